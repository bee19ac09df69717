"""What a sampler declares it supports (SPEC section 10), and what the suite therefore draws.

Optional declarations, with their defaults: `supports_logprobs` [True]; `draft_modes`
[{"model", "one_hot"}]; `logits_dtypes` [{"float32", "bfloat16", "float16"}];
`min_spec_steps` [0]. The strategies draw only what a sampler declares (`strategy_kwargs`),
and `not_exercised` says, for the report, what the gate therefore did not check.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.batch import LOGITS_DTYPES

DRAFT_MODES = ("model", "one_hot")
_STRATEGY_DRAFT_MODE = {"model": "model", "one_hot": "one-hot"}  # the strategies' spelling


class DeclarationError(ValueError):
    """A sampler's declaration is not one the SPEC allows (the message says which)."""


@dataclass(frozen=True)
class Declared:
    supports_logprobs: bool = True
    draft_modes: frozenset = frozenset(DRAFT_MODES)
    logits_dtypes: frozenset = frozenset(LOGITS_DTYPES)
    min_spec_steps: int = 0

    def strategy_kwargs(self) -> dict:
        """Keyword arguments that restrict the batch strategies to what the sampler supports."""
        kw = {}
        if not self.supports_logprobs:
            kw["logprobs"] = (None,)
        if self.draft_modes != frozenset(DRAFT_MODES):
            kw["draft_modes"] = tuple(_STRATEGY_DRAFT_MODE[m] for m in sorted(self.draft_modes))
        if self.logits_dtypes != frozenset(LOGITS_DTYPES):
            kw["logits_dtypes"] = tuple(d for d in LOGITS_DTYPES if d in self.logits_dtypes)
        if self.min_spec_steps:
            kw["min_spec_steps"] = self.min_spec_steps
        return kw

    def not_exercised(self) -> list[str]:
        """What the suite does not check because the sampler declared it away."""
        out = []
        if not self.supports_logprobs:
            out.append("logprobs (supports_logprobs = False): no logprobs field was requested or compared")
        for mode in DRAFT_MODES:
            if mode not in self.draft_modes:
                out.append(f"{mode.replace('_', '-')} drafts (draft_modes = {sorted(self.draft_modes)})")
        for dtype in LOGITS_DTYPES:
            if dtype not in self.logits_dtypes:
                out.append(f"{dtype} logits (logits_dtypes = {sorted(self.logits_dtypes)})")
        if self.min_spec_steps:
            out.append(f"requests with fewer than {self.min_spec_steps} drafts, K = 0 included "
                       f"(min_spec_steps = {self.min_spec_steps})")
        return out


def declared(sampler) -> Declared:
    """The sampler's declarations with the SPEC defaults; `DeclarationError` for values the SPEC forbids."""
    name = getattr(sampler, "name", type(sampler).__name__)
    modes = frozenset(getattr(sampler, "draft_modes", DRAFT_MODES))
    dtypes = frozenset(getattr(sampler, "logits_dtypes", LOGITS_DTYPES))
    k_min = getattr(sampler, "min_spec_steps", 0)
    if not modes or not modes <= set(DRAFT_MODES):
        raise DeclarationError(f"sampler {name}: draft_modes {sorted(modes)} must be a non-empty subset of "
                               f"{list(DRAFT_MODES)}")
    if not dtypes or not dtypes <= set(LOGITS_DTYPES):
        raise DeclarationError(f"sampler {name}: logits_dtypes {sorted(dtypes)} must be a non-empty subset of "
                               f"{list(LOGITS_DTYPES)}")
    if isinstance(k_min, bool) or not isinstance(k_min, int) or k_min < 0:
        raise DeclarationError(f"sampler {name}: min_spec_steps must be an int >= 0, not {k_min!r}")
    return Declared(bool(getattr(sampler, "supports_logprobs", True)), modes, dtypes, k_min)
