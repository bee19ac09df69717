"""Edge cases that `decision_batches` plants in its contents (NumPy only, in place).

- `heavy_tail`: target tokens `[V', V)` that no draft proposes, at or above the row's largest;
- `tie_maxima`, `greedy_tie_drafts`: exact ties among the maxima, greedy drafts on a tied maximum;
- `saturate`: target and draft saturated on one token, a draft elsewhere (empty residual);
- `pad`: padded draft ids in stochastic requests, often at step 0;
- `knob_step`: which step of a request such a knob takes.

Imports only NumPy.
"""

from __future__ import annotations

import numpy as np

from .drafts import padded_ids
from .logits import ONE_HOT_GAP, round_to_dtype

SATURATED_DRAFT_GAP = (60.0, 600.0)  # processed gap of a saturated draft row: q(t) == 1 in float64


def heavy_tail(rng, target, v_eff, cu, bounds, dtype) -> None:
    """Target tokens `[V', V)` that no draft can propose, and that p excludes (SPEC section 1),
    given logits at or above the row's largest in `[0, V')` on about half the rows: a sampler that
    normalises or takes its argmax over `V` instead of `V'` then moves every decision of the row
    (in place)."""
    for r in range(len(cu) - 1):
        for j in range(int(cu[r]), int(cu[r + 1])):
            head = target[j, :v_eff]
            finite = head[np.isfinite(head)]
            if finite.size and rng.random() < 0.5:
                top = float(finite.max()) + rng.uniform(0.0, 3.0, target.shape[1] - v_eff)
                tail = np.minimum(top, bounds[r]).astype(np.float32)
                target[j, v_eff:] = round_to_dtype(tail, dtype)


def tie_maxima(rng, target, v_eff) -> None:
    """Give about half the rows (at least one) 2-4 exactly equal maxima over `[0, v_eff)`, never all
    of `[0, v_eff)`: the greedy argmax must take the lowest index (in place)."""
    n = target.shape[0]
    if n == 0 or v_eff < 3:
        return
    rows = np.flatnonzero(rng.random(n) < 0.5)
    for j in rows if rows.size else rng.integers(n, size=1):
        head = target[j, :v_eff]
        m = int(rng.integers(2, min(4, v_eff - 1) + 1))
        head[rng.choice(v_eff, m, replace=False)] = head.max()


def greedy_tie_drafts(rng, target, lo, n, v_eff, draft_ids) -> None:
    """Greedy drafts on rows with tied maxima: half the time a tied maximum above the lowest
    index (SPEC section 4 rejects it: the argmax is the lowest index)."""
    for i in range(n):
        head = target[lo + i, :v_eff]
        top = np.flatnonzero(head == head.max())
        if top.size >= 2 and rng.random() < 0.5:
            draft_ids[lo + 1 + i] = int(rng.choice(top[1:]))


def knob_step(rng, r, n_r, stochastic, block=False) -> int | None:
    """The step of request `r` a knob (padding, saturation) takes, or None: step 0 two times in
    three (it is then reached), a random step otherwise. The first stochastic request keeps its
    step 0 (the knob takes a later step, or none), so the batch keeps a stochastic decision.
    In a block batch (`block`) the knob takes a step inside the block (`1 <= i < n`, the last
    half the time; step 0, a third of the time, when `n == 1`): a block cut at step 0 decides
    nothing."""
    n = n_r[r]
    if block:  # the last step half the time (the longest block before it), else any step >= 1
        if n < 2:
            return 0 if r != stochastic[0] and rng.random() < 1 / 3 else None
        return n - 1 if rng.random() < 0.5 else int(rng.integers(1, n))
    if r == stochastic[0]:
        return int(rng.integers(1, n)) if n >= 2 else None
    return 0 if rng.random() < 2 / 3 else int(rng.integers(n))


def saturate(rng, target, draft, draft_ids, cu, idx, temps, n_r, stochastic, v_eff, dtype, masked,
             block=False) -> None:
    """Saturate one or two steps of stochastic requests: target and draft rows put all their
    mass on the same token `t` (target: the rest `ONE_HOT_GAP` below or `-inf`; draft: a
    processed gap in [60, 600], so q(t) == 1 in float64), and the draft id is another token,
    which the test rejects. The residual max(p - q, 0) then has no positive mass. In a block
    batch (`block`) the step lies inside the block (see `knob_step`)."""
    if v_eff < 2 or not stochastic or draft is None:
        return
    chosen = rng.choice(stochastic, size=min(len(stochastic), int(rng.integers(1, 3))), replace=False)
    for r in chosen:
        i, t_r = knob_step(rng, r, n_r, stochastic, block), float(temps[r])
        if i is None:
            continue
        j, tok = int(cu[r] + i), int(rng.integers(v_eff))
        hot = rng.standard_normal()
        row = np.full(target.shape[1], hot - ONE_HOT_GAP)
        if masked and rng.random() < 0.5:
            row[:] = -np.inf
        row[tok] = hot
        target[j] = round_to_dtype(row.astype(np.float32), dtype)
        hot_q = rng.standard_normal()
        q_row = np.full(draft.shape[2], hot_q - t_r * rng.uniform(*SATURATED_DRAFT_GAP))
        q_row[tok] = hot_q
        draft[idx[r], i] = round_to_dtype(q_row.astype(np.float32), dtype)
        other = int(rng.integers(v_eff - 1))
        draft_ids[j + 1] = other + (other >= tok)


def pad(rng, draft_ids, cu, n_r, stochastic, v_eff, block=False) -> None:
    """Padded draft ids: one step of a stochastic request (see `knob_step`), plus up to a third of
    the verified positions other than the first steps of stochastic requests (none in a block
    batch, `block`, whose padded step is mid-block: a padded draft ends the block)."""
    verified = np.concatenate([np.arange(cu[r] + 1, cu[r] + 1 + n_r[r]) for r in range(len(n_r))] + [[]])
    verified = verified.astype(np.int64)
    if verified.size == 0:
        return
    firsts = np.array([cu[r] + 1 for r in stochastic], np.int64)  # step 0 of stochastic requests: knob_step's
    others = verified[~np.isin(verified, firsts)]
    where = others[rng.random(others.size) < rng.uniform(0.0, 0.33)] if not block else others[:0]
    if stochastic:
        r = int(rng.choice(stochastic[1:] or stochastic))
        i = knob_step(rng, r, n_r, stochastic, block)
        if i is not None:
            where = np.append(where, cu[r] + 1 + i)
    if where.size == 0 and others.size:
        where = others[rng.integers(others.size, size=1)]
    draft_ids[where] = padded_ids(rng, where.size, v_eff)
