"""Decision-by-decision comparison of a production output with the reference's traces (SPEC section 8).

The reference decides every acceptance test, block decision (SPEC 4b: `u_i <= h_i`),
residual-mass decision, argmax and sampling-parameter mask (SPEC 2) in float64 and reports its
margin and tolerance scale `L`, computed from the tokens the decision compares only
(`rs_verify.reference.trace`). A production decision that differs is excused only as a near-tie:

- an acceptance test or a block decision: `|m| <= eps * L`;
- an argmax: the production token's gap `<= eps * L` with `L` over the reference's and the
  production's token; an inverse-CDF resample (SPEC 4): the distance of `U` from the prefix-sum
  boundary between the two tokens `<= max(eps, V' * 2**-23)` (`rs_verify.reference.inverse_cdf`);
- a residual whose float64 mass is `<= eps`, when the production token is what the other branch
  (fallback to `p`, or a residual that float32 rounding kept) would emit within its tolerance;
- a mask decision within `eps * L` of its margin: the production output must then be what the
  reference emits with that near-tie decided the other way (`verify_with_trace(..., flips=...)`),
  itself certified; a tie with top-k's `t` (margin 0) is kept, never excused.

Token-wise requests are compared token by token; the production accepted a draft only when its
`num_sampled` goes past it, so a rejection whose resample equals the draft id is compared (and
reported) as a resample. A block request (SPEC 4b) is compared by its
`tau`: the production's `tau` (its `num_sampled - 1`) must follow from the reference's block
decisions with only near-ties flipped (the step `tau - 1` accepted, every later verified step
rejected); the token at `tau` is then compared as an argmax. After an excused divergence the
request is not compared further.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..contract import methods
from ..contract.batch import SamplerOutput
from ..contract.chunking import select_requests
from ..contract.explicit import INVERSE_CDF, inverse_cdf_tolerance

FREE = "q_zero"  # `rs_verify.reference.trace.FREE`: an acceptance test SPEC 4 leaves free

DEFAULT_EPS = 2e-4
# SPEC section 8: excused divergences may not exceed max(EXCUSE_FLOOR, EXCUSE_SHARE * stochastic decisions).
EXCUSE_FLOOR = 2
EXCUSE_SHARE = 0.01
# At most this many alternative masks are tried for one request (each near-tie token flipped alone,
# the closest ties first, and all of them together): near-ties are rare, more is noise.
MAX_MASK_ALTERNATIVES = 8

_WHAT = {"accept": "acceptance test", "argmax": "argmax", "residual": "residual mass", "length": "length",
         "block": "block decision u <= h", "prefix": "accepted tokens", "mask": "sampling-parameter mask"}


@dataclass
class Divergence:
    request: int
    step: int
    kind: str  # a key of _WHAT
    ref_token: int | None
    prod_token: int | None
    margin: float
    tolerance: float
    excused: bool
    note: str = ""
    free: bool = False  # a block decision (or the token after it) left free by a q_i(d_i) below 2**-126 (SPEC 4, read for 4b)

    def describe(self) -> str:
        return (f"request {self.request}, step {self.step}: {_WHAT[self.kind]} diverges: reference token "
                f"{self.ref_token}, production token {self.prod_token}, margin {self.margin:.6g} "
                f"(tolerance {self.tolerance:.3g}){self.note}")


@dataclass
class Comparison:
    """The first divergence of every request that has one, and how many stochastic decisions
    (acceptance tests, block decisions, resamples and bonus tokens of requests with `T > 0`) were
    compared."""

    divergences: list = field(default_factory=list)
    stochastic: int = 0
    free: list = field(default_factory=list)  # free block decisions that differed (not failures; SPEC 4 read for 4b)

    @property
    def excused(self) -> list:
        return [d for d in self.divergences if d.excused]

    @property
    def failed(self) -> list:
        return [d for d in self.divergences if not d.excused]

    @property
    def excuse_cap(self) -> float:
        """The most excused divergences SPEC section 8 allows for this comparison."""
        return max(EXCUSE_FLOOR, EXCUSE_SHARE * self.stochastic)


def _at_step(trace, i: int, kind: str):
    return next((d for d in trace.decisions if d.step == i and d.kind == kind), None)


def _gap_and_tolerance(dec, tok, eps) -> tuple[float, float]:
    """The production token's gap in an argmax-like decision and its tolerance `eps * L(ref, tok)`;
    an inverse-CDF resample's boundary distance within `max(eps, V' * 2**-23)` (SPEC section 8)."""
    if getattr(dec, "what", "") == INVERSE_CDF:
        tol = inverse_cdf_tolerance(eps, len(dec.gaps))
        return (np.inf if tok is None or not 0 <= tok < len(dec.gaps) else float(dec.gaps[tok])), tol
    if tok is None or not 0 <= tok < len(dec.gaps):
        return np.inf, eps * dec.scale
    return float(dec.gaps[tok]), eps * float(dec.scales[tok])


def _final_divergence(r, i, trace, ref_tok, prod_tok, eps) -> Divergence:
    """The token emitted at step `i` (a resample or bonus, or a greedy argmax) differs."""
    arg = _at_step(trace, i, "argmax")
    if arg is None:
        return Divergence(r, i, "length", ref_tok, prod_tok, np.inf, 0.0, False)
    gap, tol = _gap_and_tolerance(arg, prod_tok, eps)
    found = Divergence(r, i, "argmax", ref_tok, prod_tok, gap, tol, gap <= tol)
    res = _at_step(trace, i, "residual")
    if not found.excused and res is not None and res.margin <= eps:
        # The mass decision may have gone the other way: excused when the production token is
        # what that branch emits (its gaps and scales are the other branch's).
        alt_gap, alt_tol = _gap_and_tolerance(res, prod_tok, eps)
        if alt_gap <= alt_tol:
            return Divergence(r, i, "residual", ref_tok, prod_tok, res.margin, eps, True)
    return found


def _rejected_note(i, d) -> str:
    return f"the production rejected draft {d} at step {i} (num_sampled {i + 1}) and resampled that same id"


def _step_divergence(r, i, trace, drafts, ref_tok, prod_tok, eps, prod_len) -> Divergence:
    """Step `i` emits different tokens. The production accepted the draft only if it emitted it and
    went on (its `num_sampled` says so): a rejection whose resample equals the draft id is a
    resample, compared as one."""
    acc = _at_step(trace, i, "accept")
    if acc is not None:
        d = int(drafts[i])
        prod_accepted = prod_tok == d and prod_len > i + 1
        if acc.accepted != prod_accepted:
            tol = eps * acc.scale
            return Divergence(r, i, "accept", ref_tok, prod_tok, acc.margin, tol, abs(acc.margin) <= tol)
        if prod_tok == d:  # both rejected; the production's resample happens to be the draft id
            found = _final_divergence(r, i, trace, ref_tok, prod_tok, eps)
            found.note += f"; a resample: {_rejected_note(i, d)}"
            return found
    return _final_divergence(r, i, trace, ref_tok, prod_tok, eps)


def _token_divergence(r, trace, drafts, ref, prod, eps) -> tuple[Divergence | None, int]:
    """Token by token (SPEC section 4): the first divergence and the last step compared."""
    last = max(len(ref), len(prod))
    for i in range(last):
        tr = ref[i] if i < len(ref) else None
        tp = prod[i] if i < len(prod) else None
        if tr == tp:
            continue
        if tp is None and 0 < i <= len(drafts):
            # The production stopped after emitting the draft id at step i - 1 that the reference
            # accepted: it rejected that draft (num_sampled) and resampled the same id.
            acc = _at_step(trace, i - 1, "accept")
            if acc is not None and acc.accepted:
                tol = eps * acc.scale
                note = f"; {_rejected_note(i - 1, int(drafts[i - 1]))}"
                return Divergence(r, i - 1, "accept", ref[i - 1], prod[i - 1], acc.margin, tol,
                                  abs(acc.margin) <= tol, note=note), i - 1
        if tr is None or tp is None:
            return Divergence(r, i, "length", tr, tp, np.inf, 0.0, False), i
        return _step_divergence(r, i, trace, drafts, tr, tp, eps, len(prod)), i
    return None, last


def _block_divergence(r, trace, drafts, ref, prod, eps) -> tuple[Divergence | None, int]:
    """By `tau` (SPEC section 4b): the production's `tau` must follow from the reference's block
    decisions with only near-ties flipped; then the token at `tau` is compared."""
    tau_ref, tau = len(ref) - 1, len(prod) - 1
    bad = next((i for i in range(max(tau, 0)) if i >= len(drafts) or prod[i] != int(drafts[i])), None)
    if bad is not None:
        return Divergence(r, bad, "prefix", ref[bad] if bad < len(ref) else None, prod[bad], np.inf, 0.0, False,
                          note="; block verification emits the drafts d_0..d_{tau-1} then one more token"), bad
    blocks = sorted((d for d in trace.decisions if d.kind == "block"), key=lambda d: d.step)
    # SPEC 4 leaves free the test of a draft whose q(d) is below 2**-126 (a float32 sampler reads it as
    # 0); read for block steps (4b is silent; docs/sampler-protocol.md, "Readings of the SPEC"): from the
    # first such step P_i is the sampler's to read, so the block decisions from there, and a residual
    # resample after them, are free (the bonus and a padded step's resample draw from p alone and stay
    # certified).
    free_at = next((d.step for d in blocks if getattr(d, "what", "") == FREE), None)

    def free(step: int, kind: str, ref_tok, prod_tok) -> Divergence:
        return Divergence(r, step, kind, ref_tok, prod_tok, np.nan, 0.0, True, free=True,
                          note=f"; free: step {free_at}'s q(d) is below 2**-126 (SPEC 4, read for 4b)")

    if tau != tau_ref:
        if tau < 0 or tau > len(blocks):
            return Divergence(r, max(tau, 0), "length", None, None, np.inf, 0.0, False,
                              note=f"; num_sampled {tau + 1}, but only {len(blocks)} steps are verified"), max(tau, 0)
        # tau = the last step with u_i <= h_i: step tau - 1 accepted, every later verified step rejected.
        needed = ([(tau - 1, True)] if tau > 0 else []) + [(i, False) for i in range(tau, len(blocks))]
        first = None
        for i, want in needed:
            dec = blocks[i]
            if dec.accepted == want:
                continue
            if free_at is not None and i >= free_at:
                return free(i, "block", ref[min(i, tau_ref)], prod[min(i, tau)]), i
            tol = eps * dec.scale
            div = Divergence(r, i, "block", ref[min(i, tau_ref)], prod[min(i, tau)], dec.margin, tol,
                             abs(dec.margin) <= tol, note=f"; tau {tau} vs the reference's {tau_ref}")
            if not div.excused:
                return div, max(tau, tau_ref)
            first = first or div
        return first, max(tau, tau_ref)
    if prod[tau] == ref[tau]:
        return None, tau
    if free_at is not None and free_at < tau < len(blocks):  # a residual scaled by P_{tau-1}: free too
        return free(tau, "argmax", ref[tau], prod[tau]), tau
    return _final_divergence(r, tau, trace, ref[tau], prod[tau], eps), tau


def _tree_divergence(r, trace, batch, out, eps, greedy) -> tuple[Divergence | None, int]:
    """Level by level (SPEC 4c): the production's accepted child at each level must be the one the
    reference's decisions accept, each differing decision a near-tie (its margin within `eps * L`); where
    both stop at the same node the emitted token is compared as an argmax."""
    lo = int(batch.cu_num_logits[r])
    size = int(batch.cu_num_logits[r + 1]) - lo
    tokens = [int(t) for t in batch.draft_token_ids[lo : lo + size]]
    parents = [int(p) for p in batch.tree_parent[lo : lo + size]]
    ref = list(trace.tokens)
    prod = out.request(r)
    if out.accepted_nodes is None:
        return Divergence(r, 0, "length", None, None, np.inf, 0.0, False,
                          note="; a tree batch's output carries accepted_nodes (SPEC 5)"), 0
    path = out.path(r)
    node = 0
    for level in range(len(ref)):
        mine = path[level] if level < len(path) else None
        tok = prod[level] if level < len(prod) else None
        if greedy:
            arg = _at_step(trace, level, "argmax")
            if arg is None:
                return Divergence(r, level, "length", None, tok, np.inf, 0.0, False), level
            if tok != arg.token:
                gap, tol = _gap_and_tolerance(arg, tok, eps)
                return Divergence(r, level, "argmax", arg.token, tok, gap, tol, gap <= tol), level
            first = next((c for c in range(1, size) if parents[c] == node and tokens[c] == arg.token), None)
            if mine != first:
                return Divergence(r, level, "prefix", arg.token, tok, np.inf, 0.0, False,
                                  note=f"; greedy trees accept the first child of node {node} with the argmax token "
                                       f"(node {first}), the production's path {path}"), level
            if first is None:
                return None, level
            node = first
            continue
        tried = [d for d in trace.decisions if d.kind == "accept" and d.step == level]
        for d in tried:
            c = d.row - lo
            if d.accepted == (mine == c):
                continue
            if getattr(d, "what", "") == FREE:
                return Divergence(r, level, "accept", ref[level], tok, np.nan, 0.0, True, free=True,
                                  note=f"; free: child {c}'s q~(x) is below 2**-126 (SPEC 4c, as section 4)"), level
            tol = eps * d.scale
            return Divergence(r, level, "accept", ref[level], tok, d.margin, tol, abs(d.margin) <= tol,
                              note=f"; child {c} (token {d.token}) of node {node}: the reference "
                                   f"{'accepted' if d.accepted else 'rejected'} it, the production's path is {path}"), level
        accepted = next((d.row - lo for d in tried if d.accepted), None)
        if accepted is None and mine is not None:
            return Divergence(r, level, "length", ref[level], tok, np.inf, 0.0, False,
                              note=f"; the production accepted node {mine}, which the reference never tried "
                                   f"(children of node {node}: {[d.row - lo for d in tried]})"), level
        if accepted is not None:
            node = accepted
            continue
        if tok != ref[level]:
            return _final_divergence(r, level, trace, ref[level], tok, eps), level
        if len(prod) != len(ref):
            return Divergence(r, level, "length", ref[level], tok, np.inf, 0.0, False), level
        return None, level
    return None, len(ref) - 1


def _stochastic_compared(trace, last_step: int, greedy: bool) -> int:
    if greedy:
        return 0
    return sum(1 for d in trace.decisions if d.kind not in ("residual", "mask") and d.step <= last_step)


def deviation_tally(traces) -> dict[str, int]:
    """`{deviation name: decisions}`: the reference's decisions that a declared deviation's rule decided
    (SPEC 11; `Decision.deviation`), over the given traces."""
    out: dict[str, int] = {}
    for trace in traces:
        for d in trace.decisions:
            name = getattr(d, "deviation", "")
            if name:
                out[name] = out.get(name, 0) + 1
    return out


def mask_near_ties(trace, last_step: int, eps: float) -> list:
    """The mask decisions of the trace, on steps up to `last_step`, that a float32 sampler may decide
    the other way (`|margin| <= eps * L`), the closest first. An exact tie of min-p or top-k (margin 0:
    a token equal to `t`, or to the maximum at `min_p = 1`) is kept, in any precision: never excused."""
    near = [d for d in trace.decisions if d.kind == "mask" and d.step <= last_step
            and abs(d.margin) <= eps * d.scale and not (d.margin == 0 and getattr(d, "what", "") != "top_p")]
    return sorted(near, key=lambda d: abs(d.margin) / d.scale)


def _mask_alternatives(near: list) -> list[dict]:
    """Flip sets to try: each near-tie token alone (closest first), then all of them together."""
    singles = [{d.row: {d.token}} for d in near[: MAX_MASK_ALTERNATIVES - 1]]
    if len(near) <= 1:
        return singles
    every: dict = {}
    for d in near:
        every.setdefault(d.row, set()).add(d.token)
    return singles + [every]


def _mask_excusal(batch, out, r, trace, last_step, eps, reference) -> Divergence | None:
    """An excused "mask" divergence when request `r`'s production output is what the reference emits
    with some near-tie mask decisions flipped (and that comparison certifies), else None."""
    near = mask_near_ties(trace, last_step, eps)
    if not near or reference is None:
        return None
    sub = select_requests(batch, [r])
    lo = int(batch.cu_num_logits[r])
    mine = _one_request(out, r)
    for flips in _mask_alternatives(near):
        _, alt = reference.verify_with_trace(sub, flips={j - lo: tokens for j, tokens in flips.items()})
        again = compare_decisions(sub, mine, alt, eps)
        if not again.failed:
            d = near[0]
            what = ", ".join(f"row {j} token(s) {sorted(t)}" for j, t in flips.items())
            return Divergence(r, d.step, "mask", None, None, d.margin, eps * d.scale, True,
                              note=f"; explained by the mask near-tie(s) {what} decided the other way "
                                   f"({getattr(d, 'what', '') or 'mask'} margin {d.margin:.3g})")
    return None


def _one_request(out, r: int) -> SamplerOutput:
    """Request `r`'s output as a batch of one (its accepted nodes with it, SPEC 4c)."""
    nodes = None if out.accepted_nodes is None else out.accepted_nodes[r : r + 1]
    return SamplerOutput(sampled=out.sampled[r : r + 1], num_sampled=out.num_sampled[r : r + 1], accepted_nodes=nodes)


def _accepted_by(prod, drafts, i: int) -> bool:
    """Whether the production accepted draft `i`: it emitted the draft id there and went on."""
    return len(prod) > i + 1 and prod[i] == int(drafts[i])


def _free_choice(batch, out, r, div, eps, reference, decided) -> tuple[Divergence | None, int] | None:
    """SPEC 4 leaves the acceptance test of a draft with `q(d)` 0 or below `2**-126` free: when request
    `r`'s first divergence is such a test, compare it again with the reference taking the
    production's choice (`verify_with_trace(decided=...)`), so the token emitted after it is still
    certified. `(its first divergence or None, its stochastic decisions)`, or None without a reference."""
    if reference is None:
        return None
    sub = select_requests(batch, [r])
    lo = int(batch.cu_num_logits[r])
    mine = SamplerOutput(sampled=out.sampled[r : r + 1], num_sampled=out.num_sampled[r : r + 1])
    taken = {**{j - lo: a for j, a in decided.items() if lo <= j < int(batch.cu_num_logits[r + 1])},
             div.step: _accepted_by(out.request(r), batch.draft_tokens(r), div.step)}
    _, alt = reference.verify_with_trace(sub, decided=taken)
    again = compare_decisions(sub, mine, alt, eps, reference=reference, decided=taken)
    found = again.divergences[0] if again.divergences else None
    if found is not None:
        found.request = r
        found.note += f"; after the free acceptance test of step {div.step} (q(d) below 2**-126, SPEC 4)"
    return found, again.stochastic


def compare_decisions(batch, out, traces, eps: float = DEFAULT_EPS, *, reference=None, decided=None) -> Comparison:
    """Every first divergence per request between production output `out` and reference traces.

    With `reference` (the oracle that made the traces), a divergence that is not itself a near-tie
    is still excused when a near-tie mask decision of the request, decided the other way, explains it,
    and an acceptance test SPEC 4 leaves free (a draft with `q(d)` 0 or below `2**-126`) follows the
    production's choice (`decided`: the rows already taken so, `{row: accepted}`), the tokens after
    it compared; without a reference such a choice that differs fails.
    """
    result = Comparison()
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, dtype=np.int64)]
    block = getattr(batch, "verification", None) == methods.BLOCK.name
    tree = getattr(batch, "verification", None) == methods.TREE.name
    for trace in traces:
        r = trace.request
        greedy = bool(temps[r] == 0)
        ref, prod = list(trace.tokens), out.request(r)
        drafts = batch.draft_tokens(r)
        if tree:  # SPEC 4c: level by level, the accepted child and the emitted token
            div, last = _tree_divergence(r, trace, batch, out, eps, greedy)
        else:
            compare = _block_divergence if block and not greedy else _token_divergence
            div, last = compare(r, trace, drafts, ref, prod, eps)
        if div is not None and div.free:  # not compared from the free step on (SPEC 4, read for 4b)
            result.free.append(div)
            result.stochastic += _stochastic_compared(trace, div.step - 1, greedy)
            continue
        free = div is not None and div.kind == "accept" and getattr(_at_step(trace, div.step, "accept"), "what", "") == FREE
        again = _free_choice(batch, out, r, div, eps, reference, decided or {}) if free else None
        if again is not None:
            div, stochastic = again
            if div is not None:
                result.divergences.append(div)
            result.stochastic += stochastic
            continue
        if div is not None and not div.excused and not greedy:
            scope = len(drafts) if block or tree else div.step  # a tree's mask decisions: every node's row
            div = _mask_excusal(batch, out, r, trace, scope, eps, reference) or div
        if div is not None:
            ruled = sorted({d.deviation for d in trace.decisions if getattr(d, "deviation", "") and d.step <= div.step})
            if ruled and not div.excused:  # SPEC 11: the reference applied a declared rule on the way
                div.note += (f"; the reference applied the declared deviation {', '.join(ruled)} at or before this "
                             "step (a sampler that does not have it diverges on its edge)")
            result.divergences.append(div)
        result.stochastic += _stochastic_compared(trace, last if div is not None else len(drafts), greedy)
    return result
