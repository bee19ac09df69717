"""Building the context a property runs against, and deciding whether the property applies."""

from __future__ import annotations

from ..harness.context import Context, capabilities
from ..harness.handle import SamplerUnderTest, as_sampler
from ..harness.record import SUITE_INTERPRETED
from ..properties.registry import NEEDS, Property
from . import profiles
from ..harness import device as devices

__all__ = ["capabilities", "current_device", "describe", "make_context", "skip_reason"]


def skip_reason(prop: Property, ctx: Context) -> str | None:
    """Why `prop` does not apply to this context, or None when it does."""
    missing = sorted(prop.needs - capabilities(ctx))
    if not missing:
        return None
    reasons = [NEEDS[m] for m in missing]
    rec = ctx.record
    if "fast" in missing and rec is not None and rec.interpreted_why == SUITE_INTERPRETED:
        reasons[missing.index("fast")] = (f"too slow for a distribution campaign: {SUITE_INTERPRETED} (run on CUDA)")
    return "; ".join(reasons)


def current_device() -> str:
    """The backend this process runs Triton on (the choice `device.resolve` made)."""
    return "cpu" if devices.interpreted() or not devices.cuda_available() else "cuda"


def make_context(sampler, reference=None, *, profile: str | None = None, device: str | None = None) -> Context:
    """The context of one property run: the profile's batch sizes, narrowed to what the sampler
    declares it supports (SPEC section 10; `rs_verify.harness.record`)."""
    name = profile or profiles.active()
    kwargs = profiles.batch_kwargs(name)
    handle = as_sampler(sampler)
    narrowed = handle.record.strategy_kwargs()
    k_min = narrowed.pop("min_spec_steps", 0)
    if k_min:  # every request verifies at least that many drafts (so K >= k_min too)
        kwargs["min_drafts"] = k_min
        kwargs["max_spec_steps"] = max(kwargs.get("max_spec_steps", k_min), k_min)
    kwargs.update(narrowed)
    return Context(sampler=handle, reference=reference, profile=name, batch_kwargs=kwargs,
                   device=device or current_device())


def describe(sampler) -> str:
    """How to load the sampler again: its spec when it was loaded by spec, else its name."""
    rec = as_sampler(sampler).record if not isinstance(sampler, SamplerUnderTest) else sampler.record
    return rec.loaded_as or rec.name
