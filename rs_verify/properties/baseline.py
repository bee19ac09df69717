"""The regression gate: a changed sampler against its own base version (`ctx.baseline`).

- `matches_baseline`: on generated batches, the changed sampler's output equals the
  baseline's bit for bit (`sampled`, `num_sampled`, every logprobs field), for the full batch
  and, when both support internal chunking, at a drawn chunk cap. In `certified` mode a request
  that differs must instead be certified against the float64 reference (SPEC section 8, through
  `certification.compare_decisions` / `compare_logprobs`): for changes that legitimately move
  numerics. The front ends then require the distribution campaigns to pass as well
  (`certified_requirements`). When the two versions' records declare different conventions
  (stream family, resample, block seed, deviations: a release against the previous one), a
  request that differs must instead be certified on both sides, each against the reference
  bound to its own record; the decisions the change moved are counted and reported
  (`rs_verify.properties.conventions`), and a side that is not certified fails, named.
- `baseline_speed`: on CUDA, both versions are timed on the same benchmark batches in one run
  (`rs_verify.harness.timing`); the change fails when a median is more than `max_slowdown`
  times the baseline's. Without CUDA it is skipped as "not measured".

`ctx.baseline` is an opened `rs_verify.engine.baseline.Baseline` (its `sampler`, `mode`,
`max_slowdown`, `loader`, `timing_path`); properties skip, with the reason, without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..harness import timing
from ..contract.batch import SamplerOutput, SpecBatch
from . import certification, conventions
from ..harness.record import record_of
from .assertions import call, event
from .inputs import batch_and_cap, decision_rich
from .registry import NEEDS, PROPERTIES, PropertyFailure, register

LISTED_LOGPROBS = 6  # logprobs differences listed per request (the count of the rest is given)


@dataclass
class RequestDiff:
    """Where one request's output differs between the changed sampler and the baseline."""

    request: int
    steps: list = field(default_factory=list)  # (step, changed token, baseline token)
    num_sampled: tuple | None = None  # (changed, baseline)
    logprobs: list = field(default_factory=list)  # "row j field[c]: a vs b"

    def describe(self, batch: SpecBatch) -> str:
        r = self.request
        state = int(batch.idx_mapping[r])
        head = (f"request {r} (state {state}, T={float(batch.temperature[state]):g}, "
                f"drafts {batch.draft_tokens(r).tolist()})")
        parts = []
        if self.num_sampled is not None:
            parts.append(f"num_sampled: changed {self.num_sampled[0]}, baseline {self.num_sampled[1]}")
        parts += [f"step {i}: changed token {a}, baseline token {b}" for i, a, b in self.steps]
        shown = self.logprobs[:LISTED_LOGPROBS]
        parts += [f"logprobs {d}" for d in shown]
        if len(self.logprobs) > len(shown):
            parts.append(f"... and {len(self.logprobs) - len(shown)} more logprobs differences")
        return head + ":\n    " + "\n    ".join(parts)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def output_differences(batch: SpecBatch, changed: SamplerOutput, base: SamplerOutput) -> list[RequestDiff]:
    """Every request whose output differs bit for bit, with every differing step and logprobs entry."""
    found = []
    both_lp = changed.logprobs is not None and base.logprobs is not None
    for r in range(batch.num_reqs):
        d = RequestDiff(r)
        na, nb = int(changed.num_sampled[r]), int(base.num_sampled[r])
        if na != nb:
            d.num_sampled = (na, nb)
        row_a, row_b = changed.sampled[r], base.sampled[r]
        d.steps = [(int(i), int(row_a[i]), int(row_b[i])) for i in np.flatnonzero(row_a != row_b)]
        if both_lp:
            lo, hi = int(batch.cu_num_logits[r]), int(batch.cu_num_logits[r + 1])
            fa, fb = changed.logprobs.fields(), base.logprobs.fields()
            for name in fa:
                xa, xb = fa[name][lo:hi], fb[name][lo:hi]
                for idx in np.argwhere(_bits(xa) != _bits(xb)):
                    at = tuple(int(i) for i in idx)
                    col = f"[{at[1]}]" if len(at) > 1 else ""
                    d.logprobs.append(f"row {lo + at[0]} {name}{col}: changed {xa[at]!r}, baseline {xb[at]!r}")
        if d.num_sampled or d.steps or d.logprobs:
            found.append(d)
    return found


def _name(sampler) -> str:
    rec = record_of(sampler)
    return f"{rec.name} [{rec.loaded_as}]" if rec.loaded_as else rec.name


def _versions(ctx) -> str:
    return f"changed: {_name(ctx.sampler)}\nbaseline: {ctx.baseline.describe()}"


def _both_chunk(ctx) -> bool:
    return ctx.record.supports_chunking and record_of(ctx.baseline.sampler).supports_chunking


def _batch_and_maybe_cap(ctx):
    """A batch and a chunk cap when both versions chunk internally, else a batch and None."""
    if _both_chunk(ctx):
        return batch_and_cap(ctx)
    return decision_rich(ctx).map(lambda b: (b, None))


def _certify(ctx, batch: SpecBatch, out: SamplerOutput, diffs: list[RequestDiff], what: str) -> int:
    """Certified mode: each differing request of `out` must pass certification against the
    reference (SPEC section 8). Returns the number of excused divergences; raises otherwise."""
    listing = "\n".join(d.describe(batch) for d in diffs)
    oracle = ctx.oracle
    if oracle is None:
        fam = ctx.record.family
        why = ("no reference sampler was given" if ctx.reference is None
               else "the sampler has its own random streams (streams = 'own')" if fam is None
               else f"the reference cannot draw the sampler's stream family {fam.name!r}")
        raise PropertyFailure(f"{what}: {len(diffs)} request(s) differ from the baseline, and certified mode cannot "
                              f"excuse them: {why}\n{_versions(ctx)}\n{listing}", batch=batch)
    requests = {d.request for d in diffs}
    ref_out, traces = oracle.verify_with_trace(batch)
    found = certification.compare_decisions(batch, out, [t for t in traces if t.request in requests],
                                            reference=oracle)
    divergences, excused, failed, cap = found.divergences, found.excused, found.failed, found.excuse_cap
    if failed or len(excused) > cap:
        shown = failed or excused
        reason = ("not within the certification tolerance" if failed
                  else f"more excused near-ties ({len(excused)}) than SPEC section 8 allows ({cap:g})")
        raise PropertyFailure(
            f"{what}: {len(diffs)} request(s) differ from the baseline, {reason}:\n"
            + "\n".join(d.describe() for d in shown) + f"\n{_versions(ctx)}\n{listing}",
            batch=batch, details={"divergences": [vars(d) for d in shown]})
    skip = (set(range(batch.num_reqs)) - requests) | {d.request for d in divergences}
    lp = certification.compare_logprobs(batch, out, ref_out, skip)
    if lp:
        raise PropertyFailure(f"{what}: logprobs differ from the baseline beyond the certification tolerance "
                              f"(against the reference: {lp})\n{_versions(ctx)}\n{listing}", batch=batch)
    return len(excused)


@register("matches_baseline", "baseline", strategy=_batch_and_maybe_cap, needs=("baseline",), cost=140,
          why_kept=("The only comparison with the version a change replaces: a shifted token that stays within the "
                    "certification tolerance, or a changed reduction order, passes every other property."))
def matches_baseline(ctx, drawn) -> None:
    """The changed sampler's output equals the baseline version's bit for bit, chunked and full."""
    batch, cap = drawn
    base = ctx.baseline
    runs = [("full batch", max(1, batch.num_logits))]
    if cap is not None:
        runs.append((f"max_chunk_logits={cap}", cap))
    base_rec = record_of(base.sampler)
    changed = conventions.changes(base_rec, ctx.record)
    if changed:  # each side against its own reference (see the module docstring)
        ctx.stats["baseline_change"] = "; ".join(changed)
        oracles = conventions.oracles(ctx, base_rec, _versions(ctx))
        verified = [o.verify_with_trace(batch) for o in oracles]  # (output, traces): changed, baseline
    failures = []
    for what, c in runs:
        out = call(ctx.sampler, batch, max_chunk_logits=c)
        ref = call(base.sampler, batch, max_chunk_logits=c)
        if (out.logprobs is None) != (ref.logprobs is None):
            failures.append(f"{what}: logprobs present in the {'changed' if ref.logprobs is None else 'baseline'} "
                            "output only")
            continue
        diffs = output_differences(batch, out, ref)
        event(f"requests differing from the baseline: {min(len(diffs), 3)}{'+' if len(diffs) >= 3 else ''}")
        if changed and c == runs[0][1]:
            conventions.tally(ctx, verified[1][1], verified[0][1], len(diffs), batch.num_reqs)
        if not diffs:
            continue
        if changed:
            requests = {d.request for d in diffs}
            found = [conventions.uncertified(batch, o, v, orc, requests, side, rec) for o, v, orc, side, rec in
                     ((out, verified[0], oracles[0], "changed", ctx.record),
                      (ref, verified[1], oracles[1], "baseline", base_rec))]
            found = [f for f in found if f]
            if found:
                listing = "\n".join(d.describe(batch) for d in diffs)
                failures.append(f"{what}: a regression, not only the convention change ({'; '.join(changed)}):\n"
                                + "\n".join(found) + f"\n{listing}")
            continue
        if base.mode == "certified":
            ctx.count("excused", _certify(ctx, batch, out, diffs, what))
            ctx.count("certified_differences", len(diffs))
            continue
        listing = "\n".join(d.describe(batch) for d in diffs)
        failures.append(f"{what}: {len(diffs)} of {batch.num_reqs} request(s) differ:\n{listing}")
    if failures and changed:
        raise PropertyFailure("the changed sampler's output differs from the baseline's, and not every difference is "
                              f"certified on both sides\n{_versions(ctx)}\n" + "\n".join(failures), batch=batch)
    if failures:
        raise PropertyFailure("the changed sampler's output differs from the baseline's (exact mode: bit for bit)\n"
                              f"{_versions(ctx)}\n" + "\n".join(failures), batch=batch)


# -- speed ---------------------------------------------------------------------------------------

# Benchmark shapes (R, K, V) per profile: a Qwen-size vocabulary, so that the kernels, not the
# launches, dominate the device time; fewer requests outside the GPU profiles (smaller runners).
BENCH_SHAPES = {"gpu": (128, 4, 152064), "nightly": (128, 4, 152064)}
DEFAULT_BENCH_SHAPE = (64, 4, 152064)
BENCH_SEED = 20261130


def benchmark_batch(kind: str, r: int, k: int, v: int, seed: int = BENCH_SEED) -> SpecBatch:
    """A fixed-seed batch of `r` requests with `k` drafts each: kind "model", "one_hot" or "greedy"."""
    rng = np.random.default_rng([seed, r, k, v, ("model", "one_hot", "greedy").index(kind)])
    n = r * (k + 1)
    target = rng.standard_normal((n, v), dtype=np.float32) * np.float32(2)
    draft = rng.standard_normal((r, k, v), dtype=np.float32) * np.float32(2) if kind == "model" else None
    greedy = kind == "greedy"
    return SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=rng.integers(0, v, n, dtype=np.int64),
        cu_num_logits=np.arange(0, n + 1, k + 1, dtype=np.int32),
        pos=rng.integers(0, 2**40, n, dtype=np.int64),
        idx_mapping=rng.permutation(r).astype(np.int32),
        temperature=np.zeros(r, np.float32) if greedy else rng.uniform(0.5, 1.5, r).astype(np.float32),
        seeds=rng.integers(-(2**62), 2**62, r, dtype=np.int64),
        num_speculative_steps=k,
    )


def benchmark_batches(profile: str, *, chunked: bool, shape: tuple | None = None) -> list:
    """`(label, batch, call kwargs)` triples both versions are timed on."""
    r, k, v = shape or BENCH_SHAPES.get(profile, DEFAULT_BENCH_SHAPE)
    model = benchmark_batch("model", r, k, v)
    out = [("model drafts", model, {}), ("one-hot drafts", benchmark_batch("one_hot", r, k, v), {}),
           ("greedy", benchmark_batch("greedy", r, k, v), {}),
           ("model drafts, processed logprobs k=5", model.replace(num_logprobs=5, logprobs_mode="processed"), {})]
    if chunked:
        out.append(("model drafts, 8 chunks", model, {"max_chunk_logits": max(1, model.num_logits // 8)}))
    return out


@register("baseline_speed", "baseline", needs=("baseline", "timing"), cost=260,
          why_kept="CUDA only: the only property that sees a slower kernel; skipped (not measured) on CPU.")
def baseline_speed(ctx, _drawn) -> None:
    """On CUDA, the change is at most max_slowdown times slower than the baseline (medians, same batches)."""
    base = ctx.baseline
    spec = ctx.record.loaded_as
    if not spec:
        raise PropertyFailure("the changed sampler cannot be timed: it was not loaded by spec (module:attribute)")
    rows, notes = timing.time_versions((spec, []), base.loader,
                                       benchmark_batches(ctx.profile, chunked=_both_chunk(ctx)), device=ctx.device)
    text = timing.table(rows, max_slowdown=base.max_slowdown, changed=_name(ctx.sampler), baseline=base.describe(),
                        header="# rs-verify: speed of the change against its baseline\n", notes=notes)
    ctx.stats["timing_table"] = text
    if base.timing_path:
        Path(base.timing_path).parent.mkdir(parents=True, exist_ok=True)
        Path(base.timing_path).write_text(text)
    slow = timing.too_slow(rows, base.max_slowdown)
    if slow:
        worst = max(slow, key=lambda t: t.ratio)
        raise PropertyFailure(f"the change is {worst.ratio:.3f}x the baseline's {worst.measure} time on "
                              f"{worst.batch!r} (at most {base.max_slowdown:g} allowed):\n{text}")


def gate_summary(mode: str, outcomes: dict, timing_text: str | None, changes: str = "") -> tuple[list[str], bool]:
    """Closing lines of a gate run with a baseline (the front ends print them), and whether
    certified mode's extra requirement failed. `outcomes` maps property names to "passed" /
    "failed" / "skipped" (absent: not run); `changes`: a passing `matches_baseline`'s convention
    change (`conventions.summary`)."""
    lines = [f"declared conventions changed against the baseline: {changes}"] if changes else []
    if timing_text:
        lines += ["speed of the change against its baseline:", timing_text.rstrip()]
    elif outcomes.get("baseline_speed") == "skipped":
        lines.append(f"speed against the baseline: {NEEDS['timing']}")
    missing = certified_requirements(outcomes) if mode == "certified" else []
    if missing:
        lines.append("certified baseline mode fails the gate: it accepts differences within the certification "
                     "tolerance only together with passing distribution campaigns; not passed: " + ", ".join(missing))
    return lines, bool(missing)


def certified_requirements(outcomes: dict) -> list[str]:
    """Certified mode also requires every distribution campaign to pass: those that did not, as
    "name (status)" (`outcomes` maps property names to "passed" / "failed" / "skipped")."""
    required = [n for n, p in PROPERTIES.items() if p.family == "distribution"]
    return [f"{n} ({outcomes.get(n, 'not run')})" for n in required if outcomes.get(n) != "passed"]
