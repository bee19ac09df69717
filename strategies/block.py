"""Block batches rich in the decisions of SPEC section 4b (for `decision_batches`).

When both methods are allowed, each draw picks its own (about one in two: three in five when a
request verifies two drafts or more, one in four otherwise), from the content generator:
Hypothesis's generate phase builds families of a few examples by mutating one, so a structural
draw would give some ci runs almost no block batches and others almost no token batches. The
tilts below are content draws too (each in `*_SHARE` of the block batches):

- a *designated* request (one of two drafts or more) gets a rescue or a partial block on two
  adjacent steps `a, a + 1`: a rescue (`u_a > h_a`, then `u_{a+1} <= h_{a+1}`: `tau` passes the
  earlier rejection) or a partial block (`u_a <= h_a` with `P_a < 1`, then `u_{a+1} > h_{a+1}`:
  `0 < tau < m`, the residual scaled by `P_{tau-1} < 1`). The drafts are picked by their
  ratio `p / q` (closed forms for one-hot drafts), the later step's draft mass set to carry
  the prefix, and the logits tuned where that is not enough, with `|log h - log u|` in
  `[0.05, 1]` (beyond the rounding of bfloat16 logits). Other requests take one of the same
  patterns, or (`near`) a step `i` whose `h_i` lands within `exp(+-delta)` of its known
  uniform `u_i` (SPEC section 3 streams), `delta` log-uniform in `[2e-3 L, 0.25]`: decided by u,
  far above float error. A step is tuned through its draft's target logit (or, when `p(d)`
  cannot rise that far, its draft logit); the target `P_i` solves `Z(P) (1 - h) = h (1 - P)`
  (bisection; `Z` and `P` as `rs_verify.contract.block`).
- `den_zero`: one request's step `i >= 1` saturated (target and draft on one token, so
  `Z_i = 0`) after drafts of largest `p / q` (`P_{i-1} = 1`): `Z + 1 - P = 0`, `h_{i-1} = 1`;
  mostly a draft elsewhere, so `tau = i` and the residual is empty. One-hot drafts: the target
  rows up to `i` saturated on their drafts.
- `zero_zero`: one or two model-draft steps whose draft has `p(d) = q(d) = 0`: the prefix ratio
  is 0, not NaN (a NaN-unsafe `min` gives 1 and accepts a token the target excludes); both
  logits `-inf` half the time when `-inf` logits are allowed, in masked batches or not (a
  log-domain ratio is NaN only then).
- drafts of largest `p / q` before a padded step (padding is mid-block in block batches), so the
  token at the padded step is resampled from p (`tau = m < n`); greedy requests beside
  stochastic ones (`greedy_mix`: greedy requests verify token by token).

Rows the sampling-parameter recipes built (`Contents.protected`) and drafts tied with another
token are left alone.

Imports only NumPy, Hypothesis and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.methods import BLOCK, TOKEN

from .contents import Contents
from .edges import SATURATED_DRAFT_GAP
from .logits import ONE_HOT_GAP

NEAR_DELTA = (2e-3, 0.25)  # |log h - log u| targets of "near": the low end times L (SPEC 8's scale)
FAR_DELTA = (0.05, 1.0)  # |log h - log u| of the rescue and partial patterns: robust to dtype rounding
BLOCK_SHARE, SHORT_BLOCK_SHARE = 0.6, 0.25  # block batches among draws with and without a request of 2+ drafts
GREEDY_MIX, NEAR_SHARE, DEN_ZERO_SHARE, ZERO_ZERO_SHARE, REACH_PAD_SHARE = 0.4, 0.9, 0.8, 0.9, 0.5
BISECT_STEPS = 60
# Partial blocks whose stopping step's residual is made P-sensitive (`_scaled_residual_row`), and the
# range of q / p there on most tokens: above the prefix ratios in [0.5, 1) the partial pattern picks.
SCALED_RESIDUAL_SHARE, SCALED_G = 0.9, (0.85, 0.97)
PATTERN_WEIGHTS = (0.1, 0.45, 0.45)  # near, rescue, partial (the last two need two live steps)


def choose_verification(rng, methods, n_r) -> str:
    """The batch's method: the only one allowed (no draw), else block about one time in two: three
    in five when some request verifies two drafts or more, one in four otherwise (a block of one
    step has no prefix ratio to carry, no rescue and no partial acceptance)."""
    if len(methods) == 1:
        return methods[0]
    return BLOCK.name if rng.random() < (BLOCK_SHARE if max(n_r, default=0) >= 2 else SHORT_BLOCK_SHARE) else TOKEN.name


def greedy_mix(rng, kinds, n_r, allowed) -> list:
    """Per-request kinds of a block batch: with no greedy request, the last one becomes greedy
    (GREEDY_MIX of the time, when greedy is allowed and another stochastic request verifies a
    draft): greedy requests of a block batch verify token by token (SPEC section 4b)."""
    if ("greedy" in kinds or not any(n_r[:-1]) or not any(k == "greedy" for k, _ in allowed)
            or rng.random() >= GREEDY_MIX):
        return kinds
    return list(kinds[:-1]) + ["greedy"]


def plant_block(rng, c: Contents) -> None:
    """The block tilts of the module docstring, each drawn for this batch (in place)."""
    if not c.stochastic:
        return
    # p(d) = q(d) = 0 before the designation half the time: the designated request is often the
    # only stochastic one with a second step, and its rows are protected once designated.
    zero_zero = c.draft is not None and rng.random() < ZERO_ZERO_SHARE
    early = zero_zero and rng.random() < 0.5
    if early:
        _zero_zero(rng, c)
    c.designate(rng)  # its rows are left to the rescue or partial block below
    if c.designated >= 0:
        c.protected.update(range(c.lo(c.designated), c.lo(c.designated) + c.n_r[c.designated] + 1))
    if zero_zero and not early:
        _zero_zero(rng, c)
    if rng.random() < DEN_ZERO_SHARE:
        _den_zero(rng, c)
    for r in c.stochastic:
        if 0 < _m(c, r) < c.n_r[r] and rng.random() < REACH_PAD_SHARE:
            _reach_pad(c, r)
    if c.designated >= 0:
        r = c.designated
        c.protected.difference_update(range(c.lo(r), c.lo(r) + c.n_r[r] + 1))
        _near(rng, c, r, pattern=1 + int(rng.random() < 0.75))
    if rng.random() < NEAR_SHARE:
        for r in c.stochastic:
            if r != c.designated:
                _near(rng, c, r)


def _reach_pad(c: Contents, r: int) -> None:
    """Drafts of largest p / q (largest p for one-hot drafts) before request `r`'s padded step, so
    the block is accepted up to it and the token there is resampled from p (tau = m < n)."""
    m, lo = _m(c, r), c.lo(r)
    if any(lo + i in c.protected for i in range(m)):
        return
    p, q = c.probs(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(m):
            score = np.where(p[i] > 0, np.log(p[i]) - (0.0 if q is None else np.log(q[i])), -np.inf)
            c.draft_ids[lo + 1 + i] = int(np.argmax(score))
    c.protected.update(range(lo, lo + m))


def _m(c: Contents, r: int) -> int:
    """The first padded step of request `r` (its drafts' count when none)."""
    d = c.drafts(r)
    bad = np.flatnonzero((d < 0) | (d >= c.v))
    return int(bad[0]) if bad.size else c.n_r[r]


def _zero_zero(rng, c: Contents) -> None:
    """One or two requests: a verified step (not step 0 of the first stochastic request, which keeps
    a stochastic decision) whose draft gets p(d) = q(d) = 0."""
    for r in rng.choice(c.stochastic, size=min(len(c.stochastic), int(rng.integers(1, 3))), replace=False):
        r, m = int(r), _m(c, int(r))
        steps = [i for i in range(m) if c.lo(r) + i not in c.protected and (i > 0 or r != c.stochastic[0])]
        if not steps:
            continue
        i = int(rng.choice(steps))
        j, d = c.lo(r) + i, int(c.drafts(r)[i])
        target, draft = c.target[j, : c.v], c.draft[int(c.idx[r]), i, : c.v]
        if not (np.isfinite(np.delete(target, d)).any() and np.isfinite(np.delete(draft, d)).any()):
            continue
        # Both -inf together half the time (when -inf logits are allowed, masked batch or not: a drafter's
        # top-k leaves -inf draft logits): only then is a log-domain ratio log p - log q NaN
        # (-inf - -inf); finite gaps give p = q = 0 in float64 alone.
        both = c.inf_allowed and rng.random() < 0.5
        c.put(j, d, -np.inf if both else c.zero_logit(rng, r, np.delete(target, d)))
        c.put_draft(r, i, d, -np.inf if both else c.zero_logit(rng, r, np.delete(draft, d)))
        c.protected.add(j)


def _den_zero(rng, c: Contents) -> None:
    cands = [r for r in c.stochastic if _m(c, r) >= 2 and r != c.designated]
    if not cands and c.designated >= 0 and _m(c, c.designated) >= 2 and rng.random() < 0.5:  # the only long block
        cands, c.designated = [c.designated], -1
        c.protected.difference_update(range(c.lo(cands[0]), c.lo(cands[0]) + c.n_r[cands[0]] + 1))
    if not cands:
        return
    r = int(rng.choice(cands))
    lo, m, t_r = c.lo(r), _m(c, r), float(c.temps[r])
    if any(j in c.protected for j in range(lo, lo + m)):
        return
    i = int(rng.integers(1, m))
    scale = t_r if t_r > 0 else 1.0
    if c.draft is None:  # one-hot: P_{i-1} = 1 and p_i(d_i) = 1 need the rows up to i saturated on their drafts
        for a in range(i + 1):
            _saturate_row(rng, c, r, a, int(c.drafts(r)[a]))
    else:
        for a in range(i):  # drafts of largest p / q: every ratio >= 1, so P_{i-1} = 1
            p, q = c.probs(r)
            with np.errstate(divide="ignore", invalid="ignore"):
                score = np.where(p[a] > 0, np.log(p[a]) - np.log(q[a]), -np.inf)
            c.draft_ids[lo + 1 + a] = int(np.argmax(score))
        tok = int(rng.integers(c.v))
        _saturate_row(rng, c, r, i, tok)
        hot = float(rng.standard_normal())
        row = np.full(c.draft.shape[2], hot - scale * rng.uniform(*SATURATED_DRAFT_GAP))
        row[tok] = hot
        c.put_draft(r, i, slice(None), row)
        if rng.random() < 0.15:  # accepted (P_i = 1), or excluded (P_i = 0: tau = i, an empty residual)
            c.draft_ids[lo + 1 + i] = tok
    c.protected.update(range(lo, lo + i + 1))


def _saturate_row(rng, c: Contents, r: int, i: int, tok: int) -> None:
    """Target row `i` of request `r` with all its mass on `tok` (the rest ONE_HOT_GAP below, or -inf)."""
    j = c.lo(r) + i
    hot = float(rng.standard_normal())
    row = np.full(c.target.shape[1], hot - ONE_HOT_GAP)
    if c.masked and rng.random() < 0.5:
        row[:] = -np.inf
    row[tok] = hot
    c.put(j, slice(None), row)


def _solve_prefix(h: float, p_next, q_next, d_next: int) -> float:
    """The prefix ratio `P` in [0, 1] whose threshold `Z(P) / (Z(P) + 1 - P)` is `h` (SPEC 4b)."""
    if q_next is None:  # one-hot: Z = P (1 - p'(d')), h = P a / (P a + 1 - P)
        a = 1.0 - float(p_next[d_next])
        return h / (a * (1.0 - h) + h) if a > 0 else np.nan
    lo, hi = 0.0, 1.0
    for _ in range(BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        z = np.maximum(mid * p_next - q_next, 0.0).sum()
        if z * (1.0 - h) - h * (1.0 - mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _near(rng, c: Contents, r: int, pattern: int | None = None) -> None:
    """One of the three patterns of the module docstring on request `r`: a rescue or a partial block
    on two adjacent steps `(a, a + 1)` (drafts picked by `_pick`, then tuned where still needed;
    row `a + 1` enters `h_a`, so three rounds), else one step tuned near its uniform."""
    res, p, _, u = c.block(r)
    m, lo = int(res.m[0]), c.lo(r)
    if pattern is None:
        pattern = int(rng.choice(3, p=PATTERN_WEIGHTS))  # near, rescue, partial
    prev_ok = np.concatenate([[True], ~np.isneginf(res.log_prefix[0, : max(m - 1, 0)])])
    pairs = [a for a in range(m - 1) if prev_ok[a] and lo + a not in c.protected and lo + a + 1 not in c.protected
             and min(u[a], u[a + 1]) >= 1e-6]
    if pattern and pairs:
        rescue = pattern == 1
        # The pair whose uniforms help most (a rescue needs u_b <= h_b <= P_b after u_a > h_a, and
        # along one-hot drafts P_b <= P_a; a partial block needs u_a <= h_a <= P_a), half the time.
        score = [u[a + 1] / u[a] if rescue else u[a] for a in pairs]
        a = int(pairs[int(np.argmin(score))] if rng.random() < 0.5 else rng.choice(pairs))
        deltas = {a: (-1.0 if rescue else 1.0), a + 1: (1.0 if rescue else -1.0)}
        for i in deltas:
            deltas[i] *= float(np.exp(rng.uniform(*np.log(FAR_DELTA))))
        _pick(rng, c, r, a, rescue)
        _prepare(rng, c, r, a + 1, rescue)
        for round_ in range(3):
            h = c.block(r)[0].h[0]
            wrong = [i for i in (a, a + 1) if (u[i] <= h[i]) != (deltas[i] > 0)]  # not yet on the wanted side
            if not wrong:
                return
            # Step a first, even on its side: its h_a at its delta from u_a takes P_a as far towards
            # b's wanted side as a allows (a rescue's b accepts only if u_b <= h_b <= P_a p_b / q_b).
            for i in ([a] if round_ == 0 and a not in wrong else []) + wrong:
                _tune(c, r, i, u, deltas[i])
        return
    # Past a collapsed prefix ratio (P = 0) every threshold is 0: only the steps before it can move,
    # through a draft whose p(d) is neither 0 nor 1 (and not tied with another token).
    collapsed = np.flatnonzero(np.isneginf(res.log_prefix[0, :m]))
    last = (int(collapsed[0]) if collapsed.size else m) - 1
    d = c.drafts(r)
    free = [i for i in range(last + 1) if lo + i not in c.protected and u[i] >= 1e-6 and 0 < p[i, d[i]] < 1
            and not _tied(c.target[lo + i, : c.v], int(d[i]))]
    if free:
        i = int(rng.choice(free))
        low = NEAR_DELTA[0] * max(1.0, abs(float(np.log(u[i]))))
        _tune(c, r, i, u, float(rng.choice([-1.0, 1.0])) * float(np.exp(rng.uniform(np.log(low), np.log(NEAR_DELTA[1])))))


def _pick(rng, c: Contents, r: int, a: int, rescue: bool) -> None:
    """Draft ids at steps `a`, `b = a + 1` for a rescue (`u_a > h_a`, `u_b <= h_b`) or a partial
    block (`u_a <= h_a` with `P_a < 1`, `u_b > h_b`). Model drafts: a rescue's `d_a` has a prefix
    ratio below `0.8 u_a` (then `h_a <= P_a` fails) and `d_b` the largest `p / q` (the prefix
    climbs back); a partial block's `d_a` a ratio in `[0.5, 1)` and `d_b` the smallest positive
    `p / q`. One-hot drafts (`h_a = P_a x / (P_a x + 1 - P_a)`, `x = 1 - p_b(d_b)`, `h_b <= P_b =
    P_a p_b(d_b)`): a rescue takes `d_b` of largest `p_b` and the `d_a` of largest `p_a` with
    `h_a < 0.8 u_a`; a partial block the largest `p_a` and the smallest positive `p_b`."""
    res, p, q, u = c.block(r)
    lo, b = c.lo(r), a + 1
    prev = 1.0 if a == 0 else float(np.exp(res.log_prefix[0, a - 1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p[a : b + 1] > 0, p[a : b + 1] / (1.0 if q is None else q[a : b + 1]), np.nan)
    if not (np.isfinite(ratio[0]).any() and np.isfinite(ratio[1]).any()):
        return
    d_b = int(np.nanargmax(ratio[1]) if rescue else np.nanargmin(ratio[1]))
    big_a = prev * ratio[0]  # P_a for each candidate d_a (before the min with 1)
    with np.errstate(invalid="ignore"):
        if q is None and rescue:
            x = 1.0 - float(p[b, d_b])
            h_a = big_a * x / (big_a * x + 1.0 - big_a)
            cand = np.flatnonzero(h_a < 0.8 * u[a])
            d_a = int(cand[np.argmax(big_a[cand])]) if cand.size else None
        elif q is None:
            d_a = int(np.nanargmax(big_a))
        else:
            cand = np.flatnonzero(big_a < 0.8 * u[a] if rescue else (big_a >= 0.5) & (big_a < 1))
            d_a = int(rng.choice(cand)) if cand.size else None
    if d_a is not None:
        c.draft_ids[lo + 1 + a] = d_a
    c.draft_ids[lo + 1 + b] = d_b


def _tied(head, d: int) -> bool:
    """Whether token `d` shares its logit with another token of the row (a tie a tilt built)."""
    return int((head == head[d]).sum()) > 1


def _prepare(rng, c: Contents, r: int, b: int, rescue: bool) -> None:
    """Make the later step `b` of a rescue easy to accept and that of a partial block easy to fail,
    in the ratio `p_b(d_b) / q_b(d_b)` that carries the prefix past it: a rescue's draft gets
    little draft mass (q(d) 1-10% of p(d); one-hot drafts: p(d) 90-99%), a partial block's much
    (q(d) 50-90%; one-hot drafts: p(d) 1-20%), which also keeps `Z_b` (so `h_{b-1}`) large."""
    _, p, q, _ = c.block(r)
    d = int(c.drafts(r)[b])
    if q is None:
        prob = 1.0 - rng.uniform(0.01, 0.1) if rescue else rng.uniform(0.01, 0.2)
        z, mr = c.masked_z(r, [b])
        logit = _logit_for(prob, z[0], mr.kept[0] & np.isfinite(z[0]), d)
        if np.isfinite(logit):
            c.put(c.lo(r) + b, d, c.raw(r, logit))
        return
    if not rescue and rng.random() < SCALED_RESIDUAL_SHARE and _scaled_residual_row(rng, c, r, b, p[b], d):
        return
    prob = float(p[b, d]) * rng.uniform(0.01, 0.1) if rescue else rng.uniform(0.5, 0.9)
    zq = c.draft[int(c.idx[r]), b, : c.v] / np.float32(c.temps[r])
    logit = _logit_for(prob, zq, np.isfinite(zq), d) if 0 < prob < 1 else np.nan
    if np.isfinite(logit):
        c.put_draft(r, b, d, c.raw(r, logit))


def _scaled_residual_row(rng, c: Contents, r: int, b: int, p_row, d: int) -> bool:
    """The draft row of a partial block's stopping step `b` made so that its residual
    `max(P p - q, 0)` (SPEC 4b, `P = P_{b-1} < 1`) differs from the token-wise `max(p - q, 0)` where
    it matters: `q = g p` on most tokens (`g` in `SCALED_G`, above the prefix `P` the pattern aims
    for), so they carry mass of the token-wise residual only, `q = 0.3 p` on a few, which carry the
    scaled residual, and the draft itself takes the rest (`q(d) > p(d)`: the step rejects).
    A sampler that drops `P` then emits tokens outside the scaled residual's support. False when
    the row has too few kept tokens."""
    kept = np.flatnonzero(p_row > 0)
    others = kept[kept != d]
    if others.size < 3 or p_row[d] <= 0:
        return False
    few = rng.choice(others, size=max(1, others.size // 5), replace=False)
    scale = np.where(np.isin(np.arange(p_row.size), few), 0.3, rng.uniform(*SCALED_G))
    q = np.where(p_row > 0, scale * p_row, 0.0)
    q[d] = 0.0
    q[d] = 1.0 - q.sum()
    if q[d] <= p_row[d]:
        return False
    zero = p_row == 0
    with np.errstate(divide="ignore"):
        zq = np.log(np.where(zero, 1e-4 * q[d], q))
    c.put_draft(r, b, slice(0, c.v), c.raw(r, zq))
    return True


def _tune(c: Contents, r: int, i: int, u, delta: float) -> None:
    """Set step `i`'s draft logit (row `i`) so that `log h_i - log u_i` is about `delta`."""
    res, p, q, _ = c.block(r)
    m, lo = int(res.m[0]), c.lo(r)
    d = int(c.drafts(r)[i])
    prev = 1.0 if i == 0 else float(np.exp(res.log_prefix[0, i - 1]))
    if prev == 0 or p[i, d] == 0 or (p[i, d] == 1 and q is None and delta > 0):
        return  # (p(d) = 1: a one-hot step cannot rise; a model draft's q(d), or a lower p(d), still moves it)
    h = float(u[i]) * np.exp(delta)
    if h >= 1.0 and delta > 0:  # accept: h_i = 1 needs P_i = 1 (a ratio p(d) / q(d) >= 1 / P_{i-1})
        big_p, slack = 1.0, float(np.exp(delta))
    else:
        h, slack = min(h, float(u[i]) * np.exp(-abs(delta))) if h >= 1.0 else h, 1.0
        if i + 1 < m:
            big_p = _solve_prefix(h, p[i + 1], None if q is None else q[i + 1], int(c.drafts(r)[i + 1]))
        else:
            big_p = h
        if not 0 < big_p < 1:
            return
    # the p(d) that gives P_i = big_p (times `slack` past the saturation at 1)
    target = big_p * slack / prev * (1.0 if q is None else float(q[i, d]))
    if 1e-300 < target < 1.0:
        z, mr = c.masked_z(r, [i])
        kept = mr.kept[0] & np.isfinite(z[0])
        logit = _logit_for(target, z[0], kept, d)
        if np.isfinite(logit):
            c.put(lo + i, d, c.raw(r, logit))
    elif q is not None:  # p(d) cannot rise that far: lower q(d) instead
        q_target = float(p[i, d]) * prev / (big_p * slack)
        if 1e-300 < q_target < 1.0:
            zq = c.draft[int(c.idx[r]), i, : c.v] / np.float32(c.temps[r])
            logit = _logit_for(q_target, zq, np.isfinite(zq), d)
            if np.isfinite(logit):
                c.put_draft(r, i, d, c.raw(r, logit))


def _logit_for(prob: float, z, kept, d: int) -> float:
    """The processed logit of token `d` that gives it probability `prob` beside the other kept tokens."""
    kept = np.array(kept, bool)
    kept[d] = False
    if not kept.any():
        return np.nan
    rest = np.asarray(z, np.float64)[kept]
    top = rest.max()
    return float(np.log(prob) - np.log1p(-prob) + top + np.log(np.exp(rest - top).sum()))
