"""Output invariants and the greedy argmax chain (SPEC sections 4 and 5)."""

import numpy as np
import pytest

from rs_verify.engine.runner import pytest_run
from rs_verify.properties.invariants import check_output_invariants
from rs_verify.properties.registry import PropertyFailure
from rs_verify.spec.batch import SamplerOutput, SpecBatch


@pytest.mark.parametrize("prop", ["output_invariants", "greedy_chain"])
def test_invariants(prop, sampler):
    pytest_run(prop, sampler)


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
