"""Unit tests of the NumPy reference sampler on hand-built batches (SPEC sections 2-6 and 8).

Non-statistical: each case has a known answer (a one-hot target accepts its
chain, disjoint supports accept nothing, ...), or is checked against a plain
per-request loop written from the SPEC text (`_naive`), which shares only the
Philox streams with the reference (those are proved against Triton in
test_streams.py, and pinned here by golden values).
"""

import numpy as np
import pytest

from rs_verify.reference import ReferenceSampler, draft_probs, gumbel_noise, processed_logits, target_probs
from rs_verify.contract import philox
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.chunking import select_requests

NEG = -np.inf


def make_batch(target, drafts, cu, *, draft_logits=None, temperature=1.0, seeds=None, pos=None, idx_mapping=None,
               num_states=None, k=None, **kw) -> SpecBatch:
    """A SpecBatch from per-row target logits and per-request draft lists (vLLM layout built here)."""
    target = np.asarray(target, np.float32)
    cu = np.asarray(cu, np.int32)
    r = len(cu) - 1
    n = target.shape[0]
    s = num_states or r
    dti = np.zeros(n, np.int64)
    for i, ds in enumerate(drafts):
        dti[cu[i] + 1 : cu[i] + 1 + len(ds)] = ds
    temp = np.broadcast_to(np.asarray(temperature, np.float32), (s,)).copy()
    return SpecBatch(
        target_logits=target,
        draft_logits=None if draft_logits is None else np.asarray(draft_logits, np.float32),
        draft_token_ids=dti,
        cu_num_logits=cu,
        pos=np.arange(n, dtype=np.int64) * 7 + 3 if pos is None else np.asarray(pos, np.int64),
        idx_mapping=np.arange(r, dtype=np.int32) if idx_mapping is None else np.asarray(idx_mapping, np.int32),
        temperature=temp,
        seeds=np.arange(s, dtype=np.int64) * 1000 + 17 if seeds is None else np.asarray(seeds, np.int64),
        num_speculative_steps=int(np.diff(cu).max() - 1) if k is None else k,
        **kw,
    )


def one_hot_rows(tokens, v):
    x = np.full((len(tokens), v), NEG, np.float32)
    x[np.arange(len(tokens)), tokens] = 0.0
    return x


SAMPLER = ReferenceSampler()


# -- a per-request loop written from the SPEC text ----------------------------------------


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


def _naive(batch: SpecBatch) -> list[list[int]]:
    vp = batch.effective_vocab_size
    cu = batch.cu_num_logits.astype(np.int64)
    out = []
    for r in range(batch.num_reqs):
        s = int(batch.idx_mapping[r])
        t = np.float32(batch.temperature[s])
        seed = np.int64(batch.seeds[s])
        drafts = batch.draft_tokens(r)
        emitted = []

        def z_of(row):
            x = batch.target_logits[row, :vp]
            return x if t in (0, 1) else x / t

        def q_of(i):
            x = batch.draft_logits[s, i, :vp]
            return x if t == 1 else x / t

        def gumbel_argmax(base, row):
            g = philox.randint(seed, np.array([batch.pos[row]], np.int64))[0]
            v = np.maximum(philox.rand(g, np.arange(vp, dtype=np.int32)), philox.TINY).astype(np.float64)
            return int(np.argmax(base - np.log(-np.log1p(-v))))

        for i, d in enumerate(drafts):
            j = cu[r] + i
            if t == 0:
                a = int(np.argmax(z_of(j)))
                if d == a:
                    emitted.append(int(d))
                    continue
                emitted.append(a)
                break
            logp = _log_softmax(z_of(j))
            u = max(philox.rand(seed, np.array([batch.pos[j]], np.int64))[0], philox.TINY)
            ok = 0 <= d < vp
            if ok and batch.draft_logits is not None:
                logq = _log_softmax(q_of(i))
                ok = logp[d] > np.log(np.float64(u)) + logq[d]
            elif ok:
                ok = logp[d] > np.log(np.float64(u))
            if ok:
                emitted.append(int(d))
                continue
            base = logp
            if 0 <= d < vp:
                if batch.draft_logits is not None:
                    res = np.maximum(np.exp(logp) - np.exp(_log_softmax(q_of(i))), 0)
                else:
                    res = np.exp(logp)
                    res[d] = 0
                if (res > 0).any():
                    with np.errstate(divide="ignore"):
                        base = np.log(res)
            emitted.append(gumbel_argmax(base, j))
            break
        else:
            j = cu[r] + len(drafts)
            if t == 0:
                emitted.append(int(np.argmax(z_of(j))))
            else:
                emitted.append(gumbel_argmax(_log_softmax(z_of(j)), j))
        out.append(emitted)
    return out


def random_batch(seed, *, one_hot=False, v=33, vd=None, k=4, reqs=12, greedy_frac=0.25, pad_frac=0.1, **kw):
    rng = np.random.default_rng(seed)
    s = reqs + 3
    n = rng.integers(0, k + 1, reqs)
    cu = np.concatenate([[0], np.cumsum(n + 1)]).astype(np.int32)
    rows = int(cu[-1])
    vp = min(v, vd or v)
    x = (rng.standard_normal((rows, v)) * 2).astype(np.float32)
    x[rng.random((rows, v)) < 0.1] = NEG
    x[:, 0] = 1.0  # every row keeps a finite logit in [0, V')
    dl = None if one_hot else (rng.standard_normal((s, k, vd or v)) * 2).astype(np.float32)
    drafts = [np.where(rng.random(m) < pad_frac, -1, rng.integers(0, vp, m)) for m in n]
    temp = rng.uniform(0.5, 1.5, s).astype(np.float32)
    temp[rng.random(s) < greedy_frac] = 0
    temp[rng.random(s) < 0.15] = 1
    return make_batch(x, drafts, cu, draft_logits=dl, temperature=temp,
                      seeds=rng.integers(-(2**63), 2**63 - 1, s, dtype=np.int64),
                      pos=rng.integers(0, 2**40, rows), idx_mapping=rng.permutation(s)[:reqs],
                      num_states=s, k=k, **kw)


# -- Philox pins --------------------------------------------------------------------


def test_philox_golden_values():
    """Values drawn by tl.randint / tl.rand in a Triton 3.9 kernel (interpreter), for seeds and offsets that
    span the int64 range."""
    seeds = np.array([0, -1, 2**63 - 1, 12345, -(2**63)], np.int64)
    offs = np.array([0, 7, 2**32 + 5, 2**31, 123456789], np.int64)
    assert philox.randint(seeds, offs).tolist() == [1713891541, 1847653041, -1751711548, -177926148, -914767991]
    assert philox.rand(seeds, offs).view(np.uint32).tolist() == [
        1061965777, 1063010788, 1062261245, 1034530559, 1054480641]


def test_int32_seed_widening():
    """An int32 seed (the resample seed g) is zero-extended: seed_lo = its bits, seed_hi = 0."""
    g = np.array([-5, 2**31 - 1, -(2**31)], np.int32)
    x = np.array([3, 0, 255], np.int32)
    assert philox.randint(g, x).tolist() == [1625456568, 1474427545, -1717968934]  # Triton's values
    assert philox.rand(g, x).view(np.uint32).tolist() == [1061274878, 1060094964, 1061997631]
    assert (philox.randint(g, x) == philox.randint(g.view(np.uint32).astype(np.int64), x)).all()
    # A sign-extending port differs exactly where g < 0.
    assert (philox.randint(g, x) != philox.randint(g.astype(np.int64), x)).tolist() == [True, False, True]
    # int32 offsets have offset_hi = 0 even when negative; int64 offsets do not.
    neg = np.array([-1], np.int32)
    assert philox.randint(7, neg)[0] == philox.randint(7, np.array([2**32 - 1], np.int64))[0]
    assert philox.randint(7, neg)[0] != philox.randint(7, neg.astype(np.int64))[0]


def test_resample_noise_chain_golden():
    """g = randint(12345, 7) then rand(g, x), as one Triton kernel computed it."""
    g = philox.randint(np.int64(12345), np.array([7], np.int64))
    v = philox.rand(g[:, None], np.arange(4, dtype=np.int32)[None, :])
    assert v.view(np.uint32).tolist() == [[1050458540, 1060875227, 1049299480, 1060834607]]
    expect = -np.log(-np.log1p(-np.maximum(v, philox.TINY).astype(np.float64)))
    assert np.array_equal(gumbel_noise([12345], [7], 4), expect)


# -- known answers --------------------------------------------------------------------


@pytest.mark.parametrize("drafts_kind", ["model", "one_hot"])
def test_one_hot_target_accepts_matching_chain(drafts_kind):
    """p = one-hot at the draft: log p(d) = 0 > log u + log q(d) for every u < 1, so every seed accepts the
    whole chain, then the bonus row's one-hot token is emitted."""
    v, chain, bonus = 11, [3, 9, 0, 4], 7
    x = one_hot_rows(chain + [bonus], v)
    dl = None
    if drafts_kind == "model":
        dl = np.random.default_rng(0).standard_normal((1, 4, v)).astype(np.float32)
    for seed in range(20):
        out = SAMPLER(make_batch(x, [chain], [0, 5], draft_logits=dl, temperature=0.7, seeds=[seed * 7919 - 50]))
        assert out.request(0) == chain + [bonus]
        assert out.num_sampled.tolist() == [5]


def test_disjoint_supports_accept_nothing():
    """Target on tokens [0, 8), drafts from q on [8, 16): p(d) = 0 rejects every draft at step 0, and the
    residual max(p - q, 0) = p resamples inside p's support."""
    v, k = 16, 3
    rng = np.random.default_rng(1)
    x = np.full((4 * (k + 1), v), NEG, np.float32)
    x[:, :8] = rng.standard_normal((x.shape[0], 8))
    dl = np.full((4, k, v), NEG, np.float32)
    dl[:, :, 8:] = rng.standard_normal((4, k, 8))
    drafts = [rng.integers(8, 16, k) for _ in range(4)]
    for seed in range(10):
        b = make_batch(x, drafts, [0, 4, 8, 12, 16], draft_logits=dl, seeds=np.arange(4) + 100 * seed)
        out, traces = SAMPLER.verify_with_trace(b)
        assert out.num_sampled.tolist() == [1, 1, 1, 1]
        assert ((out.sampled[:, 0] >= 0) & (out.sampled[:, 0] < 8)).all()
        assert (out.sampled[:, 1:] == -1).all()
        for tr in traces:
            acc = tr.decisions[0]
            assert acc.kind == "accept" and acc.accepted is False and acc.margin == -np.inf


def test_greedy_argmax_chain_and_lowest_index_tie():
    """T = 0: argmax of the raw logits, lowest index on ties; accept while d == argmax, then emit the argmax."""
    v = 6
    x = np.array([
        [0, 5, 5, 1, 0, 0],  # tie 1/2 -> 1
        [2, 2, 2, 2, 2, 2],  # all tied -> 0
        [NEG, 1, 3, 3, 3, 0],  # tie 2/3/4 -> 2
        [9, 0, 0, 0, 0, 9],  # bonus: tie 0/5 -> 0
    ], np.float32)
    out, traces = SAMPLER.verify_with_trace(make_batch(x, [[1, 0, 2]], [0, 4], temperature=0.0))
    assert out.request(0) == [1, 0, 2, 0]
    assert [d.kind for d in traces[0].decisions] == ["argmax"] * 4
    assert [d.margin for d in traces[0].decisions] == [0.0, 0.0, 0.0, 0.0]  # exact ties
    # A mismatch at step 1 emits a_1 = 0 and stops.
    out = SAMPLER(make_batch(x, [[1, 4, 2]], [0, 4], temperature=0.0))
    assert out.request(0) == [1, 0]
    assert out.sampled.tolist() == [[1, 0, -1, -1]]


def test_padded_draft_is_rejected_and_resampled_from_p():
    """A padded draft (-1) proposed nothing: rejected, resampled from p itself (not max(p - q, 0))."""
    v = 8
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, v)).astype(np.float32)
    dl = np.zeros((1, 1, v), np.float32)
    dl[0, 0, :4] = 8.0  # q concentrated on [0, 4): max(p - q, 0) would exclude those tokens
    differs = 0
    for seed in range(40):
        b = make_batch(x, [[-1]], [0, 2], draft_logits=dl, seeds=[seed], pos=[11, 12])
        out, traces = SAMPLER.verify_with_trace(b)
        logp = np.log(target_probs(b)[0])
        g = gumbel_noise([seed], [11], v)[0]
        assert out.request(0) == [int(np.argmax(logp + g))]
        assert traces[0].decisions[0].accepted is False and traces[0].decisions[0].margin == -np.inf
        res = np.maximum(np.exp(logp) - np.exp(_log_softmax(dl[0, 0])), 0)
        with np.errstate(divide="ignore"):
            differs += int(np.argmax(np.log(res) + g) != out.request(0)[0])
    assert differs > 0  # the residual would have chosen otherwise: the test is not vacuous


def test_bonus_row_used_when_all_accepted():
    """All drafts accepted: the bonus is argmax(log p + G) of the bonus row, with the bonus row's position."""
    v = 9
    rng = np.random.default_rng(3)
    x = np.vstack([one_hot_rows([2, 5], v), rng.standard_normal((1, v)).astype(np.float32)])
    for seed in range(20):
        b = make_batch(x, [[2, 5]], [0, 3], seeds=[seed], pos=[100, 101, 102], temperature=0.9)
        out, traces = SAMPLER.verify_with_trace(b)
        z = processed_logits(b)[2]
        expect = int(np.argmax(np.log(target_probs(b)[2]) + gumbel_noise([seed], [102], v)[0]))
        assert out.request(0) == [2, 5, expect]
        last = traces[0].decisions[-1]
        assert (last.kind, last.step, last.row, last.token) == ("argmax", 2, 2, expect)
        # SPEC 8: L over the compared tokens only: the winner alone, or the winner and a candidate x.
        logp, g = _log_softmax(z), gumbel_noise([seed], [102], v)[0]
        own = max(1.0, abs(logp[expect]), abs(g[expect]))
        assert last.gaps[expect] == 0 and last.scale == own
        assert np.array_equal(last.scales, np.maximum(own, np.maximum(np.abs(logp), np.abs(g))))


def test_padding_and_num_sampled():
    """sampled is int64 [R, K + 1], -1 after num_sampled; num_sampled int32 in [1, n_r + 1]."""
    b = random_batch(4, reqs=9, k=5)
    out = SAMPLER(b)
    assert out.sampled.dtype == np.int64 and out.sampled.shape == (9, 6)
    assert out.num_sampled.dtype == np.int32 and out.num_sampled.shape == (9,)
    n = b.num_draft_tokens
    assert ((out.num_sampled >= 1) & (out.num_sampled <= n + 1)).all()
    for r in range(9):
        k = int(out.num_sampled[r])
        assert (out.sampled[r, k:] == -1).all() and (out.sampled[r, :k] >= 0).all()
        assert (out.sampled[r, :k] < b.effective_vocab_size).all()
        # The accepted prefix is the drafts themselves.
        assert out.sampled[r, : k - 1].tolist() == b.draft_tokens(r)[: k - 1].tolist()


def test_logprobs_ranks_and_ties():
    """Top-k descending with ties by ascending id; rank = 1 + #strictly larger; column 0 = the token emitted
    at the row (0 for a row that emitted nothing)."""
    x = np.array([
        [1, 3, 3, 0, 3, NEG],  # argmax 1 (tied with 2, 4): accepts d_0 = 1
        [0, 2, 2, 1, 0, 0],  # argmax 1 != d_1 = 3: emits 1
        [0, 4, 4, 5, 1, 0],  # emitted nothing: column 0 is token 0, rank 1 + |{4, 4, 5, 1}| = 5
    ], np.float32)
    b = make_batch(x, [[1, 3]], [0, 3], temperature=0.0, num_logprobs=3, logprobs_mode="raw")
    out = SAMPLER(b)
    assert out.request(0) == [1, 1]
    lp = out.logprobs
    assert lp.token_ids.dtype == np.int64 and lp.logprobs.dtype == np.float32 and lp.ranks.dtype == np.int64
    assert lp.token_ids.tolist() == [[1, 1, 2, 4], [1, 1, 2, 3], [0, 3, 1, 2]]
    assert lp.ranks.tolist() == [1, 1, 5]
    assert lp.cu_num_generated_tokens == [0, 3]
    x64 = x.astype(np.float64)
    expect = np.stack([_log_softmax(row) for row in x64]).astype(np.float32)
    assert np.array_equal(lp.logprobs, np.take_along_axis(expect, lp.token_ids, axis=1))
    assert lp.logprobs[0, 1] == lp.logprobs[0, 2] == lp.logprobs[0, 3]  # the tie, ordered by id


def test_logprobs_modes_and_single_row_requests():
    """processed: log_softmax(x / T) (raw for greedy rows); raw: log_softmax(x); over the whole vocab [0, V)
    even when V' < V; cu_num_generated_tokens is None when N == R."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7)).astype(np.float32)
    dl = rng.standard_normal((2, 0, 5)).astype(np.float32)  # K = 0, Vd = 5 < V = 7
    temp = np.array([0.5, 0.0], np.float32)
    for mode in ("raw", "processed"):
        b = make_batch(x, [[], []], [0, 1, 2], draft_logits=dl, temperature=temp, k=0, num_logprobs=7,
                       logprobs_mode=mode)
        lp = SAMPLER(b).logprobs
        assert lp.cu_num_generated_tokens is None
        z0 = x[0] / np.float32(0.5) if mode == "processed" else x[0]
        want = np.stack([_log_softmax(z0), _log_softmax(x[1])]).astype(np.float32)
        assert np.array_equal(lp.logprobs[:, 1:], -np.sort(-want, axis=1))
        assert sorted(lp.token_ids[0, 1:].tolist()) == list(range(7))
    assert (SAMPLER(b).sampled < 5).all()  # emitted tokens stay below V' = 5


def test_temperature_exactly_one_skips_division():
    """T == 1 leaves the logits untouched (bit for bit); the next float32 above 1 divides."""
    x = np.array([[3.0000002, -1.5, 1e-38, 7.25, NEG]], np.float32)
    b = make_batch(x, [[]], [0, 1], temperature=1.0)
    assert processed_logits(b).view(np.uint32).tolist() == x.view(np.uint32).tolist()
    t = np.nextafter(np.float32(1), np.float32(2))
    b2 = b.replace(temperature=np.array([t], np.float32))
    assert np.array_equal(processed_logits(b2), x / t)
    assert not np.array_equal(processed_logits(b2), x)


def test_unreferenced_states_are_ignored():
    """States no request maps to may hold anything (here NaN temperature and draft logits): same output as
    the batch without them."""
    b = random_batch(6, reqs=5, greedy_frac=0.0)
    s = b.num_states
    temp = np.concatenate([b.temperature, [np.nan, -3.0]]).astype(np.float32)
    seeds = np.concatenate([b.seeds, [1, 2]]).astype(np.int64)
    dl = np.concatenate([b.draft_logits, np.full((2,) + b.draft_logits.shape[1:], np.nan, np.float32)])
    b_more = b.replace(temperature=temp, seeds=seeds, draft_logits=dl)
    assert b_more.num_states == s + 2
    out, out_more = SAMPLER(b), SAMPLER(b_more)
    for name, arr in out.arrays().items():
        assert np.array_equal(arr, out_more.arrays()[name]), name


def test_masked_tokens_are_never_emitted():
    """-inf logits have probability 0: never emitted, never accepted (margin -inf)."""
    rng = np.random.default_rng(7)
    v = 12
    x = rng.standard_normal((5, v)).astype(np.float32)
    x[:, ::2] = NEG  # only odd tokens are possible
    drafts = [[0, 2, 4, 6]]  # all masked
    for seed in range(10):
        out, traces = SAMPLER.verify_with_trace(make_batch(x, drafts, [0, 5], seeds=[seed], temperature=1.3))
        assert out.num_sampled.tolist() == [1] and out.sampled[0, 0] % 2 == 1
        assert traces[0].decisions[0].margin == -np.inf


# -- against the per-request loop ------------------------------------------------------


@pytest.mark.parametrize("one_hot, vd", [(False, None), (False, 21), (True, None)],
                         ids=["model", "model-Vd<V", "one_hot"])
def test_matches_per_request_loop(one_hot, vd):
    """Mixed greedy / T = 1 / T != 1 requests, padded drafts, masked tokens, ragged n_r."""
    for seed in range(4):
        b = random_batch(100 + seed, one_hot=one_hot, vd=vd)
        out = SAMPLER(b)
        assert [out.request(r) for r in range(b.num_reqs)] == _naive(b)


def test_traces_are_consistent():
    """Trace tokens are the output; an acceptance's margin sign is its outcome; an argmax's winner has gap 0
    and margin = the second-smallest gap; accept decisions come first, one per tested step."""
    b = random_batch(11, reqs=16, greedy_frac=0.3)
    out, traces = SAMPLER.verify_with_trace(b)
    assert [t.request for t in traces] == list(range(b.num_reqs))
    cu = b.cu_num_logits
    for tr in traces:
        r = tr.request
        assert tr.tokens == out.request(r)
        greedy = b.temperature[b.idx_mapping[r]] == 0
        for dec in tr.decisions:
            assert dec.request == r and dec.row == cu[r] + dec.step and dec.scale >= 1.0
            if dec.kind == "accept":
                assert not greedy and dec.gaps is None and dec.scales is None
                assert dec.token == b.draft_tokens(r)[dec.step]
                assert dec.accepted == (dec.margin > 0)
            elif dec.kind == "residual":  # after a rejected real draft: the mass decision
                assert not greedy and dec.step == len(tr.tokens) - 1 and dec.token == b.draft_tokens(r)[dec.step]
                assert dec.margin >= 0 and dec.accepted == (dec.margin > 0) and dec.scale == 1.0
            else:
                assert dec.kind == "argmax" and dec.accepted is None
                assert dec.gaps.dtype == np.float64 and dec.gaps.shape == (b.effective_vocab_size,)
                assert dec.gaps[dec.token] == 0 and dec.margin == np.sort(dec.gaps)[1]
                assert dec.scales[dec.token] == dec.scale and (dec.scales >= dec.scale).all()
        steps = [d.step for d in tr.decisions if d.kind == "argmax"]
        assert steps == (list(range(len(tr.tokens))) if greedy else [len(tr.tokens) - 1])
        last, drafts = len(tr.tokens) - 1, b.draft_tokens(r)
        rejected_real = not greedy and last < len(drafts) and 0 <= drafts[last] < b.effective_vocab_size
        assert sum(d.kind == "residual" for d in tr.decisions) == int(rejected_real)


def _with_filler(b: SpecBatch, value=-1e4) -> SpecBatch:
    """`b` with one more token, logit `value` in every target and draft row (exp(value / T) is 0 in float64)."""
    x = np.asarray(b.target_logits)
    dl = np.asarray(b.draft_logits)
    return b.replace(target_logits=np.hstack([x, np.full((x.shape[0], 1), value, np.float32)]),
                     draft_logits=np.concatenate([dl, np.full(dl.shape[:2] + (1,), value, np.float32)], axis=2))


@pytest.mark.parametrize("seed", [21, 22])
def test_scales_come_from_the_compared_tokens(seed):
    """SPEC 8: an acceptance test's L is max(1, |log p(d)|, |log q(d)|) of its draft token; a token no decision
    compares (a filler at -1e4, probability 0 in float64) changes no decision, margin or scale."""
    b = random_batch(seed, reqs=16, greedy_frac=0.2, pad_frac=0.15)
    with np.errstate(divide="ignore"):
        logp, logq = np.log(target_probs(b)), np.log(draft_probs(b))
    _, traces = SAMPLER.verify_with_trace(b)
    _, filled = SAMPLER.verify_with_trace(_with_filler(b))
    v, accepts = b.effective_vocab_size, 0
    for tr, tf in zip(traces, filled, strict=True):
        assert tr.tokens == tf.tokens
        for d, f in zip(tr.decisions, tf.decisions, strict=True):
            assert (d.kind, d.step, d.token, d.accepted) == (f.kind, f.step, f.token, f.accepted)
            assert d.margin == pytest.approx(f.margin, rel=1e-12, abs=1e-300)
            assert d.scale == pytest.approx(f.scale, rel=1e-12)
            if d.scales is not None:
                assert np.allclose(d.scales, f.scales[:v], rtol=1e-12) and f.scales[v] >= 1e4 / 1.5
                assert np.allclose(d.gaps, f.gaps[:v], rtol=1e-12, atol=1e-12)
            if d.kind == "accept" and 0 <= d.token < v:
                terms = [abs(logp[d.row, d.token]), abs(logq[d.row, d.token]), 1.0]
                assert d.scale == pytest.approx(max(t for t in terms if np.isfinite(t)), rel=1e-9)
                accepts += 1
    assert accepts >= 10  # enough acceptance tests for the comparison to mean something


def test_residual_mass_decisions():
    """A rejected real draft reports whether its residual has positive mass (margin: the float64 mass), with the
    other branch's gaps: fallback p when the residual was used, distance to positive mass when it was empty."""
    v = 4
    # Empty residual: p = q on {1, 2}; the draft 3 has p = 0 (rejected) and max(p - q, 0) = 0: fall back to p.
    x = np.array([[NEG, 0, 0, NEG], [0, 0, 0, 0]], np.float32)
    dl = np.array([[[NEG, 0, 0, NEG]]], np.float32)
    out, traces = SAMPLER.verify_with_trace(make_batch(x, [[3]], [0, 2], draft_logits=dl, seeds=[5]))
    res = next(d for d in traces[0].decisions if d.kind == "residual")
    assert (res.margin, res.accepted, res.token) == (0.0, False, 3)
    assert res.gaps.tolist() == [np.inf, 0.0, 0.0, np.inf]  # only tokens with p = q > 0 could gain mass
    assert out.request(0)[0] in (1, 2)
    # Tiny residual: only token 2 (p ~ e**-30 / 2, q = 0) has p > q; the mass is that probability.
    x[0] = [0, 0, -30, NEG]
    dl[0, 0] = [0, 0, NEG, NEG]
    for seed in range(5):
        b = make_batch(x, [[3]], [0, 2], draft_logits=dl, seeds=[seed], pos=[40, 41])
        out, traces = SAMPLER.verify_with_trace(b)
        res = next(d for d in traces[0].decisions if d.kind == "residual")
        p2 = np.exp(np.float64(-30)) / (2 + np.exp(np.float64(-30)))
        assert res.accepted is True and res.margin == pytest.approx(p2, rel=1e-9)
        assert out.request(0) == [2]  # the residual's only token
        with np.errstate(divide="ignore"):
            alt = np.log(target_probs(b)[0]) + gumbel_noise([seed], [40], v)[0]
        assert np.allclose(res.gaps[:3], alt.max() - alt[:3], rtol=0, atol=1e-12) and res.gaps[3] == np.inf
    # q a point mass at the draft (as a model row, and as a one-hot draft): the residual is p without the
    # draft, its mass 1 - p(d), spread over two tokens.
    x = np.array([[0, -1, -1], [0, 0, 0]], np.float32)
    p0 = 1 / (1 + 2 * np.exp(-1.0))
    for dl in (np.array([[[0, NEG, NEG]]], np.float32), None):
        masses = []
        for seed in range(40):
            _, traces = SAMPLER.verify_with_trace(make_batch(x, [[0]], [0, 2], draft_logits=dl, seeds=[seed]))
            masses += [d.margin for d in traces[0].decisions if d.kind == "residual"]
        assert len(masses) >= 5 and np.allclose(masses, 1 - p0, rtol=1e-12)


def test_chunked_and_permuted_match_full_batch():
    """Chunk caps 1..N and a request permutation reproduce the full batch bit for bit."""
    b = random_batch(12, reqs=8, num_logprobs=2, logprobs_mode="processed")
    full = SAMPLER(b)
    for cap in (1, 2, 5, b.num_logits):
        part = SAMPLER(b, max_chunk_logits=cap)
        for name, arr in full.arrays().items():
            assert np.array_equal(arr, part.arrays()[name]), (cap, name)
    perm = np.random.default_rng(0).permutation(b.num_reqs)
    out = SAMPLER(select_requests(b, perm))
    assert [out.request(i) for i in range(b.num_reqs)] == [full.request(int(r)) for r in perm]


def test_small_slabs_match():
    """Slab size is an implementation detail: one request per slab gives the same bits."""
    b = random_batch(13, reqs=10, num_logprobs=3)
    full = SAMPLER(b)
    tiny = ReferenceSampler(slab_elems=1)(b)
    for name, arr in full.arrays().items():
        assert np.array_equal(arr, tiny.arrays()[name]), name


def test_protocol_and_validation():
    assert (ReferenceSampler.name, ReferenceSampler.supports_chunking, ReferenceSampler.streams) == (
        "reference", True, "triton-philox")
    b = random_batch(14, reqs=3)
    bad = b.replace(pos=-np.asarray(b.pos) - 1)
    with pytest.raises(ValueError, match="pos"):
        SAMPLER(bad)
    with pytest.raises(ValueError, match="pos"):
        SAMPLER.verify_with_trace(bad)
    ReferenceSampler(validate=False)(bad)  # no validation: still runs
    # The oracle offers no `unvalidated()` (SPEC section 10): without validation it checks only
    # shapes and dtypes and relies on the value rules (n_r <= K, ...), so it is not memory-safe
    # by contract on bad values, and unvalidated_in_bounds does not apply to it.
    assert not hasattr(SAMPLER, "unvalidated")
    empty = make_batch(np.zeros((0, 4)), [], [0], k=2)
    out = SAMPLER(empty)
    assert out.sampled.shape == (0, 3) and out.num_sampled.shape == (0,)
