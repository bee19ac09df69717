"""The resample rule (SPEC 4), and the resample of batches with sampling parameters, block
verification or explicit noise (Triton).

The rule is written once, here: `_resample_step` scores one block of tokens (the noise G_x of
the row's family, `log p(x) + G_x`, and `log r(x) + G_x` of the residual: in the log domain,
log r = log p + log(1 - q / p) where p > q and p is within float64 range, p without the rejected
draft for one-hot drafts) and keeps each lane's best of both; `_resample_token` reduces the lanes
to the token, ties to the lowest index, falling back to the argmax of `log p + G` when the
residual has no positive mass. `kernels._resample` (the token-wise loop of batches without
parameters, one row) and `_resample_masked` (below, `BLOCK_R` rows) are their two loops.

`resample_kernel` (one of kernels.py's pipeline) draws, for such a batch, every stochastic
request's token at row cu[r] + t with `_resample_masked`, with

- p masked by the row's (thr, cut) (SPEC 2; masks.py): a masked token scores -inf in both
  argmaxes, so it is never emitted;
- the model residual of SPEC 4b, max(P p - q, 0) with log P = l_scale (0 token-wise): in the
  log domain log r = log P + log p + log(1 - q / (P p)), and the constant log P is left out of the
  score (it does not move the argmax); P p counts as 0 below the float64 range (LOG_P_MIN);
- model or one-hot drafts decided at run time (`use_q`, `excl`), so one specialization serves
  both;
- the explicit family's noise (SPEC 3c, `STREAM == "explicit"`): `G_x = resample_gumbel[r, x]`
  (float64, rounded to float32), `g` then the pointer to request r's row; with the constexpr
  `RESAMPLE == "inverse_cdf"` the token is the inverse CDF of `U_r = resample_uniforms[r]` over the
  same residual instead (`inverse_cdf._resample_inverse_cdf`).

Its loop is a separate function (and kernel) from the token-wise `kernels._resample` so that
batches without parameters load no mask: the mask's registers pushed that loop past 128
registers per thread (register spills, or one resident block fewer per SM) on sm_80 / sm_100.
The two loops differ only in what they load; the rule is the shared step and token.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN  # see masks.py

from .inverse_cdf import _resample_inverse_cdf
from .streams import resample_key, resample_noise, score_dtype
from .tiles import _tile_rows

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)
# Residual tokens need log p(x) above this: a probability below the float64 range (~1e-323) is zero
# for the float64 reference, so a residual whose whole mass lies there falls back to p.
LOG_P_MIN = tl.constexpr(-744.0)


@triton.jit
def _resample_step(log_p, log_q, p_min, g, pos, idx, mask, use_q, excl, best_p, best_pi, best_r, best_ri,
                   HAS_Q: tl.constexpr, STREAM: tl.constexpr):
    """One block of the resample loop (module docstring), of any shape: the tokens `idx` (`mask`: in
    the row and not masked) with `log p`, and with HAS_Q `log q` (`use_q`: the model residual; rows
    without it resample from p with r(excl) = 0, excl = -1 for none); `p_min`: the log p below which
    p(x) is 0 for the residual. G_x: STREAM's noise keyed by `g` and `pos` (streams.py). Returns the
    lanes' best (score, token) of p and of the residual, updated."""
    if HAS_Q:
        pos_mass = (log_p > log_q) & (log_p > p_min)
        a = tl.where(pos_mass, log_q - log_p, -1.0)
        e = tl.exp(a)
        log_e = tl.where((e == 1.0) | (e == 0.0), 1.0, tl.log(e))
        em1 = tl.where(e == 1.0, a, tl.where(e == 0.0, -1.0, (e - 1.0) * a / log_e))
        log_r = log_p + tl.log(-em1)
    # the noise comes after the residual's logs, so neither it nor sp is live across them (drawn
    # first, sm_90's ptxas spilled a register of murmur3's specializations)
    gum = resample_noise(g, pos, idx, mask, STREAM)
    sp = log_p + gum
    sp = tl.where(mask & (sp == sp), sp, NEG_INF)
    sr = tl.where(idx == excl, NEG_INF, sp)
    if HAS_Q:
        sr = tl.where(use_q, tl.where(pos_mass, log_r + gum, NEG_INF), sr)
    sr = tl.where(mask & (sr == sr), sr, NEG_INF)
    up = sp > best_p
    best_p = tl.where(up, sp, best_p)
    best_pi = tl.where(up, idx, best_pi)
    ur = sr > best_r
    best_r = tl.where(ur, sr, best_r)
    best_ri = tl.where(ur, idx, best_ri)
    return best_p, best_pi, best_r, best_ri


@triton.jit
def _resample_token(best_p, best_pi, best_r, best_ri, n, AXIS: tl.constexpr):
    """The token of the lanes' best scores (reduced over AXIS): the residual's argmax, ties to the
    lowest index, or p's when no token has a finite residual score (no positive mass); in [0, n)."""
    mp = tl.reduce(best_p, AXIS, _MAX, keep_dims=True)
    ip = tl.reduce(tl.where(best_p == mp, best_pi, BIG_INDEX), AXIS, _MIN)
    mr = tl.reduce(best_r, AXIS, _MAX, keep_dims=True)
    ir = tl.reduce(tl.where(best_r == mr, best_ri, BIG_INDEX), AXIS, _MIN)
    tok = tl.where(tl.reduce(mr, AXIS, _MAX) > NEG_INF, ir, ip)
    return tl.where((tok >= 0) & (tok < n), tok, 0)


@triton.jit
def _resample_masked(t_row_ptrs, q_row_ptrs, n, t_div, m, log_s, q_m, q_log_s, g, pos_t, use_q, excl, thr, cut,
                     l_scale, rmask, STREAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """argmax_x (log r(x) + G_x) over [0, n) of the masked p (see the module docstring), for each of
    the BLOCK_R rows (every other argument but n one per row; rows without `rmask` read nothing), with
    STREAM's noise (explicit: `g` points at the request's Gumbel row)."""
    offs = tl.arange(0, BLOCK_V)
    best_r = score_dtype(tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32), STREAM)  # the family's scores (streams.py)
    best_p = score_dtype(tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32), STREAM)
    best_ri = tl.full([BLOCK_R, BLOCK_V], 0, (offs + n).dtype)  # the width of idx (see kernels._row_stats)
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
        zq = tl.load(q_ptrs + idx, mask=use_q_col & mask, other=NEG_INF)
        zq = tl.div_rn(zq.to(tl.float32), t_col)
        zq = tl.where(zq == zq, zq, NEG_INF)
        log_q = ((zq - q_m_col) - q_log_s_col) - l_col  # log(q / P)
        best_p, best_pi, best_r, best_ri = _resample_step(log_p, log_q, p_min, g_col, pos_col, idx, mask, use_q_col,
                                                          excl_col, best_p, best_pi, best_r, best_ri, True, STREAM)
    return _resample_token(best_p, best_pi, best_r, best_ri, n, 1)


@triton.jit(do_not_specialize=["req_off", "req_end", "N", "R", "S", "K", "V", "Vd", "Vp", "MASKED", "BLOCK",
                              "HAS_DRAFT"])
def resample_kernel(
    target_ptr, draft_ptr, draft_ids_ptr, pos_ptr, cu_ptr, idx_ptr, temp_ptr, seeds_ptr,
    t_max_ptr, t_logsum_ptr, d_max_ptr, d_logsum_ptr, t_thr_ptr, t_cut_ptr, l_res_ptr, gumbel_ptr, unif_ptr,
    sampled_ptr, num_sampled_ptr,
    req_off, req_end, N, R, S, K, V, Vd, Vp, MASKED, BLOCK, HAS_DRAFT,
    STREAM: tl.constexpr, RESAMPLE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: requests [req_off, req_end) of a chunk of a MASKED, BLOCK or explicit batch, BLOCK_R per
    program, after `verify_kernel` (which stored t + 1 in num_sampled). Draws a stochastic request's
    token at row cu[r] + t (module docstring): the masked p, the residual max(P p - q, 0) with log P
    from `block_tau_kernel` (model drafts), p without the rejected draft (one-hot), or p; by
    Gumbel-max with STREAM's noise (explicit: `gumbel_ptr[r, :Vp]`), or by inverse CDF of
    `unif_ptr[r]` (RESAMPLE "inverse_cdf", explicit only). HAS_DRAFT and the vocabulary sizes are
    runtime values here: few specializations for a kernel only these batches run."""
    r, live = _tile_rows(req_off, req_end, R, BLOCK_R)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    draws = live & (temp != 0.0)
    if tl.reduce(draws.to(tl.int32), 0, _MAX) != 0:
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + r).to(tl.int64), 0), N)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + r + 1).to(tl.int64), start), N)
        n = tl.minimum(tl.maximum(end - start - 1, 0), K).to(tl.int32)
        t = tl.minimum(tl.maximum(tl.load(num_sampled_ptr + r) - 1, 0), n)
        jt = tl.minimum(tl.maximum(start + t, 0), N - 1)
        has_d = t < n
        d_t = tl.load(draft_ids_ptr + jt + 1, mask=has_d, other=-1)
        ok_t = has_d & (d_t >= 0) & (d_t < Vp)
        thr = tl.full([BLOCK_R], NEG_INF, tl.float32)
        cut = tl.full([BLOCK_R], BIG_INDEX, tl.int32)
        if MASKED:
            thr = tl.load(t_thr_ptr + jt)
            cut = tl.load(t_cut_ptr + jt)
        l_scale = tl.full([BLOCK_R], 0.0, tl.float32)
        if BLOCK:
            l_scale = tl.load(l_res_ptr + r)
        use_q = tl.where(HAS_DRAFT != 0, ok_t, False)
        q_row = draft_ptr + (s * K + tl.minimum(tl.maximum(t, 0), K - 1)) * Vd
        pos_t = tl.load(pos_ptr + jt)
        if STREAM == "explicit":  # SPEC 3c: request r's own noise, wherever it samples
            g = gumbel_ptr + r * Vp
        else:
            g = resample_key(tl.load(seeds_ptr + s), pos_t, STREAM)
        q_m = tl.load(d_max_ptr + jt, mask=use_q, other=0.0)
        q_log_s = tl.load(d_logsum_ptr + jt, mask=use_q, other=0.0)
        excl = tl.where(ok_t & (use_q == 0), d_t, -1)
        if RESAMPLE == "inverse_cdf":  # SPEC 4: U_r of the batch, rounded to float32
            u = tl.load(unif_ptr + r, mask=draws, other=0.5).to(tl.float32)
            tok = _resample_inverse_cdf(target_ptr + jt * V, q_row, Vp, tl.where(draws, temp, 1.0), tl.load(t_max_ptr + jt),
                                        tl.load(t_logsum_ptr + jt), q_m, q_log_s, u, use_q, excl, thr, cut, l_scale,
                                        draws, BLOCK_R, BLOCK_V)
        else:
            tok = _resample_masked(target_ptr + jt * V, q_row, Vp, tl.where(draws, temp, 1.0), tl.load(t_max_ptr + jt),
                                   tl.load(t_logsum_ptr + jt), q_m, q_log_s, g, pos_t, use_q, excl, thr, cut, l_scale,
                                   draws, STREAM, BLOCK_R, BLOCK_V)
        tl.store(sampled_ptr + r * (K + 1) + t, tok.to(tl.int64), mask=draws)
