"""Fast hand-built cases for the Triton sampler (SPEC sections 4-7), answers known analytically.

Runs under the Triton interpreter on CPU (block_v=16, so vocabularies of 33
and 40 take multi-block reductions) and compiled on GPU. Each case has a
handful of programs: the whole file stays well under a minute on CPU.
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


def mixed_batch(seed=0, vocab=40, num_logprobs=None, dtype="float32", model=False):
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


def test_bonus_draw_follows_spec_streams(sampler):
    from rs_verify.spec.philox import TINY, rand, randint

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


@pytest.mark.parametrize("model", [False, True])
def test_chunked_equals_full(sampler, model):
    b = mixed_batch(num_logprobs=2, model=model)
    full = sampler(b)
    for cap in (1, 3, b.num_logits):
        out = sampler(b, max_chunk_logits=cap)
        for name, arr in full.arrays().items():
            assert np.array_equal(arr, out.arrays()[name]), (cap, name)
        assert out.extras["num_chunks"] == len(list(iter_request_chunks(b.cu_num_logits, cap)))
        assert 0 < out.extras["max_buffer_rows"] <= cap
    assert sampler(b.replace(num_logprobs=None)).extras["max_buffer_rows"] == 0


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
    for bad in (
        b.replace(target_logits=x),
        b.replace(draft_token_ids=ids, idx_mapping=idx, temperature=temp),
        b.replace(cu_num_logits=np.array([0, 9, 3, 3, 30, 12], np.int32)),
    ):
        out = raw(bad, max_chunk_logits=3)
        v = bad.effective_vocab_size
        for r in range(bad.num_reqs):
            toks = np.asarray(out.request(r))
            assert ((toks >= 0) & (toks < v)).all(), (r, out.sampled)
        assert ((out.logprobs.token_ids >= 0) & (out.logprobs.token_ids < v)).all()
