"""The table `rs-verify releases` writes: `releases.md`, `releases.json` and `catalogue.toml`.

First a matrix, one row per release and adapter: what the adapter declared and detected in the
release (stream family, block seed, draft-logit convention, verification methods, declared
deviations, logit bound: the plugin's "rs-verify: sampler" section), its passed / failed /
skipped counts, and each failing property in one line with its SPEC clause. Then the
per-property detail, the deviations each adapter's rules decided and what each run exercised.
`releases.json` carries the same (`matrix`, `cells`, `exercised`, `meta` with the resolved pins);
`catalogue.toml` is a catalogue of the releases as installed (their pins), so that
`rs-verify releases ... --catalogue catalogue.toml` repeats the run with the same dependencies.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

@dataclass
class Cell:
    release: str
    adapter: str
    property: str  # "-" for a cell about the whole adapter (install, load)
    status: str  # passed | failed | skipped | xfail | error
    message: str = ""  # a failure's first line, a skip's reason, an error's cause
    replay: str = ""  # the command that replays a failure from its bundle
    seconds: float = 0.0


@dataclass
class Exercised:
    """What one adapter's run exercised, as the plugin's summary says it (its two sections): the
    verification methods and parameters it answered, each declared deviation (SPEC 11) with the
    decisions its rule decided or "never reached", and what the sampler declared away."""
    release: str
    adapter: str
    exercised: list
    not_exercised: list
    declared: list = field(default_factory=list)  # "key: value": what the sampler declared and detected

    def detection(self) -> dict:
        return dict(line.split(": ", 1) for line in self.declared if ": " in line)

    def deviations(self) -> list:
        return [line.removeprefix("deviation ") for line in self.exercised if line.startswith("deviation ")]


DETECTED = ("streams", "block_seed", "draft_logits", "verification", "deviations", "logit_bound")
SPEC_CLAUSE = re.compile(r"SPEC (?:sections? )?(\d+[a-d]?(?:(?:,| and) \d+[a-d]?)*)")
STATUSES = ("passed", "failed", "skipped", "xfail", "error")


def spec_clause(prop: str, message: str) -> str:
    """The SPEC clause a failure names, else the one its property's description names ("" if none)."""
    m = SPEC_CLAUSE.search(message or "")
    if m is None:
        try:
            from ..properties import PROPERTIES  # noqa: PLC0415 - the table needs it only for a failure
            m = SPEC_CLAUSE.search(PROPERTIES[prop].doc) if prop in PROPERTIES else None
        except ImportError:
            m = None
    return f"SPEC {m.group(1)}" if m else ""


def matrix(cells: list, done: list) -> list[dict]:
    """One row per (release, adapter) in table order."""
    declared = {(d.release, d.adapter): d.detection() for d in done}
    rows: dict = {}
    for c in cells:
        row = rows.setdefault((c.release, c.adapter), {"release": c.release, "adapter": c.adapter,
                                                       "detected": declared.get((c.release, c.adapter), {}),
                                                       **{s: 0 for s in STATUSES}, "failures": []})
        if c.property == "-" and c.status in ("skipped", "error"):
            row["failures" if c.status == "error" else "skipped_why"] = (
                [c.message] if c.status == "error" else c.message)
        row[c.status] += 1
        if c.status == "failed":
            clause = spec_clause(c.property, c.message)
            row["failures"].append(f"{c.property}" + (f" ({clause})" if clause else "") + f": {c.message}")
    return list(rows.values())


def _version_key(spec: str):
    name, _, version = spec.partition("==")
    try:
        return name, 0, Version(version)
    except InvalidVersion:
        return name, 1, version


def changes(rows: list[dict]) -> list[str]:
    """What changed between consecutive releases of each package in the matrix: adapters gained or
    lost, and each detected fact (DETECTED, and the adapter's own) that differs."""
    by_release: dict = {}
    for row in rows:
        by_release.setdefault(row["release"], {})[row["adapter"]] = row
    out = []
    specs = sorted(by_release, key=_version_key)
    for old, new in zip(specs, specs[1:]):
        if old.partition("==")[0] != new.partition("==")[0]:
            continue
        said = []
        for adapter in sorted(set(by_release[old]) | set(by_release[new])):
            a, b = by_release[old].get(adapter), by_release[new].get(adapter)
            short = adapter.rsplit(".", 1)[-1]
            gone_a, gone_b = (r is None or not r["detected"] for r in (a, b))
            if gone_a != gone_b:
                said.append(f"`{short}` " + ("gained" if gone_a else f"lost ({_md((b or {}).get('skipped_why', ''))})"))
            elif not gone_a:
                diff = [f"{k} {a['detected'].get(k, '-')} -> {b['detected'].get(k, '-')}"
                        for k in dict.fromkeys([*a["detected"], *b["detected"]])
                        if a["detected"].get(k) != b["detected"].get(k) and k != "interpreted"]
                said += [f"`{short}`: " + "; ".join(diff)] if diff else []
        out.append(f"- {old} -> {new}: " + ("; ".join(said) if said else "no detected change"))
    return out


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(cells: list, meta: dict, done: list | None = None) -> str:
    done = done or []
    lines = [f"# rs-verify releases ({meta['created']})", "",
             f"Profile `{meta['profile']}`" + (f", `-k {meta['keyword']}`" if meta.get("keyword") else "")
             + (f", at most {meta['max_examples']} examples" if meta.get("max_examples") else "")
             + (f", baseline `{meta['baseline']}`" if meta.get("baseline") else "")
             + f", device {meta['device']}; cache `{meta['cache']}`.", "",
             "## Matrix", "",
             "| release | adapter | " + " | ".join(DETECTED) + " | passed | failed | skipped | failing (SPEC clause) |",
             "|" + "---|" * (len(DETECTED) + 6)]
    for row in matrix(cells, done):
        det = row["detected"]
        failing = "<br>".join(_md(f) for f in row["failures"]) or _md(row.get("skipped_why", ""))
        lines.append(f"| {row['release']} | `{row['adapter'].rsplit('.', 1)[-1]}` | "
                     + " | ".join(f"{_md(det.get(k, ''))}" for k in DETECTED)
                     + f" | {row['passed']} | {row['failed'] + row['error']} | {row['skipped']} | {failing} |")
    counts = {s: sum(c.status == s for c in cells) for s in STATUSES}
    changed = changes(matrix(cells, done))
    if changed:
        lines += ["", "## What changed between consecutive releases", "", *changed]
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells", "",
              "## Per property", "", "| release | adapter | property | result | detail |", "|---|---|---|---|---|"]
    for c in cells:
        detail = _md(c.message)
        if c.replay:
            detail += f"<br>replay: `{c.replay}`"
        lines.append(f"| {c.release} | `{c.adapter}` | {c.property} | {c.status} | {detail} |")
    lines.append("")
    if done:
        lines += ["## Declared deviations (SPEC 11), per release and adapter", "",
                  "| release | adapter | deviation: decisions its rule decided |", "|---|---|---|"]
        lines += [f"| {d.release} | `{d.adapter}` | {'<br>'.join(d.deviations()) or 'none declared'} |" for d in done]
        lines += ["", "## Exercised and declared away, per adapter", ""]
        for d in done:
            lines += [f"- {d.release} `{d.adapter}`:"]
            lines += [f"  - {line}" for line in d.exercised]
            lines += [f"  - not exercised: {line}" for line in d.not_exercised]
        lines.append("")
    pins = meta.get("pins") or {}
    if pins:
        lines += ["## Installed", ""]
        for spec, what in pins.items():
            lines.append(f"- {spec}: {len(what['pins'])} packages beside the wheel"
                         + (f", {len(what['left_out'])} left out ({', '.join(sorted(what['left_out']))})"
                            if what.get("left_out") else "") + "; `catalogue.toml` has them")
        lines.append("")
    return "\n".join(lines)


def catalogue_toml(meta: dict) -> str:
    """The releases as installed, as a catalogue (`--catalogue`) that repeats the run's dependencies."""
    out = ["# The releases of this run as installed: rs-verify releases SPEC... --catalogue catalogue.toml", ""]
    for spec, what in (meta.get("pins") or {}).items():
        out.append(f'["{spec}"]')
        out.append("pure_python = [" + ", ".join(json.dumps(p) for p in what["pins"]) + "]")
        if what.get("env"):
            out.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in what["env"].items()) + " }")
        out.append("")
    return "\n".join(out)


def write(cells: list, out: Path, meta: dict, done: list | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "releases.md", "json": out / "releases.json", "catalogue": out / "catalogue.toml"}
    paths["markdown"].write_text(markdown(cells, meta, done))
    paths["json"].write_text(json.dumps({"meta": meta, "matrix": matrix(cells, done or []),
                                         "cells": [asdict(c) for c in cells],
                                         "exercised": [asdict(d) for d in done or []]}, indent=1))
    paths["catalogue"].write_text(catalogue_toml(meta))
    return paths


def combine(directories: list) -> tuple[list, list, dict]:
    """The cells, exercised sections and metadata of several runs' `releases.json`, as one run's
    (a later run's cells replace an earlier run's for the same release and adapter)."""
    cells: dict = {}
    done: dict = {}
    meta: dict = {"pins": {}, "releases": [], "runs": []}
    for d in directories:
        table = json.loads((Path(d) / "releases.json").read_text())
        run = [Cell(**c) for c in table["cells"]]
        for key in {(c.release, c.adapter) for c in run}:
            cells[key] = [c for c in run if (c.release, c.adapter) == key]
        done.update({(e["release"], e["adapter"]): Exercised(**e) for e in table.get("exercised", [])})
        meta["pins"].update(table["meta"].get("pins") or {})
        meta["releases"] += [r for r in table["meta"]["releases"] if r not in meta["releases"]]
        meta["runs"].append({k: table["meta"].get(k) for k in ("created", "profile", "keyword", "max_examples")})
        meta.update({k: table["meta"].get(k) for k in ("profile", "keyword", "max_examples", "cache", "device",
                                                        "created")})
    order = sorted(cells, key=lambda k: (_version_key(k[0]), k[1]))
    return [c for k in order for c in cells[k]], [done[k] for k in order if k in done], meta
