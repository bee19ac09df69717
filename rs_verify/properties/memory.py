"""Memory properties (SPEC section 7): the processed-logits buffer stays within the cap (one request
larger than the cap is still a chunk of its own), and the peak device memory beside it."""

from __future__ import annotations

import numpy as np

from ..contract.batch import SpecBatch
from ..contract.chunking import iter_request_chunks
from .assertions import as_declared, call, call_with_report, event
from .registry import PropertyFailure, register
from .inputs import batch_and_cap


SELF_REPORTED = "relies on the sampler's self-reported extras['max_buffer_rows'] (not measured by the suite)"


def buffer_bound(batch: SpecBatch, cap: int) -> tuple[int, int | None]:
    """SPEC section 7's bound on the processed-logits buffer at cap `cap`: `(rows, r)`.

    A planned chunk holds at most `cap` rows unless it is one request larger than the cap (a chunk
    holds at least one whole request: the seed's design), so the buffer may hold
    `max(cap, n_r + 1)` rows, `r` the largest such request (None when every chunk fits the cap)."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    bound, who = cap, None
    for a, b in iter_request_chunks(cu, cap):
        rows = int(cu[b] - cu[a])
        if rows > bound:  # more rows than the cap: a chunk of one request
            bound, who = rows, a
    return bound, who


@register("buffer_within_cap", "memory", strategy=batch_and_cap, needs=("chunking", "memory_stats"), cost=90,
          why_kept="The only property that sees memory: an over-sized processed-logits buffer changes no output.")
def buffer_within_cap(ctx, drawn) -> None:
    """The processed-logits buffer holds at most max(cap, n_r + 1) rows, n_r + 1 only for a request above the cap."""
    batch, cap = drawn
    ctx.stats["self_reported"] = SELF_REPORTED  # shown by the front ends next to the verdict
    out = call(ctx.sampler, batch, max_chunk_logits=cap)
    rows = out.extras.get("max_buffer_rows")
    if rows is None:
        raise PropertyFailure("the sampler reported no extras['max_buffer_rows']", batch=batch)
    bound, who = buffer_bound(batch, cap)
    event("buffer used" if rows else "no buffer")
    if who is not None:
        event("a request larger than the cap")
    if rows > bound:
        why = (f"max(max_chunk_logits = {cap}, n_r + 1 = {bound} rows of request {who}, a chunk of its own)"
               if who is not None else f"max_chunk_logits = {cap} (every planned chunk fits the cap)")
        raise PropertyFailure(f"processed-logits buffer of {rows} rows exceeds {why}, SPEC section 7 "
                              f"(as the sampler reports it in extras['max_buffer_rows'])", batch=batch)


SLACK_BYTES = 64 * 2**20  # allocator rounding, statistics and outputs: O(N) and O(R * K), not O(N * V)


def large_batch(r: int = 64, k: int = 4, v: int = 152064, seed: int = 5):
    """A Qwen-vocabulary batch with model drafts and processed logprobs (host arrays, ~200 MB)."""
    rng = np.random.default_rng(seed)
    n = r * (k + 1)
    return SpecBatch(
        target_logits=rng.standard_normal((n, v), dtype=np.float32),
        draft_logits=rng.standard_normal((r, k, v), dtype=np.float32),
        draft_token_ids=rng.integers(0, v, n).astype(np.int64),
        cu_num_logits=np.arange(0, n + 1, k + 1, dtype=np.int32),
        pos=rng.integers(0, 2**40, n).astype(np.int64),
        idx_mapping=rng.permutation(r).astype(np.int32),
        temperature=rng.uniform(0.5, 1.5, r).astype(np.float32),
        seeds=rng.integers(-(2**62), 2**62, r).astype(np.int64),
        num_speculative_steps=k,
        num_logprobs=5,
        logprobs_mode="processed",
    )


@register("peak_memory_within_cap", "memory", needs=("cuda", "chunking"), cost=250,
          why_kept="CUDA only (peak device memory of a Qwen-size batch): skipped on CPU.")
def peak_memory_within_cap(ctx, _drawn) -> None:
    """On CUDA, a chunked call's peak memory beyond its inputs is at most the cap + 64 MiB."""
    batch = as_declared(large_batch(), ctx.sampler)
    cap_bytes = 32 * 2**20
    cap_rows = max(1, cap_bytes // (batch.vocab_size * 4))
    drafts = 0 if batch.draft_logits is None else batch.draft_logits.nbytes
    inputs = batch.target_logits.nbytes + drafts  # float32 inputs on the device
    # Measured where the sampler runs (its child process when isolated): rs_verify.harness.guards.
    _out, report = call_with_report(ctx.sampler, batch, max_chunk_logits=cap_rows)
    if report.peak_bytes is None:
        raise PropertyFailure("no CUDA memory statistics from the sampler's process (it did not use CUDA)")
    extra = report.peak_bytes - inputs
    if extra > cap_bytes + SLACK_BYTES:
        raise PropertyFailure(
            f"peak extra device memory {extra / 2**20:.1f} MiB > cap {cap_bytes / 2**20:.0f} MiB + 64 MiB "
            f"(max_chunk_logits = {cap_rows}, {batch.summary()})"
        )
