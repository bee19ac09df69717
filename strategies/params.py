"""Per-state sampling parameters (SPEC section 2): min-p, top-k and top-p, off, tight and loose.

Structure (drawn by Hypothesis, only when the strategy allows parameters): whether the batch
carries them (three draws in four; shrinks to none). Contents (NumPy): each request's *recipe*
(a content draw, so that each of the few-example families of Hypothesis's generate phase sees
several), the values, and for a stochastic request the rows its recipe builds:

- "off", "loose", "tight", "all": values only (several parameters at once, in any mix; "all"
  turns on every allowed parameter, where their order matters);
- "top_k_tie": several tokens tied with the k-th value on some rows (ties are kept);
- "top_p_tie": a boundary inside a group of tied tokens: `top_p` is placed half a token's mass
  past a prefix of the group, so float32 and float64 agree on every tied token;
- "min_p_one": `min_p = 1` with tied maxima on some rows (they are kept);
- "masked_draft": a tight mask and a draft of a token it masks (`p(d) = 0`), with `q(d) > 0` or,
  nine times in ten for model drafts, `q(d) = 0`;
- "empty_residual": a mask that leaves one token `t`, the draft row saturated on `t` and a draft
  elsewhere: `max(p - q, 0)` is empty after the mask (not before);
- "bonus": a tight mask on a flattened bonus row, and drafts the verification accepts (the token
  of largest `p / q`), so the bonus is emitted and the mask likely changes it.

Value recipes mostly draft from a q close to the *masked* target (a drafter applying the same
parameters), sometimes with one token it gave no mass (`p(d) = q(d) = 0`). With model drafts,
one request besides the first stochastic one is usually given "empty_residual" or
"masked_draft"; in a block batch one multi-step request keeps loose or no parameters for the
block tilts. The first stochastic request keeps a stochastic decision (a masked draft there is
drawn again from q restricted to the kept tokens: at step 0, every step in a block batch).

Thresholds never land on purpose within float error of a token: top-p sits half a token's mass
from a tied group's decisions, and every top-p and min-p value is vetted at the end of the draw
(`strategies.thresholds`); top-k and min-p = 1 are exact comparisons. States no request references hold
garbage (even invalid values); greedy states get values they must ignore.

Imports only NumPy, Hypothesis and the contract.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rs_verify.contract.batch import SAMPLING_PARAMS

from .contents import OFF, ZERO_GAP, Contents
from .drafts import close_draft_rows, gumbel_max_drafts, log_softmax_processed
from .edges import SATURATED_DRAFT_GAP, knob_step
from .facts import masked_probs

RECIPES = ("off", "loose", "tight", "all", "top_k_tie", "top_p_tie", "min_p_one", "masked_draft", "empty_residual",
           "bonus")
_NEEDS = {"top_k_tie": "top_k", "top_p_tie": "top_p", "min_p_one": "min_p"}
DTYPES = {"min_p": np.float32, "top_k": np.int32, "top_p": np.float32}
GARBAGE = {"min_p": (np.nan, -1.0, 2.0, np.inf, 0.5), "top_k": (-1, -(2**31), 5, 2**31 - 1),
           "top_p": (np.nan, 0.0, -1.0, 2.0, np.inf, 0.5)}
TOP_P_MIN_MASS = 1e-2  # a tied group's token mass at least this: its top-p margins are >= 5e-3
DRAFT_SIGMA = (0.03, 2.0)  # as decision_batches' drafts drawn from q close to p
KNOWING_SHARE = 0.6  # stochastic requests with parameters whose drafter samples from the masked target
VALUE_RECIPES = ("loose", "tight", "all", "top_k_tie", "top_p_tie", "min_p_one")
RECIPE_WEIGHTS = {"masked_draft": 3.0, "empty_residual": 4.0, "bonus": 1.5}  # the rest 1 each
# In a block batch, recipes that fix a request's drafts leave fewer steps to the block tilts.
BLOCK_RECIPE_WEIGHTS = {"masked_draft": 1.5, "empty_residual": 1.5, "bonus": 1.0}
BLOCK_KEPT_SHARE = 0.75  # other stochastic requests of a block batch whose masked drafts are drawn again
CORRUPT_SHARE = 2 / 3
DESIGNATED_MASK_SHARE = 0.85  # knowing drafters that still propose one masked token (p(d) = q(d) = 0)


def recipes_for(allowed, mode: str) -> tuple[str, ...]:
    """The recipes a batch may draw given the allowed parameters and the draft mode."""
    return tuple(x for x in RECIPES if _NEEDS.get(x, allowed[0]) in allowed and (x != "empty_residual" or
                                                                                     mode == "model"))


def draw_params_on(draw, allowed) -> bool:
    """Whether the batch carries parameters: a Hypothesis draw when some are allowed (three in four;
    shrinks to none), no draw otherwise. Each request's recipe is a content draw."""
    return bool(allowed) and draw(st.integers(0, 3)) > 0


# -- values -------------------------------------------------------------------------------


def value(rng, name: str, kind: str, v: int, vocab: int):
    """One parameter value of `kind` ("off", "tight", "loose") over `V' = v` tokens (`V = vocab`)."""
    if name == "top_k":
        if kind == "off":  # 0, or any k >= V' (k in [V', V) is off over [0, V') but not over [0, V))
            return 0 if rng.random() < 0.5 else int(rng.choice([v, v + int(rng.integers(1, 4)), vocab, 2**31 - 1]))
        if kind == "tight":
            return int(rng.integers(1, max(1, min(3, v - 1)) + 1))
        lo = max(1, v // 2)
        return int(rng.integers(lo, max(lo + 1, v)))  # in [V'/2, V' - 1]
    if kind == "off":
        return OFF[name]
    if name == "top_p":
        return float(np.float32(rng.uniform(0.05, 0.5) if kind == "tight" else rng.uniform(0.8, 0.99)))
    if kind == "tight":
        return 1.0 if rng.random() < 0.2 else float(np.float32(np.exp(rng.uniform(np.log(0.2), 0.0))))
    return float(np.float32(np.exp(rng.uniform(np.log(1e-4), np.log(0.05)))))


def _kinds(rng, recipe: str, allowed) -> dict[str, str]:
    """The kind of every allowed parameter under a recipe (tuning recipes set theirs later)."""
    out = {name: "off" for name in allowed}
    if recipe in ("loose", "tight"):
        pick = [name for name in allowed if rng.random() < 0.5] or [allowed[int(rng.integers(len(allowed)))]]
        for name in allowed:
            out[name] = recipe if name in pick else ("off" if recipe == "loose" or rng.random() < 0.5 else "loose")
    elif recipe == "all":
        out = {name: "tight" if rng.random() < 0.5 else "loose" for name in allowed}
    elif recipe in ("masked_draft", "bonus"):
        out[allowed[int(rng.integers(len(allowed)))]] = "tight"
    return out


def state_arrays(rng, allowed, S: int) -> dict[str, np.ndarray]:
    """Per-state arrays: off everywhere, garbage at about half the states (referenced states are
    overwritten by the caller)."""
    out = {}
    for name in allowed:
        a = np.full(S, OFF[name], dtype=DTYPES[name])
        junk = rng.random(S) < 0.5
        a[junk] = np.asarray(GARBAGE[name], dtype=DTYPES[name])[rng.integers(len(GARBAGE[name]), size=int(junk.sum()))]
        out[name] = a
    return out


def broad_params(rng, allowed, S: int, idx, v: int, vocab: int) -> dict[str, np.ndarray | None]:
    """`spec_batches`' parameters: each referenced state off, loose, tight or "all" (values only)."""
    arrays = state_arrays(rng, allowed, S)
    for s in idx:
        recipe = ("off", "loose", "tight", "all")[int(rng.integers(4))]
        for name, kind in _kinds(rng, recipe, allowed).items():
            arrays[name][s] = value(rng, name, kind, v, vocab)
    return _present(rng, arrays, idx)


def _present(rng, arrays, idx) -> dict[str, np.ndarray | None]:
    """A parameter no referenced state turns on is None half the time (off for all), else all off."""
    out = {}
    for name, a in arrays.items():
        used = (a[np.asarray(idx, np.int64)] != OFF[name]).any() if len(idx) else False
        out[name] = a if used or rng.random() < 0.5 else None
    return out


# -- decision_batches: values and rows ----------------------------------------------------


def plant_params(rng, c: Contents, allowed, vocab: int, mode: str) -> None:
    """Draw every request's recipe, fill `c.params` and build each stochastic request's rows (in
    place)."""
    choices = recipes_for(allowed, mode)
    weights = np.array([(BLOCK_RECIPE_WEIGHTS if c.block_mode else RECIPE_WEIGHTS).get(x, 1.0) for x in choices])
    plan = [choices[int(i)] for i in rng.choice(len(choices), size=len(c.idx), p=weights / weights.sum())]
    # Designated requests: a block batch keeps one multi-step request for a rescue or a partial
    # block (loose or no parameters there); with model drafts, another stochastic request most
    # of the time empties its residual through the mask or drafts a masked token.
    c.designate(rng)
    if c.block_mode and c.designated >= 0:
        plan[c.designated] = "loose" if rng.random() < 0.5 else "off"
    others = [r for r in c.stochastic[1:] if r != c.designated]
    if c.draft is not None and others and rng.random() < DESIGNATED_MASK_SHARE:
        plan[int(rng.choice(others))] = "empty_residual" if rng.random() < 0.5 else "masked_draft"
    arrays = state_arrays(rng, allowed, len(c.seeds))
    for r, recipe in enumerate(plan):
        s = int(c.idx[r])
        if c.temps[r] == 0 and recipe in _BUILDERS:
            recipe = "tight"  # a greedy state ignores its parameters: give it some to ignore
        for name, kind in _kinds(rng, recipe, allowed).items():
            arrays[name][s] = value(rng, name, kind, c.v, vocab)
    c.params = arrays
    for r, recipe in enumerate(plan):
        if r in c.stochastic and recipe in VALUE_RECIPES and rng.random() < KNOWING_SHARE:
            _knowing_drafter(rng, c, r)
    for r, recipe in enumerate(plan):
        if c.temps[r] > 0 and recipe in _BUILDERS:
            _BUILDERS[recipe](rng, c, r, allowed)
    # The first stochastic request keeps its stochastic decisions: its step 0, and in a block batch
    # every step (a collapsed prefix ratio ends the block's decisions), as do most others there
    # (all of them with one-hot drafts, whose prefix is a product of p(d) over the steps).
    for r in c.stochastic:
        if r == c.stochastic[0] or c.block_mode and (c.draft is None or rng.random() < BLOCK_KEPT_SHARE):
            for i in range(c.n_r[r] if c.block_mode else 1):
                _step_kept(c, r, i)
    c.params = _present(rng, arrays, c.idx)


def _knowing_drafter(rng, c: Contents, r: int) -> None:
    """Drafts of request `r` drawn from a q close to the *masked* target (a drafter that applies the
    same parameters; q is what it sampled from, SPEC section 2): most drafts are then tokens the
    mask keeps and decided by u. Padded steps and saturated target rows keep their drafts."""
    lo, n, s, t = c.lo(r), c.n_r[r], int(c.idx[r]), float(c.temps[r])
    z, mr = c.masked_z(r, np.arange(n))
    rows = c.target[lo : lo + n].astype(np.float64)
    rows[:, : c.v][~mr.kept] = -np.inf
    width = c.v if c.draft is None else c.draft.shape[2]
    sigma = float(np.exp(rng.uniform(*np.log(DRAFT_SIGMA))))
    close = close_draft_rows(rng, rows.astype(np.float32), width, t, sigma, c.dtype, c.bounds[r])
    if not c.masked:  # no -inf allowed in draft logits: masked tokens ZERO_GAP (processed) below the row
        low = np.where(np.isfinite(close), close, np.inf).min(axis=1, keepdims=True)
        fill = low - (t if t > 0 else 1.0) * rng.uniform(*ZERO_GAP, close.shape)
        close = np.where(np.isfinite(close), close, c._fit(fill, c.bounds[r]))
    ids = gumbel_max_drafts(log_softmax_processed(close[:, : c.v], t), np.full(n, c.seeds[s]), c.pos[lo : lo + n])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        keep = (c.drafts(r) < 0) | (masked_probs(z, np.ones_like(mr.kept)).max(axis=1) >= 1.0)
        if r != c.stochastic[0] and rng.random() < CORRUPT_SHARE:  # one id the drafter gave no mass
            i = int(rng.integers(n))
            cand = np.flatnonzero(~mr.kept[i] & np.isfinite(z[i]))
            if cand.size and not keep[i]:
                ids[i] = int(rng.choice(cand))
    ids = np.where(keep, c.drafts(r), ids)
    if c.draft is not None:
        c.draft[s, :n] = np.where(keep[:, None], c.draft[s, :n], close)
    c.draft_ids[lo + 1 : lo + 1 + n] = ids


def _step_kept(c: Contents, r: int, i: int) -> None:
    """The first stochastic request keeps stochastic decisions (as `knob_step` keeps its step 0): a
    draft the mask removes at step `i` is drawn again from q restricted to the kept tokens."""
    lo = c.lo(r)
    d = int(c.draft_ids[lo + 1 + i])
    if lo + i in c.protected or not 0 <= d < c.v:
        return
    z, mr = c.masked_z(r, [i])
    kept = mr.kept[0] & np.isfinite(z[0])
    if kept[d] or not kept.any():
        return
    _, q = c.probs(r)
    with np.errstate(divide="ignore"):
        logq = np.where(kept, np.log(q[i]) if q is not None else 0.0, -np.inf)
    if np.isfinite(logq).any():
        pos = c.pos[lo + i : lo + i + 1]
        c.draft_ids[lo + 1 + i] = int(gumbel_max_drafts(logq[None], [c.seeds[int(c.idx[r])]], pos)[0])


def _order(head) -> np.ndarray:
    """Finite tokens of a row by descending logit (ties by ascending id)."""
    fin = np.flatnonzero(np.isfinite(head))
    return fin[np.argsort(-head[fin], kind="stable")]


def _some_rows(rng, c: Contents, r: int) -> np.ndarray:
    """About half the rows of request `r` (at least one), as global row indices."""
    n = c.n_r[r] + 1
    pick = np.flatnonzero(rng.random(n) < 0.5)
    return c.lo(r) + (pick if pick.size else rng.integers(n, size=1))


def _top_k_tie(rng, c: Contents, r: int, allowed) -> None:
    """top_k = k and, on some rows, 1-3 tokens below the k-th value raised to it (and one above
    lowered to it, a third of the time): `k + c` tokens tie at or above the threshold, all kept."""
    k = int(rng.integers(1, max(1, min(4, c.v - 2)) + 1))
    c.params["top_k"][int(c.idx[r])] = k
    for j in _some_rows(rng, c, r):
        head = c.target[j, : c.v]
        order = _order(head)
        if order.size < k + 2:
            continue
        extra = int(rng.integers(1, min(3, order.size - k - 1) + 1))
        head[order[k : k + extra]] = head[order[k - 1]]
        if k >= 2 and rng.random() < 1 / 3:
            head[order[k - 2]] = head[order[k - 1]]


def _min_p_one(rng, c: Contents, r: int, allowed) -> None:
    """min_p = 1 and, on some rows, 1-3 tokens raised to the row's maximum (tied maxima are kept)."""
    c.params["min_p"][int(c.idx[r])] = 1.0
    for j in _some_rows(rng, c, r):
        head = c.target[j, : c.v]
        order = _order(head)
        if order.size < 3:
            continue
        extra = int(rng.integers(1, min(3, order.size - 2) + 1))
        head[rng.choice(order[1:], extra, replace=False)] = head[order[0]]


def _top_p_tie(rng, c: Contents, r: int, allowed) -> None:
    """On one row, 2-4 tokens among the top three ranks tied; top_p = the mass before the group
    plus `(i - 1/2)` of a tied token's mass, so the first `i` tied tokens (by id) are kept."""
    j = int(_some_rows(rng, c, r)[0])
    head = c.target[j, : c.v]
    order = _order(head)
    if order.size < 3:
        return
    g = int(rng.integers(2, min(4, order.size - 1) + 1))
    a = int(rng.integers(0, min(2, order.size - g) + 1))
    head[order[a : a + g]] = head[order[a]]
    z, mr = c.masked_z(r, [j - c.lo(r)])
    p = masked_probs(z, np.ones_like(mr.kept))[0]
    val = z[0, order[a]]
    group = np.flatnonzero(z[0] == val)
    mass = p[order[a]]
    if mass < TOP_P_MIN_MASS or group.size < 2:
        return
    i = int(rng.integers(1, group.size))
    top_p = np.float32(p[z[0] > val].sum() + (i - 0.5) * mass)
    if 0 < top_p < 1:
        c.params["top_p"][int(c.idx[r])] = top_p
        c.protected.add(j)


def _recipe_step(rng, c: Contents, r: int) -> int | None:
    """`knob_step`, or step 0 where it gives none (the first stochastic request excepted: it keeps
    the batch's stochastic decision)."""
    if r not in c.stochastic:
        return None
    i = knob_step(rng, r, c.n_r, c.stochastic, c.block_mode)
    return 0 if i is None and r != c.stochastic[0] else i


def _masked_draft(rng, c: Contents, r: int, allowed) -> None:
    """A draft (step from `knob_step`) on a token the state's tight mask removes; for model drafts
    its draft logit is made a zero probability half the time (q(d) = 0)."""
    i = _recipe_step(rng, c, r)
    if i is None or (c.drafts(r)[: i + 1] < 0).any():  # padded drafts stay (the step is not reached)
        return
    z, mr = c.masked_z(r, [i])
    cand = np.flatnonzero(~mr.kept[0] & np.isfinite(z[0]))
    if not cand.size:
        return
    d = int(rng.choice(cand))
    j = c.lo(r) + i
    c.draft_ids[j + 1] = d
    c.protected.add(j)
    if c.draft is not None and rng.random() < 0.9:
        row = c.draft[int(c.idx[r]), i, : c.v]
        others = np.delete(row, d)
        if np.isfinite(others).any():
            c.put_draft(r, i, d, c.zero_logit(rng, r, others))


def _empty_residual(rng, c: Contents, r: int, allowed) -> None:
    """Step `i`'s row keeps one token `t` after the mask (top_k = 1, min_p = 1 with a unique
    maximum, or top_p below p(t)), its draft row is saturated on `t`, the draft is elsewhere and
    the drafts before it are the rows' most likely tokens: max(p - q, 0) is empty."""
    i = _recipe_step(rng, c, r)
    if i is None or c.draft is None or (c.drafts(r)[: i + 1] < 0).any():
        return
    lo, s, t_r = c.lo(r), int(c.idx[r]), float(c.temps[r])
    j = lo + i
    head = c.target[j, : c.v]
    order = _order(head)
    if order.size < 2:
        return
    tok = int(order[0])
    ties = order[1:][head[order[1:]] == head[tok]]
    if ties.size:
        c.put(j, ties, head[tok] - c.raw(r, rng.uniform(0.5, 2.0)))
    name = allowed[int(rng.integers(len(allowed)))]
    for other in allowed:
        c.params[other][s] = OFF[other]
    if name == "top_p":
        z, mr = c.masked_z(r, [i])
        c.params["top_p"][s] = np.float32(masked_probs(z, mr.kept)[0, tok] * rng.uniform(0.3, 0.9))
    else:
        c.params[name][s] = 1
    hot = float(rng.standard_normal())
    row = np.full(c.draft.shape[2], hot - (t_r if t_r > 0 else 1.0) * rng.uniform(*SATURATED_DRAFT_GAP))
    row[tok] = hot
    c.put_draft(r, i, slice(None), row)
    c.draft_ids[j + 1] = int(rng.choice(order[1:]))
    p, _ = c.probs(r)
    for a in range(i):  # the most likely token at each earlier step: accepted (p = 1 after a one-token mask)
        c.draft_ids[lo + 1 + a] = int(np.argmax(p[a]))
    c.protected.update(range(lo, j + 1))


def _bonus(rng, c: Contents, r: int, allowed) -> None:
    """Flatten the bonus row (processed logits spread over 1-3, scaled for min-p so it masks) and
    draft at every step the token of largest p / q (largest p for one-hot drafts): accepted."""
    lo, n = c.lo(r), c.n_r[r]
    j = lo + n
    head = c.target[j, : c.v]
    fin = np.flatnonzero(np.isfinite(head))
    if fin.size >= 2:
        m = c.state_params(r)[0]
        spread = rng.uniform(1.0, 3.0) * max(1.0, -np.log(m) if m > 0 else 1.0)
        c.put(j, fin, head[fin].max() - c.raw(r, rng.uniform(0.0, spread, fin.size)))
    p, q = c.probs(r)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(n):
            score = np.log(p[i]) - (0.0 if q is None else np.log(q[i]))
            score[p[i] == 0] = -np.inf
            if c.draft_ids[lo + 1 + i] >= 0:  # padded drafts stay
                c.draft_ids[lo + 1 + i] = int(np.argmax(score))
    c.protected.update(range(lo, j + 1))


_BUILDERS = {"top_k_tie": _top_k_tie, "top_p_tie": _top_p_tie, "min_p_one": _min_p_one, "masked_draft": _masked_draft,
             "empty_residual": _empty_residual, "bonus": _bonus}
assert set(_BUILDERS) <= set(RECIPES) and set(_NEEDS.values()) <= set(SAMPLING_PARAMS)
