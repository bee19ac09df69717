"""Bad input (SPEC section 9): rejected with a ValueError naming the field; and without
validation a sampler stays in bounds."""

from __future__ import annotations

import numpy as np

from .assertions import event
from .registry import PropertyFailure, register
from .inputs import invalid, invalid_of_every_class


@register("rejects_bad_input", "bad_input", strategy=invalid_of_every_class)
def rejects_bad_input(ctx, drawn) -> None:
    """Every SPEC section 9 defect class raises ValueError naming the field, before any device work."""
    for batch, field in drawn:
        _check_rejected(ctx.sampler, batch, field)


def _check_rejected(sampler, batch, field) -> None:
    try:
        sampler(batch)
    except ValueError as exc:
        if field not in str(exc):
            raise PropertyFailure(f"ValueError does not name field {field!r}: {exc}", batch=batch) from exc
        return
    except Exception as exc:  # noqa: BLE001 - any other exception is the failure we report
        raise PropertyFailure(
            f"bad {field} raised {type(exc).__name__} instead of ValueError: {exc}", batch=batch
        ) from exc
    raise PropertyFailure(f"bad {field} was accepted without a ValueError", batch=batch)


@register("unvalidated_in_bounds", "bad_input", strategy=invalid, needs=("unvalidated",))
def unvalidated_in_bounds(ctx, drawn) -> None:
    """With validation off, a bad batch never yields a token outside [0, V') (nor a crash of the process)."""
    batch, field = drawn
    event(f"defect field: {field}")
    sampler = ctx.sampler.unvalidated()
    try:
        out = sampler(batch)
    except (ValueError, IndexError, TypeError, RuntimeError) as exc:
        event(f"host-side refusal: {type(exc).__name__}")
        return  # a host-side refusal is safe: nothing was read out of bounds
    try:
        v = batch.effective_vocab_size
    except (AttributeError, IndexError, TypeError):  # malformed draft_logits: bound by the target vocab
        v = np.asarray(batch.target_logits).shape[-1]
    sampled = np.asarray(out.sampled)
    bad = (sampled != -1) & ((sampled < 0) | (sampled >= max(v, 1)))
    if bad.any():
        r, i = (int(x) for x in np.argwhere(bad)[0])
        raise PropertyFailure(f"bad {field}: request {r} step {i} emitted {sampled[r, i]} outside [0, {v})",
                              batch=batch)
