"""Tree verification of a slab's requests (SPEC section 4c), one request at a time, in float64.

The processed target rows `z` (temperature and sampling-parameter masks, SPEC 2) come from the
slab (`reference.slab.Slab`); the draft distribution `Q` of a node is `softmax(node_draft_logits[j] /
T)` over `[0, V')`. Tree batches use the explicit family (SPEC 3c): a child's acceptance uniform is
`accept_uniforms` of its own row (`tree_uniforms = "per_child"`) or, one coin per parent node, of the
parent's row (`"per_node"`); the emitted token takes the request's `resample_gumbel` (or
`resample_uniforms` by inverse CDF).

Each request's trace lists, level by level (`step` = the depth of the node being extended), one
`"accept"` decision per child tried (`row`: the child's row; per_child margin `log p~(x) - log q~(x) -
log u`, per_node the coin's distance to the nearer bound of the child's interval, negative when
rejected), then after a rejection a `"residual"` decision (the last residual's float64 mass) and the
`"argmax"` that emitted the last token. Greedy requests: one `"argmax"` per level.

Declared deviations (SPEC 11) rule two edges here: `"tree_bonus"` (what an accepted leaf's bonus
samples: `tree_bonus_unprocessed`) and `"tree_siblings"` (the per-node bounds `S_k`:
`tree_duplicate_siblings`).
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.explicit import resample_gumbel, resample_uniforms, row_uniforms
from rs_verify.contract.tree import children, distinct_bounds, node_probs

from . import inverse_cdf
from .logits import divide, log_softmax64
from .masks import mask_decisions
from .trace import FREE, Q_FREE_LOG, Decision, RequestTrace, argmax_stats, candidate_scales, token_scale

__all__ = ["PER_CHILD", "PER_NODE", "verify_tree_slab"]

PER_CHILD, PER_NODE = "per_child", "per_node"


def _q_row(slab, row: int) -> np.ndarray:
    """`log Q` of a node: float64 `[V']` log-softmax of its processed draft logits."""
    b = slab.b
    x = np.asarray(b.batch.node_draft_logits[slab.lo + row : slab.lo + row + 1, : slab.vp])
    return log_softmax64(divide(x, slab.row_temp[row : row + 1]))[0]


def _without(logq: np.ndarray, removed: list[int]) -> np.ndarray:
    """`Q` with the `removed` tokens taken out and renormalised (SPEC 4c's without replacement), in log space."""
    if not removed:
        return logq
    removed = sorted(set(removed))
    out = logq.copy()
    gone = float(np.exp(logq[removed]).sum())
    out[removed] = -np.inf
    if gone >= 1.0:  # nothing left to renormalise: a later child could not have been drawn (q~ = 0, free)
        return np.full_like(logq, -np.inf)
    with np.errstate(divide="ignore"):
        out -= np.log1p(-min(gone, 1.0))
    return out


def verify_tree_slab(slab):
    """`(sampled, num_sampled, None, traces)` of the slab's tree requests (SPEC 4c)."""
    b = slab.b
    k = b.k
    sampled = np.full((slab.nreq, k + 1), -1, np.int64)
    nodes = np.full((slab.nreq, k), -1, np.int32)
    num = np.zeros(slab.nreq, np.int32)
    masks = mask_decisions(slab) if slab.trace else {}
    traces = []
    for r in range(slab.nreq):
        path, token, decisions = _request(slab, r)
        sampled[r, : len(path)] = [int(b.dti[slab.lo + int(slab.cu[r]) + c]) for c in path]
        sampled[r, len(path)] = token
        nodes[r, : len(path)] = path
        num[r] = len(path) + 1
        if slab.trace:
            traces.append(RequestTrace(slab.ra + r, [int(v) for v in sampled[r, : num[r]]],
                                       list(masks.get(r, ())) + decisions))
    return sampled, num, nodes, traces


def _request(slab, r: int):
    """`(path, emitted token, decisions)` of slab-local request `r`."""
    b = slab.b
    base = int(slab.cu[r])
    size = int(slab.cu[r + 1]) - base
    parents = np.asarray(b.batch.tree_parent[slab.lo + base : slab.lo + base + size])
    kids = children(parents)
    tokens = [int(b.dti[slab.lo + base + i]) for i in range(size)]
    if slab.greedy[r]:
        return _greedy(slab, r, base, kids, tokens)
    return _stochastic(slab, r, base, kids, tokens)


def _greedy(slab, r, base, kids, tokens):
    """SPEC 4c, greedy: descend by the first child whose token is `argmax p_n`; emit the argmax where none is."""
    n, path, out = 0, [], []
    while True:
        z = slab.z[base + n].astype(np.float64)
        a = int(np.argmax(z))
        if slab.trace:
            gaps, margin = argmax_stats(z[None])
            ts = token_scale(log_softmax64(z))
            scales = candidate_scales(ts, a)
            out.append(Decision(slab.ra + r, len(path), slab.lo + base + n, "argmax", a, None, float(margin[0]),
                                gaps[0], float(scales[a]), scales))
        nxt = next((c for c in kids[n] if tokens[c] == a), None)
        if nxt is None:
            return path, a, out
        path.append(nxt)
        n = nxt


def _stochastic(slab, r, base, kids, tokens):
    """SPEC 4c, stochastic: recursive rejection sampling over each level's children."""
    b = slab.b
    batch = b.batch
    req = slab.ra + r
    vp = slab.vp
    model = batch.node_draft_logits is not None
    wr = model and batch.tree_drafts == "without_replacement"
    per_node = b.tree_uniforms == PER_NODE
    sib_rule = b.deviations.at("tree_siblings")
    n, path, out = 0, [], []
    while True:
        level = len(path)
        logp_n = log_softmax64(slab.z[base + n].astype(np.float64))
        logpt = logp_n.copy()  # log p~
        logq = _q_row(slab, base + n) if model else None
        tried, accepted, last = [], None, None  # last: (residual mass, log p~ before, log q~, token) of a rejection
        real = [c for c in kids[n] if 0 <= tokens[c] < vp]  # padded children are skipped
        if per_node and real:
            coin = float(row_uniforms(batch, [slab.lo + base + n])[0])
            p_n = node_probs(slab.z[base + n])
            toks = np.array([tokens[c] for c in real])
            bounds = (distinct_bounds(p_n, toks) if sib_rule is None else
                      np.asarray(sib_rule.rule("tree_siblings")(p_n, toks), np.float64))
        for k, c in enumerate(real):
            x = tokens[c]
            if model:
                logqt = _without(logq, [tokens[t] for t in tried]) if wr else logq
            else:
                logqt = np.full(vp, -np.inf)
                logqt[x] = 0.0
            if per_node:
                lo_b = bounds[k - 1] if k else 0.0
                ok = lo_b <= coin < bounds[k]
                margin = min(coin - lo_b, bounds[k] - coin) if ok else bounds[k] - coin
                dev = sib_rule.name if sib_rule is not None and x in [tokens[t] for t in tried] else ""
                out.append(Decision(req, level, slab.lo + base + c, "accept", x, bool(ok), float(margin), None, 1.0,
                                    what="per_node", deviation=dev))
            else:
                u = float(row_uniforms(batch, [slab.lo + base + c])[0])
                lp, lq = float(logpt[x]), float(logqt[x])
                ok = lp > np.log(u) + lq
                margin = -np.inf if lp == -np.inf else lp - lq - np.log(u)
                free = model and lq < Q_FREE_LOG and lp > -np.inf
                out.append(Decision(req, level, slab.lo + base + c, "accept", x, bool(ok), float(margin), None,
                                    float(max(1.0, token_scale(np.array([lp, lq]))[0:2].max())),
                                    what=FREE if free else ""))
            tried.append(c)
            if ok:
                accepted = c
                break
            before = logpt
            pt = np.exp(logpt)
            resid = np.maximum(pt - np.exp(logqt), 0.0)
            if not model:
                resid = pt.copy()
                resid[x] = 0.0
            mass = float(resid.sum())
            with np.errstate(divide="ignore"):
                logpt = np.log(resid / mass) if mass > 0 else np.full(vp, -np.inf)
            last = (mass, before, logqt, x)
        if accepted is not None:
            path.append(accepted)
            n = accepted
            continue
        token, decisions = _emit(slab, r, base + n, level, logp_n, logpt, last, bool(path) and last is None)
        out.extend(decisions)
        return path, token, out


def _emit(slab, r, row, level, logp_n, logpt, last, bonus_at_leaf):
    """The token after the last level: from `p~` after a rejection (its fallback `p_n` when empty), else the
    bonus from `p_n` (a declared `"tree_bonus"` rule's weights at an accepted node); with its decisions."""
    b = slab.b
    req = slab.ra + r
    vp = slab.vp
    batch = b.batch
    out = []
    weights = logp_n
    dev_name = ""
    if last is not None and last[0] > 0:
        weights = logpt
    elif last is None and bonus_at_leaf and b.deviations.at("tree_bonus") is not None:
        dev = b.deviations.at("tree_bonus")
        raw = np.asarray(batch.target_logits[slab.lo + row, :vp], np.float64)
        weights = np.asarray(dev.rule("tree_bonus")(logp_n[None], raw[None]), np.float64)[0]
        dev_name = dev.name
    g = resample_gumbel(batch, [req], vp)[0]
    inverse = b.resample == inverse_cdf.WHAT
    if inverse:
        u = resample_uniforms(batch, [req])
        token = int(inverse_cdf.tokens(weights[None], u)[0])
    else:
        token = int(np.argmax(weights + g))
    if not slab.trace:
        return token, out
    if last is not None:
        mass, before, logqt, x = last
        if mass > 0:  # the other branch: the fallback p_n
            alt = argmax_stats((logp_n + g)[None])[0][0]
            alt_scales = candidate_scales(token_scale(logp_n, g), int(np.argmin(alt)))
        else:  # the other branch: a residual float32 rounding kept
            with np.errstate(invalid="ignore"):
                alt = np.maximum(logqt - before, 0.0)
            alt[~np.isfinite(before)] = np.inf
            alt_scales = np.maximum(1.0, token_scale(before))
        out.append(Decision(req, level, slab.lo + row, "residual", x, mass > 0, mass, alt, 1.0, alt_scales,
                            what=inverse_cdf.WHAT if inverse else ""))
    if inverse:
        gaps, margin = inverse_cdf.gaps(weights, float(u[0]), token)
        out.append(Decision(req, level, slab.lo + row, "argmax", token, None, margin, gaps, 1.0, np.ones_like(gaps),
                            what=inverse_cdf.WHAT, deviation=dev_name))
        return token, out
    gaps, margin = argmax_stats((weights + g)[None])
    scales = candidate_scales(token_scale(weights, g), token)
    out.append(Decision(req, level, slab.lo + row, "argmax", token, None, float(margin[0]), gaps[0],
                        float(scales[token]), scales, deviation=dev_name))
    return token, out
