"""rs_verify.adapters.keras_hub without keras-hub: the sampler drives a fake of `SpeculativeSampler`
(its constructor, `temperature` / `base_sampler.temperature` / `seed_generator.state`, and one
cycle of its loop: drafts from the masked prompt through `draft_next`, the target rows through
`verify_next`, the bonus written at `index + accepted`, the next cycle's first `draft_next`),
written here from the SPEC in torch.

The sampler is of the `own` family (nothing to certify), so the convention is checked where it is
handed over: in every call, `softmax(verify_next's logits / temperature)` must be SPEC 2's target
law `p` of the request's rows and `softmax(draft_next's logits / base_sampler.temperature)` its
draft law `q` (float64, from the batch), the drafts the request's. A swapped `p` / `q` or a lost
draft temperature fails it.
"""

import types

import numpy as np
import pytest
import torch

from rs_verify.adapters.keras_hub import KerasHubSampler
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES


class _State:
    def __init__(self):
        self.value = np.zeros(2, np.uint32)

    def assign(self, value):
        self.value = np.asarray(value, np.uint32)


def fake_speculative_sampler(calls=None):
    class SpeculativeSampler:
        def __init__(self, num_speculative_tokens=5, base_sampler=None, seed=None, temperature=1.0):
            self.num_speculative_tokens, self.base_sampler, self.temperature = num_speculative_tokens, base_sampler, temperature
            if base_sampler is not None:
                base_sampler.temperature = temperature
            self.seed_generator = types.SimpleNamespace(state=_State())

        def __call__(self, next, prompt, cache=None, index=0, mask=None, draft_next=None, verify_next=None, **kw):
            k, i0 = self.num_speculative_tokens, int(index)
            prompt = prompt.clone()
            assert bool(mask[0, i0 : i0 + k].all()) and prompt.shape[1] == i0 + k + 1
            drafts = prompt[0, i0 : i0 + k].clone()  # masked: keras-hub keeps the prompt's tokens
            dt = 1.0 if self.base_sampler is None else self.base_sampler.temperature
            q = torch.stack([(draft_next(prompt, None, i0 + i)[0][0].double() / dt).softmax(-1) for i in range(k)])
            target, _ = verify_next(prompt, None, i0, k)
            p = (target[0].double() / self.temperature).softmax(-1)
            if calls is not None and self.base_sampler is not None:
                calls.append((drafts, p, q))
            gen = torch.Generator().manual_seed(int(self.seed_generator.state.value[0]))
            m = 0
            while m < k:
                d = int(drafts[m])
                ok = p[m].argmax() == d if self.base_sampler is None else (
                    float(torch.rand((), generator=gen, dtype=torch.float64)) * float(q[m, d]) < float(p[m, d]))
                if not ok:
                    break
                m += 1
            res = p[m] if m == k or self.base_sampler is None else (p[m] - q[m]).clamp(min=0)
            res = res if float(res.sum()) > 0 else p[m]  # SPEC 4: an empty residual is p
            bonus = int(res.argmax()) if self.base_sampler is None else int(torch.multinomial(res, 1, generator=gen))
            prompt[0, i0 + m] = bonus
            if m < k:  # keras-hub's next cycle
                draft_next(prompt, None, i0 + m + 1)
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
    """Each stochastic call's laws against SPEC 2's p and q of its request (float64, from the batch)."""
    cu, states = batch.cu_num_logits, batch.idx_mapping
    stochastic = [r for r in range(batch.num_reqs) if batch.temperature[states[r]] > 0]
    assert len(calls) == len(stochastic)
    for r, (ids, p, q) in zip(stochastic, calls):
        t, n = np.float64(batch.temperature[states[r]]), len(ids)
        assert ids.tolist() == batch.draft_token_ids[cu[r] + 1 : cu[r] + 1 + n].tolist()
        np.testing.assert_allclose(p.numpy(), _softmax64(batch.target_logits[cu[r] : cu[r] + n + 1] / t), atol=1e-6)
        if batch.draft_logits is None:
            np.testing.assert_array_equal(q.numpy(), np.eye(p.shape[-1])[ids.numpy()])
        else:
            np.testing.assert_allclose(q.numpy(), _softmax64(batch.draft_logits[states[r], :n] / t), atol=1e-6)


def test_declarations():
    rec = record_of(KerasHubSampler(sampler_class=fake_speculative_sampler()))
    assert (rec.streams, rec.interpreted, rec.draft_modes) == ("own", True, {"model", "one_hot"})


@pytest.mark.parametrize("one_hot", [False, True])
def test_the_laws_handed_over_are_p_and_q(one_hot):
    calls, batch = [], _batch(one_hot=one_hot)
    out = KerasHubSampler(sampler_class=fake_speculative_sampler(calls))(batch)
    _check_laws(batch, calls)
    assert [len(c[0]) for c in calls] == [1, 2]  # the padded draft ends request 1 (SPEC 3c)
    assert out.num_sampled.tolist()[0] >= 1 and all(1 <= k <= 3 for k in out.num_sampled.tolist())


class _Deaf:
    """A base sampler whose temperature stays 1: the draft temperature lost on the way."""
    temperature = property(lambda self: 1.0, lambda self, value: None)


@pytest.mark.parametrize("mistake", ["swap_pq", "lost_temperature"])
def test_a_convention_mistake_is_caught(mistake, monkeypatch):
    if mistake == "swap_pq":
        verify = KerasHubSampler.verify

        def swapped(self, sampler, key, t, ids, draft, target):
            n = draft.shape[0]
            return verify(self, sampler, key, t, ids, target[:n], torch.cat([draft, target[n:]]))

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


@pytest.mark.parametrize("name", ["determinism", "batch_invariance", "greedy_chain"])
def test_seeded_per_request_through_the_gate(name, reference):
    sampler = KerasHubSampler(sampler_class=fake_speculative_sampler())
    outcome = run(PROPERTIES[name], make_context(sampler, reference, profile="ci"))
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
