"""Building the context a property runs against, and deciding whether the property applies."""

from __future__ import annotations

from ..properties.assertions import sampler_name, supports_chunking, uses_spec_streams
from ..properties.registry import NEEDS, Context, Property
from . import device as devices
from . import profiles


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
    return caps


def skip_reason(prop: Property, ctx: Context) -> str | None:
    """Why `prop` does not apply to this context, or None when it does."""
    missing = sorted(prop.needs - capabilities(ctx))
    return "; ".join(NEEDS[m] for m in missing) if missing else None


def current_device() -> str:
    """The backend this process runs Triton on (the choice `device.resolve` made)."""
    return "cpu" if devices.interpreted() or not devices.cuda_available() else "cuda"


def make_context(sampler, reference=None, *, profile: str | None = None, device: str | None = None) -> Context:
    name = profile or profiles.active()
    return Context(
        sampler=sampler,
        reference=reference,
        profile=name,
        batch_kwargs=profiles.batch_kwargs(name),
        device=device or current_device(),
    )


def describe(sampler) -> str:
    """How to load the sampler again: its spec when it was loaded by spec, else its name."""
    return getattr(sampler, "spec", None) or sampler_name(sampler)
