"""The reference's sampling-parameter masks (SPEC sections 2, 6 and 8), on hand-computed rows.

Each case states the kept set worked out by hand from the SPEC text; the sampler's processed
logprobs show the masked row it verified against, and its trace the near-tie decisions. The
wiring check (`test_masks_act_as_minus_inf_logits`) compares every output field with a batch
without parameters whose logits hold the masks as `-inf`: anything read before the masks
(acceptance, residual, bonus, processed logprobs) would differ.
"""

import numpy as np
import pytest

from test_reference import NEG, make_batch, random_batch
from rs_verify.reference import MASK_NEAR, ReferenceSampler, processed_logits
from rs_verify.contract.masks import apply_masks, batch_masks, row_params
from rs_verify.contract.probs import process

SAMPLER = ReferenceSampler()
LOG = np.log


def params(batch, **kw):
    """`batch` with per-state parameter arrays (one value broadcast to every state)."""
    s = batch.num_states
    dt = {"top_k": np.int32, "top_p": np.float32, "min_p": np.float32}
    return batch.replace(**{k: np.broadcast_to(np.asarray(v, dt[k]), (s,)).copy() for k, v in kw.items()})


def kept_by_sampler(x, temperature=1.0, **kw) -> set:
    """The tokens the sampler keeps in a one-row request (K = 0), read off its processed logprobs."""
    x = np.asarray(x, np.float32)[None]
    b = params(make_batch(x, [[]], [0, 1], temperature=temperature, k=0, num_logprobs=x.shape[1],
                          logprobs_mode="processed"), **kw)
    lp = SAMPLER(b).logprobs
    row = np.full(x.shape[1], np.nan, np.float32)
    row[lp.token_ids[0, 1:]] = lp.logprobs[0, 1:]
    kept = set(np.flatnonzero(row > -np.inf).tolist())
    # The kept tokens' logprobs are the log-softmax over the kept set alone.
    z = process(x[0], np.float32(temperature)).astype(np.float64)
    idx = sorted(kept)
    want = z[idx] - z[idx].max() - LOG(np.exp(z[idx] - z[idx].max()).sum())
    assert np.array_equal(row[idx], want.astype(np.float32))
    assert SAMPLER(b).request(0)[0] in kept
    return kept


@pytest.mark.parametrize("x, kw, kept", [
    # min-p 0.3: M = 3, threshold 3 + log 0.3 = 1.796: tokens 0 (2) and 5 (3).
    ([2, 1, 1, 0, -1, 3], dict(min_p=0.3), {0, 5}),
    # min-p 1 keeps every token tied at the maximum (strict <).
    ([3, 1, 3, 0, 3, 2], dict(min_p=1.0), {0, 2, 4}),
    # top-k 3: sorted 3, 2, 1, 1, 0, -1: t = 1, both tokens tied with t kept (four tokens).
    ([2, 1, 1, 0, -1, 3], dict(top_k=3), {0, 1, 2, 5}),
    ([2, 1, 1, 0, -1, 3], dict(top_k=2), {0, 5}),
    # top-k 5 with only 4 finite logits: t = -inf, nothing is masked; k = V' is off.
    ([2, NEG, 1, NEG, 0, 3], dict(top_k=5), {0, 2, 4, 5}),
    ([2, 1, 1, 0, -1, 3], dict(top_k=6), {0, 1, 2, 3, 4, 5}),
    # top-p 0.5 on four equal tokens (p = 1/4 exactly): masses before 0, 1/4, 1/2, 3/4 in id order;
    # token 2's mass before is exactly c: masked (kept iff < c).
    ([0, 0, 0, 0], dict(top_p=0.5), {0, 1}),
    # top-p 0.2, p = (0.2, 0.3, 0.3, 0.2): the tied pair 1, 2 comes first, lower id first: only 1 kept.
    (LOG([0.2, 0.3, 0.3, 0.2]), dict(top_p=0.2), {1}),
    (LOG([0.2, 0.3, 0.3, 0.2]), dict(top_p=0.31), {1, 2}),
    # All three, in order: min-p 0.01 masks token 5 (-3 < 4 - 4.605); top-k 4 on what is left keeps
    # {0, 1, 2, 3} (t = 2); top-p 0.92 on softmax of (4, 3, 3, 2) = (.534, .197, .197, .072): masses
    # before 0, .534, .731, .928: token 3 masked (on the unrenormalized row its mass before, .903, < .92).
    ([4, 3, 3, 2, 1, -3], dict(min_p=0.01, top_k=4, top_p=0.92), {0, 1, 2}),
    # Temperature first: z = x / 0.5 = (4, 2, 0, -2), min-p 0.1: threshold 4 - 2.303 = 1.697: {0, 1};
    # z = x / 2 = (1, .5, 0, -.5): threshold -1.303, every token kept; x itself: threshold -0.303: {0, 1, 2}.
    ([2, 1, 0, -1], dict(min_p=0.1, temperature=0.5), {0, 1}),
    ([2, 1, 0, -1], dict(min_p=0.1, temperature=2.0), {0, 1, 2, 3}),
    ([2, 1, 0, -1], dict(min_p=0.1), {0, 1, 2}),
])
def test_each_mask_and_combined(x, kw, kept):
    kw = dict(kw)
    t = kw.pop("temperature", 1.0)
    assert kept_by_sampler(x, temperature=t, **kw) == kept
    # The contract's implementation agrees (spec.masks, also used by spec.probs and reference.processed_logits).
    b = params(make_batch(np.asarray(x, np.float32)[None], [[]], [0, 1], temperature=t, k=0), **kw)
    z = processed_logits(b.replace(top_k=None, top_p=None, min_p=None))
    assert set(np.flatnonzero(batch_masks(b, z).kept[0] & (z[0] > -np.inf)).tolist()) == kept
    assert set(np.flatnonzero(processed_logits(b)[0] > -np.inf).tolist()) == kept


def test_masks_run_on_every_row_of_a_request():
    """Draft rows and the bonus row alike: with top-k 1 every row keeps its own argmax only, so the
    chain of argmaxes is accepted whatever the seed, and the bonus is the bonus row's argmax."""
    x = np.array([[0, 3, 1, 2], [5, 0, 1, 4], [0, 1, 2, 3]], np.float32)
    for seed in range(10):
        b = params(make_batch(x, [[1, 0]], [0, 3], seeds=[seed], temperature=1.7), top_k=1)
        assert SAMPLER(b).request(0) == [1, 0, 3]


@pytest.mark.parametrize("model", [True, False])
def test_masked_draft_is_rejected(model):
    """A draft the mask removes has p(d) = 0 after the mask: rejected (margin -inf), also with q(d) = 0
    (which without the mask accepts every u), and the emitted token is kept by the mask."""
    x = np.array([[4, 3, 0, -1], [0, 0, 0, 0]], np.float32)
    dl = np.array([[[NEG, NEG, 0, NEG]]], np.float32) if model else None  # q a point mass at d = 2
    for qd0 in ([False, True] if model else [False]):
        d = 3 if qd0 else 2  # with q = delta_2, draft 3 has q(d) = 0
        for seed in range(20):
            b = params(make_batch(x, [[d]], [0, 2], draft_logits=dl, seeds=[seed]), top_k=2)
            out, traces = SAMPLER.verify_with_trace(b)
            acc = next(dc for dc in traces[0].decisions if dc.kind == "accept")
            assert (acc.accepted, acc.margin) == (False, -np.inf)
            assert out.request(0)[0] in (0, 1)
            if qd0:  # without the mask: p(3) > 0 = q(3), always accepted
                assert SAMPLER(b.replace(top_k=None)).request(0)[0] == 3


def test_mask_empties_the_residual():
    """top-k 1 leaves p a point mass at token 0; q is a point mass at 0 too and the draft 1 (q(1) = 0)
    is masked: rejected, max(p - q, 0) = 0 everywhere, so the resample falls back to p and emits 0.
    Without the mask p(1) > 0 = q(1) accepts the draft."""
    x = np.array([[5, 0, 0, 0], [0, 1, 2, 3]], np.float32)
    dl = np.array([[[0, NEG, NEG, NEG]]], np.float32)
    for seed in range(10):
        b = params(make_batch(x, [[1]], [0, 2], draft_logits=dl, seeds=[seed]), top_k=1)
        out, traces = SAMPLER.verify_with_trace(b)
        res = next(dc for dc in traces[0].decisions if dc.kind == "residual")
        assert (res.accepted, res.margin) == (False, 0.0)
        assert out.request(0) == [0]
        assert SAMPLER(b.replace(top_k=None)).request(0)[:1] == [1]


def _as_logits(b, kept=None):
    """`b` without parameters, its stochastic rows' logits at -inf outside `kept` (default: the SPEC
    masks); T is left as it is (-inf / T is -inf), greedy rows untouched."""
    z = process(np.asarray(b.target_logits)[:, : b.effective_vocab_size],
                np.asarray(b.temperature)[np.repeat(b.idx_mapping, np.diff(b.cu_num_logits))])
    if kept is None:
        kept = batch_masks(b, z, margins=False).kept
    x = np.array(b.target_logits)
    x[:, : b.effective_vocab_size][~kept] = NEG
    return b.replace(target_logits=x, top_k=None, top_p=None, min_p=None)


def _mixed_params(b, seed):
    rng = np.random.default_rng(seed)
    s = b.num_states
    return b.replace(top_k=rng.choice([0, 1, 3, 8], s).astype(np.int32),
                     top_p=rng.choice([1.0, 0.9, 0.6, 0.3], s).astype(np.float32),
                     min_p=rng.choice([0.0, 0.05, 0.3], s).astype(np.float32))


@pytest.mark.parametrize("one_hot, vd, verification", [(False, None, "token"), (False, 21, "token"),
                                                       (True, None, "token"), (False, 21, "block"),
                                                       (True, None, "block")])
def test_masks_act_as_minus_inf_logits(one_hot, vd, verification):
    """Mixed parameters (off, tight, loose) on mixed greedy / stochastic requests: every output field
    (processed logprobs over [0, V) included; V' < V leaves [V', V) unmasked) equals that of the batch
    without parameters whose masked logits are -inf; raw logprobs equal the unmasked batch's."""
    for seed in range(3):
        b = _mixed_params(random_batch(200 + seed, one_hot=one_hot, vd=vd, num_logprobs=4,
                                       logprobs_mode="processed", verification=verification), seed)
        assert b.sampling_params_on()
        out, want = SAMPLER(b), SAMPLER(_as_logits(b))
        for name, arr in want.arrays().items():
            assert np.array_equal(out.arrays()[name], arr), name
        raw = b.replace(logprobs_mode="raw")
        unmasked = raw.replace(top_k=None, top_p=None, min_p=None)
        lp, lp0 = SAMPLER(raw).logprobs, SAMPLER(unmasked).logprobs
        assert np.array_equal(lp.logprobs[:, 1:], lp0.logprobs[:, 1:])
        assert np.array_equal(lp.token_ids[:, 1:], lp0.token_ids[:, 1:])


def test_greedy_states_ignore_the_parameters():
    """T = 0: the strictest parameters change nothing (argmax chain, raw processed logprobs, no mask
    decisions), in an all-greedy batch and beside stochastic requests that are masked."""
    b = random_batch(31, reqs=10, num_logprobs=5, logprobs_mode="processed")
    greedy = b.replace(temperature=np.zeros(b.num_states, np.float32))
    strict = params(greedy, top_k=1, top_p=0.01, min_p=1.0)
    assert not strict.sampling_params_on()
    out, traces = SAMPLER.verify_with_trace(strict)
    for name, arr in SAMPLER(greedy).arrays().items():
        assert np.array_equal(out.arrays()[name], arr), name
    assert not any(d.kind == "mask" for tr in traces for d in tr.decisions)
    strict = params(b, top_k=1, top_p=0.01, min_p=1.0)
    out, traces = SAMPLER.verify_with_trace(strict)
    ref = SAMPLER(b)
    g = np.flatnonzero(b.temperature[b.idx_mapping] == 0)
    assert 0 < g.size < b.num_reqs
    rows = np.concatenate([np.arange(b.cu_num_logits[r], b.cu_num_logits[r + 1]) for r in g])
    assert [out.request(int(r)) for r in g] == [ref.request(int(r)) for r in g]
    assert np.array_equal(out.logprobs.logprobs[rows], ref.logprobs.logprobs[rows])
    assert not any(d.kind == "mask" for r in g for d in traces[r].decisions)
    assert any(d.kind == "mask" for tr in traces for d in tr.decisions)


def test_near_tie_decisions_in_the_trace():
    """Only decisions within MASK_NEAR * L of their threshold are recorded, first in the request's list,
    in step order, with SPEC 8's margin, the scale of spec.masks and the parameter."""
    # Row 0, min-p 0.1: threshold 0 + log 0.1 = -2.302585, L = 2.302585: tokens 1 (-2.3, kept, margin
    # 2.6e-3), 2 (-2.31, masked, -7.4e-3) and 5 (-2.29, kept, 1.26e-2) are within 1e-2 * L; 3 (-2.4) is not.
    # Top-k 3 on what is left (0, -2.3, -inf, -inf, -1, -2.29): t = -2.29, L = 2.29: margin 0 at token 5
    # (kept), -0.01 at token 1 (masked); tokens 0 (2.29) and 4 (1.29) are not near.
    # Row 1 (the bonus row, all logits 0): min-p margins 2.3 (not near); top-k t = 0, six ties at margin 0.
    x = np.array([[0, -2.3, -2.31, -2.4, -1, -2.29], [0, 0, 0, 0, 0, 0]], np.float32)
    b = params(make_batch(x, [[0]], [0, 2], seeds=[3]), min_p=0.1, top_k=3)
    _, traces = SAMPLER.verify_with_trace(b)
    masks = [d for d in traces[0].decisions if d.kind == "mask"]
    assert traces[0].decisions[: len(masks)] == masks
    got = [(d.step, d.row, d.what, d.token, d.accepted) for d in masks]
    assert got == [(0, 0, "min_p", 1, True), (0, 0, "min_p", 2, False), (0, 0, "min_p", 5, True),
                   (0, 0, "top_k", 1, False), (0, 0, "top_k", 5, True)] + [(1, 1, "top_k", t, True) for t in range(6)]
    thr = np.log(np.float64(np.float32(0.1)))
    assert masks[0].margin == np.float64(np.float32(-2.3)) - thr and masks[0].scale == abs(thr)
    assert masks[3].margin == np.float64(np.float32(-2.3)) - np.float64(np.float32(-2.29))
    assert masks[4].margin == 0.0 and masks[4].scale == abs(np.float64(np.float32(-2.29)))
    assert all(abs(d.margin) <= MASK_NEAR * d.scale for d in masks)
    assert kept_by_sampler(x[0], min_p=0.1, top_k=3) == {0, 4, 5}
    # Top-p: four equal tokens, c = 0.5: token 2's margin is exactly 0 and it is masked.
    b = params(make_batch(np.zeros((1, 4), np.float32), [[]], [0, 1], k=0), top_p=0.5)
    masks = [d for d in SAMPLER.verify_with_trace(b)[1][0].decisions if d.kind == "mask"]
    assert [(d.what, d.token, d.accepted, d.margin, d.scale) for d in masks] == [("top_p", 2, False, 0.0, 1.0)]


def test_flips_change_exactly_the_flipped_memberships():
    """flips inverts the final membership of the given tokens of the given rows, nothing else: the output
    equals the parameter-free batch with those memberships at -inf (and the unflipped rows as masked)."""
    b = _mixed_params(random_batch(41, reqs=8, greedy_frac=0.2, num_logprobs=3, logprobs_mode="processed"), 1)
    rp = row_params(b)
    z = processed_logits(b.replace(top_k=None, top_p=None, min_p=None))
    kept = batch_masks(b, z, margins=False).kept
    flips = {}
    for j in np.flatnonzero(rp.any)[:8]:  # one masked token joins; a kept token other than the best leaves
        finite = z[j] > -np.inf
        toks = np.flatnonzero(finite & ~kept[j])[:1].tolist()
        toks += [t for t in np.flatnonzero(finite & kept[j]) if t != np.argmax(z[j])][:1]
        if toks:
            flips[int(j)] = toks
    assert len(flips) >= 4
    want_kept = kept.copy()
    for j, toks in flips.items():
        want_kept[j, toks] = ~want_kept[j, toks]
    assert not np.array_equal(want_kept, kept)
    out, traces = SAMPLER.verify_with_trace(b, flips=flips)
    want = SAMPLER(_as_logits(b, want_kept))
    for name, arr in want.arrays().items():
        assert np.array_equal(out.arrays()[name], arr), name
    # The mask decisions reported stay the reference's own; no flips is the plain trace.
    plain, plain_traces = SAMPLER.verify_with_trace(b, flips={})
    for name, arr in SAMPLER(b).arrays().items():
        assert np.array_equal(plain.arrays()[name], arr), name
    masks = [[(d.row, d.token, d.what, d.accepted) for d in t.decisions if d.kind == "mask"] for t in traces]
    assert masks == [[(d.row, d.token, d.what, d.accepted) for d in t.decisions if d.kind == "mask"]
                     for t in plain_traces]


def test_flips_are_checked():
    x = np.array([[1, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    b = params(make_batch(x, [[], []], [0, 1, 2], temperature=[1.0, 0.0], k=0), top_k=1)
    with pytest.raises(ValueError, match="row 1 has no sampling-parameter mask"):
        SAMPLER.verify_with_trace(b, flips={1: [2]})  # a greedy row
    with pytest.raises(ValueError, match="row 5 outside"):
        SAMPLER.verify_with_trace(b, flips={5: [0]})
    with pytest.raises(ValueError, match="token ids outside"):
        SAMPLER.verify_with_trace(b, flips={0: [4]})
    with pytest.raises(ValueError, match="no token with a finite logit"):
        SAMPLER.verify_with_trace(b, flips={0: [0]})  # top-k 1 keeps token 0 alone
    out, _ = SAMPLER.verify_with_trace(b, flips={0: [3]})  # token 3 joins token 0
    assert out.request(0)[0] in (0, 3)


def test_masks_are_independent_of_slabs_and_chunks():
    """Slabs of one request, the default slab and chunk caps 1..N give the same bits and traces."""
    for verification in ("token", "block"):
        b = _mixed_params(random_batch(51, reqs=10, num_logprobs=3, logprobs_mode="processed",
                                       verification=verification), 2)
        full, traces = SAMPLER.verify_with_trace(b)
        tiny, tiny_traces = ReferenceSampler(slab_elems=1).verify_with_trace(b)
        for cap in (1, 3, b.num_logits):
            part = SAMPLER(b, max_chunk_logits=cap)
            for name, arr in full.arrays().items():
                assert np.array_equal(arr, part.arrays()[name]), (cap, name)
                assert np.array_equal(arr, tiny.arrays()[name]), name
        flat = [[(d.kind, d.row, d.token, d.accepted, d.margin, d.what) for d in t.decisions] for t in traces]
        assert flat == [[(d.kind, d.row, d.token, d.accepted, d.margin, d.what) for d in t.decisions]
                        for t in tiny_traces]


def test_apply_masks_margins_and_scales():
    """spec.masks reports each decision's margin where that parameter decided and NaN elsewhere."""
    z = np.array([[3, 2, 2, 0, NEG]], np.float32)
    rp = row_params(params(make_batch(z, [[]], [0, 1], k=0), min_p=np.exp(-1.5), top_k=2, top_p=0.6))
    res = apply_masks(z, rp)
    thr = 3 + np.log(np.float64(np.float32(np.exp(-1.5))))
    assert np.allclose(res.min_p_margin[0, :4], [3 - thr, 2 - thr, 2 - thr, -thr])
    assert res.min_p_margin[0, 4] == -np.inf and res.min_p_scale[0] == 3.0
    # top-k decides only the tokens min-p kept: t = 2 (second of 3, 2, 2): margins 1, 0, 0.
    assert res.top_k_margin[0, :3].tolist() == [1.0, 0.0, 0.0] and np.isnan(res.top_k_margin[0, 3:]).all()
    # top-p on softmax(3, 2, 2): p0 = 1 / (1 + 2 / e) = .576; masses before 0, .576, .788.
    p0 = 1 / (1 + 2 * np.exp(-1.0))
    assert np.allclose(res.top_p_margin[0, :3], [np.float32(0.6), np.float32(0.6) - p0,
                                                 np.float32(0.6) - p0 - (1 - p0) / 2], rtol=0, atol=1e-12)
    assert res.kept[0].tolist() == [True, True, False, False, False]
    assert apply_masks(z, rp, margins=False).kept.tolist() == res.kept.tolist()


def test_kept_without_margins_equals_kept_with_margins():
    """spec.masks' fast top-p cut (sorted values only) keeps exactly the tokens whose mass before is < c,
    on rows full of ties (small integer logits, -inf entries) and at exact boundaries (c = j / V on
    uniform rows, masses exact in float64)."""
    rng = np.random.default_rng(7)
    rows, v = 400, 16
    z = rng.integers(-3, 3, (rows, v)).astype(np.float32)
    z[rng.random((rows, v)) < 0.2] = NEG
    z[:, 0] = 0
    z[:50] = 0  # uniform rows
    c = np.where(np.arange(rows) < 50, rng.integers(1, v, rows) / v, rng.uniform(0.05, 0.99, rows))
    rp = row_params(params(make_batch(z, [[]] * rows, np.arange(rows + 1), k=0), top_p=0.5))
    rp = type(rp)(rp.min_p, rng.choice([0, 2, 5], rows), c, rp.stochastic)
    slow, fast = apply_masks(z, rp), apply_masks(z, rp, margins=False)
    assert np.array_equal(slow.kept, fast.kept)
    n_kept = (slow.kept & (z > -np.inf)).sum(axis=1)
    assert np.array_equal(n_kept[:50], np.ceil(c[:50] * v).astype(int))  # uniform rows: the first c * V ids
