"""rs_verify.adapters.sglang_dspark without SGLang: the samplers wrap a fake of DSpark's
`blockwise_rejection_*` call (keyword-only, raw logits and temperatures in, `(correct_len, bonus,
trim)` out), written here from the SPEC in torch, drawing from a generator seeded by the noise key.

The samplers are of the `own` family, so the convention is checked where it is handed over: every
call's `softmax(target_logits / target_temperatures)` must be SPEC 2's `p` of the request's rows and
`softmax(draft_logits / draft_temperatures)` its `q` (float64, from the batch), the candidates the
request's drafts. A swapped `p` / `q` or a temperature applied twice fails it; the per-request
noise key is checked through the gate's `batch_invariance` at `ci`.
"""

import types

import numpy as np
import pytest
import torch

from rs_verify.adapters.sglang_dspark import DsparkTorchSampler, DsparkTritonSampler
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES


def make_noise(random_seed, device):
    return types.SimpleNamespace(key=int(random_seed), counter=torch.zeros(1, dtype=torch.int64))


def fake_rejection(calls=None):
    def blockwise_rejection(*, candidates, target_logits, draft_logits, target_temperatures, draft_temperatures,
                            noise, cutoff_verify_lens=None):
        bs, stride = candidates.shape
        assert cutoff_verify_lens is None and bs == 1 and candidates.dtype == torch.int64
        assert target_logits.shape[0] == bs * stride and target_temperatures.dtype == torch.float32
        p = (target_logits.double() / target_temperatures.double()).softmax(-1)
        q = None if draft_logits is None else (draft_logits[0].double() / draft_temperatures.double()).softmax(-1)
        if calls is not None:
            calls.append((candidates[0, 1:].clone(), p.clone(), None if q is None else q[: stride - 1].clone()))
        gen = torch.Generator().manual_seed(noise.key)
        for i in range(stride - 1):
            d = int(candidates[0, i + 1])
            qd = 1.0 if q is None else float(q[i, d])
            if float(torch.rand((), generator=gen, dtype=torch.float64)) * qd < float(p[i, d]):
                continue
            res = p[i].clone()
            if q is None:
                res[d] = 0
            else:
                res = (p[i] - q[i]).clamp(min=0)
            res = res if float(res.sum()) > 0 else p[i]
            return torch.tensor([i], dtype=torch.int32), torch.multinomial(res, 1, generator=gen), None
        return (torch.tensor([stride - 1], dtype=torch.int32), torch.multinomial(p[stride - 1], 1, generator=gen),
                None)

    return blockwise_rejection


def _batch() -> SpecBatch:
    rng = np.random.default_rng(3)
    drafts, v = ((3, 5), (2, -1), (1, 4)), 8
    rows = sum(len(d) + 1 for d in drafts)
    return SpecBatch(target_logits=rng.standard_normal((rows, v)).astype(np.float32) * 3,
                     draft_logits=rng.standard_normal((3, 2, v)).astype(np.float32) * 3,
                     draft_token_ids=np.concatenate([[0, *d] for d in drafts]).astype(np.int64),
                     cu_num_logits=np.cumsum([0] + [len(d) + 1 for d in drafts]).astype(np.int32),
                     pos=np.arange(rows, dtype=np.int64), idx_mapping=np.array([1, 2, 0], np.int32),
                     temperature=np.array([0.6, 1.9, 0.0], np.float32), seeds=np.arange(3, dtype=np.int64),
                     num_speculative_steps=2)


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _check_laws(batch, calls):
    cu, states = batch.cu_num_logits, batch.idx_mapping
    stochastic = [r for r in range(batch.num_reqs) if batch.temperature[states[r]] > 0]
    assert len(calls) == len(stochastic)
    for r, (ids, p, q) in zip(stochastic, calls):
        t, n = np.float64(batch.temperature[states[r]]), len(ids)
        assert ids.tolist() == batch.draft_token_ids[cu[r] + 1 : cu[r] + 1 + n].tolist()
        np.testing.assert_allclose(p.numpy(), _softmax64(batch.target_logits[cu[r] : cu[r] + n + 1] / t), atol=1e-6)
        np.testing.assert_allclose(q.numpy(), _softmax64(batch.draft_logits[states[r], :n] / t), atol=1e-6)


def _sampler(cls=DsparkTorchSampler, calls=None):
    return cls(rejection=fake_rejection(calls), make_noise=make_noise, device="cpu")


def test_declarations():
    for cls in (DsparkTorchSampler, DsparkTritonSampler):
        rec = record_of(_sampler(cls))
        assert (rec.streams, rec.supports_logprobs, rec.draft_modes) == ("own", False, {"model", "one_hot"})
    assert record_of(_sampler()).interpreted is False


def test_the_laws_handed_over_are_p_and_q():
    calls, batch = [], _batch()
    _sampler(calls=calls)(batch)
    _check_laws(batch, calls)


@pytest.mark.parametrize("mistake", ["swap_pq", "temperature_twice"])
def test_a_convention_mistake_is_caught(mistake, monkeypatch):
    arguments = DsparkTorchSampler.arguments

    def wrong(self, *args):
        a = arguments(self, *args)
        n = a["candidates"].shape[1] - 1
        if mistake == "swap_pq":
            target = a["target_logits"].clone()
            target[:n] = a["draft_logits"][0, :n]
            a["draft_logits"] = a["target_logits"][None, :n].clone()
            a["target_logits"] = target
        else:  # the processed logits z handed where the call divides by T itself
            a["target_logits"] = a["target_logits"] / a["target_temperatures"]
        return a

    monkeypatch.setattr(DsparkTorchSampler, "arguments", wrong)
    calls, batch = [], _batch()
    _sampler(calls=calls)(batch)
    with pytest.raises(AssertionError):
        _check_laws(batch, calls)


def test_a_changed_calling_convention_is_refused_by_name():
    def newer(*, candidates, target_logits, draft_logits, target_temperatures, draft_temperatures, noise,
              cutoff_verify_lens=None, positions):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"does not know: \['positions'\]"):
        DsparkTorchSampler(rejection=newer, make_noise=make_noise, device="cpu")


def test_keyed_per_request_through_the_gate(reference):
    outcome = run(PROPERTIES["batch_invariance"], make_context(_sampler(), reference, profile="ci"))
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
