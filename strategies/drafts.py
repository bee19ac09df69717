"""Draft token ids and draft logits (NumPy only).

Two families:

- *lean* drafts (`lean_draft_ids`, `pattern_draft_rows`): ids leaning to the target's
  argmax and likely tokens, draft rows that are noisy copies of the target or any
  logits pattern. Broad coverage; acceptance decisions are mostly far from `u`.
- drafts *drawn from q* (`close_draft_rows`, `gumbel_max_drafts`): a draft
  distribution close to the target (`q = softmax((x + T * sigma * noise) / T)`) and
  ids drawn from it by Gumbel-max with the SPEC section 3 noise at the salted
  position `pos + 2**30`, as a drafter sharing the request's seed does (DESIGN.md:
  the salt keeps the draft noise independent of the resample noise). The
  acceptance probability `min(1, p(d) / q(d))` then spreads over (0, 1], where the
  uniform `u` decides.

Imports only NumPy and the contract (the triton-philox stream family, processed logits).
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract import probs
from rs_verify.contract.triton_philox import TRITON_PHILOX

from .logits import logits_rows, mask_rows, round_to_dtype, softmax_head

DRAFT_SALT = 2**30  # the drafter's stream: SPEC noise at pos + 2**30
# The drafter is the suite's, not the sampler's: its salted stream is triton-philox noise whatever
# family the sampler declares (independent of the sampler's own noise either way).
DRAFTER_STREAMS = TRITON_PHILOX
NEGATIVE_IDS = (-2, -3, -(2**31), -(2**63))  # padded ids other than -1 (plus -V' - 1)


def salted_positions(pos) -> np.ndarray:
    """`pos + 2**30` as int64, wrapping past 2**63 - 1 as int64 kernel arithmetic does."""
    p = np.asarray(pos, dtype=np.int64).astype(np.uint64) + np.uint64(DRAFT_SALT)
    return p.view(np.int64)


def gumbel_max_drafts(logq: np.ndarray, seeds, pos) -> np.ndarray:
    """Per row, `argmax_x (log q(x) + G_x)`: a draw from `q` (float64 `[n, V']`, `-inf` for
    q = 0) with the resampling noise `G_x` of `DRAFTER_STREAMS` at `(seed, pos + 2**30)`.
    """
    logq = np.asarray(logq, dtype=np.float64)
    n, v = logq.shape
    if n == 0:
        return np.zeros(0, np.int64)
    g = DRAFTER_STREAMS.gumbel(np.asarray(seeds, dtype=np.int64).reshape(n), salted_positions(pos).reshape(n), v)
    return np.argmax(logq + g, axis=1).astype(np.int64)


def log_softmax_processed(rows: np.ndarray, t: float) -> np.ndarray:
    """Float64 log-softmax of `fp32(rows) / T` (SPEC section 2; untouched for T in {0, 1})."""
    z = probs.process(rows, t).astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def close_draft_rows(rng, target_rows, vd: int, t: float, sigma: float, dtype: str, bound: float) -> np.ndarray:
    """Draft logits close to the target rows: `x + T * sigma * N(0, 1)` over `[0, vd)`, so the
    processed draft logits differ from the processed target's by `sigma` noise. `-inf`
    target entries stay `-inf` (a drafter that knows the mask) or, one time in four, get
    finite logits 2 to 10 (processed) below the row's lowest (one that does not: it may then
    draft a token with p = 0, rejected whatever u is)."""
    base = np.asarray(target_rows, dtype=np.float64)[:, :vd]
    scale = float(t) if t > 0 else 1.0
    rows = base + rng.standard_normal(base.shape) * (sigma * scale)
    masked = ~np.isfinite(rows)
    if masked.any() and rng.random() < 0.25:
        low = np.where(masked, np.inf, rows).min(axis=1, keepdims=True)
        fill = low - rng.uniform(2.0 * scale, 10.0 * scale, rows.shape)
        rows = np.where(masked & np.isfinite(low), fill, rows)
    finite = np.isfinite(rows)
    rows[finite] = np.clip(rows[finite], -bound, bound)
    return round_to_dtype(rows.astype(np.float32), dtype)


def padded_ids(rng, count: int, v_eff: int) -> np.ndarray:
    """`count` padded draft ids: -1 mostly, other negatives (down to -2**63) otherwise."""
    negatives = np.array(NEGATIVE_IDS + (-v_eff - 1,), np.int64)
    return np.where(rng.random(count) < 0.7, -1, rng.choice(negatives, count)).astype(np.int64)


# -- lean drafts ----------------------------------------------------------------------


def lean_draft_ids(rng, target, cu, v_eff, padded) -> np.ndarray:
    """Draft ids in the vLLM layout: the id verified by row j sits at j + 1.

    Verified ids lean towards the target row's argmax and high-probability tokens
    (so acceptances happen); with `padded`, some are negative. The first entry of
    each request is never read: it holds valid ids or garbage.
    """
    N = target.shape[0]
    R = cu.shape[0] - 1
    ids = rng.integers(0, v_eff, N, dtype=np.int64)
    garbage = np.array([-1, v_eff, v_eff + 1, 2**40, -(2**63), 2**63 - 1], np.int64)
    firsts = cu[:-1]
    ids[firsts] = np.where(rng.random(R) < 0.5, ids[firsts], rng.choice(garbage, R))
    verified = np.ones(N, bool)
    verified[firsts] = False
    for p in np.flatnonzero(verified):
        u = rng.random()
        row = target[p - 1]
        if u < 0.45:
            ids[p] = int(np.argmax(row[:v_eff]))
        elif u < 0.7:
            ids[p] = int(rng.choice(v_eff, p=softmax_head(row, v_eff)))
    if padded and verified.any():
        where = np.flatnonzero(verified)
        pad = where[rng.random(where.size) < rng.uniform(0.1, 0.6)]
        if pad.size == 0:
            pad = where[rng.integers(where.size, size=1)]
        negatives = np.array([-2, -3, -v_eff - 1, -(2**31), -(2**63)], np.int64)
        ids[pad] = np.where(rng.random(pad.size) < 0.7, -1, rng.choice(negatives, pad.size))
    return ids


def pattern_draft_rows(rng, target, cu, r, n, draft_ids, Vd, dtype, bound, patterns, masked) -> np.ndarray:
    """Draft logits of the `n` verified steps of request `r`: a noisy copy of the target
    row or a pattern; a one-hot draft is hot at its draft id; masks spare the draft id."""
    lo = int(cu[r])
    out = np.empty((n, Vd), np.float32)
    ids = draft_ids[lo + 1 : lo + 1 + n]
    for i in range(n):
        kind = "correlated" if rng.random() < 0.4 else str(rng.choice(patterns))
        if kind == "correlated":
            row = target[lo + i, :Vd].astype(np.float64) * rng.uniform(0.5, 1.0)
            row = row + rng.standard_normal(Vd) * rng.choice([0.1, 1.0, 3.0])
            row = np.where(np.isfinite(row), np.clip(row, -bound, bound), row)
            out[i] = round_to_dtype(row.astype(np.float32), dtype)
        else:
            out[i] = logits_rows(rng, 1, Vd, kind, dtype=dtype, max_abs=bound, allow_inf=masked)[0]
            d = int(ids[i])
            if kind == "one-hot" and 0 <= d < Vd and rng.random() < 0.8:
                out[i] = np.roll(out[i], d - int(np.argmax(out[i])))
    if masked:
        protect = np.zeros(out.shape, bool)
        for i, d in enumerate(ids):
            if 0 <= d < Vd and rng.random() < 0.9:
                protect[i, d] = True
        mask_rows(rng, out, Vd, protect)
    return out

