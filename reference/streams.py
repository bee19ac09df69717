"""The random quantities of SPEC section 3 as the reference consumes them: acceptance
uniforms and resampling (Gumbel) noise, read through a stream family's record
(`rs_verify.contract.streams`; `triton-philox` unless the sampler under test declares another)."""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.streams import StreamFamily, family as family_of
from rs_verify.contract.triton_philox import TRITON_PHILOX

__all__ = ["acceptance_uniforms", "gumbel_noise"]


def acceptance_uniforms(batch: SpecBatch, family: StreamFamily | str = TRITON_PHILOX) -> np.ndarray:
    """`u_j` of every row of `batch` in `family`: float32 `[N]` (float64 for the explicit family, SPEC 3c)."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    seeds = np.asarray(batch.seeds)[np.repeat(np.asarray(batch.idx_mapping, np.int64), np.diff(cu))]
    return family_of(family).at_rows(batch, np.arange(batch.num_logits), seeds, np.asarray(batch.pos))


def gumbel_noise(seeds, pos, vocab: int, family: StreamFamily | str = TRITON_PHILOX) -> np.ndarray:
    """Resampling noise `G_x` of rows with the given seeds and positions in `family`: float64 `[len, vocab]`."""
    return family_of(family).gumbel(seeds, pos, vocab)
