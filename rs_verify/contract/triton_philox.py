"""The `triton-philox` stream family (SPEC section 3a): Triton's `tl.rand` / `tl.randint`.

- acceptance uniform of row `j`: `u_j = max(rand(seed, pos_j), TINY)`;
- resampling noise of token `x`: `g = randint(seed, pos_j)` (an int32 widened without sign
  extension), `v_x = max(rand(g, x), TINY)` for int32 `x`, `G_x = -log(-log1p(-v_x))`.

Built on the NumPy Philox of `rs_verify.contract.philox`; `"spec"` is the family's former name.
"""

from __future__ import annotations

import numpy as np

from . import philox
from .scratch import Scratch
from .streams import StreamEdges, StreamFamily, register

__all__ = ["TRITON_PHILOX", "acceptance_uniforms", "gumbel_noise", "token_offsets"]

_UNIFORMS = Scratch("triton-philox: resample noise uniforms v_x [rows, vocab]")


def acceptance_uniforms(seeds: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """`max(rand(seed, pos), TINY)` per row (int64 seeds and positions), float32."""
    return np.maximum(philox.rand(seeds, pos), philox.TINY)


def gumbel_noise(seeds: np.ndarray, pos: np.ndarray, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """`G_x = -log(-log1p(-v_x))` of rows keyed by int64 `(seeds, pos)`, float64 `[rows, vocab]` (into `out`)."""
    rows = seeds.shape[0]
    if out is None:
        out = np.empty((rows, vocab), np.float64)
    g = philox.randint(seeds, pos)
    v = philox.rand(g[:, None], token_offsets(vocab), out=_UNIFORMS((rows, vocab), np.float32))
    np.maximum(v, philox.TINY, out=v)
    np.negative(v, out=out)
    np.log1p(out, out=out)
    np.negative(out, out=out)
    np.log(out, out=out)  # log E_x, E_x = -log1p(-v_x)
    return np.negative(out, out=out)


def token_offsets(vocab: int) -> np.ndarray:
    """int32 token offsets `[1, vocab]` (the resample offsets are int32: `offset_hi = 0`)."""
    return np.arange(vocab, dtype=np.int32)[None, :]


# Found by an exhaustive scan of the Philox stream (rand(seed, pos) == 0 for 2 in 2**32 words).
_ZERO_UNIFORM = (2026, 3554443533)  # the Philox word is -1: rand = 0, u = TINY
_TINY_NOISE = (2026, 1671644, 3)  # g = -934469539; rand(g, 3) = 1.2107193e-08 < 2**-25
if philox.rand(np.int64(_ZERO_UNIFORM[0]), np.int64(_ZERO_UNIFORM[1])) != 0:
    raise AssertionError(f"triton-philox: rand{_ZERO_UNIFORM} is no longer 0: rescan the edge values")

TRITON_PHILOX = register(StreamFamily(
    name="triton-philox",
    aliases=("spec",),
    section="3a",
    acceptance=acceptance_uniforms,
    noise=gumbel_noise,
    floor=float(philox.TINY),
    edges=StreamEdges(zero_uniform=_ZERO_UNIFORM, tiny_noise=_TINY_NOISE),
    triton="philox",
    triton_check="rs_verify.properties.streams:check_philox_matches_triton",
    doc="Triton's tl.rand / tl.randint (Philox-4x32-10); vLLM MRV2 before PR 51367.",
))
