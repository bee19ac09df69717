"""Certified equivalence with the reference (SPEC section 8).

The reference decides every accept/reject, residual-mass and argmax decision in
float64 and reports its margin and tolerance scale `L`, computed from the tokens
the decision compares only (`reference.trace`). A production decision that
differs is excused only as a near-tie: `|m| <= eps * L` (acceptance), the
production token's gap `<= eps * L` with `L` over the reference's and the
production's token (argmax), or a residual whose float64 mass is `<= eps` when
the production token is what the other branch (fallback to `p`, or a residual
that float32 rounding kept) would emit within its own tolerance. The request is
then not compared further. Anything else is a failure naming the request, the
step, both tokens, the margin and the tolerance.

Excusals are capped: a certified batch (one sampler call) whose excused
divergences exceed `max(2, 1%)` of the stochastic decisions it compared fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec import probs
from .assertions import call, event
from .registry import PropertyFailure, register
from .inputs import certifiable_batches
from .transforms import copies_note, reseeded_copies

DEFAULT_EPS = 2e-4
LOGPROB_RTOL = 1e-4  # SPEC section 6: logprobs within 1e-4 * L of the reference
# SPEC section 8: excused divergences may not exceed max(EXCUSE_FLOOR, EXCUSE_SHARE * stochastic decisions).
EXCUSE_FLOOR = 2
EXCUSE_SHARE = 0.01
# Each drawn batch is verified together with reseeded copies of its requests: the same
# structure yields four times the stochastic decisions for one sampler call. Measured on a
# sampler with a |p - q| residual: 4% of single batches expose it, 12% with R <= 8.
REPLICAS = 4

_WHAT = {"accept": "acceptance test", "argmax": "argmax", "residual": "residual mass", "length": "length"}


@dataclass
class Divergence:
    request: int
    step: int
    kind: str  # "accept", "argmax", "residual" or "length"
    ref_token: int | None
    prod_token: int | None
    margin: float
    tolerance: float
    excused: bool

    def describe(self) -> str:
        return (f"request {self.request}, step {self.step}: {_WHAT[self.kind]} diverges: reference token "
                f"{self.ref_token}, production token {self.prod_token}, margin {self.margin:.6g} "
                f"(tolerance {self.tolerance:.3g})")


@dataclass
class Comparison:
    """The first divergence of every request that has one, and how many stochastic decisions
    (acceptance tests, resamples and bonus tokens of requests with `T > 0`) were compared."""

    divergences: list = field(default_factory=list)
    stochastic: int = 0

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
    """The production token's gap in an argmax-like decision and its tolerance `eps * L(ref, tok)`."""
    if tok is None or not 0 <= tok < len(dec.gaps):
        return np.inf, eps * dec.scale
    return float(dec.gaps[tok]), eps * float(dec.scales[tok])


def _step_divergence(r, i, trace, drafts, ref_tok, prod_tok, eps) -> Divergence:
    acc = _at_step(trace, i, "accept")
    if acc is not None:
        d = int(drafts[i])
        if acc.accepted != (prod_tok == d):
            tol = eps * acc.scale
            return Divergence(r, i, "accept", ref_tok, prod_tok, acc.margin, tol, abs(acc.margin) <= tol)
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


def _stochastic_compared(trace, last_step: int, greedy: bool) -> int:
    if greedy:
        return 0
    return sum(1 for d in trace.decisions if d.kind != "residual" and d.step <= last_step)


def compare_decisions(batch, out, traces, eps: float = DEFAULT_EPS) -> Comparison:
    """Every first divergence per request between production output `out` and reference traces."""
    result = Comparison()
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, dtype=np.int64)]
    for trace in traces:
        r = trace.request
        ref, prod = list(trace.tokens), out.request(r)
        drafts = batch.draft_tokens(r)
        last = max(len(ref), len(prod))
        for i in range(last):
            tr = ref[i] if i < len(ref) else None
            tp = prod[i] if i < len(prod) else None
            if tr == tp:
                continue
            if tr is None or tp is None:
                result.divergences.append(Divergence(r, i, "length", tr, tp, np.inf, 0.0, False))
            else:
                result.divergences.append(_step_divergence(r, i, trace, drafts, tr, tp, eps))
            last = i
            break
        result.stochastic += _stochastic_compared(trace, last, bool(temps[r] == 0))
    return result


def _logprob_rows(batch) -> np.ndarray:
    """Float64 log-softmax over [0, V) of the logits that `logprobs_mode` selects."""
    x = np.asarray(batch.target_logits)
    if batch.logprobs_mode == "processed":
        x = probs.process(x, np.asarray(batch.temperature)[probs.row_states(batch)])
    z = x.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def compare_logprobs(batch, out, ref_out, skip_requests: set) -> str | None:
    """Describe the first logprobs difference beyond SPEC section 6's tolerance, or None.

    The tolerance of a compared value is `1e-4 * L` with `L = max(1, |log p(x)|)` over the
    tokens it compares (SPEC section 8), never over the rest of the row.
    """
    if batch.num_logprobs is None:
        return None
    lp, rp = out.logprobs, ref_out.logprobs
    exact = _logprob_rows(batch)
    req_of_row = probs.row_requests(batch)
    with np.errstate(invalid="ignore"):  # -inf - -inf compares as NaN: equal values are caught first
        return _first_logprob_difference(batch, exact, req_of_row, lp, rp, skip_requests)


def _scale(row, *tokens) -> np.ndarray:
    """`max(1, |log p(x)|)` over the given tokens (broadcast), finite values only; out-of-range ids add nothing."""
    out = np.ones(np.broadcast_shapes(*(np.shape(t) for t in tokens)))
    for t in tokens:
        t = np.asarray(t)
        ok = (t >= 0) & (t < row.size)
        a = np.abs(row[np.where(ok, t, 0)])
        out = np.maximum(out, np.where(ok & np.isfinite(a), a, 0.0))
    return out


def _first_logprob_difference(batch, exact, req_of_row, lp, rp, skip_requests) -> str | None:
    for j in range(batch.num_logits):
        if int(req_of_row[j]) in skip_requests:
            continue
        row = exact[j]
        ids, rids = lp.token_ids[j], rp.token_ids[j]
        tol = LOGPROB_RTOL * _scale(row, ids, rids)
        a, b = lp.logprobs[j].astype(np.float64), rp.logprobs[j].astype(np.float64)
        close = (a == b) | (np.abs(a - b) <= tol)
        if not close.all():
            c = int(np.flatnonzero(~close)[0])
            return f"row {j} column {c}: logprob {a[c]} vs reference {b[c]} (tolerance {tol[c]:.3g})"
        if ids[0] != rids[0]:
            return f"row {j}: column 0 token {ids[0]} vs reference {rids[0]}"
        for c in range(1, len(ids)):
            if ids[c] != rids[c] and not (0 <= ids[c] < row.size
                                          and abs(row[ids[c]] - row[rids[c]]) <= tol[c]):
                return f"row {j} column {c}: top-k token {ids[c]} vs reference {rids[c]} (not a tie)"
        if 0 <= ids[0] < row.size:
            everyone = np.arange(row.size)
            near = int(np.sum(np.abs(row - row[ids[0]]) <= LOGPROB_RTOL * _scale(row, everyone, ids[0])))
        else:
            near = 0
        if abs(int(lp.ranks[j]) - int(rp.ranks[j])) > max(near - 1, 0):
            return f"row {j}: rank {lp.ranks[j]} vs reference {rp.ranks[j]}"
    return None


def certify(cmp: Comparison, *, batch, note: str = "") -> None:
    """Raise PropertyFailure (on `batch`) for a divergence of `cmp` that is not a near-tie, or
    for more excused divergences than SPEC section 8 allows."""
    failed, excused = cmp.failed, cmp.excused
    if failed:
        lines = "\n".join(d.describe() for d in failed)
        raise PropertyFailure(f"{len(failed)} decision(s) differ from the reference{note}:\n{lines}",
                              batch=batch, details={"divergences": [vars(d) for d in failed]})
    if len(excused) > cmp.excuse_cap:
        lines = "\n".join(d.describe() for d in excused)
        raise PropertyFailure(
            f"{len(excused)} excused divergences exceed max({EXCUSE_FLOOR}, {EXCUSE_SHARE:.0%} of the "
            f"{cmp.stochastic} stochastic decisions compared) = {cmp.excuse_cap:g}{note}; near-ties this "
            f"frequent are not float32 rounding:\n{lines}",
            batch=batch, details={"divergences": [vars(d) for d in excused], "stochastic": cmp.stochastic})


@register("certified_equivalence", "certification", strategy=certifiable_batches, needs=("spec_streams", "reference"),
          examples_scale=1.5)
def certified_equivalence(ctx, drawn) -> None:
    """Every decision equals the float64 reference's, except a few excused near-ties (SPEC section 8)."""
    batch = reseeded_copies(drawn, REPLICAS, seed=int(drawn.num_logits))
    ref_out, traces = ctx.reference.verify_with_trace(batch)
    out = call(ctx.sampler, batch)
    cmp = compare_decisions(batch, out, traces)
    n_excused = len(cmp.excused)
    event(f"excused divergences: {min(n_excused, 3)}{'+' if n_excused >= 3 else ''}")
    ctx.count("excused", n_excused)
    ctx.count("stochastic_decisions", cmp.stochastic)
    certify(cmp, batch=drawn, note=copies_note(drawn))
    diff = compare_logprobs(batch, out, ref_out, {d.request for d in cmp.divergences})
    if diff:
        raise PropertyFailure(f"logprobs differ from the reference{copies_note(drawn)}: {diff}", batch=drawn)
