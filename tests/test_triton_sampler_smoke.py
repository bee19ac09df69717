"""Fast hand-built cases for the Triton sampler (SPEC sections 2-7, 4b), answers known analytically.

Runs under the Triton interpreter on CPU (block_v=16, so vocabularies of 33
and 40 take multi-block reductions) and compiled on GPU. Each case has a
handful of programs: the whole file stays well under two minutes on CPU. Masks (SPEC 2) are
read from processed logprobs of the whole vocabulary (a masked token's is -inf); block
verification's (SPEC 4b) uniforms come from the triton-philox stream family (SPEC 3a).
"""

import numpy as np
import pytest

from rs_verify import SpecBatch, iter_request_chunks, select_requests

NEG = -np.inf


@pytest.fixture(scope="module")
def sampler():
    from rs_verify.triton_sampler import TritonSampler

    return TritonSampler(block_v=16)


def make_batch(target, drafts, temps, *, k=None, draft_logits=None, seeds=None, pos=None, **kw):
    """Request r owns len(drafts[r]) + 1 rows of `target` in order and uses state r."""
    target = np.asarray(target, np.float32)
    n = [len(d) for d in drafts]
    cu = np.concatenate([[0], np.cumsum(np.array(n) + 1)]).astype(np.int32)
    ids = np.zeros(int(cu[-1]), np.int64)
    for r, d in enumerate(drafts):
        ids[cu[r] + 1 : cu[r + 1]] = d
    num_reqs = len(drafts)
    return SpecBatch(
        target_logits=target,
        draft_logits=draft_logits,
        draft_token_ids=ids,
        cu_num_logits=cu,
        pos=np.arange(cu[-1], dtype=np.int64) + 1000 if pos is None else np.asarray(pos, np.int64),
        idx_mapping=np.arange(num_reqs, dtype=np.int32),
        temperature=np.asarray(temps, np.float32),
        seeds=np.arange(1, num_reqs + 1, dtype=np.int64) * 7919 if seeds is None else np.asarray(seeds, np.int64),
        num_speculative_steps=max(n) if k is None else k,
        **kw,
    )


def one_hot_rows(tokens, vocab):
    """Rows whose only finite logit is at `tokens[i]` (p is a point mass)."""
    x = np.full((len(tokens), vocab), NEG, np.float32)
    x[np.arange(len(tokens)), tokens] = 0.0
    return x


def mixed_batch(seed=0, vocab=40, num_logprobs=None, dtype="float32", model=False, features=False):
    rng = np.random.default_rng(seed)
    drafts = [[int(rng.integers(0, vocab)) for _ in range(n)] for n in (3, 0, 2, 1, 3)]
    drafts[0][0] = -1
    rows = sum(len(d) + 1 for d in drafts)
    x = rng.normal(size=(rows, vocab)).astype(np.float32) * 2
    if dtype == "bfloat16":
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    dl = None
    if model:
        dl = rng.normal(size=(len(drafts), 3, vocab)).astype(np.float32)
        if dtype == "bfloat16":
            dl = (dl.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    b = make_batch(x, drafts, [1.0, 0.0, 0.7, 1.3, 1.0], k=3, draft_logits=dl, num_logprobs=num_logprobs,
                   logits_dtype=dtype)
    if features:  # SPEC 2's parameters, each off for some state, with block verification (SPEC 4b)
        b = b.replace(top_k=np.array([3, 2, 0, 5, 0], np.int32), top_p=np.array([0.9, 1, 0.6, 1, 0.3], np.float32),
                      min_p=np.array([0, 0.5, 0.05, 0, 0], np.float32), verification="block",
                      logprobs_mode="processed")
    return b


def test_greedy_chain(sampler):
    v = 33
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, v)).astype(np.float32)
    x[:, 32] += 10  # the argmax sits in the last (partial) vocab block
    a = x.argmax(axis=1)
    out = sampler(make_batch(x, [list(a[:3])], [0.0]))
    assert out.request(0) == [int(t) for t in a]  # 3 accepted + bonus
    assert out.sampled.dtype == np.int64 and out.num_sampled.dtype == np.int32
    wrong = [int(a[0]), (int(a[1]) + 1) % v, int(a[2])]
    out = sampler(make_batch(x, [wrong], [0.0]))
    assert out.request(0) == [int(a[0]), int(a[1])]
    assert out.sampled[0].tolist() == [int(a[0]), int(a[1]), -1, -1]


def test_greedy_ties_go_to_lowest_index(sampler):
    x = np.zeros((1, 40), np.float32)
    x[0, [35, 3, 20]] = 5.0  # three equal maxima in three different blocks of 16
    assert sampler(make_batch(x, [[]], [0.0])).request(0) == [3]


def test_one_hot_target_accepts_the_chain(sampler):
    v, chain = 40, [39, 0, 17, 33]
    out = sampler(make_batch(one_hot_rows(chain, v), [chain[:3]], [1.0]))
    assert out.request(0) == chain  # p(d) = 1 > u: every draft accepted, bonus is the point mass


def test_disjoint_supports_reject_first_draft(sampler):
    v, k = 33, 2
    target = np.full((3, v), NEG, np.float32)
    target[:, 20:24] = 0.0  # p on {20..23}
    dl = np.full((1, k, v), NEG, np.float32)
    dl[0, :, 0:4] = 0.0  # q on {0..3}
    for seed in range(4):
        out = sampler(make_batch(target, [[1, 2]], [1.0], draft_logits=dl, seeds=[seed]))
        assert out.num_sampled[0] == 1
        assert 20 <= out.sampled[0, 0] < 24  # the residual max(p - q, 0) is p


def test_padded_draft_is_rejected_and_resampled_from_p(sampler):
    v = 40
    x = one_hot_rows([36, 5, 7], v)
    out = sampler(make_batch(x, [[-1, 5]], [1.0]))
    assert out.request(0) == [36]  # p(d) > 0 is not enough: a padded draft proposed nothing
    dl = np.zeros((1, 2, v), np.float32)
    out = sampler(make_batch(x, [[-1, 5]], [1.0], draft_logits=dl))
    assert out.request(0) == [36]  # model drafts: the residual of a padded step is p, not p - q
    out = sampler(make_batch(x, [[-1, 5]], [0.0]))
    assert out.request(0) == [36]


def test_one_hot_residual_excludes_the_rejected_draft(sampler):
    v = 33
    x = np.full((2, v), NEG, np.float32)
    x[0, [4, 30]] = [0.0, -40.0]  # p(30) ~ 4e-18: the draft 30 is rejected (almost surely)
    x[1, 0] = 0.0
    for seed in range(4):
        out = sampler(make_batch(x, [[30]], [1.0], seeds=[seed]))
        assert out.request(0) == [4]


def test_bonus_only_requests(sampler):
    v = 40
    x = one_hot_rows([38, 1, 17], v)
    out = sampler(make_batch(x, [[], [], []], [1.0, 0.0, 0.5]))
    assert out.request(0) == [38] and out.request(1) == [1] and out.request(2) == [17]
    assert out.sampled.shape == (3, 1)


def test_bonus_draw_follows_triton_philox_streams(sampler):
    from rs_verify.contract.philox import TINY, rand, randint

    v = 40
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, v)).astype(np.float32)
    seeds = np.array([-5, 2**40 + 3, 2**63 - 1, 0, 123456789, -(2**62)], np.int64)
    pos = np.array([0, 7, 2**31 + 5, 2**33, 99, 12345], np.int64)
    out = sampler(make_batch(x, [[]] * 6, [1.0] * 6, seeds=seeds, pos=pos))
    checked = 0
    for r in range(6):
        g = randint(seeds[r], np.array([pos[r]], np.int64)).astype(np.int32)[0]
        u = np.maximum(rand(np.int32(g), np.arange(v, dtype=np.int32)), TINY).astype(np.float64)
        z = x[r].astype(np.float64)
        score = z - np.log(np.exp(z - z.max()).sum()) - np.log(-np.log1p(-u))
        best = np.sort(score)[::-1]
        if best[0] - best[1] > 1e-3:  # margin far above fp32 rounding: the token must match
            assert out.request(r) == [int(np.argmax(score))]
            checked += 1
    assert checked >= 3


def test_logprobs_shapes_ties_and_ranks(sampler):
    v, k = 33, 4
    x = np.zeros((3, v), np.float32)  # all ties: top-k is 0..k-1, every rank is 1
    x[2, 31] = 1.0
    b = make_batch(x, [[5, 9]], [1.0], num_logprobs=k)
    out = sampler(b)
    lp = out.logprobs
    assert lp.token_ids.shape == (3, k + 1) and lp.token_ids.dtype == np.int64
    assert lp.logprobs.shape == (3, k + 1) and lp.logprobs.dtype == np.float32
    assert lp.ranks.shape == (3,) and lp.ranks.dtype == np.int64
    assert lp.cu_num_generated_tokens == [0, 3]
    assert lp.token_ids[0, 1:].tolist() == [0, 1, 2, 3]
    assert lp.token_ids[2, 1:].tolist() == [31, 0, 1, 2]
    np.testing.assert_allclose(lp.logprobs[0], -np.log(v), rtol=1e-6)
    ns = int(out.num_sampled[0])
    for row in range(3):
        emitted = int(out.sampled[0, row]) if row < ns else 0
        assert lp.token_ids[row, 0] == emitted
    assert lp.ranks[:2].tolist() == [1, 1]
    assert lp.ranks[2] == (1 if lp.token_ids[2, 0] == 31 else 2)
    out0 = sampler(b.replace(num_logprobs=0))
    assert out0.logprobs.token_ids.shape == (3, 1)


def test_processed_logprobs_divide_by_temperature(sampler):
    x = np.array([[0.0, 1.0, 2.0, -1.0] * 10], np.float32)
    for mode, t in (("raw", 1.0), ("processed", 0.5)):
        out = sampler(make_batch(x, [[]], [0.5], num_logprobs=1, logprobs_mode=mode))
        z = x[0].astype(np.float64) / t
        want = z - z.max() - np.log(np.exp(z - z.max()).sum())
        np.testing.assert_allclose(out.logprobs.logprobs[0, 1], want.max(), rtol=1e-5)


@pytest.mark.parametrize("model, features", [(False, False), (True, False), (False, True), (True, True)])
def test_chunked_equals_full(sampler, model, features):
    b = mixed_batch(num_logprobs=2, model=model, features=features)
    full = sampler(b)
    for cap in (5, b.num_logits) if features else (1, 3, b.num_logits):  # 5: chunks of 2, 2 and 1 requests
        out = sampler(b, max_chunk_logits=cap)
        for name, arr in full.arrays().items():
            assert np.array_equal(arr, out.arrays()[name]), (cap, name)
        assert out.extras["num_chunks"] == len(list(iter_request_chunks(b.cu_num_logits, cap)))
        assert 0 < out.extras["max_buffer_rows"] <= cap
    assert sampler(b.replace(num_logprobs=None)).extras["max_buffer_rows"] == 0


@pytest.fixture(scope="module")
def murmur3_sampler():
    from rs_verify.triton_sampler import TritonSampler

    return TritonSampler(block_v=16, streams="murmur3")


def murmur3_batches():
    """Mixed batches (model drafts; parameters with block verification) and bonus draws at int64
    seed edges and positions above 2**32 (SPEC 3b hashes only the position's low word)."""
    rng = np.random.default_rng(8)
    seeds = np.array([-5, 2**40 + 3, 2**63 - 1, 0, -(2**63), -(2**62)], np.int64)
    pos = np.array([0, 2**32 + 7, 2**31 + 5, 2**33, 2**63 - 1, 12345], np.int64)
    yield make_batch(rng.normal(size=(6, 40)).astype(np.float32) * 3, [[]] * 6, [1.0, 0.5, 2.0, 1.0, 0.7, 1.0],
                     seeds=seeds, pos=pos)
    for seed in range(3):
        yield mixed_batch(seed=seed, num_logprobs=2, model=True)
        yield mixed_batch(seed=seed, model=bool(seed % 2), features=True)


def test_murmur3_chunked_equals_full_and_the_reference(murmur3_sampler):
    """SPEC 3b: the murmur3 sampler's chunked output equals its full output bit for bit, and every
    token the reference's drawing the same family; the Philox draws differ (the noise is murmur3's)."""
    from rs_verify.reference import ReferenceSampler

    ref, philox = ReferenceSampler(streams="murmur3"), ReferenceSampler()
    assert murmur3_sampler.streams == "murmur3" and murmur3_sampler.unvalidated().streams == "murmur3"
    differ = 0
    for b in murmur3_batches():
        full = murmur3_sampler(b)
        out = murmur3_sampler(b, max_chunk_logits=5)
        assert out.extras["num_chunks"] > 1 or b.num_logits <= 5
        for name, arr in full.arrays().items():
            assert np.array_equal(arr, out.arrays()[name]), name
        want, other = ref(b), philox(b)
        for r in range(b.num_reqs):
            assert full.request(r) == want.request(r), (r, b.seeds, b.pos)
            differ += full.request(r) != other.request(r)
    assert differ >= 3


@pytest.mark.parametrize("streams", ["own", "gumbel", "murmur", None])
def test_unknown_stream_family_is_refused(streams):
    from rs_verify.triton_sampler import TritonSampler

    with pytest.raises(ValueError, match="draws the stream families"):
        TritonSampler(streams=streams)
    assert TritonSampler(streams="spec").streams == "triton-philox"


def test_permuted_batch_is_per_request_identical(sampler):
    b = mixed_batch(seed=4, model=True)
    full = sampler(b)
    perm = [3, 0, 4, 2, 1]
    out = sampler(select_requests(b, perm))
    for i, r in enumerate(perm):
        assert out.request(i) == full.request(r)
    again = sampler(b)
    assert all(np.array_equal(a, again.arrays()[k]) for k, a in full.arrays().items())


def test_bfloat16_input_matches_float32_of_the_same_values(sampler):
    b16 = mixed_batch(seed=2, num_logprobs=1, dtype="bfloat16", model=True)
    out16 = sampler(b16)
    out32 = sampler(b16.replace(logits_dtype="float32"))
    for name, arr in out32.arrays().items():
        assert np.array_equal(arr, out16.arrays()[name]), name


def test_validation_rejects_nan_before_device_work(sampler):
    b = mixed_batch()
    x = b.target_logits.copy()
    x[2, 7] = np.nan
    with pytest.raises(ValueError, match="target_logits"):
        sampler(b.replace(target_logits=x))


def test_unvalidated_garbage_emits_in_range_tokens():
    from rs_verify.triton_sampler import TritonSampler

    raw = TritonSampler(block_v=16, validate=False)
    b = mixed_batch(num_logprobs=2, model=True)
    x = b.target_logits.copy()
    x[0] = np.nan
    x[4, :] = NEG
    ids = b.draft_token_ids.copy()
    ids[1:4] = [40, -7, 10**12]
    idx = np.array([0, 9, -3, 3, 4], np.int32)
    temp = b.temperature.copy()
    temp[2] = np.nan
    params = dict(top_k=np.int32([-4, 10**9, 1, 3, 40]), min_p=np.float32([np.inf, -1, 2, np.nan, 1]),
                  top_p=np.float32([np.nan, -1, 0, 2, 0.5]), logprobs_mode="processed", verification="block")
    for bad in (
        b.replace(target_logits=x),
        b.replace(draft_token_ids=ids, idx_mapping=idx, temperature=temp),
        b.replace(cu_num_logits=np.array([0, 9, 3, 3, 30, 12], np.int32)),
        b.replace(target_logits=x, draft_token_ids=ids, idx_mapping=idx, temperature=temp, **params),
    ):
        out = raw(bad, max_chunk_logits=3)
        v = bad.effective_vocab_size
        for r in range(bad.num_reqs):
            toks = np.asarray(out.request(r))
            assert ((toks >= 0) & (toks < v)).all(), (r, out.sampled)
        assert ((out.logprobs.token_ids >= 0) & (out.logprobs.token_ids < v)).all()


# -- SPEC section 2: sampling-parameter masks ----------------------------------------------------
def kept_sets(sampler, x, temps, drafts=None, **kw):
    """Per row, the tokens the masks keep (finite processed logprob), and the output; one request per
    row unless `drafts` is given. Every emitted token must be kept."""
    x = np.asarray(x, np.float32)
    for k in set(kw) & {"top_k", "top_p", "min_p"}:
        kw[k] = np.asarray(kw[k], np.int32 if k == "top_k" else np.float32)
    b = make_batch(x, drafts or [[]] * len(x), temps, num_logprobs=x.shape[1], logprobs_mode="processed",
                   k=None if drafts else 0, **kw)
    out = sampler(b)
    ids, vals = out.logprobs.token_ids[:, 1:], out.logprobs.logprobs[:, 1:]
    kept = [sorted(ids[j][np.isfinite(vals[j])].tolist()) for j in range(len(x))]
    for r in range(b.num_reqs):
        assert all(tok in kept[int(b.cu_num_logits[r]) + i] for i, tok in enumerate(out.request(r))), (r, kept)
    return kept, out


def row(v=40, fill=-4.0, **at):
    """A row of `fill` with x[i] = value for each `t<i>=value`."""
    x = np.full(v, fill, np.float32)
    x[[int(k[1:]) for k in at]] = list(at.values())
    return x


def test_min_p_keeps_the_tokens_above_max_plus_log_m(sampler):
    kept, _ = kept_sets(sampler, [row(t1=3, t18=3, t35=2.5, t2=0)] * 3, [1.0, 1.0, 0.5], min_p=[1.0, 0.5, 0.5])
    assert kept[0] == [1, 18]  # m = 1 keeps the tokens tied at the maximum (strict <)
    assert kept[1] == [1, 18, 35]  # threshold 3 + log 0.5 = 2.31
    assert kept[2] == [1, 18]  # at T = 0.5: z = 6, 6, 5 and threshold 5.31


def test_top_k_keeps_every_tie_of_the_kth_value(sampler):
    kept, _ = kept_sets(sampler, [row(t30=5, t3=3, t17=3, t33=3, t9=2)] * 4, [1.0] * 4, top_k=[1, 2, 4, 5])
    assert kept[0] == [30]
    assert kept[1] == kept[2] == [3, 17, 30, 33]  # the k-th value is 3: all three ties kept
    assert kept[3] == [3, 9, 17, 30, 33]


def test_top_p_orders_ties_by_token_id(sampler):
    ties = row(fill=-np.inf, t3=0, t17=0, t20=0, t35=0)  # p = 1/4 each
    kept, _ = kept_sets(sampler, [ties, ties, ties, row(t30=10, t3=0)], [1.0] * 4, top_p=[0.5, 0.6, 0.25, 0.9])
    assert kept[0] == [3, 17]  # the mass before token 20 is exactly 0.5, not < 0.5
    assert kept[1] == [3, 17, 20]
    assert kept[2] == [3]  # the most likely token is always kept
    assert kept[3] == [30]


def test_masks_apply_in_order_min_p_top_k_top_p(sampler):
    x = [row(fill=0.0, t5=2, t21=2)] * 3  # 38 tokens at 0: top-p on the whole row would keep many
    kept, _ = kept_sets(sampler, x, [1.0] * 3, top_k=[2, 0, 2], top_p=[0.5, 0.5, 1.0], min_p=[0, 0.5, 0])
    assert kept[0] == [5]  # top-k leaves {5, 21} at 1/2 each; top-p 0.5 keeps the lower id
    assert kept[1] == [5]  # min-p 0.5 (threshold 2 - 0.69) leaves the same two
    assert kept[2] == [5, 21]


def test_greedy_rows_ignore_the_parameters(sampler):
    kept, out = kept_sets(sampler, [row(t7=1.0, t8=0.5)], [0.0], top_k=[1], top_p=[0.1], min_p=[1.0])
    assert kept[0] == list(range(40)) and out.request(0) == [7]  # raw logprobs, argmax


def test_masks_apply_to_draft_rows_and_the_bonus_row(sampler):
    x = np.stack([row(t4=2, t9=1.9), row(t12=2, t30=1.9), row(t25=2, t2=1.9)])
    for seed in range(3):  # top-k 1: p is a point mass on every row
        _, out = kept_sets(sampler, x, [1.0], drafts=[[4, 30]], seeds=[seed], top_k=[1])
        assert out.request(0) == [4, 12]  # 30 is masked (p = 0): rejected, resampled to 12
        _, out = kept_sets(sampler, x, [1.0], drafts=[[4, 12]], seeds=[seed], top_k=[1])
        assert out.request(0) == [4, 12, 25]  # the bonus row is masked too


def test_processed_logprobs_do_not_mask_tokens_outside_the_draft_vocab(sampler):
    kept, _ = kept_sets(sampler, [row(t3=2, t36=1)], [1.0], draft_logits=np.zeros((1, 0, 33), np.float32), top_k=[1])
    assert kept[0] == [3, *range(33, 40)]  # [V', V) = [33, 40) are not mask decisions


# -- SPEC section 4b: block verification -----------------------------------------------------------
def find_pos(seed, want, start=1000):
    """The first pos p >= start with want(u at p, u at p + 1) (the uniforms of two consecutive rows)."""
    from rs_verify.contract.philox import TINY, rand

    p = np.arange(start, start + 4000)
    u = np.maximum(rand(seed, p), TINY)
    return int(p[np.flatnonzero(want(u[:-1], u[1:]))[0]])


def lp(*probs):
    """Logits log p over 40 tokens from (token, p) pairs, -inf elsewhere."""
    return row(fill=-np.inf, **{f"t{t}": np.log(p) for t, p in probs})


def test_block_rescue_after_an_earlier_rejection(sampler):
    # One-hot drafts: P_0 = p_0(d_0) = 0.2, Z_1 = P_0 (1 - p_1(d_1)) = 0 so h_0 = 0; h_1 = P_1 = 0.2.
    x = np.stack([lp((10, 0.2), (11, 0.8)), lp((20, 1.0)), lp((30, 1.0))])
    for rescued in (True, False):
        pos = find_pos(7, lambda u0, u1: (u0 > 0.2) & ((u1 <= 0.2) == rescued))
        b = make_batch(x, [[10, 20]], [1.0], seeds=[7], pos=[pos, pos + 1, pos + 2], verification="block")
        assert sampler(b).request(0) == ([10, 20, 30] if rescued else [11])  # else tau = 0: p_0 without 10
        assert sampler(b.replace(verification="token")).request(0) == [11]  # token-wise rejects d_0


def test_block_one_hot_target_accepts_the_block(sampler):
    # P = 1 and Z = 0 at every step (Z + 1 - P = 0: h = 1 by rule); the last step's h = P = 1 alone
    # decides tau = n here (a later accepted step always overrides an earlier h).
    chain = [39, 0, 17, 33]
    for seed in range(3):
        assert sampler(make_batch(one_hot_rows(chain, 40), [chain[:3]], [1.0], seeds=[seed],
                                  verification="block")).request(0) == chain


@pytest.mark.parametrize("model", [False, True])
def test_block_draft_the_target_excludes_never_extends_it(sampler, model):
    # p_0(d_0) = 0 (and q_0(d_0) = 0 for model drafts: no NaN ratio may give P = 1): P = 0 from step 0 on.
    x = np.stack([lp((1, 0.5), (2, 0.5)), lp((5, 1.0)), lp((6, 1.0))])
    dl = np.stack([lp((1, 1.0)), lp((5, 1.0))])[None] if model else None
    for seed in range(4):
        out = sampler(make_batch(x, [[3, 5]], [1.0], seeds=[seed], draft_logits=dl, verification="block"))
        assert out.request(0)[0] in (1, 2) and out.num_sampled[0] == 1


@pytest.mark.parametrize("model", [False, True])
def test_block_padded_draft_ends_the_block(sampler, model):
    # h_0 = P_0 = 1 (the pad makes step 0 the last), so tau = 1 = m: resampled from p_1, not p_1 - q_1
    # (q_1 is a point mass at 3). A -1 read as token 39 would extend the block to d_2 = 9 half the time.
    x = np.stack([lp((8, 1.0)), lp((3, 0.25), (4, 0.25), (39, 0.5)), lp((9, 1.0)), lp((12, 1.0))])
    dl = np.stack([lp((8, 1.0)), lp((3, 1.0)), lp((9, 1.0))])[None] if model else None
    outs = [sampler(make_batch(x, [[8, -1, 9]], [1.0], seeds=[seed], pos=np.arange(4) + 7919 * seed,
                               draft_logits=dl, verification="block")).request(0) for seed in range(16)]
    assert all(out[0] == 8 and len(out) == 2 for out in outs), outs
    assert {out[1] for out in outs} == {3, 4, 39}


def test_block_model_threshold_and_scaled_residual(sampler):
    # P_0 = p_0(d_0) / q_0(d_0) = 0.5; Z_1 = sum max(0.5 p_1 - q_1, 0) = 0.2 (token 1 only), so
    # h_0 = 0.2 / (0.2 + 0.5) = 2/7; d_1 = 3 has p_1 = 0: P_1 = 0 = h_1. tau = 1 iff u_0 <= 2/7, then
    # the residual max(0.5 p_1 - q_1, 0) is token 1 alone (unscaled, p_1 - q_1 would keep token 2).
    x = np.stack([lp((0, 0.5), (5, 0.5)), lp((1, 0.4), (2, 0.6)), lp((7, 1.0))])
    dl = np.stack([lp((0, 1.0)), lp((2, 0.45), (3, 0.55))])[None]
    for k, accepted in enumerate((True, True, True, False, False)):
        pos = find_pos(3, lambda u0, u1: (u0 <= 2 / 7) if accepted else (u0 > 2 / 7) & (u0 < 0.5), 1000 + 5000 * k)
        b = make_batch(x, [[0, 3]], [1.0], seeds=[3], draft_logits=dl, pos=pos + np.arange(3), verification="block")
        assert sampler(b).request(0) == ([0, 1] if accepted else [5])
        if not accepted:  # token-wise accepts d_0 (0.5 > u_0): block verification differs here
            assert sampler(b.replace(verification="token")).request(0) == [0, 1]


def test_block_batches_verify_greedy_requests_token_wise(sampler):
    x = np.stack([row(t4=2), row(t12=2, t13=1.99), row(t25=2), row(t2=2)])
    for seed in range(6):  # sampled at T = 1, d_1 = 13 (p ~ 1/2) would often be accepted
        out = sampler(make_batch(x, [[4, 13, 25]], [0.0], seeds=[seed], pos=np.arange(4) + 7919 * seed,
                                 verification="block"))
        assert out.request(0) == [4, 12]  # the argmax chain, first mismatch at step 1
    assert sampler.verification_methods == {"token", "block"} and sampler.sampling_params == {"min_p", "top_k", "top_p"}
