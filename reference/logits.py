"""Processed logits and probabilities (SPEC section 2), in the reference's float64.

`z = fp32(x) / T` with IEEE float32 division (skipped for `T` in {0, 1}), then the
sampling-parameter masks (`rs_verify.contract.masks`) on rows of stochastic states with a
parameter on; `p` and `q` are float64 softmaxes of the float32 `z` over `[0, V')` (`q` is
never masked).
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.masks import batch_masks

__all__ = ["draft_probs", "log_softmax64", "processed_logits", "target_probs"]


def row_layout(cu: np.ndarray):
    """Per row of `cu` (int64, rebased or not): request index, step, and whether it is the bonus row."""
    sizes = np.diff(cu)
    req = np.repeat(np.arange(sizes.shape[0]), sizes)
    step = np.arange(int(cu[-1] - cu[0]), dtype=np.int64) - (cu[:-1] - cu[0])[req]
    bonus = step == (sizes - 1)[req]
    return req, step, bonus


def divide(x: np.ndarray, t: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`fp32(x) / T` per row (IEEE float32 division); rows with `T` in {0, 1} are left untouched.

    `x` float32 `[rows, V]`, `t` float32 `[rows]`. Returns `x` itself when no
    row divides; otherwise writes into `out` (may be `x`) or a new array.
    """
    div = (t != 0) & (t != 1)
    if not div.any():
        return x
    if out is None:
        out = np.empty(x.shape, np.float32)
    if div.all():
        return np.divide(x, t[:, None], out=out)
    if out is not x:
        np.copyto(out, x)
    rows = np.flatnonzero(div)
    out[rows] = np.divide(x[rows], t[rows, None], dtype=np.float32)
    return out


def softmax_parts(z32: np.ndarray, y: np.ndarray, e: np.ndarray | None):
    """Per row of float32 logits, in float64: `y = z - max z`, `e = exp(y)` (into `y` when `e` is None), `s = sum(e)`.

    Then `log p = y - log s` and `p = e / s`. Returns `(m, y, e, s)` with `m`
    the row max (exact: a float32 value).
    """
    m = z32.max(axis=1).astype(np.float64)
    np.subtract(z32, m[:, None], out=y)
    if e is None:
        e = y
    np.exp(y, out=e)
    return m, y, e, e.sum(axis=1)


def log_softmax64(z: np.ndarray) -> np.ndarray:
    """Float64 log-softmax over the last axis (`-inf` logits get `-inf`)."""
    z = np.asarray(z)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(z, axis=-1, keepdims=True).astype(np.float64)  # exact for float32 input
        y = np.subtract(z, m, dtype=np.float64)
        s = np.exp(y).sum(axis=-1, keepdims=True)
        y -= np.log(s)
    return y


def processed_logits(batch: SpecBatch, *, full_vocab: bool = False) -> np.ndarray:
    """`z` of every row (SPEC section 2), masked: float32 `[N, V']` (`[N, V]` with `full_vocab`: tokens
    in `[V', V)` divided, never masked); raw for greedy rows."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    v = batch.vocab_size if full_vocab else batch.effective_vocab_size
    temp = np.asarray(batch.temperature)[np.repeat(np.asarray(batch.idx_mapping, np.int64), np.diff(cu))]
    x = np.asarray(batch.target_logits)[:, :v]
    with np.errstate(over="ignore"):
        z = np.array(divide(x, temp), dtype=np.float32)
    if batch.sampling_params_on():
        vp = batch.effective_vocab_size
        z[:, :vp][~batch_masks(batch, z[:, :vp], margins=False).kept] = -np.inf
    return z


def target_probs(batch: SpecBatch) -> np.ndarray:
    """`p` of every row over `[0, V')`, float64 `[N, V']` (masked; greedy rows: softmax of the raw logits)."""
    return np.exp(log_softmax64(processed_logits(batch)))


def draft_probs(batch: SpecBatch) -> np.ndarray | None:
    """`q_i` of every row `j = cu[r] + i` over `[0, V')`, float64 `[N, V']`; bonus rows NaN; None for one-hot drafts."""
    if batch.draft_logits is None:
        return None
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    v = batch.effective_vocab_size
    req, step, bonus = row_layout(cu)
    states = np.asarray(batch.idx_mapping, np.int64)[req]
    q = np.full((batch.num_logits, v), np.nan)
    rows = np.flatnonzero(~bonus)
    if rows.size:
        d = np.asarray(batch.draft_logits)[states[rows], step[rows], :v]
        with np.errstate(over="ignore"):
            d = divide(d, np.asarray(batch.temperature)[states[rows]])
        q[rows] = np.exp(log_softmax64(d))
    return q
