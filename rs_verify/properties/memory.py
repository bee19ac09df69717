"""Memory properties (SPEC section 7): the processed-logits buffer stays within the cap."""

from __future__ import annotations


from .base import PropertyFailure, call, event, register
from .inputs import batch_and_cap


@register("buffer_within_cap", "memory", strategy=batch_and_cap, needs=("chunking", "memory_stats"))
def buffer_within_cap(ctx, drawn) -> None:
    """The processed-logits buffer never holds more than max_chunk_logits rows (instrumented)."""
    batch, cap = drawn
    out = call(ctx.sampler, batch, max_chunk_logits=cap)
    rows = out.extras.get("max_buffer_rows")
    if rows is None:
        raise PropertyFailure("the sampler reported no extras['max_buffer_rows']", batch=batch)
    event("buffer used" if rows else "no buffer")
    if rows > cap:
        raise PropertyFailure(f"processed-logits buffer of {rows} rows exceeds max_chunk_logits = {cap}",
                              batch=batch)
