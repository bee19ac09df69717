"""Bad input (SPEC section 9): rejected with a ValueError naming the field and the first offending
index, before any device work; and without validation a sampler stays in bounds."""

from __future__ import annotations

import re

import numpy as np

from ..contract.batch import ARRAY_FIELDS, SCALAR_FIELDS
from ..contract.validation import validate
from .assertions import event, observed
from .registry import PropertyFailure, register
from .inputs import invalid, invalid_of_every_class

FIELDS = (*ARRAY_FIELDS, *SCALAR_FIELDS)
# A field name as a word of its own: `logits` inside `target_logits` names nothing.
_FIELD_WORD = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(FIELDS, key=len, reverse=True)) + r")(?![A-Za-z0-9_])")
# The contract's own messages read `field: why` or `field[index]: why` (rs_verify.contract.validation).
_CONTRACT = re.compile(r"^(\w+)(?:\[\(?([-0-9, ]+)\)?\])?:")


def named_fields(message: str) -> list[str]:
    """The SpecBatch fields a message names, in order."""
    return _FIELD_WORD.findall(message)


def contract_index(batch, field: str) -> tuple[int, ...] | None:
    """The first offending index the contract's validator reports for `batch`, when it reports
    one for `field` (element-wise defect classes); None for whole-field defects."""
    try:
        validate(batch)
    except ValueError as exc:
        m = _CONTRACT.match(str(exc))
        if m and m.group(1) == field and m.group(2):
            return tuple(int(x) for x in m.group(2).replace(" ", "").split(",") if x)
    return None


def names_index(message: str, index: tuple[int, ...]) -> bool:
    """Whether the index's numbers appear, in order and side by side, among the message's integers
    (`pos[3]`, `pos at index 3`, `target_logits[2, 7]` and `(2, 7)` all name (2, 7))."""
    ints = [int(x) for x in re.findall(r"-?\d+", message)]
    k = len(index)
    return any(tuple(ints[i : i + k]) == index for i in range(len(ints) - k + 1))


def _launches(exc) -> int:
    return getattr(getattr(exc, "call_report", None), "triton_launches", None) or 0


@register("rejects_bad_input", "bad_input", strategy=invalid_of_every_class, cost=20,
          why_kept=("Validation is shared code outside the mutated packages; the property gates third-party samplers "
                    "that validate on their own (or not at all)."))
def rejects_bad_input(ctx, drawn) -> None:
    """Every SPEC section 9 defect class raises ValueError naming the field (and the first offending index)."""
    for batch, field in drawn:
        _check_rejected(ctx.sampler, batch, field)


def _check_rejected(sampler, batch, field) -> None:
    try:
        observed(sampler, batch)
    except PropertyFailure:  # the sampler modified the batch
        raise
    except ValueError as exc:
        _check_message(batch, field, str(exc), exc)
        if _launches(exc):
            raise PropertyFailure(f"bad {field}: ValueError raised after {_launches(exc)} Triton kernel launches "
                                  "(SPEC section 9: validation comes before any device work)", batch=batch) from exc
        return
    except Exception as exc:  # noqa: BLE001 - any other exception is the failure we report
        raise PropertyFailure(
            f"bad {field} raised {type(exc).__name__} instead of ValueError: {exc}", batch=batch
        ) from exc
    raise PropertyFailure(f"bad {field} was accepted without a ValueError", batch=batch)


def _check_message(batch, field: str, message: str, exc) -> None:
    """The message names `field` first (as a word, not inside a list of every field) and, for an
    element-wise defect, the first offending index the contract reports (SPEC section 9)."""
    named = named_fields(message)
    if not named:
        raise PropertyFailure(f"bad {field}: the ValueError names no SpecBatch field: {message}", batch=batch) from exc
    if named[0] != field:
        raise PropertyFailure(f"bad {field}: the ValueError names {named[0]!r} first, not {field!r}: {message}",
                              batch=batch) from exc
    index = contract_index(batch, field)
    if index is not None and not names_index(message, index):
        raise PropertyFailure(f"bad {field}: the ValueError does not name the first offending index "
                              f"{field}{list(index)}: {message}", batch=batch) from exc


@register("unvalidated_in_bounds", "bad_input", strategy=invalid, needs=("unvalidated",), cost=30,
          why_kept=("The only property that feeds invalid input to a sampler with validation off: the NaN / "
                    "no-finite-row failure mode is invisible to every other property."))
def unvalidated_in_bounds(ctx, drawn) -> None:
    """With validation off, a bad batch is refused with a ValueError or never yields a token outside [0, V')."""
    for batch, field in drawn:
        _in_bounds_unvalidated(ctx, batch, field)


def _in_bounds_unvalidated(ctx, batch, field) -> None:
    event(f"defect field: {field}")
    sampler = ctx.sampler.unvalidated()
    try:
        out, _report = observed(sampler, batch)
    except PropertyFailure:  # the sampler modified the batch
        raise
    except ValueError as exc:
        # Only a ValueError raised before any device work is a refusal. Device work is observable
        # as compiled Triton launches (guards.CallReport); under the interpreter it is not.
        if _launches(exc):
            raise PropertyFailure(f"bad {field}: ValueError raised after {_launches(exc)} Triton kernel launches "
                                  f"is no refusal (SPEC section 9): {exc}", batch=batch) from exc
        event("host-side refusal: ValueError")
        return
    except Exception as exc:  # noqa: BLE001 - a CUDA error above all: never a refusal
        raise PropertyFailure(f"bad {field}: without validation the sampler raised {type(exc).__name__} (only a "
                              f"ValueError before any device work is a refusal): {exc}", batch=batch) from exc
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
