"""Shape checks of `rejection_sample`'s arguments: what memory safety needs even without validation."""

from ..contract.batch import TREE_DRAFTS, TREE_UNIFORMS
from ..contract.explicit import EXPLICIT, READS
from ..contract.methods import BLOCK, TOKEN, TREE

PER_CHILD, PER_NODE = TREE_UNIFORMS


def check_shapes(target_logits, draft_logits, draft_token_ids, cu_num_logits, pos, idx_mapping,
                 temperature, seeds, k, num_logprobs, logprobs_mode, params=(), verification="token"):
    """Shape checks that memory safety needs even without validation (no data is read)."""
    def bad(what):
        raise ValueError(what)

    if target_logits.dim() != 2:
        bad(f"target_logits: expected [N, V], got {list(target_logits.shape)}")
    n, v = target_logits.shape
    if v < 1:
        bad("target_logits: vocab size must be >= 1")
    if isinstance(k, bool) or int(k) < 0:
        bad(f"num_speculative_steps: expected an int >= 0, got {k!r}")
    if cu_num_logits.dim() != 1 or cu_num_logits.shape[0] < 1:
        bad("cu_num_logits: expected [R + 1]")
    r = cu_num_logits.shape[0] - 1
    s = temperature.shape[0]
    for name, t, shape in (("draft_token_ids", draft_token_ids, (n,)), ("pos", pos, (n,)),
                           ("idx_mapping", idx_mapping, (r,)), ("temperature", temperature, (s,))):
        if tuple(t.shape) != shape:
            bad(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if seeds.dim() != 1 or seeds.shape[0] < s:
        bad(f"seeds: expected shape [{s}], got {list(seeds.shape)}")
    for name, t in params:
        if t is not None and (t.dim() != 1 or t.shape[0] < s):
            bad(f"{name}: expected shape [{s}], got {list(t.shape)}")
    if r > 0 and s < 1:
        bad("temperature: no request states")
    if draft_logits is not None:
        if draft_logits.dim() != 3 or draft_logits.shape[0] < s or draft_logits.shape[1] != k:
            bad(f"draft_logits: expected [{s}, {k}, Vd], got {list(draft_logits.shape)}")
        if draft_logits.shape[2] < 1:
            bad("draft_logits: draft vocab size must be >= 1")
    if num_logprobs is not None and not 0 <= int(num_logprobs) <= v:
        bad(f"num_logprobs: expected None or an int in [0, {v}], got {num_logprobs!r}")
    if logprobs_mode not in ("raw", "processed"):
        bad(f"logprobs_mode: unknown mode {logprobs_mode!r}")
    if verification not in (TOKEN.name, BLOCK.name, TREE.name):
        bad(f"verification: unknown method {verification!r}")


def check_noise(explicit, resample, n, r, vocab, accept_uniforms, resample_gumbel, resample_uniforms):
    """The explicit family's noise tensors the kernels read (SPEC 3c), by shape: `accept_uniforms`
    [N], then `resample_gumbel` [R, V'] (Gumbel-max) or `resample_uniforms` [R] (inverse CDF); a
    missing one is a `ValueError` naming it. Returns the three, the ones not read as None (for
    another family: all None)."""
    if not explicit:
        return None, None, None
    given = {"accept_uniforms": (accept_uniforms, (n,)), "resample_gumbel": (resample_gumbel, (r, vocab)),
             "resample_uniforms": (resample_uniforms, (r,))}
    read = {name: given[name] for name in READS[resample]}
    for name, (t, shape) in read.items():
        if t is None:
            raise ValueError(f"{name}: the explicit stream family reads it (SPEC 3c), and none was given")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return tuple(read[name][0] if name in read else None
                 for name in ("accept_uniforms", "resample_gumbel", "resample_uniforms"))


def check_tree(target_logits, draft_logits, tree_parent, node_draft_logits, tree_drafts, tree_uniforms, accepted_nodes,
               k, num_logprobs, streams):
    """A tree batch's arguments (SPEC 4c), by shape: `tree_parent` [N], `node_draft_logits` [N, Vd] (1 <= Vd
    <= V) or None, `accepted_nodes` int32 [R, K] (the output), the explicit family, no `draft_logits`, no
    logprobs, a known `tree_drafts` and `tree_uniforms` (per node: one-hot trees only)."""
    def bad(what):
        raise ValueError(what)

    n, v = target_logits.shape
    if streams != EXPLICIT.name:
        bad(f"verification: tree verification uses the explicit stream family (SPEC 4c), not {streams!r}")
    if tree_parent is None or tuple(tree_parent.shape) != (n,):
        bad(f"tree_parent: expected shape [{n}], got {None if tree_parent is None else list(tree_parent.shape)}")
    if draft_logits is not None:
        bad("draft_logits: a tree batch takes its draft distributions from node_draft_logits (SPEC 4c)")
    if node_draft_logits is not None and (node_draft_logits.dim() != 2 or node_draft_logits.shape[0] != n
                                          or not 1 <= node_draft_logits.shape[1] <= v):
        bad(f"node_draft_logits: expected [{n}, Vd] with 1 <= Vd <= {v}, got {list(node_draft_logits.shape)}")
    if tree_drafts not in TREE_DRAFTS:
        bad(f"tree_drafts: unknown kind {tree_drafts!r}; expected one of {TREE_DRAFTS}")
    if tree_uniforms not in TREE_UNIFORMS or (tree_uniforms == PER_NODE and node_draft_logits is not None):
        bad(f"tree_uniforms: {tree_uniforms!r} with {'model' if node_draft_logits is not None else 'one-hot'} drafts; "
            f"one of {TREE_UNIFORMS}, per_node for one-hot trees only (SPEC 4c)")
    if num_logprobs is not None:
        bad("num_logprobs: logprobs are not defined for tree batches (SPEC 4c)")
    r_k = None if accepted_nodes is None else (tuple(accepted_nodes.shape), accepted_nodes.dtype)
    if accepted_nodes is None or r_k[0][1:] != (int(k),) or str(r_k[1]) != "torch.int32":
        bad(f"accepted_nodes: a tree batch needs an int32 [R, {int(k)}] output tensor, got {r_k}")
