"""SPEC section 4's inverse-CDF resample of the explicit family (Triton, plain `tl`).

A sampler declaring `resample="inverse_cdf"` (SGLang's and FlashInfer's verification kernels)
emits, with `U = resample_uniforms[r]` and the unnormalised residual `r` of the row that samples,
the smallest `x` with `r(x) > 0` and `S_x > U * S` (`S_x = sum_{y <= x} r(y)`, `S = S_{V'-1}`).
`resample_kernel` (residual.py) calls `_resample_inverse_cdf` for a tile of BLOCK_R requests, in
two passes over each row's `[0, V')`, in the probability domain and in float32:

1. `r(x)` (`_masses`) and its total `S`, with p's total beside it, and the last token with
   `r(x) > 0` (and with `p(x) > 0`): the fallback below. `p` from the row statistics
   (`exp((z - m) - log_s)`, masked tokens 0: SPEC 2), and `r = max(P p - q, 0)` for model drafts
   (`P = exp(l_scale)`: 1 token-wise, `P_{tau-1}` of a block batch, SPEC 4b), `p` with
   `r(d) = 0` for one-hot drafts, `p` for a padded draft or the bonus. A residual with no
   positive mass (`S = 0`) falls back to `p`.
2. The prefix sums: per vocabulary block, `tl.cumsum` over its lanes (written as its own
   definition, `tl.associative_scan` with the sum combiner: one nested call fewer under the
   interpreter, which runs it as `np.cumsum`) plus a running carry, the emitted token the first
   `x` with `r(x) > 0` and `carry + cumsum > U * S`.

The carry takes each block's last prefix sum, and `S` of pass 1 is summed the same way, so the
last prefix sum of pass 2 is `S` bit for bit: no prefix exceeds `U * S` only when `U` rounds to
1 in float32 or `U * S` rounds up to `S`; then the token is the last one with `r(x) > 0` (SPEC 8
excuses both boundaries within `max(eps, V' * 2**-23)` of the prefix sum that separates the
tokens). That token is found in pass 1: tracked beside the carry in pass 2, it held ptxas to 64
registers and a 4-byte spill at sm_80 with int32 scalars (`rs-verify compile`). The lanes fix the
order of every sum, so a row's token depends on BLOCK_V only, never on the batch, the chunk or
the other rows of its tile. Each block costs the interpreter one nested call per pass
(`_masses`) besides its `tl` operations.
"""

import triton
import triton.language as tl
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN, _sum_combine as _SUM  # see masks.py

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)


@triton.jit
def _masses(t_ptrs, q_ptrs, idx, mask, t_col, m_col, log_s_col, q_m_col, q_log_s_col, p_scale, use_q_col, excl_col,
            thr_col, cut_col):
    """`(p, r)` of one block of tokens `idx` ([BLOCK_R, BLOCK_V], float32, 0 off `mask`): the masked
    p and the residual (module docstring); NaN (rows an unvalidated batch leaves without a finite
    logit) reads as 0."""
    z = tl.div_rn(tl.load(t_ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
    z = tl.where(z == z, z, NEG_INF)
    keep = mask & ((z > thr_col) | ((z == thr_col) & (idx <= cut_col)))
    p = tl.exp((z - m_col) - log_s_col)
    p = tl.where(keep & (p == p), p, 0.0)
    zq = tl.load(q_ptrs + idx, mask=use_q_col & keep, other=NEG_INF)
    zq = tl.div_rn(zq.to(tl.float32), t_col)
    zq = tl.where(zq == zq, zq, NEG_INF)
    r = tl.where(use_q_col, p_scale * p - tl.exp((zq - q_m_col) - q_log_s_col), tl.where(idx == excl_col, 0.0, p))
    return p, tl.where(r > 0.0, r, 0.0)


@triton.jit
def _resample_inverse_cdf(t_row_ptrs, q_row_ptrs, n, t_div, m, log_s, q_m, q_log_s, u, use_q, excl, thr, cut, l_scale,
                          rmask, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """The inverse-CDF token over [0, n) of `u` (float32, one per row) and the residual of
    `residual._resample_masked`'s arguments (module docstring), for each of the BLOCK_R rows; rows
    without `rmask` read nothing."""
    offs = tl.arange(0, BLOCK_V)
    last = (offs == BLOCK_V - 1)[None, :]
    t_ptrs = t_row_ptrs[:, None]
    q_ptrs = q_row_ptrs[:, None]
    t_col = t_div[:, None]
    m_col = m[:, None]
    log_s_col = log_s[:, None]
    q_m_col = q_m[:, None]
    q_log_s_col = q_log_s[:, None]
    p_scale = tl.exp(l_scale)[:, None]
    use_q_col = use_q[:, None]
    excl_col = excl[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    s_r = tl.full([BLOCK_R], 0, tl.float32)
    s_p = tl.full([BLOCK_R], 0, tl.float32)
    top_r = tl.full([BLOCK_R], -1, (offs + n).dtype)
    top_p = tl.full([BLOCK_R], -1, (offs + n).dtype)
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        p, r = _masses(t_ptrs, q_ptrs, idx, mask, t_col, m_col, log_s_col, q_m_col, q_log_s_col, p_scale, use_q_col,
                       excl_col, thr_col, cut_col)
        s_r += tl.reduce(tl.where(last, tl.associative_scan(r, 1, _SUM), 0.0), 1, _SUM)
        s_p += tl.reduce(tl.where(last, tl.associative_scan(p, 1, _SUM), 0.0), 1, _SUM)
        top_r = tl.maximum(top_r, tl.reduce(tl.where(r > 0.0, idx, -1), 1, _MAX))
        top_p = tl.maximum(top_p, tl.reduce(tl.where(p > 0.0, idx, -1), 1, _MAX))
    use_r = s_r > 0.0
    bound = (u * tl.where(use_r, s_r, s_p))[:, None]
    use_r_col = use_r[:, None]
    carry = tl.full([BLOCK_R], 0, tl.float32)
    first = tl.full([BLOCK_R], BIG_INDEX, (offs + n).dtype)  # the width of idx (see kernels._row_stats)
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        p, r = _masses(t_ptrs, q_ptrs, idx, mask, t_col, m_col, log_s_col, q_m_col, q_log_s_col, p_scale, use_q_col,
                       excl_col, thr_col, cut_col)
        w = tl.where(use_r_col, r, p)
        prefix = tl.associative_scan(w, 1, _SUM)
        hit = (w > 0.0) & (carry[:, None] + prefix > bound)
        first = tl.minimum(first, tl.reduce(tl.where(hit, idx, BIG_INDEX), 1, _MIN))
        carry += tl.reduce(tl.where(last, prefix, 0.0), 1, _SUM)
    tok = tl.where(first != BIG_INDEX, first, tl.where(use_r, top_r, top_p))
    return tl.where((tok >= 0) & (tok < n), tok, 0)
