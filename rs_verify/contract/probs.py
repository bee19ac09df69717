"""Closed-form quantities of SPEC section 2, computed directly from a batch in float64.

Properties use these to state what a sampler must do without trusting any sampler
(the reference included). Imports only the batch contract.
"""

from __future__ import annotations

import numpy as np

from .batch import SpecBatch
from .masks import batch_masks, masked_logits


def row_states(batch: SpecBatch) -> np.ndarray:
    """The request state `s_r` of every logits row (int64 [N])."""
    n = np.diff(np.asarray(batch.cu_num_logits, dtype=np.int64))
    return np.repeat(np.asarray(batch.idx_mapping, dtype=np.int64), n)


def row_requests(batch: SpecBatch) -> np.ndarray:
    """The request index of every logits row (int64 [N])."""
    n = np.diff(np.asarray(batch.cu_num_logits, dtype=np.int64))
    return np.repeat(np.arange(batch.num_reqs), n)


def process(x: np.ndarray, t) -> np.ndarray:
    """`fp32(x) / T` with IEEE float32 division, untouched for T in {0, 1} (broadcasts over rows)."""
    x = np.asarray(x, dtype=np.float32)
    t = np.asarray(t, dtype=np.float32)
    t = t.reshape(t.shape + (1,) * (x.ndim - t.ndim))
    keep = (t == 0) | (t == 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(keep, x, x / np.where(keep, np.float32(1), t)).astype(np.float32)


def softmax64(z: np.ndarray) -> np.ndarray:
    """Float64 softmax over the last axis; -inf entries get probability 0."""
    z = np.asarray(z, dtype=np.float64)
    m = np.max(z, axis=-1, keepdims=True)
    e = np.exp(z - m)
    return e / e.sum(axis=-1, keepdims=True)


def processed_logits(batch: SpecBatch, *, masked: bool = True) -> np.ndarray:
    """z of every row over [0, V') (float32 [N, V']): `fp32(x) / T`, then (with `masked`) the
    sampling-parameter masks of SPEC section 2 as -inf; raw for greedy rows."""
    temp = np.asarray(batch.temperature)[row_states(batch)]
    z = process(np.asarray(batch.target_logits)[:, : batch.effective_vocab_size], temp)
    if masked and batch.sampling_params_on():
        z = masked_logits(z, batch_masks(batch, z, margins=False).kept)
    return z


def target_probs(batch: SpecBatch) -> np.ndarray:
    """p of every row over [0, V') in float64 [N, V'] (SPEC section 2: temperature, then the
    sampling-parameter masks; greedy rows: softmax of the raw logits)."""
    return softmax64(processed_logits(batch))


def draft_probs(batch: SpecBatch) -> np.ndarray | None:
    """q of every row over [0, V') in float64 [N, V'] (row j verifies step j - cu[r]); bonus rows are NaN."""
    if batch.draft_logits is None:
        return None
    if batch.num_speculative_steps == 0:
        return np.full((batch.num_logits, batch.effective_vocab_size), np.nan)
    zq, bonus = _draft_rows(batch)
    q = softmax64(zq) if zq.shape[0] else zq.astype(np.float64)
    q[bonus] = np.nan
    return q


def processed_draft_logits(batch: SpecBatch) -> np.ndarray | None:
    """The processed draft logits `fp32(x) / T` of every row over [0, V') (float32 [N, V'], row j
    verifies step j - cu[r]; bonus rows: the last step's, unused); None for one-hot drafts."""
    if batch.draft_logits is None:
        return None
    if batch.num_speculative_steps == 0:
        return np.full((batch.num_logits, batch.effective_vocab_size), np.nan, np.float32)
    return _draft_rows(batch)[0]


def _draft_rows(batch: SpecBatch) -> tuple[np.ndarray, np.ndarray]:
    """The processed draft logits of every row (float32 [N, V']) and which rows are bonus rows."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    states = row_states(batch)
    steps = np.arange(batch.num_logits) - np.repeat(cu[:-1], np.diff(cu))
    bonus = steps == np.repeat(np.diff(cu) - 1, np.diff(cu))
    k = batch.num_speculative_steps
    rows = np.asarray(batch.draft_logits)[states, np.minimum(steps, k - 1)][:, : batch.effective_vocab_size]
    return process(rows, np.asarray(batch.temperature)[states]), bonus


def greedy_argmax(batch: SpecBatch) -> np.ndarray:
    """argmax over [0, V') of every row's raw logits, lowest index on ties (int64 [N])."""
    return np.argmax(np.asarray(batch.target_logits)[:, : batch.effective_vocab_size], axis=1).astype(np.int64)
