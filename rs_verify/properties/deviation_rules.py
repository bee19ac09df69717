"""Which emitted tokens a sampler's declared deviations explain (SPEC section 11), for the output rules.

A declared deviation replaces a rule of SPEC 4 or 4b at its edge (`rs_verify.contract.deviations`);
the output rules (`output_rules.check_output_invariants`) then hold the token it decides to the
declared rule instead of the SPEC's:

- `"empty_residual"`: after a rejection whose residual is empty in float32, as the sampler sees it
  (the record's `empty_view`: `Deviation.residual_empty32`), or whose float64 mass is within the
  `eps` certification excuses, the token may lie in the support of the rule's weights (token 0 for
  `empty_residual_token0`, even with `p = 0`);
- `"inverse_cdf_top"`: the final token of an inverse-CDF resample may be the rule's token where no
  float32 prefix sum exceeds `U S` (`inverse_cdf_unfound32`), or `U` lies within SPEC 8's
  inverse-CDF tolerance of the top;
- `"block_prefix"`: a block request's accepted draft with `p = 0` is legal when the rule reset the
  prefix ratio (a NaN sum) at that step or a later one before `tau`, and `P_{tau-1}` of the residual
  check is the rule's;
- `"tree_bonus"`: on a token batch (a chain is a tree, SPEC 4c), the token after at least one accepted
  draft and no rejected one (the bonus, or the step of a padded draft) may be any token of finite raw
  logit, which the sampling parameters may mask (`tree_bonus_unprocessed`'s raw softmax ignores them).
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax

from ..contract import probs
from ..contract.block import block_quantities, nan_steps
from ..contract.deviations import Applied, inverse_cdf_unfound32
from ..contract.explicit import inverse_cdf_tolerance, resample_uniforms
from .decisions import DEFAULT_EPS

__all__ = ["DeviationView"]


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(x, np.float64))


class DeviationView:
    """The declared deviations `dev` over one batch with float64 target (`p`) and draft (`q`, or None)
    probabilities of its rows (`rs_verify.contract.probs`)."""

    def __init__(self, batch, dev: Applied, p: np.ndarray, q: np.ndarray | None):
        self.batch, self.p, self.q = batch, p, q
        self.empty = dev.at("empty_residual")
        self.top = dev.at("inverse_cdf_top")
        self.nan_dev = dev.at("block_prefix")
        self.nan_rule = None if self.nan_dev is None else self.nan_dev.rule("block_prefix")
        self.bonus = dev.at("tree_bonus")
        self.cu = np.asarray(batch.cu_num_logits, np.int64)
        if self.empty is not None and self.empty.empty_view == "log":  # the logits, for log p and log q
            self.z, self.zq = probs.processed_logits(batch), probs.processed_draft_logits(batch)

    def _empty32(self, j: int, scale: float, d: int) -> bool:
        """Whether the residual of row `j` (`P = scale`, rejected draft `d`) is empty in float32, in the
        declared record's view; the log view takes `log p` and `log q` without underflow."""
        logp = logq = None
        if self.empty.empty_view == "log":
            logp = log_softmax(self.z[j][None].astype(np.float64), axis=1)
            logq = None if self.q is None else log_softmax(self.zq[j][None].astype(np.float64), axis=1)
        log_scale = None if scale == 1.0 else _log(np.array([scale]))
        q_row = None if self.q is None else self.q[j][None]
        return bool(self.empty.residual_empty32((scale * self.p[j])[None], q_row, logp, logq, np.array([d]),
                                                log_scale)[0])

    def _block(self, r: int):
        """Block request `r`'s quantities with the declared NaN rule, and the steps it decided."""
        lo, drafts = int(self.cu[r]), self.batch.draft_tokens(r)
        n = len(drafts)
        p = self.p[lo : lo + n + 1][None]
        q = None if self.q is None else self.q[lo : lo + n][None]
        res = block_quantities(p, q, drafts[None], np.array([n]), nan_rule=self.nan_rule)
        if q is None or not n:
            return res, np.zeros((1, n), bool)
        d = np.clip(drafts, 0, p.shape[2] - 1)
        log_pd = _log(p[0, np.arange(n), d])[None]
        log_qd = _log(q[0, np.arange(n), d])[None]
        return res, nan_steps(log_pd, log_qd, res.log_prefix, res.m)

    def block_scale(self, r: int, tau: int) -> float:
        """`P_{tau-1}` of block request `r` with the declared rule (1 for `tau = 0`)."""
        res, _ = self._block(r)
        return float(res.residual_scale(np.array([tau]))[0])

    def explained(self, r: int, tokens, drafts, scale: float, stochastic: bool, block: bool) -> dict[int, str]:
        """`{step: deviation name}`: the steps of request `r` whose emitted token a declared rule explains."""
        out: dict[int, str] = {}
        if not stochastic:
            return out
        last, n, vp = len(tokens) - 1, len(drafts), self.p.shape[1]
        lo = int(self.cu[r])
        if block and self.nan_rule is not None and last > 0:
            _, nan = self._block(r)
            for i in range(last):
                if self.p[lo + i, int(tokens[i])] == 0 and nan[0, i:last].any():
                    out[i] = self.nan_dev.name
        j, tok = lo + last, int(tokens[last])
        d = int(drafts[last]) if last < n else -1
        law, ruled_by = self.p[j], ""
        if 0 <= d < vp:  # a rejection of a real draft: the residual
            if self.q is None:
                law = self.p[j].copy()
                law[d] = 0.0
            else:
                law = np.maximum(scale * self.p[j] - self.q[j], 0.0)
            # empty as the rule's edge decides it (float32), or within the margin certification excuses
            near_empty = law.sum() <= DEFAULT_EPS
            if self.empty is not None and (near_empty or self._empty32(j, scale, d)):
                law = np.exp(self.empty.rule("empty_residual")(_log(self.p[j])[None])[0])
                ruled_by = self.empty.name
            elif not (law > 0).any():
                law = self.p[j]
        if ruled_by and law[tok] > 0:
            out[last] = ruled_by
        if self.bonus is not None and last > 0 and not 0 <= d < vp:  # a chain ending on an accepted draft
            raw = np.asarray(self.batch.target_logits[j, :vp], np.float64)
            if np.isfinite(raw[tok]):  # in the support of the rule's weights (EAGLE: the raw softmax)
                out[last] = self.bonus.name
        if self.top is not None:
            u = resample_uniforms(self.batch, np.array([r]))
            logr = _log(law)[None]
            near_top = 1.0 - float(u[0]) <= inverse_cdf_tolerance(DEFAULT_EPS, vp)
            if tok == int(self.top.rule("inverse_cdf_top")(logr, u)[0]) and (near_top or inverse_cdf_unfound32(logr, u)[0]):
                out[last] = self.top.name
        return out
