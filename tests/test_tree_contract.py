"""Tree verification's contract (SPEC 4c): validation, chunking and the reference's rule on hand-built trees."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rs_verify import SpecBatch
from rs_verify.contract.chunking import verify_chunked
from rs_verify.contract.tree import node_probs
from rs_verify.contract.validation import validate
from rs_verify.reference import ReferenceSampler
from reference.trace import FREE
from rs_verify.strategies import tree_batches

REF = ReferenceSampler(streams="explicit")
PER_NODE = ReferenceSampler(streams="explicit", tree_uniforms="per_node")


def tree(parents, tokens, *, v=6, k=3, temps=(1.0,), model=None, kind="iid", seed=0, **kw) -> SpecBatch:
    """A tree batch of the given requests: `parents` and `tokens` lists per request."""
    rng = np.random.default_rng(seed)
    sizes = [len(p) for p in parents]
    n = sum(sizes)
    cu = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    fields = dict(
        target_logits=rng.standard_normal((n, v)).astype(np.float32), draft_logits=None,
        draft_token_ids=np.concatenate([np.asarray(t, np.int64) for t in tokens]), cu_num_logits=cu,
        pos=np.arange(n, dtype=np.int64), idx_mapping=np.arange(len(parents), dtype=np.int32),
        temperature=np.asarray(temps, np.float32), seeds=np.arange(len(parents), dtype=np.int64),
        num_speculative_steps=k, verification="tree",
        tree_parent=np.concatenate([np.asarray(p, np.int32) for p in parents]),
        node_draft_logits=rng.standard_normal((n, v)).astype(np.float32) if model else None, tree_drafts=kind,
        accept_uniforms=rng.uniform(0.01, 0.99, n), resample_gumbel=rng.gumbel(size=(len(parents), v)),
        resample_uniforms=rng.uniform(0.01, 0.99, len(parents)))
    fields.update(kw)
    return SpecBatch(**fields)


@pytest.mark.parametrize("change, match", [
    (dict(tree_parent=np.array([0, 0, 0], np.int32)), r"tree_parent\[0\]: the root .* not -1"),
    (dict(tree_parent=np.array([-1, 2, 0], np.int32)), r"tree_parent\[1\]: node 1 .* parents precede"),
    (dict(tree_parent=np.array([-1, 0, 1], np.int32), num_speculative_steps=1), r"tree_parent\[2\]: .* depth 2 > K = 1"),
    (dict(tree_parent=None), "tree_parent: a tree batch"),
    (dict(tree_parent=np.array([-1, 0], np.int32)), r"tree_parent: expected shape \[3\]"),
    (dict(tree_parent=np.array([-1, 0, 0], np.int64)), "tree_parent: expected dtype int32"),
    (dict(draft_logits=np.zeros((1, 3, 6), np.float32)), "draft_logits: a tree batch"),
    (dict(num_logprobs=1), "num_logprobs: logprobs are not defined for tree batches"),
    (dict(tree_drafts="iid_please"), "tree_drafts: unknown kind"),
    (dict(node_draft_logits=np.zeros((3, 7), np.float32)), "node_draft_logits: draft vocab 7 exceeds"),
    (dict(verification="token"), "tree_parent: only a tree batch"),
    (dict(draft_token_ids=np.array([0, 6, 1])), r"draft_token_ids\[1\]: draft id >= V'"),
])
def test_validation_rejects_a_bad_tree(change, match):
    b = tree([[-1, 0, 0]], [[0, 1, 2]]).replace(**change)
    with pytest.raises(ValueError, match=match):
        validate(b)


def test_node_draft_rows_of_parents_are_scanned_and_leaves_are_not():
    nd = np.zeros((3, 6), np.float32)
    nd[2] = np.nan  # a leaf's Q row is never read
    validate(tree([[-1, 0, 0]], [[0, 1, 2]], node_draft_logits=nd))
    nd[0] = -np.inf
    with pytest.raises(ValueError, match=r"node_draft_logits\[0\]: row has no finite logit"):
        validate(tree([[-1, 0, 0]], [[0, 1, 2]], node_draft_logits=nd))


def test_a_bushy_tree_holds_more_than_k_plus_one_nodes():
    b = tree([[-1, 0, 0, 0, 0, 1]], [[0, 1, 2, 3, 4, 5]], k=2)
    out = REF(validate(b))
    assert out.sampled.shape == (1, 3) and out.accepted_nodes.shape == (1, 2)


@pytest.mark.parametrize("model", [False, True])
def test_a_chain_verifies_as_token_verification_one_row_later(model):
    """SPEC 4c: a chain is the tree whose parent of node i is i - 1; its child's uniform is its own row's,
    one row later than section 4 reads; with one child per level iid and chain verification agree."""
    rng = np.random.default_rng(3)
    for seed in range(40):
        t = tree([[-1, 0, 1, 2]], [[0, *rng.integers(0, 6, 3)]], temps=(0.7,), model=model, seed=seed)
        if model:  # Q of node i proposes node i + 1: token-wise draft step i
            t = t.replace(node_draft_logits=np.asarray(t.target_logits) + rng.normal(0, 0.3, (4, 6)).astype(np.float32))
        chain = t.replace(verification="token", tree_parent=None, node_draft_logits=None,
                          draft_logits=None if not model else np.asarray(t.node_draft_logits)[None, :3],
                          accept_uniforms=np.roll(np.asarray(t.accept_uniforms), -1))
        a, b = REF(t), REF(chain)
        assert (a.sampled == b.sampled).all() and (a.num_sampled == b.num_sampled).all()
        m = int(a.num_sampled[0]) - 1
        assert a.accepted_nodes[0].tolist() == [*range(1, m + 1), *[-1] * (3 - m)]


def test_children_are_tried_in_order_and_a_duplicate_one_hot_sibling_is_rejected():
    # p of the root: token 1 almost surely; children 1 (dup of token 1 twice) then token 2
    x = np.full((4, 6), -30.0, np.float32)
    x[0, 1] = 10.0
    b = tree([[-1, 0, 0, 0]], [[0, 3, 1, 1]], target_logits=x, accept_uniforms=np.array([0.5, 0.5, 0.999, 0.5]))
    out, traces = REF.verify_with_trace(b)
    assert out.accepted_nodes[0, 0] == 2  # node 1 (token 3) rejected, node 2 (token 1) accepted
    tried = [d.row for d in traces[0].decisions if d.kind == "accept" and d.step == 0]
    assert tried == [1, 2]
    # the first token-1 child rejected (u just below 1 > p(1)): the duplicate has p~(1) = 0 and is rejected too
    b = b.replace(accept_uniforms=np.array([0.5, 0.5, 1 - 2.0**-52, 0.5]), target_logits=np.where(
        np.arange(6) == 2, np.float32(9.0), x).astype(np.float32))
    out, traces = REF.verify_with_trace(b)
    acc = [(d.row, d.accepted) for d in traces[0].decisions if d.kind == "accept"]
    assert acc[1:] == [(2, False), (3, False)] and out.num_sampled[0] == 1


def test_a_padded_child_is_skipped_and_a_leaf_emits_the_bonus():
    b = tree([[-1, 0, 0]], [[0, -1, 2]], accept_uniforms=np.array([0.5, 0.5, 2.0**-50]))
    out, traces = REF.verify_with_trace(b)
    assert out.accepted_nodes[0].tolist() == [2, -1, -1] and out.num_sampled[0] == 2
    assert [d.row for d in traces[0].decisions if d.kind == "accept"] == [2]
    assert traces[0].decisions[-1].kind == "argmax" and not any(d.kind == "residual" for d in traces[0].decisions)


def test_per_node_coin_on_a_bound_accepts_the_next_sibling():
    """SPEC 4c's per_node layout: the k-th tried child is accepted iff S_{k-1} <= U < S_k."""
    b = tree([[-1, 0, 0, 0]], [[0, 4, 1, 4]])
    p = node_probs(b.target_logits[0])
    for coin, want in ((p[4] * 0.5, 1), (p[4], 2), (p[4] + p[1], None)):
        out, traces = PER_NODE.verify_with_trace(b.replace(accept_uniforms=np.array([coin, 0.5, 0.5, 0.5])))
        got = int(out.accepted_nodes[0, 0]) if out.num_sampled[0] > 1 else None
        assert got == want
        margins = [d.margin for d in traces[0].decisions if d.kind == "accept"]
        if coin == p[4]:
            assert margins == [0.0, 0.0]  # on the bound: both decisions at zero margin
    # the duplicate (node 3, token 4) has an empty interval: never accepted
    out = PER_NODE(b.replace(accept_uniforms=np.array([p[4] + p[1] + 1e-9, 0.5, 0.5, 0.5])))
    assert out.num_sampled[0] == 1


def test_without_replacement_removes_the_tried_siblings_from_q():
    b = tree([[-1, 0, 0]], [[0, 1, 2]], model=True, kind="without_replacement", temps=(1.0,))
    _, traces = REF.verify_with_trace(b.replace(accept_uniforms=np.array([0.5, 1 - 2.0**-52, 2.0**-52])))
    q = np.exp(np.asarray(b.node_draft_logits[0], np.float64))
    q /= q.sum()
    acc = [d for d in traces[0].decisions if d.kind == "accept"]
    # the second child's q~(2) = Q(2) / (1 - Q(1)): its margin carries that log q~
    p = np.exp(np.asarray(b.target_logits[0], np.float64))
    p /= p.sum()
    r = np.maximum(p - q, 0)
    r /= r.sum()
    want = np.log(r[2]) - np.log(q[2] / (1 - q[1])) - np.log(2.0**-52)
    assert acc[1].margin == pytest.approx(want, rel=1e-12)


def test_a_sibling_after_q_is_exhausted_is_free_and_leaves_the_residual():
    """Without replacement, a child after its siblings took all of Q's mass has q~ = 0 (0 / 0 renormalised):
    its test is free (SPEC 4c) and, rejected, it leaves p~ as it was: no NaN reaches the emitted token."""
    nd = np.array([[1.0, -np.inf, -np.inf]] + [[0.0, 0.0, 0.0]] * 2, np.float32)
    b = tree([[-1, 0, 0]], [[0, 0, 1]], v=3, model=True, kind="without_replacement", node_draft_logits=nd,
             accept_uniforms=np.array([0.5, 1 - 2.0**-52, 0.5]))
    out, traces = REF.verify_with_trace(b)
    acc = [d for d in traces[0].decisions if d.kind == "accept"]
    assert acc[0].accepted is False and acc[1].what == FREE and acc[1].margin == np.inf
    assert not any(np.isnan(d.margin) for d in traces[0].decisions if d.margin is not None)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(tree_batches(sampling_params=("min_p", "top_k", "top_p")))
def test_the_reference_verifies_drawn_trees_chunked_as_whole(b):
    validate(b)
    full = REF(b)
    for cap in (1, 2, 5):
        part = verify_chunked(b, REF, cap)
        assert (part.sampled == full.sampled).all() and (part.accepted_nodes == full.accepted_nodes).all()
