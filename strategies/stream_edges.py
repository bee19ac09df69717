"""A stream family's noise edges planted in drawn batches, and their labels (SPEC 3b), read off its record.

Which module plants which family (`PLANTED_FAMILIES`): a family keyed by `(seed, pos)` whose record
lists noise plants (`StreamEdges.plants`: murmur3, murmur3-fp64) is planted here, by aiming
seeds; the explicit family's (SPEC 3c: the batch carries its noise) in `strategies.explicit_edges`;
any other family's draws are left as drawn. Nothing below names a family: a new family with
edges adds `NoisePlant`s to its record.

Random seeds never reach a family's extreme noise (murmur3 gives `u = 1.0` for 128 of the 2**32
hashes, murmur3-fp64 its clamp for one key in 2**53). A `NoisePlant` says where the edge is: its
`keys`, and for a family that can reach it on any key (murmur3 inverts its hash by the seed's low
word) `aim(seed_hi, pos, token)`. A request's seed (and, from the keys, its positions) then put the
edge on a token of its bonus row, whose logit is set so that the noise decides the token, as the
plant's `kind` says (`rs_verify.contract.streams.PLANT_KINDS`):

- `wins`: the token wins by 1-4 nats (a sampler that loses the edge's floor gets `G = -inf` there
  and emits another token: murmur3's `u = 1.0`, murmur3-fp64's `r = 0`);
- `loses`: the token loses by 1-4 nats (a sampler without the edge's clamp gets `G = +inf` and
  emits it: murmur3-fp64's `r = 2**53 - 1`);
- `near`: the token's score is 0.2-1 nats from the best other (below it one time in three), so a
  less precise noise flips it (murmur3's smallest `u`, `G ~ 22.9`: a float32 `log(1 - u)` gives
  `+inf`, triton-philox's floor `TINY` on `u` 21.5);

and, for a family whose noise keys only part of the position (`StreamEdges.pos_period`: murmur3
hashes its low word), `wrap`: a request moved to the positions of another plus the period, with
the same seed: both share their noise while their acceptance uniforms differ.

Positions are moved by multiples of the period (the noise stays) until the request, with the
acceptance uniforms of that seed, accepts every draft and samples its bonus. Only token-wise batches
are planted, and only stochastic requests without sampling parameters (their masks could drop the
planted token); every planted decision is checked after rounding to the batch's dtype, and one that
does not hold is undone.

`stream_knobs(f, bonus_rows)` labels what a batch of the family carries, read off the batch itself
like every other knob; `stream_knob_labels(family)` lists the labels a family's batches can carry.

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract import streams as stream_families
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.explicit import EXPLICIT
from rs_verify.contract.methods import TOKEN

from .facts import Facts, batch_facts
from .logits import round_to_dtype
from .param_events import state_params_on

__all__ = ["PLANTED_FAMILIES", "STREAM_KNOBS", "plant_stream_edges", "stream_knob_labels", "stream_knobs"]

PLANT_SHARE = 0.75  # draws of the family that get planted edges (the rest stay as drawn)
WRAP_SHARE = 0.5  # planted draws that also move a request to another's positions + the period
EDGE_MARGIN = (1.0, 4.0)  # nats a "wins" token wins by, a "loses" token loses by
NEAR_MARGIN = (0.2, 1.0)  # nats between a "near" token's score and the best other's
MIN_MARGIN = 0.1  # after rounding to the dtype: the planted decision holds by at least this much
MAX_TOKENS = 8  # tokens (or keys) of the bonus row tried per request ...
MAX_SHIFTS = 6  # ... each at positions moved by 0 .. 5 periods
_INT64_MAX = 2**63 - 1


def _plants(family) -> tuple:
    edges = family.edges
    return () if edges is None or family.keyed_by != "seed_pos" else edges.plants


def _wrap_label(family) -> str | None:
    period = None if family.edges is None else family.edges.pos_period
    if not period or not _plants(family):
        return None
    shown = f"2**{period.bit_length() - 1}" if period & (period - 1) == 0 else str(period)
    return f"{family.name}: requests at positions p and p + {shown} with one seed"


def stream_knob_labels(family) -> tuple[str, ...]:
    """The knobs a drawn batch of `family` (a record or a registered name) can carry."""
    family = stream_families.family(family)
    wrap = _wrap_label(family)
    return tuple(p.label for p in _plants(family)) + ((wrap,) if wrap else ())


#: Every shipped family's knobs.
STREAM_KNOBS = tuple(k for fam in stream_families.shipped() for k in stream_knob_labels(fam))
#: Which module plants which family's edges (family name -> module).
PLANTED_FAMILIES = {**{fam.name: __name__ for fam in stream_families.shipped() if _plants(fam)},
                    EXPLICIT.name: f"{__package__}.explicit_edges"}


def plant_stream_edges(rng, batch: SpecBatch, family, bounds) -> SpecBatch:
    """`batch` with the family's noise edges planted (see the module docstring), or `batch` itself when
    the family has none, the batch is not token-wise, or no request can take them.
    `bounds`: the largest raw logit magnitude of each request (`strategies.logits.magnitude_bound`)."""
    plants = _plants(family)
    if not plants or batch.verification != TOKEN.name or rng.random() >= PLANT_SHARE:
        return batch
    f = batch_facts(batch, family)
    on = state_params_on(batch)
    free = [int(r) for r in np.flatnonzero(f.stochastic) if not any(on[p][r] for p in on)]
    if not free or f.v < 2:
        return batch
    seeds = np.array(batch.seeds, copy=True)
    pos = np.array(batch.pos, copy=True)
    target = np.array(batch.target_logits, copy=True)
    order = [free[i] for i in rng.permutation(len(free))]
    aimed = []
    for r, i in zip(order, rng.permutation(len(plants))):
        if _aim(rng, f, r, plants[int(i)], seeds, pos, target, bounds[r]):
            aimed.append(r)
    rest = [r for r in order if r not in aimed]
    if rest and _wrap_label(family) and rng.random() < WRAP_SHARE:
        _wrap(f, rest[0], seeds, pos, int(rng.integers(len(f.batch.idx_mapping))), family.edges.pos_period)
    if not aimed and np.array_equal(seeds, batch.seeds):
        return batch
    return batch.replace(seeds=seeds, pos=pos, target_logits=target)


def _reaches_bonus(f: Facts, r: int, seed: int, rows_pos: np.ndarray) -> bool:
    """Whether request `r` accepts every draft with the acceptance uniforms of `seed` at `rows_pos`."""
    b = f.batch
    lo, n = int(b.cu_num_logits[r]), int(b.num_draft_tokens[r])
    if n == 0:
        return True
    u = f.family.uniforms(np.full(n, seed, np.int64), rows_pos[:n]).astype(np.float64)
    d = np.asarray(b.draft_tokens(r), np.int64)
    if ((d < 0) | (d >= f.v)).any():
        return False  # a padded draft is rejected
    rows = lo + np.arange(n)
    with np.errstate(divide="ignore"):
        log_q = np.log(f.q[rows, d]) if f.q is not None else 0.0
        return bool((np.log(f.p[rows, d]) > np.log(u) + log_q).all())


def _candidates(rng, f: Facts, r: int, plant, seeds, pos, period):
    """`(seed, rows' positions, token)` that put `plant`'s edge on request `r`'s bonus row: aimed at
    random tokens of its own positions, or the plant's keys (their positions, the request's length)."""
    b = f.batch
    lo, j = int(b.cu_num_logits[r]), int(b.cu_num_logits[r + 1]) - 1
    shifts = [k * period for k in range(MAX_SHIFTS)] if period else [0]
    if plant.aim is not None:
        seed_hi = (int(seeds[int(b.idx_mapping[r])]) >> 32) & 0xFFFFFFFF
        for x in rng.permutation(f.v)[:MAX_TOKENS]:
            for shift in shifts:
                if int(pos[j]) + shift > _INT64_MAX:
                    break
                rows_pos = pos[lo : j + 1] + shift
                yield plant.aim(seed_hi, int(rows_pos[-1]), int(x)), rows_pos, int(x)
        return
    keys = [k for k in plant.keys if k[2] < f.v]
    for i in rng.permutation(len(keys))[:MAX_TOKENS]:
        seed, p0, x = keys[int(i)]
        for shift in shifts:
            if p0 + shift > _INT64_MAX or p0 + shift - (j - lo) < 0:
                continue
            yield seed, np.arange(p0 + shift - (j - lo), p0 + shift + 1, dtype=np.int64), x


def _aim(rng, f: Facts, r: int, plant, seeds, pos, target, bound) -> bool:
    """Plant `plant` on a token of request `r`'s bonus row (seeds, positions and logits in place)."""
    b = f.batch
    lo, j = int(b.cu_num_logits[r]), int(b.cu_num_logits[r + 1]) - 1
    t = float(f.temps[r])
    for seed, rows_pos, x in _candidates(rng, f, r, plant, seeds, pos, f.family.edges.pos_period):
        if not _reaches_bonus(f, r, seed, rows_pos):
            continue
        logit = _decisive_logit(rng, f, plant.kind, x, seed, int(rows_pos[-1]), j, t, b.logits_dtype)
        if logit is None or abs(logit) > bound:
            return False
        seeds[int(b.idx_mapping[r])], pos[lo : j + 1] = seed, rows_pos
        target[j, x] = logit
        return True
    return False


def _decisive_logit(rng, f: Facts, kind: str, x: int, seed: int, p_j: int, j: int, t: float, dtype) -> float | None:
    """The raw logit of token `x` in bonus row `j` (rounded to `dtype`) that makes its planted noise
    decide the row's Gumbel-max as `kind` says (see the module docstring), or None when rounding leaves
    it closer than `MIN_MARGIN` (or on the wrong side) or the row has no other token."""
    g = f.family.gumbel([seed], [p_j], f.v)[0]
    z = f.z[j, : f.v].astype(np.float64)
    others = np.delete(z + g, x)
    others = others[np.isfinite(others)]
    if others.size == 0:
        return None
    best = float(others.max())
    if kind == "wins":
        want = best - g[x] + rng.uniform(*EDGE_MARGIN)
    elif kind == "loses":
        want = best - g[x] - rng.uniform(*EDGE_MARGIN)
    else:
        sign = -1.0 if rng.random() < 1 / 3 else 1.0
        want = best - g[x] + sign * rng.uniform(*NEAR_MARGIN)
    raw = float(round_to_dtype(np.array([want * t], np.float32), dtype)[0])
    z_x = np.float32(raw) if t == 1 else np.float32(raw) / np.float32(t)  # SPEC section 2's processing
    margin = float(z_x) + g[x] - best
    wrong_side = (kind == "wins" and margin < 0) or (kind == "loses" and margin > 0)
    if not np.isfinite(raw) or abs(margin) < MIN_MARGIN or wrong_side:
        return None
    return raw


def _wrap(f: Facts, r: int, seeds, pos, pick: int, period: int) -> None:
    """Move request `r` to another request's positions plus `period` and give it that request's seed."""
    b = f.batch
    others = [q for q in range(b.num_reqs) if q != r]
    if not others:
        return
    q = others[pick % len(others)]
    lo, hi = int(b.cu_num_logits[r]), int(b.cu_num_logits[r + 1])
    base = int(pos[int(b.cu_num_logits[q])]) + period
    if base + (hi - lo) > _INT64_MAX:
        base -= 2 * period
    if base < 0:
        return
    pos[lo:hi] = base + np.arange(hi - lo)
    seeds[int(b.idx_mapping[r])] = seeds[int(b.idx_mapping[q])]


def stream_knobs(f: Facts, bonus_rows) -> set[str]:
    """The knobs of `stream_knob_labels(f.family)` the batch has. `bonus_rows`: `(request, row)` of the
    stochastic requests that emit their bonus token."""
    plants = _plants(f.family)
    if not plants:
        return set()
    b = f.batch
    knobs = set()
    states = np.asarray(b.idx_mapping, np.int64)
    seeds, cu, pos = np.asarray(b.seeds)[states], np.asarray(b.cu_num_logits), np.asarray(b.pos)
    wrap, period = _wrap_label(f.family), f.family.edges.pos_period
    starts = [(int(seeds[r]), int(pos[cu[r]])) for r in range(b.num_reqs) if cu[r + 1] > cu[r]]
    if wrap and any(s == s2 and p != p2 and (p - p2) % period == 0
                    for i, (s, p) in enumerate(starts) for s2, p2 in starts[:i]):
        knobs.add(wrap)
    edge_g = [(p, _edge_noise(f.family, p)) for p in plants]
    for r, j in bonus_rows:
        g = f.family.gumbel([seeds[r]], [pos[j]], f.v)[0]
        with np.errstate(divide="ignore"):
            score = np.log(f.p[j, : f.v]) + g
        best = int(np.argmax(score))
        for plant, value in edge_g:
            for x in np.flatnonzero(g == value):
                rest = np.delete(score, x)
                if not np.isfinite(score[x]) or not rest.size:
                    continue
                gap = float(score[x] - rest.max())
                if ((plant.kind == "wins" and best == x) or (plant.kind == "loses" and -5.0 <= gap < 0)
                        or (plant.kind == "near" and abs(gap) <= 2.0)):
                    knobs.add(plant.label)
    return knobs


def _edge_noise(family, plant) -> float:
    """The noise value at the plant's edge (every key of it gives the same)."""
    seed, p, x = plant.keys[0]
    return float(family.gumbel([seed], [p], x + 1)[0, x])
