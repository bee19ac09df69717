"""SPEC 3b: the NumPy MurmurHash3_x86_32 of `rs_verify.contract.murmur3` is the standard hash,
checked against an independent implementation (the `mmh3` package) on the keys the family
hashes, at the edges of every word: int64 seed edges and negative seeds, positions above
`2**32` (only their low word is hashed), large token ids."""

import struct

import numpy as np
import pytest

from rs_verify.contract import murmur3

mmh3 = pytest.importorskip("mmh3")

SEEDS = (0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 1234567890123, -987654321)
POSITIONS = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**62 + 3, 2**63 - 1)
TOKENS = (0, 1, 2, 151935, 152063, 2**20 + 7, 2**31 - 1)


def _oracle(seed: int, pos: int, token: int) -> int:
    """mmh3 over the 16-byte little-endian key `(seed_lo, seed_hi, pos_lo, token)`, hash seed 0."""
    s = seed & (2**64 - 1)
    key = struct.pack("<IIII", s & 0xFFFFFFFF, s >> 32, pos & 0xFFFFFFFF, token)
    return mmh3.hash(key, 0, signed=False)


def test_hash_is_murmur3_x86_32_on_edge_keys():
    grid = np.array([(s, p, t) for s in SEEDS for p in POSITIONS for t in TOKENS], dtype=object)
    seeds = np.array([int(g) for g in grid[:, 0]], np.int64)
    pos = np.array([int(g) for g in grid[:, 1]], np.int64)
    tok = np.array([int(g) for g in grid[:, 2]], np.int64)
    got = murmur3.hash_words(*murmur3.key_words(seeds, pos, tok))
    want = np.array([_oracle(int(s), int(p), int(t)) for s, p, t in grid], np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} keys differ, first (seed, pos, token) = {tuple(grid[bad[0]])}"


def test_hash_broadcasts_rows_against_a_vocabulary():
    rng = np.random.default_rng(20261202)
    seeds = rng.integers(-(2**63), 2**63 - 1, size=5, dtype=np.int64)
    pos = rng.integers(0, 2**40, size=5, dtype=np.int64)
    vocab = np.arange(1000, dtype=np.int64)
    grid = murmur3.hash_words(*murmur3.key_words(seeds[:, None], pos[:, None], vocab[None, :]))
    assert grid.shape == (5, 1000)
    for r in range(5):
        for x in (0, 1, 499, 999):
            assert grid[r, x] == _oracle(int(seeds[r]), int(pos[r]), x)


def test_positions_share_their_low_word():
    """Positions `p` and `p + 2**32` hash alike (SPEC 3b: part of the family, not a defect)."""
    a = murmur3.hash_words(*murmur3.key_words(7, np.int64(12), np.arange(64)))
    b = murmur3.hash_words(*murmur3.key_words(7, np.int64(12 + 2**32), np.arange(64)))
    np.testing.assert_array_equal(a, b)


def test_uniform_from_hash_edges():
    h = np.array([0, 0xFFFF, 0x10000, 2**32 - 129, 2**32 - 128, 2**32 - 1], np.uint32)
    u = murmur3.uniform_from_hash(h)
    assert u.dtype == np.float32
    assert u[0] == np.float32(2.0**-33)  # the smallest uniform
    assert u[1] == np.float32(0xFFFF * 2.0**-32 + 2.0**-33)  # exact below 2**-16
    assert u[3] < 1.0 and u[4] == 1.0 and u[5] == 1.0  # the 128 largest hashes give exactly 1.0
    every = np.arange(2**32 - 256, 2**32, dtype=np.uint64).astype(np.uint32)
    assert int((murmur3.uniform_from_hash(every) == 1.0).sum()) == 128
    # Against the formula in float64, rounded once to float32.
    hs = np.random.default_rng(3).integers(0, 2**32, size=4096, dtype=np.uint64)
    exact = (hs >> 16).astype(np.float64) * 2.0**-16 + ((hs & 0xFFFF).astype(np.float64) + 0.5) * 2.0**-32
    np.testing.assert_array_equal(murmur3.uniform_from_hash(hs.astype(np.uint32)), exact.astype(np.float32))


def test_noise_is_finite_at_both_ends():
    u = np.array([2.0**-33, 1e-7, 0.5, 1.0 - 2.0**-24, 1.0], np.float32)
    g = murmur3.noise_from_uniform(u)
    assert np.isfinite(g).all()
    assert g[-1] == -np.log(24 * np.log(2.0))
    assert g[-2] == g[-1]  # 1 - u = 2**-24 exactly: the floor and the value agree
    # Accurate for small u: -log(-log1p(-u)) ~ -log(u), not the float32 rounding of 1 - u.
    assert abs(g[0] - (-np.log(2.0**-33))) < 1e-9
    assert np.all(np.diff(g[:-1]) < 0)  # decreasing in u (the noise of 1 - u) above the floor


@pytest.mark.parametrize("target", [0, 1, 2**32 - 128, 2**32 - 1, 0xDEADBEEF])
def test_seed_for_hash_plants_the_target(target):
    """The strategies plant u = 1.0 and the smallest u on a drawn token by choosing the seed's low
    word: the planted key hashes to the target (checked against mmh3)."""
    for seed_hi, pos, token in ((0, 0, 0), (0xFFFFFFFF, 2**32 + 3, 151935), (7, 2**40, 12)):
        seed = murmur3.seed_for_hash(target, seed_hi, pos, token)
        assert -(2**63) <= seed < 2**63 and (seed >> 32) & 0xFFFFFFFF == seed_hi
        assert _oracle(seed, pos, token) == target
