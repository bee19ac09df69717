"""The sampling-parameter masks of SPEC section 2, in float64, with the margin of every decision.

For a row of a stochastic state with processed logits `z` (float32, over `[0, V')`):

1. `min_p = m > 0`: with `M = max z`, keep `z_x >= M + log m` (mask `z_x < M + log m`);
   margin `z_x - (M + log m)`.
2. `top_k = k`, `0 < k < V'`: `t` = the `k`-th largest entry of the row left by 1 (duplicates
   counted, `-inf` when fewer than `k` are finite); keep `z_x >= t`; margin `z_x - t` (a tie,
   margin 0, is kept).
3. `top_p = c < 1`: on `softmax` of the row left by 1 and 2, tokens ordered by descending
   probability, ties by ascending token id; keep `x` iff the mass of the tokens before it is
   `< c`; margin `c - mass before x` (a token exactly at `c`, margin 0, is masked).

Greedy states (`T == 0`) and parameters that are off mask nothing. Every decision's margin is
reported with its tolerance scale `L` (SPEC section 8): min-p `max(1, |M|, |log m|)` (the float32
error of the threshold `M + log m`), top-k `max(1, |t|)`, top-p `1` (a probability).

The order of tokens in top-p is that of the exact probabilities, i.e. of the logits (two distinct
logits whose float64 probabilities round to the same value are not a tie); the mass before a token
is an exclusive sequential prefix sum in float64 of `exp(z - max z)` in that order, divided by the
total.

Imports only NumPy and the batch contract. The reference, the properties and the strategies'
labels use this one implementation; production samplers implement their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import SpecBatch

__all__ = ["MASK_PARAMS", "MaskResult", "RowParams", "apply_masks", "batch_masks", "masked_logits", "row_params"]

#: The parameters in the order the masks apply (SPEC section 2).
MASK_PARAMS = ("min_p", "top_k", "top_p")

#: Distinct `k` values up to which top-k takes one `np.partition` per value instead of a full sort.
_PARTITION_GROUPS = 8


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
        """Rows where some parameter is on (`top_k >= V'` counts as on here; it masks nothing)."""
        return self.stochastic & ((self.min_p > 0) | (self.top_k > 0) | (self.top_p < 1))

    def take(self, rows: np.ndarray) -> "RowParams":
        """The parameters of the given rows."""
        return RowParams(self.min_p[rows], self.top_k[rows], self.top_p[rows], self.stochastic[rows])


@dataclass(frozen=True)
class MaskResult:
    """The masks of a block of rows over `[0, V')`.

    - `kept`: bool `[rows, V']`, the tokens left by all three parameters (tokens whose logit is
      `-inf` already may read either way: their probability is 0 whatever the mask).
    - `min_p_margin`, `top_k_margin`, `top_p_margin`: float64 `[rows, V']`, each decision's
      margin (positive: kept), NaN where that parameter made no decision (off, greedy row, or the
      token was masked by an earlier parameter). None when computed without margins.
    - `min_p_scale`, `top_k_scale`: float64 `[rows]`, the tolerance scale `L` of those decisions
      (top-p's is 1).
    - `min_p_threshold` (`M + log m`), `top_k_threshold` (`t`): float64 `[rows]`, NaN when off.
    """

    kept: np.ndarray
    min_p_margin: np.ndarray | None
    top_k_margin: np.ndarray | None
    top_p_margin: np.ndarray | None
    min_p_scale: np.ndarray
    top_k_scale: np.ndarray
    min_p_threshold: np.ndarray
    top_k_threshold: np.ndarray

    def margins(self) -> tuple[tuple[str, np.ndarray, np.ndarray], ...]:
        """`(parameter, margins [rows, V'], scales [rows, V'])` for the three parameters."""
        shape = self.kept.shape
        ones = np.ones(shape)
        return (("min_p", self.min_p_margin, np.broadcast_to(self.min_p_scale[:, None], shape)),
                ("top_k", self.top_k_margin, np.broadcast_to(self.top_k_scale[:, None], shape)),
                ("top_p", self.top_p_margin, ones))


def row_params(batch: SpecBatch, rows: np.ndarray | None = None) -> RowParams:
    """The sampling parameters of every logits row (or of `rows`), looked up through its state."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    states = np.repeat(np.asarray(batch.idx_mapping, dtype=np.int64), np.diff(cu))
    if rows is not None:
        states = states[np.asarray(rows, dtype=np.int64)]
    return state_params(batch, states)


def state_params(batch: SpecBatch, states: np.ndarray) -> RowParams:
    """The sampling parameters of rows whose request states are `states` (int64)."""
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


def _kth_largest(left: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per row, the `k`-th largest entry (1-based, duplicates counted) of float64 `left [rows, V]`."""
    ks = np.unique(k)
    if ks.size > _PARTITION_GROUPS:
        desc = -np.sort(-left, axis=1)
        return desc[np.arange(left.shape[0]), k - 1]
    out = np.empty(left.shape[0])
    for kk in ks:
        sel = np.flatnonzero(k == kk)
        out[sel] = -np.partition(-left[sel], int(kk) - 1, axis=1)[:, int(kk) - 1]
    return out


def apply_masks(z: np.ndarray, params: RowParams, *, margins: bool = True) -> MaskResult:
    """The SPEC section 2 masks of processed logits `z` (float32 `[rows, V']`) under `params`.

    With `margins=False` only `kept` and the thresholds are computed (the margin fields are None);
    top-p then finds its cut from the sorted values alone (`_top_p_kept`), without the per-token masses.
    """
    z = np.asarray(z, np.float32)
    rows, vp = z.shape
    kept = np.ones((rows, vp), bool)
    out = dict(min_p_margin=None, top_k_margin=None, top_p_margin=None,
               min_p_scale=np.ones(rows), top_k_scale=np.ones(rows),
               min_p_threshold=np.full(rows, np.nan), top_k_threshold=np.full(rows, np.nan))
    if margins:
        for name in ("min_p_margin", "top_k_margin", "top_p_margin"):
            out[name] = np.full((rows, vp), np.nan)
    if rows == 0 or vp == 0:
        return MaskResult(kept=kept, **out)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # 1. min-p: keep z >= max z + log m (compared in float64: z - thr >= 0 exactly when z >= thr).
        r = _on(params.stochastic & (params.min_p > 0))
        if r is not None:
            zr = z[r]
            top = zr.max(axis=1).astype(np.float64)
            log_m = np.log(params.min_p[r])
            thr = top + log_m
            out["min_p_threshold"][r] = thr
            out["min_p_scale"][r] = np.maximum(1.0, np.maximum(np.abs(top), np.abs(log_m)))
            if margins:
                out["min_p_margin"][r] = zr.astype(np.float64) - thr[:, None]
            kept[r] = zr >= thr[:, None]
        # 2. top-k: keep z >= the k-th largest of the row left by 1 (ties with it kept; t = -inf keeps all).
        r = _on(params.stochastic & (params.top_k > 0) & (params.top_k < vp))
        if r is not None:
            kr, zr = kept[r], z[r]
            t = _kth_largest(np.where(kr, zr, np.float32(-np.inf)), params.top_k[r]).astype(np.float64)
            out["top_k_threshold"][r] = t
            out["top_k_scale"][r] = np.maximum(1.0, np.where(np.isfinite(t), np.abs(t), 0.0))
            if margins:
                margin = zr.astype(np.float64) - t[:, None]
                margin[np.isneginf(t)] = np.inf
                margin[~kr] = np.nan
                out["top_k_margin"][r] = margin
            kept[r] = kr & (zr >= t[:, None])
        # 3. top-p: keep x iff the mass before it (descending p, ties by ascending id) is < c.
        r = _on(params.stochastic & (params.top_p < 1))
        if r is not None:
            kr = kept[r]
            left = np.where(kr, z[r], np.float32(-np.inf))
            c = params.top_p[r]
            if margins:
                margin = np.where(kr, c[:, None] - _mass_before(left), np.nan)
                out["top_p_margin"][r] = margin
                kept[r] = kr & (margin > 0)
            else:
                kept[r] = kr & _top_p_kept(left, c)
    return MaskResult(kept=kept, **out)


def _on(flags: np.ndarray):
    """The rows where `flags` holds: `slice(None)` for all of them (`a[r]` is then a view, not a copy),
    None for none, else their indices."""
    if flags.all():
        return slice(None)
    r = np.flatnonzero(flags)
    return r if r.size else None


def _sorted_mass_before(desc: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Float64 mass before each position of float32 rows sorted in descending order (`top`: the row
    max): `E_i = exp(desc_i - top)`, a sequential prefix sum `C`, and `before_i = C_{i-1} / C_last`.
    A sequential sum is the same whatever the number of trailing `-inf` columns (they add exact
    zeros), so `_top_p_kept` may drop those columns and still agree bit for bit with `_mass_before`."""
    with np.errstate(under="ignore"):
        e = np.exp(desc - top)
    cum = np.cumsum(e, axis=1)
    before = np.zeros_like(cum)
    np.divide(cum[:, :-1], cum[:, -1:], out=before[:, 1:])
    return before


def _mass_before(left: np.ndarray) -> np.ndarray:
    """Per token of float32 rows: the float64 probability mass of the tokens before it in descending
    probability, ties by ascending id (`_sorted_mass_before` in that order, mapped back to the ids)."""
    top = left.max(axis=1, keepdims=True).astype(np.float64)
    order = np.argsort(-left, axis=1, kind="stable")  # stable: ties in ascending id
    before_sorted = _sorted_mass_before(np.take_along_axis(left, order, axis=1), top)
    before = np.empty_like(before_sorted)
    np.put_along_axis(before, order, before_sorted, axis=1)
    return before


def _top_p_kept(left: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`_mass_before(left) < c` without the permutation: the same masses over the sorted values (tied
    tokens have equal probabilities, so the sequence does not depend on their order; the `-inf` tail,
    mass before 1 >= c, is left out) give the number kept, `n`; the kept tokens are those above the
    `n`-th value and the lowest-id ties with it."""
    top = left.max(axis=1, keepdims=True).astype(np.float64)
    desc = -np.sort(-left, axis=1)
    width = max(1, int((desc > -np.inf).sum(axis=1).max()))
    before_sorted = _sorted_mass_before(desc[:, :width], top)
    n = (before_sorted < c[:, None]).sum(axis=1)  # a prefix: the masses never decrease
    cut = desc[np.arange(left.shape[0]), n - 1][:, None]
    above = left > cut
    tied = left == cut
    need = n - above.sum(axis=1)
    kept = above | tied
    some = np.flatnonzero(tied.sum(axis=1) > need)  # only part of the ties with the cut is kept
    if some.size:
        kept[some] = above[some] | (tied[some] & (np.cumsum(tied[some], axis=1) <= need[some, None]))
    return kept


def batch_masks(batch: SpecBatch, z: np.ndarray, *, margins: bool = True) -> MaskResult:
    """The masks of every row of `batch`, for its processed logits `z` (float32 `[N, V']`)."""
    return apply_masks(z, row_params(batch), margins=margins)


def masked_logits(z: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """`z` (float32) with the tokens outside `kept` at `-inf`."""
    return np.where(kept, z, np.float32(-np.inf)).astype(np.float32, copy=False)
