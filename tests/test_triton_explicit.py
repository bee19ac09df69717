"""The Triton sampler of the explicit stream family (SPEC 3c, 4, 4b, 8 and 9): its random numbers are
the batch's `accept_uniforms`, `resample_gumbel` and `resample_uniforms`, resampled by Gumbel-max or by
inverse CDF (`resample="inverse_cdf"`).

Hand-built batches under the interpreter (block_v=16: the vocabularies of 40 take three blocks, so the
inverse CDF's running carry and the Gumbel rows' columns cross block boundaries). Every output is
certified against the float64 reference reading the same noise (`ReferenceSampler(streams="explicit",
resample=...)`), decision by decision. The generated property tests run both samplers too
(tests/test_properties.py: "triton-explicit", "triton-explicit-icdf").
"""

import numpy as np
import pytest
from test_triton_sampler_smoke import make_batch, mixed_batch

from rs_verify.contract import explicit
from rs_verify.contract.chunking import verify_chunked
from rs_verify.harness.record import record_of
from rs_verify.harness.samplers import load_sampler
from rs_verify.properties.certification import certify, compare_decisions
from rs_verify.reference import ReferenceSampler
from rs_verify.triton_sampler import TritonSampler, protocol

RESAMPLES = ("gumbel", "inverse_cdf")


@pytest.fixture(scope="module", params=RESAMPLES)
def sampler(request):
    return TritonSampler(block_v=16, streams="explicit", resample=request.param)


def _certify(sampler, batch, **kw):
    """The sampler's output on `batch`, certified against the reference reading the same noise."""
    oracle = ReferenceSampler(streams="explicit", resample=sampler.resample)
    out = sampler(batch, **kw)
    _, traces = oracle.verify_with_trace(batch)
    cmp = compare_decisions(batch, out, traces, reference=oracle)
    certify(cmp, batch=batch)
    return out, cmp


def _batches(model: bool, features: bool):
    return [explicit.filled(mixed_batch(seed, model=model, features=features)) for seed in range(6)]


@pytest.mark.parametrize("features", [False, True], ids=["token", "block-masked"])
@pytest.mark.parametrize("model", [True, False], ids=["model", "one-hot"])
def test_decisions_agree_with_the_reference(sampler, model, features):
    """Token-wise and block verification (SPEC 4, 4b), with and without min-p / top-k / top-p (SPEC 2),
    model and one-hot drafts: every decision is the reference's on the batch's own noise."""
    stochastic = 0
    for batch in _batches(model, features):
        _, cmp = _certify(sampler, batch)
        stochastic += cmp.stochastic
    # each batch has 4 stochastic requests (T > 0), each of at least one decision (its resample or bonus)
    assert stochastic >= 6 * 4


def _one_step(u: float):
    """One request drafting token 0 on a row where p(0) = p(1) = 1/2 (one-hot drafts), T = 1."""
    x = np.full((2, 40), -np.inf, np.float32)
    x[0, :2] = 0.0
    x[1, 20] = 0.0
    b = explicit.filled(make_batch(x, [[0]], [1.0]))
    return b.replace(accept_uniforms=np.array([u, 0.5]))


def test_acceptance_reads_the_row_uniform(sampler):
    """u = 0.49 < p(0) accepts the draft (then the bonus, the point mass at 20); u = 0.51 rejects it and
    the residual p with r(0) = 0 leaves token 1."""
    assert _certify(sampler, _one_step(0.49))[0].request(0) == [0, 20]
    assert _certify(sampler, _one_step(0.51))[0].request(0) == [1]


def _block_batch(seed: int):
    """Block verification (SPEC 4b) of model drafts that are each step's likeliest draft token, on target
    rows near the draft's (no parameters): the steps' acceptance uniforms decide tau."""
    rng = np.random.default_rng(seed)
    drafts, v = (3, 2, 3, 1), 40
    cu = np.concatenate([[0], np.cumsum(np.array(drafts) + 1)])
    x = (rng.normal(size=(int(cu[-1]), v)) * 2).astype(np.float32)
    dl = np.zeros((len(drafts), 3, v), np.float32)
    for r, n in enumerate(drafts):
        dl[r, :n] = x[cu[r]: cu[r] + n] + rng.normal(size=(n, v)).astype(np.float32) * 0.7
    ids = [[int(dl[r, i].argmax()) for i in range(n)] for r, n in enumerate(drafts)]
    return explicit.filled(make_batch(x, ids, [1.0, 0.8, 1.2, 1.0], k=3, draft_logits=dl, verification="block"))


def test_block_verification_reads_the_row_uniforms(sampler):
    """SPEC 4b with the batch's u_i (block_tau_kernel): certified on drawn noise, and uniforms near 0
    accept more of the block than uniforms near 1."""
    for seed in range(4):
        _certify(sampler, _block_batch(seed))
    b = _block_batch(0)
    low, _ = _certify(sampler, b.replace(accept_uniforms=np.full(b.num_logits, 1e-6)))
    high, _ = _certify(sampler, b.replace(accept_uniforms=np.full(b.num_logits, 1 - 1e-6)))
    assert low.num_sampled.tolist() == [4, 3, 4, 2]  # every block accepted whole (h_i >= 1e-6 here)
    assert high.num_sampled.sum() < low.num_sampled.sum()


def _bonus_batch(reqs=5, v=40, seed=3):
    """Bonus-only requests (no drafts) over a uniform p of `v` tokens: the token is the noise's alone."""
    b = make_batch(np.zeros((reqs, v), np.float32), [[]] * reqs, [1.0] * reqs)
    return explicit.filled(b.replace(seeds=np.arange(reqs, dtype=np.int64) + seed))


def test_resample_reads_its_own_request_row():
    """Request r's Gumbel row picks its token (a +5 at column x_r wins over noise of 0), its U_r the
    inverse CDF's: x_r lands in every block of the vocabulary, and no request reads another's row."""
    b = _bonus_batch()
    picks = [37, 2, 16, 31, 15]
    g = np.zeros_like(b.resample_gumbel)
    g[np.arange(5), picks] = 5.0
    u = (np.array(picks) + 0.5) / 40  # in the middle of x_r's interval of the uniform p
    gumbel = TritonSampler(block_v=16, streams="explicit")
    icdf = TritonSampler(block_v=16, streams="explicit", resample="inverse_cdf")
    assert _certify(gumbel, b.replace(resample_gumbel=g))[0].sampled[:, 0].tolist() == picks
    assert _certify(icdf, b.replace(resample_uniforms=u))[0].sampled[:, 0].tolist() == picks
    # The inverse-CDF sampler never reads the Gumbel rows, the Gumbel sampler never reads U.
    assert icdf(b.replace(resample_gumbel=g, resample_uniforms=u)).sampled[:, 0].tolist() == picks
    assert gumbel(b.replace(resample_gumbel=g, resample_uniforms=u[::-1].copy())).sampled[:, 0].tolist() == picks


def test_drawn_noise_moves_the_token(sampler):
    """Over drawn noise the tokens of one batch spread over the vocabulary and follow the reference."""
    tokens = set()
    for seed in range(4):
        out, _ = _certify(sampler, _bonus_batch(seed=10 * seed))
        tokens |= set(out.sampled[:, 0].tolist())
    assert len(tokens) >= 10  # 20 draws from 40 equally likely tokens: about 16 distinct


@pytest.mark.parametrize("features", [False, True], ids=["token", "block-masked"])
def test_chunked_equals_full(sampler, features):
    """SPEC 7: internal chunking (global row and request indices into the noise) and chunking from
    outside (the noise sliced with its rows and requests) give the full batch's output bit for bit,
    logprobs included."""
    batch = explicit.filled(mixed_batch(2, model=True, features=features, num_logprobs=3))
    full = sampler(batch)
    for cap in (1, 4, 9):
        for out in (sampler(batch, max_chunk_logits=cap), verify_chunked(batch, sampler, cap)):
            assert np.array_equal(out.sampled, full.sampled) and np.array_equal(out.num_sampled, full.num_sampled)
            for field in ("token_ids", "logprobs", "ranks"):
                assert np.array_equal(getattr(out.logprobs, field), getattr(full.logprobs, field)), (cap, field)


def test_logprobs_do_not_depend_on_the_family():
    """The stream family changes the emitted tokens only: logprob values and ranks of every row are the
    default family's (column 0 is the emitted token)."""
    batch = explicit.filled(mixed_batch(1, model=True, num_logprobs=2))
    a = TritonSampler(block_v=16, streams="explicit")(batch).logprobs
    b = TritonSampler(block_v=16)(batch).logprobs
    assert np.array_equal(a.logprobs[:, 1:], b.logprobs[:, 1:])
    assert np.array_equal(a.token_ids[:, 1:], b.token_ids[:, 1:])


def test_refuses_a_batch_without_the_noise_it_reads(monkeypatch):
    """SPEC 9: a ValueError naming the missing field, validated or not, before any device work."""
    def no_device_work(*a, **k):
        raise AssertionError("rejection_sample reached")

    monkeypatch.setattr(protocol, "rejection_sample", no_device_work)
    b = explicit.filled(mixed_batch(0))
    gumbel = TritonSampler(block_v=16, streams="explicit")
    icdf = TritonSampler(block_v=16, streams="explicit", resample="inverse_cdf")
    for s in (gumbel, gumbel.unvalidated()):
        for field in ("accept_uniforms", "resample_gumbel"):
            with pytest.raises(ValueError, match=field):
                s(b.replace(**{field: None}))
    for s in (icdf, icdf.unvalidated()):
        for field in ("accept_uniforms", "resample_uniforms"):
            with pytest.raises(ValueError, match=field):
                s(b.replace(**{field: None}))
    with pytest.raises(AssertionError, match="reached"):  # the fields it does not read may be absent
        icdf(b.replace(resample_gumbel=None))
    with pytest.raises(AssertionError, match="reached"):
        gumbel(b.replace(resample_uniforms=None))


def test_inverse_cdf_top_fallback_stays_on_the_residual():
    """`U = 1 - 2**-26` is 1.0 in float32: no prefix sum exceeds `U * S`, and the token is the last one with
    r > 0. After the rejected draft 3 (r(3) = 0, p(3) ~ 8e-10) that is token 2, the reference's too; for
    the bonus (r = p) it is token 3, where the reference emits 2 (S_2 / S is 1 - 8e-10 > U): SPEC 8
    excuses that boundary."""
    x = np.array([[0, 0, 0, -21], [0, 0, 0, -21]], np.float32)
    icdf = TritonSampler(block_v=16, streams="explicit", resample="inverse_cdf")
    b = explicit.filled(make_batch(x, [[3]], [1.0])).replace(accept_uniforms=np.array([0.5, 0.5]),
                                                             resample_uniforms=np.array([1 - 2.0**-26]))
    assert _certify(icdf, b)[0].request(0) == [2]
    bonus = explicit.filled(make_batch(x[:1], [[]], [1.0])).replace(resample_uniforms=np.array([1 - 2.0**-26]))
    out, cmp = _certify(icdf, bonus)
    assert out.request(0) == [3] and len(cmp.excused) == 1
    # Top boundary of a wider residual, across blocks: every token in [0, V') with r > 0.
    batch = explicit.filled(mixed_batch(4, model=True))
    top = batch.replace(resample_uniforms=np.full(batch.num_reqs, 1 - 2.0**-26))
    out, _ = _certify(icdf, top)
    tokens = out.sampled[out.sampled >= 0]
    assert tokens.min() >= 0 and tokens.max() < batch.effective_vocab_size


def test_resample_declaration():
    s = TritonSampler(block_v=16, streams="explicit", resample="inverse_cdf")
    assert s.resample == "inverse_cdf" and record_of(s).resample == "inverse_cdf"
    assert s.unvalidated().resample == "inverse_cdf" and "resample='inverse_cdf'" in repr(s)
    assert TritonSampler(streams="explicit").resample == "gumbel" and TritonSampler().resample == "gumbel"
    assert "resample" not in repr(TritonSampler())
    with pytest.raises(ValueError, match="resample"):
        TritonSampler(streams="explicit", resample="race")
    with pytest.raises(ValueError, match="explicit"):
        TritonSampler(streams="murmur3", resample="inverse_cdf")
    with pytest.raises(ValueError, match="explicit"):
        TritonSampler(resample="gumbel")


@pytest.mark.parametrize("name, streams, resample", [("triton", "triton-philox", "gumbel"),
                                                     ("triton-murmur3", "murmur3", "gumbel"),
                                                     ("triton-explicit", "explicit", "gumbel"),
                                                     ("triton-explicit-icdf", "explicit", "inverse_cdf")])
def test_built_in_names_declare_their_family(name, streams, resample):
    """The CLI's and the plugin's built-in names load the Triton sampler of each family it offers."""
    rec = record_of(load_sampler(name))
    assert (rec.streams, rec.resample) == (streams, resample)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_acceptance_uniforms_below_float32_range(sampler, verification):
    """A uniform below float32's normal range (SPEC 3c allows any u in (0, 1)) still decides by its own
    log: with log p(d) = -130 (one-hot draft), u = 1e-50 (log u = -115.1) rejects and u = 1e-60 (-138.2)
    accepts. Rounded to float32 both would be 0 (log u = -inf): accepted whatever p(d)."""
    x = np.full((2, 40), -np.inf, np.float32)
    x[0, :2] = (-130.0, 0.0)
    x[1, 20] = 0.0
    b = explicit.filled(make_batch(x, [[0]], [1.0], verification=verification))
    rejected, _ = _certify(sampler, b.replace(accept_uniforms=np.array([1e-50, 0.5])))
    accepted, _ = _certify(sampler, b.replace(accept_uniforms=np.array([1e-60, 0.5])))
    assert rejected.request(0) == [1] and accepted.request(0) == [0, 20]


@pytest.mark.parametrize("g", [-1e300, 1e300])
def test_gumbel_noise_beyond_float32_range(g):
    """Finite float64 noise beyond float32's range (SPEC 3c allows it) is held at the largest float32:
    a row of noise at -1e300 (or +1e300) does not score every token -inf (+inf), where the argmax would
    fall to token 0 of p = 0; the token is the reference's, one with p > 0."""
    x = np.zeros((1, 40), np.float32)
    x[0, :5] = -np.inf
    x[0, 7] = 3.0
    b = explicit.filled(make_batch(x, [[]], [1.0]))
    out, _ = _certify(TritonSampler(block_v=16, streams="explicit"),
                      b.replace(resample_gumbel=np.full((1, 40), g)))
    assert out.request(0)[0] >= 5
