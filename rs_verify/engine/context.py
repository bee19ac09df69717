"""Building the context a property runs against, and deciding whether the property applies."""

from __future__ import annotations

from ..properties.assertions import sampler_name, supports_chunking, uses_spec_streams
from ..properties.registry import NEEDS, Context, Property
from . import device as devices
from . import profiles
from .declared import declared


def capabilities(ctx: Context) -> set[str]:
    caps = {"triton"}
    s = ctx.sampler
    if supports_chunking(s):
        caps.add("chunking")
    if uses_spec_streams(s):
        caps.add("spec_streams")
    if ctx.reference is not None:
        caps.add("reference")
    if getattr(s, "memory_stats", False):
        caps.add("memory_stats")
    if callable(getattr(s, "unvalidated", None)):
        caps.add("unvalidated")
    if ctx.device == "cuda":
        caps.update(("cuda", "timing"))
    if getattr(ctx, "baseline", None) is not None:
        caps.add("baseline")
    if not getattr(s, "interpreted", False):
        caps.add("fast")
    if s is not None:
        caps.update(f"{mode}_drafts" for mode in declared(s).draft_modes)
    return caps


def skip_reason(prop: Property, ctx: Context) -> str | None:
    """Why `prop` does not apply to this context, or None when it does."""
    missing = sorted(prop.needs - capabilities(ctx))
    return "; ".join(NEEDS[m] for m in missing) if missing else None


def current_device() -> str:
    """The backend this process runs Triton on (the choice `device.resolve` made)."""
    return "cpu" if devices.interpreted() or not devices.cuda_available() else "cuda"


def make_context(sampler, reference=None, *, profile: str | None = None, device: str | None = None) -> Context:
    """The context of one property run: the profile's batch sizes, narrowed to what the sampler
    declares it supports (SPEC section 10; `rs_verify.engine.declared`)."""
    name = profile or profiles.active()
    kwargs = profiles.batch_kwargs(name)
    narrowed = declared(sampler).strategy_kwargs()
    k_min = narrowed.pop("min_spec_steps", 0)
    if k_min:  # every request verifies at least that many drafts (so K >= k_min too)
        kwargs["min_drafts"] = k_min
        kwargs["max_spec_steps"] = max(kwargs.get("max_spec_steps", k_min), k_min)
    kwargs.update(narrowed)
    return Context(
        sampler=sampler,
        reference=reference,
        profile=name,
        batch_kwargs=kwargs,
        device=device or current_device(),
    )


def describe(sampler) -> str:
    """How to load the sampler again: its spec when it was loaded by spec, else its name."""
    return getattr(sampler, "spec", None) or sampler_name(sampler)
