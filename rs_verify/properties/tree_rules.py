"""The output rules of a tree batch (SPEC 4c and 5), checked wherever the suite receives an output:
`accepted_nodes` int32 `[R, K]` names a root path of the request's tree (each node the child of the one
before, the first a child of the root, no padded child), `-1` after it; `num_sampled` is the path's
length plus one; `sampled` holds the path's tokens then one more, then `-1`; every accepted token and
the emitted one lie in `[0, V')` with `p > 0` in their parent's row and are not clearly masked (SPEC 2);
after the children of a one-hot node were all tried, the emitted token is none of theirs unless `p_n`
has no mass elsewhere. A declared `"tree_bonus"` deviation (SPEC 11) lets the bonus of a path ending on
an accepted node take a token the sampling parameters mask (its raw softmax ignores them).
"""

from __future__ import annotations

import numpy as np

from ..contract.deviations import applied
from ..contract.tree import children
from ..harness.failure import PropertyFailure

__all__ = ["check_tree_invariants"]


def check_tree_invariants(batch, out, deviations, masked, fail_request) -> None:
    """Raise PropertyFailure unless `out` meets SPEC 4c's output rules on tree batch `batch`; `masked`: the
    clearly masked tokens and why (`output_rules._clearly_masked`), `fail_request` how a request fails."""
    dev = applied(deviations)
    k = batch.num_speculative_steps
    nodes = out.accepted_nodes
    if nodes is None or np.shape(nodes) != (batch.num_reqs, k):
        raise PropertyFailure(f"accepted_nodes = {None if nodes is None else list(np.shape(nodes))}: SPEC 5 wants "
                              f"int32 [R, K] = [{batch.num_reqs}, {k}] for a tree batch", batch=batch)
    v = batch.effective_vocab_size
    cu = np.asarray(batch.cu_num_logits, np.int64)
    finite = np.isfinite(np.asarray(batch.target_logits)[:, :v])
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, np.int64)]
    bonus_rule = dev.at("tree_bonus") is not None
    for r in range(batch.num_reqs):
        lo, size = int(cu[r]), int(cu[r + 1] - cu[r])
        parents = np.asarray(batch.tree_parent[lo : lo + size], np.int64)
        tokens = np.asarray(batch.draft_token_ids[lo : lo + size])
        m = int(out.num_sampled[r])
        if not 1 <= m <= k + 1:
            fail_request(batch, r, f"num_sampled = {m} outside [1, K + 1 = {k + 1}]")
        path = [int(c) for c in nodes[r, : m - 1]]
        if (nodes[r, m - 1 :] != -1).any():
            fail_request(batch, r, f"accepted_nodes[{m - 1}:] = {nodes[r, m - 1:].tolist()} must be -1 padding "
                                   f"(num_sampled {m}: a path of {m - 1} nodes)")
        row = out.sampled[r]
        if (row[m:] != -1).any():
            fail_request(batch, r, f"sampled[{m}:] = {row[m:].tolist()} must be -1 padding")
        prev = 0
        for i, c in enumerate(path):
            if not 1 <= c < size or int(parents[c]) != prev:
                fail_request(batch, r, f"accepted_nodes {path} is not a root path of the tree: node {c} at depth "
                                       f"{i + 1} is not a child of node {prev} (tree_parent {parents.tolist()})", step=i)
            if not 0 <= int(tokens[c]) < v:
                fail_request(batch, r, f"accepted node {c} is a padded child (token {tokens[c]})", step=i)
            if int(row[i]) != int(tokens[c]):
                fail_request(batch, r, f"sampled[{i}] = {row[i]} but accepted node {c} holds token {tokens[c]}",
                             step=i)
            _check_token(batch, r, i, lo + prev, int(tokens[c]), finite, masked, v, "accepted", fail_request)
            prev = c
        t = int(row[m - 1])
        kids = [c for c in children(parents)[prev] if 0 <= int(tokens[c]) < v]
        ruled = bonus_rule and path and not kids and temps[r] > 0
        _check_token(batch, r, m - 1, lo + prev, t, finite, None if ruled else masked, v, "emitted", fail_request)
        if temps[r] > 0 and kids and batch.node_draft_logits is None:  # every one-hot child was rejected
            tried = {int(tokens[c]) for c in kids}
            others = finite[lo + prev].copy()
            others[list(tried)] = False
            if masked is not None:
                others &= ~masked[0][lo + prev]
            if t in tried and others.any():
                fail_request(batch, r, f"after rejecting the children {sorted(tried)} of node {prev}, the emitted "
                                       f"token {t} is one of theirs (SPEC 4c: p~ excludes them)", step=m - 1)


def _check_token(batch, r, i, j, t, finite, masked, v, what, fail_request) -> None:
    if not 0 <= t < v:
        fail_request(batch, r, f"step {i} {what} token {t} outside [0, V' = {v})", step=i)
    if not finite[j, t]:
        fail_request(batch, r, f"step {i} {what} token {t} with p = 0 in node row {j} (logit "
                               f"{batch.target_logits[j, t]})", step=i)
    if masked is not None and masked[0][j, t]:
        fail_request(batch, r, f"step {i} {what} token {t}, which {masked[1][j][t]} masks in node row {j} "
                               "(SPEC section 2)", step=i)
