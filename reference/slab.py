"""Verification of one slab of whole requests, vectorized over rows and requests (SPEC sections 2, 4, 4b).

1. processed logits `z` of the slab (float32, IEEE division by `T`), then the
   sampling-parameter masks of rows with parameters on (`reference.masks`);
2. every acceptance test at once: `log p_j(d) > log u_j + log q_i(d)` (model
   drafts) or `log p_j(d) > log u_j` (one-hot); greedy `d_i == argmax z`;
3. each request's first rejection `t_r` by a segmented minimum; with block
   verification, stochastic requests take `tau` from `reference.block` instead;
4. one resample/bonus pass: one row of `V'` Gumbel noises per request,
   `argmax_x (log r(x) + G_x)`, `G` from the sampler's stream family (a block residual: `max(P_{tau-1} p - q, 0)`);
   a sampler of the explicit family that resamples by inverse CDF (SPEC 4) instead takes the smallest
   `x` with `r(x) > 0` and `S_x > U S` (`reference.inverse_cdf`).

Declared deviations (SPEC 11, `BatchArrays.deviations`) replace a rule at their edge: at
`"empty_residual"` whether a residual is empty is decided in float32, in the record's view
(`Deviation.residual_empty32`: float32 probabilities, or float32 log space, where a residual whose
mass lies below float64's range is then sampled from `log P p + log1p(-exp(log q - log P p))`), and an
empty one samples the rule's weights instead of `p`; at `"inverse_cdf_top"` a resample whose float32
prefix sums never exceed `U S` (`inverse_cdf_unfound32`) takes the rule's token; at `"tree_bonus"` a
chain that ends on an accepted draft (SPEC 4c: a chain is a tree) samples the rule's weights of its
final row's raw logits instead of `p`.

Residual scores use the unnormalized `log max(p - q, 0)`: a per-row constant
changes no argmax and no gap. The big temporaries are `Scratch` arrays (reused
across calls); in trace mode the quantities the trace needs are copied out.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.deviations import inverse_cdf_unfound32
from rs_verify.contract.explicit import resample_uniforms
from rs_verify.contract.scratch import Scratch
from rs_verify.contract.streams import PLAIN

from . import inverse_cdf
from .block import block_decisions, verify_block
from .logits import divide, log_softmax64, row_layout, softmax_parts
from .logprobs import slab_logprobs
from .masks import mask_decisions, mask_slab
from .trace import Q_FREE_LOG, slab_traces, token_scale

__all__ = ["Slab", "accept", "resample", "verify_slab"]

_Z = Scratch("reference slab: processed target logits z [rows, V']")
_ACC_Z = Scratch("reference acceptance: z of the stochastic draft rows")
_ACC_Y = Scratch("reference acceptance: float64 softmax work array")
_ACC_Q = Scratch("reference acceptance: processed draft logits")
_RES_Z = Scratch("reference resample: z of the final rows")
_RES_BASE = Scratch("reference resample: log p, then the scores")
_RES_E = Scratch("reference resample: exp(z - max), then the noise G")
_RES_Q = Scratch("reference resample: processed draft logits of rejected rows")
_RES_EQ = Scratch("reference resample: q of rejected rows")
_RES_R = Scratch("reference resample: residual max(p - q, 0)")


class Slab:
    """Requests `[ra, rb)` of a batch (`reference.sampler.BatchArrays`), with slab-local layout:
    rows `[lo, hi)`, rebased `cu`, per-row request, step, bonus flag, draft id and temperature,
    and the processed target logits `z` over `[0, V')`, masked (SPEC section 2); `masks`: the
    masked rows and their masks (None when no row of the slab has a parameter on)."""

    def __init__(self, b, cu: np.ndarray, ra: int, rb: int, trace: bool, flips=None, decided=None):
        self.b, self.trace = b, trace
        self.decided = decided or {}  # {batch row: accepted}: free acceptance tests taken as given
        self.ra = ra
        self.lo, self.hi = int(cu[ra]), int(cu[rb])
        self.cu = cu[ra : rb + 1] - cu[ra]
        self.nreq, self.nrow = rb - ra, self.hi - self.lo
        self.k1 = b.k + 1
        self.vp = b.vp
        self.states = b.idx[ra:rb]
        self.temp = b.temperature[self.states]
        self.seeds = b.seeds[self.states]
        self.n = np.diff(self.cu) - 1
        self.req, self.step, self.bonus = row_layout(self.cu)
        self.greedy = self.temp == 0
        self.pos = b.pos[self.lo : self.hi]
        d = np.full(self.nrow, -1, dtype=np.int64)
        d[:-1] = b.dti[self.lo + 1 : self.hi]
        d[self.bonus] = -1
        self.d = d
        self.row_temp = self.temp[self.req]
        # Processed logits over [0, V'), float32 (raw for greedy rows and T == 1).
        self.x = b.x[self.lo : self.hi]
        buf = _Z((self.nrow, self.vp), np.float32)
        self.z = divide(self.x[:, : self.vp], self.row_temp, buf)
        self.masks = None
        if b.params is not None:
            if self.z is not buf:  # no row divided: z is a view of the batch
                np.copyto(buf, self.z)
                self.z = buf
            self.masks = mask_slab(self, self.z, b.params, flips)

    def uniforms(self, rows: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """The acceptance uniforms of the given slab rows in the batch's family (SPEC section 3); with
        `steps`, those of block steps (SPEC 4b), keyed by the sampler's block seed (SPEC 3b)."""
        fam, seeds = self.b.family, self.seeds[self.req[rows]]
        if steps is not None and self.b.block_seed != PLAIN:
            return fam.block_uniforms(seeds, self.pos[rows], steps, self.b.block_seed)
        return fam.at_rows(self.b.batch, self.lo + rows, seeds, self.pos[rows])

    def gather(self, rows: np.ndarray, scratch: Scratch) -> np.ndarray:
        """Processed target logits of the given slab rows, float32 `[len, V']` (in `scratch`)."""
        return np.take(self.z, rows, axis=0, out=scratch((rows.shape[0], self.vp), np.float32))

    def draft_rows(self, rows: np.ndarray, scratch: Scratch) -> np.ndarray:
        """Processed draft logits of the given slab rows (the draft row of their step), float32 `[len, V']`."""
        flat = self.states[self.req[rows]] * self.b.k + self.step[rows]
        buf = scratch((rows.shape[0], self.b.draft.shape[1]), np.float32)
        q = np.take(self.b.draft, flat, axis=0, out=buf)[:, : self.vp]
        return divide(q, self.row_temp[rows], out=q)


def _at(z32: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """`z[i, tok[i]]` as float64 (`tok` already clipped into range)."""
    return z32[np.arange(z32.shape[0]), tok].astype(np.float64)


def verify_slab(slab: Slab):
    """`(sampled, num_sampled, logprobs or None, traces)` of the slab's requests."""
    nrow, nreq = slab.nrow, slab.nreq
    greedy_row = slab.greedy[slab.req]
    draft_row = ~slab.bonus
    valid = (slab.d >= 0) & (slab.d < slab.vp)
    d_safe = np.where(valid, slab.d, 0)

    # Greedy rows: argmax of the raw logits over [0, V') (lowest index on ties).
    argmax = np.full(nrow, -1, dtype=np.int64)
    g_rows = np.flatnonzero(greedy_row)
    if g_rows.size:
        argmax[g_rows] = np.argmax(slab.z if g_rows.size == nrow else slab.z[g_rows], axis=1)

    # Every acceptance test at once (token-wise requests); the bonus row ends every request.
    s_req = np.flatnonzero(~slab.greedy)
    blk = None
    if slab.b.block and s_req.size:  # stochastic requests verify as a block (SPEC section 4b)
        blk = verify_block(slab, s_req, d_safe)
    reject = slab.bonus.copy()
    g_draft = g_rows[draft_row[g_rows]]
    reject[g_draft] = slab.d[g_draft] != argmax[g_draft]
    s_rows = np.flatnonzero(~greedy_row & draft_row) if blk is None else np.zeros(0, np.int64)
    acc = None
    if s_rows.size:
        acc = accept(slab, s_rows, valid[s_rows], d_safe[s_rows])
        reject[s_rows] = ~acc["accepted"]

    # First rejection per request (the bonus row when all were accepted); block requests: tau.
    t = np.minimum.reduceat(np.where(reject, slab.step, slab.k1), slab.cu[:-1])
    if blk is not None:
        t[s_req] = blk["tau"]
    final_row = slab.cu[:-1] + t

    # The token emitted at the final row: greedy argmax, or the resample / bonus.
    tokens = argmax[final_row]
    res = None
    if s_req.size:
        log_scale = None if blk is None or slab.b.draft is None else blk["log_scale"]
        res = resample(slab, s_req, final_row[s_req], (t == slab.n)[s_req], valid, d_safe, log_scale)
        tokens[s_req] = res["tokens"]

    sampled = np.full((nreq, slab.k1), -1, dtype=np.int64)
    keep = draft_row & (slab.step < t[slab.req])
    sampled[slab.req[keep], slab.step[keep]] = slab.d[keep]
    sampled[np.arange(nreq), t] = tokens
    num = (t + 1).astype(np.int32)

    lp = slab_logprobs(slab, sampled, num) if slab.b.batch.num_logprobs is not None else None
    traces = []
    if slab.trace:
        block = None if blk is None else {int(r): block_decisions(slab, int(r), blk, i) for i, r in enumerate(s_req)}
        traces = slab_traces(slab, sampled, num, t, argmax, acc, s_rows, res, s_req, mask_decisions(slab), block)
    return sampled, num, lp, traces


def accept(slab: Slab, rows, valid, d) -> dict:
    """Acceptance tests of stochastic draft rows: accepted flags (in trace mode also each test's
    margin and its scale `L = max(1, |log p(d)|, |log q(d)|)`)."""
    zt = slab.gather(rows, _ACC_Z)
    y = _ACC_Y(zt.shape, np.float64)
    m, _, _, s = softmax_parts(zt, y, None)
    logp = _at(zt, d) - m - np.log(s)
    u = slab.uniforms(rows)
    logu = np.log(u.astype(np.float64))
    out = {}
    if slab.b.draft is not None:
        zq = slab.draft_rows(rows, _ACC_Q)
        mq, _, _, sq = softmax_parts(zq, y, None)
        logq = _at(zq, d) - mq - np.log(sq)
        accepted = valid & (logp > logu + logq)
    else:
        logq = None
        accepted = valid & (logp > logu)
    if slab.decided:  # free choices (SPEC 4: q(d) = 0) taken as the production took them
        for k, j in enumerate(slab.lo + rows):
            if int(j) in slab.decided:
                accepted[k] = slab.decided[int(j)]
    out["accepted"] = accepted
    if slab.trace:
        # SPEC 4: a draft with q(d) = 0 or below float32's smallest normal (and p(d) > 0) is accepted
        # or rejected freely; the trace says so, and the comparison follows the production's choice.
        out["free"] = valid & (logq < Q_FREE_LOG) & (logp > -np.inf) if logq is not None else np.zeros_like(valid)
        margin = logp - logu if logq is None else logp - logq - logu
        margin[np.isneginf(logp)] = -np.inf  # p(d) = 0: never accepted
        margin[~valid] = -np.inf
        out.update(margin=margin, scale=np.maximum(1.0, token_scale(logp, logq)))
    return out


def _log_residual(logp, logq, log_scale=None) -> np.ndarray:
    """`log max(P p - q, 0)` `[n, V']` in log space (`log P p + log1p(-exp(log q - log P p))`, `-inf`
    where `P p <= q`), for residuals whose mass lies below float64's range."""
    lps = logp if log_scale is None else logp + np.asarray(log_scale)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(lps > logq, lps + np.log1p(-np.exp(logq - lps)), -np.inf)


def resample(slab: Slab, reqs, rows, bonus, valid, d_safe, log_scale=None) -> dict:
    """One Gumbel-max pass over the final rows of stochastic requests: `argmax_x (log r(x) + G_x)`.

    `log_scale` (block verification with model drafts): `log P_{tau-1}` per final row; the
    residual is then `max(P_{tau-1} p - q, 0)`.

    In trace mode also: `logp`, `noise` (G) and `scores` per final row; for the rows that
    rejected a real draft (`resid_index` >= 0) the residual's float64 `mass`, whether it was
    `used` (positive mass: in float64, or in float32 where a deviation rules the empty residual)
    and, for model drafts, `logq`; `ruled`: `{"empty_residual" | "inverse_cdf_top" | "tree_bonus": (deviation,
    bool mask over the residual rows | the final rows | the final rows)}` where a declared deviation decided.
    A declared `"tree_bonus"` rule (SPEC 11) weights the final rows of chains that end on an accepted draft
    (the bonus row, or a padded step after at least one accepted draft): a chain is a tree (SPEC 4c).
    """
    nr, vp = rows.shape[0], slab.vp
    zf = slab.gather(rows, _RES_Z)
    base = _RES_BASE((nr, vp), np.float64)
    e = _RES_E((nr, vp), np.float64)
    _, base, e, s = softmax_parts(zf, base, e)
    base -= np.log(s)[:, None]  # log p
    out = {}
    if slab.trace:
        out["logp"] = base.copy()
    rej = np.flatnonzero(~bonus & valid[rows])  # rejected real drafts: residuals
    dev = slab.b.deviations.at("empty_residual")
    ruled = {}
    if rej.size:
        d = d_safe[rows[rej]]
        if slab.b.draft is not None:
            zq = slab.draft_rows(rows[rej], _RES_Q)
            eq = _RES_EQ(zq.shape, np.float64)
            _, _, eq, sq = softmax_parts(zq, eq, None)
            eq /= sq[:, None]  # q
            r = np.take(e, rej, axis=0, out=_RES_R(zq.shape, np.float64))
            r /= s[rej, None]  # p
            if log_scale is not None:
                r *= np.exp(log_scale[rej])[:, None]  # P p (exact for P = 1)
            ls = None if log_scale is None else log_scale[rej]
            log_view = dev is not None and dev.empty_view == "log"
            logq = log_softmax64(zq) if slab.trace or log_view else None  # log q without underflow
            empty32 = None if dev is None else dev.residual_empty32(r, eq, base[rej], logq, None, ls)
            r -= eq
            np.maximum(r, 0.0, out=r)
            used = r.any(axis=1) if dev is None else ~empty32  # no positive mass: falls back to p
            keep = np.flatnonzero(used)
            if slab.trace:
                out.update(mass=r.sum(axis=1), logq=np.log(eq), logq_exact=logq, used=used, log_scale=ls)
            np.log(r, out=r)
            if log_view:  # a residual whose mass lies below float64's range, kept in log space
                deep = keep[~(r[keep] > -np.inf).any(axis=1)]
                r[deep] = _log_residual(base[rej[deep]], logq[deep], None if ls is None else ls[deep])
            base[rej[keep]] = r[keep]
        else:
            logr = base[rej]
            logr[np.arange(rej.size), d] = -np.inf
            used = ((logr > -np.inf).any(axis=1) if dev is None
                    else ~dev.residual_empty32(np.exp(base[rej]), None, base[rej], None, d))
            keep = np.flatnonzero(used)
            if slab.trace:
                out.update(mass=np.exp(logr).sum(axis=1), logq=None, used=used)
            base[rej[keep]] = logr[keep]
        if dev is not None:  # SPEC 11: the declared rule instead of the fallback to p
            empty = rej[~used]
            if empty.size:
                base[empty] = dev.rule("empty_residual")(base[empty])
            ruled["empty_residual"] = (dev.name, ~used)
    bonus_dev = slab.b.deviations.at("tree_bonus")
    if bonus_dev is not None:  # SPEC 4c, 11: a chain is a tree; ending on an accepted draft, it takes the rule
        ended = (bonus | ~valid[rows]) & (slab.step[rows] >= 1)  # the bonus row or a padded step after a draft
        at = np.flatnonzero(ended)
        if at.size:
            raw = slab.x[rows[at], :vp].astype(np.float64)
            base[at] = bonus_dev.rule("tree_bonus")(base[at], raw)
        ruled["tree_bonus"] = (bonus_dev.name, ended)
    if slab.b.resample == inverse_cdf.WHAT:
        u = resample_uniforms(slab.b.batch, slab.ra + reqs)
        out["tokens"] = inverse_cdf.tokens(base, u)
        top = slab.b.deviations.at("inverse_cdf_top")
        if top is not None:  # SPEC 11: no float32 prefix sum above U S takes the declared rule's token
            unfound = inverse_cdf_unfound32(base, u)
            if unfound.any():
                out["tokens"][unfound] = top.rule("inverse_cdf_top")(base[unfound], u[unfound])
            ruled["inverse_cdf_top"] = (top.name, unfound)
        if slab.trace:
            out["U"] = u
    # The request's noise (explicit, SPEC 3c: its own wherever it samples) or its row's; e is free again.
    noise = slab.b.family.at_requests(slab.b.batch, slab.ra + reqs, slab.seeds[reqs], slab.pos[rows], vp, out=e)
    scores = base
    if slab.trace and "U" in out:
        out["logr"] = scores.copy()
    scores += noise  # log r(x) + G_x
    out.setdefault("tokens", np.argmax(scores, axis=1))
    if slab.trace:
        index = np.full(nr, -1, dtype=np.int64)
        index[rej] = np.arange(rej.size)
        out.update(scores=scores.copy(), noise=noise.copy(), resid_index=index)
        out.setdefault("mass", np.zeros(0))
        out.setdefault("used", out["mass"] > 0)
        out.setdefault("logq", None)
        out.setdefault("logq_exact", None)
        out["ruled"] = ruled
    return out

