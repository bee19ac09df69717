"""Hypothesis strategies for rs-verify: ragged spec-decode batches, chunk caps and bad input.

Imports only NumPy, Hypothesis and the batch contract (never torch or triton).
"""

from .batches import (
    DEFAULT_VOCAB_SIZES,
    DRAFT_MODES,
    DTYPE_MAX,
    PATTERNS,
    TEMPERATURE_KINDS,
    logits_rows,
    magnitude_bound,
    mask_rows,
    positions,
    round_to_dtype,
    seeds,
    spec_batches,
    vocab_sizes,
)
from .chunks import cap_candidates, chunk_caps
from .invalid import EXPECTED_FIELD, INVALID_CLASSES, InvalidBatch, invalid_batches

__all__ = [
    "DEFAULT_VOCAB_SIZES",
    "DRAFT_MODES",
    "DTYPE_MAX",
    "EXPECTED_FIELD",
    "INVALID_CLASSES",
    "InvalidBatch",
    "PATTERNS",
    "TEMPERATURE_KINDS",
    "cap_candidates",
    "chunk_caps",
    "invalid_batches",
    "logits_rows",
    "magnitude_bound",
    "mask_rows",
    "positions",
    "round_to_dtype",
    "seeds",
    "spec_batches",
    "vocab_sizes",
]
