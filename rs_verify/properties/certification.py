"""Certified equivalence with the reference (SPEC section 8): the property, the excusal cap and the
logprobs comparison. The decision-by-decision comparison (token-wise, block and mask decisions,
and which near-ties it excuses) is `rs_verify.properties.decisions`.

Excusals are capped: a certified batch (one sampler call) whose excused divergences exceed
`max(2, 1%)` of the stochastic decisions it compared fails.
"""

from __future__ import annotations

import numpy as np

from ..contract import probs
from ..contract.deviations import shipped as shipped_deviations
from ..contract.masks import batch_masks
from ..harness.context import certifying_reference
from ..harness.record import DeclarationError
from .assertions import call, event
from .decisions import (  # noqa: F401  (re-exported: the comparison's public names)
    DEFAULT_EPS,
    EXCUSE_FLOOR,
    EXCUSE_SHARE,
    Comparison,
    Divergence,
    compare_decisions,
    deviation_tally,
    mask_near_ties,
)
from .registry import PropertyFailure, register
from .inputs import certifiable_batches
from .transforms import copies_note, reported_on, reseeded_copies

LOGPROB_RTOL = 1e-4  # SPEC section 6: logprobs within 1e-4 * L of the reference
# Each drawn batch is verified together with reseeded copies of its requests: the same
# structure yields four times the stochastic decisions for one sampler call. Measured on a
# sampler with a |p - q| residual: 4% of single batches expose it, 12% with R <= 8.
REPLICAS = 4


def _logprob_rows(batch) -> np.ndarray:
    """Float64 log-softmax over [0, V) of the logits that `logprobs_mode` selects: raw, or processed
    (temperature, then SPEC 2's masks over [0, V'); the tokens of [V', V) are no mask decisions)."""
    x = np.asarray(batch.target_logits)
    if batch.logprobs_mode == "processed":
        x = probs.process(x, np.asarray(batch.temperature)[probs.row_states(batch)])
        if batch.sampling_params_on():
            vp = batch.effective_vocab_size
            x = x.copy()
            x[:, :vp] = np.where(batch_masks(batch, x[:, :vp]).kept, x[:, :vp], np.float32(-np.inf))
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


def undeclared_deviation(ctx, batch, out) -> str:
    """`"; looks like `NAME`; ..."` when the reference applying a shipped deviation the sampler does not
    declare (SPEC 11) certifies `out` on `batch`, else `""`."""
    rec = ctx.record
    for cand in shipped_deviations():
        if cand.name in rec.applied.names:  # declared, maybe in another view (SPEC 11)
            continue
        try:
            oracle = certifying_reference(ctx.reference, rec.replace(deviations=rec.deviations | {cand.name}))
        except DeclarationError:  # it rules an edge a declared one rules
            continue
        if oracle is None:
            continue
        _, traces = oracle.verify_with_trace(batch)
        cmp = compare_decisions(batch, out, traces, reference=oracle)
        if not cmp.failed and len(cmp.excused) <= cmp.excuse_cap:
            return f"\nlooks like `{cand.name}` (SPEC section 11: {cand.doc}); declare it if it is known"
    return ""


@register("certified_equivalence", "certification", strategy=certifiable_batches,
          needs=("certifiable_streams", "reference"),
          examples_scale=1.5, cost=150,
          why_kept="Every decision against the float64 reference with its margin: the broadest net.")
def certified_equivalence(ctx, drawn) -> None:
    """Every decision equals the float64 reference's, except a few excused near-ties (SPEC section 8)."""
    batch = reseeded_copies(drawn, REPLICAS, seed=int(drawn.num_logits))
    oracle = ctx.oracle  # the reference drawing the sampler's stream family
    ref_out, traces = oracle.verify_with_trace(batch)
    with reported_on(drawn):  # the output rules (SPEC 4-6) fail at the call
        out = call(ctx.sampler, batch)
    cmp = compare_decisions(batch, out, traces, reference=oracle)
    ctx.sampler.count_deviations(deviation_tally(traces))  # SPEC 11: what each declared rule decided
    n_excused = len(cmp.excused)
    event(f"excused divergences: {min(n_excused, 3)}{'+' if n_excused >= 3 else ''}")
    ctx.count("excused", n_excused)
    ctx.count("free_block_decisions", len(cmp.free))  # after a q_i(d_i) below 2**-126: SPEC 4 read for 4b
    ctx.count("stochastic_decisions", cmp.stochastic)
    try:
        certify(cmp, batch=drawn, note=copies_note(drawn))
    except PropertyFailure as exc:
        raise PropertyFailure(f"{exc}{undeclared_deviation(ctx, batch, out)}", batch=exc.batch,
                              details=exc.details) from None
    # A request with a mask near-tie may hold logprobs of the other mask (within tolerance): not compared.
    skip = {d.request for d in cmp.divergences} | {t.request for t in traces if mask_near_ties(t, batch.num_logits,
                                                                                                DEFAULT_EPS)}
    diff = compare_logprobs(batch, out, ref_out, skip)
    if diff:
        raise PropertyFailure(f"logprobs differ from the reference{copies_note(drawn)}: {diff}", batch=drawn)
