"""Block verification of a slab's stochastic requests (SPEC section 4b), vectorized over the slab.

1. `m` per request (the first padded draft ends the block);
2. for every verified step `i < m`, in one pass over those rows: `log p(d_i)` from the masked
   processed logits, `log q_i(d_i)` (model drafts) and the acceptance uniform `u_i` (section 3);
3. the prefix ratios `log P_i` (`spec.block.prefix_ratios`, a loop over the K steps on `[R]`
   scalars);
4. `Z_{i+1}` for every row at a step `1 <= i + 1 < m`, in one more pass over those rows
   (`sum_x max(P_i p(x) - q(x), 0)`; one-hot drafts `P_i (1 - p(d_{i+1}))`, no pass);
5. `h_i` (`spec.block.thresholds`) and `tau` (`spec.block.BlockResult.tau`).

A declared deviation at the edge `"block_prefix"` (SPEC 11: `block_nan_prefix_resets`) gives `log P_i`
where the recurrence's sum is NaN; the block decisions of those steps carry its name.

The token at step `tau` is then emitted by the slab's one resample/bonus pass (`reference.slab`):
the bonus when `tau == n`, `p` at a padded step, else the residual `max(P_{tau-1} p - q, 0)` (the
`log_scale` returned here) or `p` without `d_tau` for one-hot drafts.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.block import BlockResult, first_padded, nan_steps, prefix_ratios, thresholds
from rs_verify.contract.scratch import Scratch

from .logits import softmax_parts
from .trace import FREE, Q_FREE_LOG, Decision, token_scale

__all__ = ["block_decisions", "verify_block"]

_BLK_Z = Scratch("reference block: z of the verified draft rows")
_BLK_E = Scratch("reference block: exp(z - max) of the verified draft rows")
_BLK_Q = Scratch("reference block: processed draft logits of the verified rows")
_BLK_EQ = Scratch("reference block: exp(zq - max) of the verified rows")
_BLK_W = Scratch("reference block: P p - q of the rows that need Z")


def _at(a: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """`a[i, tok[i]]` as float64."""
    return a[np.arange(a.shape[0]), tok].astype(np.float64)


def verify_block(slab, reqs: np.ndarray, d_safe: np.ndarray) -> dict:
    """Block verification of the slab-local stochastic requests `reqs`.

    Returns `tau` and `log_scale` (`log P_{tau-1}`, 0 for `tau == 0`) per request of `reqs`, and
    `result` (the `BlockResult`), `u` (the uniforms, float64 `[len(reqs), K]`, NaN at unverified
    steps), `ruled` (`(name, bool [len(reqs), K])`: the steps a declared `"block_prefix"` deviation
    decided, or None) and `free_from` (per request, the first verified step whose `q_i(d_i)` is below
    `2**-126`, SPEC 4b; `K` when none).
    """
    nb, k, vp = reqs.size, slab.b.k, slab.vp
    where = np.full(slab.nreq, -1, np.int64)
    where[reqs] = np.arange(nb)
    bi = where[slab.req]  # block-request index of every slab row (-1: not a block request)
    rows = np.flatnonzero((bi >= 0) & ~slab.bonus)
    drafts = np.full((nb, k), -1, np.int64)
    drafts[bi[rows], slab.step[rows]] = slab.d[rows]
    m = first_padded(drafts, slab.n[reqs], vp)
    rows = rows[slab.step[rows] < m[bi[rows]]]  # the verified steps
    ri, st = bi[rows], slab.step[rows]
    d = d_safe[rows]

    log_pd = np.full((nb, k), np.nan)
    log_qd = None
    u = np.full((nb, k), np.nan)
    zt = slab.gather(rows, _BLK_Z)
    e = _BLK_E(zt.shape, np.float64)
    mz, _, e, s = softmax_parts(zt, e, None)
    log_pd[ri, st] = _at(zt, d) - mz - np.log(s)
    if slab.b.draft is not None:
        zq = slab.draft_rows(rows, _BLK_Q)
        eq = _BLK_EQ(zq.shape, np.float64)
        mq, _, eq, sq = softmax_parts(zq, eq, None)
        log_qd = np.full((nb, k), np.nan)
        log_qd[ri, st] = _at(zq, d) - mq - np.log(sq)
    u[ri, st] = slab.uniforms(rows, st)  # the family's exact values, by the block seed
    dev = slab.b.deviations.at("block_prefix")
    log_prefix = prefix_ratios(log_pd, log_qd, m, None if dev is None else dev.rule("block_prefix"))
    ruled = None if dev is None else (dev.name, nan_steps(log_pd, log_qd, log_prefix, m))
    # SPEC 4b: from the first verified step whose q_i(d_i) > 0 lies below 2**-126 (a float32 sampler
    # reads it as 0, and P_i with it), the block's decisions are free.
    free_from = np.full(nb, k, np.int64)
    if log_qd is not None:
        with np.errstate(invalid="ignore"):
            low = (log_qd < Q_FREE_LOG) & (log_pd > -np.inf) & (np.arange(k)[None, :] < m[:, None])
        hit = low.any(axis=1)
        if hit.any():
            free_from[hit] = np.argmax(low[hit], axis=1)

    # Z_{i+1} at the rows of steps 1 <= i + 1 < m, with P_i of the step before.
    z = np.full((nb, k), np.nan)
    zs = np.flatnonzero(st >= 1)
    if zs.size:
        big_p = np.exp(log_prefix[ri[zs], st[zs] - 1])
        if log_qd is None:
            z[ri[zs], st[zs] - 1] = big_p * -np.expm1(log_pd[ri[zs], st[zs]])
        else:
            w = np.take(e, zs, axis=0, out=_BLK_W((zs.size, vp), np.float64))
            w /= s[zs, None]  # p
            w *= big_p[:, None]  # P p: the arithmetic of the resample's residual (reference.slab)
            w -= np.take(eq, zs, axis=0) / sq[zs, None]  # - q
            np.maximum(w, 0.0, out=w)
            z[ri[zs], st[zs] - 1] = w.sum(axis=1)
    result = BlockResult(m=m, log_prefix=log_prefix, h=thresholds(log_prefix, z, m), z=z)
    tau = result.tau(u)
    return {"tau": tau, "log_scale": result.residual_log_scale(tau), "result": result, "u": u, "ruled": ruled,
            "free_from": free_from}


def block_decisions(slab, r: int, blk: dict, bi: int) -> list[Decision]:
    """The "block" decisions of slab-local request `r` (block-request index `bi`): one per verified
    step `i < m`, `accepted = u_i <= h_i`, margin `log h_i - log u_i`, scale
    `max(1, |log u_i|, |log P_i|, |log h_i|)` over the finite terms; `deviation`: the declared
    deviation that decided `log P_i` (SPEC 11), else empty; `what`: `FREE` from the first step whose
    `q_i(d_i)` is below `2**-126` (SPEC 4b leaves those decisions free)."""
    res = blk["result"]
    mi = int(res.m[bi])
    u = blk["u"][bi, :mi]
    log_u = np.log(u)
    log_p = res.log_prefix[bi, :mi]
    h = res.h[bi, :mi]
    with np.errstate(divide="ignore"):
        log_h = np.log(h)
    margin = log_h - log_u
    scale = np.maximum(1.0, token_scale(log_u, log_p, log_h)) if mi else np.zeros(0)
    accepted = u <= h
    base = int(slab.cu[r])
    name, ruled = blk["ruled"] or ("", np.zeros((bi + 1, mi), bool))
    free = int(blk["free_from"][bi])
    return [Decision(slab.ra + r, i, slab.lo + base + i, "block", int(slab.d[base + i]), bool(accepted[i]),
                     float(margin[i]), None, float(scale[i]), what=FREE if i >= free else "",
                     deviation=name if ruled[bi, i] else "")
            for i in range(mi)]
