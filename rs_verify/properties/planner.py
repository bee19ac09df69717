"""Chunk planner properties (SPEC section 7): cover, no split, cap, maximality, minimality."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..contract.chunking import iter_request_chunks
from .registry import PropertyFailure, register


def _cu_and_caps(ctx):
    sizes = st.lists(st.integers(1, 9), min_size=0, max_size=12)

    def with_cap(sizes):
        cu = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        total = int(cu[-1])
        return st.tuples(st.just(cu), st.integers(1, total + 2))

    return sizes.flatmap(with_cap)


def min_chunks(cu: np.ndarray, cap: int) -> int:
    """Fewest contiguous capped ranges (brute-force dynamic programme, for small R)."""
    r = len(cu) - 1
    best = [0] + [r + 1] * r
    for end in range(1, r + 1):
        for start in range(end):
            if end - start == 1 or cu[end] - cu[start] <= cap:
                best[end] = min(best[end], best[start] + 1)
    return best[r]


def check_plan(cu, cap: int, chunks: list[tuple[int, int]]) -> None:
    """Raise PropertyFailure unless `chunks` is the SPEC section 7 plan of `cu` under `cap`."""
    cu = np.asarray(cu, dtype=np.int64)
    r = len(cu) - 1
    where = f"cu_num_logits={cu.tolist()}, max_chunk_logits={cap}, chunks={chunks}"
    if r == 0:
        if chunks:
            raise PropertyFailure(f"R = 0 must yield no chunk; {where}")
        return
    if not chunks or chunks[0][0] != 0 or chunks[-1][1] != r:
        raise PropertyFailure(f"chunks do not cover [0, {r}); {where}")
    for (s0, e0), (s1, _) in zip(chunks, chunks[1:]):
        if e0 != s1:
            raise PropertyFailure(f"chunks not contiguous and ordered at {e0} -> {s1}; {where}")
    for s, e in chunks:
        if not 0 <= s < e <= r:
            raise PropertyFailure(f"empty or out-of-range chunk ({s}, {e}); {where}")
        rows = cu[e] - cu[s]
        if e - s > 1 and rows > cap:
            raise PropertyFailure(f"chunk ({s}, {e}) holds {rows} rows > cap {cap}; {where}")
        if e < r and cu[e + 1] - cu[s] <= cap:
            raise PropertyFailure(f"chunk ({s}, {e}) is not maximal: request {e} fits; {where}")
    best = min_chunks(cu, cap)
    if len(chunks) != best:
        raise PropertyFailure(f"{len(chunks)} chunks where {best} suffice; {where}")


@register("planner", "planner", strategy=_cu_and_caps, cost=10, self_check=True,
          why_kept=("Checks the chunk planner itself (rs_verify.contract.chunking), which no sampler mutant patches: "
                    "it guards the contract that chunked samplers and the reference share (no split, cap, maximal, "
                    "minimal)."))
def planner(ctx, drawn) -> None:
    """iter_request_chunks: ordered cover of [0, R), no split, cap unless one request, maximal, minimal."""
    cu, cap = drawn
    check_plan(cu, cap, list(iter_request_chunks(cu, cap)))
