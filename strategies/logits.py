"""Logits contents (NumPy only): patterns, dtype rounding, magnitude bounds, `-inf` masks.

`magnitude_bound` is the one limit every drawn raw logit of a request keeps (its patterns, edges and
tilts clip to it); with a sampler's `logit_bound` (SPEC section 10) it also keeps the processed
logit `|fp32(x) / T|` within the bound, dtype rounding included (`rs_verify.contract.logit_bound`),
and `clip_to_bounds` brings what an edge planted beyond it (a one-hot row's gap, unrelated draft
rows) back within it. `-inf` is never touched: masked logits are drawn whatever the bound.

Imports only NumPy and the batch contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.logit_bound import raw_limit

PATTERNS = ("random", "peaked", "flat", "tied", "one-hot", "extreme")

FLOAT32_MAX = float(np.finfo(np.float32).max)
BFLOAT16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))
DTYPE_MAX = {"float32": FLOAT32_MAX, "bfloat16": BFLOAT16_MAX, "float16": 65504.0}
ONE_HOT_GAP = 1e4  # exp(-1e4 / 4) underflows even float64: a one-hot row without -inf


def round_to_dtype(x, dtype: str) -> np.ndarray:
    """float32 `x` rounded (to nearest even) to values exactly representable in `dtype`.

    Finite values are first clipped to the dtype's largest finite value, so
    nothing becomes infinite; `-inf` stays `-inf`. NaN is not supported.
    """
    x = np.array(x, dtype=np.float32)
    if dtype == "float32":
        return x
    m = np.float32(DTYPE_MAX[dtype])
    finite = np.isfinite(x)
    x[finite] = np.clip(x[finite], -m, m)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        raise ValueError(f"unknown dtype {dtype!r}")
    b = x.view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def magnitude_bound(dtype: str, temperature: float, logit_bound: float | None = None) -> float:
    """The largest raw logit magnitude allowed for a state: the dtype's largest finite value,
    and, when `0 < T < 1`, half of what `T` can divide without overflowing float32 (SPEC 9).
    With a `logit_bound` (SPEC 10), the largest value of `dtype` whose processed logit is within
    it as well: a value of `dtype`, so clipping to it, then rounding, stays within it."""
    m = DTYPE_MAX[dtype]
    t = float(temperature)
    small = not (t == 0 or t >= 1)
    if logit_bound is None:
        return min(m, FLOAT32_MAX * t * 0.5) if small else m
    return raw_limit(dtype, t, min(float(logit_bound), FLOAT32_MAX * 0.5) if small else float(logit_bound))


def clip_to_bounds(target, draft, cu, idx, bounds) -> None:
    """Clip the finite raw logits of each request `r` (its target rows, its state's draft rows) to
    `bounds[r]` (in place; `-inf` kept): what an edge planted beyond a declared `logit_bound`."""
    for r in range(len(cu) - 1):
        b = np.float32(bounds[r])
        rows = [target[cu[r] : cu[r + 1]]] + ([draft[idx[r]]] if draft is not None else [])
        for x in rows:
            finite = np.isfinite(x)
            x[finite] = np.clip(x[finite], -b, b)


def logits_rows(
    rng: np.random.Generator,
    n: int,
    vocab: int,
    pattern: str,
    *,
    dtype: str = "float32",
    v_eff: int | None = None,
    max_abs: float | None = None,
    allow_inf: bool = False,
) -> np.ndarray:
    """`n` float32 logits rows over `vocab` tokens in `pattern`, representable in `dtype`.

    Patterns: "random" (Gaussian, random scale), "peaked" (one dominant logit),
    "flat" (all equal), "tied" (2-4 exactly equal maxima), "one-hot" (one finite
    logit and the rest `-inf` when `allow_inf`, else `ONE_HOT_GAP` below),
    "extreme" (magnitudes up to `max_abs`, default the dtype's limit). Peaks,
    ties and hot tokens lie in `[0, v_eff)` (default `vocab`). Finite values are
    clipped to `max_abs`.
    """
    v_eff = vocab if v_eff is None else v_eff
    bound = DTYPE_MAX[dtype] if max_abs is None else float(max_abs)
    shape = (n, vocab)
    if pattern == "random":
        x = rng.standard_normal(shape) * rng.choice([1.0, 4.0, 16.0])
    elif pattern == "peaked":
        x = rng.standard_normal(shape)
        x[np.arange(n), rng.integers(0, v_eff, n)] += rng.uniform(8.0, 30.0, n)
    elif pattern == "flat":
        x = np.repeat(np.round(rng.uniform(-8.0, 8.0, (n, 1)), 1), vocab, axis=1)
    elif pattern == "tied":
        x = rng.standard_normal(shape) * 2.0
        m = min(v_eff, int(rng.integers(2, 5)))
        if m >= 2:
            top = x.max(axis=1) + 1.0
            for row in range(n):
                x[row, rng.choice(v_eff, m, replace=False)] = top[row]
    elif pattern == "one-hot":
        hot_val = rng.standard_normal(n)
        x = np.repeat((hot_val - ONE_HOT_GAP)[:, None], vocab, axis=1)
        if allow_inf:
            x[:] = -np.inf
        x[np.arange(n), rng.integers(0, v_eff, n)] = hot_val
    elif pattern == "extreme":
        big = rng.uniform(-1.0, 1.0, shape) * bound
        x = np.where(rng.random(shape) < 0.5, big, rng.standard_normal(shape))
        if vocab:
            x[np.arange(n), rng.integers(0, vocab, n)] = bound * rng.choice([-1.0, 1.0], n)
    else:
        raise ValueError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
    x = x.astype(np.float32)
    finite = np.isfinite(x)
    x[finite] = np.clip(x[finite], -bound, bound)
    return round_to_dtype(x, dtype)


def mask_rows(rng: np.random.Generator, x: np.ndarray, v_eff: int, protect=None) -> np.ndarray:
    """Set random entries of about half the rows of `x` to `-inf` (in place), never the
    maxima over `[0, v_eff)` nor entries where `protect` holds: every row keeps a
    finite logit in `[0, v_eff)`, and its argmax and ties are kept."""
    n, vocab = x.shape
    if n == 0 or vocab == 0:
        return x
    head = x[:, :v_eff]
    keep = np.zeros(x.shape, bool)
    keep[:, :v_eff] = head == head.max(axis=1, keepdims=True)
    if protect is not None:
        keep |= protect
    frac = rng.uniform(0.05, 1.0, (n, 1)) * (rng.random((n, 1)) < 0.5)
    x[(rng.random(x.shape) < frac) & ~keep] = -np.inf
    return x



def softmax_head(row, v_eff) -> np.ndarray:
    """Float64 softmax of a raw logits row over `[0, v_eff)`."""
    z = row[:v_eff].astype(np.float64)
    z = np.exp(z - z.max())
    return z / z.sum()


def shift_rows(x: np.ndarray, offsets, dtype: str, bound: float) -> np.ndarray:
    """`x + offsets[:, None]` (finite entries only), clipped to `bound` and rounded to `dtype`.

    A common offset leaves the softmax unchanged but scales the absolute rounding
    error of every logit: real logits are rarely centred on 0.
    """
    x = np.array(x, dtype=np.float64)
    finite = np.isfinite(x)
    x[finite] = np.clip((x + np.asarray(offsets, np.float64).reshape(-1, 1))[finite], -bound, bound)
    return round_to_dtype(x.astype(np.float32), dtype)
