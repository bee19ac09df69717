"""The resample of batches with sampling parameters or block verification (Triton, plain `tl`).

`resample_kernel` (kernels.py) draws, for such a batch, every stochastic request's token at row
cu[r] + t with `_resample_masked`: SPEC 4's Gumbel-max argmax_x (log r(x) + G_x) of
`kernels._resample` (the same noise, the same log-domain residual, the same fallback to p when
the residual has no positive mass), with

- p masked by the row's (thr, cut) (SPEC 2; masks.py): a masked token scores -inf in both
  argmaxes, so it is never emitted;
- the model residual of SPEC 4b, max(P p - q, 0) with log P = l_scale (0 token-wise): in the
  log domain log r = log P + log p + log(1 - q / (P p)), and the constant log P is left out of the
  score (it does not move the argmax); P p counts as 0 below the float64 range (LOG_P_MIN);
- model or one-hot drafts decided at run time (`use_q`, `excl`), so one specialization serves
  both.

It is a separate function (and kernel) so that the token-wise `_resample` loop of batches
without parameters stays as it was: the mask's registers pushed that loop past 128 registers per
thread (register spills, or one resident block fewer per SM) on sm_80 / sm_100.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN  # see masks.py

from .murmur3 import murmur3_noise
from .streams import philox_gumbel

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)
LOG_P_MIN = tl.constexpr(-744.0)


@triton.jit
def _resample_masked(t_row_ptrs, q_row_ptrs, n, t_div, m, log_s, q_m, q_log_s, g, pos_t, use_q, excl, thr, cut,
                     l_scale, rmask, STREAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """argmax_x (log r(x) + G_x) over [0, n) of the masked p (see the module docstring), for each of
    the BLOCK_R rows (every other argument but n one per row; rows without `rmask` read nothing), with
    STREAM's noise as in `kernels._resample`."""
    offs = tl.arange(0, BLOCK_V)
    best_r = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)
    best_ri = tl.full([BLOCK_R, BLOCK_V], 0, (offs + n).dtype)  # the width of idx (see kernels._row_stats)
    best_p = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)
    best_pi = tl.full([BLOCK_R, BLOCK_V], 0, (offs + n).dtype)
    t_ptrs = t_row_ptrs[:, None]
    q_ptrs = q_row_ptrs[:, None]
    t_col = t_div[:, None]
    m_col = m[:, None]
    log_s_col = log_s[:, None]
    q_m_col = q_m[:, None]
    q_log_s_col = q_log_s[:, None]
    g_col = g[:, None]
    pos_col = pos_t[:, None]
    use_q_col = use_q[:, None]
    excl_col = excl[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    l_col = l_scale[:, None]
    p_min = LOG_P_MIN - l_col
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        z = tl.div_rn(tl.load(t_ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where(z == z, z, NEG_INF)
        mask = mask & ((z > thr_col) | ((z == thr_col) & (idx <= cut_col)))
        log_p = (z - m_col) - log_s_col
        if STREAM == "murmur3":
            gum = murmur3_noise(g_col, pos_col, idx)
        else:
            gum = philox_gumbel(g_col, idx)
        sp = log_p + gum
        sp = tl.where(mask & (sp == sp), sp, NEG_INF)
        zq = tl.load(q_ptrs + idx, mask=use_q_col & mask, other=NEG_INF)
        zq = tl.div_rn(zq.to(tl.float32), t_col)
        zq = tl.where(zq == zq, zq, NEG_INF)
        log_q = ((zq - q_m_col) - q_log_s_col) - l_col  # log(q / P)
        pos_mass = (log_p > log_q) & (log_p > p_min)
        a = tl.where(pos_mass, log_q - log_p, -1.0)
        e = tl.exp(a)
        log_e = tl.where((e == 1.0) | (e == 0.0), 1.0, tl.log(e))
        em1 = tl.where(e == 1.0, a, tl.where(e == 0.0, -1.0, (e - 1.0) * a / log_e))
        sq = tl.where(pos_mass, log_p + tl.log(-em1) + gum, NEG_INF)
        sr = tl.where(use_q_col, sq, tl.where(idx == excl_col, NEG_INF, sp))
        sr = tl.where(mask & (sr == sr), sr, NEG_INF)
        up = sp > best_p
        best_p = tl.where(up, sp, best_p)
        best_pi = tl.where(up, idx, best_pi)
        ur = sr > best_r
        best_r = tl.where(ur, sr, best_r)
        best_ri = tl.where(ur, idx, best_ri)
    mp = tl.reduce(best_p, 1, _MAX)
    ip = tl.reduce(tl.where(best_p == mp[:, None], best_pi, BIG_INDEX), 1, _MIN)
    mr = tl.reduce(best_r, 1, _MAX)
    ir = tl.reduce(tl.where(best_r == mr[:, None], best_ri, BIG_INDEX), 1, _MIN)
    tok = tl.where(mr > NEG_INF, ir, ip)
    return tl.where((tok >= 0) & (tok < n), tok, 0)
