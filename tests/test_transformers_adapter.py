"""rs_verify.adapters.hf_transformers without transformers: the sampler wraps a fake of
`_speculative_sampling` (its signature and return convention), written here from the SPEC in
torch, drawing from torch's global generator as transformers does.

The sampler is of the `own` family (nothing to certify), so the convention is checked where it is
handed over: every call's `softmax(new_logits)` must be the target law `p = softmax(x / T)` and
`softmax(candidate_logits)` the draft law `q = softmax(d / T)` of the request's rows, computed
here in float64 from the batch (SPEC 2). A swapped `p` / `q` or a lost temperature fails it. The
seeding per request is checked through the gate's determinism and batch invariance at `ci`.
"""

import numpy as np
import pytest
import torch

from rs_verify.adapters import per_request
from rs_verify.adapters.hf_transformers import TransformersSampler
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES


def fake_speculative_sampling(calls=None):
    def _speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                              assistant_ensemble_weight=None):
        n = candidate_length
        assert assistant_ensemble_weight is None and n >= 1
        assert candidate_input_ids.dtype == torch.int64 and candidate_input_ids.shape[0] == 1
        assert candidate_logits.dtype == new_logits.dtype == torch.float32
        assert candidate_logits.shape[:2] == (1, n) and new_logits.shape[:2] == (1, n + 1)
        if calls is not None:
            calls.append((candidate_input_ids[0, -n:].clone(), candidate_logits[0].clone(), new_logits[0].clone()))
        q, p = candidate_logits[0].softmax(-1), new_logits[0].softmax(-1)
        drafts = candidate_input_ids[0, -n:]
        out = []
        for i in range(n):
            d = int(drafts[i])
            if float(torch.rand(())) < float(p[i, d] / q[i, d]):
                out.append(d)
                continue
            res = (p[i] - q[i]).clamp(min=0)
            res = res if float(res.sum()) > 0 else p[i]  # SPEC 4: an empty residual is p
            out.append(int(torch.multinomial(res / res.sum(), 1)))
            return torch.tensor([out]), torch.tensor(i)
        out.append(int(torch.multinomial(p[n], 1)))
        return torch.tensor([out]), torch.tensor(n)

    return _speculative_sampling


def _batch(temperature=(0.5, 1.7, 0.0)) -> SpecBatch:
    rng = np.random.default_rng(7)
    drafts, v = ((3, 5), (2, -1), (1, 4)), 8
    rows = sum(len(d) + 1 for d in drafts)
    return SpecBatch(target_logits=rng.standard_normal((rows, v)).astype(np.float32) * 3,
                     draft_logits=rng.standard_normal((3, 2, v)).astype(np.float32) * 3,
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
    """Each call's laws against SPEC 2's p and q of its request (float64, from the batch)."""
    cu, states = batch.cu_num_logits, batch.idx_mapping
    stochastic = [r for r in range(batch.num_reqs) if batch.temperature[states[r]] > 0]
    assert len(calls) == len(stochastic)
    for r, (ids, cand, new) in zip(stochastic, calls):
        t, n = np.float64(batch.temperature[states[r]]), len(ids)
        assert ids.tolist() == batch.draft_token_ids[cu[r] + 1 : cu[r] + 1 + n].tolist()
        p = _softmax64(batch.target_logits[cu[r] : cu[r] + n + 1] / t)
        q = _softmax64(batch.draft_logits[states[r], :n] / t)
        np.testing.assert_allclose(new.softmax(-1).double().numpy(), p, atol=1e-6)
        np.testing.assert_allclose(cand.softmax(-1).double().numpy(), q, atol=1e-6)


def test_declarations():
    sampler = TransformersSampler(speculative_sampling=fake_speculative_sampling())
    rec = record_of(sampler)
    assert (rec.streams, rec.interpreted, rec.draft_modes, rec.supports_logprobs) == ("own", False, {"model"}, False)
    assert sampler.optional == {"assistant_ensemble_weight": None}
    with pytest.raises(ValueError, match="^draft_logits: "):
        sampler(_batch().replace(draft_logits=None))


def test_the_laws_handed_over_are_p_and_q():
    calls, batch = [], _batch()
    out = TransformersSampler(speculative_sampling=fake_speculative_sampling(calls))(batch)
    _check_laws(batch, calls)
    assert [len(c[0]) for c in calls] == [1, 2]  # the padded draft ends request 1 (SPEC 3c)
    assert out.num_sampled[0] >= 1  # request 0 (state 2) is greedy: the adapter verifies it


@pytest.mark.parametrize("mistake", ["swap_pq", "lost_temperature"])
def test_a_convention_mistake_is_caught(mistake, monkeypatch):
    arguments, batch = TransformersSampler.arguments, _batch()

    def wrong(self, prepared, prep, r):
        a = arguments(self, prepared, prep, r)
        n = a["candidate_length"]
        if mistake == "swap_pq":
            new = a["new_logits"].clone()
            new[:, :n] = a["candidate_logits"]
            a["candidate_logits"] = a["new_logits"][:, :n].clone()
            a["new_logits"] = new
        else:  # the raw logits, as before the temperature
            lo, s = int(prep.rows[r]), int(batch.idx_mapping[r])
            a["new_logits"] = torch.from_numpy(batch.target_logits[lo : lo + n + 1].copy())[None]
            a["candidate_logits"] = torch.from_numpy(batch.draft_logits[s, :n].copy())[None]
        return a

    monkeypatch.setattr(TransformersSampler, "arguments", wrong)
    calls = []
    TransformersSampler(speculative_sampling=fake_speculative_sampling(calls))(batch)
    with pytest.raises(AssertionError):
        _check_laws(batch, calls)


def test_a_changed_calling_convention_is_refused_by_name():
    def newer(candidate_input_ids, candidate_logits, candidate_length, new_logits, generator):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"does not know: \['generator'\]"):
        TransformersSampler(speculative_sampling=newer)
    assert per_request.request_seed(2**64 - 1, 3) == per_request.request_seed(-1, 3)


@pytest.mark.parametrize("name", ["determinism", "batch_invariance"])
def test_seeded_per_request_through_the_gate(name, reference):
    outcome = run(PROPERTIES[name], make_context(TransformersSampler(speculative_sampling=fake_speculative_sampling()),
                                                 reference, profile="ci"))
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason


def test_the_adapters_own_draw_stays_on_the_support_and_in_bounds():
    """per_request.sample_p: a request with no draft. Never a token of probability 0; a NaN law
    (bad input without validation) still gives a token in [0, V'), not an exception."""
    gen = torch.Generator().manual_seed(5)
    p = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    drawn = [per_request.sample_p(p, gen) for _ in range(400)]
    assert set(drawn) == {1, 3} and 0.6 < drawn.count(3) / 400 < 0.9  # 0.75: 400 draws, sd 0.022
    assert 0 <= per_request.sample_p(torch.full((4,), float("nan")), gen) < 4
