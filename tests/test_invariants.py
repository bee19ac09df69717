"""Output invariants and the greedy argmax chain (SPEC sections 4 and 5)."""

import numpy as np
import pytest

from examples.broken_sampler import ChunkLocalCuSampler
from rs_verify.engine.runner import make_context, run
from rs_verify.properties import PROPERTIES
from rs_verify.properties.invariants import check_output_invariants
from rs_verify.properties.registry import PropertyFailure
from rs_verify.contract.batch import LogprobsTensors, SamplerOutput, SpecBatch


def _saturated_batch():
    """One request, one model draft d = 1 with p and q both saturated on token 1: max(p - q, 0) = 0."""
    row = np.array([-np.inf, 0.0, -np.inf, -np.inf], np.float32)
    return SpecBatch(target_logits=np.stack([row, row]), draft_logits=row.reshape(1, 1, 4).copy(),
                     draft_token_ids=np.array([0, 1], np.int64), cu_num_logits=np.array([0, 2], np.int32),
                     pos=np.array([5, 6], np.int64), idx_mapping=np.array([0], np.int32),
                     temperature=np.array([1.0], np.float32), seeds=np.array([7], np.int64),
                     num_speculative_steps=1)


def test_invariant_failure_names_the_decision():
    """An empty residual emitting token 0 (p = 0): the message names the request, the step, the
    draft id, p(d), q(d) and the residual mass, and the failure records request and step."""
    batch = _saturated_batch()
    bad = SamplerOutput(sampled=np.array([[0, -1]], np.int64), num_sampled=np.array([1], np.int32))
    with pytest.raises(PropertyFailure) as info:
        check_output_invariants(batch, bad)
    msg = str(info.value)
    for part in ("request 0", "step 0 emitted token 0 with p = 0", "model draft d = 1", "p(d) = 1", "q(d) = 1",
                 "residual mass sum max(p - q, 0) = 0 (empty: falls back to p)"):
        assert part in msg, msg
    assert info.value.details == {"request": 0, "step": 0}
    good = SamplerOutput(sampled=np.array([[1, 1]], np.int64), num_sampled=np.array([2], np.int32))
    check_output_invariants(batch, good)  # p(1) = q(1) = 1: the draft is accepted, the bonus is 1


def _two_requests(num_logprobs=1):
    """Two requests of one model draft each (N = 4 rows, R = 2), logprobs asked."""
    rng = np.random.default_rng(3)
    return SpecBatch(target_logits=rng.normal(size=(4, 5)).astype(np.float32),
                     draft_logits=rng.normal(size=(2, 1, 5)).astype(np.float32),
                     draft_token_ids=np.array([0, 2, 0, 4], np.int64), cu_num_logits=np.array([0, 2, 4], np.int32),
                     pos=np.arange(4, dtype=np.int64), idx_mapping=np.array([1, 0], np.int32),
                     temperature=np.ones(2, np.float32), seeds=np.array([5, 6], np.int64), num_speculative_steps=1,
                     num_logprobs=num_logprobs)


def _with_cu(out, cu):
    lp = out.logprobs
    return SamplerOutput(out.sampled, out.num_sampled,
                         LogprobsTensors(lp.token_ids, lp.logprobs, lp.ranks, cu_num_generated_tokens=cu))


def test_cu_num_generated_tokens_is_the_full_batch_cu(reference):
    """SPEC section 6: `cu_num_logits` as a list, or None when N == R; a chunk's own list (what a
    concatenation that keeps the last part's `cu` gives) fails, and so does None for N > R."""
    batch = _two_requests()
    out = reference(batch)
    check_output_invariants(batch, out)
    assert out.logprobs.cu_num_generated_tokens == [0, 2, 4]
    for wrong in ([0, 2], None, [0, 1, 2]):
        with pytest.raises(PropertyFailure, match=r"cu_num_generated_tokens = .*SPEC section 6 wants cu_num_logits"):
            check_output_invariants(batch, _with_cu(out, wrong))
    single = batch.replace(target_logits=batch.target_logits[[0, 2]], draft_token_ids=np.zeros(2, np.int64),
                           cu_num_logits=np.array([0, 1, 2], np.int32), pos=np.arange(2, dtype=np.int64),
                           num_speculative_steps=0, draft_logits=None)  # N == R: None
    out = reference(single)
    check_output_invariants(single, out)
    with pytest.raises(PropertyFailure, match=r"wants None \(N == R\)"):
        check_output_invariants(single, _with_cu(out, [0, 1, 2]))


def test_output_invariants_fails_a_chunk_local_cu():
    res = run(PROPERTIES["output_invariants"], make_context(ChunkLocalCuSampler(), profile="ci", device="cpu"))
    assert res.status == "failed" and "cu_num_generated_tokens" in res.message, res.message


class _EmitsPZero:
    """The reference, but request 0's first token is replaced by token 0 whatever p says (deterministic)."""

    name = "emits-p-zero"

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch, **kw):
        out = self.inner(batch, **kw)
        sampled = out.sampled.copy()
        sampled[0, 0] = 0
        return SamplerOutput(sampled, out.num_sampled, out.logprobs)


@pytest.mark.parametrize("prop", ["determinism", "chunked_equals_full"])
def test_every_call_is_held_to_the_output_rules(prop, reference):
    """A deterministic, chunk-invariant sampler that emits a token with p = 0 passes what determinism
    and chunking compare, yet fails them: every output of a valid batch is checked at the call."""
    batch = _saturated_batch()
    ctx = make_context(_EmitsPZero(reference), reference)
    drawn = (batch, 1)  # determinism: (batch, seed); chunking: (batch, cap)
    with pytest.raises(PropertyFailure, match="emits-p-zero's output breaks SPEC sections 4-6: request 0: "):
        PROPERTIES[prop].check(ctx, drawn)
    PROPERTIES[prop].check(make_context(reference, reference), drawn)
