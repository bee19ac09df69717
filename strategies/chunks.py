"""Chunk caps (`max_chunk_logits`) for chunked verification (SPEC section 7).

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rs_verify.spec.batch import SpecBatch

MAX_SPAN_REQS = 64  # beyond this many requests, only prefixes and single requests give candidates


def cap_candidates(batch: SpecBatch) -> list[int]:
    """The caps where the chunk planner's decisions change, sorted and all `>= 1`.

    For every run of whole requests (each prefix `cu[i]`, each request size and,
    for up to `MAX_SPAN_REQS` requests, every span `cu[j] - cu[i]`) the row
    count `b` gives `b - 1`, `b` and `b + 1`; then `1`, `2`, `N` and `N + 1`.
    """
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    n = int(cu[-1]) if cu.size else 0
    r = cu.size - 1
    if r <= MAX_SPAN_REQS:
        spans = (cu[None, :] - cu[:, None])[np.triu_indices(cu.size, 1)]
    else:
        spans = np.concatenate([cu[1:], np.diff(cu)])
    points = np.concatenate([spans - 1, spans, spans + 1, [1, 2, n, n + 1]])
    return sorted({int(c) for c in points if c >= 1})


def chunk_caps(batch: SpecBatch) -> st.SearchStrategy[int]:
    """Caps `>= 1` on rows per chunk for `batch`, biased to request boundaries.

    Mostly one of `cap_candidates(batch)`; one draw in four, any value in
    `[1, N + 2]`. Shrinks towards 1 (one request per chunk).
    """
    candidates = st.sampled_from(cap_candidates(batch))
    anything = st.integers(1, int(batch.num_logits) + 2)

    @st.composite
    def _caps(draw):
        return draw(anything if draw(st.integers(0, 3)) == 3 else candidates)

    return _caps()
