"""The `murmur3` stream family's resampling noise in plain `tl` (SPEC 3b).

`murmur3_noise(seed, pos, idx)`: MurmurHash3_x86_32 (hash seed 0) of the key
`(seed_lo, seed_hi, pos_lo, x)` for every token `x` of `idx`, its float32 uniform `u` and the
noise `G = -log(-log(max(1 - u, 2**-24)))`. `log(1 - u)` is a series for small `u` (no `log`
of a number near 1, which compiled Triton evaluates with an absolute error) and Goldberg's
`log(w) * -u / (w - 1)` above it; `u = 1.0` (the 128 largest hashes) takes the floor.
uint32 products and sums wrap modulo `2**32`, as the hash needs, compiled and interpreted.
The acceptance uniform of the family is Triton Philox's (SPEC 3a), drawn by the callers.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from ..contract import murmur3 as contract, murmur3_fp64 as fp64_contract
from ..contract.streams import report_mismatch
from ..harness import device

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
def murmur3_hash(seed, pos, idx, HASH_SEED: tl.constexpr = 0):
    """MurmurHash3_x86_32 of the words `(seed_lo, seed_hi, pos_lo, idx)` of an int64 `seed` and
    `pos` (their low and high 32 bits; casts to uint32 truncate), the state starting from
    `HASH_SEED`, uint32 of `idx`'s shape."""
    h = _mix(tl.full(idx.shape, HASH_SEED, tl.uint32), seed.to(tl.int64).to(tl.uint32))
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


HI_HASH_SEED = tl.constexpr(0x9E3779B9)  # murmur3-fp64's second hash (SPEC 3b)
ULP53 = tl.constexpr(1.1102230246251565e-16)  # 2**-53, exact in float32 too


@triton.jit
def murmur3_fp64_noise(seed, pos, idx):
    """The float64 Gumbel noise `G_x` of `murmur3-fp64` (SPEC 3b): `r` the top 53 bits of the hashes
    with hash seeds `0x9E3779B9` (high word) and 0 (low), `u = (r + 0.5) 2**-53`, `1 - 2**-53` where
    that rounds to 1, `G = -log(-log(u))`, all in float64."""
    lo = murmur3_hash(seed, pos, idx).to(tl.uint64)
    hi = murmur3_hash(seed, pos, idx, HI_HASH_SEED).to(tl.uint64)
    r = ((hi << 32) | lo) >> 11
    u = (r.to(tl.float64) + 0.5) * ULP53
    u = tl.where(u == 1.0, u - ULP53, u)
    return -tl.log(-tl.log(u))


def called_directly(fn):
    """`fn` itself compiled; under Triton's interpreter, the plain function the interpreter
    rewrites it to (`InterpretedFunction.rewrite()`, cached by Triton).

    The interpreter re-patches `triton.language` on every call of a nested `@triton.jit` function
    (about 0.2-1 ms each), and `murmur3_noise` nests seven such calls (the hash's four blocks, the
    hash, the uniform, itself) per vocabulary block. Every caller here is a running kernel, which
    has patched `triton.language` already, so calling the rewritten functions skips only the
    repeated patching: the kernels' noise costs what Philox's does (3.9 ms instead of 5.3 ms per
    256-lane block in a bench kernel). Compiled (and in `aot.py`'s compile copy) nothing changes."""
    rewrite = getattr(fn, "rewrite", None) if type(fn).__name__ == "InterpretedFunction" else None
    return fn if rewrite is None else rewrite()


_mix, murmur3_hash, murmur3_uniform, murmur3_noise, murmur3_fp64_noise = map(
    called_directly, (_mix, murmur3_hash, murmur3_uniform, murmur3_noise, murmur3_fp64_noise))

# -- the family's check against the contract (StreamFamily.triton_check) ----------------------
NOISE_RTOL = 1e-5  # float32 noise vs the contract's float64: ~100 ulp of max(1, |G|) (tl.log is approximate on GPUs)
NOISE64_RTOL = 1e-13  # float64 noise: ~500 ulp of max(1, |G|) (a float64 log within a few ulp, two of them nested)
CHECK_TOKENS = (0, 37, 2**31 - 40, 2**31 - 3)  # token ranges [a, b): a masked tail and the largest int32 ids


@triton.jit
def probe_kernel(seed_ptr, pos_ptr, hash_ptr, uniform_ptr, noise_ptr, noise64_ptr, tok0, n_tok, BLOCK: tl.constexpr):
    """Row `r`: hash, uniform and noise (murmur3's float32 and murmur3-fp64's float64) of tokens
    `tok0 .. tok0 + n_tok - 1` at `(seeds[r], pos[r])`."""
    r = tl.program_id(0)
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)
    for start in range(0, n_tok, BLOCK):
        j = start + tl.arange(0, BLOCK)
        mask = j < n_tok
        idx = tok0 + j
        h = murmur3_hash(seed, pos, idx)
        tl.store(hash_ptr + r * n_tok + j, h.to(tl.int32, bitcast=True), mask=mask)
        tl.store(uniform_ptr + r * n_tok + j, murmur3_uniform(h), mask=mask)
        tl.store(noise_ptr + r * n_tok + j, murmur3_noise(seed, pos, idx), mask=mask)
        tl.store(noise64_ptr + r * n_tok + j, murmur3_fp64_noise(seed, pos, idx), mask=mask)


def triton_hash_and_noise(seeds, pos, tok0: int, n_tok: int):
    """`(hash uint32, uniform float32, noise float32, fp64 noise float64)` `[rows, n_tok]` from `probe_kernel`."""
    dev = "cpu" if device.interpreted() else "cuda"  # the suite's one backend choice, made on import
    s = torch.from_numpy(np.ascontiguousarray(seeds, np.int64)).to(dev)
    p = torch.from_numpy(np.ascontiguousarray(pos, np.int64)).to(dev)
    rows = s.shape[0]
    h = torch.empty(rows, n_tok, dtype=torch.int32, device=dev)
    u = torch.empty(rows, n_tok, dtype=torch.float32, device=dev)
    g = torch.empty(rows, n_tok, dtype=torch.float32, device=dev)
    g64 = torch.empty(rows, n_tok, dtype=torch.float64, device=dev)
    if rows:
        probe_kernel[(rows,)](s, p, h, u, g, g64, tok0, n_tok, BLOCK=64)
    return h.cpu().numpy().view(np.uint32), u.cpu().numpy(), g.cpu().numpy(), g64.cpu().numpy()


def _check(seeds, offsets_dtype, offsets, fp64: bool) -> None:
    seeds, pos = np.broadcast_arrays(np.asarray(seeds, np.int64), np.asarray(offsets).astype(np.int64))
    seeds, pos = seeds.reshape(-1), pos.reshape(-1)
    for a, b in zip(CHECK_TOKENS[::2], CHECK_TOKENS[1::2]):
        h, u, g, g64 = triton_hash_and_noise(seeds, pos, a, b - a)
        toks = np.arange(a, b, dtype=np.int64)[None, :]
        words = contract.key_words(seeds[:, None], pos[:, None], toks)
        h_ref = contract.hash_words(*words)
        at = {"seed": seeds[:, None], "pos": pos[:, None], "token": toks}
        dt = f"{np.dtype(offsets_dtype)} offsets"
        if fp64:
            g_ref = fp64_contract.noise_from_hashes(h_ref, contract.hash_words(*words, hash_seed=fp64_contract.HI_HASH_SEED))
            err = np.abs(g64 - g_ref) / np.maximum(1.0, np.abs(g_ref))
            report_mismatch(f"murmur3-fp64 noise, {dt}", g_ref, g64, at, bad=~(err <= NOISE64_RTOL))
            continue
        u_ref = contract.uniform_from_hash(h_ref)
        report_mismatch(f"murmur3 hash, {dt}", h_ref, h, at)
        report_mismatch(f"murmur3 uniform, {dt}", u_ref, u, at)
        g_ref = contract.noise_from_uniform(u_ref)
        err = np.abs(g.astype(np.float64) - g_ref) / np.maximum(1.0, np.abs(g_ref))
        report_mismatch(f"murmur3 noise, {dt}", g_ref, g, at, bad=~(err <= NOISE_RTOL))


def check_matches_contract(seeds, offsets_dtype, offsets) -> None:
    """`murmur3`'s `StreamFamily.triton_check`: the hash and uniform of this module equal the
    contract's (`rs_verify.contract.murmur3`) bit for bit, and its float32 noise the contract's
    float64 noise within `NOISE_RTOL`, for rows `(seeds, offsets as positions)` and the tokens of
    `CHECK_TOKENS`; `AssertionError` naming the first mismatch."""
    _check(seeds, offsets_dtype, offsets, fp64=False)


def check_fp64_matches_contract(seeds, offsets_dtype, offsets) -> None:
    """`murmur3-fp64`'s `StreamFamily.triton_check`: this module's float64 noise equals the contract's
    (`rs_verify.contract.murmur3_fp64`) within `NOISE64_RTOL`, as `check_matches_contract` checks murmur3's."""
    _check(seeds, offsets_dtype, offsets, fp64=True)
