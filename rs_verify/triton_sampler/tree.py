"""SPEC section 4c's tree verification (Triton, plain `tl`): `tree_kernel`, one program per BLOCK_R requests.

A request's nodes are its rows `cu[r] + i` (node 0 the root); `tree_parent` holds local parents that
precede their children. Children are tried in increasing node index and every child of node `n` has an
index above `n`, so ONE forward scan over the nodes `i = 1..size-1` walks the whole tree: node `i` is
tried when its parent is the current node `n` (and its token real: a padded child is skipped); accepted,
it becomes `n` (its children all lie further on); rejected, the scan goes on to `n`'s later children.
The requests of a tile scan in step (`i` is shared), each its own tree. Per level a request keeps:

- `p~`, the target's distribution for `n`'s children after the rejected siblings: `p_n` itself while
  none was rejected (`fresh`: read from the target row, the row statistics of `row_stats_kernel` and the
  masks of `mask_stats_kernel` applied on load), else `exp(buf - lz)`, `buf` the request's row of the
  FP32 residual buffer (`[requests of the chunk, V']`, log domain) and `lz` its log-sum-exp;
- greedy requests: the first child whose token is `argmax p_n` (lowest index on ties) is accepted;
- `tree_uniforms = "per_child"`: child `c` with token `x` is accepted iff `log p~(x) > log u_c + log q~(x)`
  (`u_c` = `accept_uniforms` of the child's row, `explicit_uniform`; one-hot: `log q~ = 0`; model
  drafts `Q = softmax(node_draft_logits[j_n] / T)` over `[0, V')` from its row statistics, and for
  `tree_drafts = "without_replacement"` `Q~_c` is `Q` without the tokens of the siblings tried before
  `c`, renormalised: `log_den`, the log of the mass left, is summed by the rejection passes);
- `tree_uniforms = "per_node"` (one-hot trees): one coin `U` (`accept_uniforms` of `n`'s row) per level;
  the child tried `k`-th is accepted iff `S_{k-1} <= U < S_k`, `S_k` summed in float32 over the first
  `k` distinct tokens' `p_n` (a token already tried is one the residual has zeroed);
- after a rejection, `_tree_residual`, one pass over `[0, V')`: `r = max(p~ - Q~, 0)` in the log domain
  (`log p~ + log(1 - Q~ / p~)`, Kahan's expm1 as in residual.py; probabilities below the float64 range,
  `LOG_P_MIN`, count as 0 as for the reference), or `p~` with `x` zeroed (one-hot and per-node), stored
  into `buf`, with its online log-sum-exp `lz` (`-inf`: no positive mass).

When the scan ends, a stochastic request emits from `p~` after a rejection at its last level, else (a
leaf, children all padded, or an empty residual) from `p_n`, which one more pass writes into `buf`; the
draw itself is residual.py's `_resample_masked` (Gumbel-max over `resample_gumbel[r]`) or inverse_cdf.py's
`_resample_inverse_cdf` (over `resample_uniforms[r]`, `RESAMPLE = "inverse_cdf"`) read from `buf`. A
greedy request emits `argmax p_n`. `sampled[r]` gets the path's tokens and the emitted one,
`accepted_nodes[r]` the path's local nodes, `num_sampled[r]` the depth plus one.

Every index read from the batch is clamped (a node deeper than `K` is never accepted), so an unvalidated
batch stays in bounds. A request's result depends on its own rows and `BLOCK_V` only (the lanes fix every
sum's order), never on the chunk, the tile or `BLOCK_R`. `tl.debug_barrier()` orders a pass's stores
before any later load of the buffer (another thread's lanes).

Cost per stochastic request: one scalar test per node; one pass over a target (or buffer) row and, for
model drafts, a draft row per rejected child, times the siblings tried before it for the membership test
of without-replacement drafts; one or two passes to emit. The vocabulary sizes, the draft kind
(`HAS_Q`, `WR`), the coin layout (`PER_NODE`) and `MASKED` are runtime values: the kernel specializes on
the logits dtype, `RESAMPLE`, `BLOCK_R` and `BLOCK_V` only.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _sum_combine as _SUM  # see masks.py

from .inverse_cdf import _resample_inverse_cdf
from .residual import LOG_P_MIN, _resample_masked
from .streams import EXPLICIT_SMALL_U, explicit_uniform
from .tiles import _tile_rows

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)


@triton.jit
def _tree_residual(t_rows, q_rows, buf_rows, parent_ptr, ids_ptr, start, n, i_cur, Vp, t_div, m, log_s, thr, cut,
                   q_m, q_log_s, lz, log_den, fresh, x, use_q, WR, rmask, BLOCK_R: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    """One rejection pass for the rows with `rmask` (every argument from `t_rows` on, but `i_cur`, `Vp` and
    `WR`, one per row): `p~` (from the target row when `fresh`, else `exp(buf - lz)`) less `Q~` (`use_q`)
    or with token `x` zeroed, stored into `buf` in the log domain. Returns the new `(lz, log_den)`: the
    residual's log mass, and for without-replacement drafts (`WR`) the log mass of `Q` left once `x` joins
    the tokens of the children of `n` tried before node `i_cur` (all of them are removed from `Q~`)."""
    offs = tl.arange(0, BLOCK_V)
    t_ptrs = t_rows[:, None]
    q_ptrs = q_rows[:, None]
    b_ptrs = buf_rows[:, None]
    t_col = t_div[:, None]
    m_col = m[:, None]
    ls_col = log_s[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    qm_col = q_m[:, None]
    qls_col = q_log_s[:, None]
    lz_col = lz[:, None]
    den_col = log_den[:, None]
    fresh_col = fresh[:, None]
    x_col = x[:, None]
    use_q_col = use_q[:, None]
    n_col = n[:, None]
    m_vec = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)  # online log-sum-exp of the residual, per lane
    s_vec = tl.full([BLOCK_R, BLOCK_V], 0, tl.float32)
    dm_vec = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)  # and of Q over the tokens left (WR)
    ds_vec = tl.full([BLOCK_R, BLOCK_V], 0, tl.float32)
    for v0 in range(0, Vp, BLOCK_V):
        idx = (v0 + offs)[None, :]
        mask = rmask[:, None] & (idx < Vp)
        z = tl.div_rn(tl.load(t_ptrs + idx, mask=mask & fresh_col, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where((z == z) & ((z > thr_col) | ((z == thr_col) & (idx <= cut_col))), z, NEG_INF)
        b = tl.load(b_ptrs + idx, mask=mask & (fresh_col == 0), other=NEG_INF)
        lp = tl.where(fresh_col, (z - m_col) - ls_col, tl.where(lz_col > NEG_INF, b - lz_col, NEG_INF))
        lp = tl.where(lp > LOG_P_MIN, lp, NEG_INF)
        lr = tl.where(idx == x_col, NEG_INF, lp)
        zq = tl.div_rn(tl.load(q_ptrs + idx, mask=mask & use_q_col, other=NEG_INF).to(tl.float32), t_col)
        lq = tl.where(zq == zq, (zq - qm_col) - qls_col, NEG_INF)  # log Q
        if WR:  # Q~: Q without the tokens tried before, renormalised; and the mass left for the next child
            gone = mask & False
            for jj in range(1, i_cur):
                sib = (tl.load(parent_ptr + start + jj, mask=rmask, other=-2) == n) & (jj > n)
                tok = tl.load(ids_ptr + start + jj, mask=rmask & sib, other=-1)
                gone = gone | ((tok[:, None] == idx) & sib[:, None])
            left = mask & (gone == 0) & (idx != x_col) & (lq > NEG_INF)
            dgt = left & (lq > dm_vec)
            de = tl.exp(tl.where(dgt, dm_vec - lq, lq - dm_vec))
            de = tl.where(left, de, 0.0)
            ds_vec = tl.where(dgt, ds_vec * de + 1.0, ds_vec + de)
            dm_vec = tl.where(dgt, lq, dm_vec)
            lq = tl.where(gone, NEG_INF, lq - den_col)
        pos = (lp > lq) & (lp > NEG_INF)
        a = tl.where(pos, lq - lp, -1.0)  # log(1 - e^a), a < 0, with Kahan's expm1 (residual.py)
        e = tl.exp(a)
        log_e = tl.where((e == 1.0) | (e == 0.0), 1.0, tl.log(e))
        em1 = tl.where(e == 1.0, a, tl.where(e == 0.0, -1.0, (e - 1.0) * a / log_e))
        lr = tl.where(use_q_col, tl.where(pos, lp + tl.log(-em1), NEG_INF), lr)
        lr = tl.where(mask & (lr == lr), lr, NEG_INF)
        tl.store(b_ptrs + idx, lr, mask=mask)
        gt = lr > m_vec
        ex = tl.exp(tl.where(gt, m_vec - lr, lr - m_vec))
        ex = tl.where(lr == NEG_INF, 0.0, ex)
        s_vec = tl.where(gt, s_vec * ex + 1.0, s_vec + ex)
        m_vec = tl.where(gt, lr, m_vec)
    tl.debug_barrier()
    mx = tl.reduce(m_vec, 1, _MAX)
    sc = tl.where(m_vec != NEG_INF, tl.exp(m_vec - mx[:, None]), 0.0)
    total = tl.reduce(tl.where(m_vec != NEG_INF, s_vec * sc, 0.0), 1, _SUM)
    new_lz = tl.where(mx > NEG_INF, mx + tl.log(tl.where(mx > NEG_INF, total, 1.0)), NEG_INF)
    dmx = tl.reduce(dm_vec, 1, _MAX)
    dsc = tl.where(dm_vec != NEG_INF, tl.exp(dm_vec - dmx[:, None]), 0.0)
    dtotal = tl.reduce(tl.where(dm_vec != NEG_INF, ds_vec * dsc, 0.0), 1, _SUM)
    new_den = tl.where(dmx > NEG_INF, dmx + tl.log(tl.where(dmx > NEG_INF, dtotal, 1.0)), NEG_INF)
    return tl.where(rmask, new_lz, lz), tl.where(tl.where(WR != 0, rmask, False), new_den, log_den)


@triton.jit(do_not_specialize=["req_off", "req_end", "N", "R", "S", "K", "V", "Vd", "Vp", "MASKED", "HAS_Q", "WR",
                               "PER_NODE"])
def tree_kernel(
    target_ptr, node_q_ptr, ids_ptr, parent_ptr, cu_ptr, idx_ptr, temp_ptr,
    t_max_ptr, t_logsum_ptr, t_arg_ptr, q_max_ptr, q_logsum_ptr, t_thr_ptr, t_cut_ptr,
    accept_ptr, gumbel_ptr, unif_ptr, buf_ptr,
    sampled_ptr, num_sampled_ptr, nodes_ptr,
    req_off, req_end, N, R, S, K, V, Vd, Vp, MASKED, HAS_Q, WR, PER_NODE,
    RESAMPLE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: requests [req_off, req_end) of a chunk of a tree batch, BLOCK_R per program, after
    `row_stats_kernel` (target rows; with model drafts once more over `node_draft_logits`, into
    `q_max` / `q_logsum`) and, with MASKED, `mask_stats_kernel`. See the module docstring; `buf` holds
    one row of `Vp` floats per request of the chunk."""
    r, live = _tile_rows(req_off, req_end, R, BLOCK_R)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    greedy = temp == 0.0
    t_div = tl.where(greedy, 1.0, temp)
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + r).to(tl.int64), 0), N)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + r + 1).to(tl.int64), start), N)
    size = tl.where(live, end - start, 0)
    buf_row = buf_ptr + (r - req_off) * Vp
    start = tl.minimum(start, N - 1)
    has_q = tl.where(HAS_Q != 0, greedy == 0, False)
    zero_i = tl.full([BLOCK_R], 0, tl.int64)
    n = zero_i  # the current node (local) and its row
    jn = start
    depth = zero_i
    fresh = tl.full([BLOCK_R], 1, tl.int1)
    tried = tl.full([BLOCK_R], 0, tl.int1)
    lz = tl.full([BLOCK_R], 0.0, tl.float32)
    log_den = lz
    s_prev = lz
    m_n = tl.load(t_max_ptr + jn)
    ls_n = tl.load(t_logsum_ptr + jn)
    arg_n = tl.load(t_arg_ptr + jn).to(tl.int64)
    thr_n = tl.full([BLOCK_R], NEG_INF, tl.float32)
    cut_n = tl.full([BLOCK_R], BIG_INDEX, tl.int32)
    if MASKED:
        thr_n = tl.load(t_thr_ptr + jn)
        cut_n = tl.load(t_cut_ptr + jn)
    qm_n = tl.load(q_max_ptr + jn, mask=has_q, other=0.0)
    qls_n = tl.load(q_logsum_ptr + jn, mask=has_q, other=0.0)
    coin = tl.load(accept_ptr + jn, mask=live, other=0.5).to(tl.float32)
    for i in range(1, tl.reduce(size, 0, _MAX)):
        act = live & (i < size)
        j = tl.minimum(start + i, N - 1)
        par = tl.load(parent_ptr + j, mask=act, other=-2)
        x = tl.load(ids_ptr + j, mask=act, other=-1)
        cand = act & (par == n) & (x >= 0) & (x < Vp) & (depth < K)
        if tl.reduce(cand.to(tl.int32), 0, _MAX) != 0:
            xs = tl.minimum(tl.maximum(x, 0), Vp - 1)
            z = tl.div_rn(tl.load(target_ptr + jn * V + xs).to(tl.float32), t_div)
            z = tl.where((z == z) & ((z > thr_n) | ((z == thr_n) & (xs <= cut_n))), z, NEG_INF)
            lp_n = (z - m_n) - ls_n
            b = tl.load(buf_row + xs, mask=cand & (fresh == 0), other=NEG_INF)
            lp = tl.where(fresh, lp_n, tl.where(lz > NEG_INF, b - lz, NEG_INF))
            ok = cand & False
            s_cur = s_prev
            if PER_NODE:  # S_k: p_n of the token unless a sibling tried before held it
                s_cur = s_prev + tl.where(fresh | (b > NEG_INF), tl.exp(lp_n), 0.0)
                ok = (s_prev <= coin) & (coin < s_cur)
            else:
                u64 = tl.load(accept_ptr + j, mask=cand, other=0.5)
                u = u64.to(tl.float32)
                log_scale = tl.full([BLOCK_R], 0.0, tl.float32)
                if tl.reduce((u64 < EXPLICIT_SMALL_U).to(tl.int32), 0, _MAX) != 0:  # explicit_uniform's range
                    u, log_scale = explicit_uniform(u64)
                lq = tl.full([BLOCK_R], 0.0, tl.float32)
                if HAS_Q:
                    zq = tl.div_rn(tl.load(node_q_ptr + jn * Vd + xs, mask=cand & has_q, other=0.0).to(tl.float32),
                                   t_div)
                    lq = tl.where(zq == zq, (zq - qm_n) - qls_n - log_den, NEG_INF)
                    if WR:  # a token tried before is out of Q~: q~(x) = 0
                        for jj in range(1, i):
                            sib = (tl.load(parent_ptr + start + jj, mask=cand, other=-2) == n) & (jj > n)
                            dup = sib & (tl.load(ids_ptr + start + jj, mask=cand & sib, other=-1) == x)
                            lq = tl.where(dup, NEG_INF, lq)
                ok = lp > (tl.log(u) - log_scale) + lq
            acc = cand & tl.where(greedy, x == arg_n, ok)
            rej = cand & (acc == 0) & (greedy == 0)
            s_prev = tl.where(rej, s_cur, s_prev)
            if tl.reduce(rej.to(tl.int32), 0, _MAX) != 0:
                lz, log_den = _tree_residual(target_ptr + jn * V, node_q_ptr + jn * Vd, buf_row, parent_ptr, ids_ptr,
                                             start, n, i, Vp, t_div, m_n, ls_n, thr_n, cut_n, qm_n, qls_n, lz, log_den,
                                             fresh, xs, tl.where(PER_NODE == 0, rej & has_q, False), WR, rej, BLOCK_R, BLOCK_V)
                fresh = fresh & (rej == 0)
                tried = tried | rej
            if tl.reduce(acc.to(tl.int32), 0, _MAX) != 0:
                dk = tl.minimum(depth, tl.maximum(K - 1, 0))
                tl.store(sampled_ptr + r * (K + 1) + dk, x.to(tl.int64), mask=acc)
                tl.store(nodes_ptr + r * K + dk, (zero_i + i).to(tl.int32), mask=acc)
                n = tl.where(acc, zero_i + i, n)
                jn = tl.where(acc, j, jn)
                depth = tl.where(acc, depth + 1, depth)
                fresh = fresh | acc
                tried = tried & (acc == 0)
                lz = tl.where(acc, 0.0, lz)
                log_den = tl.where(acc, 0.0, log_den)
                s_prev = tl.where(acc, 0.0, s_prev)
                m_n = tl.load(t_max_ptr + jn)
                ls_n = tl.load(t_logsum_ptr + jn)
                arg_n = tl.load(t_arg_ptr + jn).to(tl.int64)
                if MASKED:
                    thr_n = tl.load(t_thr_ptr + jn)
                    cut_n = tl.load(t_cut_ptr + jn)
                qm_n = tl.load(q_max_ptr + jn, mask=has_q, other=0.0)
                qls_n = tl.load(q_logsum_ptr + jn, mask=has_q, other=0.0)
                coin = tl.load(accept_ptr + jn, mask=live, other=0.5).to(tl.float32)
    # the last token: from p~ after a rejection with mass left, else from p_n (written into buf first)
    draws = live & (greedy == 0)
    init = draws & ((tried == 0) | (lz == NEG_INF))
    if tl.reduce(init.to(tl.int32), 0, _MAX) != 0:
        lz, _ = _tree_residual(target_ptr + jn * V, node_q_ptr + jn * Vd, buf_row, parent_ptr, ids_ptr, start, n, 0,
                               Vp, t_div, m_n, ls_n, thr_n, cut_n, qm_n, qls_n, lz, log_den, fresh | init,
                               zero_i - 1, init & False, 0, init, BLOCK_R, BLOCK_V)
    tok = arg_n
    if tl.reduce(draws.to(tl.int32), 0, _MAX) != 0:
        one = tl.full([BLOCK_R], 1.0, tl.float32)
        nil = tl.full([BLOCK_R], 0.0, tl.float32)
        none = tl.full([BLOCK_R], NEG_INF, tl.float32)
        big = tl.full([BLOCK_R], BIG_INDEX, tl.int32)
        if RESAMPLE == "inverse_cdf":  # SPEC 4: U_r of the batch, rounded to float32
            u_r = tl.load(unif_ptr + r, mask=draws, other=0.5).to(tl.float32)
            t_s = _resample_inverse_cdf(buf_row, buf_row, Vp, one, nil, lz, nil, nil, u_r, draws & False, zero_i - 1,
                                        none, big, nil, draws, BLOCK_R, BLOCK_V)
        else:
            t_s = _resample_masked(buf_row, buf_row, Vp, one, nil, lz, nil, nil, gumbel_ptr + r * Vp, zero_i,
                                   draws & False, zero_i - 1, none, big, nil, draws, "explicit", BLOCK_R, BLOCK_V)
        tok = tl.where(draws, t_s.to(tl.int64), tok)
    tok = tl.where((tok >= 0) & (tok < Vp), tok, 0)
    tl.store(sampled_ptr + r * (K + 1) + depth, tok, mask=live)
    tl.store(num_sampled_ptr + r, (depth + 1).to(tl.int32), mask=live)
