"""rs_verify.adapters.keras_hub without keras-hub: the sampler drives a fake of `SpeculativeSampler`
written here in torch from keras-hub's description of its loop (its constructor, `temperature` /
`base_sampler.temperature`, and its cycles over a batch: drafts from the masked prompt through
`draft_next`, the target rows through `verify_next`, each row's accepted prefix, every row's bonus
written at `index + ops.min(num_accepted)`, the next cycle), whose module reaches its two hooked
calls through the globals `ops` and `random`, as keras-hub's does.

The sampler is of the `own` family (nothing to certify), so the convention is checked where it is
handed over: in every call, `softmax(verify_next's logits / temperature)` must be SPEC 2's target
law `p` of the request's rows and `softmax(draft_next's logits / base_sampler.temperature)` its
draft law `q` (float64, from the batch), the drafts the request's. A swapped `p` / `q` or a lost
draft temperature fails it. Batched, each request must emit what it emits alone: an adapter that
takes keras-hub's bonus at the batch's smallest accepted count for a row that accepted more fails.
"""

import types

import numpy as np
import pytest
import torch

from rs_verify.adapters.keras_hub import KerasHubSampler
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.chunking import select_requests
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES

# The fake module's `ops` and `random`: the two calls the adapter hooks, as Keras's torch backend makes them.
ops = types.SimpleNamespace(min=torch.min)
random = types.SimpleNamespace(
    SeedGenerator=lambda seed: torch.Generator().manual_seed(seed or 0),
    uniform=lambda shape, seed=None, dtype="float32": torch.rand(tuple(shape), generator=seed))


def fake_speculative_sampler(calls=None, counts=None):
    class SpeculativeSampler:
        def __init__(self, num_speculative_tokens=5, base_sampler=None, seed=None, temperature=1.0):
            self.num_speculative_tokens, self.base_sampler, self.temperature = num_speculative_tokens, base_sampler, temperature
            if base_sampler is not None:
                base_sampler.temperature = temperature
            self.seed_generator = random.SeedGenerator(seed)

        def __call__(self, next, prompt, cache=None, index=0, mask=None, draft_next=None, verify_next=None, **kw):
            k, length, index = self.num_speculative_tokens, prompt.shape[1], int(index)
            stochastic, prompt = self.base_sampler is not None, prompt.clone()
            rows = torch.arange(prompt.shape[0])
            while index < length:
                current, drafts, q = prompt.clone(), [], []
                for i in range(k):  # draft: argmax of q; a masked (or out of bounds) position keeps its token
                    at = min(index + i, length - 1)
                    dt = self.base_sampler.temperature if stochastic else self.temperature
                    q.append((draft_next(current, None, at)[0].double() / dt).softmax(-1))
                    keep = mask[:, at] | (index + i >= length)
                    current[:, at] = torch.where(keep, current[:, at], q[-1].argmax(-1))
                    drafts.append(current[:, at].clone())
                d, q = torch.stack(drafts, 1), torch.stack(q, 1)
                p = (verify_next(current, None, index, k)[0].double() / self.temperature).softmax(-1)
                if calls is not None and stochastic:
                    calls.extend(zip(d, p, q))
                pd = p[:, :k].gather(2, d[:, :, None])[:, :, 0]
                if stochastic:
                    r = random.uniform((prompt.shape[0], k), seed=self.seed_generator, dtype="float32")
                    ok = r.double() * q.gather(2, d[:, :, None])[:, :, 0] < pd
                else:
                    ok = d == p[:, :k].argmax(-1)
                num = ok.int().cumprod(1).sum(1)  # each row's accepted prefix
                for i in range(k):
                    if index + i < length:
                        prompt[:, index + i] = torch.where(i < num, d[:, i], prompt[:, index + i])
                m = int(ops.min(num))  # every row's bonus at the batch's smallest count
                if counts is not None:
                    counts.append(num.tolist())
                b = p[rows, m]
                if stochastic:  # keras-hub's residual at m and Gumbel-max, without its 1e-7 terms (the gate's
                    if m < k:     # properties below then see the adapter, not keras-hub's defect (D))
                        res = (b - q[rows, m]).clamp(min=0)
                        b = torch.where(res.sum(-1, keepdim=True) > 0, res / res.sum(-1, keepdim=True), b)
                    u = random.uniform(b.shape, seed=self.seed_generator, dtype="float32").double()
                    bonus = (b.log() - (-u.clamp(min=1e-30).log()).log()).argmax(-1)
                else:
                    bonus = b.argmax(-1)
                if index + m < length:
                    prompt[:, index + m] = bonus
                index = min(index + m + 1, length)
            return prompt

    return SpeculativeSampler


def _batch(temperature=(0.5, 1.7, 0.0), one_hot=False) -> SpecBatch:
    rng = np.random.default_rng(7)
    drafts, v = ((3, 5), (2, -1), (1, 4)), 8
    rows = sum(len(d) + 1 for d in drafts)
    return SpecBatch(target_logits=rng.standard_normal((rows, v)).astype(np.float32) * 3,
                     draft_logits=None if one_hot else rng.standard_normal((3, 2, v)).astype(np.float32) * 3,
                     draft_token_ids=np.concatenate([[0, *d] for d in drafts]).astype(np.int64),
                     cu_num_logits=np.cumsum([0] + [len(d) + 1 for d in drafts]).astype(np.int32),
                     pos=np.arange(rows, dtype=np.int64), idx_mapping=np.array([2, 0, 1], np.int32),
                     temperature=np.array(temperature, np.float32), seeds=np.arange(3, dtype=np.int64),
                     num_speculative_steps=2)


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _check_laws(batch, calls):
    """Each stochastic row handed over against SPEC 2's p and q of its request (float64, from the batch)."""
    cu, states = batch.cu_num_logits, batch.idx_mapping
    stochastic = {r for r in range(batch.num_reqs) if batch.temperature[states[r]] > 0}
    seen = set()
    for ids, p, q in calls:
        n = len(ids)
        r = next(r for r in range(batch.num_reqs)
                 if batch.draft_token_ids[cu[r] + 1 : cu[r] + 1 + n].tolist() == ids.tolist())
        t = np.float64(batch.temperature[states[r]])
        assert r in stochastic
        seen.add(r)
        np.testing.assert_allclose(p.numpy(), _softmax64(batch.target_logits[cu[r] : cu[r] + n + 1] / t), atol=1e-6)
        if batch.draft_logits is None:
            np.testing.assert_array_equal(q.numpy(), np.eye(p.shape[-1])[ids.numpy()])
        else:
            np.testing.assert_allclose(q.numpy(), _softmax64(batch.draft_logits[states[r], :n] / t), atol=1e-6)
    assert seen == stochastic


def test_declarations():
    rec = record_of(KerasHubSampler(sampler_class=fake_speculative_sampler()))
    assert (rec.streams, rec.interpreted, rec.draft_modes) == ("own", False, {"model", "one_hot"})


@pytest.mark.parametrize("one_hot", [False, True])
def test_the_laws_handed_over_are_p_and_q(one_hot):
    calls, batch = [], _batch(one_hot=one_hot)
    out = KerasHubSampler(sampler_class=fake_speculative_sampler(calls))(batch)
    _check_laws(batch, calls)
    assert sorted({len(c[0]) for c in calls}) == [1, 2]  # the padded draft ends request 1 (SPEC 3c)
    assert out.num_sampled.tolist()[0] >= 1 and all(1 <= k <= 3 for k in out.num_sampled.tolist())


class _Deaf:
    """A base sampler whose temperature stays 1: the draft temperature lost on the way."""
    temperature = property(lambda self: 1.0, lambda self, value: None)


@pytest.mark.parametrize("mistake", ["swap_pq", "lost_temperature"])
def test_a_convention_mistake_is_caught(mistake, monkeypatch):
    if mistake == "swap_pq":
        verify = KerasHubSampler.verify

        def swapped(self, sampler, keys, t, ids, draft, target):
            n = draft.shape[1]
            return verify(self, sampler, keys, t, ids, target[:, :n], torch.cat([draft, target[:, n:]], dim=1))

        monkeypatch.setattr(KerasHubSampler, "verify", swapped)
    else:
        build = KerasHubSampler.sampler

        def deaf(self, n, greedy):
            s = build(self, n, greedy)
            if s.base_sampler is not None:
                s.base_sampler = _Deaf()
            return s

        monkeypatch.setattr(KerasHubSampler, "sampler", deaf)
    calls, batch = [], _batch()
    KerasHubSampler(sampler_class=fake_speculative_sampler(calls))(batch)
    with pytest.raises(AssertionError):
        _check_laws(batch, calls)


def _mixed_counts_batch() -> SpecBatch:
    """Two greedy and two stochastic (T = 1) requests of 3 one-hot drafts each, V = 8: in each pair
    one request's drafts are the target's sure tokens (logit +30: all accepted) and the other's
    first draft is a token of p ~ 1e-20 (rejected), so each group's smallest accepted count is 0."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    drafts = np.array([[1, 2, 3], [4, 5, 6], [1, 2, 3], [4, 5, 6]])
    for r in (0, 2):  # sure drafts
        x[4 * r + np.arange(3), drafts[r]] = 30.0
    for r in (1, 3):  # a first draft of p ~ 1e-20, then the sure tokens
        x[4 * r, drafts[r, 0]] = -45.0
        x[4 * r + 1 + np.arange(2), drafts[r, 1:]] = 30.0
    ids = np.concatenate([[0, *d] for d in drafts]).astype(np.int64)
    return SpecBatch(target_logits=x, draft_logits=None, draft_token_ids=ids,
                     cu_num_logits=np.arange(0, 17, 4).astype(np.int32), pos=np.arange(16, dtype=np.int64) * 10,
                     idx_mapping=np.arange(4, dtype=np.int32), temperature=np.array([0, 0, 1, 1], np.float32),
                     seeds=np.array([5, 6, 7, 8], np.int64), num_speculative_steps=3)


def _check_alone(sampler, batch):
    """Each request emits in the batch what it emits alone."""
    out = sampler(batch)
    for r in range(batch.num_reqs):
        alone = sampler(select_requests(batch, [r]))
        n = int(alone.num_sampled[0])
        assert int(out.num_sampled[r]) == n, f"request {r}: {out.num_sampled[r]} tokens batched, {n} alone"
        assert out.sampled[r].tolist() == alone.sampled[0].tolist(), f"request {r}"


@pytest.mark.parametrize("mistake", [None, "trust_bonus_at_min"])
def test_a_row_that_accepted_more_is_not_cut_at_the_minimum(mistake, monkeypatch):
    if mistake:  # keras-hub's sequences taken as they are: every row cut at the group's smallest count
        def trusting(self, sampler, keys, t, ids, draft, target):
            sequences, accepted, m = self.cycle(sampler, keys, t, ids, draft, target)
            return [row[1 : m + 2].tolist() for row in sequences]

        monkeypatch.setattr(KerasHubSampler, "verify", trusting)
    counts, batch = [], _mixed_counts_batch()
    sampler = KerasHubSampler(sampler_class=fake_speculative_sampler(counts=counts))
    if mistake:
        with pytest.raises(AssertionError, match="tokens batched"):
            _check_alone(sampler, batch)
        return
    _check_alone(sampler, batch)
    assert [3, 0] in counts  # both groups' first calls: a row accepted more than the minimum
    assert sampler(batch).num_sampled.tolist() == [4, 1, 4, 1]


@pytest.mark.parametrize("name", ["determinism", "batch_invariance", "greedy_chain"])
def test_seeded_per_request_through_the_gate(name, reference):
    sampler = KerasHubSampler(sampler_class=fake_speculative_sampler())
    outcome = run(PROPERTIES[name], make_context(sampler, reference, profile="ci"))
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
