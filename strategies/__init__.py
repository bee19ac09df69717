"""Hypothesis strategies for rs-verify: ragged spec-decode batches, chunk caps and bad input.

- `spec_batches`: broad valid batches (every SPEC field, greedy-only and K = 0 batches included).
- `decision_batches`: valid batches rich in stochastic acceptance decisions (drafts drawn
  from q close to p, padded drafts with model logits, empty residuals, ties, vocabularies
  straddling block sizes), for certification, invariants and determinism.
- `tree_batches`: ragged tree batches (SPEC 4c) of every draft kind, with the explicit noise;
  `decision_batches` draws them too when `verifications` holds "tree".
- `chunk_caps`: caps on rows per chunk, at and below request boundaries.
- `invalid_batches`: one SPEC section 9 defect per batch.
- `decision_knobs`: the knobs a drawn batch exercises (what `hypothesis.event` records):
  `DECISION_KNOBS` (token-wise decisions), `BLOCK_KNOBS` (block verification, SPEC 4b) and
  `PARAM_KNOBS` (min-p, top-k, top-p, SPEC 2), `STREAM_KNOBS` (the murmur3 family's edges,
  SPEC 3b, planted when `decision_batches` is given `streams="murmur3"`) and `EXPLICIT_KNOBS` (the
  explicit family's noise on decision boundaries, SPEC 3c, with `streams="explicit"`).

Both batch strategies take `verifications` (default `("token",)`) and `sampling_params` (default
`()`): what a sampler declaring nothing supports; `decision_batches` also takes `streams` (default
`"triton-philox"`, the sampler's stream family); the engine passes the sampler's declarations.

Imports only NumPy, Hypothesis and the batch contract (never torch or triton).
"""

from .batches import DRAFT_MODES, spec_batches
from .chunks import CAP_KINDS, cap_candidates, cap_kind, chunk_caps
from .decisions import decision_batches
from .tree import tree_batches
from .events import (BLOCK_KNOBS, DECISION_KNOBS, EXPLICIT_KNOBS, PARAM_KNOBS, STREAM_KNOBS, acceptance_tests, block_k_knob,
                     block_knobs, decision_knobs, near_ties, stochastic_decisions)
from .invalid import EXPECTED_FIELD, INVALID_CLASSES, PARAM_CLASS_NEEDS, InvalidBatch, classes_for, invalid_batches
from .logits import DTYPE_MAX, PATTERNS, logits_rows, magnitude_bound, mask_rows, round_to_dtype
from .scalars import (DEFAULT_BLOCK_SIZES, DEFAULT_VOCAB_SIZES, TEMPERATURE_KINDS, block_edge_vocab_sizes, positions,
                      seeds, vocab_sizes)

__all__ = [
    "BLOCK_KNOBS",
    "CAP_KINDS",
    "DECISION_KNOBS",
    "DEFAULT_BLOCK_SIZES",
    "DEFAULT_VOCAB_SIZES",
    "DRAFT_MODES",
    "EXPLICIT_KNOBS",
    "DTYPE_MAX",
    "EXPECTED_FIELD",
    "INVALID_CLASSES",
    "InvalidBatch",
    "PARAM_CLASS_NEEDS",
    "PARAM_KNOBS",
    "PATTERNS",
    "STREAM_KNOBS",
    "TEMPERATURE_KINDS",
    "acceptance_tests",
    "block_edge_vocab_sizes",
    "block_k_knob",
    "block_knobs",
    "cap_candidates",
    "cap_kind",
    "chunk_caps",
    "classes_for",
    "decision_batches",
    "tree_batches",
    "decision_knobs",
    "invalid_batches",
    "logits_rows",
    "magnitude_bound",
    "mask_rows",
    "near_ties",
    "positions",
    "round_to_dtype",
    "seeds",
    "spec_batches",
    "stochastic_decisions",
    "vocab_sizes",
]
