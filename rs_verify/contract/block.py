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

`1 - P_i` and `1 - p(d)` are evaluated as `-expm1(log P_i)` and `-expm1(log p(d))` (accurate when
`P_i` or `p(d)` is close to 1).

The pieces work on per-step scalars, so a caller with rows in another layout (the reference's
slabs) computes `log p(d)`, `log q(d)` and `Z` its own way and shares the recurrence
(`prefix_ratios`), the thresholds (`thresholds`) and `tau` (`BlockResult.tau`);
`block_quantities` does it all from dense `[R, K + 1, V']` probabilities.

Imports only NumPy. The reference and the strategies' labels use this one implementation of the
SPEC's formulas; production samplers implement their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockResult", "block_quantities", "block_residual", "first_padded", "nan_steps", "prefix_ratios",
           "residual_mass", "tau_law", "thresholds"]


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
        return np.exp(self.residual_log_scale(tau))

    def residual_log_scale(self, tau: np.ndarray) -> np.ndarray:
        """`log P_{tau - 1}` (0 for `tau == 0`), float64 `[R]`."""
        tau = np.asarray(tau, np.int64)
        if self.log_prefix.shape[1] == 0:
            return np.zeros(tau.shape)
        prev = np.take_along_axis(self.log_prefix, np.clip(tau - 1, 0, None)[:, None], axis=1)[:, 0]
        return np.where(tau == 0, 0.0, prev)


def _at(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`a[r, i, idx[r, i]]` for a `[R, K, V]` array and int `[R, K]` indices (clipped)."""
    return np.take_along_axis(a, np.clip(idx, 0, a.shape[2] - 1)[..., None], axis=2)[..., 0]


def first_padded(drafts: np.ndarray, n: np.ndarray, vocab: int) -> np.ndarray:
    """`m` of every request: the first step `i < n` with `d_i < 0` or `d_i >= vocab`, else `n` (int64 `[R]`)."""
    drafts = np.asarray(drafts, np.int64)
    n = np.asarray(n, np.int64)
    steps = np.arange(drafts.shape[1])[None, :]
    padded = (steps < n[:, None]) & ((drafts < 0) | (drafts >= vocab))
    if not padded.size:
        return n.astype(np.int64)
    return np.where(padded.any(axis=1), np.argmax(padded, axis=1), n).astype(np.int64)


def prefix_ratios(log_pd: np.ndarray, log_qd: np.ndarray | None, m: np.ndarray, nan_rule=None) -> np.ndarray:
    """`log P_i` (float64 `[R, K]`, NaN at steps `>= m`) from `log p_i(d_i)` and `log q_i(d_i)`
    (`[R, K]`; None for one-hot drafts: `log q = 0`). `nan_rule` (a declared deviation's rule at the
    edge `"block_prefix"`, SPEC 11): `log P_i` where `log P_{i-1} + log p_i(d_i) - log q_i(d_i)` is
    NaN, as `nan_rule(prev, log_pd, log_qd)` on those requests (the SPEC's `-inf` without it)."""
    log_pd = np.asarray(log_pd, np.float64)
    log_qd = None if log_qd is None else np.asarray(log_qd, np.float64)
    r, k = log_pd.shape
    live = np.arange(k)[None, :] < np.asarray(m)[:, None]
    with np.errstate(invalid="ignore"):
        ratio = log_pd if log_qd is None else log_pd - np.asarray(log_qd, np.float64)
        ratio = np.where(np.isneginf(log_pd), -np.inf, ratio)  # p(d) = 0: never extends the block
    out = np.full((r, k), np.nan)
    prev = np.zeros(r)
    for i in range(k):
        with np.errstate(invalid="ignore"):
            cur = np.where(np.isneginf(prev), -np.inf, np.minimum(prev + ratio[:, i], 0.0))
            if nan_rule is not None and log_qd is not None:
                nan = live[:, i] & np.isnan(prev + (log_pd[:, i] - log_qd[:, i]))
                if nan.any():
                    cur[nan] = nan_rule(prev[nan], log_pd[nan, i], log_qd[nan, i])
        out[:, i] = np.where(live[:, i], cur, np.nan)
        prev = cur
    return out


def thresholds(log_prefix: np.ndarray, z: np.ndarray, m: np.ndarray) -> np.ndarray:
    """`h_i` (float64 `[R, K]`, NaN at steps `>= m`) from `log P_i` and `Z_{i+1}` (`[R, K]`; read only
    where `i + 1 < m`)."""
    log_prefix = np.asarray(log_prefix, np.float64)
    k = log_prefix.shape[1]
    steps = np.arange(k)[None, :]
    m = np.asarray(m)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        big_p = np.exp(log_prefix)
        den = z + (-np.expm1(log_prefix))  # Z + 1 - P
        h = np.where(den > 0, z / np.where(den > 0, den, 1.0), 1.0)
    h = np.where(steps + 1 < m, h, big_p)  # the last verified step: h = P
    return np.where(steps < m, h, np.nan)


def residual_mass(scale: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """`sum_x max(scale p(x) - q(x), 0)` over the last axis (`scale` broadcast over it)."""
    return np.maximum(np.asarray(scale)[..., None] * p - q, 0.0).sum(axis=-1)


def nan_steps(log_pd: np.ndarray, log_qd: np.ndarray | None, log_prefix: np.ndarray, m: np.ndarray) -> np.ndarray:
    """bool `[R, K]`: the verified steps where `log P_{i-1} + log p_i(d_i) - log q_i(d_i)` is NaN
    (`-inf` minus `-inf`: the edge of a `"block_prefix"` deviation, SPEC 11); never for one-hot drafts."""
    r, k = np.shape(log_pd)
    if log_qd is None or not k:
        return np.zeros((r, k), bool)
    prev = np.concatenate([np.zeros((r, 1)), np.asarray(log_prefix, np.float64)[:, :-1]], axis=1)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(prev + (np.asarray(log_pd, np.float64) - np.asarray(log_qd, np.float64)))
    return nan & (np.arange(k)[None, :] < np.asarray(m)[:, None])


def block_quantities(p: np.ndarray, q: np.ndarray | None, drafts: np.ndarray, n: np.ndarray,
                     nan_rule=None) -> BlockResult:
    """SPEC section 4b's `m`, prefix ratios and thresholds (`nan_rule`: see `prefix_ratios`).

    - `p`: float64 `[R, K + 1, V']`, target probabilities of each request's rows (step `i`, then the
      bonus row; rows past a request's `n + 1` are ignored).
    - `q`: float64 `[R, K, V']` draft probabilities, or None for one-hot drafts.
    - `drafts`: int `[R, K]` draft ids (entries past `n` ignored); `n`: int `[R]` drafts per request.
    """
    p = np.asarray(p, np.float64)
    drafts = np.asarray(drafts, np.int64)
    r, k = drafts.shape
    m = first_padded(drafts, n, p.shape[2])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_pd = np.log(_at(p[:, :k], drafts))
        log_qd = None if q is None else np.log(_at(np.asarray(q, np.float64), drafts))
        log_prefix = prefix_ratios(log_pd, log_qd, m, nan_rule)
        z = np.full((r, k), np.nan)
        for i in range(k - 1):
            rows = np.flatnonzero(i + 1 < m)
            if not rows.size:
                continue
            big_p = np.exp(log_prefix[rows, i])
            if q is None:
                z[rows, i] = big_p * -np.expm1(log_pd[rows, i + 1])
            else:
                z[rows, i] = residual_mass(big_p, p[rows, i + 1], np.asarray(q[rows, i + 1], np.float64))
    return BlockResult(m=m, log_prefix=log_prefix, h=thresholds(log_prefix, z, m), z=z)


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
