"""Philox-4x32-10 in NumPy, bit for bit Triton's `tl.randint` / `tl.rand` (SPEC section 3).

Triton (`triton/language/random.py`) draws `randint(seed, offset)` as the first
output word of Philox-4x32 with 10 rounds, key `(seed_lo, seed_hi)` and counter
`(offset_lo, offset_hi, 0, 0)`; `rand` maps that int32 word `w` to float32
`(w < 0 ? ~w : w) * 4.6566127342e-10` (int32 -> float32 conversion, then an
fp32 multiply).

Widening rules (what a Triton kernel does with the value it holds):

- seed: an int64 (a Python int, `np.int64`, an int64 array) gives
  `seed_lo, seed_hi` = its low and high 32 bits (two's complement); an int32
  (`np.int32` or an int32 array: the resample seed `g = randint(...)`) is
  widened WITHOUT sign extension: `seed_lo` = its 32 bits, `seed_hi = 0`, also
  when negative. uint32 / uint64 are taken as bit patterns the same way.
- offset: int64 gives `offset_lo, offset_hi` = low and high 32 bits; int32
  gives `offset_lo` = its 32 bits and `offset_hi = 0` (even when negative).
  Python ints and lists become int64.

`seed` broadcasts against `offsets` (a per-row seed array against per-row
offsets, or `seeds[:, None]` against `np.arange(V, dtype=np.int32)[None, :]`).
The work is done in blocks of about `BLOCK` elements in per-thread uint64
scratch buffers, with the state stacked so that a round is five in-place
ufunc calls (about 20 ns per draw on one core).
"""

from __future__ import annotations

import math

import numpy as np

from .scratch import Scratch

__all__ = ["TINY", "SCALE", "rand", "randint", "rand_from_int", "philox_keys", "philox_counters"]

PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
N_ROUNDS = 10

#: Triton's int32 -> uniform scale, as the float32 constant the kernel multiplies by.
SCALE = np.float32(4.6566127342e-10)
#: The floor of every uniform in SPEC section 3 (`max(rand, TINY)`).
TINY = np.float32(4.6566127342e-10)

BLOCK = 1 << 14  # elements per block: keeps the six uint64 buffers in L2

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_A = np.uint64(PHILOX_ROUND_A)
_B = np.uint64(PHILOX_ROUND_B)

_SEED_DTYPES_32 = (np.dtype(np.int32), np.dtype(np.uint32))
_SEED_DTYPES_64 = (np.dtype(np.int64), np.dtype(np.uint64))


def philox_keys(seed) -> tuple[np.ndarray, np.ndarray]:
    """`(seed_lo, seed_hi)` as uint64 arrays (values < 2**32) of `seed`'s shape (widening rules above)."""
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("seed must be an integer, not a bool")
    if isinstance(seed, int):
        if not -(2**63) <= seed < 2**64:
            raise OverflowError(f"seed {seed} does not fit in 64 bits")
        seed = np.int64(seed) if seed < 2**63 else np.uint64(seed)
    a = np.asarray(seed)
    if a.dtype in _SEED_DTYPES_32:
        lo = a.view(np.uint32).astype(np.uint64)
        return lo, np.zeros_like(lo)
    if a.dtype in _SEED_DTYPES_64:
        bits = a.view(np.uint64)
        return bits & _M32, bits >> _S32
    raise TypeError(f"seed must be int32, uint32, int64 or uint64, got {a.dtype}")


def philox_counters(offsets) -> tuple[np.ndarray, np.ndarray | None]:
    """`(offset_lo, offset_hi)` as uint64 arrays; `offset_hi` is None when it is 0 (32-bit offsets)."""
    a = np.asarray(offsets)
    if a.dtype == np.bool_ or a.dtype.kind not in "iu":
        raise TypeError(f"offsets must be an integer array, got {a.dtype}")
    if a.dtype.itemsize == 4:
        return a.view(np.uint32).astype(np.uint64), None
    if a.dtype.itemsize == 8:
        bits = a.view(np.uint64)
        return bits & _M32, bits >> _S32
    raise TypeError(f"offsets must be 32- or 64-bit integers, got {a.dtype}")


def _round_keys(k0: np.ndarray, k1: np.ndarray, ndim: int) -> np.ndarray:
    """The key of every round, stacked: `keys[r] = [k0 + r * A, k1 + r * B] mod 2**32`.

    Shape `(N_ROUNDS, 2) + key shape`, the key shape padded with leading
    size-1 axes to `ndim` dimensions so that it broadcasts against a block.
    """
    shape = np.broadcast_shapes(np.shape(k0), np.shape(k1))
    shape = (1,) * (ndim - len(shape)) + shape
    base = np.stack([np.broadcast_to(k0, shape), np.broadcast_to(k1, shape)])
    inc = _KEY_INC.reshape((N_ROUNDS, 2) + (1,) * ndim)
    keys = base[None] + inc
    keys &= _M32
    return keys


_KEY_INC = np.array(
    [[(r * PHILOX_KEY_A) & 0xFFFFFFFF, (r * PHILOX_KEY_B) & 0xFFFFFFFF] for r in range(N_ROUNDS)], dtype=np.uint64
)


_WORD = Scratch("philox: first output word of a block")
_STATE = tuple(Scratch(f"philox: stacked round state {n}") for n in "XLP")


def _work_buffers(block: tuple) -> tuple[np.ndarray, ...]:
    """`word [block]` and `X, L, P [(2,) + block]` uint64 scratch arrays (reused across calls)."""
    word = _WORD(block, np.uint64)
    X, L, P = (s((2,) + block, np.uint64) for s in _STATE)
    return word, X, L, P


def _block(out_word, keys, c0_in, c1_in, X, L, P, C):
    """Ten Philox rounds on one block; writes the first output word into `out_word` (uint64).

    The state is stacked: `X = [c0, c2]`, `L = [c1, c3]` (shape `(2,) + block`),
    so each round is five ufunc calls: `P = [B * c2, A * c0]`, `X = hi(P) ^ L ^ key`,
    `L = lo(P)`. Counters enter as `(c0_in, c1_in, 0, 0)`: round 1 is
    specialized for `c2 = c3 = 0`, and the last round computes `c0` only.
    """
    # Round 1: c0' = c1 ^ k0; c2' = hi(A * c0) ^ k1; c1' = lo(B * 0) = 0; c3' = lo(A * c0).
    np.multiply(c0_in, _A, out=P[1])
    np.right_shift(P[1], _S32, out=X[1])
    X[1] ^= keys[0][1]
    if c1_in is None:
        np.copyto(X[0], keys[0][0])
    else:
        np.bitwise_xor(c1_in, keys[0][0], out=X[0])
    L[0].fill(0)
    np.bitwise_and(P[1], _M32, out=L[1])
    Xr = X[::-1]  # [c2, c0], to multiply by C = [B, A]
    for r in range(1, N_ROUNDS - 1):
        np.multiply(Xr, C, out=P)
        np.right_shift(P, _S32, out=X)
        X ^= L
        X ^= keys[r]
        np.bitwise_and(P, _M32, out=L)
    # Last round: c0 = hi(B * c2) ^ c1 ^ k0.
    np.multiply(X[1], _B, out=P[0])
    np.right_shift(P[0], _S32, out=out_word)
    out_word ^= L[0]
    out_word ^= keys[N_ROUNDS - 1][0]
    return out_word


def _slice_rows(a, i0, i1, ndim, axis=0):
    """Rows `[i0, i1)` along `axis` of `a` broadcast to `ndim` dims (a size-1 axis broadcasts)."""
    if not isinstance(a, np.ndarray) or a.ndim == 0:
        return a
    if a.ndim < ndim:
        a = a.reshape((1,) * (ndim - a.ndim) + a.shape)
    if a.shape[axis] == 1:
        return a
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(i0, i1)
    return a[tuple(idx)]


def _philox_word(seed, offsets, out=None) -> np.ndarray:
    """The first Philox output word for every element of `broadcast(seed, offsets)`, as uint32.

    `out`: an optional 4-byte array of the broadcast shape to write the words into (viewed as uint32).
    """
    k0, k1 = philox_keys(seed)
    c0, c1 = philox_counters(offsets)
    shape = np.broadcast_shapes(k0.shape, c0.shape)
    if len(shape) > 2:  # rare: flatten everything
        flat = [np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(-1) for a in (k0, k1, c0)]
        c1 = None if c1 is None else np.ascontiguousarray(np.broadcast_to(c1, shape)).reshape(-1)
        words = _philox_word_2d(*flat, c1, (flat[0].shape[0],), None).reshape(shape)
        if out is None:
            return words
        np.copyto(out.view(np.uint32), words)
        return out.view(np.uint32)
    return _philox_word_2d(k0, k1, c0, c1, shape, out)


def _philox_word_2d(k0, k1, c0, c1, shape, out) -> np.ndarray:
    if out is None:
        out = np.empty(shape, np.uint32)
    else:
        if out.shape != tuple(shape) or out.dtype.itemsize != 4 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous 4-byte array of shape {tuple(shape)}")
        out = out.view(np.uint32)
    if out.size == 0:
        return out
    ndim = max(1, len(shape))
    shape_n = (1,) * (ndim - len(shape)) + tuple(shape)
    out_n = out.reshape(shape_n)
    keys = _round_keys(k0, k1, ndim)
    inner = math.prod(shape_n[1:])
    rows = max(1, BLOCK // max(inner, 1))
    block = (min(rows, shape_n[0]),) + shape_n[1:]
    word, X, L, P = _work_buffers(block)
    C = _ROUND_MUL.reshape((2,) + (1,) * ndim)
    for i0 in range(0, shape_n[0], rows):
        i1 = min(i0 + rows, shape_n[0])
        n = i1 - i0
        if n != word.shape[0]:
            word, X, L, P = word[:n], X[:, :n], L[:, :n], P[:, :n]
        b_keys = _slice_rows(keys, i0, i1, ndim + 2, axis=2)
        b_c0 = np.broadcast_to(_slice_rows(c0, i0, i1, ndim), word.shape)
        b_c1 = None if c1 is None else np.broadcast_to(_slice_rows(c1, i0, i1, ndim), word.shape)
        _block(word, b_keys, b_c0, b_c1, X, L, P, C)
        np.copyto(out_n[i0:i1], word, casting="unsafe")
    return out


_ROUND_MUL = np.array([PHILOX_ROUND_B, PHILOX_ROUND_A], dtype=np.uint64)


def randint(seed, offsets, *, out=None) -> np.ndarray:
    """`tl.randint(seed, offsets)`: int32 array of shape `broadcast(seed, offsets)` (written into `out` if given)."""
    return _philox_word(seed, offsets, out).view(np.int32)


_SIGN_MASK = Scratch("philox: w ^ (w >> 31) of rand_from_int")


def rand_from_int(w: np.ndarray, *, out=None) -> np.ndarray:
    """Triton's int32 -> float32 uniform map: `(w < 0 ? ~w : w) * 4.6566127342e-10` in float32.

    `out` may be `w`'s own memory viewed as float32 (the conversion is done in place then).
    """
    w = np.asarray(w)
    if w.dtype != np.int32:
        raise TypeError(f"expected int32 words, got {w.dtype}")
    if out is None:
        out = np.empty(w.shape, np.float32)
    # w ^ (w >> 31) is ~w for negative w and w otherwise.
    m = _SIGN_MASK(w.shape, np.int32)
    np.right_shift(w, 31, out=m)
    m ^= w
    np.multiply(m, SCALE, out=out, dtype=np.float32)  # int32 -> float32 (round to nearest), then fp32 multiply
    return out


def rand(seed, offsets, *, out=None) -> np.ndarray:
    """`tl.rand(seed, offsets)`: float32 in [0, 1) of shape `broadcast(seed, offsets)` (written into `out` if given)."""
    shape = np.broadcast_shapes(np.shape(seed), np.shape(offsets))
    if out is None:
        out = np.empty(shape, np.float32)
    words = _philox_word(seed, offsets, out).view(np.int32)  # the words share out's memory
    return rand_from_int(words, out=out)
