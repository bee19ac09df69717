"""The reference's block verification (SPEC section 4b) on hand-built batches.

Known answers worked out from the SPEC's formulas, a per-request loop written from the SPEC text
(`_naive_block`: plain Python over the rows, sharing only the Philox streams and the masked `p` of
`spec.probs` with the reference), and the law of `tau` for fixed one-hot drafts.
"""

import numpy as np
import pytest
from scipy import stats

from test_reference import NEG, _naive, make_batch, one_hot_rows, random_batch
from rs_verify.reference import ReferenceSampler, acceptance_uniforms, gumbel_noise
from rs_verify.contract import explicit, philox, probs
from rs_verify.contract.batch import SamplerOutput, SpecBatch
from rs_verify.properties.decisions import compare_decisions
from rs_verify.contract.block import block_quantities, tau_law, thresholds
from rs_verify.contract.chunking import select_requests

SAMPLER = ReferenceSampler()


def block(b, **kw):
    return b.replace(verification="block", **kw)


def _gumbel_argmax(base, seed, pos, v):
    return int(np.argmax(base + gumbel_noise([seed], [pos], v)[0]))


def _naive_block(batch) -> list[list[int]]:
    """SPEC section 4b request by request (greedy requests: section 4 through test_reference's loop)."""
    vp = batch.effective_vocab_size
    p_all, q_all = probs.target_probs(batch), probs.draft_probs(batch)
    token_wise = _naive(batch)
    out = []
    for r in range(batch.num_reqs):
        s = int(batch.idx_mapping[r])
        if batch.temperature[s] == 0:
            out.append(token_wise[r])
            continue
        seed, base = np.int64(batch.seeds[s]), int(batch.cu_num_logits[r])
        d = [int(x) for x in batch.draft_tokens(r)]
        n = len(d)
        m = next((i for i, x in enumerate(d) if not 0 <= x < vp), n)
        p = [p_all[base + i] for i in range(n + 1)]
        q = [None if q_all is None else q_all[base + i] for i in range(n)]
        big_p, prev = [], 1.0
        for i in range(m):
            pd, qd = p[i][d[i]], (1.0 if q[i] is None else q[i][d[i]])
            prev = 0.0 if pd == 0 or prev == 0 else min(prev * pd / qd if qd > 0 else 1.0, 1.0)
            big_p.append(prev)
        tau = 0
        for i in range(m):
            if i + 1 < m:
                if q[i + 1] is None:
                    z = big_p[i] * (1 - p[i + 1][d[i + 1]])
                else:
                    z = np.maximum(big_p[i] * p[i + 1] - q[i + 1], 0).sum()
                h = z / (z + 1 - big_p[i]) if z + 1 - big_p[i] > 0 else 1.0
            else:
                h = big_p[i]
            u = max(philox.rand(seed, np.array([batch.pos[base + i]], np.int64))[0], philox.TINY)
            if u <= h:
                tau = i + 1
        emitted = d[:tau]
        j = base + tau
        law = p[tau]
        if tau < m:  # a residual (tau == m: the padded step or the bonus: p itself)
            if q[tau] is None:
                law = p[tau].copy()
                law[d[tau]] = 0
            else:
                law = np.maximum((big_p[tau - 1] if tau else 1.0) * p[tau] - q[tau], 0)
            if not (law > 0).any():
                law = p[tau]
        with np.errstate(divide="ignore"):
            emitted.append(_gumbel_argmax(np.log(law), seed, batch.pos[j], vp))
        out.append(emitted)
    return out


def _mixed_params(b, seed):
    rng = np.random.default_rng(seed)
    s = b.num_states
    return b.replace(top_k=rng.choice([0, 2, 5], s).astype(np.int32),
                     top_p=rng.choice([1.0, 0.8], s).astype(np.float32),
                     min_p=rng.choice([0.0, 0.1], s).astype(np.float32))


def _near_q(b, seed, noise=0.7):
    """`b` with draft logits a noisy copy of each request's target rows and its real drafts drawn from
    those q (so blocks get accepted); padded drafts stay."""
    rng = np.random.default_rng(seed)
    dl = np.array(b.draft_logits)
    x = np.asarray(b.target_logits)
    ids = np.array(b.draft_token_ids)
    t = np.asarray(b.temperature)
    for r in range(b.num_reqs):
        s, base = int(b.idx_mapping[r]), int(b.cu_num_logits[r])
        for i in range(int(b.num_draft_tokens[r])):
            row = x[base + i, : dl.shape[2]]
            dl[s, i] = np.where(np.isfinite(row), row + rng.standard_normal(row.shape) * noise, NEG)
            if ids[base + i + 1] >= 0:
                zq = dl[s, i, : b.effective_vocab_size].astype(np.float64) / (t[s] or 1.0)
                q = np.exp(zq - zq.max())
                ids[base + i + 1] = rng.choice(q.size, p=q / q.sum())
    return b.replace(draft_logits=dl.astype(np.float32), draft_token_ids=ids)


@pytest.mark.parametrize("one_hot, vd, masks", [(False, None, False), (False, 21, False), (True, None, False),
                                                (False, None, True), (True, None, True)],
                         ids=["model", "model-Vd<V", "one_hot", "model-masks", "one_hot-masks"])
def test_matches_per_request_loop(one_hot, vd, masks):
    """Mixed greedy / stochastic, padded drafts (mid-block too), ragged n_r, masks composing with blocks."""
    taus = set()
    for seed in range(4):
        b = block(random_batch(300 + seed, one_hot=one_hot, vd=vd, k=4, reqs=16, pad_frac=0.15,
                               v=3 if one_hot else 33))
        if not one_hot:
            b = _near_q(b, seed)
        if masks:
            b = _mixed_params(b, seed)
        out = SAMPLER(b)
        assert [out.request(r) for r in range(b.num_reqs)] == _naive_block(b)
        taus |= set(out.num_sampled.tolist())
    assert len(taus) >= 4  # blocks of several lengths were accepted: the comparison is not vacuous


@pytest.mark.parametrize("one_hot", [False, True])
def test_one_step_blocks_equal_token_wise(one_hot):
    """K = 0 and K = 1: h_0 = P_0 = min(p(d) / q(d), 1) and the residual is max(p - q, 0): block and token-wise
    verification emit the same tokens and logprobs, and each block decision's margin is the acceptance
    test's when p(d) < q(d)."""
    compared = 0
    for seed in range(3):
        b = random_batch(400 + seed, one_hot=one_hot, k=1, reqs=30, num_logprobs=2, pad_frac=0.2,
                         v=6 if one_hot else 33)
        b = b if one_hot else _near_q(b, seed)
        out, tr = SAMPLER.verify_with_trace(b)
        bout, btr = SAMPLER.verify_with_trace(block(b))
        for name, arr in out.arrays().items():
            assert np.array_equal(arr, bout.arrays()[name]), name
        for t, bt in zip(tr, btr, strict=True):
            acc = [d for d in t.decisions if d.kind == "accept"]
            blk = [d for d in bt.decisions if d.kind == "block"]
            if acc and acc[0].margin > -np.inf and blk:
                assert blk[0].accepted == acc[0].accepted
                logu = np.log(np.float64(acceptance_uniforms(b)[acc[0].row]))
                if acc[0].margin + logu < 0:  # p(d) < q(d)
                    assert blk[0].margin == pytest.approx(acc[0].margin, rel=1e-12, abs=1e-12)
                    compared += 1
            assert [d.kind for d in t.decisions if d.kind != "accept"] == [
                d.kind for d in bt.decisions if d.kind != "block"]
    assert compared >= 5
    b = random_batch(410, one_hot=one_hot, k=0, reqs=6, num_logprobs=1)  # K = 0: the bonus alone
    for name, arr in SAMPLER(b).arrays().items():
        assert np.array_equal(arr, SAMPLER(block(b)).arrays()[name]), name


def _one_hot_block(p_rows, drafts, seeds, pos=None):
    """One request per seed, every request the same target rows (probabilities, float64) and drafts."""
    x = np.log(np.asarray(p_rows, np.float64)).astype(np.float32)
    n = len(drafts)
    reqs = len(seeds)
    cu = np.arange(reqs + 1) * (n + 1)
    return block(make_batch(np.tile(x, (reqs, 1)), [drafts] * reqs, cu, seeds=seeds, k=n,
                            pos=np.tile(np.arange(n + 1) + 50, reqs) if pos is None else pos))


def test_later_step_rescues_the_block():
    """One-hot drafts, p_0(d_0) = a = .5, p_1(d_1) = b = .9: P = (a, ab), Z_1 = a (1 - b),
    h_0 = a (1 - b) / (a (1 - b) + 1 - a) = 1/11, h_1 = ab = .45. A seed with u_0 > h_0 and u_1 <= h_1
    accepts both drafts (tau = 2) and emits the bonus; token-wise verification stops at step 0."""
    p_rows = [[0.5, 0.25, 0.25], [0.05, 0.05, 0.9], [0.2, 0.3, 0.5]]
    b = _one_hot_block(p_rows, [0, 2], seeds=np.arange(400))
    out, traces = SAMPLER.verify_with_trace(b)
    pt = probs.target_probs(b)
    a, bb = pt[0, 0], pt[1, 2]
    h0, h1 = a * (1 - bb) / (a * (1 - bb) + 1 - a), a * bb
    u = acceptance_uniforms(b).astype(np.float64)
    token_wise = SAMPLER(b.replace(verification="token"))
    rescued = 0
    for r, tr in enumerate(traces):
        blk = [d for d in tr.decisions if d.kind == "block"]
        assert [d.step for d in blk] == [0, 1]
        assert blk[0].margin == pytest.approx(np.log(h0) - np.log(u[3 * r]), rel=1e-12)
        assert blk[1].margin == pytest.approx(np.log(h1) - np.log(u[3 * r + 1]), rel=1e-12)
        assert blk[0].scale == max(1, abs(np.log(u[3 * r])), abs(np.log(a)), abs(blk[0].margin + np.log(u[3 * r])))
        if not blk[0].accepted and blk[1].accepted:
            rescued += 1
            assert tr.tokens[:2] == [0, 2] and tr.decisions[-1].step == 2  # the bonus row's argmax
            assert not any(d.kind == "residual" for d in tr.decisions)
            assert tr.tokens[2] == _gumbel_argmax(np.log(pt[2]), int(b.seeds[r]), 52, 3)
            if u[3 * r] >= a:  # token-wise rejects d_0 (log p(d_0) > log u fails) and stops there
                assert token_wise.num_sampled[r] == 1
    assert rescued > 100  # P(u_0 > 1/11, u_1 <= .45) = .41 of 400 seeds


def test_partly_accepted_block_resamples_from_the_scaled_residual():
    """Model drafts (d_0, d_1) = (0, 3): P_0 = p_0(0) / q_0(0) = .25 / .5 = .5; p_1 = (.4, .3, .2, .1),
    q_1 = (.1, .1, .1, .7): Z_1 = sum max(.5 p_1 - q_1, 0) = .15, h_0 = .15 / .65, h_1 = P_1 = .5 * .1 / .7.
    When tau = 1 (u_0 <= h_0 and u_1 > h_1) the token at row 1 comes from max(P_0 p_1 - q_1, 0) =
    (.1, .05, 0, 0), never token 2, which the unscaled max(p_1 - q_1, 0) = (.3, .2, .1, 0) can emit."""
    reqs = 300
    x = np.log(np.array([[0.25] * 4, [0.4, 0.3, 0.2, 0.1], [0.25] * 4])).astype(np.float32)
    dl = np.log(np.array([[[0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3], [0.1, 0.1, 0.1, 0.7]]])).astype(np.float32)
    b = block(make_batch(np.tile(x, (reqs, 1)), [[0, 3]] * reqs, np.arange(reqs + 1) * 3,
                         draft_logits=np.repeat(dl, reqs, axis=0), seeds=np.arange(reqs),
                         pos=np.tile([20, 21, 22], reqs)))
    out, traces = SAMPLER.verify_with_trace(b)
    pt, qt = probs.target_probs(b), probs.draft_probs(b)
    big_p = pt[0, 0] / qt[0, 0]
    with np.errstate(divide="ignore"):
        scaled, unscaled = np.log(np.maximum(big_p * pt[1] - qt[1], 0)), np.log(np.maximum(pt[1] - qt[1], 0))
    partial, unscaled_differs = 0, 0
    for r in np.flatnonzero(out.num_sampled == 2):
        partial += 1
        res = next(d for d in traces[r].decisions if d.kind == "residual")
        assert (res.step, res.accepted) == (1, True) and res.margin == pytest.approx(0.15, rel=1e-6)
        assert out.request(r) == [0, _gumbel_argmax(scaled, r, 21, 4)] and out.request(r)[1] in (0, 1)
        unscaled_differs += out.request(r)[1] != _gumbel_argmax(unscaled, r, 21, 4)
    assert partial >= 30 and unscaled_differs >= 5


@pytest.mark.parametrize("q_zero", [False, True])
def test_prefix_ratio_collapses_at_p_zero(q_zero):
    """p_0(d_0) = 0 (masked logit) gives P_0 = 0 and P_1 = 0 whatever q: h_0 = Z_1 / (Z_1 + 1) with
    Z_1 = sum max(0 - q, 0) = 0, h_1 = P_1 = 0, so tau = 0 for every seed. With q_0(d_0) = 0 as well
    (p = q = 0) P stays 0 (vLLM's NaN ratio read as P = 1 would accept d_0 on a one-step block)."""
    x = np.array([[NEG, 0, 1, 2], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    dl = np.zeros((1, 2, 4), np.float32)
    if q_zero:
        dl[0, 0, 0] = NEG
    for drafts in ([0, 1], [0]):
        n = len(drafts)
        rows = x if n == 2 else x[[0, 2]]
        for seed in range(30):
            b = block(make_batch(rows, [drafts], [0, n + 1], draft_logits=dl[:, :n] if n == 2 else dl[:, :1],
                                 seeds=[seed], k=n))
            out, traces = SAMPLER.verify_with_trace(b)
            blk = [d for d in traces[0].decisions if d.kind == "block"]
            assert [(d.accepted, d.margin) for d in blk] == [(False, -np.inf)] * n
            assert out.num_sampled.tolist() == [1] and out.request(0)[0] in (1, 2, 3)
    p = np.zeros((1, 2, 4))
    p[0, :, 1] = 1.0  # p(d = 0) = 0
    q = np.array([[[0.0, 1 / 3, 1 / 3, 1 / 3]]])  # q(d = 0) = 0 too
    res = block_quantities(p, q, np.array([[0]]), np.array([1]))
    assert res.log_prefix.tolist() == [[-np.inf]] and res.h.tolist() == [[0.0]]


def test_zero_threshold_denominator_gives_one():
    """Model drafts with q_i = p_i (the same logits): P_0 = 1 and Z_1 = sum max(p - q, 0) = 0, so
    Z_1 + 1 - P_0 = 0 and h_0 = 1 (step 0 accepted at every u: margin -log u_0); the block is accepted."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    dl = x[None, :2].copy()
    for seed in range(20):
        b = block(make_batch(x, [[1, 3]], [0, 3], draft_logits=dl, seeds=[seed], temperature=0.8))
        out, traces = SAMPLER.verify_with_trace(b)
        blk = [d for d in traces[0].decisions if d.kind == "block"]
        u0 = np.float64(acceptance_uniforms(b)[0])
        assert blk[0].accepted and blk[0].margin == -np.log(u0)
        assert out.request(0)[:2] == [1, 3] and out.num_sampled.tolist() == [3]
    h = thresholds(np.array([[0.0, 0.0]]), np.array([[0.0, np.nan]]), np.array([2]))
    assert h.tolist() == [[1.0, 1.0]]


def test_padded_draft_ends_the_block():
    """Drafts (a, -1, b): m = 1, one block decision (h_0 = P_0). tau = 1 == m resamples from p at the
    padded row with that row's noise (no residual decision); tau = 0 resamples from the residual of d_0."""
    x = np.array([[0, 0.5, 1, 0], [2, 0, 1, -1], [0, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    seen = set()
    for seed in range(40):
        b = block(make_batch(x, [[2, -1, 1]], [0, 4], seeds=[seed], pos=[7, 8, 9, 10]))
        out, traces = SAMPLER.verify_with_trace(b)
        kinds = [d.kind for d in traces[0].decisions]
        tau = int(out.num_sampled[0]) - 1
        seen.add(tau)
        assert tau in (0, 1) and kinds.count("block") == 1
        if tau == 1:
            assert kinds == ["block", "argmax"] and out.request(0)[0] == 2
            assert out.request(0)[1] == _gumbel_argmax(np.log(probs.target_probs(b)[1]), seed, 8, 4)
        else:
            assert kinds == ["block", "residual", "argmax"]
            law = probs.target_probs(b)[0].copy()
            law[2] = 0
            with np.errstate(divide="ignore"):
                assert out.request(0) == [_gumbel_argmax(np.log(law), seed, 7, 4)]
    assert seen == {0, 1}


def test_full_block_emits_the_bonus():
    """p one-hot at every draft: P = 1, h = 1, tau = n; the bonus is argmax(log p_n + G) of the bonus row."""
    v = 7
    x = np.vstack([one_hot_rows([3, 1, 6], v), np.random.default_rng(2).standard_normal((1, v)).astype(np.float32)])
    for drafts in ("model", "one_hot"):
        dl = None if drafts == "one_hot" else np.random.default_rng(3).standard_normal((1, 3, v)).astype(np.float32)
        for seed in range(15):
            b = block(make_batch(x, [[3, 1, 6]], [0, 4], draft_logits=dl, seeds=[seed], pos=[5, 6, 7, 8]))
            out, traces = SAMPLER.verify_with_trace(b)
            bonus = _gumbel_argmax(np.log(probs.target_probs(b)[3]), seed, 8, v)
            assert out.request(0) == [3, 1, 6, bonus]
            assert [d.kind for d in traces[0].decisions] == ["block"] * 3 + ["argmax"]
            assert all(d.accepted for d in traces[0].decisions[:3])


def test_block_decisions_match_the_dense_quantities():
    """The slab's flat computation of log P, Z and h (reference.block) agrees with spec.block's dense one."""
    for one_hot in (False, True):
        b = block(random_batch(500 + one_hot, one_hot=one_hot, reqs=12, greedy_frac=0.0, pad_frac=0.1))
        b = b if one_hot else _near_q(b, 5)
        _, traces = SAMPLER.verify_with_trace(b)
        k, vp = b.num_speculative_steps, b.effective_vocab_size
        pt, qt = probs.target_probs(b), probs.draft_probs(b)
        p = np.zeros((b.num_reqs, k + 1, vp))
        q = None if one_hot else np.zeros((b.num_reqs, k, vp))
        drafts = np.full((b.num_reqs, k), -1)
        for r in range(b.num_reqs):
            rows = list(b.request_rows(r))
            p[r, : len(rows)] = pt[rows]
            if q is not None:
                q[r, : len(rows) - 1] = qt[rows[:-1]]
            drafts[r, : len(rows) - 1] = b.draft_tokens(r)
        res = block_quantities(p, q, drafts, b.num_draft_tokens)
        u = acceptance_uniforms(b).astype(np.float64)
        for r, tr in enumerate(traces):
            blk = [d for d in tr.decisions if d.kind == "block"]
            assert len(blk) == res.m[r]
            for d in blk:
                h = res.h[r, d.step]
                assert d.accepted == (u[d.row] <= h)
                with np.errstate(divide="ignore"):
                    assert d.margin == pytest.approx(np.log(h) - np.log(u[d.row]), rel=1e-9, abs=1e-12)


def test_tau_follows_its_law_for_fixed_one_hot_drafts():
    """Over 4000 seeds the empirical law of tau (fixed one-hot drafts, K = 3, fixed p: h = (.31, .13, .34))
    matches spec.block.tau_law. Chi-square with 3 degrees of freedom (4 cells, expected counts >= 330),
    rejected at p < 1e-4: a correct sampler fails this fixed-seed test with probability 1e-4 over the
    choice of seeds. Power: thresholds that forget Z (h_i = P_i at every step) give a law at total
    variation .25 from it, a chi-square noncentrality of about 1900 at this size: power ~1 (checked below
    on the law itself). For fixed drafts no coupling accepts d_0..d_{t-1} more often than prod p_i(d_i):
    the law equals token-wise verification's, P(tau = t) = prod_{i<t} p_i(d_i) (1 - p_t(d_t))."""
    p_rows = [[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.4, 0.3, 0.3]]
    drafts = [0, 1, 2]
    seeds = np.arange(4000, dtype=np.int64) * 7919 + 11
    b = _one_hot_block(p_rows, drafts, seeds)
    tau = SAMPLER(b).num_sampled.astype(np.int64) - 1
    pt = probs.target_probs(b)[:4]
    law = tau_law(block_quantities(pt[None], None, np.array([drafts]), np.array([3])))[0]
    counts = np.bincount(tau, minlength=4)
    assert law.min() * seeds.size >= 100
    assert stats.chisquare(counts, law * seeds.size).pvalue > 1e-4
    pd = pt[np.arange(3), drafts]
    token_wise = np.array([1 - pd[0], pd[0] * (1 - pd[1]), pd[0] * pd[1] * (1 - pd[2]), pd.prod()])
    assert np.allclose(law, token_wise, rtol=1e-12)
    big_p = np.cumprod(pd)
    no_z = np.array([np.prod(1 - big_p), big_p[0] * np.prod(1 - big_p[1:]), big_p[1] * (1 - big_p[2]), big_p[2]])
    assert 0.5 * np.abs(no_z - law).sum() > 0.2
    assert stats.chisquare(counts, no_z * seeds.size).pvalue < 1e-20  # the test tells the two apart


def test_block_is_independent_of_slabs_chunks_and_order():
    """Slabs of one request, chunk caps 1..N and a permutation of the requests give the same bits."""
    for one_hot in (False, True):
        b = block(random_batch(600 + one_hot, one_hot=one_hot, reqs=12, num_logprobs=2, pad_frac=0.15))
        b = b if one_hot else _near_q(b, 6)
        full, traces = SAMPLER.verify_with_trace(b)
        tiny, tiny_traces = ReferenceSampler(slab_elems=1).verify_with_trace(b)
        for name, arr in full.arrays().items():
            assert np.array_equal(arr, tiny.arrays()[name]), name
            for cap in (1, 4, b.num_logits):
                assert np.array_equal(arr, SAMPLER(b, max_chunk_logits=cap).arrays()[name]), (cap, name)
        key = [[(d.kind, d.row, d.token, d.accepted, d.margin, d.scale) for d in t.decisions] for t in traces]
        assert key == [[(d.kind, d.row, d.token, d.accepted, d.margin, d.scale) for d in t.decisions]
                       for t in tiny_traces]
        perm = np.random.default_rng(1).permutation(b.num_reqs)
        out = SAMPLER(select_requests(b, perm))
        assert [out.request(i) for i in range(b.num_reqs)] == [full.request(int(r)) for r in perm]


def _underflowing_block(u0: float) -> SpecBatch:
    """One request, model drafts (d_0, d_1) = (1, 2), explicit noise: q_0 = p_0 uniform over 4 tokens
    (P_0 = 1, so h_0 = Z_1 / Z_1 = 1 unless Z_1 = 0); q_1(d_1) = e**-200 / (3 + e**-200), below
    2**-126, with p_1(d_1) = 1/4: the float64 P_1 is 1, a float32 sampler's 0/0 is anything."""
    x = np.zeros((3, 4), np.float32)
    dl = np.zeros((1, 2, 4), np.float32)
    dl[0, 0] = (0.0, 0.0, -1.0, -1.0)  # q_0(1) = 1 / (2 + 2 / e) > p_0(1) = 1/4: P_0 < 1, Z_1 > 0
    dl[0, 1, 2] = -200.0
    b = SpecBatch(target_logits=x, draft_logits=dl, draft_token_ids=np.array([0, 1, 2], np.int64),
                  cu_num_logits=np.array([0, 3], np.int32), pos=np.array([3, 4, 5], np.int64),
                  idx_mapping=np.array([0], np.int32), temperature=np.ones(1, np.float32),
                  seeds=np.array([9], np.int64), num_speculative_steps=2, verification="block")
    return explicit.filled(b).replace(accept_uniforms=np.array([u0, 0.5, 0.5]))


def _output(tokens) -> SamplerOutput:
    sampled = np.full((1, 3), -1, np.int64)
    sampled[0, : len(tokens)] = tokens
    return SamplerOutput(sampled=sampled, num_sampled=np.array([len(tokens)], np.int32))


def test_block_decisions_after_an_underflowing_q_are_free():
    """SPEC 4 frees the test of a draft whose q(d) is below 2**-126; read for block steps (section 4b is
    silent): from the step whose q_i(d_i) is below 2**-126 the block decisions, and a residual resample
    after them, are free (SGLang's probability-space kernel reads the ratio as 0 / 0); the decisions before
    it, and the bonus, stay certified."""
    oracle = ReferenceSampler(streams="explicit")
    for u0 in (0.01, 0.999):  # step 0 accepted, then rejected, by the reference
        b = _underflowing_block(u0)
        ref, traces = oracle.verify_with_trace(b)
        blocks = [d for d in traces[0].decisions if d.kind == "block"]
        assert [d.what for d in blocks] == ["", "q_zero"] and ref.num_sampled[0] == 3  # h_1 = P_1 = 1
        # a float32 sampler rejecting step 1 (tau = 1 or 0), whatever it resamples there: free, not failed
        stop = [1, 3] if blocks[0].accepted else [0]
        cmp = compare_decisions(b, _output(stop), traces, reference=oracle)
        assert not cmp.failed and len(cmp.free) == 1 and cmp.free[0].step == 1
        # the bonus after an accepted block draws from p alone: another bonus token still fails
        wrong_bonus = [*ref.request(0)[:2], (ref.request(0)[2] + 1) % 4]
        assert compare_decisions(b, _output(wrong_bonus), traces, reference=oracle).failed
    # a divergence before the free step is certified as before: step 0 taken the other way fails
    b = _underflowing_block(0.999)
    _, traces = oracle.verify_with_trace(b)
    assert not traces[0].decisions[0].accepted
    failed = compare_decisions(b, _output([1, 0]), traces, reference=oracle).failed
    assert failed and failed[0].step == 0 and failed[0].kind == "block"
