"""Edge cases the generated batches cannot reach (SPEC sections 2 and 3), as fixed campaigns.

- `stream_edges`: the SPEC clamps every uniform to `TINY` and asks for an accurate
  `log(1 - v)`. Both only matter at rare stream values: `rand(seed, pos) == 0` happens for 2
  in 2**32 Philox words, `v < 2**-25` (where `1 - v` rounds to 1 in float32) for about 130 in
  2**32. Random seeds and positions never hit them, so a sampler that skips the clamp or
  writes `log(1 - v)` passes every generated batch. The sampler's stream family holds such
  points (`StreamFamily.edges`, found by an exhaustive scan of its stream); the campaign builds
  requests whose decision flips exactly there and certifies the sampler against the reference.
  A family whose noise uniforms reach 1 (murmur3: `u = 1.0` for 128 of the 2**32 hashes) floors
  `1 - u` at `2**-24`, so that token keeps the finite noise `-log(24 log 2)`; its `edges.top_noise`
  point gets one more request, where that token wins by its logit alone and a sampler without
  the floor (`G = -inf`) emits another.
- `tiny_temperatures`: SPEC section 2 makes only `T == 0` greedy. The batch strategies draw
  `T` in `[0.05, 4]`, so a sampler that treats `T <= 1e-5` as greedy (vLLM's `_SAMPLING_EPS`)
  is never caught by certification, whose tolerance `eps * L` grows with `|log p|` of the
  compared tokens (`1 / T` for every token below a tied maximum). Here
  rows have exactly tied maxima and every other logit `1 / T` below them: `p` is exactly
  uniform over the ties in float32 and float64 alike, so every decision can be compared with
  the reference on the natural scale of its margin (absolute tolerance `1e-4`).

Both check that they are not vacuous: the stream values are recomputed and the reference's
own decisions must take the edge (a rejection, a non-lowest tied token), otherwise the
campaign raises instead of passing.
"""

from __future__ import annotations

import numpy as np

from ..contract.batch import SpecBatch
from ..contract.streams import StreamEdges
from ..contract.triton_philox import TRITON_PHILOX
from .assertions import call, within_bound
from .registry import PropertyFailure, register
from .certification import compare_decisions

# The triton-philox family's edges: rand(seed, pos) == 0 (u = TINY), and a resample uniform
# rand(randint(seed, pos), 3) = 1.2107193e-08 < 2**-25 (1 - v == 1 in float32).
U_ZERO = TRITON_PHILOX.edges.zero_uniform
TINY_V = TRITON_PHILOX.edges.tiny_noise
EDGE_VOCAB = 8
MARGIN_ATOL = 1e-4  # absolute, in log units: tiny_temperatures' decisions are O(1) apart
TINY_TEMPERATURES = (1e-5, 5e-6, 1e-6, 1e-7)
TINY_T_REQUESTS = 32
TINY_T_VOCAB = 6


TOP_NOISE_GAP = 40.0  # the top-noise token's logit above the others': it wins with G = -log(24 log 2) ~ -2.8


def edge_batch(draft_mode: str, edges: StreamEdges = TRITON_PHILOX.edges) -> SpecBatch:
    """Request 0: one draft, rejected only because u = TINY (p(d) / q(d) ~ e**-30 < TINY), at the
    zero-uniform point of `edges`. Request 1: no draft; its bonus row's token at the tiny-noise
    point has logit -40 and the tiny noise v, so it must lose (G ~ 18 < 40). Request 2, when the
    family has a top-noise point: no draft; its bonus row's token there has logit 0 and every
    other -40, so it wins with its floored finite noise (any other's `G` is below 23) and loses
    only where its noise is `-inf`."""
    (s0, p0), (s1, p1, tok) = edges.zero_uniform, edges.tiny_noise
    top = edges.top_noise
    v = max(EDGE_VOCAB, tok + 1, top[2] + 1 if top else 0)
    reqs = 3 if top else 2
    x = np.zeros((reqs + 1, v), np.float32)
    x[0] = -1.0
    x[0, 0] = 0.0
    x[0, 1] = -30.0  # the draft d = 1: p(d) ~ 1e-14 < TINY
    x[1] = np.linspace(-2.0, 0.0, v, dtype=np.float32)
    x[2, tok] = -40.0
    if top:
        x[3] = -TOP_NOISE_GAP
        x[3, top[2]] = 0.0
    draft_logits = None
    if draft_mode == "model":
        draft_logits = np.full((reqs, 1, v), -5.0, np.float32)
        draft_logits[0, 0, 1] = 0.0  # q(d) ~ 0.95
    ids = np.zeros(reqs + 1, np.int64)
    ids[1] = 1  # row 0 verifies ids[1] = 1
    return SpecBatch(
        target_logits=x,
        draft_logits=draft_logits,
        draft_token_ids=ids,
        cu_num_logits=np.array([0, 2, 3, 4][: reqs + 1], np.int32),
        pos=np.array([p0, p0 + 1, p1] + ([top[1]] if top else []), np.int64),
        idx_mapping=np.arange(reqs, dtype=np.int32),
        temperature=np.ones(reqs, np.float32),
        seeds=np.array([s0, s1] + ([top[0]] if top else []), np.int64),
        num_speculative_steps=1,
    )


@register("stream_edges", "edges", needs=("certifiable_streams", "seeded_streams", "reference"), cost=50,
          why_kept=("Zero and tiny uniforms occur 2 and ~130 times in 2**32 draws: no generated batch reaches them, "
                    "so the TINY clamp and the accurate log(1 - v) are guarded here alone."))
def stream_edges(ctx, _drawn) -> None:
    """At the stream family's edge points (a zero uniform, a tiny Gumbel uniform, a floored top noise uniform
    where the family has one) every decision equals the reference's."""
    family, oracle = ctx.record.family, ctx.oracle
    if family.edges is None:
        raise PropertyFailure(f"stream family {family.name!r} names no edge points (StreamFamily.edges): the clamp "
                              "and the accurate log(1 - v) cannot be planted")
    tok = family.edges.tiny_noise[2]
    top = family.edges.top_noise
    where = (f"u = 0 clamped to TINY at request 0, v at {family.edges.tiny_noise} below 2**-25 at request 1"
             + (f", the largest noise uniform at {top} (1 - u floored at 2**-24) at request 2" if top else ""))
    for mode in [m for m in ("one_hot", "model") if m in ctx.record.draft_modes]:
        batch = within_bound(edge_batch(mode, family.edges), ctx.sampler)  # SPEC 10: within a declared bound
        ref_out, traces = oracle.verify_with_trace(batch)
        if (ref_out.request(0)[:1] == [1] or ref_out.request(1) == [tok]
                or (top is not None and ref_out.request(2) != [top[2]])):
            raise AssertionError(f"stream_edges ({mode}): the reference no longer takes the edge: "
                                 f"{[ref_out.request(r) for r in range(batch.num_reqs)]}")
        out = call(ctx.sampler, batch)
        found = compare_decisions(batch, out, traces).failed
        if found:
            raise PropertyFailure(f"{mode} drafts at {family.name} edge values ({where}): "
                                  + "; ".join(d.describe() for d in found), batch=batch)


def tiny_temperature_batch(seed: int = 20261201) -> SpecBatch:
    """`TINY_T_REQUESTS` requests with one draft each, T from `TINY_TEMPERATURES`; every row has
    2-3 exactly tied maxima (logit 0) and every other logit -1; drafts are mostly tied tokens."""
    rng = np.random.default_rng(seed)
    r, v = TINY_T_REQUESTS, TINY_T_VOCAB
    x = np.full((2 * r, v), -1.0, np.float32)
    ties = []
    for j in range(2 * r):
        tied = np.sort(rng.choice(v, int(rng.integers(2, 4)), replace=False))
        x[j, tied] = 0.0
        ties.append(tied)
    ids = np.zeros(2 * r, np.int64)
    for q in range(r):
        tied = ties[2 * q]
        others = np.setdiff1d(np.arange(v), tied)
        ids[2 * q + 1] = int(rng.choice(tied)) if rng.random() < 0.75 else int(rng.choice(others))
    pos = np.repeat(rng.integers(0, 2**40, r), 2) + np.tile([0, 1], r)
    return SpecBatch(
        target_logits=x,
        draft_logits=None,
        draft_token_ids=ids,
        cu_num_logits=(np.arange(r + 1) * 2).astype(np.int32),
        pos=pos.astype(np.int64),
        idx_mapping=rng.permutation(r).astype(np.int32),
        temperature=np.array([TINY_TEMPERATURES[i % len(TINY_TEMPERATURES)] for i in range(r)], np.float32),
        seeds=rng.integers(-(2**63), 2**63 - 1, r, dtype=np.int64, endpoint=True),
        num_speculative_steps=1,
    )


def _divergence(trace, drafts, prod: list) -> str | None:
    """The first decision where `prod` leaves the reference's tokens beyond MARGIN_ATOL, or None."""
    ref = list(trace.tokens)
    for i in range(max(len(ref), len(prod))):
        tr = ref[i] if i < len(ref) else None
        tp = prod[i] if i < len(prod) else None
        if tr == tp:
            continue
        acc = next((d for d in trace.decisions if d.step == i and d.kind == "accept"), None)
        if acc is not None and acc.accepted != (tp == int(drafts[i])):
            if abs(acc.margin) <= MARGIN_ATOL:
                return None
            return (f"step {i}: acceptance of draft {drafts[i]} differs (reference {tr}, sampler {tp}, "
                    f"margin {acc.margin:.4g})")
        arg = next((d for d in trace.decisions if d.step == i and d.kind == "argmax"), None)
        gap = float(arg.gaps[tp]) if arg is not None and tp is not None and 0 <= tp < len(arg.gaps) else np.inf
        if gap <= MARGIN_ATOL:
            return None
        return f"step {i}: reference token {tr}, sampler token {tp} (its gap below the best score: {gap:.4g})"
    return None


@register("tiny_temperatures", "edges", needs=("certifiable_streams", "reference", "one_hot_drafts"), cost=60,
          why_kept=("The strategies draw T >= 0.05: temperatures in (0, 1e-5], where exact ties decide, are only "
                    "checked here."))
def tiny_temperatures(ctx, _drawn) -> None:
    """Temperatures in (0, 1e-5] sample among exactly tied maxima like the reference (only T == 0 is greedy)."""
    batch = within_bound(tiny_temperature_batch(), ctx.sampler)  # logits of -1 at T = 1e-7: -1e7 processed
    ref_out, traces = ctx.oracle.verify_with_trace(batch)
    x = np.asarray(batch.target_logits)
    lowest = [int(np.flatnonzero(row == row.max())[0]) for row in x]
    cu = np.asarray(batch.cu_num_logits)
    # Not vacuous: greedy would emit the lowest tied token and accept only it; the reference must not.
    off_lowest = sum(ref_out.request(r)[-1] != lowest[int(cu[r]) + ref_out.num_sampled[r] - 1]
                     for r in range(batch.num_reqs))
    if off_lowest < 4:
        raise AssertionError(f"tiny_temperatures: only {off_lowest} reference tokens avoid the lowest tie: vacuous")
    out = call(ctx.sampler, batch)
    for trace in traces:
        r = trace.request
        msg = _divergence(trace, batch.draft_tokens(r), out.request(r))
        if msg:
            t = float(batch.temperature[int(batch.idx_mapping[r])])
            raise PropertyFailure(f"request {r} (T = {t:g}, tied maxima): {msg}", batch=batch)
