"""Triton kernels of the production rejection sampler (SPEC sections 2-6).

One code path for CUDA and the interpreter: plain `tl` only (no libdevice).
Every program but `verify_kernel`'s (one request) works on `BLOCK_R` target rows or
requests (a constexpr: 1 compiled, more through the interpreter, which pays per `tl`
operation and per program, not per element) as `[BLOCK_R, BLOCK_V]` tiles, and reduces each row over the vocabulary in
blocks of the constexpr `BLOCK_V` with a fixed lane layout, so a row's result never
depends on the batch, the chunk, the other rows of its tile or `BLOCK_R` itself.
Per-row branches are masks: a tile runs a pass when any of its rows needs it, and a
row takes only its own results (`BLOCK_R = 1`: the branch of the one row, as before).
All row / state offsets are int64 (`row * V` must not overflow int32); every
load and store is masked or uses indices clamped into range, so a sampler run
without validation never touches memory outside its tensors.
Integer scalars arrive as int32 or int64 (Triton passes a Python int >= 2**31 as
int64): index vectors and loop-carried indices take the width of the bound they
run to (`tl.zeros_like(offs + n)`), so every kernel compiles for both widths
(`aot.py` compiles them for CUDA archs, also on a machine without a GPU).
Sampling parameters (SPEC 2) arrive as two statistics per row from `mask_stats_kernel` (masks.py):
a keep threshold `thr` and a tie-id cutoff `cut`; every load of a target logit of a masked row
applies `keep` (z > thr, or z == thr and x <= cut). `MASKED` (any parameter on in the batch) and
`BLOCK` (block verification, SPEC 4b: block.py) are runtime flags, not specializations: a batch
without them runs the same instructions as before they existed, one scalar branch aside. The
stochastic draws of such batches, and of every batch of the explicit family (SPEC 3c), are
`resample_kernel`'s (residual.py; its inverse-CDF resample: inverse_cdf.py).
The mutants of mutants/catalogue.py patch this file's text by exact match: keep their anchors in step.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN, _sum_combine as _SUM  # see masks.py

from .block import block_tau_kernel  # noqa: F401 - a kernel of this module's pipeline
from .masks import _masked_stats, _row_masks
from .residual import LOG_P_MIN, _resample_step, _resample_token, resample_kernel  # noqa: F401 - resample_kernel: a kernel of this module's pipeline
from .streams import explicit_uniform, philox_acceptance, resample_key, score_dtype
from .tiles import _tile_rows
from .tree import tree_kernel  # noqa: F401 - a kernel of this module's pipeline (SPEC 4c)

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)
# Draft steps verified together by one program (a fixed vector width, not K).
STEP_BLOCK = tl.constexpr(16)


# ---------------------------------------------------------------------------
# Per-element formulas are written inline: under the interpreter every call of
# a nested @triton.jit function costs about a millisecond (it re-patches
# triton.language), and Triton's own helpers are such functions too. So the
# kernels spell them with builtins or with fewer of Triton's helpers, each the
# helper's own definition (the same IR compiled):
#   tl.zeros(s, d) / tl.zeros_like(x)  ->  tl.full(s, 0, d) / tl.full(x.shape, 0, x.dtype)
#   tl.max / tl.min / tl.sum(x, 0)     ->  tl.reduce(x, 0, _MAX / _MIN / _SUM) (32-bit x)
# The random streams (SPEC 3) are the helpers of streams.py, one nested call each, and murmur3.py's
# noises (under the interpreter plain functions: see murmur3.called_directly):
#   tl.rand(g, o)                      ->  tl.randint4x(g, o)[0] and uint_to_uniform_float's own definition
#   tl.randint(g, o)                   ->  tl.randint4x(g, o)[0]
# (randint4x keeps the Philox counter layout of the installed Triton version).
# The resample rule is residual.py's `_resample_step` (one nested call per vocabulary block) and
# `_resample_token` (one per row), shared by both resample loops so that it is written once.
#
#   processed logits (SPEC 2): z = div_rn(fp32(x), t_div), t_div = 1 for greedy
#     rows and T == 1 (x / 1 is exact); NaN is read as -inf so unvalidated NaN
#     rows never win an argmax.
#   log(1 - e^a), a < 0, i.e. log(-expm1(a)), with Kahan's expm1:
#     (e - 1) * a / log(e), e = exp(a) (a when e == 1, -1 when e == 0).
#   Gumbel noise (SPEC 3): the family the constexpr STREAM names (a StreamFamily's `triton`),
#     chosen in one place, streams.py's resample_key (what a row's noise is keyed by) and
#     resample_noise (G_x), with score_dtype the dtype of the scores it is added to:
#     "philox" (3a): G_x = -log(-log(1 - v_x)), v_x = max(rand(g, x), TINY), log(1 - v) by
#     Goldberg's form, g the row's resample seed; "murmur3" and "murmur3_fp64" (3b): G_x of the
#     hash (or the two hashes) of (seed, pos, x) (murmur3.py), g the seed itself; "explicit" (3c):
#     the batch's noise fields, loaded (resample_kernel: residual.py).
#     Only the kernels that read or draw noise take STREAM (verify_kernel, resample_kernel,
#     block_tau_kernel).
# ---------------------------------------------------------------------------


# -- row reductions ---------------------------------------------------------
@triton.jit
def _row_stats(row_ptrs, rmask, n, t_div, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Max, sum of exp(z - max) and argmax (lowest index on ties) of z over [0, n), for each of the
    BLOCK_R rows `row_ptrs` (t_div per row; rows with `rmask` false read nothing: (-inf, 0, 0)).

    Per-lane online accumulators (one exp per element), reduced across lanes
    once at the end: the order is fixed by BLOCK_V alone.
    """
    offs = tl.arange(0, BLOCK_V)
    m_vec = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)
    s_vec = tl.full([BLOCK_R, BLOCK_V], 0, tl.float32)
    i_vec = tl.full([BLOCK_R, BLOCK_V], 0, (offs + n).dtype)  # the width of idx: int32, or int64 for an int64 n
    row_ptr = row_ptrs[:, None]
    t_col = t_div[:, None]
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        z = tl.div_rn(tl.load(row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where(z == z, z, NEG_INF)
        gt = z > m_vec
        e = tl.exp(tl.where(gt, m_vec - z, z - m_vec))
        e = tl.where(z == NEG_INF, 0.0, e)
        s_vec = tl.where(gt, s_vec * e + 1.0, s_vec + e)
        i_vec = tl.where(gt, idx, i_vec)
        m_vec = tl.where(gt, z, m_vec)
    m = tl.reduce(m_vec, 1, _MAX)
    live = m_vec != NEG_INF
    scale = tl.exp(tl.where(live, m_vec - m[:, None], 0.0))
    s = tl.reduce(tl.where(live, s_vec * scale, 0.0), 1, _SUM)
    arg = tl.reduce(tl.where(m_vec == m[:, None], i_vec, BIG_INDEX), 1, _MIN)
    arg = tl.where(arg == BIG_INDEX, 0, arg)
    return m, s, arg


@triton.jit
def _resample(t_row_ptr, q_row_ptr, n, t_div, m, log_s, q_m, q_log_s, g, pos_t, use_q, excl,
              HAS_DRAFT: tl.constexpr, STREAM: tl.constexpr, BLOCK_V: tl.constexpr):
    """SPEC section 4: argmax_x (log r(x) + G_x) over [0, n), ties to the lowest index, for one row:
    the rule of residual.py (`_resample_step`, `_resample_token`) over the unmasked p.

    r = max(p - q, 0) when `use_q` (model drafts), p with r(excl) = 0 (one-hot drafts; excl = -1
    for none); the argmax of log p(x) + G_x when the residual has no positive mass. G_x: STREAM's
    noise of the row, keyed by `g` (philox: the resample seed; murmur3: the seed) and `pos_t` (murmur3).
    """
    offs = tl.arange(0, BLOCK_V)
    best_r = score_dtype(tl.full([BLOCK_V], NEG_INF, tl.float32), STREAM)  # the family's scores (streams.py)
    best_p = score_dtype(tl.full([BLOCK_V], NEG_INF, tl.float32), STREAM)
    best_ri = tl.full((offs + n).shape, 0, (offs + n).dtype)  # the width of idx (see _row_stats)
    best_pi = tl.full((offs + n).shape, 0, (offs + n).dtype)
    for start in range(0, n, BLOCK_V):
        idx = start + offs
        mask = idx < n
        z = tl.div_rn(tl.load(t_row_ptr + idx, mask=mask, other=NEG_INF).to(tl.float32), t_div)
        z = tl.where(z == z, z, NEG_INF)
        log_p = (z - m) - log_s
        log_q = log_p  # one-hot drafts: not read (no residual of q)
        if HAS_DRAFT:
            zq = tl.load(q_row_ptr + idx, mask=tl.where(use_q, mask, False), other=NEG_INF)
            zq = tl.div_rn(zq.to(tl.float32), t_div)
            zq = tl.where(zq == zq, zq, NEG_INF)
            log_q = (zq - q_m) - q_log_s
        best_p, best_pi, best_r, best_ri = _resample_step(log_p, log_q, LOG_P_MIN, g, pos_t, idx, mask, use_q, excl,
                                                          best_p, best_pi, best_r, best_ri, HAS_DRAFT, STREAM)
    return _resample_token(best_p, best_pi, best_r, best_ri, n, 0)


# -- kernels ----------------------------------------------------------------
@triton.jit(do_not_specialize=["row_off", "row_end", "N", "R", "S", "K", "Vp"])
def row_stats_kernel(
    target_ptr, draft_ptr, req_of_row_ptr, cu_ptr, idx_ptr, temp_ptr,
    t_max_ptr, t_logsum_ptr, t_arg_ptr, d_max_ptr, d_logsum_ptr,
    row_off, row_end, N, R, S, K, V, Vd, Vp,
    HAS_DRAFT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: target rows [row_off, row_end) of a chunk, BLOCK_R per program. Max / log-sum-exp /
    argmax of z over [0, V') per row and, for model drafts, max / log-sum-exp of draft / T for the
    (request, step) the row verifies. Rows with sampling parameters get their masked log-sum-exp
    from `mask_stats_kernel` next."""
    j, live = _tile_rows(row_off, row_end, N, BLOCK_R)
    r = tl.minimum(tl.maximum(tl.load(req_of_row_ptr + j).to(tl.int64), 0), R - 1)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    t_div = tl.where(temp == 0.0, 1.0, temp)
    m, sum_exp, arg = _row_stats(target_ptr + j * V, live, Vp, t_div, BLOCK_R, BLOCK_V)
    tl.store(t_max_ptr + j, m, mask=live)
    tl.store(t_logsum_ptr + j, tl.log(sum_exp), mask=live)
    tl.store(t_arg_ptr + j, arg, mask=live)
    if HAS_DRAFT:
        start = tl.minimum(tl.maximum(tl.load(cu_ptr + r).to(tl.int64), 0), N)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + r + 1).to(tl.int64), start), N)
        n_r = tl.minimum(tl.maximum(end - start - 1, 0), K)
        i = j - start
        verifies = live & (i >= 0) & (i < n_r) & (temp != 0.0)
        if tl.reduce(verifies.to(tl.int32), 0, _MAX) != 0:
            i = tl.minimum(tl.maximum(i, 0), tl.maximum(K - 1, 0))
            dm, ds, _ = _row_stats(draft_ptr + (s * K + i) * Vd, verifies, Vp, t_div, BLOCK_R, BLOCK_V)
            tl.store(d_max_ptr + j, dm, mask=verifies)
            tl.store(d_logsum_ptr + j, tl.log(ds), mask=verifies)


@triton.jit(do_not_specialize=["row_off", "row_end", "N", "R", "S", "V", "Vp"])
def mask_stats_kernel(
    target_ptr, req_of_row_ptr, idx_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
    t_max_ptr, t_logsum_ptr, t_thr_ptr, t_cut_ptr,
    row_off, row_end, N, R, S, V, Vp,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, MASK_BLOCK: tl.constexpr,
):
    """Grid: target rows [row_off, row_end) of a chunk, BLOCK_R per program, after
    `row_stats_kernel` (which stored M = t_max). Stores each row's (thr, cut) (-inf, BIG_INDEX:
    greedy rows and rows without parameters) and, for a masked row, replaces t_logsum by the
    masked row's log-sum-exp."""
    j, live = _tile_rows(row_off, row_end, N, BLOCK_R)
    r = tl.minimum(tl.maximum(tl.load(req_of_row_ptr + j).to(tl.int64), 0), R - 1)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    min_p = tl.load(min_p_ptr + s)
    top_k = tl.load(top_k_ptr + s)
    top_p = tl.load(top_p_ptr + s)
    masks = live & (temp != 0.0) & ((min_p > 0.0) | ((top_k > 0) & (top_k < Vp)) | (top_p < 1.0))
    thr = tl.full([BLOCK_R], NEG_INF, tl.float32)
    cut = tl.full([BLOCK_R], BIG_INDEX, tl.int32)
    if tl.reduce(masks.to(tl.int32), 0, _MAX) != 0:
        row_j = target_ptr + j * V
        t_div = tl.where(masks, temp, 1.0)
        thr, cut = _row_masks(row_j, Vp, t_div, tl.load(t_max_ptr + j), min_p, top_k, top_p, masks, BLOCK_R,
                              MASK_BLOCK)
        _, sum_exp = _masked_stats(row_j, masks, Vp, t_div, thr, cut, Vp, True, BLOCK_R, BLOCK_V)
        tl.store(t_logsum_ptr + j, tl.log(sum_exp), mask=masks)
    tl.store(t_thr_ptr + j, thr, mask=live)
    tl.store(t_cut_ptr + j, cut, mask=live)


@triton.jit(do_not_specialize=["req_off", "N", "R", "S", "K", "Vp", "MASKED", "BLOCK", "DEFER"])
def verify_kernel(
    target_ptr, draft_ptr, draft_ids_ptr, pos_ptr, cu_ptr, idx_ptr, temp_ptr, seeds_ptr, accept_ptr,
    t_max_ptr, t_logsum_ptr, t_arg_ptr, d_max_ptr, d_logsum_ptr, t_thr_ptr, t_cut_ptr, tau_ptr,
    sampled_ptr, num_sampled_ptr,
    req_off, N, R, S, K, V, Vd, Vp, MASKED, BLOCK, DEFER,
    HAS_DRAFT: tl.constexpr, STREAM: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: requests of a chunk. Acceptance tests of SPEC section 4 (with MASKED, of the masked
    p; with BLOCK, a stochastic request takes t = tau from `block_tau_kernel`: SPEC 4b), then one
    resample (first rejection, or tau < n) or bonus draw with STREAM's noise. `sampled` is pre-filled
    with -1. With DEFER (set for MASKED or BLOCK batches, and for every batch of the explicit family,
    whose acceptance u is `accept_ptr[j]`) a stochastic request's draw is left to `resample_kernel`
    (residual.py), so this kernel's resample loop is the token-wise one, unmasked."""
    r = tl.minimum(tl.maximum(tl.program_id(0).to(tl.int64) + req_off, 0), R - 1)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    seed = tl.load(seeds_ptr + s)
    greedy = temp == 0.0
    t_div = tl.where(greedy, 1.0, temp)
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + r).to(tl.int64), 0), N)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + r + 1).to(tl.int64), start), N)
    n = tl.minimum(tl.maximum(end - start - 1, 0), K).to(tl.int32)
    out_row = sampled_ptr + r * (K + 1)

    # The acceptance tests of all steps are independent: evaluate them STEP_BLOCK
    # steps at a time, t = the first rejected step (n when all are accepted).
    t = n
    n_tok = n
    if BLOCK:
        if temp != 0.0:
            t = tl.minimum(tl.maximum(tl.load(tau_ptr + r), 0), n)
            n_tok = tl.full(n.shape, 0, n.dtype)
    for kb in range(0, n_tok, STEP_BLOCK):
        i_vec = kb + tl.arange(0, STEP_BLOCK)
        smask = i_vec < n
        j_vec = start + i_vec
        d = tl.load(draft_ids_ptr + j_vec + 1, mask=smask, other=-1)
        ok = smask & (d >= 0) & (d < Vp)
        d_safe = tl.where(ok, d, 0)
        if greedy:
            acc = ok & (d == tl.load(t_arg_ptr + j_vec, mask=smask, other=-1))
        else:
            j_pos = tl.load(pos_ptr + j_vec, mask=smask, other=0)
            if STREAM == "explicit":  # SPEC 3c: the batch's float64 u_j, in float32's range (streams.py)
                u, log_scale = explicit_uniform(tl.load(accept_ptr + j_vec, mask=smask, other=0.5))
            else:
                u = philox_acceptance(seed, j_pos)
            zd = tl.load(target_ptr + j_vec * V + d_safe, mask=smask, other=NEG_INF)
            zd = tl.div_rn(zd.to(tl.float32), t_div)
            zd = tl.where(zd == zd, zd, NEG_INF)
            if MASKED:
                k_thr = tl.load(t_thr_ptr + j_vec, mask=smask, other=NEG_INF)
                k_cut = tl.load(t_cut_ptr + j_vec, mask=smask, other=BIG_INDEX)
                zd = tl.where((zd > k_thr) | ((zd == k_thr) & (d_safe <= k_cut)), zd, NEG_INF)
            log_p = (zd - tl.load(t_max_ptr + j_vec, mask=smask, other=0.0)) \
                - tl.load(t_logsum_ptr + j_vec, mask=smask, other=0.0)
            thr = tl.log(u)
            if STREAM == "explicit":
                thr = thr - log_scale
            if HAS_DRAFT:
                zq = tl.load(draft_ptr + (s * K + i_vec) * Vd + d_safe, mask=smask, other=NEG_INF)
                zq = tl.div_rn(zq.to(tl.float32), t_div)
                zq = tl.where(zq == zq, zq, NEG_INF)
                thr = thr + ((zq - tl.load(d_max_ptr + j_vec, mask=smask, other=0.0))
                             - tl.load(d_logsum_ptr + j_vec, mask=smask, other=0.0))
            acc = ok & (log_p > thr)
        t = tl.minimum(t, tl.reduce(tl.where(smask & (acc == 0), i_vec, BIG_INDEX), 0, _MIN))
        tl.store(out_row + i_vec, d, mask=smask & (i_vec < t))

    jt = tl.minimum(tl.maximum(start + t, 0), N - 1)
    if greedy:
        tok = tl.load(t_arg_ptr + jt)
        tok = tok.to(tl.int64)  # both branches int64, whatever the scalars' width
    else:
        has_d = t < n
        d_t = tl.load(draft_ids_ptr + jt + 1, mask=has_d, other=-1)
        ok_t = has_d & (d_t >= 0) & (d_t < Vp)
        pos_t = tl.load(pos_ptr + jt)
        g = seed  # explicit: never drawn here (always DEFER)
        if STREAM != "explicit":
            g = resample_key(seed, pos_t, STREAM)
        m = tl.load(t_max_ptr + jt)
        log_s = tl.load(t_logsum_ptr + jt)
        t_row = target_ptr + jt * V
        if STREAM == "explicit":  # always DEFER: no resample loop compiled for the explicit family
            tok = d_t
        elif HAS_DRAFT:
            q_m = tl.load(d_max_ptr + jt, mask=ok_t, other=0.0)
            q_log_s = tl.load(d_logsum_ptr + jt, mask=ok_t, other=0.0)
            q_row = draft_ptr + (s * K + tl.minimum(tl.maximum(t, 0), K - 1)) * Vd
            if DEFER:
                tok = d_t  # a stand-in: resample_kernel draws this request's token
            else:
                tok = _resample(t_row, q_row, Vp, t_div, m, log_s, q_m, q_log_s, g, pos_t, ok_t, -1,
                                HAS_DRAFT, STREAM, BLOCK_V).to(tl.int64)
        else:
            excl = tl.where(ok_t, d_t, -1)
            if DEFER:
                tok = d_t
            else:
                tok = _resample(t_row, t_row, Vp, t_div, m, log_s, m, log_s, g, pos_t, ok_t, excl,
                                HAS_DRAFT, STREAM, BLOCK_V).to(tl.int64)
        tok = tok.to(tl.int64)
    tok = tl.where((tok >= 0) & (tok < Vp), tok, 0)
    tl.store(out_row + t, tok.to(tl.int64))
    tl.store(num_sampled_ptr + r, (t + 1).to(tl.int32))


@triton.jit(do_not_specialize=["row_off", "row_end", "N", "R", "S", "Vp", "MASKED"])
def log_softmax_kernel(
    target_ptr, out_ptr, req_of_row_ptr, idx_ptr, temp_ptr, t_thr_ptr, t_cut_ptr,
    row_off, row_end, N, R, S, V, Vp, PROCESSED, MASKED,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Grid: rows of one buffer block, BLOCK_R per program. out[b, :] = log_softmax over [0, V) of
    row row_off + b (< row_end): raw fp32 logits, or z = x / T when PROCESSED (raw for greedy rows),
    with the row's masks (SPEC 2) on [0, V') when MASKED (processed mode only): masked tokens -inf,
    tokens in [V', V) kept (not mask decisions); a greedy or unmasked row's (thr, cut) keep everything."""
    j, live = _tile_rows(row_off, row_end, N, BLOCK_R)
    b = j - row_off
    r = tl.minimum(tl.maximum(tl.load(req_of_row_ptr + j).to(tl.int64), 0), R - 1)
    s = tl.minimum(tl.maximum(tl.load(idx_ptr + r).to(tl.int64), 0), S - 1)
    temp = tl.load(temp_ptr + s)
    t_div = tl.where((PROCESSED != 0) & (temp != 0.0), temp, 1.0)
    rows = target_ptr + j * V
    thr = tl.load(t_thr_ptr + j)  # read only with MASKED (the host sets it for processed logprobs of
    cut = tl.load(t_cut_ptr + j)  # a batch with parameters; else these alias other buffers)
    m, sum_exp = _masked_stats(rows, live, V, t_div, thr, cut, Vp, MASKED, BLOCK_R, BLOCK_V)
    log_s = tl.log(sum_exp)[:, None]
    offs = tl.arange(0, BLOCK_V)
    out_rows = (out_ptr + b * V)[:, None]
    ptrs = rows[:, None]
    t_col = t_div[:, None]
    m_col = m[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    for start in range(0, V, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = live[:, None] & (idx < V)
        z = tl.div_rn(tl.load(ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where(z == z, z, NEG_INF)
        if MASKED:
            z = tl.where((z > thr_col) | ((z == thr_col) & (idx <= cut_col)) | (idx >= Vp), z, NEG_INF)
        tl.store(out_rows + idx, (z - m_col) - log_s, mask=mask)
