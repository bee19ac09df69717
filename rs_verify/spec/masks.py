"""The sampling-parameter masks of SPEC section 2, in float64, with the margin of every decision.

For a row of a stochastic state with processed logits `z` (float32, over `[0, V')`):

1. `min_p = m > 0`: with `M = max z`, keep `z_x >= M + log m` (mask `z_x < M + log m`);
   margin `z_x - (M + log m)`.
2. `top_k = k`, `0 < k < V'`: `t` = the `k`-th largest entry of the row left by 1 (duplicates
   counted, `-inf` when fewer than `k` are finite); keep `z_x >= t`; margin `z_x - t` (a tie,
   margin 0, is kept).
3. `top_p = c < 1`: on `softmax` of the row left by 1 and 2, tokens ordered by descending
   probability, ties by ascending token id; keep `x` iff the mass of the tokens before it is
   `< c`; margin `c - mass before x`.

Greedy states (`T == 0`) and parameters that are off mask nothing. Every decision's margin is
reported with its tolerance scale `L` (SPEC section 8): min-p `max(1, |M|, |log m|)` (the float32
error of the threshold `M + log m`), top-k `max(1, |t|)`, top-p `1` (a probability).

Imports only NumPy and the batch contract. The reference, the properties and the strategies'
labels use this one implementation; production samplers implement their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import SpecBatch

__all__ = ["MaskResult", "RowParams", "apply_masks", "batch_masks", "row_params"]


@dataclass(frozen=True)
class RowParams:
    """Per row: `min_p` (float64, 0 off), `top_k` (int64, 0 off), `top_p` (float64, 1 off), and
    whether the row belongs to a stochastic state (greedy rows are never masked)."""

    min_p: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    stochastic: np.ndarray

    @property
    def any(self) -> np.ndarray:
        """Rows where some parameter is on."""
        return self.stochastic & ((self.min_p > 0) | (self.top_k > 0) | (self.top_p < 1))


@dataclass(frozen=True)
class MaskResult:
    """The masks of a block of rows over `[0, V')`.

    - `kept`: bool `[rows, V']`, the tokens left by all three parameters.
    - `min_p_margin`, `top_k_margin`, `top_p_margin`: float64 `[rows, V']`, each decision's
      margin (positive: kept), NaN where that parameter made no decision (off, greedy row, or the
      token was masked by an earlier parameter).
    - `min_p_scale`, `top_k_scale`: float64 `[rows]`, the tolerance scale `L` of those decisions
      (top-p's is 1).
    - `min_p_threshold` (`M + log m`), `top_k_threshold` (`t`): float64 `[rows]`, NaN when off.
    """

    kept: np.ndarray
    min_p_margin: np.ndarray
    top_k_margin: np.ndarray
    top_p_margin: np.ndarray
    min_p_scale: np.ndarray
    top_k_scale: np.ndarray
    min_p_threshold: np.ndarray
    top_k_threshold: np.ndarray

    def margins(self) -> tuple[tuple[str, np.ndarray, np.ndarray], ...]:
        """`(parameter, margins [rows, V'], scales [rows, V'])` for the three parameters."""
        ones = np.ones_like(self.top_p_margin)
        return (("min_p", self.min_p_margin, np.broadcast_to(self.min_p_scale[:, None], ones.shape)),
                ("top_k", self.top_k_margin, np.broadcast_to(self.top_k_scale[:, None], ones.shape)),
                ("top_p", self.top_p_margin, ones))


def row_params(batch: SpecBatch, rows: np.ndarray | None = None) -> RowParams:
    """The sampling parameters of every logits row (or of `rows`), looked up through its state."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    states = np.repeat(np.asarray(batch.idx_mapping, dtype=np.int64), np.diff(cu))
    if rows is not None:
        states = states[np.asarray(rows, dtype=np.int64)]
    n = states.shape[0]

    def per_row(name, off, dtype):
        a = getattr(batch, name)
        return np.full(n, off, dtype) if a is None else np.asarray(a)[states].astype(dtype)

    return RowParams(
        min_p=per_row("min_p", 0.0, np.float64),
        top_k=per_row("top_k", 0, np.int64),
        top_p=per_row("top_p", 1.0, np.float64),
        stochastic=np.asarray(batch.temperature)[states] > 0,
    )


def apply_masks(z: np.ndarray, params: RowParams) -> MaskResult:
    """The SPEC section 2 masks of processed logits `z` (float32 `[rows, V']`) under `params`."""
    z = np.asarray(z)
    rows, vp = z.shape
    z64 = z.astype(np.float64)
    nan = np.full((rows, vp), np.nan)
    kept = np.ones((rows, vp), bool)  # -inf tokens stay "kept": their p is 0 already
    out = dict(min_p_margin=nan.copy(), top_k_margin=nan.copy(), top_p_margin=nan.copy(),
               min_p_scale=np.ones(rows), top_k_scale=np.ones(rows),
               min_p_threshold=np.full(rows, np.nan), top_k_threshold=np.full(rows, np.nan))
    if rows == 0 or vp == 0:
        return MaskResult(kept=kept, **out)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # 1. min-p: keep z >= max z + log m.
        on = params.stochastic & (params.min_p > 0)
        if on.any():
            r = np.flatnonzero(on)
            top = z64[r].max(axis=1)
            log_m = np.log(params.min_p[r])
            thr = top + log_m
            margin = z64[r] - thr[:, None]
            out["min_p_margin"][r] = margin
            out["min_p_threshold"][r] = thr
            out["min_p_scale"][r] = np.maximum(1.0, np.maximum(np.abs(top), np.abs(log_m)))
            kept[r] &= margin >= 0
        # 2. top-k: keep z >= the k-th largest of the row left by 1 (ties with it kept).
        on = params.stochastic & (params.top_k > 0) & (params.top_k < vp)
        if on.any():
            r = np.flatnonzero(on)
            left = np.where(kept[r], z64[r], -np.inf)
            desc = -np.sort(-left, axis=1)
            t = desc[np.arange(r.size), params.top_k[r] - 1]
            margin = np.where(kept[r], z64[r] - t[:, None], np.nan)
            margin[np.isneginf(t)] = np.where(kept[r][np.isneginf(t)], np.inf, np.nan)
            out["top_k_margin"][r] = margin
            out["top_k_threshold"][r] = t
            out["top_k_scale"][r] = np.maximum(1.0, np.where(np.isfinite(t), np.abs(t), 0.0))
            kept[r] &= ~(margin < 0)
        # 3. top-p: keep x iff the mass before it (descending p, ties by ascending id) is < c.
        on = params.stochastic & (params.top_p < 1)
        if on.any():
            r = np.flatnonzero(on)
            left = np.where(kept[r], z64[r], -np.inf)
            m = left.max(axis=1, keepdims=True)
            e = np.exp(left - m)
            p = e / e.sum(axis=1, keepdims=True)
            order = np.argsort(-left, axis=1, kind="stable")  # stable: ties in ascending id
            sorted_p = np.take_along_axis(p, order, axis=1)
            before_sorted = np.cumsum(sorted_p, axis=1) - sorted_p
            before = np.empty_like(before_sorted)
            np.put_along_axis(before, order, before_sorted, axis=1)
            margin = np.where(kept[r], params.top_p[r, None] - before, np.nan)
            out["top_p_margin"][r] = margin
            kept[r] &= margin > 0
    return MaskResult(kept=kept, **out)


def batch_masks(batch: SpecBatch, z: np.ndarray) -> MaskResult:
    """The masks of every row of `batch`, for its processed logits `z` (float32 `[N, V']`)."""
    return apply_masks(z, row_params(batch))
