"""Equivalence properties (SPEC sections 7 and 8): chunked == full, black-box chunking,
batch invariance (alone, split, permuted and merged) and determinism, all bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..contract import methods
from ..contract.chunking import iter_request_chunks, select_requests, slice_batch, verify_chunked
from .assertions import as_declared, assert_same_output, assert_same_request, call, event
from .inputs import batch_and_cap, decision_rich
from .memory import large_batch
from .registry import register
from .transforms import merge_unrelated


def _full(ctx, batch):
    return call(ctx.sampler, batch, max_chunk_logits=max(1, batch.num_logits))


@register("chunked_equals_full", "equivalence", strategy=batch_and_cap, needs=("chunking",), cost=120,
          why_kept="Internal chunking against the full batch, bit for bit, at every cap.")
def chunked_equals_full(ctx, drawn) -> None:
    """Internal chunking at any cap gives the full-batch output bit for bit (every field)."""
    # Besides the drawn cap, every example also runs one row below its largest request (SPEC
    # section 7: such a request is still verified whole, as a chunk of its own), the cap a
    # planner that cuts requests gets wrong; the drawn caps cover request boundaries.
    batch, cap = drawn
    largest = int(np.diff(np.asarray(batch.cu_num_logits, dtype=np.int64)).max(initial=0))
    caps = [cap] + ([largest - 1] if largest >= 2 and cap >= largest else [])
    full = _full(ctx, batch)
    for c in caps:
        chunks = list(iter_request_chunks(batch.cu_num_logits, c))
        event(f"chunks: {min(len(chunks), 5)}{'+' if len(chunks) >= 5 else ''}")
        out = call(ctx.sampler, batch, max_chunk_logits=c)
        assert_same_output(out, full, what=f"max_chunk_logits={c} vs one chunk", batch=batch)


@register("blackbox_chunking", "equivalence", strategy=batch_and_cap, cost=100,
          why_kept=("Chunking from outside, for samplers without internal chunking; it also sees "
                    "batch-size-dependent numerics (sub-batches are smaller batches)."))
def blackbox_chunking(ctx, drawn) -> None:
    """Each planned chunk verified as a batch of its own, concatenated, equals the full batch."""
    batch, cap = drawn
    out = verify_chunked(batch, lambda sub: _full(ctx, sub), cap)
    assert_same_output(out, _full(ctx, batch), what=f"sub-batches of cap {cap} vs full batch", batch=batch)


def _batch_and_seed(ctx):
    return st.tuples(decision_rich(ctx), st.integers(0, 2**32 - 2))


def split_parts(r: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random partition of `r` requests: one request alone, the others in one or two parts."""
    if r <= 1:
        return [np.arange(r)]
    order = rng.permutation(r)
    rest = order[1:]
    label = rng.integers(0, 2, len(rest)) if rng.random() < 0.5 else np.zeros(len(rest), np.int64)
    return [order[:1]] + [rest[label == k] for k in (0, 1) if (label == k).any()]


@register("batch_invariance", "equivalence", strategy=_batch_and_seed, cost=110,
          why_kept=("Alone, split, permuted and merged: neither the streams nor the numerics may depend on the batch "
                    "row, the batch size or the other requests."))
def batch_invariance(ctx, drawn) -> None:
    """Each request is bit-identical in its batch, alone, split off, and permuted among unrelated requests."""
    # Every example runs the request in batches of very different sizes: alone (n_r + 1 rows), in
    # its drawn batch, and interleaved with as many unrelated requests (twice the rows, another
    # order). A sampler whose kernels or block sizes change with the batch's size, order or
    # contents then shows it whatever the threshold it switches at.
    batch, seed = drawn
    rng = np.random.default_rng(seed)
    full = _full(ctx, batch)
    merged, where = merge_unrelated(batch, rng)
    out = _full(ctx, merged)
    for old, new in enumerate(where):
        assert_same_request(out, merged, new, full, batch, old, what="permuted batch merged with unrelated requests",
                            batch=batch)
    parts = split_parts(batch.num_reqs, rng)
    event(f"split into {len(parts)} part(s)")
    for part in parts:
        sub = select_requests(batch, part)
        out = _full(ctx, sub)
        for new, old in enumerate(part):
            what = "request alone" if len(part) == 1 else "split batch"
            assert_same_request(out, sub, new, full, batch, int(old), what=what, batch=batch)


@register("determinism", "equivalence", strategy=_batch_and_seed, cost=70,
          why_kept="Gates atomics, races, uninitialised memory and hidden global random state.")
def determinism(ctx, drawn) -> None:
    """Repeated runs on the same input are bit-identical, with the global random generators reseeded between them."""
    # Hypothesis seeds `random` and NumPy's global generator before each example, so two calls
    # inside one example would see the same global state: a sampler drawing from it would pass.
    # Each call gets its own seed of Python's, NumPy's and torch's global generators instead
    # (set in the sampler's process; rs_verify.harness.guards).
    batch, seed = drawn
    first = call(ctx.sampler, batch, reseed=seed)
    second = call(ctx.sampler, batch, reseed=seed + 1)
    assert_same_output(second, first, what="second run vs first run (global generators reseeded between them)",
                       batch=batch)


# A batch with more requests and rows than the strategies draw (R <= 6 on CPU), sized so that each
# profile can afford a few calls on its device: (requests, draft steps, vocabulary, calls). Races
# between programs and uninitialised memory show on large grids (the gpu profile: Qwen's
# vocabulary); through the Triton interpreter, where programs run one at a time (~1 s a call at
# the ci size, ~6 s with 16-wide vocabulary blocks), it still catches state leaking between calls.
LARGE = {"dev": (16, 4, 256, 2), "ci": (16, 4, 256, 2), "gpu": (64, 8, 152064, 3), "nightly": (64, 8, 4096, 4)}


def with_block_and_params(batch, seed: int = 23):
    """`batch` verified as blocks (SPEC 4b) with sampling parameters (SPEC 2) on three states in four:
    top-k, top-p and min-p alone and together, so the threshold searches run on the large grid too."""
    rng = np.random.default_rng(seed)
    s = batch.num_states
    which = rng.integers(0, 4, s)  # 0: none, 1: top-k, 2: top-p, 3: all three
    top_k = np.where((which == 1) | (which == 3), rng.integers(1, max(2, batch.vocab_size // 4), s), 0)
    top_p = np.where(which >= 2, rng.uniform(0.3, 0.95, s), 1.0)
    min_p = np.where(which == 3, rng.uniform(0.01, 0.2, s), 0.0)
    return batch.replace(verification=methods.BLOCK.name, top_k=top_k.astype(np.int32), top_p=top_p.astype(np.float32),
                         min_p=min_p.astype(np.float32))


@register("determinism_large_batch", "equivalence", cost=130,
          why_kept=("Races between programs and uninitialised memory show on grids larger than the strategies draw; "
                    "the only property that repeats one large batch."))
def determinism_large_batch(ctx, _drawn) -> None:
    """Repeats of one large batch (model drafts, processed logprobs; then blocks and sampling parameters) are bit-identical."""
    r, k, v, calls = LARGE.get(ctx.profile, LARGE["dev"])
    plain = large_batch(r=r, k=k, v=v, seed=17)
    batches = [as_declared(plain, ctx.sampler)]
    rich = as_declared(with_block_and_params(plain), ctx.sampler)
    if rich.verification == methods.BLOCK.name or rich.sampling_params_on():  # what the sampler declares of them
        batches.append(rich)
    for batch in batches:
        first = call(ctx.sampler, batch, reseed=1)
        for i in range(1, calls):
            again = call(ctx.sampler, batch, reseed=1 + i)
            # No batch on the failure: a fixed input replays from its seed (a bundle stays small).
            assert_same_output(again, first, what=f"run {i + 1} vs run 1 of {batch.summary()}", batch=None)
