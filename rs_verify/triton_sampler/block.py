"""SPEC section 4b's block verification of one stochastic request (Triton, plain `tl`).

`block_tau_kernel` (one program per BLOCK_R requests, launched for block batches only, before
`verify_kernel`) calls `_block_tau`, which walks the
verified steps i < m (m: the first padded draft, a draft id outside [0, V') counting as padded)
in order, each request of the tile its own steps, with one load per request of the row statistics:

    log P_i = min(log P_{i-1} + log p_i(d_i) - log q_i(d_i), 0)   (one-hot: log q = 0),
              -inf when p_i(d_i) = 0 or P_{i-1} = 0;
    h_i     = Z_{i+1} / (Z_{i+1} + 1 - P_i), 1 when that is 0 / 0  (i + 1 < m),
              P_i                                                    (i + 1 == m);
    tau     = the last i + 1 with log u_i <= log h_i (0 when none),

with 1 - P = -expm1(log P) (Kahan's expm1: accurate when P is near 1) and Z_{i+1} =
sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0): for model drafts one pass over row i + 1's target and
draft logits (`_block_z`, BLOCK_V / 2 lanes: no register spills with int64 scalars; the masks
applied on load), for one-hot drafts P_i (1 - p_{i+1}(d_{i+1})) from scalar loads. It stores the accepted drafts d_0..d_{tau-1} and returns tau and
log P_{tau-1} (0 for tau = 0), the scale of the model residual max(P_{tau-1} p - q, 0) that
`resample_kernel`'s one resample pass (residual.py) draws from at row cu[r] + tau: two O(R) buffers. A separate
kernel keeps the token-wise `verify_kernel` as it was (its registers, its compile time).

Cost: model drafts pay one more pass over a target row and a draft row per verified step but the
last; one-hot drafts none. Greedy requests and token-wise batches never enter it.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN, _sum_combine as _SUM  # see masks.py

from .streams import explicit_uniform, philox_acceptance
from .tiles import _tile_rows

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)
STEP_BLOCK = tl.constexpr(16)


@triton.jit
def _block_z(t_row_ptrs, q_row_ptrs, n, t_div, m, log_s, q_m, q_log_s, l_scale, thr, cut, masked, rmask,
             BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Z = sum over [0, n) of max(P p(x) - q(x), 0), log P = l_scale; p masked by (thr, cut) when
    `masked` (a row without parameters has (-inf, BIG_INDEX): its mask keeps every token). For each
    of the BLOCK_R rows (every argument but n and masked one per row; rows without `rmask` read
    nothing and get 0)."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.full([BLOCK_R, BLOCK_V], 0, tl.float32)
    t_ptr = t_row_ptrs[:, None]
    q_ptr = q_row_ptrs[:, None]
    t_col = t_div[:, None]
    q_m_col = q_m[:, None]
    q_log_s_col = q_log_s[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        z = tl.div_rn(tl.load(t_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where(z == z, z, NEG_INF)
        if masked:
            z = tl.where((z > thr_col) | ((z == thr_col) & (idx <= cut_col)), z, NEG_INF)
        zq = tl.div_rn(tl.load(q_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        zq = tl.where(zq == zq, zq, NEG_INF)
        term = tl.exp((z - m[:, None]) - log_s[:, None] + l_scale[:, None]) - tl.exp((zq - q_m_col) - q_log_s_col)
        acc += tl.where(mask & (term > 0.0), term, 0.0)
    return tl.reduce(acc, 1, _SUM)


@triton.jit
def _block_tau(target_ptr, draft_ptr, draft_ids_ptr, pos_ptr, t_max_ptr, t_logsum_ptr, d_max_ptr,
               d_logsum_ptr, t_thr_ptr, t_cut_ptr, accept_ptr, out_row, start, n, s, seed, t_div, N, K, V, Vd, Vp,
               MASKED, HAS_DRAFT: tl.constexpr, STREAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """(tau, log P_{tau-1}) of BLOCK_R stochastic requests of n drafts at rows start.. (module
    docstring; one value per request in every argument from out_row to t_div). A request with
    n = 0 gets (0, 0); the steps run to the longest request's m, each request's own while i < m."""
    m = n
    for kb in range(0, tl.reduce(n, 0, _MAX), STEP_BLOCK):
        i_vec = (kb + tl.arange(0, STEP_BLOCK))[None, :]
        smask = i_vec < n[:, None]
        d = tl.load(draft_ids_ptr + start[:, None] + i_vec + 1, mask=smask, other=-1)
        m = tl.minimum(m, tl.reduce(tl.where(smask & ((d < 0) | (d >= Vp)), i_vec, BIG_INDEX), 1, _MIN))
    l_p = tl.full(t_div.shape, 0.0, tl.float32)
    l_res = tl.full(t_div.shape, 0.0, tl.float32)
    tau = tl.full(m.shape, 0, m.dtype)
    for i in range(0, tl.reduce(m, 0, _MAX)):
        act = i < m
        j = tl.minimum(start + i, N - 1)
        d = tl.minimum(tl.maximum(tl.load(draft_ids_ptr + j + 1, mask=act, other=0), 0), Vp - 1)
        zd = tl.div_rn(tl.load(target_ptr + j * V + d).to(tl.float32), t_div)
        zd = tl.where(zd == zd, zd, NEG_INF)
        if MASKED != 0:
            thr = tl.load(t_thr_ptr + j)
            zd = tl.where((zd > thr) | ((zd == thr) & (d <= tl.load(t_cut_ptr + j))), zd, NEG_INF)
        lp_d = (zd - tl.load(t_max_ptr + j)) - tl.load(t_logsum_ptr + j)
        ratio = lp_d
        if HAS_DRAFT:
            zq = tl.div_rn(tl.load(draft_ptr + (s * K + i) * Vd + d).to(tl.float32), t_div)
            zq = tl.where(zq == zq, zq, NEG_INF)
            ratio = lp_d - ((zq - tl.load(d_max_ptr + j)) - tl.load(d_logsum_ptr + j))
        step = tl.minimum(l_p + ratio, 0.0)
        l_p = tl.where((lp_d == NEG_INF) | (l_p == NEG_INF) | (step != step), NEG_INF, step)
        log_h = l_p
        nxt = act & (i + 1 < m)
        if tl.reduce(nxt.to(tl.int32), 0, _MAX) != 0:
            j1 = tl.minimum(j + 1, N - 1)
            thr1 = tl.full(t_div.shape, NEG_INF, tl.float32)
            cut1 = tl.full(t_div.shape, BIG_INDEX, tl.int32)
            if MASKED != 0:
                thr1 = tl.load(t_thr_ptr + j1)
                cut1 = tl.load(t_cut_ptr + j1)
            if HAS_DRAFT:
                z_next = _block_z(target_ptr + j1 * V, draft_ptr + (s * K + tl.minimum(i + 1, K - 1)) * Vd, Vp, t_div,
                                  tl.load(t_max_ptr + j1), tl.load(t_logsum_ptr + j1), tl.load(d_max_ptr + j1),
                                  tl.load(d_logsum_ptr + j1), l_p, thr1, cut1,
                                  MASKED != 0, nxt, BLOCK_R, BLOCK_V // 2)
            else:
                d1 = tl.minimum(tl.maximum(tl.load(draft_ids_ptr + j1 + 1, mask=nxt, other=0), 0), Vp - 1)
                z1 = tl.div_rn(tl.load(target_ptr + j1 * V + d1).to(tl.float32), t_div)
                z1 = tl.where((z1 == z1) & ((z1 > thr1) | ((z1 == thr1) & (d1 <= cut1))), z1, NEG_INF)
                a1 = tl.minimum((z1 - tl.load(t_max_ptr + j1)) - tl.load(t_logsum_ptr + j1), 0.0)
                e1 = tl.exp(a1)  # 1 - p(d1) = -expm1(a1), Kahan
                l1 = tl.where((e1 == 1.0) | (e1 == 0.0), 1.0, tl.log(e1))
                z_next = tl.exp(l_p) * -tl.where(e1 == 1.0, a1, tl.where(e1 == 0.0, -1.0, (e1 - 1.0) * a1 / l1))
            e = tl.exp(l_p)  # 1 - P = -expm1(log P), Kahan
            le = tl.where((e == 1.0) | (e == 0.0), 1.0, tl.log(e))
            one_m_p = -tl.where(e == 1.0, l_p, tl.where(e == 0.0, -1.0, (e - 1.0) * l_p / le))
            den = z_next + one_m_p
            log_h = tl.where(den > 0.0, tl.log(z_next) - tl.log(tl.where(den > 0.0, den, 1.0)), 0.0)
            log_h = tl.where(nxt, log_h, l_p)
        if STREAM == "explicit":  # SPEC 3c: the batch's float64 u_i, in float32's range (streams.py)
            u, log_scale = explicit_uniform(tl.load(accept_ptr + j))
            ok = act & (tl.log(u) - log_scale <= log_h)
        elif STREAM == "philox" or STREAM == "philox_step":
            key = seed
            if STREAM == "philox_step":  # SPEC 3b's step-mixed block seed: seed ^ (i << 32)
                key = seed ^ (tl.cast(i, tl.int64) << 32)
            u = philox_acceptance(key, tl.load(pos_ptr + j))
            ok = act & (tl.log(u) <= log_h)
        else:
            tl.static_assert(False, "block_tau_kernel: an acceptance STREAM it does not draw")
        tau = tl.where(ok, i + 1, tau)
        l_res = tl.where(ok, l_p, l_res)
    for kb in range(0, tl.reduce(tau, 0, _MAX), STEP_BLOCK):
        i_vec = (kb + tl.arange(0, STEP_BLOCK))[None, :]
        smask = i_vec < tau[:, None]
        tl.store(out_row[:, None] + i_vec, tl.load(draft_ids_ptr + start[:, None] + i_vec + 1, mask=smask, other=-1),
                 mask=smask)
    return tau, l_res


@triton.jit(do_not_specialize=["req_off", "req_end", "N", "R", "S", "K", "V", "Vd", "Vp", "MASKED"])
def block_tau_kernel(
    target_ptr, draft_ptr, draft_ids_ptr, pos_ptr, cu_ptr, idx_ptr, temp_ptr, seeds_ptr,
    t_max_ptr, t_logsum_ptr, d_max_ptr, d_logsum_ptr, t_thr_ptr, t_cut_ptr, accept_ptr,
    sampled_ptr, tau_ptr, l_res_ptr,
    req_off, req_end, N, R, S, K, V, Vd, Vp, MASKED,
    HAS_DRAFT: tl.constexpr, STREAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: requests [req_off, req_end) of a chunk of a block batch, BLOCK_R per program, before
    `verify_kernel`. A stochastic request gets its accepted drafts in `sampled`, tau and log
    P_{tau-1} (`_block_tau`); a greedy one tau = -1 (verify_kernel verifies it token-wise). The
    vocabulary sizes are not specialized (fewer compiles; the Z pass loses the divisibility-by-16
    alignment hints). STREAM is the acceptance uniforms' family: "philox" (SPEC 3a, also 3b's),
    "philox_step" (3b's step-mixed block seed: step i keyed by `seed ^ (i << 32)`) or "explicit"
    (`accept_ptr[j]`, SPEC 3c)."""
    r, live = _tile_rows(req_off, req_end, R, BLOCK_R)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    stochastic = live & (temp != 0.0)
    tau = tl.full([BLOCK_R], -1, tl.int32)
    l_res = tl.full([BLOCK_R], 0.0, tl.float32)
    if tl.reduce(stochastic.to(tl.int32), 0, _MAX) != 0:
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + r).to(tl.int64), 0), N)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + r + 1).to(tl.int64), start), N)
        n = tl.where(stochastic, tl.minimum(tl.maximum(end - start - 1, 0), K), 0).to(tl.int32)
        tau_s, l_res_s = _block_tau(target_ptr, draft_ptr, draft_ids_ptr, pos_ptr, t_max_ptr, t_logsum_ptr, d_max_ptr,
                                    d_logsum_ptr, t_thr_ptr, t_cut_ptr, accept_ptr, sampled_ptr + r * (K + 1), start,
                                    n, s, tl.load(seeds_ptr + s), tl.where(stochastic, temp, 1.0), N, K, V, Vd, Vp,
                                    MASKED, HAS_DRAFT, STREAM, BLOCK_R, BLOCK_V)
        tau = tl.where(stochastic, tau_s, tau)
        l_res = tl.where(stochastic, l_res_s, l_res)
    tl.store(tau_ptr + r, tau, mask=live)
    tl.store(l_res_ptr + r, l_res, mask=live)
