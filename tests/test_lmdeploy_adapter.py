"""rs_verify.adapters.lmdeploy without LMDeploy: each sampler wraps a fake of LMDeploy's call, written
here from the SPEC (not from the adapter):

- `fake_kernels()`: a module with the three Triton launchers' signatures (`sample_recovered_tokens`,
  `random_rejection_sample`, `greedy_rejection_sample`), in NumPy: accept iff `q > 0 and p / q >= u`
  (`p >= u` one-hot), recover `argmax max(p - q, 0) * inv_q` (`p` when the residual has no mass:
  SPEC 4 exactly), greedy rows by `target_token_ids`; outputs written in place, `-1` past them.
- `fake_default()`: a module whose `DefaultRejectionSamplingImpl.forward` draws `torch.rand` and
  `torch.empty(...).exponential_()` through the module's own `torch`, as LMDeploy's does.

Each fake checks the dtypes and layouts LMDeploy's code relies on. The adapter over a correct fake
passes certification at `ci`; a mistake of the kind a release change would cause (p and q swapped,
`E` handed where LMDeploy wants `1 / E`, the temperature lost) fails it.
"""

import types

import numpy as np
import pytest
import torch

from conftest import no_shrink
from rs_verify.adapters import explicit_inputs
from rs_verify.adapters import lmdeploy as adapter
from rs_verify.adapters.lmdeploy import LmdeployTorchSampler, LmdeployTritonSampler
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES

F32 = np.float32


def _recover(p, q, d, inv_q):
    res = p.copy()
    if q is None:
        res[d] = 0
    else:
        res = np.maximum(p - q, F32(0))
    if not (res > 0).any():  # SPEC 4: a residual with no positive mass is p
        res = p
    return int(np.argmax(res * inv_q))


def fake_kernels():
    mod = types.ModuleType("fake_lmdeploy_kernels")

    def sample_recovered_tokens(output_token_ids, draft_token_ids, draft_probs, target_probs, inv_q):
        b, n = draft_token_ids.shape
        v = target_probs.shape[-1]
        assert output_token_ids.dtype == draft_token_ids.dtype == torch.int64 and output_token_ids.shape == (b, n)
        assert target_probs.dtype == torch.float32 and target_probs.shape == (b, n, v) and target_probs.is_contiguous()
        assert draft_probs is None or (draft_probs.dtype == torch.float32 and draft_probs.shape == (b, n, v))
        assert inv_q.dtype == torch.float32 and inv_q.shape == (b, v)
        p, ids, iq = target_probs.numpy(), draft_token_ids.numpy(), inv_q.numpy()
        for r in range(b):
            for i in range(n):
                q = None if draft_probs is None else draft_probs[r, i].numpy()
                output_token_ids[r, i] = _recover(p[r, i], q, int(ids[r, i]), iq[r])

    def random_rejection_sample(output_token_ids, num_rejected_tokens, last_token_ids, draft_token_ids, draft_probs,
                                target_probs, bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy):
        b, n = draft_token_ids.shape
        assert output_token_ids.shape == (b, n + 1) and bonus_token_ids.shape == (b,)
        assert bonus_token_ids.dtype == recovered_token_ids.dtype == torch.int64
        assert uniform_probs.dtype == torch.float64 and uniform_probs.shape == (b, n)
        assert is_greedy is None or (is_greedy.dtype == torch.bool and is_greedy.any())
        p, ids, u = target_probs.numpy(), draft_token_ids.numpy(), uniform_probs.numpy()
        for r in range(b):
            if is_greedy is not None and bool(is_greedy[r]):
                continue
            out = [-1] * (n + 1)
            for i in range(n):
                d = int(ids[r, i])
                qd = F32(1) if draft_probs is None else F32(draft_probs[r, i, d].item())
                with np.errstate(over="ignore"):
                    ok = qd > 0 and p[r, i, d] / qd >= u[r, i]
                out[i] = d if ok else int(recovered_token_ids[r, i])
                if not ok:
                    break
            else:
                out[n] = int(bonus_token_ids[r])
            output_token_ids[r] = torch.tensor(out)

    def greedy_rejection_sample(output_token_ids, num_rejected_tokens, last_token_ids, draft_token_ids,
                                target_token_ids, bonus_token_ids, is_greedy):
        b, n = draft_token_ids.shape
        assert target_token_ids.shape == (b, n) and target_token_ids.dtype == torch.int64
        for r in range(b):
            if is_greedy is not None and not bool(is_greedy[r]):
                continue
            out = [-1] * (n + 1)
            for i in range(n):
                out[i] = int(target_token_ids[r, i])
                if out[i] != int(draft_token_ids[r, i]):
                    break
            else:
                out[n] = int(bonus_token_ids[r])
            output_token_ids[r] = torch.tensor(out)

    mod.sample_recovered_tokens, mod.random_rejection_sample = sample_recovered_tokens, random_rejection_sample
    mod.greedy_rejection_sample = greedy_rejection_sample
    return mod


_DEFAULT = '''
class DefaultRejectionSamplingImpl:
    def forward_greedy(self, target_token_ids, draft_token_ids):
        return _format(target_token_ids[:, :-1], draft_token_ids == target_token_ids[:, :-1], target_token_ids[:, -1])

    def forward(self, target_logits, draft_token_ids, bonus_token_ids, *, is_greedy, draft_probs=None):
        b, n = draft_token_ids.shape
        p = target_logits.softmax(dim=-1, dtype=torch.float32)
        u = torch.rand((b, n), dtype=torch.float64, device=target_logits.device)
        q = torch.empty((b, target_logits.shape[-1]), dtype=torch.float32, device=target_logits.device)
        q.exponential_()
        inv_q = q.reciprocal()
        sel, acc = draft_token_ids.clone(), torch.zeros((b, n), dtype=torch.bool)
        for r in range(b):
            for i in range(n):
                d = int(draft_token_ids[r, i])
                if is_greedy is not None and bool(is_greedy[r]):
                    sel[r, i] = target_logits[r, i].argmax()
                    acc[r, i] = bool(sel[r, i] == d)
                    continue
                qd = 1.0 if draft_probs is None else float(draft_probs[r, i, d])
                acc[r, i] = qd > 0 and float(p[r, i, d]) / qd >= float(u[r, i])
                dq = None if draft_probs is None else draft_probs[r, i].numpy()
                sel[r, i] = d if acc[r, i] else _recover(p[r, i].numpy(), dq, d, inv_q[r].numpy())
        return _format(sel, acc, bonus_token_ids)


def _format(sel, acc, bonus):
    b, n = sel.shape
    out = torch.full((b, n + 1), -1, dtype=torch.int64)
    for r in range(b):
        for i in range(n):
            out[r, i] = sel[r, i]
            if not acc[r, i]:
                break
        else:
            out[r, n] = bonus[r]
    return out, None, None
'''


def fake_default():
    mod = types.ModuleType("fake_lmdeploy_default")
    mod.__dict__.update(torch=torch, _recover=_recover)
    exec(_DEFAULT, mod.__dict__)
    return mod


def _triton():
    return LmdeployTritonSampler(kernels=fake_kernels(), device="cpu", deviations=())


def _torch():
    return LmdeployTorchSampler(impl_module=fake_default(), device="cpu", deviations=())


def _certify(sampler, reference, shrink=True):
    """Certification at the ci profile's budget; `shrink=False` stops at the first failing example (a kill)."""
    return run(PROPERTIES["certified_equivalence"], make_context(sampler, reference, profile="ci"),
               None if shrink else no_shrink())


def test_declarations():
    for sampler in (_triton(), _torch()):
        rec = record_of(sampler)
        assert (rec.streams, rec.resample, rec.supports_logprobs, rec.verification_methods) == (
            "explicit", "gumbel", False, frozenset({"token"}))
        assert record_of(sampler.unvalidated()) == rec and sampler.unvalidated().validate is False
    assert LmdeployTorchSampler.deviations == {"empty_residual_token0"}  # measured on 0.18.0 (docs/engines.md)


def test_a_changed_calling_convention_is_refused_by_name():
    kernels = fake_kernels()
    kernels.random_rejection_sample = lambda output_token_ids, num_rejected_tokens, last_token_ids, \
        draft_token_ids, draft_probs, target_probs, bonus_token_ids, recovered_token_ids, uniform_probs, \
        is_greedy, seed: None  # noqa: E731
    with pytest.raises(TypeError, match=r"refuses the parameters it does not know: \['seed'\]"):
        LmdeployTritonSampler(kernels=kernels, device="cpu")
    kernels.random_rejection_sample = lambda output_token_ids, draft_token_ids: None  # noqa: E731
    with pytest.raises(TypeError, match="lacks"):
        LmdeployTritonSampler(kernels=kernels, device="cpu")


@pytest.mark.parametrize("make", [_triton, _torch], ids=["triton", "torch"])
def test_certified_over_a_correct_fake(make, reference):
    outcome = _certify(make(), reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
    assert outcome.stats["stochastic_decisions"] >= 100


def _swap_pq(a):
    if a["draft_probs"] is not None:
        a["target_probs"], a["draft_probs"] = a["draft_probs"], a["target_probs"]
        a["target_logits"] = a["target_probs"].log()
    return a


def _e_for_inverse(a):
    return {**a, "e": a["e"].reciprocal()}  # the kernels then get E where they want 1 / E


# The temperature is applied in code both backends share: the Triton one checks it (the cheaper fake).
@pytest.mark.parametrize("make, mistake", [(_triton, "swap_pq"), (_torch, "swap_pq"), (_triton, "e_for_inverse"),
                                           (_torch, "e_for_inverse"), (_triton, "lost_temperature")])
def test_a_convention_mistake_fails_certification(make, mistake, reference, monkeypatch):
    sampler = make()
    if mistake == "lost_temperature":
        prepare = explicit_inputs.prepare
        monkeypatch.setattr(adapter.explicit_inputs, "prepare", lambda batch, dev: prepare(
            batch.replace(temperature=np.where(batch.temperature > 0, F32(1), F32(0)).astype(np.float32)), dev))
    else:
        inputs = type(sampler).inputs
        fix = _swap_pq if mistake == "swap_pq" else _e_for_inverse
        monkeypatch.setattr(type(sampler), "inputs", lambda self, *a: fix(inputs(self, *a)))
    outcome = _certify(sampler, reference, shrink=False)
    assert outcome.status == "failed", outcome.status
