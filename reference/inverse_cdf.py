"""Inverse-CDF resampling (SPEC section 4, explicit family) and its certified margin (section 8).

With `U = resample_uniforms[r]`, the residual `r` of the row that samples (unnormalised) and its
prefix sums `S_x = sum_{y <= x} r(y)`, the token is the smallest `x` with `r(x) > 0` and
`S_x > U * S_{V'-1}`. The reference sums in float64; a production sampler's float32 prefix sums
may put the boundary elsewhere, so a differing token `x` is measured by the normalised distance
of the prefix sum that separates it from the reference's token `t` (`gaps`):
- `x > t` (the production found `S_b <= U S` up to `x - 1`): `S_{x-1} / S - U`; a token with
  `r(x) = 0` only at the top (no mass after it: a fallback when float32 rounding leaves no prefix
  above `U S`), where that is `1 - U`;
- `x < t` (the production found `S_x > U S`): `U - S_x / S`, for `r(x) > 0` only;
- `inf` for a token that no rounding of the prefix sums emits.
A gap within `max(eps, V' * 2**-23)` (a float32 prefix sum's error over `V'` tokens;
`rs_verify.contract.explicit.inverse_cdf_tolerance`) is excused.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.explicit import INVERSE_CDF, prefix_fractions

__all__ = ["WHAT", "gaps", "tokens"]

#: The `Decision.what` of an argmax (or residual) decision taken by inverse CDF.
WHAT = INVERSE_CDF


#: The positive tokens of the residual `r = exp(log r)` (rows) and its normalised prefix sums `S_x / S`
#: (the contract's, which the strategies plant on too).
_prefix = prefix_fractions


def tokens(logr: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of `log r` (float64 `[n, V']`, `-inf` where `r = 0`), the smallest `x` with `r(x) > 0`
    and `S_x > U S`, `U` from `u` `[n]`."""
    positive, c = _prefix(logr)
    hit = positive & (c > np.asarray(u, np.float64)[:, None])
    hit[:, -1] |= ~hit.any(axis=1)  # unreachable for U < 1 and S > 0: the last token as the guard
    return np.argmax(hit, axis=1)


def gaps(logr_row: np.ndarray, u: float, token: int) -> tuple[np.ndarray, float]:
    """`(gaps [V'], margin)` of one inverse-CDF resample that emitted `token` (module docstring):
    each candidate production token's boundary distance (0 at `token`), and the reference's own
    margin, the distance of `U` from the nearer boundary of `token`'s interval."""
    positive, c = _prefix(logr_row[None])
    positive, c = positive[0], c[0]
    u = float(u)
    v = c.size
    prev = np.concatenate(([0.0], c[:-1]))  # S_{x-1} / S
    out = np.full(v, np.inf)
    x = np.arange(v)
    mass_after = np.concatenate((np.cumsum(positive[::-1])[::-1][1:], [0])) > 0
    up = (x > token) & (positive | ~mass_after)
    out[up] = prev[up] - u
    down = (x < token) & positive
    out[down] = u - c[down]
    out[token] = 0.0
    margin = min(c[token] - u, u - prev[token])
    return np.maximum(out, 0.0), float(margin)
