"""Tree verification's batch layout (SPEC 4c): validation of `tree_parent`, `node_draft_logits` and
`tree_drafts`, and the tree helpers every layer reads (children in trying order, depths, paths).

The rows of request `r` are its nodes: row `cu[r] + i` is node `i`, node 0 the root; `tree_parent` holds
local parent indices, `-1` at the root and `0 <= parent < i` elsewhere (parents precede children, so a
request's rows are one tree); a node's depth is at most `K`. Imports only the batch contract.
"""

from __future__ import annotations

import numpy as np

from .batch import TREE_DRAFTS, SpecBatch

__all__ = ["check_layout", "check_structure", "children", "depths", "distinct_bounds", "global_parents",
           "greedy_tokens", "node_probs", "parent_rows", "root_path"]


def check_structure(batch: SpecBatch, check_array, fail) -> None:
    """Dtypes and shapes (SPEC 1 and 4c): a tree batch carries `tree_parent` int32 `[N]`, no
    `draft_logits`, optional `node_draft_logits` float32 `[N, Vd]` (`1 <= Vd <= V`), a known `tree_drafts`
    and no logprobs; any other batch carries neither tree field."""
    if batch.tree_drafts not in TREE_DRAFTS:
        fail("tree_drafts", None, f"unknown kind {batch.tree_drafts!r}; expected one of {TREE_DRAFTS}")
    if not batch.tree:
        for name in ("tree_parent", "node_draft_logits"):
            if getattr(batch, name) is not None:
                fail(name, None, f"only a tree batch (verification 'tree', SPEC 4c) carries it; this one verifies "
                                 f"{batch.verification!r}")
        return
    n, v = batch.target_logits.shape
    if batch.tree_parent is None:
        fail("tree_parent", None, "a tree batch (SPEC 4c) needs each node's parent")
    check_array(batch, "tree_parent", np.int32, (n,))
    if batch.draft_logits is not None:
        fail("draft_logits", None, "a tree batch takes its draft distributions from node_draft_logits (SPEC 4c)")
    if batch.node_draft_logits is not None:
        nd = check_array(batch, "node_draft_logits", np.float32, (n, None))
        if nd.shape[1] < 1:
            fail("node_draft_logits", None, "draft vocab size must be >= 1")
        if nd.shape[1] > v:
            fail("node_draft_logits", None, f"draft vocab {nd.shape[1]} exceeds target vocab {v}")
    if batch.num_logprobs is not None:
        fail("num_logprobs", None, "logprobs are not defined for tree batches (SPEC 4c)")


def _row_requests(cu: np.ndarray, n: int) -> np.ndarray:
    return np.repeat(np.arange(cu.shape[0] - 1), np.diff(cu)) if n else np.zeros(0, np.int64)


def check_layout(batch: SpecBatch, fail) -> None:
    """Parents precede children (`-1` at each request's root, `0 <= parent < i` elsewhere) and every
    depth is at most `K` (SPEC 4c); after `cu_num_logits` itself is checked."""
    cu = np.asarray(batch.cu_num_logits, np.int64)
    parent = np.asarray(batch.tree_parent, np.int64)
    n = parent.shape[0]
    req = _row_requests(cu, n)
    local = np.arange(n) - cu[req]
    root = local == 0
    bad = np.flatnonzero(root & (parent != -1))
    if bad.size:
        fail("tree_parent", int(bad[0]), f"the root of request {req[bad[0]]} has parent {parent[bad[0]]}, not -1")
    bad = np.flatnonzero(~root & ((parent < 0) | (parent >= local)))
    if bad.size:
        j = int(bad[0])
        fail("tree_parent", j, f"node {local[j]} of request {req[j]} has parent {parent[j]}: parents precede "
                               f"their children (0 <= parent < {local[j]})")
    d = depths(batch)
    k = batch.num_speculative_steps
    bad = np.flatnonzero(d > k)
    if bad.size:
        j = int(bad[0])
        fail("tree_parent", j, f"node {local[j]} of request {req[j]} has depth {d[j]} > K = {k}")


def global_parents(batch: SpecBatch) -> np.ndarray:
    """Each row's parent as a global row (the root: itself), int64 `[N]`."""
    cu = np.asarray(batch.cu_num_logits, np.int64)
    parent = np.asarray(batch.tree_parent, np.int64)
    req = _row_requests(cu, parent.shape[0])
    return np.where(parent < 0, np.arange(parent.shape[0]), cu[req] + np.maximum(parent, 0))


def depths(batch: SpecBatch) -> np.ndarray:
    """Each node's depth (the root's 0), int64 `[N]`, by pointer jumping; capped at `K + 1`."""
    gp = global_parents(batch)
    node = np.arange(gp.shape[0])
    d = np.zeros(gp.shape[0], np.int64)
    for _ in range(batch.num_speculative_steps + 1):
        up = gp[node] != node
        if not up.any():
            break
        d += up
        node = gp[node]
    return d


def parent_rows(batch: SpecBatch) -> np.ndarray:
    """The global rows that are some node's parent (their `node_draft_logits` row is read), sorted."""
    gp = global_parents(batch)
    return np.unique(gp[gp != np.arange(gp.shape[0])])


def children(parent_local) -> list[list[int]]:
    """Per local node of one request, its children's local indices in increasing order (the trying
    order of SPEC 4c)."""
    parent_local = [int(p) for p in parent_local]
    out: list[list[int]] = [[] for _ in parent_local]
    for i, p in enumerate(parent_local):
        if i and p >= 0:
            out[p].append(i)
    return out


def root_path(parent_local, node: int) -> list[int]:
    """The local nodes from the root's first child down to `node` (empty for the root)."""
    path = []
    while node > 0:
        path.append(node)
        node = int(parent_local[node])
    return path[::-1]


def node_probs(z32: np.ndarray) -> np.ndarray:
    """`p` of a processed float32 row in float64: `exp(z - max) / sum` (the per-node bounds' arithmetic)."""
    z = np.asarray(z32, np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max())
    return e / e.sum()


def distinct_bounds(p: np.ndarray, tokens) -> np.ndarray:
    """SPEC 4c's per-node bounds: `S_k`, the sum of `p` over the first `k` distinct tokens (float64 `[c]`,
    summed in trying order)."""
    seen, total, out = set(), 0.0, np.empty(len(tokens))
    for k, x in enumerate(tokens):
        if int(x) not in seen:
            seen.add(int(x))
            total += float(p[int(x)])
        out[k] = total
    return out


def greedy_tokens(batch: SpecBatch, r: int, argmax: np.ndarray) -> list[int]:
    """What greedy request `r` of a tree batch emits (SPEC 4c): at each node the first child whose token is
    the node row's argmax (`argmax`: per global row), then the argmax of the first level without one."""
    lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
    kids = children(batch.tree_parent[lo:hi])
    tokens = batch.draft_token_ids[lo:hi]
    n, out = 0, []
    while True:
        a = int(argmax[lo + n])
        out.append(a)
        n = next((c for c in kids[n] if int(tokens[c]) == a), None)
        if n is None:
            return out
