"""The output rules every answer to a valid batch must meet (SPEC sections 4, 5 and 6's
`cu_num_generated_tokens`), checked wherever the suite receives an output.

`check_output_invariants(batch, out)` raises `PropertyFailure` for the first broken rule: `num_sampled`
bounds and `-1` padding, tokens in `[0, V')` with `p > 0` and not clearly masked (SPEC 2), the
accepted tokens a prefix of the drafts, the token after a rejection inside the residual, and the
logprobs' `cu_num_generated_tokens`. A sampler's declared deviations (SPEC 11) replace the rules they cover:
`rs_verify.properties.deviation_rules` says which emitted tokens a declared rule explains. `assertions.call` runs it on every output of a valid batch
that is small enough to check at little cost (`checked_here`), so every property that calls the
sampler also holds its answers to these rules; `output_invariants` is the property that draws
batches for them alone.
"""

from __future__ import annotations

import numpy as np

from ..harness.failure import PropertyFailure
from ..contract import methods, probs
from ..contract.block import block_quantities
from ..contract.deviations import Applied, applied, shipped
from ..contract.masks import batch_masks
from .deviation_rules import DeviationView
from .tree_rules import check_tree_invariants

# Outputs of larger batches (the distribution campaigns' hundreds of thousands of requests) are
# not checked at the call: the check is a Python loop over requests and float64 probabilities of
# every row (about 1 ms per 10 requests); their properties test them statistically instead.
CHECKED_MAX_REQS = 2048
CHECKED_MAX_ELEMS = 1 << 22


def checked_here(batch) -> bool:
    """Whether `assertions.call` checks the output of `batch` against the rules (its size)."""
    return batch.num_reqs <= CHECKED_MAX_REQS and batch.num_logits * batch.vocab_size <= CHECKED_MAX_ELEMS


# A resampled token must have positive residual mass p - q > 0. Production samplers
# compute p and q in float32, so a token whose float64 residual is negative by less
# than this (relative to p + q) is excused; |p - q| residuals or a residual that keeps
# the rejected draft are off by far more than this (they pick tokens with q >> p).
RESIDUAL_RTOL = 1e-4
# A token the sampling parameters mask (SPEC section 2) is never emitted. Production samplers decide
# the masks in float32: a token masked by a margin within this share of the decision's scale `L`
# (SPEC section 8's default eps, the tolerance certification excuses) is a near-tie, not an error;
# ignoring a parameter, or applying it to the wrong rows, emits tokens masked by far more.
MASK_RTOL = 2e-4


def fail_request(batch, r, msg, step=None):
    details = {"request": r} if step is None else {"request": r, "step": step}
    raise PropertyFailure(f"request {r}: {msg}", batch=batch, details=details)


def step_facts(batch, r, i, p, q) -> str:
    """What decided step `i` of request `r`: the draft id, p(d), q(d) and the residual mass.

    One-hot drafts have q(d) = 1; the residual mass is sum over [0, V') of max(p - q, 0),
    and a mass of 0 means SPEC section 4's fallback to p.
    """
    j = int(batch.cu_num_logits[r] + i)
    drafts = batch.draft_tokens(r)
    if i >= len(drafts):
        return f"bonus step {i} (all {len(drafts)} drafts accepted; samples p)"
    d = int(drafts[i])
    if not 0 <= d < p.shape[1]:
        return f"draft d = {d} (padded: a rejection resamples from p)"
    if q is None:
        qrow = np.zeros(p.shape[1])
        qrow[d] = 1.0
    else:
        qrow = q[j]
    mass = float(np.maximum(p[j] - qrow, 0.0).sum())
    kind = "one-hot" if q is None else "model"
    return (f"{kind} draft d = {d}, p(d) = {p[j, d]:.6g}, q(d) = {qrow[d]:.6g}, "
            f"residual mass sum max(p - q, 0) = {mass:.6g}" + (" (empty: falls back to p)" if mass == 0 else ""))


def check_output_invariants(batch, out, deviations=None) -> None:
    """Raise PropertyFailure unless `out` meets every SPEC section 4-5 invariant on `batch` (and section 6's
    `cu_num_generated_tokens`), with the rules of the declared `deviations` (SPEC 11; names, records or
    an `Applied`) in place of those they replace."""
    dev = applied(deviations)
    if batch.tree:  # SPEC 4c: a root path of the tree (rs_verify.properties.tree_rules)
        return check_tree_invariants(batch, out, dev, _clearly_masked(batch), fail_request)
    v = batch.effective_vocab_size
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    p = probs.target_probs(batch)
    q = probs.draft_probs(batch)
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, dtype=np.int64)]
    masked = _clearly_masked(batch)
    block = batch.verification == methods.BLOCK.name
    view = DeviationView(batch, dev, p, q) if dev else None
    for r in range(batch.num_reqs):
        n_r = int(cu[r + 1] - cu[r] - 1)
        m = int(out.num_sampled[r])
        if not 1 <= m <= n_r + 1:
            fail_request(batch, r, f"num_sampled = {m} outside [1, n_r + 1 = {n_r + 1}]")
        row = out.sampled[r]
        if (row[m:] != -1).any():
            fail_request(batch, r, f"sampled[{m}:] = {row[m:].tolist()} must be -1 padding")
        tokens = row[:m]
        bad = (tokens < 0) | (tokens >= v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail_request(batch, r, f"step {i} emitted token {tokens[i]} outside [0, V' = {v}); "
                            f"{step_facts(batch, r, i, p, q)}", step=i)
        drafts = batch.draft_tokens(r)
        if (tokens[: m - 1] != drafts[: m - 1]).any():
            i = int(np.flatnonzero(tokens[: m - 1] != drafts[: m - 1])[0])
            fail_request(batch, r, f"accepted tokens are not a prefix of the drafts: step {i} emitted {tokens[i]} "
                            f"and later steps followed; {step_facts(batch, r, i, p, q)}", step=i)
        last = m - 1
        stochastic_rejection = last < n_r and temps[r] > 0
        scale = (_block_scale(batch, r, last, p, q, view) if block else 1.0) if stochastic_rejection else 1.0
        # The steps whose token a declared deviation's rule explains (SPEC 11): not held to the SPEC's rules.
        ruled = view.explained(r, tokens, drafts, scale, bool(temps[r] > 0), block) if view is not None else {}
        for i, t in enumerate(tokens):
            j = int(cu[r] + i)
            if i in ruled:
                continue
            if not np.isfinite(batch.target_logits[j, t]):  # p > 0 exactly when the logit is finite
                fail_request(batch, r, f"step {i} emitted token {t} with p = 0 (logit {batch.target_logits[j, t]}); "
                                f"{step_facts(batch, r, i, p, q)}", step=i)
            if masked is not None and masked[0][j, t]:
                fail_request(batch, r, f"step {i} emitted token {t}, which {masked[1][j][t]} masks (SPEC section 2); "
                                f"{step_facts(batch, r, i, p, q)}", step=i)
        if stochastic_rejection and last not in ruled:  # a rejection at step `last`: check the residual
            _check_resample(batch, r, last, int(tokens[last]), int(drafts[last]), p, q, scale)
    check_cu_num_generated_tokens(batch, out)


def undeclared_hint(batch, out, deviations=None) -> str:
    """`"; looks like `NAME`; ..."` when the output meets the rules once a shipped deviation the sampler
    does not declare is added to `deviations` (SPEC 11), else `""`: a failure says what it resembles."""
    dev = applied(deviations)
    for cand in shipped():
        if cand.name in dev.names:  # declared, maybe in another view (SPEC 11)
            continue
        try:
            check_output_invariants(batch, out, Applied([*dev.records, cand]))
        except (ValueError, PropertyFailure):  # ValueError: it rules an edge a declared one rules
            continue
        return f"; looks like `{cand.name}` (SPEC section 11: {cand.doc}); declare it if it is known"
    return ""


def check_cu_num_generated_tokens(batch, out) -> None:
    """SPEC section 6: `logprobs.cu_num_generated_tokens` is `cu_num_logits` as a list, or None when N == R
    (what `LogprobsTensors.cat` keeps across chunks: a chunk's own list is wrong)."""
    if out.logprobs is None:
        return
    got = out.logprobs.cu_num_generated_tokens
    want = None if batch.num_logits == batch.num_reqs else [int(c) for c in np.asarray(batch.cu_num_logits)]
    if got is not None:
        try:
            got = [int(c) for c in got]
        except (TypeError, ValueError):
            got = repr(got)[:80]  # not a list of ints at all
    if got != want:
        def head(v):  # bounded: a large batch's list is long
            return repr(v) if not isinstance(v, list) or len(v) <= 9 else f"[{', '.join(map(str, v[:8]))}, ...]"

        raise PropertyFailure(f"logprobs.cu_num_generated_tokens = {head(got)}, SPEC section 6 wants "
                              f"{'None (N == R)' if want is None else 'cu_num_logits as a list, ' + head(want)}",
                              batch=batch)


def _check_resample(batch, r, i, token, draft, p, q, scale: float = 1.0) -> None:
    """The token emitted after a rejection at step `i` lies in the residual: `max(P p - q, 0)` for
    model drafts (`P = 1` token by token; `P_{i-1}` in block verification, SPEC 4b), `p` without the
    rejected draft for one-hot drafts; `p` itself when that residual has no positive mass."""
    j = int(batch.cu_num_logits[r] + i)
    if draft < 0 or draft >= p.shape[1]:
        return  # a padded draft resamples from p: covered by the p > 0 check
    if q is None:
        if token == draft and (np.delete(p[j], draft) > 0).any():
            fail_request(batch, r, f"step {i} rejected draft {draft} and emitted it again; "
                            f"{step_facts(batch, r, i, p, q)}", step=i)
        return
    resid = scale * p[j] - q[j]
    if (resid > 0).any() and resid[token] < -RESIDUAL_RTOL * (scale * p[j, token] + q[j, token]):
        what = "max(p - q, 0)" if scale == 1.0 else f"max(P p - q, 0) with P = {scale:.6g}"
        fail_request(batch, r, f"step {i} resampled token {token} with p = {p[j, token]:.6g}, q = {q[j, token]:.6g}: "
                        f"outside the residual {what}; {step_facts(batch, r, i, p, q)}", step=i)


def _block_scale(batch, r, tau, p, q, view=None) -> float:
    """`P_{tau-1}` of block request `r` (SPEC section 4b; 1 for `tau = 0`), with a declared deviation's
    rule for a NaN prefix ratio (SPEC 11) when `view` has one."""
    if tau == 0:
        return 1.0
    if view is not None and view.nan_rule is not None:
        return view.block_scale(r, tau)
    lo, n = int(batch.cu_num_logits[r]), len(batch.draft_tokens(r))
    qr = None if q is None else q[lo : lo + n][None]
    res = block_quantities(p[lo : lo + n + 1][None], qr, batch.draft_tokens(r)[None], np.array([n]))
    return float(res.residual_scale(np.array([tau]))[0])


def _clearly_masked(batch):
    """`(masked [N, V'], why)`: tokens SPEC 2's sampling parameters mask by more than `MASK_RTOL * L`
    (near-ties excluded) and, per row and token, the parameter that masks them; None without parameters."""
    if not batch.sampling_params_on():
        return None
    res = batch_masks(batch, probs.processed_logits(batch, masked=False))
    masked = np.zeros(res.kept.shape, bool)
    why = {}
    for name, margin, scale in res.margins():
        with np.errstate(invalid="ignore"):
            hit = (margin < 0) & (margin < -MASK_RTOL * scale) & ~masked
        for j, t in zip(*np.nonzero(hit)):
            why.setdefault(int(j), {})[int(t)] = f"{name} (margin {margin[j, t]:.4g})"
        masked |= hit
    return masked, why
