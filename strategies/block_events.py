"""Labels of block verification (SPEC section 4b): what the decisions of a block batch exercise.

Read off the batch's facts (`strategies.facts`: `rs_verify.contract.block`'s prefix ratios,
thresholds and `tau` with the SPEC uniforms), for the stochastic requests of a block batch
(greedy requests verify token by token). Re-exported by `strategies.events`.

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract import block as spec_block

from .facts import Facts

NEAR_U = 0.05  # |log h_i - log u_i| below this: a 5% error in h_i flips the decision
NEAR_TIE = 1e-6  # |margin| <= NEAR_TIE * L: float32 and float64 may decide differently (SPEC 8)

BLOCK_DECISION = "block: stochastic decision u_i <= h_i"
BLOCK_NEAR = "block: u_i within 5% of h_i"
BLOCK_RESCUED = "block: a later step accepts the block after an earlier u_i > h_i"
BLOCK_SATURATED = "block: prefix ratio saturated at 1"
BLOCK_COLLAPSED = "block: prefix ratio collapsed to 0 (p(d) = 0)"
BLOCK_DEN = "block: Z + 1 - P <= 0 (h_i = 1)"
BLOCK_PARTIAL = "block: resample after a partly accepted block (0 < tau < m, P < 1)"
BLOCK_PADDED = "block: padded draft mid-block (0 < m < n)"
BLOCK_PADDED_STEP = "block: resample from p at the padded step (tau = m < n)"
BLOCK_BONUS = "block: whole block accepted (bonus)"
BLOCK_EMPTY = "block: empty residual at tau"
BLOCK_ZERO_ZERO = "block: verified draft with p(d) = q(d) = 0"
BLOCK_ONE_HOT = "block: one-hot drafts, stochastic decision"
BLOCK_ONE_HOT_CHAIN = "block: one-hot prefix product over 2+ steps in (0, 1)"
BLOCK_MODEL = "block: model drafts, stochastic decision"
BLOCK_MIXED = "block: greedy and stochastic requests in one block batch"

BLOCK_KNOBS = (BLOCK_DECISION, BLOCK_NEAR, BLOCK_RESCUED, BLOCK_SATURATED, BLOCK_COLLAPSED, BLOCK_DEN, BLOCK_PARTIAL,
               BLOCK_PADDED, BLOCK_PADDED_STEP, BLOCK_BONUS, BLOCK_EMPTY, BLOCK_ZERO_ZERO, BLOCK_ONE_HOT, BLOCK_MODEL,
               BLOCK_MIXED)
# Labelled too, but not held to the ci budget: it needs a one-hot structure of two drafts or more
# in a block draw, which a ci run of 40 examples misses about one time in eight.
BLOCK_EXTRA_KNOBS = (BLOCK_ONE_HOT_CHAIN,)


def block_k_knob(k: int) -> str:
    """The label of a block batch with `K = k` (K up to 8 is drawn when `max_spec_steps` allows it)."""
    return f"block: K = {k}"


def block_margins(f: Facts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request and step: whether the decision `u_i <= h_i` is a stochastic one (`i < m` of a
    stochastic request, `h_i > 0`), its margin `log h_i - log u_i` and its scale `L` (SPEC 8)."""
    res = f.block
    k = res.h.shape[1]
    live = (np.arange(k)[None, :] < res.m[:, None]) & f.stochastic[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        live &= np.nan_to_num(res.h, nan=0.0) > 0
        log_h, log_u, log_p = np.log(res.h), np.log(f.u_steps), res.log_prefix
        margin = np.where(live, log_h - log_u, np.nan)
        terms = np.stack([np.ones_like(log_h), np.abs(log_u), np.abs(log_p), np.abs(log_h)])
        scale = np.where(np.isfinite(terms), terms, 0.0).max(axis=0)
    return live, margin, scale


def block_decisions(f: Facts) -> int:
    """How many stochastic block decisions (`h_i > 0`) the batch's requests evaluate."""
    if f.block is None:
        return 0
    return int(block_margins(f)[0].sum())


def block_near_ties(f: Facts) -> int:
    """Block decisions within `NEAR_TIE * L` of their threshold (a float32 sampler may decide them
    the other way; certification excuses only a few per batch)."""
    if f.block is None:
        return 0
    live, margin, scale = block_margins(f)
    with np.errstate(invalid="ignore"):
        return int((live & (np.abs(margin) <= NEAR_TIE * scale)).sum())


def _residual_empty(p_row, q_row, draft, scale) -> bool:
    """Whether SPEC 4b's residual at `tau` has no positive mass (`block_residual` falls back to p)."""
    p_row = np.asarray(p_row, np.float64)
    return spec_block.block_residual(p_row, q_row, draft, scale, False) is p_row


def block_knobs_of(f: Facts) -> set[str]:
    """The knobs of `BLOCK_KNOBS` a block batch has (empty for a token batch)."""
    if f.block is None:
        return set()
    b, res = f.batch, f.block
    knobs = set()
    live, margin, _ = block_margins(f)
    n = b.num_draft_tokens
    model = f.q is not None
    cu = np.asarray(b.cu_num_logits, np.int64)
    ids = np.asarray(b.draft_token_ids)
    if (~f.stochastic).any() and f.stochastic.any():
        knobs.add(BLOCK_MIXED)
    with np.errstate(divide="ignore", invalid="ignore"):
        for r in np.flatnonzero(f.stochastic):
            m, tau = int(res.m[r]), int(f.tau[r])
            if 0 < m < n[r]:
                knobs.add(BLOCK_PADDED)
            if tau == m < n[r]:
                knobs.add(BLOCK_PADDED_STEP)
            if tau == n[r]:
                knobs.add(BLOCK_BONUS)
            if live[r].any():
                knobs.update((BLOCK_DECISION, BLOCK_MODEL if model else BLOCK_ONE_HOT))
            if (np.abs(margin[r][live[r]]) < NEAR_U).any():
                knobs.add(BLOCK_NEAR)
            if m == 0:
                continue
            log_p = res.log_prefix[r, :m]
            if (log_p == 0).any():
                knobs.add(BLOCK_SATURATED)
            if np.isneginf(log_p).any():
                knobs.add(BLOCK_COLLAPSED)
            den = res.z[r, : m - 1] + 1.0 - np.exp(log_p[: m - 1])
            if (den <= 0).any():
                knobs.add(BLOCK_DEN)
            u, h = f.u_steps[r, :m], res.h[r, :m]
            if tau >= 2 and (u[: tau - 1] > h[: tau - 1]).any():
                knobs.add(BLOCK_RESCUED)
            if not model and m >= 2 and ((log_p[1:] < 0) & np.isfinite(log_p[1:])).any():
                knobs.add(BLOCK_ONE_HOT_CHAIN)
            steps = np.arange(m)
            d = ids[cu[r] + 1 + steps]
            rows = cu[r] + steps
            if model and ((f.p[rows, d] == 0) & (f.q[rows, d] == 0)).any():
                knobs.add(BLOCK_ZERO_ZERO)
            if tau < m:
                j = int(cu[r] + tau)
                scale = 1.0 if tau == 0 else float(np.exp(log_p[tau - 1]))  # P_{tau-1}
                if 0 < tau and scale < 1:
                    knobs.add(BLOCK_PARTIAL)
                if _residual_empty(f.p[j], None if not model else f.q[j], int(ids[j + 1]), scale):
                    knobs.add(BLOCK_EMPTY)
    return knobs
