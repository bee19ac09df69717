"""A float32 NumPy tree-verifying sampler (SPEC 4c) of the `explicit` stream family (SPEC 3c).

Written only against rs-verify's public types, as an engine's own tree verifier would be: recursive
rejection sampling over each node's children in node order, the acceptance test `u * q~(x) < p~(x)`,
the residual `max(p~ - Q~, 0)` renormalised after each rejected child (without replacement: `Q` with
the tried siblings' tokens removed and renormalised), the last token by Gumbel-max over `p~` (or the
bonus over `p_n`). `uniforms="per_node"` is SGLang's layout: one coin per parent node against the
running sums of `p_n` over the siblings' distinct tokens (one-hot trees). No sampling parameters, no
logprobs (undefined for trees), token and tree batches only; token batches verify as a chain of
one-hot or model drafts would not: it declares tree verification besides the baseline and answers a
token batch by SPEC 4 itself (`_chain`).

Planted defects, each a known way to get tree verification wrong, that the suite must catch:
- `residual="kept"`: after a rejected child `p~` is left as it was (no residual update), so a later
  sibling is accepted with the wrong probability and the final token is drawn from `p_n`;
- `siblings="repeated"` (per node): a repeated sibling's token is counted again in the bounds (SGLang's
  kernel; declared, it is the `tree_duplicate_siblings` deviation);
- `bonus="raw"`: an accepted leaf's bonus from the softmax of the raw logits, and so a chain's after an
  accepted draft (EAGLE 1.2.1; declared, it is `tree_bonus_unprocessed`).

Gate it with:  pytest -p rs_verify --rs-sampler=examples.tree_sampler:TreeSampler
"""

from __future__ import annotations

import numpy as np

from rs_verify import SamplerOutput, SpecBatch, validate

__all__ = ["TreeSampler", "forgets_residual", "per_node", "per_node_repeated", "raw_bonus", "undeclared_raw_bonus",
           "undeclared_repeated_siblings"]

_F32 = np.float32


def _processed(x: np.ndarray, t: float) -> np.ndarray:
    x = np.asarray(x, _F32)
    return x if t in (0.0, 1.0) else np.divide(x, _F32(t), dtype=_F32)


def _softmax(z: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(z - z.max(), dtype=_F32)
    return (e / e.sum(dtype=_F32)).astype(_F32)


class TreeSampler:
    streams = "explicit"
    supports_logprobs = False
    supports_chunking = False
    draft_modes = frozenset({"one_hot"})
    verification_methods = frozenset({"token", "tree"})

    def __init__(self, uniforms: str = "per_child", *, residual: str = "updated", siblings: str = "distinct",
                 bonus: str = "processed", deviations=()):
        self.tree_uniforms = uniforms
        self.tree_drafts = frozenset({"one_hot"} if uniforms == "per_node" else {"one_hot", "iid", "without_replacement"})
        self.residual, self.siblings, self.bonus = residual, siblings, bonus
        self.deviations = frozenset(deviations)
        self.name = f"tree-{uniforms}" + ("" if residual == "updated" else f"-{residual}-residual") + (
            "" if siblings == "distinct" else f"-{siblings}-siblings") + ("" if bonus == "processed" else f"-{bonus}-bonus")

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        validate(batch)
        for field in ("accept_uniforms", "resample_gumbel"):
            if getattr(batch, field) is None:
                raise ValueError(f"{field}: the explicit family reads it, and the batch carries none")
        k = batch.num_speculative_steps
        cu = np.asarray(batch.cu_num_logits, np.int64)
        sampled = np.full((batch.num_reqs, k + 1), -1, np.int64)
        nodes = np.full((batch.num_reqs, k), -1, np.int32)
        num = np.zeros(batch.num_reqs, np.int32)
        tree = batch.verification == "tree"
        for r in range(batch.num_reqs):
            path, tokens = (self._tree if tree else self._chain)(batch, r, int(cu[r]), int(cu[r + 1]))
            sampled[r, : len(tokens)] = tokens
            nodes[r, : len(path)] = path
            num[r] = len(tokens)
        return SamplerOutput(sampled=sampled, num_sampled=num, accepted_nodes=nodes if tree else None)

    # -- SPEC 4 (one-hot drafts): a chain -------------------------------------------------

    def _chain(self, batch, r, lo, hi):
        t = float(batch.temperature[int(batch.idx_mapping[r])])
        vp = batch.effective_vocab_size
        g = np.asarray(batch.resample_gumbel[r], _F32)
        out = []
        for j in range(lo, hi):
            z = _processed(batch.target_logits[j, :vp], t)
            d = int(batch.draft_token_ids[j + 1]) if j + 1 < hi else -1
            if t == 0:
                a = int(np.argmax(z))
                out.append(a)
                if d != a:
                    return [], out
                continue
            p = _softmax(z)
            if j + 1 < hi and 0 <= d < vp and _F32(batch.accept_uniforms[j]) < p[d]:
                out.append(d)
                continue
            w = p.copy()
            if j + 1 < hi and 0 <= d < vp:
                w[d] = 0
                w = w if w.sum() > 0 else p
            elif j > lo and self.bonus == "raw":  # a chain is a tree (SPEC 4c): it ends on an accepted draft
                w = _softmax(np.asarray(batch.target_logits[j, :vp], _F32))
            with np.errstate(divide="ignore"):
                out.append(int(np.argmax(np.log(w) + g)))
            return [], out
        return [], out

    # -- SPEC 4c --------------------------------------------------------------------------

    def _tree(self, batch, r, lo, hi):
        t = float(batch.temperature[int(batch.idx_mapping[r])])
        vp = batch.effective_vocab_size
        parents = np.asarray(batch.tree_parent[lo:hi])
        tokens = np.asarray(batch.draft_token_ids[lo:hi])
        kids = [[c for c in range(1, hi - lo) if parents[c] == n] for n in range(hi - lo)]
        n, path = 0, []
        while True:
            z = _processed(batch.target_logits[lo + n, :vp], t)
            if t == 0:
                a = int(np.argmax(z))
                nxt = next((c for c in kids[n] if tokens[c] == a), None)
                if nxt is None:
                    return path, [*(int(tokens[c]) for c in path), a]
                path.append(nxt)
                n = nxt
                continue
            p = _softmax(z)
            real = [c for c in kids[n] if 0 <= tokens[c] < vp]
            accepted, emit_from = (self._per_node if self.tree_uniforms == "per_node" else self._per_child)(
                batch, lo, n, real, tokens, p, t, vp)
            if accepted is not None:
                path.append(accepted)
                n = accepted
                continue
            if not real and path and self.bonus == "raw":
                emit_from = _softmax(np.asarray(batch.target_logits[lo + n, :vp], _F32))
            g = np.asarray(batch.resample_gumbel[r], _F32)
            with np.errstate(divide="ignore"):
                token = int(np.argmax(np.log(emit_from) + g))
            return path, [*(int(tokens[c]) for c in path), token]

    def _per_child(self, batch, lo, n, real, tokens, p, t, vp):
        """`(accepted child or None, the distribution the last token is drawn from)`."""
        nd = batch.node_draft_logits
        q = None if nd is None else _softmax(_processed(nd[lo + n, :vp], t))
        wr = nd is not None and batch.tree_drafts == "without_replacement"
        pt, removed = p.copy(), []
        for c in real:
            x = int(tokens[c])
            if q is None:
                qt = np.zeros(vp, _F32)
                qt[x] = 1
            elif wr:
                qt = q.copy()
                qt[removed] = 0
                qt = (qt / (_F32(1) - q[sorted(set(removed))].sum(dtype=_F32))).astype(_F32)
            else:
                qt = q
            if _F32(batch.accept_uniforms[lo + c]) * qt[x] < pt[x]:
                return c, None
            removed.append(x)
            if self.residual == "kept":
                continue
            res = np.maximum(pt - qt, 0).astype(_F32)
            s = res.sum(dtype=_F32)
            pt = (res / s).astype(_F32) if s > 0 else np.zeros(vp, _F32)
        return None, pt if real and pt.sum() > 0 else p

    def _per_node(self, batch, lo, n, real, tokens, p, t, vp):
        coin = _F32(batch.accept_uniforms[lo + n])
        seen, total, prev = set(), _F32(0), _F32(0)
        for c in real:
            x = int(tokens[c])
            if x not in seen or self.siblings == "repeated":
                total = _F32(total + p[x])
            seen.add(x)
            if prev <= coin < total:
                return c, None
            prev = total
        w = p.copy()
        w[sorted(seen)] = 0
        return None, w if w.sum() > 0 else p


def per_node():
    return TreeSampler("per_node")


def forgets_residual():
    """A defect: a rejected child leaves `p~` unchanged."""
    return TreeSampler(residual="kept")


def per_node_repeated(declared: bool = True):
    """SGLang's layout with its repeated-sibling bounds, declared as `tree_duplicate_siblings` (SPEC 11)."""
    return TreeSampler("per_node", siblings="repeated", deviations={"tree_duplicate_siblings"} if declared else ())


def raw_bonus(declared: bool = True):
    """EAGLE's raw-softmax leaf bonus, declared as `tree_bonus_unprocessed` (SPEC 11)."""
    return TreeSampler(bonus="raw", deviations={"tree_bonus_unprocessed"} if declared else ())


def undeclared_repeated_siblings():
    """`per_node_repeated` without its declaration: certification must fail on a repeated sibling."""
    return per_node_repeated(declared=False)


def undeclared_raw_bonus():
    """`raw_bonus` without its declaration: certification must fail on a leaf's bonus."""
    return raw_bonus(declared=False)
