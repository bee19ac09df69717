"""The deviations the suite ships (SPEC section 11), one `register(Deviation(...))` call each, and
`EMPTY_RESIDUAL_TOKEN0_LOG`: `empty_residual_token0` with empty residuals decided in float32 log space.

They live in one module: each is a rule of two or three NumPy lines at one or two edges
(`rs_verify.contract.deviations.EDGES`), and a module per rule would hold more docstring than code.
"""

from __future__ import annotations

import numpy as np

from .deviations import Deviation, register

__all__ = ["BLOCK_NAN_PREFIX_RESETS", "EMPTY_RESIDUAL_TOKEN0", "EMPTY_RESIDUAL_TOKEN0_LOG", "INVERSE_CDF_LAST_TOKEN",
           "TREE_BONUS_UNPROCESSED", "TREE_DUPLICATE_SIBLINGS"]


def _point_mass(logp: np.ndarray, token: int) -> np.ndarray:
    """Log weights `[n, V']` of a point mass at `token` (`-1`: the last token)."""
    out = np.full(np.shape(logp), -np.inf)
    out[:, token] = 0.0
    return out


def token0(logp: np.ndarray) -> np.ndarray:
    """vLLM: an argmax over residual scores that are all `-inf` picks index 0."""
    return _point_mass(logp, 0)


def last_token(logp: np.ndarray) -> np.ndarray:
    """SGLang's chain kernel: with `S = 0` no prefix exceeds `U * S`; the fallback is `V' - 1`."""
    return _point_mass(logp, -1)


def last_token_at_top(logr: np.ndarray, u: np.ndarray) -> np.ndarray:
    """SGLang's chain kernel: where no float32 prefix exceeds `U * S`, `V' - 1`."""
    return np.full(np.shape(u), np.shape(logr)[1] - 1, np.int64)


def prefix_resets(prev: np.ndarray, log_pd: np.ndarray, log_qd: np.ndarray) -> np.ndarray:
    """vLLM MRV2: `tl.minimum(NaN, 0.0)` is `0.0`, so the prefix ratio restarts at 1."""
    return np.zeros(np.shape(prev))


EMPTY_RESIDUAL_TOKEN0 = register(Deviation(
    name="empty_residual_token0", section="4",
    replaces="a residual with no positive mass falls back to p (sections 4 and 4b)",
    rules={"empty_residual": token0},
    doc="vLLM MRV2 and V1: an empty residual emits token 0 instead of sampling p"))

# The same deviation as vLLM MRV2 sees an empty residual: its resample kernel keeps the residual in
# float32 log space, so probabilities below float32's range still count (SPEC 11: "as the sampler
# sees it"). Not registered: the name stays `empty_residual_token0`; it travels by this path.
EMPTY_RESIDUAL_TOKEN0_LOG = EMPTY_RESIDUAL_TOKEN0.viewed("log")

INVERSE_CDF_LAST_TOKEN = register(Deviation(
    name="inverse_cdf_last_token", section="4",
    replaces="inverse CDF: the smallest x with r(x) > 0 and S_x > U * S; an empty residual falls back to p",
    rules={"empty_residual": last_token, "inverse_cdf_top": last_token_at_top},
    doc="SGLang's chain kernel: where no prefix sum exceeds U * S it emits V' - 1"))

BLOCK_NAN_PREFIX_RESETS = register(Deviation(
    name="block_nan_prefix_resets", section="4b",
    replaces="log P_i = -inf whenever p(d_i) = 0 or P_{i-1} = 0",
    rules={"block_prefix": prefix_resets},
    doc="vLLM MRV2 block verification: a NaN prefix ratio (-inf - -inf) becomes min(NaN, 0) = 0"))


def raw_softmax(logp: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """EAGLE 1.2.1: an accepted leaf's bonus from `softmax` of the raw logits (no temperature, no parameters)."""
    raw = np.asarray(raw, np.float64)
    with np.errstate(invalid="ignore"):
        return raw - raw.max(axis=1, keepdims=True)


def repeated_bounds(p: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """SGLang's tree kernel: `S_k` sums `p` over the first `k` siblings' tokens, repeats counted."""
    return np.cumsum(np.asarray(p, np.float64)[np.asarray(tokens, np.int64)])


TREE_BONUS_UNPROCESSED = register(Deviation(
    name="tree_bonus_unprocessed", section="4c",
    replaces="a path that ends on an accepted node emits the bonus from p_n",
    rules={"tree_bonus": raw_softmax},
    doc="EAGLE 1.2.1: an accepted leaf's bonus is drawn from softmax of the raw logits"))

TREE_DUPLICATE_SIBLINGS = register(Deviation(
    name="tree_duplicate_siblings", section="4c",
    replaces="one coin per node: S_k sums p_n over the first k distinct siblings' tokens",
    rules={"tree_siblings": repeated_bounds},
    doc="SGLang's tree kernel: a repeated one-hot sibling is tried with its token's mass again"))
