"""A declared convention change between a sampler and its baseline: each side certified under its own.

Two versions of a library may differ in what their records declare (SPEC section 10): the stream
family, how an explicit sampler resamples, the block seed (SPEC 3b: vLLM 0.33.0 keys a block
step's acceptance uniform by `seed ^ (i << 32)`, 0.32.0 by `seed`), the declared deviations
(SPEC 11). The draft-logit convention a vLLM release takes is the adapter's business (it hands the
release what it expects), so it never shows here. Such a change moves decisions by design, so
`matches_baseline` does not compare such versions bit for bit: it compares each with the float64
reference bound to its own record (`certifying_reference`) and

- counts the decisions the change moved: the two references' traces of every batch, decision by
  decision (same request, step and kind; the mask near-ties left out), and the requests whose
  outputs differ (`tally`, summed into `ctx.stats` under `STATS`);
- for each request whose outputs differ, certifies both outputs, each against its own reference
  (`certification.compare_decisions`, the same tolerance and excusal cap as SPEC section 8):
  a side that is not certified is a regression, reported with the side, its conventions and the
  decision (`uncertified`).

`summary(stats)` is the line a passing run prints: "block seed plain -> step: 36 of 400 block
decisions differ, each certified under its own conventions".
"""

from __future__ import annotations

from ..harness.context import certifying_reference
from ..harness.record import SamplerRecord
from . import certification
from .registry import PropertyFailure

STATS = "baseline_conventions"  # ctx.stats key: the change, the decision tally, the requests
KIND_NAMES = {"accept": "acceptance tests", "block": "block decisions", "residual": "residual-mass decisions",
              "argmax": "argmaxes (resamples, bonus and greedy tokens)"}


def _family(rec: SamplerRecord) -> str:
    return rec.family.name if rec.family is not None else "own"


CONVENTIONS = (("stream family", _family), ("resample", lambda r: r.resample),
               ("block seed", lambda r: r.block_seed),
               ("deviations", lambda r: "[" + ", ".join(sorted(map(str, r.applied.names))) + "]"))


def conventions(rec: SamplerRecord) -> str:
    """A record's declared conventions, as the reports name them."""
    return ", ".join(f"{what} {get(rec)}" for what, get in CONVENTIONS)


def changes(baseline: SamplerRecord, changed: SamplerRecord) -> list[str]:
    """The declared conventions that differ, as "block seed plain -> step" (baseline -> changed)."""
    return [f"{what} {get(baseline)} -> {get(changed)}" for what, get in CONVENTIONS if get(baseline) != get(changed)]


def oracles(ctx, baseline_record: SamplerRecord, versions: str):
    """The references bound to each side's record: `(changed, baseline)`; a PropertyFailure when one
    side cannot be certified at all (no reference, own streams, a family the reference cannot draw)."""
    if ctx.reference is None:
        raise PropertyFailure(f"the baseline's declared conventions differ ({'; '.join(changes(baseline_record, ctx.record))}) "
                              f"and there is no reference to certify both sides against\n{versions}")
    sides = (("changed", ctx.record), ("baseline", baseline_record))
    found = tuple(certifying_reference(ctx.reference, rec) for _, rec in sides)
    for (side, rec), oracle in zip(sides, found):
        if oracle is None:
            raise PropertyFailure(f"the {side} sampler ({rec.name}: {conventions(rec)}) cannot be certified against the "
                                  f"reference (own streams, or a family it cannot draw), so its decisions that differ "
                                  f"from the other side's cannot be told correct\n{versions}")
    return found


def _outcomes(trace) -> dict:
    """(step, kind) -> the decision's outcome (accepted, or the token of an argmax); masks left out."""
    return {(d.step, d.kind): (d.accepted if d.kind != "argmax" else d.token)
            for d in trace.decisions if d.kind != "mask"}


def tally(ctx, base_traces, changed_traces, differing: int, requests: int) -> None:
    """Add one batch's counts to `ctx.stats[STATS]`: per decision kind `[moved, compared]`, the
    decisions present in both references' traces; and the requests whose outputs differ."""
    stats = ctx.stats.setdefault(STATS, {"kinds": {}, "requests": [0, 0]})
    for tb, tc in zip(base_traces, changed_traces):
        ob, oc = _outcomes(tb), _outcomes(tc)
        for key in ob.keys() & oc.keys():
            counts = stats["kinds"].setdefault(key[1], [0, 0])
            counts[0] += ob[key] != oc[key]
            counts[1] += 1
    stats["requests"][0] += differing
    stats["requests"][1] += requests


def uncertified(batch, out, verified, oracle, requests: set, side: str, rec: SamplerRecord) -> str | None:
    """Why `side`'s output is not certified on `requests` against its own reference (`verified`: the
    reference's output and traces of `batch`), or None."""
    ref_out, traces = verified
    found = certification.compare_decisions(batch, out, [t for t in traces if t.request in requests],
                                            reference=oracle)
    if not found.failed and len(found.excused) <= found.excuse_cap:
        skip = (set(range(batch.num_reqs)) - requests) | {d.request for d in found.divergences}
        lp = certification.compare_logprobs(batch, out, ref_out, skip)
        return None if lp is None else (f"the {side} sampler ({rec.name}) is not certified under its own conventions "
                                        f"({conventions(rec)}): logprobs against its reference: {lp}")
    shown = found.failed or found.excused
    why = ("" if found.failed else
           f"more excused near-ties ({len(found.excused)}) than SPEC section 8 allows ({found.excuse_cap:g}): ")
    return (f"the {side} sampler ({rec.name}) is not certified under its own conventions ({conventions(rec)}): "
            + why + "; ".join(d.describe() for d in shown[:3]))


def summary(stats: dict) -> str:
    """The line a run prints for the convention change (empty without one)."""
    found = stats.get(STATS)
    if not found or not stats.get("baseline_change"):
        return ""
    moved = [f"{n} of {m} {KIND_NAMES.get(k, k)}" for k, (n, m) in sorted(found["kinds"].items()) if n]
    n, m = found["requests"]
    what = ", ".join(moved) if moved else "no decision"
    return (f"{stats['baseline_change']}: {what} differ ({n} of {m} requests' outputs), "
            "each certified under its own conventions")
