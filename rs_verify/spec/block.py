"""Block verification (SPEC section 4b) in float64, vectorized over requests.

For request `r` with `n` drafts `d_0..d_{n-1}`, target probabilities `p_i` of its rows and draft
probabilities `q_i` (a point mass at `d_i` for one-hot drafts):

- `m`: the first step with a padded draft (`d < 0`, or `d >= V'` without validation), else `n`;
- prefix ratios `log P_{-1} = 0`, `log P_i = min(log P_{i-1} + log p_i(d_i) - log q_i(d_i), 0)`,
  and `log P_i = -inf` when `p_i(d_i) = 0` or `P_{i-1} = 0` (whatever `q_i(d_i)`);
- thresholds `h_i = Z_{i+1} / (Z_{i+1} + 1 - P_i)` (1 when that denominator is not positive) for
  `i + 1 < m`, with `Z_{i+1} = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0)` (one-hot drafts:
  `P_i (1 - p_{i+1}(d_{i+1}))`), and `h_i = P_i` for `i + 1 == m`;
- `tau = max({0} U {i + 1 : i < m, u_i <= h_i})`;
- the token at step `tau` (when `tau < n`): resampled from `p_tau` when `tau == m`, else from the
  residual `max(P_{tau-1} p_tau - q_tau, 0)` (model drafts, `P_{-1} = 1`) or `p_tau` without
  `d_tau` (one-hot drafts), `p_tau` itself when the residual has no positive mass.

Imports only NumPy. The reference and the strategies' labels use this one implementation of the
SPEC's formulas; production samplers implement their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockResult", "block_quantities", "block_residual", "tau_law"]


@dataclass(frozen=True)
class BlockResult:
    """Per request (`[R]`) and step (`[R, K]`); steps at or past `m` hold NaN (`log_prefix`, `h`)."""

    m: np.ndarray  # int64 [R]: verified steps (the first padded draft ends the block)
    log_prefix: np.ndarray  # float64 [R, K]: log P_i
    h: np.ndarray  # float64 [R, K]: the thresholds h_i
    z: np.ndarray  # float64 [R, K]: Z_{i+1} used by h_i (NaN for the last verified step)

    def tau(self, u: np.ndarray) -> np.ndarray:
        """`tau` of every request for acceptance uniforms `u` (float `[R, K]`)."""
        k = self.h.shape[1]
        steps = np.arange(k)[None, :]
        with np.errstate(invalid="ignore"):
            ok = (steps < self.m[:, None]) & (np.asarray(u, np.float64) <= self.h)
        last = np.where(ok, steps + 1, 0)
        return last.max(axis=1, initial=0).astype(np.int64) if k else np.zeros(self.m.shape, np.int64)

    def residual_scale(self, tau: np.ndarray) -> np.ndarray:
        """`P_{tau - 1}` (1 for `tau == 0`), float64 `[R]`."""
        tau = np.asarray(tau, np.int64)
        if self.log_prefix.shape[1] == 0:
            return np.ones(tau.shape)
        prev = np.take_along_axis(self.log_prefix, np.clip(tau - 1, 0, None)[:, None], axis=1)[:, 0]
        return np.where(tau == 0, 1.0, np.exp(prev))


def _at(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`a[r, i, idx[r, i]]` for a `[R, K, V]` array and int `[R, K]` indices (clipped)."""
    return np.take_along_axis(a, np.clip(idx, 0, a.shape[2] - 1)[..., None], axis=2)[..., 0]


def block_quantities(p: np.ndarray, q: np.ndarray | None, drafts: np.ndarray, n: np.ndarray) -> BlockResult:
    """SPEC section 4b's `m`, prefix ratios and thresholds.

    - `p`: float64 `[R, K + 1, V']`, target probabilities of each request's rows (step `i`, then the
      bonus row; rows past a request's `n + 1` are ignored).
    - `q`: float64 `[R, K, V']` draft probabilities, or None for one-hot drafts.
    - `drafts`: int `[R, K]` draft ids (entries past `n` ignored); `n`: int `[R]` drafts per request.
    """
    p = np.asarray(p, np.float64)
    drafts = np.asarray(drafts, np.int64)
    n = np.asarray(n, np.int64)
    r, k = drafts.shape
    vp = p.shape[2]
    steps = np.arange(k)[None, :]
    padded = (steps < n[:, None]) & ((drafts < 0) | (drafts >= vp))
    m = np.where(padded.any(axis=1), np.argmax(padded, axis=1), n).astype(np.int64)
    live = steps < m[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pd = _at(p[:, :k], drafts)
        log_ratio = np.log(pd) - (0.0 if q is None else np.log(_at(np.asarray(q, np.float64), drafts)))
        log_ratio = np.where(pd == 0, -np.inf, log_ratio)  # a draft the target excludes never extends the block
        log_prefix = np.full((r, k), np.nan)
        h = np.full((r, k), np.nan)
        z = np.full((r, k), np.nan)
        prev = np.zeros(r)
        for i in range(k):
            cur = np.where(np.isneginf(prev), -np.inf, np.minimum(prev + log_ratio[:, i], 0.0))
            cur = np.where(live[:, i], cur, np.nan)
            log_prefix[:, i] = cur
            big_p = np.exp(cur)
            nxt = live[:, i + 1] if i + 1 < k else np.zeros(r, bool)
            zi = np.full(r, np.nan)
            if nxt.any():
                rows = np.flatnonzero(nxt)
                if q is None:
                    zi[rows] = big_p[rows] * (1.0 - _at(p[rows, i + 1 : i + 2], drafts[rows, i + 1 : i + 2])[:, 0])
                else:
                    diff = big_p[rows, None] * p[rows, i + 1] - np.asarray(q[rows, i + 1], np.float64)
                    zi[rows] = np.maximum(diff, 0.0).sum(axis=1)
            den = zi + 1.0 - big_p
            hi = np.where(den > 0, zi / np.where(den > 0, den, 1.0), 1.0)
            hi = np.where(nxt, hi, big_p)  # the last verified step: h = P
            h[:, i] = np.where(live[:, i], hi, np.nan)
            z[:, i] = np.where(nxt, zi, np.nan)
            prev = np.where(live[:, i], cur, prev)
    return BlockResult(m=m, log_prefix=log_prefix, h=h, z=z)


def block_residual(p_row: np.ndarray, q_row: np.ndarray | None, draft: int, scale: float,
                   padded: bool) -> np.ndarray:
    """The (unnormalised) law of the token emitted at the first step not accepted, float64 `[V']`:
    `p` at a padded step; else `max(scale * p - q, 0)` (model drafts; `scale = P_{tau-1}`) or `p`
    without the draft (one-hot drafts); `p` when that has no positive mass."""
    p_row = np.asarray(p_row, np.float64)
    if padded:
        return p_row
    if q_row is None:
        r = p_row.copy()
        if 0 <= draft < r.shape[0]:
            r[draft] = 0.0
    else:
        r = np.maximum(scale * p_row - np.asarray(q_row, np.float64), 0.0)
    return r if (r > 0).any() else p_row


def tau_law(result: BlockResult) -> np.ndarray:
    """`P(tau = t)` for `t = 0..K` when the thresholds are fixed (given drafts) and the uniforms
    independent: `P(tau = t) = h_{t-1} prod_{t <= i < m} (1 - h_i)` (`h_{-1} = 1`); float64 `[R, K + 1]`."""
    r, k = result.h.shape
    h = np.where(np.arange(k)[None, :] < result.m[:, None], result.h, 0.0)
    out = np.zeros((r, k + 1))
    for t in range(k + 1):
        later = np.prod(1.0 - h[:, t:], axis=1)
        out[:, t] = later * (1.0 if t == 0 else h[:, t - 1])
    return out
