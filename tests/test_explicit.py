"""SPEC 3c, 4 and 8: the explicit family (the batch carries the random numbers), inverse-CDF
resampling and its certified margin, the race of exponentials, the three writings of the
acceptance test and drafts with q(d) = 0 left free."""

import warnings

import numpy as np
import pytest

from examples.explicit_sampler import ExplicitSampler
from rs_verify.contract import explicit
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.validation import validate
from rs_verify.contract.streams import StreamFamily, family
from rs_verify.engine.runner import make_context, pytest_run, run
from rs_verify.properties import PROPERTIES
from rs_verify.harness.context import Context
from rs_verify.harness.guards import with_explicit_noise
from rs_verify.harness.record import DeclarationError, SamplerRecord, record_of
from rs_verify.properties.certification import certify, compare_decisions
from rs_verify.properties.registry import PropertyFailure
from rs_verify.reference import ReferenceSampler


def _batch(reqs=6, k=3, v=12, seed=0, one_hot=False) -> SpecBatch:
    rng = np.random.default_rng(seed)
    rows = reqs * (k + 1)
    x = (rng.standard_normal((rows, v)) * 2).astype(np.float32)
    dl = None if one_hot else (x.reshape(reqs, k + 1, v)[:, :k] + rng.standard_normal((reqs, k, v))).astype(np.float32)
    ids = rng.integers(0, v, rows).astype(np.int64)
    return SpecBatch(target_logits=x, draft_logits=dl, draft_token_ids=ids,
                     cu_num_logits=(np.arange(reqs + 1) * (k + 1)).astype(np.int32),
                     pos=rng.integers(0, 2**40, rows).astype(np.int64), idx_mapping=np.arange(reqs, dtype=np.int32),
                     temperature=np.full(reqs, 0.8, np.float32), seeds=rng.integers(-(2**62), 2**62, reqs),
                     num_speculative_steps=k)


# -- the family and the record -------------------------------------------------------------------


def test_explicit_family_record():
    fam = family("explicit")
    assert fam is explicit.EXPLICIT and fam.keyed_by == "batch" and fam.section == "3c"
    with pytest.raises(TypeError, match="keyed by the batch"):
        fam.uniforms([1], [2])
    rec = record_of(ExplicitSampler("inverse_cdf"))
    assert rec.streams == "explicit" and rec.resample == "inverse_cdf"
    assert SamplerRecord.from_dict(rec.to_dict()) == rec
    assert SamplerRecord.from_dict({"name": "old", "streams": "explicit"}).resample == "gumbel"  # a record sent before
    with pytest.raises(DeclarationError, match="resample 'inverse_cdf' needs the explicit stream family"):
        SamplerRecord(name="x", streams="murmur3", resample="inverse_cdf")
    with pytest.raises(DeclarationError, match="resample must be one of"):
        SamplerRecord(name="x", streams="explicit", resample="alias")
    with pytest.raises(ValueError, match="keyed_by"):  # a batch-keyed family without fill
        StreamFamily(name="x", section="3c", acceptance=explicit.row_uniforms, noise=explicit.resample_gumbel,
                     keyed_by="batch")
    # The oracle is bound to the family and the resample method.
    oracle = Context(ExplicitSampler("inverse_cdf"), ReferenceSampler()).oracle
    assert oracle.family is fam and oracle.resample == "inverse_cdf"


def test_fill_is_deterministic_and_keeps_carried_noise():
    b = _batch()
    full = with_explicit_noise(ExplicitSampler(), b)
    assert full.noise_carried() == ("accept_uniforms", "resample_gumbel", "resample_uniforms")
    assert with_explicit_noise(ReferenceSampler(), b) is b  # another family: untouched
    again = explicit.filled(b)
    for name in full.noise_carried():
        assert np.array_equal(getattr(full, name), getattr(again, name))
    planted = b.replace(accept_uniforms=np.full(b.num_logits, 0.5))
    assert np.all(explicit.filled(planted).accept_uniforms == 0.5)
    # The noise belongs to its request: the second half of the batch alone draws the same.
    half = explicit.filled(b.replace(target_logits=b.target_logits[12:], draft_token_ids=b.draft_token_ids[12:],
                                     pos=b.pos[12:], cu_num_logits=b.cu_num_logits[:4],
                                     idx_mapping=b.idx_mapping[3:]))
    assert np.array_equal(half.resample_gumbel, full.resample_gumbel[3:])
    assert np.array_equal(half.accept_uniforms, full.accept_uniforms[12:])


# -- the reference reads the batch's noise -------------------------------------------------------


def _direct(b: SpecBatch) -> list:
    """SPEC 4 in float64, request by request, from the batch's own noise (Gumbel resampling)."""
    out = []
    for r in range(b.num_reqs):
        lo, hi = int(b.cu_num_logits[r]), int(b.cu_num_logits[r + 1])
        t = np.float32(b.temperature[b.idx_mapping[r]])

        def logsm(z):
            z = (np.asarray(z, np.float32) / t).astype(np.float64)
            return z - z.max() - np.log(np.exp(z - z.max()).sum())

        toks = []
        for i in range(hi - lo):
            logp = logsm(b.target_logits[lo + i])
            if i == hi - lo - 1:
                toks.append(int(np.argmax(logp + b.resample_gumbel[r])))
                break
            d = int(b.draft_token_ids[lo + i + 1])
            logq = logsm(b.draft_logits[b.idx_mapping[r], i])
            if logp[d] > np.log(b.accept_uniforms[lo + i]) + logq[d]:
                toks.append(d)
                continue
            res = np.maximum(np.exp(logp) - np.exp(logq), 0.0)
            with np.errstate(divide="ignore"):
                toks.append(int(np.argmax(np.log(res) + b.resample_gumbel[r])))
            break
        out.append(toks)
    return out


def test_reference_reads_explicit_noise():
    b = explicit.filled(_batch(reqs=12, seed=3))
    rng = np.random.default_rng(5)
    b = b.replace(accept_uniforms=rng.uniform(0.05, 0.95, b.num_logits),
                  resample_gumbel=rng.gumbel(size=b.resample_gumbel.shape))
    ref = ReferenceSampler(streams="explicit")(b)
    assert [ref.request(r) for r in range(b.num_reqs)] == _direct(b)
    # A batch without the fields reads as the drawn noise the suite fills in.
    bare = _batch(reqs=12, seed=3)
    assert np.array_equal(ReferenceSampler(streams="explicit")(bare).sampled,
                          ReferenceSampler(streams="explicit")(explicit.filled(bare)).sampled)


# -- inverse CDF and the race of exponentials ----------------------------------------------------


def test_inverse_cdf_picks_the_first_prefix_above_u():
    from rs_verify.reference import inverse_cdf

    logr = np.tile([np.log(0.25), -np.inf, np.log(0.25), np.log(0.5)], (3, 1))
    assert list(inverse_cdf.tokens(logr, np.array([0.1, 0.5, 0.25]))) == [0, 3, 2]  # S_2 = 0.5 is not > 0.5
    gaps, _ = inverse_cdf.gaps(logr[0], 0.5, 3)
    assert gaps[2] == 0.0 and gaps[1] == np.inf and gaps[0] == 0.25  # token 1 has no mass


@pytest.mark.parametrize("sampler", [ExplicitSampler("gumbel"), ExplicitSampler("race"),
                                     ExplicitSampler("inverse_cdf"), ExplicitSampler("gumbel", accept="p/q>=u")],
                         ids=lambda s: f"{s.name}-{s.accept}")
def test_explicit_samplers_are_certified(sampler):
    """Gumbel-max, the race of exponentials `argmax r / exp(-G)`, inverse CDF in float32 prefix sums and vLLM V1's
    acceptance test (`p / q >= u`, rejecting q(d) = 0) are each certified decision by decision at ci."""
    out = _at_ci(sampler)
    assert out.stats["stochastic_decisions"] >= 100  # the decision floor of a whole-budget run (about 1,500 here)


def _at_ci(sampler):
    """certified_equivalence at the ci profile against the reference (bound to the sampler's family)."""
    out = run(PROPERTIES["certified_equivalence"], make_context(sampler, ReferenceSampler(), profile="ci"))
    assert out.status == "passed" and out.failure is None, out.failure and out.failure.text()
    return out


def _boundary_batch(reqs=8, v=4) -> SpecBatch:
    """Bonus-only requests with a uniform `p` (exact in float32 and float64) and `U = 1/2`: `U * S` is the prefix
    sum of token 1 exactly, so SPEC 4's strict `S_x > U * S` emits token 2."""
    b = SpecBatch(target_logits=np.zeros((reqs, v), np.float32), draft_logits=None,
                  draft_token_ids=np.zeros(reqs, np.int64), cu_num_logits=np.arange(reqs + 1, dtype=np.int32),
                  pos=np.arange(reqs, dtype=np.int64), idx_mapping=np.arange(reqs, dtype=np.int32),
                  temperature=np.ones(reqs, np.float32), seeds=np.arange(reqs, dtype=np.int64),
                  num_speculative_steps=0)
    return explicit.filled(b).replace(resample_uniforms=np.full(reqs, 0.5))


def _certify(sampler, batch):
    oracle = ReferenceSampler(streams="explicit", resample=sampler.resample)
    _, traces = oracle.verify_with_trace(batch)
    certify(compare_decisions(batch, sampler(batch), traces, reference=oracle), batch=batch)


def test_inverse_cdf_boundary_is_strict():
    batch = _boundary_batch()
    _certify(ExplicitSampler("inverse_cdf"), batch)
    assert set(ReferenceSampler(streams="explicit", resample="inverse_cdf")(batch).sampled[:, 0]) == {2}
    # `>=` for `>`: each boundary is within the prefix-sum tolerance, but eight in one batch exceed the cap.
    with pytest.raises(PropertyFailure, match="excused divergences exceed"):
        _certify(ExplicitSampler("inverse_cdf", cdf_boundary=">="), batch)


def test_inverse_cdf_top_fallback_is_excused():
    """`U = 1 - 2**-26` is 1.0 in float32 and the last token's mass (about 7e-10) vanishes in a float32 prefix sum:
    no prefix exceeds `U * S`, and the sampler falls back to its last token with `r > 0` where the reference
    emits token 2. The boundary is `1 - S_2 / S - (1 - U)`, below `V' * 2**-23`: excused. A fallback to token 0
    instead is far from any boundary and fails."""
    b = SpecBatch(target_logits=np.array([[0, 0, 0, -21]], np.float32), draft_logits=None,
                  draft_token_ids=np.zeros(1, np.int64), cu_num_logits=np.array([0, 1], np.int32),
                  pos=np.zeros(1, np.int64), idx_mapping=np.zeros(1, np.int32), temperature=np.ones(1, np.float32),
                  seeds=np.zeros(1, np.int64), num_speculative_steps=0)
    b = explicit.filled(b).replace(resample_uniforms=np.array([1 - 2.0**-26]))
    sampler = ExplicitSampler("inverse_cdf")
    assert sampler(b).request(0) == [3] and ReferenceSampler(streams="explicit", resample="inverse_cdf")(b).request(0) == [2]
    _certify(sampler, b)

    class FallsToZero(ExplicitSampler):
        def _sample(self, batch, r, p, q, d):
            token = super()._sample(batch, r, p, q, d)
            return 0 if token == int(np.flatnonzero(p > 0)[-1]) else token

    with pytest.raises(PropertyFailure, match="differ from the reference"):
        _certify(FallsToZero("inverse_cdf"), b)


def test_inverse_cdf_over_p_fails_certification():
    with pytest.raises(AssertionError, match="outside the residual|differ from the reference|emitted it again"):
        pytest_run("certified_equivalence", ExplicitSampler("inverse_cdf", cdf_over="p"), ReferenceSampler())


def test_exponential_race_is_the_gumbel_argmax():
    """SPEC 3c: `argmax r / E` with `E = exp(-G)` is `argmax log r + G` (monotone: log(r / E) = log r + G)."""
    rng = np.random.default_rng(11)
    r = rng.dirichlet(np.full(50, 0.3), size=200)
    r[rng.random(r.shape) < 0.2] = 0.0
    g = rng.gumbel(size=r.shape)
    with np.errstate(divide="ignore"):
        assert np.array_equal(np.argmax(r / np.exp(-g), axis=1), np.argmax(np.log(r) + g, axis=1))


# -- the acceptance test's writings and q(d) = 0 -------------------------------------------------


def _one_step(q_d_logit: float, u: float, target=(0, 0, 0, 0)) -> SpecBatch:
    """One request, one model draft (token 1) whose q(d) follows from `q_d_logit`, with `u` planted."""
    x = np.zeros((2, 4), np.float32)
    x[0] = target
    dl = np.zeros((1, 1, 4), np.float32)
    dl[0, 0, 1] = q_d_logit
    b = SpecBatch(target_logits=x, draft_logits=dl, draft_token_ids=np.array([0, 1], np.int64),
                  cu_num_logits=np.array([0, 2], np.int32), pos=np.array([3, 4], np.int64),
                  idx_mapping=np.array([0], np.int32), temperature=np.ones(1, np.float32),
                  seeds=np.array([9], np.int64), num_speculative_steps=1)
    return explicit.filled(b).replace(accept_uniforms=np.array([u, 0.5]))


def test_acceptance_writings_agree_but_at_equality():
    """`u = p / q` exactly (p = 1/4, q = 1/2): `log p > log u + log q` and `u * q < p` reject, `p / q >= u` accepts;
    the margin is 0, so either outcome is certified (excused), and away from equality all three agree."""
    b = _one_step(np.log(3.0), 0.5)  # q(d) = 3 / 6
    lo = _one_step(np.log(3.0), 0.25)
    for writing in ("u*q<p", "p/q>=u"):
        s = ExplicitSampler("gumbel", accept=writing)
        _certify(s, b)
        _certify(s, lo)
        assert s(lo).num_sampled[0] == 2  # accepted
    assert ExplicitSampler("gumbel", accept="u*q<p")(b).num_sampled[0] == 1
    assert ExplicitSampler("gumbel", accept="p/q>=u")(b).num_sampled[0] == 2


def test_draft_with_q_zero_is_free():
    """q(d) = 0 in float32 (logit -200 against 0): the reference accepts (p / q = inf), vLLM V1's writing rejects;
    SPEC 4 leaves the choice free and certifies the token emitted after it. A q(d) well above 2**-126 is not free."""
    b = _one_step(-200.0, 0.5, target=(2, 0, 2, 0))  # residual max(p - q, 0) on tokens 0, 1 and 2
    v1 = ExplicitSampler("gumbel", accept="p/q>=u")
    assert ReferenceSampler(streams="explicit")(b).num_sampled[0] == 2 and v1(b).num_sampled[0] == 1
    _certify(v1, b)
    oracle = ReferenceSampler(streams="explicit")
    _, traces = oracle.verify_with_trace(b)
    # The resample after the free choice is still certified: one drawn with other noise fails.
    other = b.replace(resample_gumbel=np.array([[9.0, 0.0, 0.0, 0.0]]))
    assert v1(other).request(0) == [0] != v1(b).request(0)
    assert compare_decisions(b, v1(other), traces, reference=oracle).failed
    with pytest.raises(PropertyFailure, match="acceptance test"):  # without a reference the free choice fails
        certify(compare_decisions(b, v1(b), traces), batch=b)
    # q(d) = 3/6 is no free choice: rejecting a draft with u = 1/4 < p / q fails.
    plain = _one_step(np.log(3.0), 0.25)
    _, traces = oracle.verify_with_trace(plain)
    rejected = plain.replace(accept_uniforms=np.array([0.75, 0.5]))
    assert compare_decisions(plain, v1(rejected), traces, reference=oracle).failed


def test_reference_declaring_explicit_certifies_against_itself():
    for resample in ("gumbel", "inverse_cdf"):
        out = _at_ci(ReferenceSampler(streams="explicit", resample=resample))
        assert out.stats["sent"].get("block", 0) > 0  # block verification reads the explicit uniforms too


def test_fit_to_one_hot_drafts_keeps_the_noise_valid():
    """Narrowing a batch to one-hot drafts widens V' from Vd to V: Gumbel noise carried for Vd tokens
    would no longer fit, so it is dropped (and drawn again by the fill); the rest is kept."""
    b = _batch()
    b = explicit.filled(b.replace(draft_logits=np.ascontiguousarray(b.draft_logits[:, :, :9])))
    assert b.resample_gumbel.shape == (b.num_reqs, 9)
    rec = SamplerRecord(name="one-hot", streams="explicit", draft_modes=frozenset({"one_hot"}))
    fitted = rec.fit(b)
    assert fitted.draft_logits is None and fitted.resample_gumbel is None
    assert np.array_equal(fitted.accept_uniforms, b.accept_uniforms)
    assert np.array_equal(fitted.resample_uniforms, b.resample_uniforms)
    validate(explicit.filled(fitted))
    assert explicit.filled(fitted).resample_gumbel.shape == (b.num_reqs, b.vocab_size)
    # Equal vocabularies: nothing to widen, the noise is kept as carried.
    same = explicit.filled(_batch())
    assert np.array_equal(rec.fit(same).resample_gumbel, same.resample_gumbel)


def test_fill_of_a_broken_batch_neither_draws_nor_warns():
    """A bad position (NaN where an int64 belongs) cannot key a draw: the batch goes to the sampler as
    given, without the fill's cast warning, so the sampler names the bad field itself (SPEC 9)."""
    b = _batch()
    bad = b.replace(pos=np.where(np.arange(b.num_logits) == 3, np.nan, b.pos.astype(np.float64)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert with_explicit_noise(ExplicitSampler(), bad) is bad
    with pytest.raises(ValueError, match="pos"):
        ExplicitSampler()(bad)
