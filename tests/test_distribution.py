"""Distribution (SPEC section 8): fixed-seed tests of fit, proof of their power on planted biases,
and the power the module states (computed with scipy.stats) checked by simulation."""

import dataclasses

import numpy as np
import pytest

from mutants.mutation import load_patched
from rs_verify.engine.runner import make_context
from rs_verify.properties import PROPERTIES
from rs_verify.properties import PropertyFailure
from rs_verify.properties import distribution as dist
from rs_verify.properties import distribution_sequences as seqs
from rs_verify.properties.distribution_fit import bins, binomial_fit, chisquare_fit
from rs_verify.contract.probs import target_probs

# Planted biases in a copy of the reference (the files on disk stay untouched), each with the
# campaigns that must reject it at the ci trial count.
PADDED_FROM_Q = ("rej = np.flatnonzero(~bonus & valid[rows])",
                 "rej = np.flatnonzero(~bonus & (valid[rows] | (slab.b.draft is not None)))")
EMPTY_TO_TOKEN_0 = ("used = r.any(axis=1) if dev is None else ~empty32", "used = np.ones(r.shape[0], bool)")
PLANTED = {
    "residual |p - q| instead of max(p - q, 0)": (
        [("np.maximum(r, 0.0, out=r)", "np.abs(r, out=r)")], ["distribution_model_drafts"]),
    "temperature applied to the target only": (
        [("return divide(q, self.row_temp[rows], out=q)", "return q")], ["closed_forms"]),
    "one-hot residual keeps the rejected draft": (
        [("logr[np.arange(rej.size), d] = -np.inf", "pass")], ["distribution_one_hot_drafts"]),
    # Padded model drafts resampled from max(p - q, 0) with the q of a step that proposed nothing.
    "padded residual from q": ([PADDED_FROM_Q], ["distribution_model_drafts", "closed_forms"]),
    # An empty residual's Gumbel argmax over all -inf scores: token 0, with no fallback to p.
    "empty residual emits token 0": ([EMPTY_TO_TOKEN_0], ["distribution_saturated_residuals", "closed_forms"]),
    # Both, as measured in vLLM's MRV2 rejection_sample (DESIGN): a padded draft on saturated
    # rows then has an empty residual too.
    "vLLM MRV2 padded and empty residuals": (
        [PADDED_FROM_Q, EMPTY_TO_TOKEN_0], ["distribution_saturated_residuals"]),
}
# Block verification (SPEC 4b, reference/block.py) and the sampling parameters (SPEC 2, reference/masks.py).
PLANTED_ELSEWHERE = {
    "block: tau at the first rejection (no rescue by a later step)": ("block.py", [
        ("tau = result.tau(u)", "tau = np.cumprod(u <= result.h, axis=1).sum(axis=1).astype(np.int64)")],
        ["block_closed_forms", "distribution_block_sequences"]),
    "block: residual max(p - q, 0) without P_{tau-1}": ("block.py", [
        ('"log_scale": result.residual_log_scale(tau)', '"log_scale": np.zeros(nb)')], ["block_closed_forms"]),
    "block: h_i = P_i at every step (the token-wise rule)": ("block.py", [
        ("h=thresholds(log_prefix, z, m)", "h=np.exp(log_prefix)")],
        ["block_closed_forms", "distribution_block_sequences"]),
    "block: a draft the target excludes extends the block": ("block.py", [
        ("log_prefix = prefix_ratios(log_pd, log_qd, m,",
         "log_prefix = prefix_ratios(np.where(np.isneginf(log_pd), 0.0, log_pd), log_qd, m,")],
        ["block_closed_forms", "distribution_block_sequences"]),
    "block: Z_{i+1} scaled by P_{i+1} instead of P_i": ("block.py", [
        ("big_p = np.exp(log_prefix[ri[zs], st[zs] - 1])", "big_p = np.exp(log_prefix[ri[zs], st[zs]])")],
        ["block_closed_forms", "distribution_block_sequences"]),
    # vLLM #42744 (V1 sampler): the masks reach only the bonus token.
    "sampling parameters on the bonus row only": ("masks.py", [("    on = rp.any\n", "    on = rp.any & slab.bonus\n")],
                                                  ["distribution_sampling_params"]),
}
for _bug, (_file, _patches, _props) in PLANTED_ELSEWHERE.items():
    PLANTED[_bug] = (_patches, _props)
CASES = [(bug, prop) for bug, (_, props) in PLANTED.items() for prop in props]


def _run(name, sampler, profile="ci", campaign=None):
    trials = dist.TRIALS[profile]
    if name in dist.SEQUENCE_PROPERTIES:
        ctx = make_context(sampler, None, profile=profile, device="cpu")
        PROPERTIES[name].check(ctx, None)
        return
    if name == "closed_forms":
        result = dist.run_closed_forms(sampler, trials)
    else:
        result = dist.run_campaign(sampler, campaign or dist.CAMPAIGNS[name], trials)
    dist.check_campaign(result, name)


@pytest.mark.parametrize(("bug", "prop"), CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_planted_bias_is_detected(bug, prop):
    where = PLANTED_ELSEWHERE[bug][0] if bug in PLANTED_ELSEWHERE else "slab.py"
    mutant = load_patched("rs_verify.reference", {where: PLANTED[bug][0]}).ReferenceSampler()
    with pytest.raises(PropertyFailure, match="does not fit"):
        _run(prop, mutant)


def test_unsalted_drafter_is_detected(reference):
    """Drafts drawn with the resample's own noise stream (no salt) bias the output (DESIGN: shared
    draft/resample noise); the same campaign with the salted stream passes (test_distribution)."""
    campaign = dataclasses.replace(dist.CAMPAIGNS["distribution_model_drafts"], draft_salt=0)
    with pytest.raises(PropertyFailure, match="does not fit"):
        _run("distribution_model_drafts", reference, campaign=campaign)


def test_laws_of_padded_and_masked_drafts():
    """Closed forms: a padded draft is never accepted and resamples from p; so does a masked draft
    on saturated rows (empty residual); an unpadded request can reach its bonus row."""
    c = dist.CAMPAIGNS["distribution_saturated_residuals"]
    batch, group, pattern = dist.build_batch(c, len(c.temperatures) * len(c.draft_patterns))
    for u, pat in enumerate(c.distinct_patterns):
        r = int(np.flatnonzero(pattern == u)[0])
        law = dist.acceptance_lengths(batch, r, from_q=np.array(list(pat)) == "q")
        stop = min((i for i, k in enumerate(pat) if k != "q"), default=c.steps)
        assert law[stop] >= 1 - c.steps * 2.0**-16 and law[stop + 1:].sum() == 0, (pat, law)
    for block in dist.CLOSED_FORMS:
        drafts = dist.closed_form_drafts(block, block.vocab + 1)
        batch, _, _ = dist.build_batch(block, block.vocab + 1, drafts=drafts)
        laws = {d: (want, law, what) for d, want, law, what in dist.closed_form_laws(block, batch, drafts)}
        p = target_probs(batch)[0]
        assert laws[-1][0] == 0.0 and np.array_equal(laws[-1][1], p), laws[-1]
        if block.rows == "saturated":
            masked = [d for d in range(block.vocab) if p[d] == 0]
            assert masked and all(laws[d][0] == 0 and np.array_equal(laws[d][1], p) for d in masked)


# -- the stated power -----------------------------------------------------------------------


def test_docstring_states_the_computed_power():
    """The module docstring's table is `power_table()` (regenerate it when a campaign changes)."""
    assert dist.power_table() in dist.__doc__


def _worst_case_bias(expected, n, d):
    """A law at total variation d from `expected` on the tested bins, moving mass proportionally to
    p between two halves of near-equal mass: the bias that minimises the chi-square non-centrality."""
    groups, rare = bins(expected, n)
    mass = np.array([expected[g].sum() for g in groups])
    order = np.argsort(-mass)
    up = np.zeros(len(groups), bool)
    total = 0.0
    for i in order:  # greedy split into halves of near-equal mass
        if total + mass[i] <= 0.5 or total == 0.0:
            up[i], total = True, total + mass[i]
    biased = expected.copy()
    for i, g in enumerate(groups):
        scale = d / total if up[i] else -d / (1 - total)
        biased[g] += scale * expected[g]
    return biased / biased.sum()


def test_stated_power_holds_by_simulation():
    """For every campaign's weakest principal test at ci (and the weakest acceptance-frequency
    test), a bias of exactly the stated smallest detectable TV is rejected, at the campaign's own
    per-test level, in >= 291 of 300 simulated runs: the stated power is >= 0.99, and at exactly
    0.99 ten or more misses in 300 have probability binom.sf(9, 300, 0.01) = 1.0e-3."""
    rng = np.random.default_rng(5)
    cases = []
    for row in dist.campaign_power("ci"):
        cases.append((row, next(t for t in row["per_test"] if t["label"] == row["weakest_test"])))
        binomial = [t for t in row["per_test"] if t["kind"] == "binomial"]
        if binomial:  # closed_forms: its weakest acceptance-frequency test too
            cases.append((row, max(binomial, key=lambda t: t["min_tv"])))
    assert {t["kind"] for _, t in cases} == {"chi-square", "binomial"}
    for row, test in cases:
        alpha, d, n = row["test_alpha"], test["min_tv"], int(round(test["n"]))
        if test["kind"] == "binomial":
            want = next(w for name, w in _closed_form_wants() if name == test["label"])
            biased = want - d if want - d >= 0 else want + d
            hits = sum(binomial_fit("", int(k), n, want).pvalue < alpha for k in rng.binomial(n, biased, 300))
        else:
            expected = _law_of(row["property"], test["label"])
            biased = _worst_case_bias(expected, n, d)
            tokens = [np.repeat(np.arange(expected.size), rng.multinomial(n, biased)) for _ in range(300)]
            hits = sum(chisquare_fit("", t, expected).pvalue < alpha for t in tokens)
        assert hits >= 291, (row["property"], test, hits)


def _law_of(prop, label):
    if prop in dist.SEQUENCE_PROPERTIES:
        trials = dist.TRIALS["ci"]
        tests = seqs.closed_form_powers(trials) if prop == "block_closed_forms" else seqs.sequence_powers(trials)
        return next(law for name, _, _, law in tests if name == label)
    if prop == "closed_forms":
        for c in dist.CLOSED_FORMS:
            drafts = dist.closed_form_drafts(c, c.vocab + 1)
            batch, _, _ = dist.build_batch(c, c.vocab + 1, drafts=drafts)
            for d, _, law, what in dist.closed_form_laws(c, batch, drafts):
                if label == f"{dist._draft_name(c, d)}: {what}":
                    return law
    c = dist.CAMPAIGNS[prop]
    batch, group, pattern = dist.build_batch(c, len(c.temperatures) * len(c.draft_patterns))
    counts = dist.counts_of(c, dist.TRIALS["ci"])
    return next(f.expected for f in dist.plan_fits(c, batch, group, pattern, counts) if f.label == label)


def _closed_form_wants():
    for c in dist.CLOSED_FORMS:
        drafts = dist.closed_form_drafts(c, c.vocab + 1)
        batch, _, _ = dist.build_batch(c, c.vocab + 1, drafts=drafts)
        for d, want, _, _ in dist.closed_form_laws(c, batch, drafts):
            yield f"{dist._draft_name(c, d)}: acceptance", want


def test_campaigns_hand_their_batch_over_in_slices(reference, monkeypatch):
    """`campaign_call` slices whole requests (`CAMPAIGN_SLICE` a call) and concatenates the outputs: on the
    reference, whose requests do not depend on each other, the result is the one-call output bit for bit."""
    from rs_verify.properties import assertions
    from rs_verify.properties.assertions import assert_same_output, call, campaign_call

    batch, _, _ = dist.build_batch(dist.CAMPAIGNS["distribution_model_drafts"], 103)
    calls = []
    spy = lambda b: calls.append(b.num_reqs) or reference(b)  # noqa: E731
    monkeypatch.setattr(assertions, "CAMPAIGN_SLICE", 25)
    sliced = campaign_call(spy, batch)
    assert calls == [25, 25, 25, 25, 3]
    assert_same_output(sliced, call(reference, batch), what="sliced campaign vs one call", batch=batch)
