"""Scalar strategies and helpers: seeds, positions, vocab sizes, temperatures.

Imports only NumPy and Hypothesis.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from .knobs import INT64_MAX, check_int, check_ints

# Small sizes and sizes straddling power-of-two block edges; larger ones come
# from a separate, rarer branch (see `vocab_sizes`).
DEFAULT_VOCAB_SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
LARGE_VOCAB_MIN = 255
# Vocabulary block sizes of blocked samplers (Triton kernels reduce the vocabulary in
# power-of-two tiles; 1024 is the built-in sampler's default): `block_edge_vocab_sizes`
# draws sizes around their multiples (those below `max_vocab`).
DEFAULT_BLOCK_SIZES = (16, 32, 64, 128, 1024)
TINY_VOCAB_SIZES = (2, 3, 5, 1)

TEMPERATURE_KINDS = ("greedy", "one", "random", "mixed")
MIN_RANDOM_TEMPERATURE = 0.05
MAX_RANDOM_TEMPERATURE = 4.0

SPECIAL_SEEDS = (0, -1, 1, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32, 2**63 - 1, -(2**63))
POSITION_EDGES = (2**31, 2**32, INT64_MAX)


def seeds() -> st.SearchStrategy[int]:
    """Seeds across the whole int64 range, biased to the 32/64-bit edges; shrinks to 0."""
    return st.one_of(st.sampled_from(SPECIAL_SEEDS), st.integers(-(2**63), INT64_MAX))


def positions() -> st.SearchStrategy[int]:
    """Positions in `[0, 2**63 - 1]`: small ones, ones within 8 of 2**31, 2**32 and
    2**63 - 1, and uniform ones; shrinks to 0."""
    near_edge = st.builds(
        lambda edge, d: min(max(edge + d, 0), INT64_MAX),
        st.sampled_from(POSITION_EDGES),
        st.integers(-8, 8),
    )
    return st.one_of(st.integers(0, 4096), near_edge, st.integers(0, INT64_MAX))


def vocab_sizes(max_vocab: int = 1025) -> st.SearchStrategy[int]:
    """The default vocab sizes: 1, tiny sizes and block-edge sizes (15/16/17 ... 127/128/129)
    up to `max_vocab`, plus, one draw in eight, a size in `[255, max_vocab]`; shrinks to 1."""
    check_int("max_vocab", max_vocab, 1)
    small = [v for v in DEFAULT_VOCAB_SIZES if v <= max_vocab]
    if max_vocab < LARGE_VOCAB_MIN:
        return st.sampled_from(small)

    @st.composite
    def _vocab(draw):
        if draw(st.integers(0, 7)) == 7:
            return draw(st.integers(LARGE_VOCAB_MIN, max_vocab))
        return draw(st.sampled_from(small))

    return _vocab()


def block_edge_vocab_sizes(max_vocab: int = 1025, block_sizes=DEFAULT_BLOCK_SIZES) -> st.SearchStrategy[int]:
    """Vocab sizes that make blocked reductions cross blocks and end in partial tiles.

    Six draws in eight: `V = m * B + delta` for a block size `B < max_vocab` from
    `block_sizes`, `m` in `[1, 3]` (a bit above a block: few tiles, cheap under an
    interpreter) and `delta` one of `+1`, a random partial tail in `[1, B - 1]`,
    `-1` and `0` (whole tiles). One draw in eight each: a tiny size (2, 3, 5, 1) or
    any size in `[2, max_vocab]`. Sizes never exceed `max_vocab`; shrinks to 2.

    * `max_vocab`: the largest size drawn.
    * `block_sizes`: block sizes (ints >= 1) whose multiples the sizes straddle.
    """
    check_int("max_vocab", max_vocab, 1)
    blocks = tuple(b for b in check_ints("block_sizes", block_sizes, 1) if b < max_vocab)
    tiny = [v for v in TINY_VOCAB_SIZES if v <= max_vocab]

    @st.composite
    def _vocab(draw):
        kind = draw(st.integers(0, 7))
        if kind == 0 or (not blocks and kind < 7):
            return draw(st.sampled_from(tiny))
        if kind == 7:
            return draw(st.integers(min(2, max_vocab), max_vocab))
        b = draw(st.sampled_from(blocks))
        m = draw(st.integers(1, max(1, min(3, max_vocab // b))))
        tail = draw(st.integers(0, 3))
        delta = draw(st.integers(1, b - 1)) if tail == 1 and b > 1 else (1, 1, -1, 0)[tail]
        return int(min(max(m * b + delta, 1), max_vocab))

    return _vocab()


# -- temperatures (content helpers, NumPy only) ------------------------------------


def garbage_temperatures(rng, S) -> np.ndarray:
    """Arbitrary finite float32 temperatures, for states no request references."""
    pool = np.array([0.0, 1.0, -1.0, 1e-30, 1e30, -3e38, 3e38, 0.5], np.float32)
    t = np.where(rng.random(S) < 0.5, rng.choice(pool, S), rng.uniform(-10.0, 10.0, S))
    return t.astype(np.float32)


def temperature_kinds(rng, kind, R) -> list[str]:
    """Per-request kinds for a batch-level `kind` ("mixed": each request its own, not all equal)."""
    if kind != "mixed":
        return [kind] * R
    kinds = list(rng.choice(["greedy", "one", "random"], R))
    if R >= 2 and len(set(kinds)) == 1:
        kinds[int(rng.integers(R))] = "random" if kinds[0] != "random" else "greedy"
    return [str(k) for k in kinds]


def temperature(rng, kind) -> np.float32:
    """T for a kind: 0 (greedy), exactly 1 (one), log-uniform in [0.05, 4] (random)."""
    if kind == "greedy":
        return np.float32(0.0)
    if kind == "one":
        return np.float32(1.0)
    lo, hi = np.log(MIN_RANDOM_TEMPERATURE), np.log(MAX_RANDOM_TEMPERATURE)
    return np.float32(np.exp(rng.uniform(lo, hi)))
