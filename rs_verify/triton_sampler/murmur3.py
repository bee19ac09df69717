"""The `murmur3` stream family's resampling noise in plain `tl` (SPEC 3b).

`murmur3_noise(seed, pos, idx)`: MurmurHash3_x86_32 (hash seed 0) of the key
`(seed_lo, seed_hi, pos_lo, x)` for every token `x` of `idx`, its float32 uniform `u` and the
noise `G = -log(-log(max(1 - u, 2**-24)))`. `log(1 - u)` is a series for small `u` (no `log`
of a number near 1, which compiled Triton evaluates with an absolute error) and Goldberg's
`log(w) * -u / (w - 1)` above it; `u = 1.0` (the 128 largest hashes) takes the floor.
uint32 products and sums wrap modulo `2**32`, as the hash needs, compiled and interpreted.
The acceptance uniform of the family is Triton Philox's (SPEC 3a), drawn by the callers.
"""

import triton
import triton.language as tl

C1 = tl.constexpr(0xCC9E2D51)
C2 = tl.constexpr(0x1B873593)
N_ADD = tl.constexpr(0xE6546B64)
F1 = tl.constexpr(0x85EBCA6B)
F2 = tl.constexpr(0xC2B2AE35)
LOG_FLOOR = tl.constexpr(-16.635532333438687)  # log(2**-24): max(1 - u, 2**-24) at u = 1.0
SERIES_BELOW = tl.constexpr(0.015625)  # 2**-6: the series' first omitted term u**6 / 6 is < 2**-24 u


@triton.jit
def _mix(h, k):
    """One 4-byte block of the key into the state `h` (uint32)."""
    k = k * C1
    k = (k << 15) | (k >> 17)
    k = k * C2
    h = h ^ k
    h = (h << 13) | (h >> 19)
    return h * 5 + N_ADD


@triton.jit
def murmur3_hash(seed, pos, idx):
    """MurmurHash3_x86_32 of the words `(seed_lo, seed_hi, pos_lo, idx)` of an int64 `seed` and
    `pos` (their low and high 32 bits; casts to uint32 truncate), uint32 of `idx`'s shape."""
    h = _mix(tl.full(idx.shape, 0, tl.uint32), seed.to(tl.int64).to(tl.uint32))
    h = _mix(h, (seed.to(tl.int64) >> 32).to(tl.uint32))
    h = _mix(h, pos.to(tl.int64).to(tl.uint32))
    h = _mix(h, idx.to(tl.uint32))
    h = h ^ 16
    h = h ^ (h >> 16)
    h = h * F1
    h = h ^ (h >> 13)
    h = h * F2
    return h ^ (h >> 16)


@triton.jit
def murmur3_uniform(h):
    """`fp32(h >> 16) * 2**-16 + (fp32(h & 0xFFFF) + 0.5) * 2**-32`, float32 in `[2**-33, 1]`."""
    hi = (h >> 16).to(tl.float32) * 1.52587890625e-05
    lo = ((h & 0xFFFF).to(tl.float32) + 0.5) * 2.3283064365386963e-10
    return hi + lo


@triton.jit
def murmur3_noise(seed, pos, idx):
    """The Gumbel noise `G_x` of SPEC 3b for the tokens `idx` of one row (int64 `seed`, `pos`), float32."""
    u = murmur3_uniform(murmur3_hash(seed, pos, idx))
    w = 1.0 - u
    series = -u * (1.0 + u * (0.5 + u * (0.3333333333333333 + u * (0.25 + u * 0.2))))
    safe_w = tl.where(w == 0.0, 0.5, w)
    goldberg = tl.log(safe_w) * (-u) / tl.where(w == 1.0, -1.0, safe_w - 1.0)
    log1m_u = tl.where(u < SERIES_BELOW, series, tl.where(w == 0.0, LOG_FLOOR, goldberg))
    return -tl.log(-log1m_u)
