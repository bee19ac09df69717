"""SPEC section 10's `logit_bound`: the largest `|z|` of a finite processed logit a sampler claims
the contract for (section 2: `z = fp32(x) / T`, untouched for `T` in {0, 1}; target rows and the
draft rows of the states the batch references alike; `-inf` is masked and never counts).

The one place that turns a declared bound into raw-logit limits:

- `checked(value)`: the declaration as a float (or None, every finite float32), `ValueError` otherwise;
- `raw_limit(dtype, T, bound)`: the largest raw magnitude representable in `dtype` whose processed
  value stays within `bound` (the float32 division rounds to nearest, so `bound * T` alone may
  round past it): the strategies draw within it (`strategies.logits.magnitude_bound`);
- `beyond(batch, bound)`: the first finite processed logit past the bound, described, or None;
- `clamped(batch, bound)`: the batch with every such logit moved to the limit (a fixed campaign's
  batch, `SamplerRecord.fit`).

Imports NumPy and the batch contract only.
"""

from __future__ import annotations

import math

import numpy as np

from .batch import SpecBatch
from .probs import process

FLOAT32_MAX = float(np.finfo(np.float32).max)
_DTYPE_MAX = {"float32": FLOAT32_MAX, "bfloat16": float(np.array(0x7F7F0000, np.uint32).view(np.float32)),
              "float16": 65504.0}


def checked(value, who: str = "logit_bound") -> float | None:
    """The declared bound as a float, None for None; `ValueError` unless a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{who} must be a positive finite number or None, not {value!r}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{who} must be a positive finite number or None, not {value!r}")
    return v


def _step_down(v: float, dtype: str) -> float:
    """The next value of `dtype` below `v > 0` (towards 0)."""
    if dtype == "float16":
        return float(np.nextafter(np.float16(v), np.float16(0)))
    if dtype == "bfloat16":
        return float((np.array(v, np.float32).view(np.uint32) - np.uint32(0x10000)).view(np.float32))
    return float(np.nextafter(np.float32(v), np.float32(0)))


def _step_up(v: float, dtype: str) -> float:
    """The next value of `dtype` above `v >= 0` (inf past its largest)."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return float(np.nextafter(np.float16(v), np.float16(np.inf)))
    if dtype == "bfloat16":
        return float((np.array(v, np.float32).view(np.uint32) + np.uint32(0x10000)).view(np.float32))
    return float(np.nextafter(np.float32(v), np.float32(np.inf)))


def _round_down(x: float, dtype: str) -> float:
    """The largest value of `dtype` at or below `0 <= x <= dtype max`."""
    if dtype == "bfloat16":
        f = np.float32(x)
        if float(f) > x:
            f = np.nextafter(f, np.float32(0))
        return float((np.array(f, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))
    v = float(np.float16(x)) if dtype == "float16" else float(np.float32(x))
    return _step_down(v, dtype) if v > x else v


def raw_limit(dtype: str, temperature, bound: float) -> float:
    """The largest raw magnitude `x`, representable in `dtype` (at most its largest finite value),
    with `|fp32(x) / T| <= bound` in float32 arithmetic (`|x| <= bound` for `T` in {0, 1})."""
    t = np.float32(temperature)
    keep = t == 0 or t == 1
    want = bound if keep else bound * float(t)
    v = _round_down(min(want, _DTYPE_MAX[dtype]), dtype)
    if keep:
        return v

    def within(x: float) -> bool:
        return x <= _DTYPE_MAX[dtype] and float(np.float32(x) / t) <= bound

    while v > 0 and not within(v):
        v = _step_down(v, dtype)
    while within(_step_up(v, dtype)):  # the division rounds: `bound * T` may sit below the last value within
        v = _step_up(v, dtype)
    return v


def _rows(batch: SpecBatch):
    """`(request, what, raw rows, state, T)` for every request: its target rows and its state's draft rows
    (a tree batch: its nodes' `node_draft_logits` rows, SPEC 4c)."""
    cu = np.asarray(batch.cu_num_logits, np.int64)
    idx = np.asarray(batch.idx_mapping, np.int64)
    temps = np.asarray(batch.temperature, np.float32)
    for r in range(batch.num_reqs):
        s = int(idx[r])
        yield r, "target", slice(int(cu[r]), int(cu[r + 1])), s, temps[s]
        if batch.draft_logits is not None:
            yield r, "draft", s, s, temps[s]
        if getattr(batch, "node_draft_logits", None) is not None:
            yield r, "node_draft", slice(int(cu[r]), int(cu[r + 1])), s, temps[s]


def beyond(batch: SpecBatch, bound: float | None) -> str | None:
    """The first finite processed logit of `batch` with `|z| > bound`, described, or None."""
    if bound is None:
        return None
    for r, what, sel, s, t in _rows(batch):
        x = np.asarray(getattr(batch, f"{what}_logits"))[sel]
        with np.errstate(over="ignore"):
            z = process(x, t)
        over = np.isfinite(z) & (np.abs(z) > bound)
        if over.any():
            at = tuple(int(i) for i in np.argwhere(over)[0])
            where = (f"draft_logits[{s}, {at[0]}]" if what == "draft" else
                     f"{what.replace('_', ' ')} row {sel.start + at[0]}")
            return (f"request {r}: {where}, token {at[1]}: processed logit {float(z[at]):.6g} "
                    f"(raw {float(x[at]):.6g}, T = {float(t):g}) beyond logit_bound {bound:g}")
    return None


def clamped(batch: SpecBatch, bound: float | None) -> SpecBatch:
    """`batch` with every finite raw logit whose processed value passes `bound` moved to
    `raw_limit` (its sign kept); the batch itself when none does."""
    if bound is None or beyond(batch, bound) is None:
        return batch
    target = np.array(batch.target_logits, np.float32)
    draft = None if batch.draft_logits is None else np.array(batch.draft_logits, np.float32)
    nodes = None if getattr(batch, "node_draft_logits", None) is None else np.array(batch.node_draft_logits, np.float32)
    for _, what, sel, _, t in _rows(batch):
        arr = {"target": target, "draft": draft, "node_draft": nodes}[what]
        limit = np.float32(raw_limit(batch.logits_dtype, t, bound))
        x = arr[sel]
        arr[sel] = np.where(np.isfinite(x), np.clip(x, -limit, limit), x)
    extra = {} if nodes is None else {"node_draft_logits": nodes}
    return batch.replace(target_logits=target, draft_logits=draft, **extra)
