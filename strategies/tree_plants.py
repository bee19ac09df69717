"""The tree strategies' plants (SPEC 4c): the edges a drawn tree batch is steered onto (a sibling with
`q~(x) = 0`, an empty residual after the last sibling, a coin on a bound of the per-node layout) and the
batches that make a verifier's renormalisation and later siblings matter; used by `strategies.tree`."""

from __future__ import annotations

import numpy as np

from rs_verify.contract.tree import children, distinct_bounds, node_probs


def _processed_q(row: np.ndarray, t: float) -> np.ndarray:
    """`Q = softmax(row / T)` in float64 (float32 division, as SPEC 2)."""
    z = row if t in (0.0, 1.0) else np.divide(row, np.float32(t), dtype=np.float32)
    z = z.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max())
    return e / e.sum()


def _stochastic_parents(cu, parents, temps, tokens, vp):
    """`(request, parent node, its children)` for stochastic requests' nodes with a real child."""
    out = []
    for r, par in enumerate(parents):
        if temps[r] <= 0:
            continue
        for n, cs in enumerate(children(par)):
            real = [c for c in cs if 0 <= tokens[int(cu[r]) + c] < vp]
            if real:
                out.append((r, n, real))
    return out


def _plant_q_zero(rng, cu, parents, tokens, nd, vp, temps) -> list[str]:
    """A sibling whose token the parent's `Q` excludes (`q~(x) = 0`: SPEC 4c leaves its test free)."""
    cands = _stochastic_parents(cu, parents, temps, tokens, vp)
    if not cands or vp < 2:
        return []
    r, n, real = cands[int(rng.integers(len(cands)))]
    j = int(cu[r]) + n
    c = real[int(rng.integers(len(real)))]
    others = {int(tokens[int(cu[r]) + s]) for s in real if s != c}
    free = [x for x in range(vp) if x not in others]
    if not free:
        return []
    x = int(rng.choice(free))
    keep = [y for y in range(vp) if y != x and np.isfinite(nd[j, y])]
    if not keep:
        return []
    nd[j, x] = -np.inf
    tokens[int(cu[r]) + c] = x
    return ["q~(x) = 0 sibling"]


def _plant_empty_residual(rng, cu, parents, tokens, target, nd, vp, temps, params_on) -> list[str]:
    """The last real sibling of a node rejected with nothing left: the parent's `p` equal to its `Q`, the
    child's token excluded by both (`p~(x) = q~(x) = 0`: rejected, residual `max(p - Q, 0) = 0`)."""
    if params_on or vp < 2:  # sampling parameters would make p differ from Q
        return []
    cands = [(r, n, real) for r, n, real in _stochastic_parents(cu, parents, temps, tokens, vp) if len(real) == 1]
    if not cands:
        return []
    r, n, real = cands[int(rng.integers(len(cands)))]
    j = int(cu[r]) + n
    x = int(tokens[int(cu[r]) + real[0]])
    row = target[j, :vp].copy()
    row[x] = -np.inf
    if not np.isfinite(row).any():
        return []
    target[j, :vp] = row
    nd[j, :vp] = row
    return ["empty residual after the last sibling"]


def _plant_coin(rng, cu, parents, tokens, target, vp, temps, params_on, accept) -> list[str]:
    """One coin per node (SPEC 4c's per_node layout) exactly on a bound `S_k` (in float64)."""
    if params_on:
        return []
    out = []
    for r, n, real in _stochastic_parents(cu, parents, temps, tokens, vp):
        if len(real) < 2 or rng.random() < 0.5:
            continue
        j = int(cu[r]) + n
        row = target[j, :vp]
        t = np.float32(temps[r])
        p = node_probs(row if t == 1 else np.divide(row, t, dtype=np.float32))
        bounds = distinct_bounds(p, [int(tokens[int(cu[r]) + c]) for c in real])
        k = int(rng.integers(len(bounds) - 1))
        if 0 < bounds[k] < 1:
            accept[j] = bounds[k]
            out.append("coin exactly on a bound S_k")
    return out


def _planted_parents(rng, cu, parents, temps, tokens, vp):
    """Stochastic parents with two real children or more: every root (each request's first level is
    always verified) and each deeper node with probability one half (verified only where the path
    reaches it)."""
    cands = [c for c in _stochastic_parents(cu, parents, temps, tokens, vp) if len(c[2]) >= 2]
    return [c for c in cands if rng.random() < 0.5 or c[1] == 0]


def _guided_branches(rng, cu, parents, temps, tokens, vp, p_rows):
    """`(request, node, its children, path)` for each stochastic request: the shallowest node with two
    children or more (a padded one may be given a token) that the first real children lead to from the
    root, each with `p(x) > 0` there (`path`, accepted at the uniform `2**-53`: most drawn trees are
    chains or branch below the root); and deeper branching nodes with probability one half (verified
    only where the path reaches them)."""
    out = []
    for r, par in enumerate(parents):
        if temps[r] <= 0:
            continue
        lo, kids, n, path, branch = int(cu[r]), children(par), 0, [], None
        while branch is None:
            real = [c for c in kids[n] if 0 <= tokens[lo + c] < vp]
            if len(kids[n]) >= 2:
                branch = n
                out.append((r, n, kids[n], path))
            elif len(real) == 1 and p_rows[lo + n, tokens[lo + real[0]]] > 1e-12:
                n = real[0]
                path = path + [n]
            else:
                break
        out += [(r, m, kids[m], []) for m in range(len(par)) if m != branch and len(kids[m]) >= 2
                and rng.random() < 0.5]
    return out


def _plant_later_coin(rng, cu, parents, tokens, p_rows, nd, vp, temps, accept) -> list[str]:
    """One coin per node: a drawn coin mostly lands in the first sibling's interval `[0, S_1)` when its
    token is the parent's top one, so the running sums over later (and repeated) siblings decide
    little. In some nodes with two real children or more (`_planted_parents`), the coin is put at the
    middle of a later sibling's non-empty interval `[S_{k-1}, S_k)` (`k >= 2`) or of `[S_c, 1)` (every
    sibling rejected): a decision with margin half the interval's width."""
    out = []
    for r, n, real in _planted_parents(rng, cu, parents, temps, tokens, vp):
        j = int(cu[r]) + n
        bounds = distinct_bounds(p_rows[j, :vp], [int(tokens[int(cu[r]) + c]) for c in real])
        edges = np.concatenate([bounds, [1.0]])
        spans = [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi - lo > 2.0**-20]
        if not spans:
            continue
        lo, hi = spans[int(rng.integers(len(spans)))]
        accept[j] = np.round((lo + hi) / 2 * 2.0**53) * 2.0**-53
        out.append("coin deciding a later sibling")
    return out


def _plant_renormalised(rng, cu, parents, tokens, p_rows, nd, vp, temps, accept) -> list[str]:
    """Drafts without replacement: a node's first two children get the tokens `x1` with `Q(x1) > p(x1)`
    (rejected at a uniform near 1) and `x2` with `p(x2) > Q(x2)`, and `x2`'s uniform lies strictly between
    `p~(x2) / q~(x2)` (SPEC 4c: rejected) and `p~(x2) / Q(x2)` (accepted by a verifier that forgets to take
    `x1` out of `Q`), at their geometric mean. The siblings stay distinct (tokens swapped, not repeated); a
    padded first or second child gets its token."""
    out = []
    for r, n, real, path in _guided_branches(rng, cu, parents, temps, tokens, vp, p_rows):
        j, t, lo_row = int(cu[r]) + n, float(temps[r]), int(cu[r])
        p = p_rows[j, :vp]
        q = _processed_q(nd[j, :vp], t)
        over = np.flatnonzero(q > p * (1 + 1e-6))
        if not over.size:
            continue
        x1 = int(over[np.argmax(q[over] - p[over])])
        resid = np.maximum(p - q, 0.0)
        if resid.sum() <= 0:
            continue
        pt = resid / resid.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.where((pt > 0) & (q > 0), pt * (1.0 - q[x1]) / q, np.inf)
        x2 = int(np.argmin(lo))
        hi = min(pt[x2] / q[x2], 1.0) if q[x2] > 0 else 0.0
        if x2 == x1 or not 0 < lo[x2] < hi * (1 - 1e-6):
            continue
        toks = [int(tokens[lo_row + c]) for c in real]
        for want, at in ((x1, 0), (x2, 1)):
            if want in toks:
                k = toks.index(want)
                toks[k], toks[at] = toks[at], toks[k]
            else:
                toks[at] = want
        tokens[lo_row + np.asarray(real)] = toks
        accept[lo_row + real[0]] = 1.0 - 2.0**-53
        accept[lo_row + real[1]] = np.round(np.sqrt(lo[x2] * hi) * 2.0**53) * 2.0**-53
        accept[lo_row + np.asarray(path, np.int64)] = 2.0**-53  # the path down to the node: accepted
        out.append("second sibling's uniform between p~/q~ and p~/Q")
    return out
