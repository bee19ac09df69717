"""The murmur3 family's edges planted in drawn batches, and their labels (SPEC 3b).

Which module plants which family (`PLANTED_FAMILIES`): murmur3's edges here, by aiming seeds; the
explicit family's (SPEC 3c: the batch carries its noise) in `strategies.explicit_edges`; the other
families' draws are left as drawn. Everything below is murmur3's own.

Random seeds never reach a family's extreme noise: murmur3 gives `u = 1.0` for 128 of the 2**32
hashes and its smallest uniform `2**-33` for one. But its noise of token `x` hashes
`(seed_lo, seed_hi, pos_lo, x)`, and for any target hash one `seed_lo` reaches it
(`rs_verify.contract.murmur3.seed_for_hash`), so a request's seed can put that noise on a chosen
token of its bonus row, whose logit is then set so that the noise decides the token:

- `top`: `u = 1.0` (hash `2**32 - 1`), the floored noise `G = -log(24 log 2)`: the token's logit is
  raised until it wins there by 1-4 nats; a sampler without the floor (`log(1 - u) = -inf`, so
  `G = -inf`) emits another token;
- `smallest`: `u = 2**-33` (hash 0), `G ~ 22.9`: the token's logit is set 0.2-1 nats above the best
  other score (below it one time in three); a sampler whose `G` is off by more (a float32
  `log(1 - u)`: `+inf`; triton-philox's floor `TINY` on `u`: `G ~ 21.5`) emits another token;
- `wrap`: a request moved to the positions of another request plus `2**32`, with the same seed:
  only `pos_lo` is hashed, so both share their noise while their acceptance uniforms differ
  (Philox keys the whole position).

The seed is searched (the tokens of the row, positions moved by multiples of `2**32`) until the
request, with the acceptance uniforms of that seed, accepts every draft and samples its bonus.
Only token-wise batches are planted, and only stochastic requests without sampling parameters
(their masks could drop the planted token); the other batches of the family, and every batch of
another family, are left as drawn. Every planted decision is checked after rounding to the
batch's dtype; one that does not hold is undone.

`stream_knobs(f, bonus_rows)` labels what a batch of the murmur3 family carries (`STREAM_KNOBS`), read
off the batch itself like every other knob.

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract import murmur3
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.explicit import EXPLICIT
from rs_verify.contract.methods import TOKEN

from .facts import Facts, batch_facts
from .logits import round_to_dtype
from .param_events import state_params_on

__all__ = ["PLANTED_FAMILIES", "STREAM_KNOBS", "plant_stream_edges", "stream_knobs"]

TOP = "murmur3: u = 1.0 (floored noise) wins a bonus token"
SMALLEST = "murmur3: the smallest u (2**-33) decides a bonus token"
WRAP = "murmur3: requests at positions p and p + 2**32 with one seed"
STREAM_KNOBS = (TOP, SMALLEST, WRAP)

#: Which module plants which family's edges (family name -> module): murmur3's noise is aimed by the
#: seed (here), the explicit family's is written into the batch (`strategies.explicit_edges`).
PLANTED_FAMILIES = {murmur3.MURMUR3.name: __name__, EXPLICIT.name: f"{__package__}.explicit_edges"}

PLANT_SHARE = 0.75  # draws of the family that get planted edges (the rest stay as drawn)
WRAP_SHARE = 0.5  # planted draws that also move a request to another's positions + 2**32
TOP_MARGIN = (1.0, 4.0)  # nats the floored-noise token wins by
SMALLEST_MARGIN = (0.2, 1.0)  # nats between the smallest-u token's score and the best other's
MIN_MARGIN = 0.1  # after rounding to the dtype: the planted decision holds by at least this much
MAX_TOKENS = 8  # tokens of the bonus row tried per request ...
MAX_SHIFTS = 6  # ... each at positions moved by 0 .. 5 times 2**32
TOP_HASH, SMALLEST_HASH = 2**32 - 1, 0
_W = 2**32
_INT64_MAX = 2**63 - 1


def plant_stream_edges(rng, batch: SpecBatch, family, bounds) -> SpecBatch:
    """`batch` with murmur3's edges planted (see the module docstring), or `batch` itself when the
    family is another, the batch is not token-wise, or no request can take them.
    `bounds`: the largest raw logit magnitude of each request (`strategies.logits.magnitude_bound`)."""
    if family.name != murmur3.MURMUR3.name or batch.verification != TOKEN.name or rng.random() >= PLANT_SHARE:
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
    for r, kind in zip(order, [("top", "smallest")[i] for i in rng.permutation(2)]):
        if _aim(rng, f, r, kind, seeds, pos, target, bounds[r]):
            aimed.append(r)
    rest = [r for r in order if r not in aimed]
    if rest and rng.random() < WRAP_SHARE:
        _wrap(rng, f, rest[0], seeds, pos)
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


def _aim(rng, f: Facts, r: int, kind: str, seeds, pos, target, bound) -> bool:
    """Plant `kind` on a token of request `r`'s bonus row (seeds, positions and logits in place)."""
    b = f.batch
    lo, n = int(b.cu_num_logits[r]), int(b.num_draft_tokens[r])
    j, s = lo + n, int(b.idx_mapping[r])
    seed_hi = (int(seeds[s]) >> 32) & (_W - 1)
    t = float(f.temps[r])
    for x in rng.permutation(f.v)[:MAX_TOKENS]:
        x = int(x)
        for k in range(MAX_SHIFTS):
            if int(pos[j]) + k * _W > _INT64_MAX:
                break
            rows_pos = pos[lo : j + 1] + k * _W
            seed = murmur3.seed_for_hash(TOP_HASH if kind == "top" else SMALLEST_HASH, seed_hi, int(rows_pos[-1]), x)
            if not _reaches_bonus(f, r, seed, rows_pos):
                continue
            logit = _decisive_logit(rng, f, kind, x, seed, int(rows_pos[-1]), j, t, b.logits_dtype)
            if logit is None or abs(logit) > bound:
                return False
            seeds[s], pos[lo : j + 1] = seed, rows_pos
            target[j, x] = logit
            return True
    return False


def _decisive_logit(rng, f: Facts, kind: str, x: int, seed: int, p_j: int, j: int, t: float, dtype) -> float | None:
    """The raw logit of token `x` in bonus row `j` (rounded to `dtype`) that makes its planted noise
    decide the row's Gumbel-max (see the module docstring), or None when rounding leaves it closer
    than `MIN_MARGIN` or the row has no other token."""
    g = f.family.gumbel([seed], [p_j], f.v)[0]
    z = f.z[j, : f.v].astype(np.float64)
    others = np.delete(z + g, x)
    others = others[np.isfinite(others)]
    if others.size == 0:
        return None
    best = float(others.max())
    if kind == "top":
        want = best - g[x] + rng.uniform(*TOP_MARGIN)
    else:
        sign = -1.0 if rng.random() < 1 / 3 else 1.0
        want = best - g[x] + sign * rng.uniform(*SMALLEST_MARGIN)
    raw = float(round_to_dtype(np.array([want * t], np.float32), dtype)[0])
    z_x = np.float32(raw) if t == 1 else np.float32(raw) / np.float32(t)  # SPEC section 2's processing
    margin = float(z_x) + g[x] - best
    if not np.isfinite(raw) or abs(margin) < MIN_MARGIN or (kind == "top" and margin < 0):
        return None
    return raw


def _wrap(rng, f: Facts, r: int, seeds, pos) -> None:
    """Move request `r` to another request's positions plus `2**32` and give it that request's seed."""
    b = f.batch
    others = [q for q in range(b.num_reqs) if q != r]
    if not others:
        return
    q = others[int(rng.integers(len(others)))]
    lo, hi = int(b.cu_num_logits[r]), int(b.cu_num_logits[r + 1])
    base = int(pos[int(b.cu_num_logits[q])]) + _W
    if base + (hi - lo) > _INT64_MAX:
        base -= 2 * _W
    if base < 0:
        return
    pos[lo:hi] = base + np.arange(hi - lo)
    seeds[int(b.idx_mapping[r])] = seeds[int(b.idx_mapping[q])]


def stream_knobs(f: Facts, bonus_rows) -> set[str]:
    """The knobs of `STREAM_KNOBS` the batch has in the murmur3 family (none in another family).
    `bonus_rows`: `(request, row)` of the stochastic requests that emit their bonus token."""
    if f.family.name != murmur3.MURMUR3.name:
        return set()
    b = f.batch
    knobs = set()
    states = np.asarray(b.idx_mapping, np.int64)
    seeds, cu, pos = np.asarray(b.seeds)[states], np.asarray(b.cu_num_logits), np.asarray(b.pos)
    starts = [(int(seeds[r]), int(pos[cu[r]])) for r in range(b.num_reqs) if cu[r + 1] > cu[r]]
    if any(s == s2 and p != p2 and (p - p2) % _W == 0 for i, (s, p) in enumerate(starts) for s2, p2 in starts[:i]):
        knobs.add(WRAP)
    for r, j in bonus_rows:
        h = murmur3.hash_words(*murmur3.key_words(seeds[r], pos[j], np.arange(f.v)))
        u = murmur3.uniform_from_hash(h)
        top, small = np.flatnonzero(u == 1.0), np.flatnonzero(h == SMALLEST_HASH)
        if not top.size and not small.size:
            continue
        with np.errstate(divide="ignore"):
            score = np.log(f.p[j, : f.v]) + murmur3.noise_from_uniform(u)
        win = int(np.argmax(score))
        if win in top:
            knobs.add(TOP)
        for x in small:
            rest = np.delete(score, x)
            if np.isfinite(score[x]) and rest.size and abs(score[x] - rest.max()) <= 2.0:
                knobs.add(SMALLEST)
    return knobs
