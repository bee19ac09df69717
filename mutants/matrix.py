"""The kill matrix: per mutant and property, whether the property killed the mutant; rendered as a
rich table, Markdown and JSON (`benchmarks/results/mutants/`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from rs_verify.frontends.report import markdown_table, md_cell
from rs_verify.properties import PROPERTIES, by_cost

KILLED, ESCALATED, ERRORED, SURVIVED, SKIPPED, NOT_RUN = "K", "k", "E", ".", "-", "?"
KILLS = (KILLED, ERRORED)  # an escalated kill (k) is not a kill at the gate's budget
STATUS_SYMBOL = {"failed": KILLED, "error": ERRORED, "passed": SURVIVED, "skipped": SKIPPED}
LEGEND = {KILLED: "killed", ESCALATED: "failed only with the escalated example count (not a kill at the gate's budget)",
          ERRORED: "killed by an exception (a crash on a valid input, or several distinct failures at once)",
          SURVIVED: "survived", SKIPPED: "skipped (does not apply)",
          NOT_RUN: "not run (budget spent, the first kill reached under --first-kill, or not among the run's --properties)"}


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


def print_matrix(results: list[MutantResult], prop_names: list[str], console) -> None:
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


def markdown(results: list[MutantResult], prop_names: list[str], meta: dict) -> str:
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
        "against every property (cheapest first) with the unpatched reference as the oracle."
        + (" Merged from runs restricted to the properties each part lists below (`merged from`): `?` also "
           "marks a property a part did not run." if "merged from" in meta else ""),
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
    ]
    rows = []
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
        rows.append([f"`{r.name}`", target, md_cell(r.models), killer, batch, example, len(r.killers),
                     f"{r.seconds:.0f}"])
    lines += markdown_table(["mutant", "target", "real-world bug it models", "first killing property",
                             "minimal batch", "example", "properties killing it", "seconds"], rows)
    lines += ["", "## Kill matrix", "",
              "Cells: " + ", ".join(f"`{k}` {v}" for k, v in LEGEND.items()) + ". Columns, cheapest property first:",
              ""]
    lines += markdown_table(["mutant", *(abbr[p] for p in prop_names)],
                            [[f"`{r.name}`", *(r.symbols().get(p, NOT_RUN).replace(".", "·") for p in prop_names)]
                             for r in results])
    lines += ["", "## Properties", "",
              "Mutants only it kills: those no other property killed in this run (an escalated mutant's other "
              "properties ran at the base example count only). Why it is kept: for a property that is no "
              "mutant's sole killer, the `why_kept` of its `register(...)` call (`rs_verify.properties`).", "",
              ]
    summary = property_summary(results, prop_names)
    rows = []
    for p in prop_names:
        s = summary[p]
        only = ", ".join(f"`{n}`" for n in s["only"]) if s["only"] else "none"
        why = "sole killer of the mutants listed" if s["only"] else (PROPERTIES[p].why_kept if p in PROPERTIES else "")
        rows.append([abbr[p], f"`{p}`", len(s["kills"]), only, md_cell(why)])
    lines += markdown_table(["column", "property", "mutants killed", "mutants only it kills", "why it is kept"], rows)
    survivors = [r for r in results if not r.killed]
    if survivors:
        lines += ["", "## Survivors", ""]
        for r in survivors:
            lines.append(f"- `{r.name}`: {md_cell(r.load_error or r.models)}")
    lines += ["", "## Failure of the first killing property, per mutant", ""]
    for r in results:
        first = r.first_kill()
        if first:
            lines.append(f"- `{r.name}` / `{first.property}` (`{first.symbol}`, {first.seconds:.1f} s, "
                         f"{first.examples} calls): {md_cell(first.message)}")
    return "\n".join(lines) + "\n"


def load_results(path) -> tuple[list[MutantResult], list[str], dict]:
    """The results, property order and metadata of a `mutants.json` written by `write_report`."""
    doc = json.loads(Path(path).read_text())
    results = []
    for m in doc["mutants"]:
        d = {k: v for k, v in m.items() if k in MutantResult.__dataclass_fields__}
        results.append(_from_dict(d))
    return results, list(doc["properties"]), dict(doc["meta"])


def merge_results(paths, only=None) -> tuple[list[MutantResult], list[str], dict]:
    """Several recorded runs (`mutants.json` files) as one matrix: each mutant from the one run that
    holds it (a mutant in two runs is an error), the properties of all runs cheapest first, and the
    metadata the runs share, with one line per run for what differs (its mutants, properties, time).
    A property a run did not include shows as not run for that run's mutants. `only`: keep these
    mutants of each run (the others are dropped before the check for duplicates)."""
    if len(paths) == 1 and only is None:
        return load_results(paths[0])
    results, props, metas, seen = [], set(), [], {}
    for path in paths:
        part, part_props, meta = load_results(path)
        part = [r for r in part if only is None or r.name in only]
        for r in part:
            if r.name in seen:
                raise ValueError(f"mutant {r.name} is in both {seen[r.name]} and {path}")
            seen[r.name] = path
        results += part
        props.update(part_props)
        metas.append((path, part, part_props, meta))
    shared = {k: v for k, v in metas[0][3].items() if all(m.get(k) == v for *_, m in metas)}
    lines = []
    for path, part, part_props, meta in metas:
        own = {k: v for k, v in meta.items() if k not in shared and k != "versions"}
        which = ("all properties" if len(metas) > 1 and set(part_props) == props
                 else "properties " + ", ".join(part_props))
        lines.append(f"{path}: {len(part)} mutants, {which}; " + ", ".join(f"{k} {v}" for k, v in own.items()))
    order = [p for p in by_cost() if p in props] + sorted(props - set(PROPERTIES))
    return results, order, {**shared, "merged from": " | ".join(lines)}


def write_report(results: list[MutantResult], prop_names: list[str], out_dir, meta: dict,
                 ) -> dict:
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
        "property_summary": {p: summary[p] | {"why_kept": PROPERTIES[p].why_kept if p in PROPERTIES else ""} for p in prop_names},
        "score": {"killed": sum(r.killed for r in results), "total": len(results)},
    }
    paths = {"json": out / "mutants.json", "markdown": out / "mutants.md"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    paths["markdown"].write_text(markdown(results, prop_names, meta))
    return paths


def _from_dict(d: dict) -> MutantResult:
    cells = [Cell(**c) for c in d.pop("cells")]
    return MutantResult(cells=cells, **d)


