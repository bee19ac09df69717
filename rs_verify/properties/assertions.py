"""Assertions and sampler helpers every property shares: bit-exact comparisons and the checked call."""

from __future__ import annotations

import numpy as np
from hypothesis import event as _event
from hypothesis.errors import InvalidArgument

from ..harness import guards
from ..harness.failure import PropertyFailure
from ..harness.handle import as_sampler
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import concat_outputs, slice_batch
from ..contract.logit_bound import clamped
from .output_rules import check_output_invariants, checked_here, undeclared_hint


def request_view(out: SamplerOutput, batch: SpecBatch, r: int) -> dict:
    """Every output field of request `r` (its sampled row and its logprobs rows)."""
    view = {"sampled": out.sampled[r], "num_sampled": out.num_sampled[r : r + 1]}
    if out.logprobs is not None:
        lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
        for k, v in out.logprobs.fields().items():
            view[f"logprobs.{k}"] = v[lo:hi]
    return view


def first_difference(a: dict, b: dict) -> str | None:
    """Describe the first field where two name -> array mappings differ bit for bit."""
    if a.keys() != b.keys():
        return f"fields differ: {sorted(a)} vs {sorted(b)}"
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{name}: shape/dtype {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        xb = x.view(np.uint8) if x.size else x
        yb = y.view(np.uint8) if y.size else y
        if not np.array_equal(xb, yb):
            bad = np.argwhere(x != y) if x.dtype.kind != "f" else np.argwhere(x.view(np.uint32) != y.view(np.uint32))
            idx = tuple(int(i) for i in bad[0]) if bad.size else ()
            return f"{name}{list(idx)}: {x[idx] if idx else x} vs {y[idx] if idx else y}"
    return None


def assert_same_output(a: SamplerOutput, b: SamplerOutput, *, what: str, batch: SpecBatch) -> None:
    """Whole outputs bit-identical (SPEC section 8)."""
    if (a.logprobs is None) != (b.logprobs is None):
        raise PropertyFailure(f"{what}: logprobs present in one output only", batch=batch)
    diff = first_difference(a.arrays(), b.arrays())
    if diff:
        raise PropertyFailure(f"{what}: outputs differ at {diff}", batch=batch)


def assert_same_request(a, batch_a, ra, b, batch_b, rb, *, what: str, batch: SpecBatch) -> None:
    """Request `ra` of output `a` equals request `rb` of output `b`, bit for bit."""
    diff = first_difference(request_view(a, batch_a, ra), request_view(b, batch_b, rb))
    if diff:
        raise PropertyFailure(f"{what}: request {ra} (vs {rb}) differs at {diff}", batch=batch)


def call(sampler, batch: SpecBatch, **kw) -> SamplerOutput:
    """Call a sampler with a valid batch and check the output's types and shapes (SPEC section 5)
    and, for a batch `output_rules.checked_here` accepts, the output rules of SPEC sections 4-6
    (`output_rules.check_output_invariants`; `check=False` leaves them to the caller): whatever a
    property compares, an answer that breaks the contract fails it.

    Every call is observed (`rs_verify.harness.guards`): a sampler that modifies its input
    fails here, before any comparison of its output.
    """
    return call_with_report(sampler, batch, **kw)[0]


# The distribution campaigns verify 200,000 requests and more a batch (`distribution_batches.TRIALS`). A
# sampler whose adapter calls its library once per request (`rs_verify.adapters.per_request`: HF
# transformers costs about 0.4 ms a request on a CPU) needs some 80 s of a core for such a batch, near the
# 120 s a call may take before it counts as hung, and past it on a loaded machine. The campaigns therefore
# hand a sampler their batch in slices of whole requests, each a batch of its own, and concatenate the
# outputs: every law they test is a law of single requests, so the slicing changes nothing they measure.
CAMPAIGN_SLICE = 50_000  # requests per call of a distribution campaign


def campaign_call(sampler, batch: SpecBatch) -> SamplerOutput:
    """`call()` over slices of at most `CAMPAIGN_SLICE` whole requests, their outputs concatenated."""
    r = batch.num_reqs
    if r <= CAMPAIGN_SLICE:
        return call(sampler, batch)
    return concat_outputs([call(sampler, slice_batch(batch, a, min(a + CAMPAIGN_SLICE, r)))
                           for a in range(0, r, CAMPAIGN_SLICE)], batch)


def observed(sampler, batch: SpecBatch, *, reseed: int | None = None, **kw):
    """`guards.observed_call`, with a modified input turned into a `PropertyFailure`: `(output, CallReport)`."""
    try:
        return guards.observed_call(sampler, batch, kw, reseed=reseed)
    except guards.InputModified as exc:
        raise PropertyFailure(str(exc), batch=batch) from exc


def call_with_report(sampler, batch: SpecBatch, *, reseed: int | None = None, check: bool = True, **kw):
    """`call()`, also returning the `CallReport` (device work, peak memory) of the call."""
    out, report = observed(sampler, batch, reseed=reseed, **kw)
    if not isinstance(out, SamplerOutput):
        raise PropertyFailure(f"{sampler_name(sampler)} returned {type(out).__name__}, not SamplerOutput", batch=batch)
    r, k1 = batch.num_reqs, batch.num_speculative_steps + 1
    checks = [
        ("sampled", out.sampled, np.int64, (r, k1)),
        ("num_sampled", out.num_sampled, np.int32, (r,)),
    ]
    if batch.num_logprobs is not None:
        lp = out.logprobs
        if lp is None:
            raise PropertyFailure("num_logprobs is set but the output has no logprobs", batch=batch)
        n, k = batch.num_logits, batch.num_logprobs + 1
        checks += [
            ("logprobs.token_ids", lp.token_ids, np.int64, (n, k)),
            ("logprobs.logprobs", lp.logprobs, np.float32, (n, k)),
            ("logprobs.ranks", lp.ranks, np.int64, (n,)),
        ]
    for name, arr, dtype, shape in checks:
        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
            got = f"{type(arr).__name__} {getattr(arr, 'dtype', '?')} {getattr(arr, 'shape', '?')}"
            raise PropertyFailure(f"output {name}: expected {np.dtype(dtype)} {shape}, got {got}", batch=batch)
    if check and checked_here(batch):
        declared = as_sampler(sampler).record.applied  # SPEC 11: the declared rules replace the SPEC's
        try:
            check_output_invariants(batch, out, declared)
        except PropertyFailure as exc:
            raise PropertyFailure(f"{sampler_name(sampler)}'s output breaks SPEC sections 4-6: {exc}"
                                  f"{undeclared_hint(batch, out, declared)}", batch=batch,
                                  details=exc.details) from None
    return out, report


def as_declared(batch: SpecBatch, sampler) -> SpecBatch:
    """A fixed campaign's batch made fit for what the sampler declares (SPEC section 10): without
    logprobs when it computes none, with one-hot drafts (the same draft ids) when it takes no model
    drafts, verified token by token when it does not declare the batch's method, without the
    sampling parameters it does not declare. `SamplerRecord.fit`: the narrowing the strategies
    read for generated batches (`SamplerRecord.strategy_kwargs`)."""
    return as_sampler(sampler).record.fit(batch)


def within_bound(batch: SpecBatch, sampler) -> SpecBatch:
    """A fixed campaign's batch with each finite processed logit beyond the sampler's declared
    `logit_bound` moved to it (SPEC section 10; the rest of `as_declared`'s narrowing left out)."""
    return clamped(batch, as_sampler(sampler).record.logit_bound)


def sampler_name(sampler) -> str:
    return as_sampler(sampler).record.name


def event(value: str) -> None:
    """`hypothesis.event`, ignored outside a Hypothesis test (replay, fixed campaigns)."""
    try:
        _event(value)
    except InvalidArgument:
        pass
