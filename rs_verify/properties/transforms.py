"""Batch transformations the properties use: merging with unrelated requests, reseeded copies."""

from __future__ import annotations

import contextlib

import numpy as np

from ..harness.failure import PropertyFailure
from ..contract.batch import STATE_FIELDS, SpecBatch
from ..contract.chunking import select_requests


def merge_unrelated(batch: SpecBatch, rng: np.random.Generator) -> tuple[SpecBatch, list[int]]:
    """`batch` interleaved with unrelated requests (own states, seeds, positions and logits).

    Returns the merged batch and, for each original request, its index in the merged one.
    """
    s, r = batch.num_states, batch.num_reqs
    v = batch.effective_vocab_size
    tl = np.array(batch.target_logits)
    tl[:, :v] = tl[:, rng.permutation(v)]  # other contents, same magnitudes: stays valid
    pos = np.asarray(batch.pos)
    shift = int(rng.integers(1, 2**20))
    other = batch.replace(
        target_logits=tl,
        pos=np.where(pos > 2**62, pos - shift, pos + shift).astype(np.int64),
        idx_mapping=(np.asarray(batch.idx_mapping) + s).astype(np.int32),
    )
    states = dict(
        tiled_states(batch, 2),
        seeds=np.concatenate([batch.seeds, rng.integers(-(2**63), 2**63 - 1, s, dtype=np.int64, endpoint=True)]),
    )
    both = _concat_batches(batch.replace(**states), other)
    order = rng.permutation(2 * r)
    merged = select_requests(both, order)
    where = {int(o): i for i, o in enumerate(order)}
    return merged, [where[i] for i in range(r)]


def _concat_batches(a: SpecBatch, b: SpecBatch) -> SpecBatch:
    """Requests of `a` then `b`; both share the state arrays of `a`."""
    cu = np.concatenate([a.cu_num_logits, a.cu_num_logits[-1] + b.cu_num_logits[1:]]).astype(np.int32)
    return a.replace(
        target_logits=np.concatenate([a.target_logits, b.target_logits]),
        draft_token_ids=np.concatenate([a.draft_token_ids, b.draft_token_ids]),
        pos=np.concatenate([a.pos, b.pos]),
        cu_num_logits=cu,
        idx_mapping=np.concatenate([a.idx_mapping, b.idx_mapping]).astype(np.int32),
    )


def copies_note(drawn: SpecBatch) -> str:
    """How to read request indices of a failure found on `reseeded_copies(drawn, ...)`."""
    r = drawn.num_reqs
    return (f" (checked on the drawn batch followed by reseeded copies of it: request i there is "
            f"drawn request i mod {r}, under a fresh seed and shifted positions when i >= {r})")


@contextlib.contextmanager
def reported_on(drawn: SpecBatch):
    """A `PropertyFailure` raised on `reseeded_copies(drawn, ...)`, re-raised on `drawn` with `copies_note`."""
    try:
        yield
    except PropertyFailure as exc:
        raise PropertyFailure(f"{exc}{copies_note(drawn)}", batch=drawn, details=exc.details) from None


def reseeded_copies(batch: SpecBatch, copies: int, seed: int) -> SpecBatch:
    """`batch` followed by `copies - 1` copies of its requests under fresh states (new seeds,
    shifted positions, same logits and temperatures): more stochastic decisions per example."""
    if copies <= 1 or batch.num_reqs == 0:
        return batch
    rng = np.random.default_rng(seed)
    s = batch.num_states
    out = batch
    pos = np.asarray(batch.pos)
    for c in range(1, copies):
        shift = int(rng.integers(1, 2**20))
        other = batch.replace(
            pos=np.where(pos > 2**62, pos - shift, pos + shift).astype(np.int64),
            idx_mapping=(np.asarray(batch.idx_mapping) + c * s).astype(np.int32),
        )
        out = _concat_batches(out, other)
    return out.replace(
        **tiled_states(batch, copies),
        seeds=np.concatenate([batch.seeds] + [rng.integers(-(2**63), 2**63 - 1, s, dtype=np.int64, endpoint=True)
                                              for _ in range(copies - 1)]),
    )


def tiled_states(batch: SpecBatch, copies: int) -> dict:
    """Every per-state array of `batch` but the seeds (SPEC section 1: temperature, the sampling
    parameters, draft logits) repeated `copies` times: state `s + c * S` is a copy of state `s`."""
    out = {}
    for name in (*STATE_FIELDS, "draft_logits"):
        if name == "seeds":  # the copies' own seeds: drawn by the caller
            continue
        a = getattr(batch, name)
        out[name] = None if a is None else np.concatenate([a] * copies)
    return out
