"""Logprobs of a slab (SPEC section 6): over the whole vocabulary `[0, V)`, ordered and
ranked by the float32 logprobs. Processed mode reads the masked processed logits (SPEC
section 2: masked tokens at `-inf`; tokens in `[V', V)` are divided by `T` and never masked)."""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import LogprobsTensors

from .logits import divide, log_softmax64

__all__ = ["slab_logprobs", "topk"]


def slab_logprobs(slab, sampled, num) -> LogprobsTensors:
    """Column 0 the token emitted at each row (0 where none), then the top-k; ranks of column 0."""
    b = slab.b.batch
    k = int(b.num_logprobs)
    if b.logprobs_mode == "processed":
        y = slab.z if slab.vp == slab.b.v else divide(slab.x, slab.row_temp)
        if slab.masks is not None and y is not slab.z:
            if y is slab.x:  # no row divided: a view of the batch
                y = y.copy()
            y[:, : slab.vp] = slab.z
    else:
        y = slab.x
    lp = log_softmax64(y).astype(np.float32)
    emitted = slab.step < num[slab.req]
    tok = np.where(emitted, sampled[slab.req, np.minimum(slab.step, slab.k1 - 1)], 0)
    col0 = lp[np.arange(slab.nrow), tok]
    ranks = 1 + (lp > col0[:, None]).sum(axis=1)
    ids = np.empty((slab.nrow, k + 1), dtype=np.int64)
    ids[:, 0] = tok
    ids[:, 1:] = topk(lp, k)
    return LogprobsTensors(
        token_ids=ids,
        logprobs=np.take_along_axis(lp, ids, axis=1),
        ranks=ranks.astype(np.int64),
        cu_num_generated_tokens=None if slab.nrow == slab.nreq else [int(c) for c in slab.cu],
    )


def topk(lp: np.ndarray, k: int) -> np.ndarray:
    """Per row: the ids of the `k` largest entries, descending, ties by ascending id (int64 `[rows, k]`)."""
    rows, v = lp.shape
    if k == 0 or rows == 0:
        return np.zeros((rows, k), dtype=np.int64)
    neg = -lp
    if 4 * k >= v:
        return np.argsort(neg, axis=1, kind="stable")[:, :k].astype(np.int64)
    # The k-th largest value; rows whose ties straddle it take the full stable sort.
    kth = np.partition(neg, k - 1, axis=1)[:, k - 1 : k]
    cand = np.argpartition(neg, k - 1, axis=1)[:, :k]
    order = np.lexsort((cand, np.take_along_axis(neg, cand, axis=1)), axis=1)
    out = np.take_along_axis(cand, order, axis=1).astype(np.int64)
    straddle = np.flatnonzero((neg <= kth).sum(axis=1) > k)
    if straddle.size:
        out[straddle] = np.argsort(neg[straddle], axis=1, kind="stable")[:, :k]
    return out
