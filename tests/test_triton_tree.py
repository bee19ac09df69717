"""The Triton sampler's tree verification (SPEC 4c; rs_verify/triton_sampler/tree.py): its declarations, a
hand-built tree whose path needs the residual update, chunking of tree batches, and an unvalidated batch.

Certification on drawn tree batches runs in tests/test_properties.py ("triton-explicit",
"triton-explicit-icdf", "triton-explicit-per-node"); these are the unit tests.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rs_verify import SpecBatch
from rs_verify.contract.chunking import verify_chunked
from rs_verify.harness.record import record_of
from rs_verify.harness.samplers import load_sampler
from rs_verify.properties.certification import certify, compare_decisions
from rs_verify.properties.memory import buffer_bound
from rs_verify.reference import ReferenceSampler
from rs_verify.strategies import tree_batches
from rs_verify.triton_sampler import TritonSampler


def _sampler(uniforms="per_child", resample="gumbel"):
    return TritonSampler(block_v=16, streams="explicit", tree_uniforms=uniforms, resample=resample)


def test_tree_declarations():
    """The explicit family declares tree verification (SPEC 10): every kind with one coin per child, one-hot
    trees with one coin per node; another family verifies no trees and refuses `tree_uniforms`."""
    rec = record_of(_sampler())
    assert "tree" in rec.verification_methods and rec.tree_uniforms == "per_child"
    assert rec.tree_drafts == {"one_hot", "iid", "without_replacement"}
    node = _sampler("per_node")
    assert record_of(node).tree_drafts == {"one_hot"} and record_of(node).tree_uniforms == "per_node"
    assert node.unvalidated().tree_uniforms == "per_node" and "tree_uniforms='per_node'" in repr(node)
    assert record_of(load_sampler("triton-explicit-per-node")).tree_uniforms == "per_node"
    assert "tree" not in record_of(TritonSampler(block_v=16)).verification_methods
    for bad in (dict(streams="murmur3", tree_uniforms="per_child"), dict(streams="explicit", tree_uniforms="coin")):
        with pytest.raises(ValueError, match="tree_uniforms"):
            TritonSampler(**bad)


def _star(uniforms: list[float], resample_uniform=0.5) -> SpecBatch:
    """One stochastic request (T = 1): a root whose children hold tokens 0 and 1 (one-hot drafts), on a
    row with p = (0.5, 0.3, 0.2) over V = 3; a second request, greedy, whose path is its argmax child."""
    x = np.log(np.array([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8], [0.1, 0.2, 0.7], [0.2, 0.1, 0.7],
                         [0.6, 0.2, 0.2]], np.float32))
    return SpecBatch(
        target_logits=x, draft_logits=None, draft_token_ids=np.array([0, 0, 1, 0, 2, 1]),
        cu_num_logits=np.array([0, 3, 6], np.int32), pos=np.arange(6), idx_mapping=np.array([0, 1], np.int32),
        temperature=np.array([1.0, 0.0], np.float32), seeds=np.zeros(2, np.int64), num_speculative_steps=2,
        verification="tree", tree_parent=np.array([-1, 0, 0, -1, 0, 1], np.int32),
        accept_uniforms=np.array([0.5, *uniforms, 0.5, 0.5, 0.5]), resample_gumbel=np.zeros((2, 3)),
        resample_uniforms=np.array([resample_uniform, 0.5]))


@pytest.mark.parametrize("resample", ["gumbel", "inverse_cdf"])
def test_a_rejected_sibling_updates_the_residual(resample):
    """Child 1 (token 0, u = 0.9 > p(0) = 0.5) is rejected; the residual (0, 0.6, 0.4) accepts child 2
    (token 1) at u = 0.55, which p(1) = 0.3 itself would reject; the leaf's bonus is the argmax of node
    2's row (zero Gumbel noise; inverse CDF at U = 0.5 of (0.1, 0.1, 0.8) also gives token 2). The greedy
    request takes its argmax child (node 1, token 2), whose row's argmax (token 2) no child holds."""
    out = _sampler(resample=resample)(_star([0.9, 0.55]))
    assert out.accepted_nodes.tolist() == [[2, -1], [1, -1]]
    assert out.sampled.tolist() == [[1, 2, -1], [2, 2, -1]] and out.num_sampled.tolist() == [2, 2]
    # both rejected (u = 0.95 > 0.6): the last token from the residual (0, 0, 1) after both, token 2
    out = _sampler(resample=resample)(_star([0.9, 0.95], resample_uniform=0.01))
    assert out.accepted_nodes[0].tolist() == [-1, -1] and out.sampled[0].tolist() == [2, -1, -1]


@pytest.mark.parametrize("resample", ["gumbel", "inverse_cdf"])
def test_without_replacement_renormalises_q(resample):
    """Model drafts, p = (0.2, 0.5, 0.3), Q = (0.6, 0.2, 0.2) at the root, children tokens 0 then 2. Child 1
    (u = 0.5: 0.2 < 0.3) is rejected, leaving p~ = (0, 0.75, 0.25). Child 2 at u = 0.7: drawn iid,
    q~(2) = 0.2 accepts it (0.25 > 0.14); drawn without replacement, q~(2) = 0.2 / (1 - 0.6) = 0.5 rejects it
    (0.25 < 0.35) and the residual max(p~ - Q~, 0) = (0, 0.25, 0) emits token 1."""
    p = np.log(np.array([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]], np.float32))
    q = np.log(np.array([[0.6, 0.2, 0.2], [0.3, 0.3, 0.4], [0.3, 0.3, 0.4]], np.float32))
    batch = SpecBatch(
        target_logits=p, draft_logits=None, draft_token_ids=np.array([0, 0, 2]), cu_num_logits=np.array([0, 3], np.int32),
        pos=np.arange(3), idx_mapping=np.array([0], np.int32), temperature=np.array([1.0], np.float32),
        seeds=np.zeros(1, np.int64), num_speculative_steps=1, verification="tree",
        tree_parent=np.array([-1, 0, 0], np.int32), node_draft_logits=q, tree_drafts="iid",
        accept_uniforms=np.array([0.5, 0.5, 0.7]), resample_gumbel=np.zeros((1, 3)), resample_uniforms=np.array([0.5]))
    sampler = _sampler(resample=resample)
    iid = sampler(batch)
    assert iid.accepted_nodes.tolist() == [[2]] and iid.sampled.tolist() == [[2, 2]]
    wr = sampler(batch.replace(tree_drafts="without_replacement"))
    assert wr.accepted_nodes.tolist() == [[-1]] and wr.sampled.tolist() == [[1, -1]]


def test_per_node_coin():
    """One coin per node: child k accepted iff S_{k-1} <= U < S_k (S = 0.5, 0.8): U = 0.6 takes child 2."""
    batch = _star([0.99, 0.99])
    out = _sampler("per_node")(batch.replace(accept_uniforms=np.array([0.6, 0.99, 0.99, 0.5, 0.5, 0.5])))
    assert out.accepted_nodes[0].tolist() == [2, -1] and out.sampled[0].tolist() == [1, 2, -1]


TREES = tree_batches(max_reqs=4, max_nodes=8, vocab_sizes=(3, 17, 40), sampling_params=("min_p", "top_k", "top_p"))


@settings(max_examples=6, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(TREES)
def test_chunked_tree_batches_equal_the_full_batch(batch):
    """SPEC 7 on tree batches: for caps of 1, 2 and 5 rows the chunked output (accepted_nodes included) is
    the full batch's bit for bit, the residual buffer within `buffer_bound`; and every decision of the full
    batch is certified against the reference (SPEC 8)."""
    sampler = _sampler()
    full = sampler(batch)
    oracle = ReferenceSampler(streams="explicit")
    _, traces = oracle.verify_with_trace(batch)
    certify(compare_decisions(batch, full, traces, reference=oracle), batch=batch)
    for cap in (1, 2, 5):
        out = sampler(batch, max_chunk_logits=cap)
        for name in ("sampled", "num_sampled", "accepted_nodes"):
            assert np.array_equal(getattr(out, name), getattr(full, name)), (cap, name)
        assert out.extras["max_buffer_rows"] <= buffer_bound(batch, cap)[0]
        outside = verify_chunked(batch, sampler, cap)  # the suite's own chunking agrees too
        assert np.array_equal(outside.accepted_nodes, full.accepted_nodes)


def test_unvalidated_tree_stays_in_bounds():
    """Without validation, parents out of range or after their child, tokens beyond V' and a path deeper
    than K neither crash nor leave [0, V') (SPEC 9)."""
    batch = _star([0.1, 0.1])
    bad = batch.replace(tree_parent=np.array([5, 0, 7, -3, 0, 1], np.int32), draft_token_ids=np.array([9, 0, 1, 0, 2, 99]),
                        num_speculative_steps=1, accept_uniforms=np.full(6, 1e-9))
    out = _sampler().unvalidated()(bad)
    assert ((out.sampled >= -1) & (out.sampled < 3)).all() and (out.num_sampled <= 2).all()
    assert (out.accepted_nodes < 3).all()
