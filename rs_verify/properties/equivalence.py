"""Equivalence properties (SPEC sections 7 and 8): chunked == full, black-box chunking,
batch invariance (permutation, split, merge) and determinism, all bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..spec.chunking import iter_request_chunks, select_requests, slice_batch, verify_chunked
from .base import assert_same_output, assert_same_request, call, event, register
from .inputs import batch_and_cap, batches, decision_rich
from .transforms import merge_unrelated


def _full(ctx, batch):
    return call(ctx.sampler, batch, max_chunk_logits=max(1, batch.num_logits))


@register("chunked_equals_full", "equivalence", strategy=batch_and_cap, needs=("chunking",))
def chunked_equals_full(ctx, drawn) -> None:
    """Internal chunking at any cap gives the full-batch output bit for bit (every field)."""
    batch, cap = drawn
    chunks = list(iter_request_chunks(batch.cu_num_logits, cap))
    event(f"chunks: {min(len(chunks), 5)}{'+' if len(chunks) >= 5 else ''}")
    out = call(ctx.sampler, batch, max_chunk_logits=cap)
    assert_same_output(out, _full(ctx, batch), what=f"max_chunk_logits={cap} vs one chunk", batch=batch)


@register("blackbox_chunking", "equivalence", strategy=batch_and_cap)
def blackbox_chunking(ctx, drawn) -> None:
    """Each planned chunk verified as a batch of its own, concatenated, equals the full batch."""
    batch, cap = drawn
    out = verify_chunked(batch, lambda sub: _full(ctx, sub), cap)
    assert_same_output(out, _full(ctx, batch), what=f"sub-batches of cap {cap} vs full batch", batch=batch)


def _batch_and_transform(ctx):
    return st.tuples(batches(ctx), st.sampled_from(["permute", "split", "merge"]), st.integers(0, 2**32 - 1))


@register("batch_invariance", "equivalence", strategy=_batch_and_transform)
def batch_invariance(ctx, drawn) -> None:
    """Permuting, splitting or merging the batch with unrelated requests leaves each request bit-identical."""
    batch, kind, seed = drawn
    event(f"transform: {kind}")
    rng = np.random.default_rng(seed)
    full = _full(ctx, batch)
    r = batch.num_reqs
    if kind == "permute":
        perm = rng.permutation(r)
        out = _full(ctx, select_requests(batch, perm))
        sub = select_requests(batch, perm)
        for new, old in enumerate(perm):
            assert_same_request(out, sub, new, full, batch, int(old), what="permuted batch", batch=batch)
    elif kind == "split":
        mask = rng.random(r) < 0.5
        for part in (np.flatnonzero(mask), np.flatnonzero(~mask)):
            sub = select_requests(batch, part)
            out = _full(ctx, sub)
            for new, old in enumerate(part):
                assert_same_request(out, sub, new, full, batch, int(old), what="split batch", batch=batch)
    else:
        merged, where = merge_unrelated(batch, rng)
        out = _full(ctx, merged)
        for old, new in enumerate(where):
            assert_same_request(out, merged, new, full, batch, old, what="merged batch", batch=batch)


@register("determinism", "equivalence", strategy=decision_rich)
def determinism(ctx, batch) -> None:
    """Repeated runs on the same input are bit-identical."""
    first = call(ctx.sampler, batch)
    assert_same_output(call(ctx.sampler, batch), first, what="second run vs first run", batch=batch)
