"""The `murmur3` stream family (SPEC 3b; vLLM MRV2 from PR 51367 on), and MurmurHash3_x86_32 in NumPy.

- acceptance uniform of row `j`: triton-philox's (SPEC 3a), `max(rand(seed, pos_j), TINY)`;
- resampling noise of token `x`: `h` = MurmurHash3_x86_32 (hash seed 0) of the words
  `(seed_lo, seed_hi, pos_lo, x)`, `u_x` its float32 uniform, `G_x = -log(-log(max(1 - u_x, 2**-24)))`.

The noise of row `j` for token `x` hashes the 16-byte key made of the little-endian uint32
words `(seed_lo, seed_hi, pos_lo, x)` with hash seed 0: the standard MurmurHash3_x86_32, so
any independent implementation of it is a known-answer oracle (the tests use the `mmh3`
package). Written by hand because the family hashes whole `[rows, vocab]` grids: a library
that hashes one byte string per call would take minutes where these ufuncs take
milliseconds.

All arithmetic is on uint32 arrays, where NumPy's multiply and add wrap modulo `2**32`.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .streams import BLOCK_SEEDS, NoisePlant, StreamEdges, StreamFamily, register
from .triton_philox import TRITON_PHILOX

__all__ = ["MURMUR3", "SMALLEST_HASH", "SMALLEST_LABEL", "TOP_HASH", "TOP_LABEL", "U_FLOOR_LOG", "hash_words", "key_words", "noise_from_uniform", "resample_noise",
           "seed_for_hash", "seeds_for_hash", "uniform_from_hash"]

C1 = np.uint32(0xCC9E2D51)
C2 = np.uint32(0x1B873593)
N_ADD = np.uint32(0xE6546B64)
F1 = np.uint32(0x85EBCA6B)
F2 = np.uint32(0xC2B2AE35)
KEY_BYTES = np.uint32(16)

#: `log(2**-24)`: `max(1 - u, 2**-24)` floors the exponential's argument (SPEC 3b), so `u = 1.0`
#: (the 128 largest hashes) gets the finite noise `-log(24 log 2)`.
U_FLOOR_LOG = -24.0 * np.log(2.0)

_HI = np.float32(2.0**-16)
_LO = np.float32(2.0**-32)
_HALF = np.float32(0.5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def hash_words(*words: np.ndarray, hash_seed: int = 0) -> np.ndarray:
    """MurmurHash3_x86_32 of the key made of the given uint32 words, elementwise over their
    broadcast shape (the key of element `i` is `words[0][i], words[1][i], ...`), the state
    starting from `hash_seed` (0 in SPEC 3b; `murmur3-fp64` also hashes with `0x9E3779B9`)."""
    words = [np.asarray(w, dtype=np.uint32) for w in words]
    h = np.full(np.broadcast_shapes(*(w.shape for w in words)), hash_seed & _M, np.uint32)
    with np.errstate(over="ignore"):
        for w in words:
            k = w * C1
            k = _rotl(k, 15)
            k *= C2
            h ^= k
            h = _rotl(h, 13)
            h = h * np.uint32(5) + N_ADD
        h ^= np.uint32(4 * len(words))
        h ^= h >> np.uint32(16)
        h *= F1
        h ^= h >> np.uint32(13)
        h *= F2
        h ^= h >> np.uint32(16)
    return h


def key_words(seeds, pos, tokens) -> tuple[np.ndarray, ...]:
    """The four uint32 words `(seed_lo, seed_hi, pos_lo, x)` of SPEC 3b, broadcast: int64 seeds
    and positions (two's complement; only the position's low word is hashed), int tokens."""
    s = np.asarray(seeds, dtype=np.int64).view(np.uint64)
    p = np.asarray(pos, dtype=np.int64).view(np.uint64)
    lo32 = np.uint64(0xFFFFFFFF)
    seed_lo = (s & lo32).astype(np.uint32)
    seed_hi = (s >> np.uint64(32)).astype(np.uint32)
    pos_lo = (p & lo32).astype(np.uint32)
    x = np.asarray(tokens, dtype=np.int64).astype(np.uint32)
    return seed_lo, seed_hi, pos_lo, x


def uniform_from_hash(h: np.ndarray) -> np.ndarray:
    """`u = fp32(h >> 16) * 2**-16 + (fp32(h & 0xFFFF) + 0.5) * 2**-32` in float32: both
    products are exact, the sum is rounded to nearest; `u` lies in `[2**-33, 1]`."""
    h = np.asarray(h, dtype=np.uint32)
    hi = (h >> np.uint32(16)).astype(np.float32) * _HI
    lo = ((h & np.uint32(0xFFFF)).astype(np.float32) + _HALF) * _LO
    return np.add(hi, lo, dtype=np.float32)


def noise_from_uniform(u: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`G = -log(-log(max(1 - u, 2**-24)))` in float64, `log(1 - u)` by `log1p(-u)` (exact for
    small `u`); `u = 1.0` gives `-log(24 log 2)`."""
    u = np.asarray(u, dtype=np.float64)
    with np.errstate(divide="ignore"):  # u = 1.0: log1p(-1) = -inf, floored just below
        log_e = np.log1p(np.negative(u), out=out)
    # For float32 u < 1, 1 - u >= 2**-24, so the floor changes u = 1.0 alone.
    np.maximum(log_e, U_FLOOR_LOG, out=log_e)
    np.negative(log_e, out=log_e)  # E = -log(max(1 - u, 2**-24)) > 0
    np.log(log_e, out=log_e)
    return np.negative(log_e, out=log_e)


# -- planting edge values -------------------------------------------------------------------
# Every step of the hash is a bijection of the state for fixed other words, so for any target
# hash and any `(seed_hi, pos_lo, x)` exactly one `seed_lo` reaches it: the strategies plant
# `u = 1.0` and the smallest `u` on any token they draw by choosing the seed's low word.

_M = 0xFFFFFFFF


def _inv(a: int) -> int:
    return pow(a, -1, 2**32)


def _rotr(x: int, r: int) -> int:
    return ((x >> r) | (x << (32 - r))) & _M


def _unfmix(h: int) -> int:
    h ^= h >> 16
    h = (h * _inv(int(F2))) & _M
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _inv(int(F1))) & _M
    return h ^ (h >> 16)


def _mix_k(k: int) -> int:
    k = (k * int(C1)) & _M
    k = ((k << 15) | (k >> 17)) & _M
    return (k * int(C2)) & _M


def _step(h: int, k: int) -> int:
    h ^= _mix_k(k)
    h = ((h << 13) | (h >> 19)) & _M
    return (h * 5 + int(N_ADD)) & _M


def _unstep(h_next: int, k: int) -> int:
    """The state before the block `k` that `_step` maps to `h_next`."""
    h = ((h_next - int(N_ADD)) * _inv(5)) & _M
    return _rotr(h, 13) ^ _mix_k(k)


def seed_for_hash(target: int, seed_hi: int, pos: int, token: int, hash_seed: int = 0) -> int:
    """The int64 seed with high word `seed_hi` whose key `(seed_lo, seed_hi, pos_lo, token)`
    hashes to `target` with `hash_seed` (SPEC 3b): the seed that plants a chosen noise on `token`
    at `pos`."""
    return int(seeds_for_hash(target, np.array([seed_hi & _M], np.uint64), pos, token, hash_seed)[0])


def seeds_for_hash(target: int, seed_his: np.ndarray, pos: int, token: int, hash_seed: int = 0) -> np.ndarray:
    """`seed_for_hash` for an array of high words at once (int64 seeds); the arithmetic above, on
    uint64 arrays with every product masked to its low 32 bits."""
    his = np.asarray(seed_his).astype(np.uint64) & np.uint64(_M)
    h = _unfmix(target & _M) ^ 16
    for word in (token & _M, pos & _M):
        h = _unstep(h, word)
    h = _unstep(np.full(his.shape, h, np.uint64), his)
    # h is now the state after the first block: h = _step(hash_seed, seed_lo); invert the block's mix.
    k = ((h - np.uint64(N_ADD)) * np.uint64(_inv(5))) & np.uint64(_M)
    k = _rotr(k, 13) ^ np.uint64(hash_seed & _M)  # = mix_k(seed_lo)
    k = (k * np.uint64(_inv(int(C2)))) & np.uint64(_M)
    k = _rotr(k, 15)
    seed_lo = (k * np.uint64(_inv(int(C1)))) & np.uint64(_M)
    return ((his << np.uint64(32)) | seed_lo).view(np.int64)


# -- the family ------------------------------------------------------------------------------

def resample_noise(seeds: np.ndarray, pos: np.ndarray, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """`G_x` of rows keyed by int64 `(seeds, pos)` for tokens `0 .. vocab - 1`: float64 `[rows, vocab]`."""
    seeds = np.asarray(seeds, np.int64).reshape(-1, 1)
    pos = np.asarray(pos, np.int64).reshape(-1, 1)
    h = hash_words(*key_words(seeds, pos, np.arange(int(vocab), dtype=np.int64)[None, :]))
    if out is not None and out.shape != h.shape:
        raise ValueError(f"out must have shape {h.shape}, not {out.shape}")
    return noise_from_uniform(uniform_from_hash(h), out=out)


TOP_HASH, SMALLEST_HASH = 2**32 - 1, 0  # u = 1.0 (the floored noise) and the smallest u, 2**-33
TOP_LABEL = "murmur3: u = 1.0 (floored noise) wins a bonus token"
SMALLEST_LABEL = "murmur3: the smallest u (2**-33) decides a bonus token"


def _edges():
    """The family's edge points: the acceptance floor is triton-philox's (the same uniform); the
    smallest noise uniform `u = 2**-33` (hash 0, below `2**-25`) and `u = 1.0` (hash `2**32 - 1`,
    the `2**-24` floor) are planted on token 3 at a position above `2**32` by the seed's low word,
    and on any token the strategies draw (`NoisePlant.aim`): `u = 1.0` must win there (without the
    floor `G = -inf`), the smallest `u` must decide a near-tie (G ~ 22.9; a float32 `log(1 - u)`
    gives `+inf`, triton-philox's floor `TINY` on `u` 21.5)."""
    pos = 2**32 + 1671644  # its low word alone is hashed
    tiny, top = (seed_for_hash(SMALLEST_HASH, 2026, pos, 3), pos, 3), (seed_for_hash(TOP_HASH, 2026, pos, 3), pos, 3)
    return StreamEdges(zero_uniform=TRITON_PHILOX.edges.zero_uniform, tiny_noise=tiny, top_noise=top,
                       plants=(NoisePlant("wins", TOP_LABEL, (top,), partial(_aim, TOP_HASH)),
                               NoisePlant("near", SMALLEST_LABEL, (tiny,), partial(_aim, SMALLEST_HASH))),
                       pos_period=2**32)


def _aim(target: int, seed_hi: int, pos: int, token: int) -> int:
    return seed_for_hash(target, seed_hi, pos, token)


def _register():
    return register(StreamFamily(
        name="murmur3",
        section="3b",
        acceptance=TRITON_PHILOX.acceptance,
        noise=resample_noise,
        floor=TRITON_PHILOX.floor,
        edges=_edges(),
        triton="murmur3",
        triton_check="rs_verify.triton_sampler.murmur3:check_matches_contract",
        block_seeds=BLOCK_SEEDS,
        doc="Triton Philox acceptance uniforms, MurmurHash3 resampling noise; vLLM MRV2 from PR 51367 on "
            "(block verification keyed by the step-mixed seed from 0.33.0 on: block_seed 'step').",
    ))


MURMUR3 = _register()
