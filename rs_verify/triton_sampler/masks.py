"""SPEC section 2's sampling-parameter masks as two statistics per row (Triton, plain `tl`).

A stochastic row with min-p, top-k or top-p keeps token x of [0, V') iff

    z_x > thr, or z_x == thr and x <= cut                          (`keep`)

One pair (thr float32, cut int32) per row describes all three masks: min-p and top-k mask by
value and keep every tie (cut = BIG_INDEX); top-p keeps a prefix of the tokens ordered by
descending z then ascending id, whose last token has value thr and id cut. Rows without a mask
have thr = -inf and cut = BIG_INDEX (`keep` is then true for every token). The kernels apply
`keep` when they load a target logit, so no masked copy of the logits is ever made.
`mask_stats_kernel` (kernels.py) calls `_row_masks` and `_masked_stats` for a tile of BLOCK_R rows:
the searches run while any row of the tile is in play, each row keeping its own range and answer.

How `_row_masks` finds them, with M = max z (from `row_stats_kernel`):
- min-p: lo = min(M + log m, M) (the clamp keeps the maximum when an approximate log of an
  m just below 1 rounds up).
- top-k: the k-th largest z among the tokens left by min-p (`_radix_select` with counts); with
  fewer than k of them it is -inf. lo = max(lo, that value): every token tied with it is kept.
- top-p: `_radix_select` with masses e = exp(z - M) over the tokens z >= lo: the smallest value
  t whose strictly larger tokens hold mass W < c * S (S: the mass of all tokens z >= lo), so
  every token above t is kept, and t's ties are kept in id order while W + r * e(t) < c * S
  (r ties before it): the first n_keep = ceil((c S - W) / e(t)), clamped to [1, ties] (the most
  likely token is always kept). When n_keep < ties, one more pass finds the id of the n_keep-th
  tie (a count per block, then a prefix count over the lanes of the block holding it): cut.
- `_masked_stats`: the masked row's log-sum-exp, one more pass.

`_radix_select` is an exact radix select (no sort) over order-preserving uint32 keys of the
float32 bits (-0.0 canonicalised to +0.0; NaN keys fall outside every range). It keeps the key
range [rlo, rhi] still in play (at first [key(lo), key(M)]); each pass splits it into RADIX = 16
bins at its highest differing bit, counts (and, for top-p, sums the mass of) each bin, keeps each
bin's smallest and largest key, picks the bin holding the answer and narrows the range to that
bin's smallest and largest key. A range of one key ends it (top-k also ends when the wanted rank
is the bin's first or last key): at most 8 passes, ~log16(tokens in play) + 1 in practice.
Per-bin accumulators are [BLOCK_R, MASK_BLOCK, RADIX], reduced once per pass, so the order of
every float sum is fixed by MASK_BLOCK: a row's statistics never depend on the batch, the chunk
or the other rows.

Cost per masked row, in passes over its V' logits (besides the statistics pass every row pays):
min-p alone 1; top-k 1 + its search; top-p 1 + its search (+ 1 when the cut splits ties); the
searches at most 8 passes each. Rows and batches without a parameter pay nothing.
"""

import triton
import triton.language as tl
# tl.reduce / tl.associative_scan with Triton's own combine functions are what tl.sum, tl.min,
# tl.max and tl.cumsum compile to; called directly, the interpreter takes its NumPy fast path
# without entering a nested @jit function (about 1.7 ms per call there), which decides its speed
# on the many small per-pass reductions here.
from triton.language.standard import _elementwise_max as _MAX, _elementwise_min as _MIN, _sum_combine as _SUM

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)
INT_MIN = tl.constexpr(-2147483648)
# Unsigned order key of -inf (bits 0xFF800000, all flipped) and the largest key.
NEG_INF_KEY = tl.constexpr(8388607)
KEY_MAX = tl.constexpr(4294967295)
RADIX = tl.constexpr(16)
RADIX_BITS = tl.constexpr(4)
RADIX_PASSES = tl.constexpr(8)


@triton.jit
def _radix_select(row_ptrs, n, t_div, lo, m, rank, c, act, TOP_P: tl.constexpr, BLOCK_R: tl.constexpr,
                  MB: tl.constexpr):
    """Exact radix select, for each of the BLOCK_R rows with `act`, over the tokens lo <= z <= m of
    z = div_rn(row, t_div) on [0, n) (lo, m, rank, c, t_div: one per row).

    TOP_P false: the key of the `rank`-th largest z (duplicates counted), NEG_INF_KEY when fewer
    than `rank` tokens qualify. TOP_P true: the key of the smallest z whose strictly larger tokens
    hold mass W < c * S (e = exp(z - m), S = total mass), with W and c * S; if none qualifies
    (c <= 0) the largest z. Returns (key, W, c * S, ties of that key), keys in unsigned order.

    Each pass splits the key range [rlo, rhi] still in play into RADIX bins at its highest
    differing bit, then narrows the range to the smallest and largest key of the chosen bin.
    A row that is done (or not in `act`) reads nothing more and keeps its values.
    """
    offs = tl.arange(0, MB)
    bins = tl.arange(0, RADIX)
    bins_row = bins[None, :]
    bins_3d = bins[None, None, :]
    above_mat = (bins_row > bins[:, None])[None, :, :]  # [1, b, b']: bin b' lies above bin b
    lo_bits = tl.where(lo == 0.0, 0.0, lo).to(tl.int32, bitcast=True)
    m_bits = tl.where(m == 0.0, 0.0, m).to(tl.int32, bitcast=True)
    rlo = (lo_bits ^ ((lo_bits >> 31) | INT_MIN)).to(tl.uint32, bitcast=True)
    rhi = (m_bits ^ ((m_bits >> 31) | INT_MIN)).to(tl.uint32, bitcast=True)
    kk = rank.to(tl.int32)
    done = tl.where(act, 0, 1)
    ans = tl.full([BLOCK_R], NEG_INF_KEY, tl.uint32)
    umax = tl.full([], KEY_MAX, tl.uint32)
    uzero = tl.full([], 0, tl.uint32)
    ties = tl.full([BLOCK_R], 0, tl.int32)
    w = tl.full([BLOCK_R], 0.0, tl.float32)
    target = tl.full([BLOCK_R], 0.0, tl.float32)
    ptrs = row_ptrs[:, None]
    t_col = t_div[:, None]
    m_col = m[:, None]
    p = 0
    while (p < RADIX_PASSES) & (tl.reduce(done, 0, _MIN) == 0):
        # the highest bit where rlo and rhi differ (-1023 when equal), by the float64 exponent
        diff = rlo ^ rhi
        top = tl.full([BLOCK_R], 0, tl.uint32)
        for step in tl.static_range(4, -1, -1):  # binary search for the highest set bit
            up = (diff >> (top + (1 << step))) != 0
            top = tl.where(up, top + (1 << step), top)
        sh = tl.where(top >= RADIX_BITS - 1, top - (RADIX_BITS - 1), 0)
        wide = (sh + RADIX_BITS) >= 32
        base = tl.where(wide, 0, rlo & ~((tl.full([], 1, tl.uint32) << tl.where(wide, 0, sh + RADIX_BITS)) - 1))
        span = (rhi - rlo)[:, None]
        rlo_col = rlo[:, None]
        base_col = base[:, None]
        sh_col = sh[:, None]
        open_col = (done == 0)[:, None]
        c_acc = tl.full([BLOCK_R, MB, RADIX], 0, tl.int32)
        e_acc = tl.full([BLOCK_R, MB, RADIX], 0, tl.float32)
        lo_acc = tl.full([BLOCK_R, MB, RADIX], KEY_MAX, tl.uint32)
        hi_acc = tl.full([BLOCK_R, MB, RADIX], 0, tl.uint32)
        for start in range(0, n, MB):
            idx = (start + offs)[None, :]
            mask = open_col & (idx < n)
            z = tl.div_rn(tl.load(ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
            z = tl.where(z == 0.0, 0.0, z)  # -0.0 and +0.0: one key
            bits = z.to(tl.int32, bitcast=True)
            key = (bits ^ ((bits >> 31) | INT_MIN)).to(tl.uint32, bitcast=True)  # unsigned order
            # NaN keys lie outside [key(-inf), key(+inf)], so outside every range: never counted
            dig = tl.where(mask & (key - rlo_col <= span), (key - base_col) >> sh_col, RADIX)
            hit = dig[:, :, None] == bins_3d
            c_acc += hit.to(tl.int32)
            if TOP_P:
                e_acc += tl.where(hit, tl.exp(z - m_col)[:, :, None], 0.0)
            key_3d = key[:, :, None]
            lo_acc = tl.minimum(lo_acc, tl.where(hit, key_3d, umax))
            hi_acc = tl.maximum(hi_acc, tl.where(hit, key_3d, uzero))
        cnt = tl.reduce(c_acc, 1, _SUM)
        kmin = tl.reduce(lo_acc, 1, _MIN)
        kmax = tl.reduce(hi_acc, 1, _MAX)
        going = done == 0
        if TOP_P:
            mass = tl.reduce(e_acc, 1, _SUM)
            target = tl.where(going & (p == 0), c * tl.reduce(mass, 1, _SUM), target)
            above = w[:, None] + tl.reduce(tl.where(above_mat, mass[:, None, :], 0.0), 2, _SUM)
            full = cnt > 0
            b = tl.reduce(tl.where(full & (above < target[:, None]), bins_row, RADIX), 1, _MIN)
            b = tl.where(b == RADIX, tl.reduce(tl.where(full, bins_row, -1), 1, _MAX), b)
            sel = bins_row == b[:, None]
            w = tl.where(going, tl.reduce(tl.where(sel, above, 0.0), 1, _SUM), w)
        else:
            above = tl.reduce(cnt, 1, _SUM)[:, None] - tl.associative_scan(cnt, 1, _SUM)  # tokens in bins above b
            kk_col = kk[:, None]
            b = tl.reduce(tl.where((above < kk_col) & (above + cnt >= kk_col), bins_row, -1), 1, _MAX)
            sel = bins_row == b[:, None]
            kk = tl.where(going, kk - tl.reduce(tl.where(sel, above, 0), 1, _SUM), kk)
        ties = tl.where(going, tl.reduce(tl.where(sel, cnt, 0), 1, _SUM), ties)
        rlo = tl.where(going, tl.reduce(tl.where(sel, kmin, umax), 1, _MIN), rlo)
        rhi = tl.where(going, tl.reduce(tl.where(sel, kmax, uzero), 1, _MAX), rhi)
        if TOP_P:
            fin = (b < 0) | (rlo == rhi)
            ans = tl.where(going & (b >= 0), rlo, ans)
        else:
            fin = (b < 0) | (kk == ties) | (kk == 1) | (rlo == rhi)
            ans = tl.where(going & (b >= 0), tl.where(kk == 1, rhi, rlo), ans)
        done = tl.where(going & fin, 1, done)
        p += 1
    return ans, w, target, ties


@triton.jit
def _row_masks(row_ptrs, n, t_div, m, min_p, top_k, top_p, act, BLOCK_R: tl.constexpr, MB: tl.constexpr):
    """(thr, cut) of each of the BLOCK_R rows over [0, n) with max m (see the module docstring);
    rows without `act` (greedy, no parameter, or past the chunk) get (-inf, BIG_INDEX)."""
    lo = tl.where(act & (min_p > 0.0), tl.minimum(m + tl.log(min_p), m), NEG_INF)
    cut = tl.full([BLOCK_R], BIG_INDEX, tl.int32)
    need_k = act & (top_k > 0) & (top_k < n)
    if tl.reduce(need_k.to(tl.int32), 0, _MAX) != 0:
        kth, _, _, _ = _radix_select(row_ptrs, n, t_div, lo, m, top_k, top_p, need_k, False, BLOCK_R, MB)
        kth = kth.to(tl.int32, bitcast=True)
        lo = tl.where(need_k, tl.maximum(lo, (kth ^ ((~kth >> 31) | INT_MIN)).to(tl.float32, bitcast=True)), lo)
    need_p = act & (top_p < 1.0)
    if tl.reduce(need_p.to(tl.int32), 0, _MAX) != 0:
        key, w, target, ties = _radix_select(row_ptrs, n, t_div, lo, m, top_k, top_p, need_p, True, BLOCK_R, MB)
        key = key.to(tl.int32, bitcast=True)
        lo = tl.where(need_p, (key ^ ((~key >> 31) | INT_MIN)).to(tl.float32, bitcast=True), lo)
        # ties at lo kept in id order while w + r * e(lo) < c * S: the first ceil(x) of them
        x = (target - w) / tl.exp(lo - m)
        x = tl.minimum(tl.maximum(tl.where(x == x, x, 1.0), 1.0), ties.to(tl.float32))
        keep = x.to(tl.int32)
        keep = tl.minimum(tl.maximum(keep + (keep.to(tl.float32) < x).to(tl.int32), 1), ties)
        splits = need_p & (keep < ties)
        if tl.reduce(splits.to(tl.int32), 0, _MAX) != 0:
            offs = tl.arange(0, MB)
            seen = tl.full([BLOCK_R], 0, tl.int32)
            ptrs = row_ptrs[:, None]
            t_col = t_div[:, None]
            lo_col = lo[:, None]
            for start in range(0, n, MB):
                idx = (start + offs)[None, :]
                mask = splits[:, None] & (idx < n)
                z = tl.div_rn(tl.load(ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
                tie = (mask & (z == lo_col)).to(tl.int32)
                in_block = tl.reduce(tie, 1, _SUM)
                here = splits & (cut == BIG_INDEX) & (seen + in_block >= keep)  # the block of the keep-th tie
                if tl.reduce(here.to(tl.int32), 0, _MAX) != 0:
                    # its rank here, want = keep - seen: the lowest lane with `want` ties at or before it
                    at_or_before = tl.associative_scan(tie, 1, _SUM)
                    lane = tl.reduce(tl.where(at_or_before >= (keep - seen)[:, None], offs[None, :], MB), 1, _MIN)
                    cut = tl.where(here, (start + lane).to(tl.int32), cut)
                seen += in_block
    return lo, cut


@triton.jit
def _masked_stats(row_ptrs, rmask, n, t_div, thr, cut, mask_end, masked, BLOCK_R: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    """Max and sum of exp(z - max) over [0, n) of each of the BLOCK_R rows (rows with `rmask` false
    read nothing), of the tokens `keep` leaves when `masked` (tokens at or past `mask_end` are not
    mask decisions: always kept), of all tokens otherwise. Per-lane online accumulators with the
    formulas of `_row_stats` (kernels.py), without its argmax: an unmasked row's statistics are bit
    for bit `_row_stats`'s."""
    offs = tl.arange(0, BLOCK_V)
    m_vec = tl.full([BLOCK_R, BLOCK_V], NEG_INF, tl.float32)
    s_vec = tl.full([BLOCK_R, BLOCK_V], 0, tl.float32)
    ptrs = row_ptrs[:, None]
    t_col = t_div[:, None]
    thr_col = thr[:, None]
    cut_col = cut[:, None]
    for start in range(0, n, BLOCK_V):
        idx = (start + offs)[None, :]
        mask = rmask[:, None] & (idx < n)
        z = tl.div_rn(tl.load(ptrs + idx, mask=mask, other=NEG_INF).to(tl.float32), t_col)
        z = tl.where(z == z, z, NEG_INF)
        if masked:
            z = tl.where((z > thr_col) | ((z == thr_col) & (idx <= cut_col)) | (idx >= mask_end), z, NEG_INF)
        gt = z > m_vec
        e = tl.exp(tl.where(gt, m_vec - z, z - m_vec))
        e = tl.where(z == NEG_INF, 0.0, e)
        s_vec = tl.where(gt, s_vec * e + 1.0, s_vec + e)
        m_vec = tl.where(gt, z, m_vec)
    m = tl.reduce(m_vec, 1, _MAX)
    live = m_vec != NEG_INF
    scale = tl.exp(tl.where(live, m_vec - m[:, None], 0.0))
    s = tl.reduce(tl.where(live, s_vec * scale, 0.0), 1, _SUM)
    return m, s
