"""Chunked verification (SPEC section 7): the planner, batch slicing and the chunked driver.

Imports only the batch contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .batch import REQUEST_FIELDS, ROW_FIELDS, LogprobsTensors, SamplerOutput, SpecBatch

DEFAULT_CAP_BYTES = 2**30


def max_chunk_logits(vocab_size: int, cap_bytes: int = DEFAULT_CAP_BYTES) -> int:
    """Rows of FP32 processed logits that fit in `cap_bytes`: `max(1, cap_bytes // (V * 4))`."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    return max(1, int(cap_bytes) // (int(vocab_size) * 4))


def iter_request_chunks(cu_num_logits, max_chunk_logits: int) -> Iterator[tuple[int, int]]:
    """Yield request ranges `(start, end)` covering `[0, R)` in order.

    Greedy: each range takes requests while its rows stay within the cap, and
    always at least one request. For contiguous partitions under a cap, greedy
    maximal ranges are also the fewest possible (an exchange argument: the
    greedy k-th range ends no earlier than the k-th range of any valid partition).
    """
    if max_chunk_logits < 1:
        raise ValueError(f"max_chunk_logits must be >= 1, got {max_chunk_logits}")
    cu = np.asarray(cu_num_logits, dtype=np.int64)
    num_reqs = cu.shape[0] - 1
    start = 0
    while start < num_reqs:
        # Largest end with cu[end] - cu[start] <= cap; cu is strictly increasing.
        end = int(np.searchsorted(cu, cu[start] + max_chunk_logits, side="right")) - 1
        end = min(max(end, start + 1), num_reqs)
        yield start, end
        start = end


def slice_batch(batch: SpecBatch, start: int, end: int) -> SpecBatch:
    """Requests `[start, end)` as a batch of their own (cu rebased; the explicit noise sliced with
    its rows and requests; draft logits stay indexed by state)."""
    cu = np.asarray(batch.cu_num_logits)
    lo, hi = int(cu[start]), int(cu[end])
    return batch.replace(
        cu_num_logits=(cu[start : end + 1] - cu[start]).astype(cu.dtype),
        **take_rows_and_requests(batch, slice(lo, hi), slice(start, end)),
    )


def select_requests(batch: SpecBatch, reqs) -> SpecBatch:
    """A batch of the given requests, in the given order (rows and the explicit noise gathered, cu rebuilt)."""
    reqs = [int(r) for r in reqs]
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    rows = np.concatenate([np.arange(cu[r], cu[r + 1]) for r in reqs]) if reqs else np.zeros(0, np.int64)
    sizes = np.array([cu[r + 1] - cu[r] for r in reqs], dtype=np.int64)
    new_cu = np.concatenate([[0], np.cumsum(sizes)]).astype(batch.cu_num_logits.dtype)
    return batch.replace(cu_num_logits=new_cu,
                         **take_rows_and_requests(batch, rows, np.asarray(reqs, dtype=np.int64)))


def take_rows_and_requests(batch: SpecBatch, rows, reqs) -> dict:
    """Every per-row field indexed by `rows` and every per-request field by `reqs` (a slice or an
    index array each; SPEC section 7), dtypes kept; optional fields that are None stay None."""
    out = {}
    for fields, index in ((ROW_FIELDS, rows), (REQUEST_FIELDS, reqs)):
        for name in fields:
            a = getattr(batch, name)
            out[name] = None if a is None else np.asarray(a)[index]
    return out


def concat_outputs(parts: list[SamplerOutput], batch: SpecBatch) -> SamplerOutput:
    """Concatenate per-chunk outputs of consecutive request ranges of `batch`."""
    k1 = batch.num_speculative_steps + 1
    if not parts:
        return empty_output(batch)
    logprobs = None
    if batch.num_logprobs is not None:
        logprobs = LogprobsTensors.cat([p.logprobs for p in parts], batch.cu_num_logits)
    nodes = None
    if batch.tree:  # SPEC 4c: the accepted path's nodes, local to each request
        nodes = np.concatenate([p.accepted_nodes.reshape(-1, k1 - 1) for p in parts], axis=0)
    return SamplerOutput(
        sampled=np.concatenate([p.sampled.reshape(-1, k1) for p in parts], axis=0),
        num_sampled=np.concatenate([p.num_sampled for p in parts], axis=0),
        logprobs=logprobs,
        accepted_nodes=nodes,
    )


def empty_output(batch: SpecBatch) -> SamplerOutput:
    """The output of a batch with no requests."""
    k = batch.num_logprobs
    logprobs = None
    if k is not None:
        logprobs = LogprobsTensors(
            token_ids=np.zeros((0, k + 1), np.int64),
            logprobs=np.zeros((0, k + 1), np.float32),
            ranks=np.zeros(0, np.int64),
            cu_num_generated_tokens=None,
        )
    return SamplerOutput(
        sampled=np.zeros((0, batch.num_speculative_steps + 1), np.int64),
        num_sampled=np.zeros(0, np.int32),
        logprobs=logprobs,
        accepted_nodes=np.zeros((0, batch.num_speculative_steps), np.int32) if batch.tree else None,
    )


def verify_chunked(
    batch: SpecBatch,
    verify: Callable[[SpecBatch], SamplerOutput],
    max_chunk_logits: int,
) -> SamplerOutput:
    """Verify `batch` chunk by chunk with `verify` and concatenate (SPEC section 7)."""
    parts = [
        verify(slice_batch(batch, start, end))
        for start, end in iter_request_chunks(batch.cu_num_logits, max_chunk_logits)
    ]
    return concat_outputs(parts, batch)
