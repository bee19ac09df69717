"""The `murmur3-fp64` stream family (SPEC 3b; vLLM's `use_fp64` noise, off by default there).

- acceptance uniform of row `j`: murmur3's (SPEC 3a's Philox, `max(rand(seed, pos_j), TINY)`);
- resampling noise of token `x`: `lo` and `hi` are the MurmurHash3_x86_32 of murmur3's key
  `(seed_lo, seed_hi, pos_lo, x)` with hash seed `0` and with hash seed `0x9E3779B9`;
  `r = ((hi << 32) | lo) >> 11` (53 bits), `u = (float64(r) + 0.5) * 2**-53` rounded to nearest,
  `u = 1 - 2**-53` where that gives `1.0` (`r = 2**53 - 1` alone), and `G = -log(-log(u))` in
  float64, added to float64 residual scores.

The noise's range is `[G(r = 0), G(r = 2**53 - 1)] = [-3.62, 36.74]`. Random seeds reach neither
end (each is one key in `2**53`), so the family ships a bank of keys for each (`EDGE_KEYS`):
`"clamp"`, `r = 2**53 - 1`, where a sampler without the clamp gets `u = 1.0`, `log u = 0` and
`G = +inf`; `"zero"`, `r = 0`, the smallest uniform `2**-54`. Each hash is a bijection of the
seed's low word for fixed other words, so a key whose `hi` is chosen costs one inversion; its
`lo` must then fall in a range of `2**21` values (`scan_keys`; some tokens have no such key in
millions of seeds): seconds per bank, so the bank is scanned once and checked when the record is
built (`StreamFamily.check`). The plants: the clamp's token must lose where `G = 36.74` leaves it
behind (without the clamp it wins, `G = +inf`), `r = 0`'s must win where `G = -3.62` is enough
(without the half step `u = 0` and `G = -inf`).
"""

from __future__ import annotations

import numpy as np

from .murmur3 import MURMUR3, hash_words, key_words, seeds_for_hash
from .streams import BLOCK_SEEDS, NoisePlant, StreamEdges, StreamFamily, register

__all__ = ["EDGE_KEYS", "HI_HASH_SEED", "MURMUR3_FP64", "noise_from_hashes", "resample_noise", "scan_keys",
           "uniform_from_hashes"]

HI_HASH_SEED = 0x9E3779B9
_ULP = 2.0**-53
_TOP_R = 2**53 - 1


def uniform_from_hashes(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`u = (float64(r) + 0.5) * 2**-53`, `r = ((hi << 32) | lo) >> 11`, and `1 - 2**-53` where it rounds to 1."""
    r = ((np.asarray(hi, np.uint64) << np.uint64(32)) | np.asarray(lo, np.uint64)) >> np.uint64(11)
    u = (r.astype(np.float64) + 0.5) * _ULP  # r < 2**53: exact in float64; the sum rounds to nearest
    return np.where(u == 1.0, 1.0 - _ULP, u)


def noise_from_hashes(lo: np.ndarray, hi: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`G = -log(-log(u))` of the hashes' float64 uniform (finite: `u` lies in `[2**-54, 1 - 2**-53]`)."""
    g = np.log(uniform_from_hashes(lo, hi), out=out)
    np.negative(g, out=g)
    np.log(g, out=g)
    return np.negative(g, out=g)


def resample_noise(seeds: np.ndarray, pos: np.ndarray, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """`G_x` of rows keyed by int64 `(seeds, pos)` for tokens `0 .. vocab - 1`: float64 `[rows, vocab]`."""
    words = key_words(np.asarray(seeds, np.int64).reshape(-1, 1), np.asarray(pos, np.int64).reshape(-1, 1),
                      np.arange(int(vocab), dtype=np.int64)[None, :])
    lo, hi = hash_words(*words), hash_words(*words, hash_seed=HI_HASH_SEED)
    if out is not None and out.shape != lo.shape:
        raise ValueError(f"out must have shape {lo.shape}, not {out.shape}")
    return noise_from_hashes(lo, hi, out=out)


def _r(seed: int, pos: int, token: int) -> int:
    words = key_words(seed, pos, token)
    return (int(hash_words(*words, hash_seed=HI_HASH_SEED)) << 21) | (int(hash_words(*words)) >> 11)


# -- the bank of edge keys --------------------------------------------------------------------
#: `(seed, pos, token)` keys of each edge: `"clamp"` (`r = 2**53 - 1`) and `"zero"` (`r = 0`), eight
#: tokens each below 13, at a position above `2**32` (only the position's low word is hashed). From
#: `scan_keys("clamp")` and `scan_keys("zero")` (6 s and 3 s on one core).
EDGE_KEYS = {
    "clamp": ((2492590410393381, 4315228499, 1), (7967280008383575, 4315228499, 3),
              (491850396789458, 4315228499, 5), (1510109047289354, 4315228499, 7),
              (8222058444022060, 4315228499, 8), (2565785640109023, 4315228499, 9),
              (25986296746721862, 4315228499, 11), (7311731938237263, 4315228499, 12)),
    "zero": ((56336376238293, 4315228499, 0), (1074275387384402, 4315228499, 1),
             (3285602207375748, 4315228499, 3), (15333423264386291, 4315228499, 4),
             (422041038396602, 4315228499, 5), (709532276990682, 4315228499, 6),
             (12919546999776212, 4315228499, 7), (15392617478751052, 4315228499, 8)),
}
_R_OF = {"clamp": _TOP_R, "zero": 0}
_HI_OF = {"clamp": 0xFFFFFFFF, "zero": 0}


def scan_keys(kind: str, *, n: int = 8, tokens=range(64), pos: int = 2**32 + 20261203, his: int = 2**23,
              chunk: int = 1 << 20) -> tuple:
    """Up to `n` keys of edge `kind` on distinct tokens: for each token, the seed high words `0 .. his - 1`
    (in chunks), each with the seed low word that gives `hi` of the edge (an inversion of the hash with
    `HI_HASH_SEED`), until `lo` completes `r` (one high word in `2**21` on the tokens that have keys:
    some tokens have none in the range, and are passed over)."""
    want = np.uint32(_R_OF[kind] & 0x1FFFFF)
    found = []
    for token in tokens:
        for start in range(0, his, chunk):
            seeds = seeds_for_hash(_HI_OF[kind], np.arange(start, start + chunk, dtype=np.int64), pos, int(token),
                                   HI_HASH_SEED)
            hit = np.flatnonzero((hash_words(*key_words(seeds, pos, token)) >> np.uint32(11)) == want)
            if hit.size:
                found.append((int(seeds[hit[0]]), pos, int(token)))
                break
        if len(found) == n:
            break
    return tuple(found)


CLAMP_LABEL = "murmur3-fp64: r = 2**53 - 1 (u clamped below 1) loses a bonus token"
ZERO_LABEL = "murmur3-fp64: r = 0 (u = 2**-54, the smallest noise) wins a bonus token"


def _register():
    clamp, zero = EDGE_KEYS["clamp"], EDGE_KEYS["zero"]
    return register(StreamFamily(
        name="murmur3-fp64",
        section="3b",
        acceptance=MURMUR3.acceptance,
        noise=resample_noise,
        floor=MURMUR3.floor,
        edges=StreamEdges(zero_uniform=MURMUR3.edges.zero_uniform, tiny_noise=clamp[0], top_noise=zero[0],
                          plants=(NoisePlant("loses", CLAMP_LABEL, clamp), NoisePlant("wins", ZERO_LABEL, zero)),
                          pos_period=2**32),
        triton="murmur3_fp64",
        triton_check="rs_verify.triton_sampler.murmur3:check_fp64_matches_contract",
        block_seeds=BLOCK_SEEDS,
        doc="murmur3's acceptance uniforms, float64 noise from two MurmurHash3 hashes (vLLM's use_fp64).",
    ))


MURMUR3_FP64 = _register()
