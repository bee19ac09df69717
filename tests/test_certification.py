"""Certified equivalence (SPEC section 8): decisions equal the float64 reference's, except a few
excused near-ties, with tolerances taken from the tokens each decision compares."""

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings

from conftest import no_shrink
from mutants.catalogue import by_name
from rs_verify.reference import ReferenceSampler, acceptance_uniforms
from rs_verify.engine.runner import make_context, run as run_property
from rs_verify.properties import PROPERTIES, PropertyFailure
from rs_verify.properties.certification import DEFAULT_EPS, certify, compare_decisions, compare_logprobs
from rs_verify.properties.inputs import certifiable_batches
from rs_verify.contract.batch import SamplerOutput, SpecBatch

NEG = -np.inf
FILLER = -1e4


def test_extreme_rows_are_certified(reference):
    """Certification draws the extreme pattern too (logits near the float32 limit)."""
    ctx = make_context(reference, reference, profile="ci")
    extreme = find(certifiable_batches(ctx), lambda b: np.nanmax(np.abs(np.where(
        np.isfinite(b.target_logits), b.target_logits, 0))) > 1e30,
        settings=settings(database=None, derandomize=True, max_examples=200, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck)))  # the first such draw: no shrinking
    assert extreme.num_reqs >= 1


# -- tolerances from the compared tokens: a filler token hides nothing --------------------------


def model_draft_batch(seed: int, *, filler: bool, reqs: int = 24, k: int = 4, v: int = 40) -> SpecBatch:
    """Requests with T far from 1 (0.3-0.6 or 1.7-3), draft logits a noisy copy of the target (q close to p,
    so acceptance is decided by u) and drafts drawn from q; with `filler`, one more token with logit -1e4 in
    every target and draft row (probability 0 in float64, never drafted)."""
    rng = np.random.default_rng(seed)
    rows = reqs * (k + 1)
    x = (rng.standard_normal((rows, v)) * 2).astype(np.float32)
    dl = np.empty((reqs, k, v), np.float32)
    ids = np.zeros(rows, np.int64)
    temp = np.where(rng.random(reqs) < 0.5, rng.uniform(0.3, 0.6, reqs), rng.uniform(1.7, 3.0, reqs))
    for r in range(reqs):
        for i in range(k):
            dl[r, i] = x[r * (k + 1) + i] + rng.standard_normal(v).astype(np.float32) * 0.5
            q = np.exp(dl[r, i] / temp[r] - (dl[r, i] / temp[r]).max())
            ids[r * (k + 1) + i + 1] = rng.choice(v, p=q / q.sum())
    if filler:
        x = np.hstack([x, np.full((rows, 1), FILLER, np.float32)])
        dl = np.concatenate([dl, np.full((reqs, k, 1), FILLER, np.float32)], axis=2)
    return SpecBatch(
        target_logits=x, draft_logits=dl, draft_token_ids=ids,
        cu_num_logits=(np.arange(reqs + 1) * (k + 1)).astype(np.int32),
        pos=rng.integers(0, 2**40, rows).astype(np.int64), idx_mapping=np.arange(reqs, dtype=np.int32),
        temperature=temp.astype(np.float32), seeds=rng.integers(-(2**63), 2**63 - 1, reqs, dtype=np.int64),
        num_speculative_steps=k,
    )


def _failures(sampler, batch, reference) -> int:
    _, traces = reference.verify_with_trace(batch)
    return len(compare_decisions(batch, sampler(batch), traces).failed)


def test_filler_token_keeps_draft_temperature_failures(reference):
    """A draft-temperature bug (q = softmax(draft) instead of softmax(draft / T), planted in memory in a copy of
    the reference that keeps the triton-philox streams) fails just as often with a never-sampled -1e4 token in every row.
    Under the old rule (L = the largest |z| of the row) the filler made L >= 1e4 / T and excused most of them."""
    mutant = by_name("ref_own_rng_draft_temperature_ignored").load().ReferenceSampler()
    plain = [_failures(mutant, model_draft_batch(s, filler=False), reference) for s in range(3)]
    filled = [_failures(mutant, model_draft_batch(s, filler=True), reference) for s in range(3)]
    assert filled == plain and min(plain) >= 3, (plain, filled)
    ctx = make_context(mutant, reference)
    # The output rules held at every call may see it first: a resample outside the true residual.
    with pytest.raises(PropertyFailure, match="differ from the reference|outside the residual"):
        PROPERTIES["certified_equivalence"].check(ctx, model_draft_batch(0, filler=True))
    # The correct sampler passes the same batches.
    PROPERTIES["certified_equivalence"].check(make_context(reference, reference), model_draft_batch(0, filler=True))


# -- the excusal cap -----------------------------------------------------------------------------


def near_tie_batch(reqs: int, ties: int, v: int = 8) -> SpecBatch:
    """One-hot drafts, one per request: for the first `ties` requests p(d) = u * exp(-1e-6) (rejected by a hair),
    for the others p(d) = u * exp(-1) (clearly rejected)."""
    cu = (np.arange(reqs + 1) * 2).astype(np.int32)
    base = SpecBatch(
        target_logits=np.zeros((2 * reqs, v), np.float32), draft_logits=None,
        draft_token_ids=np.tile([0, 3], reqs).astype(np.int64), cu_num_logits=cu,
        pos=np.arange(2 * reqs, dtype=np.int64) * 11 + 5, idx_mapping=np.arange(reqs, dtype=np.int32),
        temperature=np.ones(reqs, np.float32), seeds=np.arange(reqs, dtype=np.int64) * 7919 + 1,
        num_speculative_steps=1,
    )
    u = acceptance_uniforms(base)[cu[:-1]].astype(np.float64)
    target = u * np.exp(np.where(np.arange(reqs) < ties, -1e-6, -1.0))  # p(d) wanted
    x = np.zeros((2 * reqs, v), np.float32)
    x[cu[:-1], 3] = np.log((v - 1) * target / (1 - target))  # p(d) = e^a / (e^a + v - 1)
    return base.replace(target_logits=x)


class Nudged:
    """The reference on the batch with every draft's target logit raised by 1e-4: decisions within about
    1e-4 of a tie flip, others do not (an error of the size float32 rounding never makes)."""

    name, streams = "nudged", "spec"

    def __call__(self, batch, *, max_chunk_logits=None):
        x = np.array(batch.target_logits)
        cu = np.asarray(batch.cu_num_logits)
        for r in range(batch.num_reqs):
            for i, d in enumerate(batch.draft_tokens(r)):
                x[cu[r] + i, d] += np.float32(1e-4)
        return ReferenceSampler()(batch.replace(target_logits=x))


@pytest.mark.parametrize("ties", [2, 3, 24])
def test_excusal_cap(ties, reference):
    """Each flipped near-tie is excused (|m| = 1e-6 <= eps * L), but more than max(2, 1%) of the stochastic
    decisions compared fails, and the message states both numbers."""
    batch = near_tie_batch(24, ties)
    _, traces = reference.verify_with_trace(batch)
    margins = [tr.decisions[0].margin for tr in traces]
    assert all(abs(m) < 1e-5 for m in margins[:ties]) and all(m < -0.5 for m in margins[ties:])
    cmp = compare_decisions(batch, Nudged()(batch), traces)
    assert len(cmp.excused) == ties and not cmp.failed
    assert {d.kind for d in cmp.excused} == {"accept"}
    assert cmp.stochastic == 2 * 24  # an acceptance test and a resample or bonus per request
    if ties <= 2:
        certify(cmp, batch=batch)
    else:
        with pytest.raises(PropertyFailure, match=rf"{ties} excused divergences exceed max\(2, 1% of the 48 "):
            certify(cmp, batch=batch)


# -- residual-mass decisions ------------------------------------------------------------------------


def _output(tokens) -> SamplerOutput:
    return SamplerOutput(sampled=np.array([list(tokens) + [-1] * (2 - len(tokens))], np.int64),
                         num_sampled=np.array([len(tokens)], np.int32))


def _residual_batch(target_row, draft_row, draft, seed):
    x = np.array([target_row, [0.0] * len(target_row)], np.float32)
    return SpecBatch(
        target_logits=x, draft_logits=np.array([[draft_row]], np.float32),
        draft_token_ids=np.array([0, draft], np.int64), cu_num_logits=np.array([0, 2], np.int32),
        pos=np.array([40, 41], np.int64), idx_mapping=np.array([0], np.int32),
        temperature=np.ones(1, np.float32), seeds=np.array([seed], np.int64), num_speculative_steps=1,
    )


def test_empty_residual_excuses_only_tokens_that_could_gain_mass(reference):
    """p = q on {1, 2} and the draft 3 has p = 0: the residual is empty (mass 0) and the reference falls back to
    p. A production whose float32 residual kept token 1 or 2 is excused; one that emits a token with p = 0 (the
    argmax over an all -inf residual, as vLLM did, or the draft) fails."""
    batch = _residual_batch([NEG, 0, 0, NEG], [NEG, 0, 0, NEG], 3, seed=5)
    _, traces = reference.verify_with_trace(batch)
    ref = traces[0].tokens[0]
    other = 3 - ref
    found = compare_decisions(batch, _output([other]), traces).divergences
    assert [(d.kind, d.excused, d.margin, d.tolerance) for d in found] == [("residual", True, 0.0, DEFAULT_EPS)]
    for token in (0, 3):  # 3 is the rejected draft itself: num_sampled = 1 says it is a resample all the same
        found = compare_decisions(batch, _output([token]), traces).divergences
        assert [(d.kind, d.excused) for d in found] == [("argmax", False)], token
    assert "resample: the production rejected draft 3 at step 0 (num_sampled 1)" in found[0].describe()


# -- a rejection whose resample is the draft id: reported as a resample ------------------------------


def _with_request(out: SamplerOutput, r: int, tokens) -> SamplerOutput:
    sampled, num = out.sampled.copy(), out.num_sampled.copy()
    sampled[r] = -1
    sampled[r, : len(tokens)] = tokens
    num[r] = len(tokens)
    return SamplerOutput(sampled=sampled, num_sampled=num)


def test_rejection_that_emits_the_draft_id_is_a_resample_divergence(reference):
    """A sampler that rejects a draft and emits the draft id itself (vLLM's token 0 from an empty residual,
    when the draft was token 0): its num_sampled shows the rejection, so the failure names the resample (an
    argmax divergence with the resample's gap), never "acceptance test diverges" with the test's margin. A
    sampler that rejects a draft the reference accepted, and resamples that same id, fails on the acceptance
    test, with the same note."""
    batch = model_draft_batch(1, filler=False)
    out, traces = reference.verify_with_trace(batch)
    n = batch.num_draft_tokens
    rejected = [(r, int(out.num_sampled[r]) - 1) for r in range(batch.num_reqs) if out.num_sampled[r] <= n[r]]
    r, t = next((r, t) for r, t in rejected if out.request(r)[t] != batch.draft_tokens(r)[t])
    d = int(batch.draft_tokens(r)[t])
    acc = next(x for x in traces[r].decisions if x.kind == "accept" and x.step == t)
    assert not acc.accepted and abs(acc.margin) > 1e-3  # the reference rejects clearly
    prod = _with_request(out, r, out.request(r)[:t] + [d])
    [div] = compare_decisions(batch, prod, traces).divergences
    assert (div.request, div.step, div.kind, div.prod_token, div.excused) == (r, t, "argmax", d, False)
    assert div.margin != acc.margin
    text = div.describe()
    assert text.startswith(f"request {r}, step {t}: argmax diverges") and "acceptance test" not in text
    assert f"resample: the production rejected draft {d} at step {t} (num_sampled {t + 1})" in text

    r, t = next((r, 0) for r in range(batch.num_reqs) if out.num_sampled[r] >= 2)  # the reference accepted step 0
    d = int(batch.draft_tokens(r)[0])
    [div] = compare_decisions(batch, _with_request(out, r, [d]), traces).divergences
    acc = next(x for x in traces[r].decisions if x.kind == "accept" and x.step == 0)
    assert (div.request, div.step, div.kind, div.margin) == (r, 0, "accept", acc.margin)
    assert f"the production rejected draft {d} at step 0 (num_sampled 1)" in div.describe()


def test_tiny_residual_excuses_the_fallback_token_only(reference):
    """Only token 2 has p > q (mass ~ 2e-14 <= eps): the reference emits it. A production that lost that mass to
    float32 falls back to p and emits argmax(log p + G) over {0, 1}: excused; the other token of {0, 1} is not."""
    for seed in range(6):
        batch = _residual_batch([0, 0, -30, NEG], [0, 0, NEG, NEG], 3, seed=seed)
        _, traces = reference.verify_with_trace(batch)
        assert traces[0].tokens == [2]
        res = next(d for d in traces[0].decisions if d.kind == "residual")
        fallback = int(np.argmin(res.gaps))
        assert fallback in (0, 1)
        found = compare_decisions(batch, _output([fallback]), traces).divergences
        assert [(d.kind, d.excused) for d in found] == [("residual", True)]
        if res.gaps[1 - fallback] > DEFAULT_EPS * res.scales[1 - fallback]:
            found = compare_decisions(batch, _output([1 - fallback]), traces).divergences
            assert [(d.kind, d.excused) for d in found] == [("argmax", False)]


# -- logprobs ------------------------------------------------------------------------------------


def test_logprob_tolerance_ignores_filler_tokens(reference):
    """A 0.01-nat logprob error on an ordinary token fails although the row holds a -1e4 filler token (the old
    row-wide L made the tolerance 1 nat there); the same error on the filler's own logprob is within 1e-4 * 1e4."""
    rng = np.random.default_rng(3)
    x = np.hstack([rng.standard_normal((4, 12)).astype(np.float32), np.full((4, 1), FILLER, np.float32)])
    batch = SpecBatch(
        target_logits=x, draft_logits=None, draft_token_ids=np.array([0, 2, 0, 5], np.int64),
        cu_num_logits=np.array([0, 2, 4], np.int32), pos=np.arange(4, dtype=np.int64),
        idx_mapping=np.array([0, 1], np.int32), temperature=np.array([0.8, 1.0], np.float32),
        seeds=np.array([1, 2], np.int64), num_speculative_steps=1, num_logprobs=13, logprobs_mode="raw",
    )
    ref_out = reference(batch)
    assert compare_logprobs(batch, ref_out, ref_out, set()) is None
    for col, shift, ok in ((1, 0.01, False), (13, 0.5, True)):
        lp = ref_out.logprobs
        bad = lp.logprobs.copy()
        bad[2, col] += np.float32(shift)
        out = SamplerOutput(sampled=ref_out.sampled, num_sampled=ref_out.num_sampled,
                            logprobs=type(lp)(token_ids=lp.token_ids, logprobs=bad, ranks=lp.ranks,
                                              cu_num_generated_tokens=lp.cu_num_generated_tokens))
        diff = compare_logprobs(batch, out, ref_out, set())
        assert (diff is None) == ok, diff


# -- the murmur3 family (SPEC 3b): certified against the reference drawing it --------------------


class _Declaring:
    """A sampler whose declared stream family is not the one it draws: the reference drawing `draws`,
    declaring `declares`."""

    def __init__(self, declares: str, draws: str):
        self.name, self.streams = f"{draws} declared as {declares}", declares
        self.inner = ReferenceSampler(streams=draws)

    def __call__(self, batch, *, max_chunk_logits=None):
        return self.inner(batch)


def _certification(sampler, reference, shrink=True):
    """Certification at the ci profile's budget; `shrink=False` stops at the first failing example (a kill)."""
    base = None if shrink else no_shrink()
    return run_property(PROPERTIES["certified_equivalence"], make_context(sampler, reference, profile="ci"), base)


def test_murmur3_samplers_are_certified_and_philox_noise_under_its_name_fails(reference):
    """The oracle draws the declared family (SPEC 8): a murmur3 sampler (the reference itself, and the torch
    example's own int64 port of the hash) is certified decision by decision at the ci profile; a sampler
    declaring murmur3 that draws triton-philox noise fails on a resample or bonus token, and so does one
    declaring triton-philox that draws murmur3 noise."""
    from examples.torch_sampler import murmur3_sampler

    for sampler in (ReferenceSampler(streams="murmur3"), murmur3_sampler()):
        outcome = _certification(sampler, reference)
        assert outcome.status == "passed", outcome.failure and outcome.failure.text()
        assert outcome.stats["stochastic_decisions"] >= 1000 and outcome.excused == 0
    for declares, draws in (("murmur3", "triton-philox"), ("triton-philox", "murmur3")):
        outcome = _certification(_Declaring(declares, draws), reference, shrink=False)
        assert outcome.status == "failed", (declares, draws)
        assert "argmax diverges" in outcome.failure.text(), outcome.failure.text()


def _murmur3_drawing(name, uniform, floor: bool):
    """A sampler declaring murmur3 whose noise maps the float32 uniform by `uniform` and, without `floor`,
    writes `-log(-log1p(-u))` (G = -inf at u = 1.0): the reference drawing that variant."""
    from rs_verify.contract import murmur3
    from rs_verify.contract.streams import StreamFamily

    def noise(seeds, pos, vocab, out=None):
        h = murmur3.hash_words(*murmur3.key_words(np.asarray(seeds).reshape(-1, 1), np.asarray(pos).reshape(-1, 1),
                                                  np.arange(vocab)[None, :]))
        u = uniform(murmur3.uniform_from_hash(h)).astype(np.float64)
        with np.errstate(divide="ignore"):
            g = murmur3.noise_from_uniform(u) if floor else -np.log(-np.log1p(-u))
        if out is None:
            return g
        out[...] = g
        return out

    family = StreamFamily(name=name, section="3d", acceptance=murmur3.MURMUR3.acceptance, noise=noise)
    sampler = _Declaring("murmur3", "murmur3")
    sampler.name, sampler.inner = name, ReferenceSampler(streams=family)
    return sampler


@pytest.mark.parametrize("name, uniform, floor", [
    ("no floor on 1 - u", lambda u: u, False),
    ("u floored at TINY", lambda u: np.maximum(u, np.float32(4.6566127342e-10)), True),
], ids=["no-floor", "tiny-floor"])
def test_murmur3_edge_defects_are_killed_on_drawn_batches(name, uniform, floor, reference):
    """The strategies plant murmur3's edges (u = 1.0 and u = 2**-33 deciding bonus tokens) for a sampler
    declaring the family: certification at the ci profile kills a sampler that gets G wrong only there,
    which passes the same run when the edges are not planted (random seeds never reach them)."""
    sampler = _murmur3_drawing(name, uniform, floor)
    outcome = _certification(sampler, reference, shrink=False)
    assert outcome.status == "failed" and "argmax diverges" in outcome.failure.text()
    ctx = make_context(sampler, reference, profile="ci")
    assert ctx.batch_kwargs.pop("streams") == "murmur3"
    assert run_property(PROPERTIES["certified_equivalence"], ctx).status == "passed"
