"""Chunk caps (`max_chunk_logits`) for chunked verification (SPEC section 7).

A cap matters where the chunk planner's decisions change: at the row count of a run
of whole requests (a chunk then ends exactly at a request boundary), one row either
side of it, and below the largest request (that request must still be verified
whole, as a chunk of its own). `chunk_caps` draws each kind and labels the draw.

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.chunking import iter_request_chunks

MAX_SPAN_REQS = 64  # beyond this many requests, only prefixes and single requests give candidates

BELOW_LARGEST = "cap below the largest request"
AT_BOUNDARY = "cap = rows of a run of whole requests"
NEAR_BOUNDARY = "cap one row off a run of whole requests"
ONE_CHUNK = "cap >= N (one chunk)"
CAP_KINDS = (BELOW_LARGEST, AT_BOUNDARY, NEAR_BOUNDARY, ONE_CHUNK)


def _spans(cu: np.ndarray) -> np.ndarray:
    """Row counts of runs of whole requests (every span for up to MAX_SPAN_REQS requests)."""
    if cu.size - 1 <= MAX_SPAN_REQS:
        return (cu[None, :] - cu[:, None])[np.triu_indices(cu.size, 1)]
    return np.concatenate([cu[1:], np.diff(cu)])


def cap_candidates(batch: SpecBatch) -> list[int]:
    """The caps where the chunk planner's decisions change, sorted and all `>= 1`.

    For every run of whole requests (each prefix `cu[i]`, each request size and,
    for up to `MAX_SPAN_REQS` requests, every span `cu[j] - cu[i]`) the row
    count `b` gives `b - 1`, `b` and `b + 1`; then `1`, `2`, `N` and `N + 1`.
    """
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    n = int(cu[-1]) if cu.size else 0
    spans = _spans(cu)
    points = np.concatenate([spans - 1, spans, spans + 1, [1, 2, n, n + 1]])
    return sorted({int(c) for c in points if c >= 1})


def cap_kind(batch: SpecBatch, cap: int) -> str | None:
    """Which of `CAP_KINDS` a cap is for `batch` (the first that applies), or None."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    if cu.size < 2:
        return None
    spans = _spans(cu)
    if cap < int(np.diff(cu).max()):
        return BELOW_LARGEST
    if cap >= int(cu[-1]):
        return ONE_CHUNK
    if (spans == cap).any():
        return AT_BOUNDARY
    if (np.abs(spans - cap) == 1).any():
        return NEAR_BOUNDARY
    return None


def chunk_caps(batch: SpecBatch) -> st.SearchStrategy[int]:
    """Caps `>= 1` on rows per chunk for `batch`, at and around its request boundaries.

    One draw in four each: the row count of a run of whole requests (a chunk ends
    exactly at a request boundary); a cap below the largest request (when one has
    two rows or more); a cap one row off a run of whole requests (else one of
    `cap_candidates(batch)`); any value in `[1, N + 2]`.
    Labels the draw with its kind (`cap_kind`) and the number of chunks planned.
    Shrinks towards the smallest run of whole requests.
    """
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    n = int(batch.num_logits)
    spans = sorted({int(s) for s in _spans(cu)}) or [1]
    largest = int(np.diff(cu).max()) if cu.size >= 2 else 1
    near = sorted({s + d for s in spans for d in (-1, 1)} - set(spans))
    near = [c for c in near if largest <= c < n] or cap_candidates(batch)
    choices = [
        st.sampled_from(spans),
        st.integers(1, largest - 1) if largest >= 2 else st.sampled_from(spans),
        st.sampled_from(near),
        st.integers(1, n + 2),
    ]

    @st.composite
    def _caps(draw):
        cap = draw(choices[draw(st.integers(0, 3))])
        event(f"chunk cap: {cap_kind(batch, cap)}")
        if cu.size >= 2:
            chunks = sum(1 for _ in iter_request_chunks(cu.astype(np.int32), cap))
            event(f"chunks planned: {min(chunks, 5)}{'+' if chunks >= 5 else ''}")
        return cap

    return _caps()
