"""Decision traces with margins and tolerance scales (SPEC section 8).

`verify_with_trace` reports, per request, every decision the reference took, in
order: the near-tie sampling-parameter mask decisions of its rows (section 2), then
the acceptance tests (token-wise) or the block decisions of its verified steps
(section 4b), then (after a rejected real draft, or a block resample from a residual)
whether the residual had positive mass, then the argmax that emitted the last token
(greedy requests: one argmax per emitted token).

Each decision carries the scale `L` of SPEC section 8, computed from the tokens
the decision compares and never from the rest of the row:
`L = max(1, |log p(x)|, |log q(x)|, |G_x|)` over the draft token of an
acceptance test, or over the reference's and the production's token of an
argmax (`log q` only where a draft distribution enters the decision, `G` only
for resamples and bonus tokens; non-finite terms are left out: they belong to
tokens with probability 0, which are never near a tie). Since the production
token of an argmax is not known here, an argmax decision reports `L` for every
candidate (`scales`). A block decision's `L` is `max(1, |log u_i|, |log P_i|,
|log h_i|)`; a mask decision's is that of `rs_verify.contract.masks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import inverse_cdf
from .logits import log_softmax64

__all__ = ["FREE", "Q_FREE_LOG", "Decision", "RequestTrace"]

#: `Decision.what` of an acceptance test SPEC 4 leaves free (a draft with `q(d)` 0 or below `2**-126`),
#: and of a block decision SPEC 4b leaves free (at or after such a draft's step).
FREE = "q_zero"
#: `log 2**-126`: a draft whose `q(d)` is below float32's smallest normal number may be accepted
#: or rejected (SPEC 4; in a block, 4b): float32 samplers read it as 0.
Q_FREE_LOG = -126 * np.log(2.0)


@dataclass(frozen=True, eq=False)
class Decision:
    """One decision of the reference, with its margin and tolerance scale.

    - `request`: batch index `r`; `step`: `i` (`n_r` for the bonus); `row`: `j = cu[r] + step`.
    - `kind`: `"mask"` (a sampling-parameter mask decision within `MASK_NEAR * L` of its
      threshold), `"accept"` (a stochastic acceptance test), `"block"` (a block decision
      `u_i <= h_i`, SPEC section 4b), `"residual"` (whether the residual of a rejected real
      draft, or of a block resample, has positive mass) or `"argmax"` (a greedy argmax, a
      resample or a bonus).
    - `token`: the token masked or kept (mask), the draft id tested (accept, block,
      residual) or the winning token (argmax).
    - `accepted`: mask: kept by that parameter; accept: the outcome of the test; block:
      `u_i <= h_i`; residual: True when the residual had positive mass (resampled from it),
      False when it fell back to `p`; argmax: None.
    - `margin`: mask: SPEC section 8's margin (min-p `z_x - (M + log m)`, top-k `z_x - t`,
      top-p `c - mass before x`; positive: kept, and 0 is kept except by top-p); accept:
      `log p(d) - log q(d) - log u` (`log q = 0` for one-hot drafts; `-inf` for padded or
      out-of-range drafts and whenever `p(d) = 0`); block: `log h_i - log u_i`; residual:
      the residual's total mass in float64; argmax: best minus second-best score (`inf` with
      a single candidate).
    - `gaps`: float64 `[V']`. argmax: best score minus each candidate's (0 at the winner,
      `inf` where the score is `-inf`). residual: each token's gap under the branch NOT
      taken, i.e. what a sampler that decided the mass the other way would compare: the
      fallback `log p(x) + G_x` when the residual was used; `max(0, log q(x) - log p(x))`
      (how far `x` is from positive residual mass; `inf` where `p(x) = 0` or `x` is the
      rejected one-hot draft; a block residual `max(P p - q, 0)` uses `log q - log P - log p`)
      when it fell back. None for mask, accept and block decisions.
    - `scale`: `L` of the decision when the production agrees: accept: over the draft
      token; argmax: over the winner; residual: 1 (the mass is compared with `eps` itself);
      block: `max(1, |log u_i|, |log P_i|, |log h_i|)`; mask: `rs_verify.contract.masks`'s.
    - `scales`: argmax and residual: float64 `[V']`, `L` over the branch's best token and
      each candidate production token `x`. None for mask, accept and block decisions.
    - `what`: mask: the parameter, `"min_p"`, `"top_k"` or `"top_p"`; accept: `"q_zero"` (`FREE`)
      for a draft whose `q(d)` is 0 or below `2**-126`, a test SPEC 4 leaves free; block: `"q_zero"` at and
      after the first step whose `q_i(d_i)` is below `2**-126` (SPEC 4b); argmax and residual of an
      inverse-CDF resample (SPEC 4): `"inverse_cdf"`, whose `gaps` are the boundary distances of
      `reference.inverse_cdf` (excused within `rs_verify.contract.explicit.inverse_cdf_tolerance`, SPEC 8, `scales` all 1);
      `""` otherwise.
    - `deviation`: the name of the declared deviation (SPEC 11) whose rule decided it, else `""`:
      a residual decision that found the residual empty in float32 (`"empty_residual"`), an
      inverse-CDF argmax whose float32 prefix sums never exceeded `U S` (`"inverse_cdf_top"`, margin
      `1 - U`), a block decision whose `log P_i` the rule gave (`"block_prefix"`).
    """

    request: int
    step: int
    row: int
    kind: str
    token: int
    accepted: bool | None
    margin: float
    gaps: np.ndarray | None
    scale: float
    scales: np.ndarray | None = None
    what: str = ""
    deviation: str = ""


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """The tokens emitted for one request and the decisions that produced them, in order."""

    request: int
    tokens: list
    decisions: list


def argmax_stats(scores: np.ndarray):
    """Per row of float64 scores: gaps (best minus each; inf at -inf) and the best/second-best margin."""
    best = scores.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        gaps = best - scores
    gaps[np.isneginf(scores) & np.isfinite(best)] = np.inf
    if scores.shape[1] < 2:
        margin = np.full(scores.shape[0], np.inf)
    else:
        margin = np.partition(gaps, 1, axis=1)[:, 1]  # the winner's gap, 0, is the smallest
    return gaps, margin


def token_scale(*terms) -> np.ndarray:
    """Elementwise `max |term|` over the finite terms (0 where none is finite); None terms are skipped."""
    out = None
    for t in terms:
        if t is None:
            continue
        a = np.abs(np.asarray(t, dtype=np.float64))
        a[~np.isfinite(a)] = 0.0
        out = a if out is None else np.maximum(out, a)
    return out


def candidate_scales(ts: np.ndarray, best: int) -> np.ndarray:
    """`L` for each candidate `x` of an argmax whose best token is `best`: `max(1, ts[best], ts[x])`."""
    return np.maximum(ts, max(1.0, float(ts[best])))


def slab_traces(slab, sampled, num, t, argmax, acc, s_rows, res, s_req, masks=None, block=None) -> list[RequestTrace]:
    """One `RequestTrace` per request of a verified slab (a loop over requests: trace mode only).

    `acc`: the acceptance results of the stochastic draft rows `s_rows`; `res`: the resample
    results of the stochastic requests `s_req` (see `reference.slab`); `masks`: the mask decisions
    per slab-local request; `block`: the block decisions per slab-local request (block
    verification: they replace the acceptance tests).
    """
    masks, block = masks or {}, block or {}
    s_index = np.full(slab.nrow, -1, dtype=np.int64)
    s_index[s_rows] = np.arange(s_rows.size)
    r_index = np.full(slab.nreq, -1, dtype=np.int64)
    r_index[s_req] = np.arange(s_req.size)
    traces = []
    for r in range(slab.nreq):
        tr, base = int(t[r]), int(slab.cu[r])
        decisions = list(masks.get(r, ()))
        if slab.greedy[r]:
            decisions.extend(_greedy_decisions(slab, r, tr, argmax))
        elif r in block:
            decisions.extend(block[r])
            decisions.extend(_final_decisions(slab, r, tr, int(sampled[r, tr]), res, int(r_index[r])))
        else:
            for i in range(min(tr + 1, int(slab.n[r]))):
                j = base + i
                si = s_index[j]
                decisions.append(Decision(slab.ra + r, i, slab.lo + j, "accept", int(slab.d[j]),
                                          bool(acc["accepted"][si]), float(acc["margin"][si]), None,
                                          float(acc["scale"][si]), what=FREE if acc["free"][si] else ""))
            decisions.extend(_final_decisions(slab, r, tr, int(sampled[r, tr]), res, int(r_index[r])))
        traces.append(RequestTrace(slab.ra + r, [int(v) for v in sampled[r, : num[r]]], decisions))
    return traces


def _greedy_decisions(slab, r, tr, argmax) -> list[Decision]:
    """One argmax of the raw logits per emitted token; `L` from `log p` of the raw logits."""
    base = int(slab.cu[r])
    rows = np.arange(base, base + tr + 1)
    z = slab.z[rows]
    gaps, margin = argmax_stats(z.astype(np.float64))
    ts = token_scale(log_softmax64(z))
    out = []
    for i in range(tr + 1):
        tok = int(argmax[base + i])
        scales = candidate_scales(ts[i], tok)
        out.append(Decision(slab.ra + r, i, slab.lo + base + i, "argmax", tok, None, float(margin[i]), gaps[i],
                            float(scales[tok]), scales))
    return out


def _ruled(res, edge: str, k: int) -> str:
    """The deviation that decided entry `k` at `edge` of the resample results, or `""`."""
    name, mask = res.get("ruled", {}).get(edge, ("", None))
    return name if mask is not None and 0 <= k < mask.size and bool(mask[k]) else ""


def _final_decisions(slab, r, tr, token, res, ri) -> list[Decision]:
    """The residual-mass decision (after a rejected real draft) and the resample or bonus argmax."""
    req, j = slab.ra + r, int(slab.cu[r]) + tr
    logp, g = res["logp"][ri], res["noise"][ri]
    out = []
    logq = None  # q enters the argmax only through a residual of model drafts that was used
    k = res["resid_index"][ri]
    inverse = "U" in res  # an inverse-CDF resample (SPEC 4): boundary distances, not score gaps
    what = inverse_cdf.WHAT if inverse else ""
    dev = slab.b.deviations.at("empty_residual")
    # What an empty residual samples: p, or a declared deviation's weights (SPEC 11).
    fallback = logp if dev is None else dev.rule("empty_residual")(logp[None])[0]
    if k >= 0:
        mass, draft, used = float(res["mass"][k]), int(slab.d[j]), bool(res["used"][k])
        q_row = None if res["logq"] is None else res["logq"][k]
        q_exact = None if res.get("logq_exact") is None else res["logq_exact"][k]  # log q without underflow
        if used and inverse:  # the other branch: inverse CDF over the fallback
            alt_token = int(inverse_cdf.tokens(fallback[None], res["U"][ri : ri + 1])[0])
            alt_gaps = inverse_cdf.gaps(fallback, res["U"][ri], alt_token)[0]
            alt_scales = np.ones_like(alt_gaps)
        elif used:  # the other branch: the fallback
            alt_gaps = argmax_stats((fallback + g)[None])[0][0]
            alt_scales = candidate_scales(token_scale(logp, g), int(np.argmin(alt_gaps)))
            logq = q_row
        else:  # the other branch: a residual that float32 rounding kept
            log_scale = None if res.get("log_scale") is None else float(res["log_scale"][k])
            alt_gaps = _distance_to_positive_mass(logp, q_exact, draft, log_scale)
            # Decided in float32: no rounding keeps a residual that is empty in exact arithmetic. A float64
            # mass of 0 is not that where the positive mass lies below float64's range (log p < -745): a
            # sampler that keeps the residual in log space samples it, within the margin (SPEC 8).
            if dev is not None and mass == 0 and not _positive_mass(logp, q_exact, draft, log_scale).any():
                alt_gaps = np.full_like(alt_gaps, np.inf)
            alt_scales = np.maximum(1.0, token_scale(logp, q_row))
        out.append(Decision(req, tr, slab.lo + j, "residual", draft, used, mass, alt_gaps, 1.0, alt_scales,
                            what=what, deviation=_ruled(res, "empty_residual", k)))
    bonus = _ruled(res, "tree_bonus", ri)  # a chain's bonus from the declared rule's weights (SPEC 11)
    if inverse:
        top = _ruled(res, "inverse_cdf_top", ri)
        if top:  # the float64 token's distance from the top boundary is 1 - U (SPEC 8)
            own = int(inverse_cdf.tokens(res["logr"][ri : ri + 1], res["U"][ri : ri + 1])[0])
            gaps, _ = inverse_cdf.gaps(res["logr"][ri], res["U"][ri], own)
            gaps[own], gaps[token], margin = 1.0 - float(res["U"][ri]), 0.0, 1.0 - float(res["U"][ri])
        else:
            gaps, margin = inverse_cdf.gaps(res["logr"][ri], res["U"][ri], token)
        out.append(Decision(req, tr, slab.lo + j, "argmax", token, None, margin, gaps, 1.0, np.ones_like(gaps),
                            what=what, deviation=top or bonus))
        return out
    gaps, margin = argmax_stats(res["scores"][ri : ri + 1])
    scales = candidate_scales(token_scale(logp, logq, g), token)
    out.append(Decision(req, tr, slab.lo + j, "argmax", token, None, float(margin[0]), gaps[0], float(scales[token]),
                        scales, deviation=bonus))
    return out


def _positive_mass(logp, logq, draft, log_scale=None) -> np.ndarray:
    """bool `[V']`: where the residual has positive mass in exact arithmetic, decided in log space (no
    underflow): `log P + log p(x) > log q(x)` (one-hot drafts: `p(x) > 0` but at the rejected `draft`)."""
    shift = logp if not log_scale else logp + log_scale
    out = shift > -np.inf if logq is None else shift > logq
    if logq is None:
        out[draft] = False
    return out


def _distance_to_positive_mass(logp, logq, draft, log_scale=None) -> np.ndarray:
    """Per token, `max(0, log q(x) - log p(x))` (block residual `max(P p - q, 0)`: `log q - log P - log p`,
    `log_scale = log P`): 0 where the residual has mass, `inf` where it never can (`p(x) = 0`, or the
    rejected one-hot draft itself; `logq` None means one-hot drafts, `q = 0` elsewhere)."""
    with np.errstate(invalid="ignore"):
        shift = logp if not log_scale else logp + log_scale
        gap = np.zeros_like(logp) if logq is None else np.maximum(logq - shift, 0.0)
    gap[~np.isfinite(logp)] = np.inf
    if logq is None:
        gap[draft] = np.inf
    return gap
