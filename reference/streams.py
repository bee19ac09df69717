"""The random quantities of SPEC section 3 as the reference consumes them: acceptance
uniforms and resampling (Gumbel) noise, from the contract's Philox streams."""

from __future__ import annotations

import numpy as np

from rs_verify.contract import philox
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.scratch import Scratch

__all__ = ["acceptance_uniforms", "gumbel_noise"]

_UNIFORMS = Scratch("reference: resample noise uniforms v_x [rows, V']")


def acceptance_uniforms(batch: SpecBatch) -> np.ndarray:
    """`u_j = max(rand(seeds[s], pos[j]), TINY)` of every row, float32 `[N]`."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    seeds = np.asarray(batch.seeds)[np.repeat(np.asarray(batch.idx_mapping, np.int64), np.diff(cu))]
    return row_uniforms(seeds, np.asarray(batch.pos))


def row_uniforms(seeds: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """`max(rand(seed, pos), TINY)` per row (int64 seeds and positions), float32."""
    return np.maximum(philox.rand(seeds, pos), philox.TINY)


def gumbel_noise(seeds, pos, vocab: int) -> np.ndarray:
    """Resampling noise `G_x` of rows with the given seeds and positions: float64 `[len, vocab]`.

    `g = randint(seed, pos)` (int32, widened without sign extension),
    `v_x = max(rand(g, x), TINY)` for int32 `x`, `G_x = -log(-log1p(-v_x))`.
    """
    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    out = np.empty((seeds.shape[0], int(vocab)), np.float64)
    log_exponential_noise(seeds, np.asarray(pos, dtype=np.int64).reshape(-1), out)
    return np.negative(out, out=out)


def log_exponential_noise(seeds: np.ndarray, pos: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`log E_x` with `E_x = -log1p(-v_x)` into float64 `out [len, vocab]`; `G_x = -log E_x`."""
    rows, vocab = out.shape
    g = philox.randint(seeds, pos)
    v = philox.rand(g[:, None], token_offsets(vocab), out=_UNIFORMS((rows, vocab), np.float32))
    np.maximum(v, philox.TINY, out=v)
    np.negative(v, out=out)
    np.log1p(out, out=out)
    np.negative(out, out=out)
    return np.log(out, out=out)


def token_offsets(vocab: int) -> np.ndarray:
    """int32 token offsets `[1, vocab]` (the resample offsets are int32: `offset_hi = 0`)."""
    return np.arange(vocab, dtype=np.int32)[None, :]
