"""Ragged tree batches (SPEC 4c): `tree_batches`.

Structure is drawn by Hypothesis (so it shrinks: towards one request, a star of one child at the root,
`T = 1`, float32, a tiny vocabulary, no parameters, no edge), contents by NumPy from a content seed:

- shapes per request: chains, stars, deep trees (depth `K`), bushy trees (many children per node) and
  random trees; a node's depth is at most `K`, and a request may hold more than `K + 1` nodes;
- draft kinds, one per batch, uniform over those allowed (drawn from the content seed: a structural
  draw leaned to the first kind, 30 of 33 tree batches one-hot at ci): `"one_hot"` (no node draft logits; children are the
  parent's top tokens or random ones, duplicate siblings included), `"iid"` (each child an independent
  draw from its parent's `Q`) and `"without_replacement"` (children drawn without replacement, in
  sampling order: Gumbel top-k); `Q` lies close to the parent's `p`, so acceptance decisions are near `u`;
- padded children (`-1`) after a node's drawn ones, greedy and stochastic requests mixed (a greedy
  request's tree holds its argmax path most of the time), per-state sampling parameters;
- the edges (each drawn for some batches): a sibling with `q~(x) = 0` (its token's draft logit `-inf`),
  an empty residual after the last sibling (the parent's `p` equal to its `Q` and the child's token
  excluded by both), for drafts without replacement a second sibling's uniform between `p~(x) / q~(x)`
  and `p~(x) / Q(x)` (the renormalised `Q~` decides it; at the shallowest branching node, the path down
  to it accepted), and, for one coin per node, the coin exactly on a bound `S_k`;
- for one coin per node, coins in the middle of a later sibling's interval `[S_{k-1}, S_k)`, `k >= 2`
  (repeated tokens included), or past the last one: the running sums decide;
- the explicit noise (SPEC 3c): all three fields, multiples of `2**-53`.

Imports only NumPy, Hypothesis and the contract.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
from hypothesis import event, strategies as st
from hypothesis.errors import InvalidArgument

from rs_verify.contract.batch import LOGITS_DTYPES, SAMPLING_PARAMS, TREE_DRAFT_KINDS, TREE_UNIFORMS, SpecBatch
from rs_verify.contract.methods import TREE
from rs_verify.contract.probs import target_probs
from rs_verify.contract.tree import children

from rs_verify.contract.logit_bound import checked as checked_bound

from .logits import magnitude_bound, round_to_dtype
from .tree_plants import (_plant_coin, _plant_empty_residual, _plant_later_coin, _plant_q_zero, _plant_renormalised,
                          _processed_q)

__all__ = ["SHAPES", "TREE_EDGES", "tree_batches"]

SHAPES = ("star", "chain", "deep", "bushy", "random")
TREE_EDGES = ("q_zero_sibling", "empty_residual", "coin_on_bound", "renormalised_q")
# Shares of the content draws (per batch): each edge is planted in about one batch in four.
EDGE_SHARE = 0.25
PAD_SHARE = 0.3  # a node's children followed by a padded child
DUPLICATE_SHARE = 0.5  # one-hot trees: a sibling repeats an earlier sibling's token
GREEDY_PATH_SHARE = 0.7  # a greedy request's child carries its parent's argmax
RENORMALISED_SHARE = 0.75  # without replacement: batches with the second-sibling plant (besides the edge's share)
LATER_COIN_SHARE = 0.75  # one coin per node: batches whose coins decide a later sibling (or none of them)
CLOSE_SIGMA = (0.05, 1.5)  # Q's logits: p's plus Gaussian noise of this (log-uniform) scale


def _unit(rng, shape) -> np.ndarray:
    """Uniforms in (0, 1), multiples of 2**-53 (exact in float64)."""
    return rng.integers(1, 2**53, size=shape, dtype=np.int64).astype(np.float64) * 2.0**-53


def _parents(draw, shape: str, size: int, k: int) -> list[int]:
    """Local parents of a tree of `size` nodes and depth at most `k` (Hypothesis draws, shrinking to a star)."""
    parent, depth = [-1], [0]
    for i in range(1, size):
        if shape == "star":
            p = 0
        elif shape == "chain":
            p = i - 1
        elif shape == "deep":  # the deepest node that may still take a child, then anything
            deepest = max((n for n in range(i) if depth[n] < k), key=lambda n: (depth[n], n))
            p = deepest if draw(st.integers(0, 3)) else draw(st.integers(0, i - 1))
        elif shape == "bushy":
            p = draw(st.integers(0, min(i - 1, 2)))
        else:
            p = draw(st.integers(0, i - 1))
        while depth[p] >= k:  # SPEC 4c: depth at most K (its parent's depth is below it)
            p = parent[p]
        parent.append(p)
        depth.append(depth[p] + 1)
    return parent


def _sizes(shape: str, k: int, max_nodes: int) -> tuple[int, int]:
    """Bounds of a request's node count for `shape`."""
    if shape == "chain":
        return 1, k + 1
    return 1, max(2, max_nodes)


@st.composite
def _tree_batches(draw, cfg) -> SpecBatch:
    R = draw(st.integers(cfg["min_reqs"], cfg["max_reqs"]))
    K = draw(st.integers(1, cfg["max_spec_steps"]))
    shapes = [draw(st.sampled_from(SHAPES)) for _ in range(R)]
    parents = []
    for shape in shapes:
        lo, hi = _sizes(shape, K, cfg["max_nodes"])
        parents.append(_parents(draw, shape, draw(st.integers(lo, hi)), K))
    V = draw(st.sampled_from(cfg["vocab_sizes"]))
    Vd = V if V < 2 or draw(st.integers(0, 5)) else draw(st.integers(1, V - 1))  # model drafts only
    dtype = draw(st.sampled_from(cfg["dtypes"]))
    temp_kinds = [draw(st.sampled_from(cfg["temperatures"])) for _ in range(R)]
    if all(t == "greedy" for t in temp_kinds) and len(cfg["temperatures"]) > 1:
        temp_kinds[-1] = next(t for t in cfg["temperatures"] if t != "greedy")
    params_on = bool(cfg["sampling_params"]) and draw(st.integers(0, 3)) == 0
    seeds = [draw(st.integers(-(2**63), 2**63 - 1)) for _ in range(R)]
    structure = (R, K, shapes, parents, V, Vd, dtype, temp_kinds, params_on, cfg["tree_uniforms"], cfg["tree_drafts"])
    rng = np.random.default_rng([draw(st.integers(0, 2**32 - 1)), zlib.crc32(repr(structure).encode())])
    # The draft kind is content, uniform over the allowed kinds: a structural draw is shared by the
    # families of examples Hypothesis's generate phase builds by mutation and leans to the first kind
    # (measured at ci on the Triton sampler: 30 of 33 tree batches one-hot, 2 without replacement).
    kind = cfg["tree_drafts"][int(rng.integers(len(cfg["tree_drafts"])))]
    Vd = Vd if kind != "one_hot" else V
    return _contents(rng, cfg, R, K, shapes, parents, V, kind, Vd, dtype, temp_kinds, params_on, seeds)


def _temperature(rng, kind: str) -> float:
    return {"greedy": 0.0, "one": 1.0}.get(kind) if kind != "random" else float(rng.choice([0.25, 0.5, 0.7, 1.5, 2.0]))


def _contents(rng, cfg, R, K, shapes, parents, V, kind, Vd, dtype, temp_kinds, params_on, seeds) -> SpecBatch:
    model = kind != "one_hot"
    vp = V if Vd is None or not model else min(V, Vd)
    sizes = [len(p) for p in parents]
    cu = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    N = int(cu[-1])
    temps = np.array([_temperature(rng, t) for t in temp_kinds], np.float32)
    scale = np.exp(rng.uniform(np.log(0.5), np.log(6.0), R))
    target = round_to_dtype((rng.standard_normal((N, V)) * np.repeat(scale, sizes)[:, None]).astype(np.float32), dtype)
    nd = None
    if model:
        sigma = np.exp(rng.uniform(*np.log(CLOSE_SIGMA), N))[:, None]
        nd = round_to_dtype((target[:, :Vd] + rng.standard_normal((N, Vd)) * sigma).astype(np.float32), dtype)
    if cfg["logit_bound"] is not None:  # SPEC 10: every processed logit of a request within the bound
        for r in range(R):
            b = np.float32(magnitude_bound(dtype, float(temps[r]), cfg["logit_bound"]))
            for rows in (target, nd) if model else (target,):
                rows[cu[r] : cu[r + 1]] = np.clip(rows[cu[r] : cu[r + 1]], -b, b)
    tokens = np.full(N, -1, np.int64)
    tokens[cu[:-1]] = rng.integers(0, vp, R)  # the root's token: unused
    edges = set(e for e in TREE_EDGES if rng.random() < EDGE_SHARE)
    planted = []
    for r in range(R):
        lo, kids = int(cu[r]), children(parents[r])
        for n, cs in enumerate(kids):
            if not cs:
                continue
            j = lo + n
            toks = _child_tokens(rng, kind, target[j, :vp], None if nd is None else nd[j, :vp], temps[r], len(cs))
            if temps[r] == 0 and rng.random() < GREEDY_PATH_SHARE:
                a, at = int(np.argmax(target[j, :vp])), int(rng.integers(len(cs)))
                if kind != "without_replacement" or a not in toks:  # siblings drawn without replacement stay distinct
                    toks[at] = a
            if len(cs) >= 2 and rng.random() < PAD_SHARE:
                toks[-1] = -1  # a padded child after the drawn ones
            tokens[lo + np.asarray(cs)] = toks
    if "q_zero_sibling" in edges and model:
        planted += _plant_q_zero(rng, cu, parents, tokens, nd, vp, temps)
    if "empty_residual" in edges and model:
        planted += _plant_empty_residual(rng, cu, parents, tokens, target, nd, vp, temps, params_on)
    S = R
    params = _params(rng, S, vp, temps, cfg["sampling_params"]) if params_on else {}
    accept = _unit(rng, N)
    renormalised = kind == "without_replacement" and ("renormalised_q" in edges or rng.random() < RENORMALISED_SHARE)
    later_coin = cfg["tree_uniforms"] == "per_node" and not model and rng.random() < LATER_COIN_SHARE
    if "coin_on_bound" in edges and cfg["tree_uniforms"] == "per_node" and not model:
        planted += _plant_coin(rng, cu, parents, tokens, target, vp, temps, params_on, accept)
    pos = np.concatenate([rng.integers(0, 2**40) + np.arange(s) for s in sizes]).astype(np.int64)
    batch = SpecBatch(
        target_logits=target, draft_logits=None, draft_token_ids=tokens, cu_num_logits=cu.astype(np.int32), pos=pos,
        idx_mapping=np.arange(R, dtype=np.int32), temperature=temps, seeds=np.array(seeds, np.int64),
        num_speculative_steps=K, logits_dtype=dtype, verification=TREE.name,
        tree_parent=np.concatenate([np.asarray(p, np.int32) for p in parents]),
        node_draft_logits=nd, tree_drafts=kind if model else "iid",
        accept_uniforms=accept, resample_gumbel=-np.log(-np.log(_unit(rng, (R, vp)))),
        resample_uniforms=_unit(rng, R), **params)
    if renormalised or later_coin:  # aimed at p with the sampling parameters applied (SPEC 2, 4c)
        p_rows = target_probs(batch)
        plant = _plant_renormalised if renormalised else _plant_later_coin
        planted += plant(rng, cu, parents, tokens, p_rows, nd, vp, temps, accept)
        batch = batch.replace(draft_token_ids=tokens, accept_uniforms=accept)
    event(f"tree drafts: {kind}")
    for shape in sorted(set(shapes)):
        event(f"tree shape: {shape}")
    for what in sorted(set(planted)):
        event(f"tree edge: {what}")
    if any(t == 0 for t in temps) and any(t > 0 for t in temps):
        event("tree: greedy and stochastic requests mixed")
    if params_on:
        event("tree: sampling parameters")
    if any(len(p) > K + 1 for p in parents):
        event("tree: more nodes than K + 1")
    return batch


def _child_tokens(rng, kind, p_row, q_row, t, c) -> np.ndarray:
    """`c` children's tokens drawn as `kind` declares (SPEC 4c)."""
    vp = p_row.shape[0]
    if kind == "one_hot":  # the parent's top tokens (EAGLE/SGLang top-k) or random ones, duplicates included
        top = np.argsort(-p_row.astype(np.float64), kind="stable")
        toks = np.resize(top[:c], c) if rng.random() < 0.5 else rng.integers(0, vp, c)
        toks = toks.astype(np.int64)
        if c >= 2 and rng.random() < DUPLICATE_SHARE:
            toks[int(rng.integers(1, c))] = toks[0]
        return toks
    q = _processed_q(q_row, t if t > 0 else 1.0)
    if kind == "iid":
        return rng.choice(vp, size=c, p=q).astype(np.int64)
    with np.errstate(divide="ignore"):  # Gumbel top-k: a sample without replacement, in sampling order
        keys = np.log(q) + rng.gumbel(size=vp)
    order = np.argsort(-keys, kind="stable")
    support = int((q > 0).sum())
    out = np.full(c, -1, np.int64)
    out[: min(c, support)] = order[: min(c, support)]
    return out


def _params(rng, S, vp, temps, allowed) -> dict:
    """Per-state sampling parameters (SPEC 2), each on for about half the states; only those `allowed`."""
    on = rng.random((3, S)) < 0.5
    top_k = np.where(on[0], rng.integers(1, vp + 1, S), 0).astype(np.int32)
    top_p = np.where(on[1], rng.uniform(0.3, 1.0, S), 1.0).astype(np.float32)
    min_p = np.where(on[2], rng.uniform(0.0, 0.3, S), 0.0).astype(np.float32)
    return {k: v for k, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)) if k in allowed}


def tree_batches(
    *,
    min_reqs: int = 1,
    max_reqs: int = 6,
    max_spec_steps: int = 4,
    max_nodes: int = 10,
    vocab_sizes: Sequence[int] = (2, 3, 5, 8, 17, 40),
    tree_drafts: Sequence[str] = TREE_DRAFT_KINDS,
    tree_uniforms: str = TREE_UNIFORMS[0],
    temperatures: Sequence[str] = ("greedy", "one", "random"),
    logits_dtypes: Sequence[str] = LOGITS_DTYPES,
    sampling_params: Sequence[str] = (),
    logit_bound: float | None = None,
) -> st.SearchStrategy[SpecBatch]:
    """Valid tree batches (SPEC 4c) with the explicit noise; see the module docstring.

    `tree_drafts`: the kinds drawn, some of "one_hot", "iid", "without_replacement"; `tree_uniforms`:
    "per_child" or "per_node" (then one-hot trees only: SPEC 4c); `temperatures`: some of "greedy", "one",
    "random"; `sampling_params`: some of SPEC 2's, or none; `logit_bound` (SPEC 10): every finite processed
    logit, target and node draft rows alike, keeps `|z| <= logit_bound` (`strategies.logits.magnitude_bound`)."""
    kinds = tuple(k for k in TREE_DRAFT_KINDS if k in set(tree_drafts))
    if not kinds or set(tree_drafts) - set(TREE_DRAFT_KINDS):
        raise InvalidArgument(f"tree_drafts={tree_drafts!r}: some of {list(TREE_DRAFT_KINDS)}")
    if tree_uniforms not in TREE_UNIFORMS:
        raise InvalidArgument(f"tree_uniforms={tree_uniforms!r}: one of {list(TREE_UNIFORMS)}")
    if tree_uniforms == "per_node":
        kinds = tuple(k for k in kinds if k == "one_hot")
        if not kinds:
            raise InvalidArgument("tree_uniforms='per_node' takes one-hot trees only (SPEC 4c)")
    if not 1 <= min_reqs <= max_reqs or max_spec_steps < 1 or max_nodes < 1:
        raise InvalidArgument("need 1 <= min_reqs <= max_reqs, max_spec_steps >= 1, max_nodes >= 1")
    try:
        bound = checked_bound(logit_bound)
    except ValueError as exc:
        raise InvalidArgument(f"logit_bound={logit_bound!r}: {exc}") from None
    temps = ("greedy", "one", "random") if "mixed" in temperatures else (
        tuple(t for t in temperatures if t in ("greedy", "one", "random")) or ("one",))
    cfg = dict(min_reqs=min_reqs, max_reqs=max_reqs, max_spec_steps=max_spec_steps, max_nodes=max_nodes,
               vocab_sizes=tuple(int(v) for v in vocab_sizes), tree_drafts=kinds, tree_uniforms=tree_uniforms,
               temperatures=temps, dtypes=tuple(logits_dtypes),
               sampling_params=tuple(p for p in SAMPLING_PARAMS if p in set(sampling_params)), logit_bound=bound)
    return _tree_batches(cfg)
