"""Explicit-family edges planted in drawn batches, and their labels (SPEC 3c, 4 and 8).

A sampler of the `explicit` family takes its random numbers from the batch, so the strategies
can put them on the decision boundaries that its fixed draw (`rs_verify.contract.explicit.filled`)
never reaches. In `PLANT_SHARE` of the token-wise draws of the family the batch is given all three
noise fields: the family's draw (what the tilts of `strategies.decisions` aimed at), with edges
written at places and values drawn from the content generator, on stochastic requests without
sampling parameters:

- `ACCEPT_EXTREME`: `u = 2**-53` or `1 - 2**-53` (float32 rounds it to 1) on a deciding row, only
  where the test is decided by more than `SAFE * L` (no excusal for a correct float32 sampler);
- `NOISE_EXTREME`: the Gumbel noise of those uniforms, `G = 36.7` on a token with `r = 0` in
  float32 too (`p = 0`, the rejected one-hot draft, `p <= (1 - SAFE) q`; the row's winner when none
  has), `G = -3.6` on a losing token;
- `NOISE_TIE`, in up to `TIES` requests: two tokens of equal residual above `exp(TIE_FLOOR)` (equal
  logits; in a bonus row one logit is copied when no two are equal) get equal noise within
  `[G_LO, G_HI]`, the row's best score by 0.5-2 nats: an exact tie, which a correct sampler breaks
  to the lowest index like the reference (equal inputs, equal scores);
- `U_BOTTOM`: `U = 2**-53` where the first positive token holds at least `SAFE` of the residual;
- and in `TIE_CLASS_SHARE` of the planted draws one tie-class plant, where a correct float32
  sampler may decide otherwise and is excused (SPEC 8): `ACCEPT_BOUNDARY`, `u = p(d) / q(d)`
  (one-hot: `p(d)`) or one ulp either side on a deciding row (margin 0 or one ulp); `PREFIX_BOUNDARY`,
  `U` on a prefix sum of the sampled residual (`U * S == S_b` in float64, margin 0); `U_TOP`,
  `U = 1 - 2**-53`, where float32 rounding leaves no prefix sum above `U * S` (SPEC 4's fallback).

The rows, residuals and margins are the reference's, operation for operation (`walk`, `_row_logp`;
the prefix sums are `rs_verify.contract.explicit.prefix_fractions`, which the reference uses): the first rejected row's residual (`max(p - q, 0)`, `p` without the one-hot
draft, `p` after a padded draft or an empty residual) or the bonus row's `p`. Block batches and
requests with sampling parameters are left as drawn.

`explicit_knobs(f)` labels what a batch of the family carries (`EXPLICIT_KNOBS`), read off the
batch itself like every other knob.

Imports only NumPy and the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rs_verify.contract import probs
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.explicit import EXPLICIT, filled, prefix_fractions, resample_uniforms
from rs_verify.contract.methods import TOKEN

from .facts import Facts
from .param_events import state_params_on

__all__ = ["EXPLICIT_KNOBS", "TIE_CLASS_KNOBS", "Walk", "explicit_knobs", "plant_explicit_edges", "walk"]

ACCEPT_EXTREME = "explicit: u = 2**-53 or 1 - 2**-53 on a deciding row"
ACCEPT_BOUNDARY = "explicit: u = p(d) / q(d) (to one ulp) on a deciding row"
NOISE_EXTREME = "explicit: resample noise of u = 2**-53 and 1 - 2**-53 in a stochastic request"
NOISE_TIE = "explicit: two tokens tie for the best score of a sampled row"
PREFIX_BOUNDARY = "explicit: U * S on a prefix sum of the sampled residual"
U_TOP = "explicit: U = 1 - 2**-53 (no float32 prefix sum above U * S)"
U_BOTTOM = "explicit: U = 2**-53"
EXPLICIT_KNOBS = (ACCEPT_EXTREME, ACCEPT_BOUNDARY, NOISE_EXTREME, NOISE_TIE, PREFIX_BOUNDARY, U_TOP, U_BOTTOM)
#: The plants where a correct float32 sampler may diverge (excused, SPEC 8, but counted against the cap).
TIE_CLASS_KNOBS = (ACCEPT_BOUNDARY, PREFIX_BOUNDARY, U_TOP)

U_LO, U_HI = 2.0**-53, 1.0 - 2.0**-53  # the extreme uniforms (`U_HI` rounds to 1 in float32)
G_HI, G_LO = -np.log(-np.log(U_HI)), -np.log(-np.log(U_LO))  # their Gumbel noise: 36.74, -3.60

PLANT_SHARE = 0.75  # token-wise draws of the family that get planted edges (the rest keep the family's draw)
# Draws that also get one tie-class plant (ACCEPT_BOUNDARY, PREFIX_BOUNDARY or U_TOP: the kind drawn,
# the next in turn where no request takes it). Certification allows max(2, 1%) excused divergences
# per certified batch (the draw and three reseeded copies, whose noise is drawn afresh: the plants
# stay in the first copy), so one tie-class plant per draw leaves room for one natural near-tie.
# Measured over 600 certified batches (10 digests x 60 ci examples) with the example samplers
# (examples/explicit_sampler.py): gumbel and race 30 batches with one excused divergence, vLLM's
# p / q >= u 58, inverse CDF 72, every one in a draw with a tie-class plant (357 of 600), none with
# two; 80 excused of 19,343 stochastic decisions at most (0.4%). Without planting: 2 batches with 4
# (one near-empty residual in all four copies), the same 2 with planting.
TIE_CLASS_SHARE = 0.75
ACCEPT_EXTREMES = 2  # deciding rows per planted draw given u = 2**-53 or 1 - 2**-53
# Requests per planted draw given an exact tie. A correct sampler breaks an exact tie as the reference
# does (equal inputs give equal float32 scores): measured, no excusal outside the draws with a
# tie-class plant. A sampler that breaks ties to another token is excused tie by tie; three in one
# draw exceed the cap of two, so the cap catches it.
TIES = 3
SAFE = 1e-3  # a safe plant's margin over L (excusal: eps = 2e-4; float32 error ~1e-6)
TIE_LEAD = (0.5, 2.0)  # nats the planted tie leads the row's other scores by
BOUNDARY_ULPS = 8 * 2.0**-52  # an acceptance margin within this (times L) is on the boundary
MAX_PAIRS = 8  # tied pairs tried per request
TIE_FLOOR = -60.0  # tied tokens keep log r above this: r is a normal float32 number (a float32 sampler sees it)
Q_FREE_LOG = -126 * np.log(2.0)  # a draft with q(d) below 2**-126 is accepted or rejected freely (SPEC 4)


@dataclass(frozen=True)
class Walk:
    """Request `r`'s acceptance walk in the reference's float64 (SPEC 4: accept iff `log p(d) > log u +
    log q(d)`). `tests`: `(row, log p(d), log q(d) (0: one-hot), free)` of each evaluated test of a
    valid draft (`free`: `q(d)` below `2**-126`); `row`: the row that samples; `logr`: the reference's
    log residual there (`-inf` where `r = 0`); `zq`: the draft logits of that row when `logr` is
    `log max(p - q, 0)` (equal residuals need equal draft logits too), else None; `dropped`: the
    one-hot draft a rejection removed from `p`, else None."""

    tests: list
    row: int
    logr: np.ndarray
    zq: np.ndarray | None = None
    dropped: int | None = None

    def zeros(self, z32: np.ndarray) -> np.ndarray:
        """Tokens with `r = 0` in float32 too: `p = 0`, the dropped draft, or `p <= (1 - SAFE) q`."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            logp = _row_logp(z32)[0]
            out = logp == -np.inf
            if self.zq is not None:
                out |= np.exp(logp) <= (1 - SAFE) * np.exp(_row_logp(self.zq)[0])
        if self.dropped is not None:
            out[self.dropped] = True
        return out & (self.logr == -np.inf)


def _row_logp(z32: np.ndarray):
    """`(log p, exp(z - max), sum)` of one float32 row in float64, as `reference.logits.softmax_parts`."""
    m = np.float64(z32.max())
    y = np.subtract(z32, m, dtype=np.float64)
    e = np.exp(y)
    s = e.sum()
    return y - np.log(s), e, s


def _draft_z(b: SpecBatch, r: int, i: int) -> np.ndarray:
    s = int(b.idx_mapping[r])
    return probs.process(np.asarray(b.draft_logits)[s, i, : b.effective_vocab_size], np.asarray(b.temperature)[s])


def walk(b: SpecBatch, z: np.ndarray, r: int, u: np.ndarray) -> Walk:
    """Request `r`'s `Walk` with processed logits `z` (float32 `[N, V']`) and acceptance uniforms `u` `[N]`."""
    lo, n, v = int(b.cu_num_logits[r]), int(b.num_draft_tokens[r]), z.shape[1]
    model = b.draft_logits is not None
    tests = []
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        for i in range(n):
            j, d = lo + i, int(b.draft_token_ids[lo + i + 1])
            logp, e, s = _row_logp(z[j])
            if not 0 <= d < v:
                return Walk(tests, j, logp)  # a padded draft proposed nothing: p
            zq = _draft_z(b, r, i) if model else None
            logq, eq, sq = _row_logp(zq) if model else (None, None, None)
            lq = float(logq[d]) if model else 0.0
            tests.append((j, float(logp[d]), lq, lq < Q_FREE_LOG))
            if logp[d] > np.log(u[j]) + lq:
                continue
            if model:  # reference.slab.resample: (e / s) - (eq / sq), clipped at 0; empty: p
                res = np.maximum(e / s - eq / sq, 0.0)
                return Walk(tests, j, np.log(res), zq) if res.any() else Walk(tests, j, logp)
            logr = logp.copy()
            logr[d] = -np.inf
            return Walk(tests, j, logr, dropped=d) if (logr > -np.inf).any() else Walk(tests, j, logp)
        return Walk(tests, lo + n, _row_logp(z[lo + n])[0])


def _margin(t, u: float) -> float:
    """The reference's acceptance margin `log p(d) - log q(d) - log u` of test `t` at `u`."""
    return t[1] - t[2] - float(np.log(u))


def _scale(t) -> float:
    return max(1.0, abs(t[1]), abs(t[2]))


def _free(b: SpecBatch, stochastic) -> list[int]:
    """Stochastic requests without sampling parameters: the requests planted and labelled."""
    on = state_params_on(b)
    return [int(r) for r in np.flatnonzero(stochastic) if not any(on[p][r] for p in on)]


class _Plant:
    """The three noise fields being planted (the family's draw to start with) and the target logits."""

    def __init__(self, b: SpecBatch, z: np.ndarray):
        full = filled(b)
        self.b, self.z, self.v = b, np.array(z, copy=True), z.shape[1]
        self.u = np.array(full.accept_uniforms, copy=True)
        self.g = np.array(full.resample_gumbel, copy=True)
        self.U = np.array(full.resample_uniforms, copy=True)
        self.target = None  # a copy once a tie copies a logit
        self.at_u = set()  # requests whose U is planted

    def walk(self, r) -> Walk:
        return walk(self.b, self.z, r, self.u)

    def accept_extreme(self, rng, r) -> bool:
        tests = self.walk(r).tests
        for t in (tests[i] for i in rng.permutation(len(tests))):
            for u in rng.permutation([U_LO, U_HI]):
                if not t[3] and t[1] > -np.inf and abs(_margin(t, u)) > SAFE * _scale(t):
                    self.u[t[0]] = u
                    return True
        return False

    def accept_boundary(self, rng, r) -> bool:
        tests = [t for t in self.walk(r).tests if not t[3] and 2.0**-52 <= np.exp(t[1] - t[2]) <= 1 - 2.0**-52]
        if not tests:
            return False
        t = tests[int(rng.integers(len(tests)))]
        u = float(np.exp(t[1] - t[2]))
        self.u[t[0]] = (u, np.nextafter(u, 0.0), np.nextafter(u, 1.0))[int(rng.integers(3))]
        return True

    def noise_tie(self, rng, r) -> bool:
        w = self.walk(r)
        z, bonus = self.z[w.row], w.row == int(self.b.cu_num_logits[r + 1]) - 1
        pos = np.flatnonzero(w.logr > TIE_FLOOR)
        pairs = [(a, c) for k, a in enumerate(pos) for c in pos[k + 1 :] if z[a] == z[c]
                 and (w.zq is None or w.zq[a] == w.zq[c])]
        for k in rng.permutation(len(pairs))[:MAX_PAIRS]:
            if self._tie(rng, r, w.logr, *pairs[k]):
                return True
        if pairs or not bonus or not pos.size or self.v < 2:
            return False
        # The bonus row's p alone (no acceptance test reads it): copy one logit onto another token.
        a = int(pos[int(rng.integers(pos.size))])
        c = int((a + 1 + rng.integers(self.v - 1)) % self.v)
        target = np.array(self.b.target_logits if self.target is None else self.target, copy=True)
        target[w.row, c] = target[w.row, a]
        old, s = self.z[w.row].copy(), int(self.b.idx_mapping[r])
        self.z[w.row] = probs.process(target[w.row, : self.v], np.asarray(self.b.temperature)[s])
        if self._tie(rng, r, self.walk(r).logr, min(a, c), max(a, c)):
            self.target = target
            return True
        self.z[w.row] = old
        return False

    def _tie(self, rng, r, logr, a, c) -> bool:
        """Equal noise on tokens `a` and `c` (equal residuals), within the range of the family's noise
        (`[G_LO, G_HI]`), leading the row's other scores by `TIE_LEAD`; False when none fits."""
        g = self.g[r]
        with np.errstate(invalid="ignore"):
            others = np.delete(logr + g, [a, c])
        others = others[np.isfinite(others)]
        if not others.size:
            g[c] = g[a]
            return True
        lead = float(others.max()) - logr[a]
        value = float(np.clip(lead + rng.uniform(*TIE_LEAD), G_LO, G_HI))
        if value - lead < TIE_LEAD[0]:
            return False
        g[a] = g[c] = value
        return True

    def noise_extreme(self, rng, r) -> bool:
        w = self.walk(r)
        logr, g = w.logr, self.g[r]
        zero = np.flatnonzero(w.zeros(self.z[w.row]))
        with np.errstate(invalid="ignore"):
            top = int(zero[int(rng.integers(zero.size))]) if zero.size else int(np.argmax(logr + g))
        if g[top] > G_HI:
            return False
        g[top] = G_HI
        with np.errstate(invalid="ignore"):
            win = int(np.argmax(logr + g))
        losers = np.flatnonzero((np.arange(self.v) != win) & (np.arange(self.v) != top) & (g > G_LO))
        if losers.size:
            g[losers[int(rng.integers(losers.size))]] = G_LO
        return True

    def prefix_boundary(self, rng, r) -> bool:
        logr = self.walk(r).logr
        positive, c = (a[0] for a in prefix_fractions(logr[None]))
        s = np.cumsum(np.exp(logr))
        with np.errstate(invalid="ignore"):
            ok = np.flatnonzero(positive & (c >= U_LO) & (c <= U_HI) & (c * s[-1] == s))
        return self._put_u(r, c[ok[int(rng.integers(ok.size))]] if ok.size else None)

    def u_top(self, rng, r) -> bool:
        return self._put_u(r, U_HI)

    def u_bottom(self, rng, r) -> bool:
        positive, c = (a[0] for a in prefix_fractions(self.walk(r).logr[None]))
        first = np.flatnonzero(positive)
        return self._put_u(r, U_LO if first.size and c[first[0]] >= SAFE else None)

    def _put_u(self, r, value) -> bool:
        if value is None or r in self.at_u:
            return False
        self.U[r] = value
        self.at_u.add(r)
        return True

    def batch(self) -> SpecBatch:
        extra = {} if self.target is None else {"target_logits": self.target}
        return self.b.replace(accept_uniforms=self.u, resample_gumbel=self.g, resample_uniforms=self.U, **extra)


def _first(rng, requests, plant) -> int | None:
    """The first request in `requests` (in random order) that takes `plant`."""
    for r in (requests[i] for i in rng.permutation(len(requests))):
        if plant(rng, r):
            return r
    return None


def plant_explicit_edges(rng, batch: SpecBatch, family) -> SpecBatch:
    """`batch` with the explicit family's edges planted (see the module docstring), or `batch`
    itself when the family is another, the batch is not token-wise or the draw is not planted."""
    if family.name != EXPLICIT.name or batch.verification != TOKEN.name or rng.random() >= PLANT_SHARE:
        return batch
    stochastic = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, np.int64)] > 0
    free = _free(batch, stochastic)
    if not free:
        return batch
    p = _Plant(batch, probs.processed_logits(batch, masked=False))
    for _ in range(ACCEPT_EXTREMES):
        _first(rng, free, p.accept_extreme)
    # The tie-class plant: its kind drawn, the next kinds in turn where no request takes it.
    kinds = list(np.roll(range(3), -int(rng.integers(3)))) if rng.random() < TIE_CLASS_SHARE else []
    if kinds and kinds[0] == 0:  # acceptance plants first: they move the row that samples
        kinds = [] if _first(rng, free, p.accept_boundary) is not None else kinds[1:]
    tied = []  # before the U plants: a tie may copy a logit of a bonus row
    for _ in range(TIES):
        tied.append(_first(rng, [r for r in free if r not in tied], p.noise_tie))
    _first(rng, [r for r in free if r not in tied], p.noise_extreme)
    for kind in kinds:
        if kind and _first(rng, free, (p.prefix_boundary, p.u_top)[kind - 1]) is not None:
            break
    _first(rng, free, p.u_bottom)
    return p.batch()


def explicit_knobs(f: Facts) -> set[str]:
    """The knobs of `EXPLICIT_KNOBS` a token-wise batch carrying explicit noise has (none for
    another family), read in the reference's float64 at its free stochastic requests."""
    b = f.batch
    if f.family.name != EXPLICIT.name or b.verification != TOKEN.name or not b.noise_carried():
        return set()
    reqs = np.arange(b.num_reqs)
    g, big_u = EXPLICIT.noise(b, reqs, f.v), resample_uniforms(b, reqs)
    knobs = set()
    for r in _free(b, f.stochastic):
        w = walk(b, f.z, r, f.u)
        for t in w.tests:
            u = f.u[t[0]]
            if u in (U_LO, U_HI):
                knobs.add(ACCEPT_EXTREME)
            if not t[3] and t[1] > -np.inf and abs(_margin(t, u)) <= BOUNDARY_ULPS * _scale(t):
                knobs.add(ACCEPT_BOUNDARY)
        if (g[r] == G_HI).any() or (g[r] == G_LO).any():
            knobs.add(NOISE_EXTREME)
        with np.errstate(invalid="ignore"):
            scores = np.sort((w.logr + g[r])[w.logr > -np.inf])
        if scores.size >= 2 and scores[-1] == scores[-2]:
            knobs.add(NOISE_TIE)
        knobs |= {U_TOP} if big_u[r] == U_HI else {U_BOTTOM} if big_u[r] == U_LO else set()
        positive, c = (a[0] for a in prefix_fractions(w.logr[None]))
        if (positive & (c == big_u[r])).any():
            knobs.add(PREFIX_BOUNDARY)
    return knobs
