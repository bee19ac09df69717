"""Hypothesis strategies for rs-verify: ragged spec-decode batches, chunk caps and bad input.

- `spec_batches`: broad valid batches (every SPEC field, greedy-only and K = 0 batches included).
- `decision_batches`: valid batches rich in stochastic acceptance decisions (drafts drawn
  from q close to p, padded drafts with model logits, empty residuals, ties, vocabularies
  straddling block sizes), for certification, invariants and determinism.
- `chunk_caps`: caps on rows per chunk, at and below request boundaries.
- `invalid_batches`: one SPEC section 9 defect per batch.
- `decision_knobs`: the knobs a drawn batch exercises (what `hypothesis.event` records).

Imports only NumPy, Hypothesis and the batch contract (never torch or triton).
"""

from .batches import DRAFT_MODES, spec_batches
from .chunks import CAP_KINDS, cap_candidates, cap_kind, chunk_caps
from .decisions import decision_batches
from .events import DECISION_KNOBS, acceptance_tests, block_knobs, decision_knobs, stochastic_decisions
from .invalid import EXPECTED_FIELD, INVALID_CLASSES, InvalidBatch, invalid_batches
from .logits import DTYPE_MAX, PATTERNS, logits_rows, magnitude_bound, mask_rows, round_to_dtype
from .scalars import (DEFAULT_BLOCK_SIZES, DEFAULT_VOCAB_SIZES, TEMPERATURE_KINDS, block_edge_vocab_sizes, positions,
                      seeds, vocab_sizes)

__all__ = [
    "CAP_KINDS",
    "DECISION_KNOBS",
    "DEFAULT_BLOCK_SIZES",
    "DEFAULT_VOCAB_SIZES",
    "DRAFT_MODES",
    "DTYPE_MAX",
    "EXPECTED_FIELD",
    "INVALID_CLASSES",
    "InvalidBatch",
    "PATTERNS",
    "TEMPERATURE_KINDS",
    "acceptance_tests",
    "block_edge_vocab_sizes",
    "block_knobs",
    "cap_candidates",
    "cap_kind",
    "chunk_caps",
    "decision_batches",
    "decision_knobs",
    "invalid_batches",
    "logits_rows",
    "magnitude_bound",
    "mask_rows",
    "positions",
    "round_to_dtype",
    "seeds",
    "spec_batches",
    "stochastic_decisions",
    "vocab_sizes",
]
