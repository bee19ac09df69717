"""`python -m mutants`: the property library against a catalogue of planted bugs, as a kill matrix.

Each mutant (`mutants.catalogue.Mutant`: a patched in-memory copy of the Triton sampler or the
reference, see `mutants.mutation.load_patched`) runs in a worker process of a
`ProcessPoolExecutor` (spawned, so every worker picks its Triton backend before triton is
imported: the interpreter when there is no CUDA; one torch thread per worker). The worker
loads the Hypothesis profile, builds the mutant sampler and runs every registered property
on it through `rs_verify.engine.runner.run`, with the unpatched reference as the oracle, cheapest
property first (`COST_ORDER`).

Cost controls (the defaults aim at the whole catalogue within 20 minutes on 2 CPU cores
under the Triton interpreter):
- `max_examples` (default 10): examples per property instead of the profile's count; a
  property's `examples_scale` still applies. With the derandomized ci profile every mutant
  sees the same inputs.
- `shrink_seconds` (default 10): Hypothesis's shrink phase stops after this many seconds per
  failure (`hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS`, which Hypothesis
  keeps monkeypatchable for this), and only the first killing property of a mutant shrinks
  (its failing batch is the one reported); later ones stop at their first failing example.
- `escalate` (default 100): a mutant that no property killed gets a second, targeted pass:
  its expected killers (the catalogue's `killers`) with the profile's example count, then with
  this many; a kill there is recorded as `k`. Measured: the derandomized ci examples rarely combine stochastic model
  drafts, padded drafts and uncertain decisions, so a few mutants need 20-140 examples of
  `output_invariants` / `certified_equivalence`.
- `budget` (default 300 s per mutant): once spent, properties not started yet are recorded
  as not run (`?`) and no escalation starts.

Matrix cells: `K` killed (the property failed), `k` killed after escalation, `E` killed by an
exception (the sampler crashed on a valid input, or Hypothesis saw a flaky failure), `.`
survived, `-` skipped (the property does not apply: e.g. distribution campaigns need a fast
sampler), `?` not run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_CATALOGUE = "mutants.catalogue:MUTANTS"
DEFAULT_WORKERS = 2
DEFAULT_MAX_EXAMPLES = 10
DEFAULT_SHRINK_SECONDS = 10.0
DEFAULT_BUDGET = 300.0
DEFAULT_ESCALATE = 100

KILLED, ESCALATED, ERRORED, SURVIVED, SKIPPED, NOT_RUN = "K", "k", "E", ".", "-", "?"
KILLS = (KILLED, ESCALATED, ERRORED)
STATUS_SYMBOL = {"failed": KILLED, "error": ERRORED, "passed": SURVIVED, "skipped": SKIPPED}
LEGEND = {KILLED: "killed", ESCALATED: "killed only with the escalated example count",
          ERRORED: "killed by an exception (a crash on a valid input, or several distinct failures at once)",
          SURVIVED: "survived", SKIPPED: "skipped (does not apply)",
          NOT_RUN: "not run (budget spent)"}

# Measured seconds per example of the unpatched Triton sampler under the interpreter (ci
# profile, 2 shared cores); properties are run in this order, cheapest first. Properties
# not listed (plugins) run last in registry order.
COST_ORDER = (
    "planner",
    "rejects_bad_input",
    "unvalidated_in_bounds",
    "philox_streams",
    "stream_edges",
    "tiny_temperatures",
    "determinism",
    "greedy_chain",
    "buffer_within_cap",
    "blackbox_chunking",
    "batch_invariance",
    "chunked_equals_full",
    "certified_equivalence",
    "output_invariants",
    "closed_forms",
    "distribution_one_hot_drafts",
    "distribution_model_drafts",
    "peak_memory_within_cap",
)


def ordered_properties(names=None) -> list[str]:
    """Registered property names (restricted to `names`), cheapest first."""
    from rs_verify.properties import PROPERTIES

    rank = {n: i for i, n in enumerate(COST_ORDER)}
    order = sorted(PROPERTIES, key=lambda n: (rank.get(n, len(rank)), list(PROPERTIES).index(n)))
    return [n for n in order if names is None or n in names]


# -- data -----------------------------------------------------------------------------


@dataclass
class Cell:
    """One property run on one mutant."""

    property: str
    symbol: str
    seconds: float = 0.0
    examples: int = 0
    message: str = ""
    batch: dict | None = None  # R, N, V, K and summary of the failing (shrunk) batch
    found_at: int | None = None  # 1-based index of the example that first failed (before shrinking)
    max_examples: int | None = None  # the example cap it ran with


@dataclass
class MutantResult:
    name: str
    models: str = ""
    target: str = ""
    build: str = ""
    cells: list = field(default_factory=list)
    seconds: float = 0.0
    load_error: str = ""  # PatchError or build failure: the catalogue is out of sync

    def symbols(self) -> dict:
        return {c.property: c.symbol for c in self.cells}

    @property
    def killers(self) -> list[str]:
        return [c.property for c in self.cells if c.symbol in KILLS]

    @property
    def killed(self) -> bool:
        return bool(self.killers)

    def first_kill(self) -> Cell | None:
        return next((c for c in self.cells if c.symbol in KILLS), None)


# -- the catalogue --------------------------------------------------------------------


def load_catalogue(spec: str):
    """The mutant list named by `module:attribute` (a module of the current directory is found too)."""
    from rs_verify.engine.samplers import _import

    if ":" not in spec:
        raise ValueError(f"catalogue {spec!r}: expected module:attribute")
    module_name, attr = spec.split(":", 1)
    module = _import(module_name)
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
    """Process initializer: backend (interpreter without CUDA), torch threads, profile, shrink limit."""
    import sys

    import torch

    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if threads:
        torch.set_num_threads(threads)
    from rs_verify.engine import profiles

    profiles.load(profile)
    if shrink_seconds is not None:
        from hypothesis.internal.conjecture import engine

        engine.MAX_SHRINKING_SECONDS = shrink_seconds


def _batch_info(failure) -> dict | None:
    from rs_verify.spec.batch import SpecBatch
    from rs_verify.frontends.report import failing_input
    from rs_verify.engine.runner import Result

    batch, drawn = failing_input(Result("", "failed", failure=failure))
    if batch is None:
        for cand in (drawn, drawn[0] if isinstance(drawn, tuple) and drawn else None):
            if isinstance(cand, SpecBatch):
                batch = cand
                break
    if not isinstance(batch, SpecBatch):
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
               phases=None) -> MutantResult:
    """Run the properties (cheapest first) against one mutant of `catalogue`; never raises for a kill.

    - `max_examples`: examples per property (None: the profile's); `phases`: Hypothesis phases
      (None: all, shrinking included).
    - `escalate`: when no property killed the mutant, re-run its expected killers (the
      catalogue's `killers`; every survived property, cheapest first, when it names none) with
      more examples until one kills it: the profile's count, then `escalate`
      (`escalation_tiers`); that cell becomes `k`. None or 0: no escalation.
    - `budget`: seconds; properties not started by then are recorded as not run.
    - `properties`: restrict to these property names.
    """
    from hypothesis import settings
    from hypothesis.errors import HypothesisWarning
    from hypothesis.reporting import with_reporter

    from rs_verify.engine import profiles, runner
    from rs_verify.properties import PROPERTIES

    start = time.perf_counter()
    _, mutants = load_catalogue(catalogue)
    mutant = next(m for m in mutants if m.name == name)
    result = MutantResult(name, mutant.models, mutant.target, mutant.build)
    names = ordered_properties(properties)
    try:
        sampler = mutant.sampler()
    except Exception as exc:  # noqa: BLE001 - PatchError or a build failure: reported, not a kill
        result.load_error = _first_line(exc)
        result.cells = [Cell(n, NOT_RUN) for n in names]
        return result
    from reference import ReferenceSampler

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
        prop, first_failure = _counting(PROPERTIES[pname])
        res = runner.run(prop, ctx, cfg)
        cell = Cell(pname, STATUS_SYMBOL.get(res.status, ERRORED), round(res.seconds, 2), res.examples,
                    max_examples=cfg.max_examples)
        if res.failure is not None:
            cell.message = _first_line(res.failure)
            cell.batch = _batch_info(res.failure)
            cell.found_at = first_failure[0]
        elif res.status == "skipped":
            cell.message = res.message
        return cell

    def spent() -> bool:
        return budget is not None and time.perf_counter() - start > budget

    with with_reporter(lambda _msg: None), warnings.catch_warnings():
        warnings.simplefilter("ignore", HypothesisWarning)  # e.g. "overly large repr" of a failing batch
        for pname in names:
            result.cells.append(Cell(pname, NOT_RUN) if spent() else
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


def _counting(prop):
    """`prop` with a check that records the 1-based index of the first example that fails."""
    import dataclasses

    calls, first = [0], [None]

    def check(ctx, drawn):
        calls[0] += 1
        try:
            prop.check(ctx, drawn)
        except Exception:
            if first[0] is None:
                first[0] = calls[0]
            raise

    return dataclasses.replace(prop, check=check), first


def _pool_task(args) -> dict:
    catalogue, name, profile, max_examples, escalate, budget, properties = args
    return asdict(run_mutant(catalogue, name, profile=profile, max_examples=max_examples, escalate=escalate,
                             budget=budget, properties=properties))


def _from_dict(d: dict) -> MutantResult:
    cells = [Cell(**c) for c in d.pop("cells")]
    return MutantResult(cells=cells, **d)


def run_all(catalogue: str, names: list[str], *, workers: int = DEFAULT_WORKERS, profile: str | None = None,
            max_examples: int | None = DEFAULT_MAX_EXAMPLES, escalate: int | None = None,
            shrink_seconds: float | None = DEFAULT_SHRINK_SECONDS, budget: float | None = DEFAULT_BUDGET,
            properties: list[str] | None = None, progress=None) -> list[MutantResult]:
    """Every named mutant through `run_mutant`, `workers` at a time (0: in this process)."""
    tasks = [(catalogue, n, profile, max_examples, escalate, budget, properties) for n in names]
    results: dict[str, MutantResult] = {}

    def done(res: MutantResult):
        results[res.name] = res
        if progress is not None:
            progress(res, len(results), len(tasks))

    if workers <= 0:  # in this process: the profile and the shrink limit are restored afterwards
        from hypothesis import settings
        from hypothesis.internal.conjecture import engine

        saved = settings.get_current_profile_name(), engine.MAX_SHRINKING_SECONDS
        try:
            init_worker(profile, shrink_seconds, threads=0)
            for t in tasks:
                done(_from_dict(_pool_task(t)))
        finally:
            settings.load_profile(saved[0])
            engine.MAX_SHRINKING_SECONDS = saved[1]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

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


# -- analysis -------------------------------------------------------------------------


def property_summary(results: list[MutantResult], prop_names: list[str]) -> dict:
    """Per property: mutants it kills, and the mutants that only it kills."""
    out = {}
    for p in prop_names:
        kills = [r.name for r in results if p in r.killers]
        only = [r.name for r in results if r.killers == [p]]
        out[p] = {"kills": kills, "only": only}
    return out


def abbreviations(names: list[str]) -> dict:
    """Short, unique column labels: the initials of the words of each property name."""
    out, used = {}, set()
    for n in names:
        base = "".join(w[0] for w in n.split("_") if w)
        label, i = base, 2
        while label in used:
            label, i = f"{base}{i}", i + 1
        used.add(label)
        out[n] = label
    return out


def _batch_text(cell: Cell | None) -> str:
    if cell is None or not cell.batch:
        return "-"
    b = cell.batch
    return f"R={b['R']}, N={b['N']}, V={b['V']}"


# -- rendering ------------------------------------------------------------------------


def print_matrix(results: list[MutantResult], prop_names: list[str], console, why_kept: dict | None = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    abbr = abbreviations(prop_names)
    style = {KILLED: "green", ESCALATED: "cyan", ERRORED: "yellow", SURVIVED: "bold red", SKIPPED: "dim",
             NOT_RUN: "magenta"}
    table = Table(title="kill matrix (mutant x property)", show_lines=False)
    table.add_column("mutant", no_wrap=True)
    for p in prop_names:
        table.add_column(abbr[p], justify="center")
    table.add_column("first killer", no_wrap=True)
    table.add_column("minimal batch", no_wrap=True)
    for r in results:
        sym = r.symbols()
        first = r.first_kill()
        name = f"[bold red]{escape(r.name)}[/]" if not r.killed else escape(r.name)
        row = [name] + [f"[{style[sym.get(p, NOT_RUN)]}]{sym.get(p, NOT_RUN)}[/]" for p in prop_names]
        if r.load_error:
            row += [f"[red]{escape(r.load_error[:60])}[/]", "-"]
        else:
            row += [escape(first.property) if first else "[bold red]SURVIVED[/]", _batch_text(first)]
        table.add_row(*row)
    console.print(table)
    console.print("cells: " + ", ".join(f"{k} {v}" for k, v in LEGEND.items()))
    summary = property_summary(results, prop_names)
    props = Table(title="properties")
    for col in ("column", "property", "kills", "only it kills"):
        props.add_column(col)
    for p in prop_names:
        s = summary[p]
        only = ", ".join(s["only"]) if s["only"] else "-"
        props.add_row(abbr[p], p, str(len(s["kills"])), escape(f"{len(s['only'])}: {only}" if s["only"] else only))
    console.print(props)


def markdown(results: list[MutantResult], prop_names: list[str], meta: dict, why_kept: dict | None = None) -> str:
    why_kept = why_kept or {}
    abbr = abbreviations(prop_names)
    killed = sum(r.killed for r in results)
    run = [f"- {k}: {v}" for k, v in meta.items() if k != "versions"]
    if isinstance(meta.get("versions"), dict):
        run.append("- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    lines = [
        "# Mutation analysis: the kill matrix",
        "",
        f"**{killed} of {len(results)} mutants killed.** Generated by `python -m mutants`: every mutant is a planted "
        "bug from `mutants/catalogue.py`, applied in memory with `mutants.mutation.load_patched`, and run "
        "against every property (cheapest first) with the unpatched reference as the oracle.",
        "",
        *run,
        "",
        "## Mutants",
        "",
        "First killing property: the first, in the cheapest-first order, that failed (`k`: only in the escalation "
        "pass, with the example cap shown). Minimal batch: the failing batch of that property after Hypothesis "
        "shrinking (limited in time), as `PropertyFailure.batch` holds it; certification and the output "
        "invariants verify each drawn batch with 3 reseeded copies, so their R and N are 4x the drawn batch's; "
        "the fixed campaigns have fixed batches. Example: the 1-based index of the first failing example.",
        "",
        "| mutant | target | real-world bug it models | first killing property | minimal batch | example | "
        "properties killing it | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        first = r.first_kill()
        if first is None:
            killer = "**patch error**" if r.load_error else "**SURVIVED**"
        else:
            killer = f"`{first.property}`" + (f" (k, {first.max_examples} examples)" if first.symbol == ESCALATED
                                              else " (E)" if first.symbol == ERRORED else "")
        target = "triton" if r.target.endswith("triton_sampler") else r.target
        batch = _batch_text(first) if first is None or first.batch else "fixed campaign"
        example = first.found_at if first is not None and first.found_at else "-"
        lines.append(f"| `{r.name}` | {target} | {_md(r.models)} | {killer} | {batch} | {example} | "
                     f"{len(r.killers)} | {r.seconds:.0f} |")
    lines += ["", "## Kill matrix", "",
              "Cells: " + ", ".join(f"`{k}` {v}" for k, v in LEGEND.items()) + ". Columns, cheapest property first:",
              ""]
    lines.append("| mutant | " + " | ".join(abbr[p] for p in prop_names) + " |")
    lines.append("|---|" + "---|" * len(prop_names))
    for r in results:
        sym = r.symbols()
        lines.append(f"| `{r.name}` | " + " | ".join(sym.get(p, NOT_RUN).replace(".", "·") for p in prop_names)
                     + " |")
    lines += ["", "## Properties", "",
              "Mutants only it kills: those no other property killed in this run (an escalated mutant's other "
              "properties ran at the base example count only). Why it is kept: for a property that is no "
              "mutant's sole killer, from `WHY_KEPT` in the catalogue.", "",
              "| column | property | mutants killed | mutants only it kills | why it is kept |",
              "|---|---|---|---|---|"]
    summary = property_summary(results, prop_names)
    for p in prop_names:
        s = summary[p]
        only = ", ".join(f"`{n}`" for n in s["only"]) if s["only"] else "none"
        why = why_kept.get(p, "") if not s["only"] else "sole killer of the mutants listed"
        lines.append(f"| {abbr[p]} | `{p}` | {len(s['kills'])} | {only} | {_md(why)} |")
    survivors = [r for r in results if not r.killed]
    if survivors:
        lines += ["", "## Survivors", ""]
        for r in survivors:
            lines.append(f"- `{r.name}`: {_md(r.load_error or r.models)}")
    lines += ["", "## Failure of the first killing property, per mutant", ""]
    for r in results:
        first = r.first_kill()
        if first:
            lines.append(f"- `{r.name}` / `{first.property}` (`{first.symbol}`, {first.seconds:.1f} s, "
                         f"{first.examples} calls): {_md(first.message)}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def load_results(path) -> tuple[list[MutantResult], list[str], dict]:
    """The results, property order and metadata of a `mutants.json` written by `write_report`."""
    doc = json.loads(Path(path).read_text())
    results = []
    for m in doc["mutants"]:
        d = {k: v for k, v in m.items() if k in MutantResult.__dataclass_fields__}
        results.append(_from_dict(d))
    return results, list(doc["properties"]), dict(doc["meta"])


def write_report(results: list[MutantResult], prop_names: list[str], out_dir, meta: dict,
                 why_kept: dict | None = None) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = property_summary(results, prop_names)
    doc = {
        "meta": meta,
        "legend": LEGEND,
        "properties": prop_names,
        "columns": abbreviations(prop_names),
        "mutants": [asdict(r) | {"killed": r.killed, "killers": r.killers,
                                 "first_killer": (r.first_kill().property if r.first_kill() else None)}
                    for r in results],
        "property_summary": {p: summary[p] | {"why_kept": (why_kept or {}).get(p, "")} for p in prop_names},
        "score": {"killed": sum(r.killed for r in results), "total": len(results)},
    }
    paths = {"json": out / "mutants.json", "markdown": out / "mutants.md"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(results, prop_names, meta, why_kept))
    return paths


# -- the command ----------------------------------------------------------------------


def cmd_mutate(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if args.from_json:  # re-render a recorded run
        try:
            results, prop_names, meta = load_results(args.from_json)
            module, _ = load_catalogue(meta.get("catalogue", args.catalogue))
        except (OSError, ValueError, KeyError, ImportError) as exc:
            console.print(f"[red]python -m mutants: cannot re-render {escape(args.from_json)}: {escape(str(exc))}[/]")
            return 2
        why_kept = getattr(module, "WHY_KEPT", {})
        print_matrix(results, prop_names, console, why_kept)
        if args.report:
            paths = write_report(results, prop_names, args.report, meta, why_kept)
            console.print(f"report: {paths['markdown']}, {paths['json']}", markup=False, highlight=False)
        return 0 if all(r.killed for r in results) else 1
    try:
        module, mutants = load_catalogue(args.catalogue)
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
    from rs_verify.properties import PROPERTIES

    if args.properties:
        unknown = [p for p in args.properties if p not in PROPERTIES]
        if unknown:
            console.print(f"[red]python -m mutants: unknown properties {unknown}; see `rs-verify list`[/]")
            return 2
    prop_names = ordered_properties(args.properties)
    from rs_verify.engine import profiles

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
                      budget=args.budget, properties=args.properties, progress=progress)
    wall = time.perf_counter() - start
    why_kept = getattr(module, "WHY_KEPT", {})
    print_matrix(results, prop_names, console, why_kept)
    killed = sum(r.killed for r in results)
    broken = [r.name for r in results if r.load_error]
    survivors = [r.name for r in results if not r.killed and not r.load_error]
    console.print(f"{killed} of {len(results)} mutants killed in {wall:.0f} s"
                  + (f"; [bold red]survivors: {', '.join(survivors)}[/]" if survivors else "")
                  + (f"; [red]not loaded: {', '.join(broken)}[/]" if broken else ""))
    if args.report:
        from rs_verify.engine.bundle import versions

        meta = {"catalogue": args.catalogue, "profile": profile, "workers": args.workers,
                "max_examples": args.max_examples or "profile", "escalate_examples": escalate,
                "shrink_seconds": args.shrink_seconds,
                "budget_s": args.budget, "wall_s": round(wall, 1),
                "device": "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and _cuda() else "cpu (interpreter)",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": versions()}
        paths = write_report(results, prop_names, args.report, meta, why_kept)
        console.print(f"report: {paths['markdown']}, {paths['json']}", markup=False, highlight=False)
    if broken:
        return 2
    return 1 if survivors else 0


def _cuda() -> bool:
    from rs_verify.engine.runner import cuda_available

    return cuda_available()


def add_arguments(p) -> None:
    p.add_argument("--profile", choices=("dev", "ci", "gpu", "nightly"), default=None,
                   help="Hypothesis profile (default: HYPOTHESIS_PROFILE, ci under CI, else dev)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    p.add_argument("--catalogue", default=DEFAULT_CATALOGUE, metavar="MODULE:ATTR",
                   help=f"the mutant list (default: {DEFAULT_CATALOGUE})")
    p.add_argument("--properties", nargs="+", metavar="PROPERTY", help="run only these properties")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"time per mutant; properties not started by then are not run (default {DEFAULT_BUDGET:g})")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"worker processes (default {DEFAULT_WORKERS}; 0 runs in this process)")
    p.add_argument("--max-examples", type=int, default=DEFAULT_MAX_EXAMPLES,
                   help=f"examples per property (default {DEFAULT_MAX_EXAMPLES}; 0: the profile's)")
    p.add_argument("--escalate", type=int, default=DEFAULT_ESCALATE, metavar="N",
                   help="examples per expected killer when re-running a mutant no property killed "
                        f"(default {DEFAULT_ESCALATE}; 0: no escalation)")
    p.add_argument("--shrink-seconds", type=float, default=DEFAULT_SHRINK_SECONDS,
                   help=f"shrinking time per failure (default {DEFAULT_SHRINK_SECONDS:g})")
    p.add_argument("--report", metavar="DIR", default=None, help="write mutants.md and mutants.json into DIR")
    p.add_argument("--from-json", metavar="PATH", default=None,
                   help="run nothing: print (and with --report write) the matrix of a recorded mutants.json")


def main(argv=None) -> int:
    """`python -m mutants [options]`: run the campaign and print (and optionally write) the kill matrix."""
    parser = argparse.ArgumentParser(prog="python -m mutants",
                                     description="The property library against the planted-bug catalogue.")
    add_arguments(parser)
    start = time.perf_counter()
    code = cmd_mutate(parser.parse_args(argv))
    print(f"total time {time.perf_counter() - start:.1f} s")
    return code
