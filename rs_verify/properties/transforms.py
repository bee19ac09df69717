"""Batch transformations the properties use: merging with unrelated requests, reseeded copies."""

from __future__ import annotations

import contextlib

import numpy as np

from ..harness.failure import PropertyFailure
from ..contract.batch import REQUEST_FIELDS, ROW_FIELDS, STATE_FIELDS, SpecBatch
from ..contract.chunking import select_requests


def merge_unrelated(batch: SpecBatch, rng: np.random.Generator) -> tuple[SpecBatch, list[int]]:
    """`batch` interleaved with unrelated requests (own states, seeds, positions, logits and
    explicit noise; the batch's own noise moves with its rows and requests).

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
        **fresh_noise(batch, rng),
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
    """Requests of `a` then `b` (their rows, their explicit noise); both share the state arrays of `a`."""
    cu = np.concatenate([a.cu_num_logits, a.cu_num_logits[-1] + b.cu_num_logits[1:]]).astype(np.int32)
    joined = {}
    for name in (*ROW_FIELDS, *REQUEST_FIELDS):
        x, y = getattr(a, name), getattr(b, name)
        joined[name] = None if x is None else np.concatenate([x, y])
    return a.replace(cu_num_logits=cu, **joined)


def fresh_noise(batch: SpecBatch, rng: np.random.Generator) -> dict:
    """New explicit noise (SPEC section 3c) for each noise field `batch` carries, of the same shape:
    what fresh seeds are to the in-kernel families. Uniforms are multiples of `2**-53` in `(0, 1)`;
    the Gumbel noise is `-log(-log U)` of such uniforms (finite)."""
    out = {}
    for name in batch.noise_carried():
        shape = np.shape(getattr(batch, name))
        u = rng.integers(1, 2**53, size=shape, dtype=np.int64).astype(np.float64) * 2.0**-53
        out[name] = -np.log(-np.log(u)) if name == "resample_gumbel" else u
    return out


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
    shifted positions, fresh explicit noise when the batch carries it, same logits and
    temperatures): more stochastic decisions per example."""
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
            **fresh_noise(batch, rng),
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
