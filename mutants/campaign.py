"""`python -m mutants`: the property library against a catalogue of planted bugs, as a kill matrix.

Each mutant (`mutants.catalogue.Mutant`: a patched in-memory copy of the Triton sampler or the
reference, see `mutants.mutation.load_patched`) runs in a worker process of a
`ProcessPoolExecutor` (spawned, so every worker picks its Triton backend before triton is
imported: the interpreter when there is no CUDA; one torch thread per worker). The worker
loads the Hypothesis profile, builds the mutant sampler and runs every registered property
on it through `rs_verify.engine.runner.run`, with the unpatched reference as the oracle, cheapest
property first (the registry's cost order).

Cost controls (the defaults aim at the whole catalogue within 20 minutes on 2 CPU cores
under the Triton interpreter):
- `max_examples` (default: the profile's own count): a mutant counts as killed only within
  the budget the gate really runs at (the ci profile: 40 examples, times a property's
  `examples_scale`). With the derandomized ci profile every mutant sees the same inputs.
- `shrink_seconds` (default 10): Hypothesis's shrink phase stops after this many seconds per
  failure (`hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS`, which Hypothesis
  keeps monkeypatchable for this), and only the first killing property of a mutant shrinks
  (its failing batch is the one reported); later ones stop at their first failing example.
- `escalate` (default 0: off): a diagnostic for survivors only. A mutant that no property
  killed gets a second pass of its expected killers (the catalogue's `killers`) with this many
  examples; a kill there is recorded as `k` and does NOT count as a kill of the gate.
- `first_kill` (off by default): stop a mutant at its first kill; the properties after it are
  recorded as not run (`?`). The whole catalogue at the ci budget then costs what it takes to
  find each bug once; the full matrix (which property kills what alone) needs it off.
- `budget` (default 600 s per mutant): once spent, properties not started yet are recorded
  as not run (`?`) and no escalation starts.

Controls: first, each target build's unpatched copy runs every property; a property it fails
is not run on that build's mutants, and the command exits 2.

Matrix cells: `K` killed (the property failed), `k` killed after escalation, `E` killed by an
exception (the sampler crashed on a valid input, or Hypothesis saw a flaky failure), `.`
survived, `-` skipped (the property does not apply: e.g. distribution campaigns need a fast
sampler), `?` not run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict

from hypothesis import settings
from hypothesis.internal.conjecture import engine as conjecture_engine
from hypothesis.reporting import with_reporter
from rich.console import Console
from rich.markup import escape

from rs_verify.reference import ReferenceSampler
from rs_verify.engine import profiles, runner
from rs_verify.harness import device
from rs_verify.harness.samplers import import_module
from rs_verify.engine.versions import versions
from rs_verify.properties import PROPERTIES, by_cost

from .catalogue import Mutant
from .matrix import (ERRORED, ESCALATED, KILLED, KILLS, NOT_RUN, STATUS_SYMBOL, SURVIVED, Cell, MutantResult,
                     _batch_text, _from_dict, merge_results, print_matrix, write_report)

DEFAULT_CATALOGUE = "mutants.catalogue:MUTANTS"
DEFAULT_WORKERS = 2
DEFAULT_SHRINK_SECONDS = 10.0
DEFAULT_BUDGET = 600.0
CONTROL = "control: "  # `control: <target> <build>`: a property failing the unpatched build kills nothing


def control_name(mutant) -> str:
    return f"{CONTROL}{mutant.target} {mutant.build}"


def find_mutant(catalogue: str, name: str):
    """The mutant `name` of `catalogue`, or the unpatched build a control name stands for."""
    if name.startswith(CONTROL):
        target, build = name[len(CONTROL):].split(" ", 1)
        return Mutant(name, "the unpatched build: every property must pass on it", target, {}, build=build)
    _, mutants = load_catalogue(catalogue)
    return next(m for m in mutants if m.name == name)

def ordered_properties(names=None) -> list[str]:
    """Registered property names (restricted to `names`), cheapest first (the registry's cost order)."""
    return [n for n in by_cost() if names is None or n in names]


# -- the catalogue --------------------------------------------------------------------


def load_catalogue(spec: str):
    """The mutant list named by `module:attribute` (a module of the current directory is found too)."""
    if ":" not in spec:
        raise ValueError(f"catalogue {spec!r}: expected module:attribute")
    module_name, attr = spec.split(":", 1)
    module = import_module(module_name)
    try:
        mutants = list(getattr(module, attr))
    except AttributeError as exc:
        raise ValueError(f"catalogue {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    names = [m.name for m in mutants]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"catalogue {spec!r}: duplicate mutant names {dupes}")
    return module, mutants


# -- the worker -----------------------------------------------------------------------


def init_worker(profile: str | None, shrink_seconds: float | None, threads: int = 1) -> None:
    """Process initializer: the suite's backend choice, torch threads, profile, shrink limit."""
    device.resolve()
    if threads:
        import torch  # lazy: after the backend choice (torch only caps its threads here)

        torch.set_num_threads(threads)
    profiles.load(profile)
    if shrink_seconds is not None:
        conjecture_engine.MAX_SHRINKING_SECONDS = shrink_seconds


def _batch_info(failure) -> dict | None:
    batch = failure.failing_batch()
    if batch is None:
        return None
    try:
        return {"R": batch.num_reqs, "N": batch.num_logits, "V": batch.vocab_size,
                "K": batch.num_speculative_steps, "summary": batch.summary()}
    except Exception:  # noqa: BLE001 - a malformed (bad-input) batch
        return {"R": -1, "N": -1, "V": -1, "K": -1, "summary": repr(batch)}


def _first_line(exc, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = " | ".join(lines[:3])
    return out if len(out) <= limit else out[: limit - 3] + "..."


def run_mutant(catalogue: str, name: str, *, profile: str | None = None, max_examples: int | None = None,
               escalate: int | None = None, budget: float | None = None, properties: list[str] | None = None,
               phases=None, first_kill: bool = False, void: tuple = ()) -> MutantResult:
    """Run the properties (cheapest first) against one mutant of `catalogue`; never raises for a kill.

    - `max_examples`: examples per property (None: the profile's); `phases`: Hypothesis phases
      (None: all, shrinking included).
    - `escalate`: when no property killed the mutant, re-run its expected killers (the
      catalogue's `killers`; every survived property, cheapest first, when it names none) with
      more examples until one kills it: the profile's count, then `escalate`
      (`escalation_tiers`); that cell becomes `k`. None or 0: no escalation.
    - `budget`: seconds; properties not started by then are recorded as not run.
    - `properties`: restrict to these property names.
    - `void`: properties its control failed (recorded as not run, never a kill).
    """
    start = time.perf_counter()
    mutant = find_mutant(catalogue, name)
    result = MutantResult(name, mutant.models, mutant.target, mutant.build)
    names = ordered_properties(properties)
    try:
        sampler = mutant.sampler()
    except Exception as exc:  # noqa: BLE001 - PatchError or a build failure: reported, not a kill
        result.load_error = _first_line(exc)
        result.cells = [Cell(n, NOT_RUN) for n in names]
        return result
    reference = ReferenceSampler()
    profile = profile or profiles.active()
    kw = {}
    if max_examples is not None:
        kw["max_examples"] = int(max_examples)
    if phases is not None:
        kw["phases"] = phases
    # The named profile (whichever one is loaded); one failure per property is all a kill needs,
    # so Hypothesis stops at the first one (no search for further distinct bugs, no explain phase).
    kw.setdefault("phases", [p for p in settings.get_profile(profile).phases if p.name != "explain"])
    base = settings(settings.get_profile(profile), report_multiple_bugs=False, **kw)
    # Only the first killing property shrinks its failure (its batch is the one reported);
    # later ones stop at the first failing example.
    no_shrink = settings(base, phases=[p for p in base.phases if p.name != "shrink"])

    def run_cell(pname, cfg) -> Cell:
        ctx = runner.make_context(sampler, reference, profile=profile)
        res = runner.run(PROPERTIES[pname], ctx, cfg)
        failure = res.failure
        symbol = SURVIVED if res.status == "passed" else STATUS_SYMBOL["skipped"] if res.status == "skipped" \
            else KILLED if failure.kind == "property" else ERRORED
        cell = Cell(pname, symbol, round(res.seconds, 2), res.examples, max_examples=cfg.max_examples)
        if failure is not None:
            cell.message = failure.headline()
            cell.batch = _batch_info(failure)
            cell.found_at = failure.found_at
        elif res.status == "skipped":
            cell.message = res.message
        return cell

    def spent() -> bool:
        return budget is not None and time.perf_counter() - start > budget

    with with_reporter(lambda _msg: None):  # the runner silences Hypothesis's repr warnings
        for pname in names:
            if pname in void:
                result.cells.append(Cell(pname, NOT_RUN, message="fails on the unpatched build (its control)"))
                continue
            result.cells.append(Cell(pname, NOT_RUN) if spent() or (first_kill and result.killed) else
                                run_cell(pname, no_shrink if result.killed else base))
        survived = {c.property: i for i, c in enumerate(result.cells) if c.symbol == SURVIVED}
        order = [p for p in mutant.killers if p in survived] or list(survived)
        tiers = escalation_tiers(base.max_examples, escalate, settings.get_profile(profile).max_examples)
        for cap, pname in [(cap, p) for cap in tiers for p in order]:
            if result.killed or spent():
                break
            cell = run_cell(pname, settings(base, max_examples=cap))
            if cell.symbol in (KILLED, ERRORED):
                cell.symbol = ESCALATED
                result.cells[survived[pname]] = cell
    result.seconds = round(time.perf_counter() - start, 2)
    return result


def escalation_tiers(base: int, escalate: int | None, profile_examples: int) -> list[int]:
    """Example caps of the escalation pass: the profile's count, then `escalate` (each above `base`).

    Two tiers because a derandomized run draws a different sequence for every cap: a batch
    found at example 16 of 40 may not be drawn at all in a run of 100.
    """
    if not escalate:
        return []
    tiers = sorted({min(int(profile_examples), int(escalate)), int(escalate)})
    return [t for t in tiers if t > base]


def _pool_task(args) -> dict:
    catalogue, name, profile, max_examples, escalate, budget, properties, first_kill, void = args
    return asdict(run_mutant(catalogue, name, profile=profile, max_examples=max_examples, escalate=escalate,
                             budget=budget, properties=properties, first_kill=first_kill, void=void))


def run_all(catalogue: str, names: list[str], *, workers: int = DEFAULT_WORKERS, profile: str | None = None,
            max_examples: int | None = None, escalate: int | None = None,
            shrink_seconds: float | None = DEFAULT_SHRINK_SECONDS, budget: float | None = DEFAULT_BUDGET,
            properties: list[str] | None = None, progress=None, first_kill: bool = False,
            void: dict | None = None) -> list[MutantResult]:
    """Every named mutant through `run_mutant`, `workers` at a time (0: in this process);
    `void` maps a mutant's name to the properties its control failed."""
    tasks = [(catalogue, n, profile, max_examples, escalate, budget, properties, first_kill,
              tuple((void or {}).get(n, ()))) for n in names]
    results: dict[str, MutantResult] = {}

    def done(res: MutantResult):
        results[res.name] = res
        if progress is not None:
            progress(res, len(results), len(tasks))

    if workers <= 0:  # in this process: the profile and the shrink limit are restored afterwards
        saved = settings.get_current_profile_name(), conjecture_engine.MAX_SHRINKING_SECONDS
        try:
            init_worker(profile, shrink_seconds, threads=0)
            for t in tasks:
                done(_from_dict(_pool_task(t)))
        finally:
            settings.load_profile(saved[0])
            conjecture_engine.MAX_SHRINKING_SECONDS = saved[1]
    else:
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=init_worker,
                                 initargs=(profile, shrink_seconds)) as pool:
            futures = {pool.submit(_pool_task, t): t[1] for t in tasks}
            for fut in as_completed(futures):
                name = futures[fut]
                try:
                    done(_from_dict(fut.result()))
                except (BrokenProcessPool, Exception) as exc:  # noqa: BLE001 - a crashed worker is reported
                    done(MutantResult(name, load_error=f"worker failed: {_first_line(exc)}",
                                      cells=[Cell(n, NOT_RUN) for n in ordered_properties(properties)]))
    return [results[n] for n in names]


# -- the command ----------------------------------------------------------------------


def cmd_mutate(args) -> int:
    console = Console()
    if args.from_json:  # re-render a recorded run
        try:
            results, prop_names, meta = merge_results(args.from_json, only=set(args.only) if args.only else None)
        except (OSError, ValueError, KeyError, ImportError) as exc:
            console.print(f"[red]python -m mutants: cannot re-render {escape(' '.join(args.from_json))}: {escape(str(exc))}[/]")
            return 2
        print_matrix(results, prop_names, console)
        if args.report:
            paths = write_report(results, prop_names, args.report, meta)
            console.print(f"report: {paths['markdown']}, {paths['json']}", markup=False, highlight=False)
        return 0 if all(r.killed for r in results) else 1
    try:
        _, mutants = load_catalogue(args.catalogue)
    except (ValueError, ImportError) as exc:
        console.print(f"[red]python -m mutants: {escape(str(exc))}[/]")
        return 2
    names = [m.name for m in mutants]
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            console.print(f"[red]python -m mutants: unknown mutants {unknown}; the catalogue has {names}[/]")
            return 2
        names = [n for n in names if n in args.only]
    if args.properties:
        unknown = [p for p in args.properties if p not in PROPERTIES]
        if unknown:
            console.print(f"[red]python -m mutants: unknown properties {unknown}; see `rs-verify list`[/]")
            return 2
    prop_names = ordered_properties(args.properties)
    profile = args.profile or profiles.default_profile_name()  # loaded by each worker
    if profile not in profiles.PROFILE_NAMES:
        console.print(f"[red]python -m mutants: unknown profile {profile!r}[/]")
        return 2
    escalate = args.escalate
    console.print(f"[bold]python -m mutants[/]: {len(names)} mutants of {escape(args.catalogue)} x {len(prop_names)} "
                  f"properties, profile {profile}, {args.workers} workers, max_examples "
                  f"{args.max_examples if args.max_examples else 'of the profile'}, shrinking <= "
                  f"{args.shrink_seconds} s per failure, escalation of survivors to {escalate or 'none'} examples, "
                  f"budget {args.budget} s per mutant")
    start = time.perf_counter()
    void, failed_controls = run_controls(args, [m for m in mutants if m.name in names], profile, console)

    def progress(res: MutantResult, i: int, total: int):
        first = res.first_kill()
        if res.load_error:
            what = f"[red]{escape(res.load_error)}[/]"
        elif first:
            how = " after escalation" if first.symbol == ESCALATED else ""
            what = (f"killed by {len(res.killers)}{how} ({escape(first.property)} first, {_batch_text(first)}, "
                    f"example {first.found_at})")
        else:
            what = "[bold red]SURVIVED[/]"
        console.print(f"[{i}/{total}] {escape(res.name)}: {what} in {res.seconds:.0f} s "
                      f"(elapsed {time.perf_counter() - start:.0f} s)")

    results = run_all(args.catalogue, names, workers=args.workers, profile=profile,
                      max_examples=args.max_examples or None, escalate=escalate, shrink_seconds=args.shrink_seconds,
                      budget=args.budget, properties=args.properties, progress=progress, first_kill=args.first_kill,
                      void=void)
    wall = time.perf_counter() - start
    print_matrix(results, prop_names, console)
    killed = sum(r.killed for r in results)
    broken = [r.name for r in results if r.load_error]
    survivors = [r.name for r in results if not r.killed and not r.load_error]
    console.print(f"{killed} of {len(results)} mutants killed in {wall:.0f} s"
                  + (f"; [bold red]survivors: {', '.join(survivors)}[/]" if survivors else "")
                  + (f"; [red]not loaded: {', '.join(broken)}[/]" if broken else "")
                  + (f"; [bold red]controls failed: {escape(str(failed_controls))}[/]" if failed_controls else ""))
    if args.report:
        meta = {"catalogue": args.catalogue, "profile": profile, "workers": args.workers,
                "max_examples": args.max_examples or "profile", "escalate_examples": escalate,
                "shrink_seconds": args.shrink_seconds,
                "budget_s": args.budget, "first_kill": args.first_kill, "wall_s": round(wall, 1),
                "device": "cpu (interpreter)" if device.resolve() == "cpu" else "cuda",  # the workers' choice
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": versions(),
                "controls": failed_controls or "every control passed every property"}
        paths = write_report(results, prop_names, args.report, meta)
        console.print(f"report: {paths['markdown']}, {paths['json']}", markup=False, highlight=False)
    if broken or failed_controls:
        return 2
    return 1 if survivors else 0


def run_controls(args, mutants: list, profile: str, console) -> tuple[dict, dict]:
    """Run every target build's control on every property (no first kill, no escalation).

    Returns `void` (mutant name -> properties its control failed) and the failed controls
    (control name -> those properties)."""
    by_control = {}
    for m in mutants:
        by_control.setdefault(control_name(m), []).append(m.name)
    console.print(f"controls (the unpatched builds, which must pass every property): {', '.join(by_control)}")
    results = run_all(args.catalogue, list(by_control), workers=args.workers, profile=profile,
                      max_examples=args.max_examples or None, shrink_seconds=args.shrink_seconds, budget=None,
                      properties=args.properties)
    failed = {r.name: r.killers for r in results if r.killers}
    for r in results:
        what = (f"[bold red]FAILED {', '.join(failed[r.name])}[/] (not counted as kills of its mutants)"
                if r.name in failed else "passed" if not r.load_error else f"[red]{escape(r.load_error)}[/]")
        console.print(f"{escape(r.name)}: {what} in {r.seconds:.0f} s")
    void = {name: failed.get(control, []) for control, names in by_control.items() for name in names}
    return void, failed


def add_arguments(p) -> None:
    p.add_argument("--profile", choices=profiles.PROFILE_NAMES, default=None,
                   help="Hypothesis profile (default: HYPOTHESIS_PROFILE, ci under CI, else dev)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    p.add_argument("--catalogue", default=DEFAULT_CATALOGUE, metavar="MODULE:ATTR",
                   help=f"the mutant list (default: {DEFAULT_CATALOGUE})")
    p.add_argument("--properties", nargs="+", metavar="PROPERTY", help="run only these properties")
    p.add_argument("--first-kill", action="store_true",
                   help="stop each mutant at its first kill (later properties: not run)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"time per mutant; properties not started by then are not run (default {DEFAULT_BUDGET:g})")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"worker processes (default {DEFAULT_WORKERS}; 0 runs in this process)")
    p.add_argument("--max-examples", type=int, default=0,
                   help="examples per property (default 0: the profile's own count, the budget that counts)")
    p.add_argument("--escalate", type=int, default=0, metavar="N",
                   help="diagnostic: re-run a surviving mutant's expected killers with N examples; such a "
                        "kill is marked k and is not a kill at the gate's budget (default 0: off)")
    p.add_argument("--shrink-seconds", type=float, default=DEFAULT_SHRINK_SECONDS,
                   help=f"shrinking time per failure (default {DEFAULT_SHRINK_SECONDS:g})")
    p.add_argument("--report", metavar="DIR", default=None, help="write mutants.md and mutants.json into DIR")
    p.add_argument("--from-json", metavar="PATH", nargs="+", default=None, help="run nothing: print (and with "
                   "--report write) the matrix of recorded runs (mutants.json), merged (--only: those mutants)")


def main(argv=None) -> int:
    """`python -m mutants [options]`: run the campaign and print (and optionally write) the kill matrix."""
    parser = argparse.ArgumentParser(prog="python -m mutants",
                                     description="The property library against the planted-bug catalogue.")
    add_arguments(parser)
    start = time.perf_counter()
    code = cmd_mutate(parser.parse_args(argv))
    print(f"total time {time.perf_counter() - start:.1f} s")
    return code
