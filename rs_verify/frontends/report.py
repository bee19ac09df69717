"""Reports of a `rs-verify check` run: `report.json`, `report.md` and PNG plots.

- a results table (property, status, examples, excused divergences, failures, time);
- per distribution campaign (the fits a distribution property leaves in `ctx.stats["fits"]`):
  observed vs expected token frequencies with binomial confidence bands, one figure per
  campaign with one panel per fit (`<property>.png`);
- acceptance-length histograms against the closed-form expectation (the fits labelled
  "acceptance length", `<property>-acceptance.png`);
- for a failing chunking property, the chunk layout of the failing batch: requests as bars
  of their row counts, the chunk boundaries of `iter_request_chunks` at the failing cap
  (`<property>-chunks.png`).

matplotlib (the `report` extra) is imported lazily with the Agg backend; without it the JSON
and Markdown reports are still written and the report says the plots were skipped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from ..properties import PROPERTIES
from ..properties.distribution import campaign_power
from ..contract.batch import SpecBatch
from ..contract.chunking import iter_request_chunks

BAND = 0.99  # confidence of the per-token binomial bands drawn around the expected frequency
MAX_TOKENS_PLOTTED = 64


# -- data ------------------------------------------------------------------------


def _json_safe(x):
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return _json_safe(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return v if math.isfinite(v) else repr(v)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return repr(x)


def fit_record(fit) -> dict:
    return {
        "label": fit.label,
        "n": int(fit.n),
        "statistic": _json_safe(fit.statistic),
        "pvalue": _json_safe(fit.pvalue),
        "observed": _json_safe(np.asarray(fit.observed)),
        "expected": _json_safe(np.asarray(fit.expected)),
    }


def is_acceptance_fit(fit) -> bool:
    return "acceptance length" in fit.label


def failing_input(outcome):
    """(batch, drawn) of a failed outcome, from its Failure record (the shrunk input)."""
    failure = outcome.failure
    if failure is None:
        return None, None
    return failure.failing_batch(), failure.drawn


def chunk_cap(drawn) -> int | None:
    """The chunk cap of a `(batch, cap)` draw (the chunking and memory properties), else None."""
    if isinstance(drawn, tuple) and len(drawn) == 2 and isinstance(drawn[0], SpecBatch) \
            and isinstance(drawn[1], (int, np.integer)) and not isinstance(drawn[1], bool):
        return int(drawn[1])
    return None


def result_record(result) -> dict:
    prop = PROPERTIES.get(result.name)
    batch, drawn = failing_input(result)
    rec = {
        "property": result.name,
        "family": prop.family if prop else None,
        "doc": prop.doc if prop else None,
        "status": result.status,
        "examples": result.examples,
        "excused": result.excused,
        "failures": int(result.status == "failed"),
        "seconds": round(result.seconds, 3),
        "message": result.message,
        "reason": result.reason,
        "self_check": bool(getattr(result, "self_check", False)),
        "bundles": [str(b) for b in getattr(result, "bundles", [])],
        "fits": [fit_record(f) for f in (getattr(result, "stats", {}) or {}).get("fits", [])],
        "sent": dict((getattr(result, "stats", {}) or {}).get("sent", {})),  # answered batches per SPEC 2 / 4b feature
    }
    if batch is not None:
        rec["failing_batch"] = batch.summary()
    cap = chunk_cap(drawn)
    if cap is not None:
        rec["failing_cap"] = cap
    return rec


# -- plots -----------------------------------------------------------------------


def _pyplot():
    import matplotlib  # lazy: an optional extra (`report`); without it only the plots are skipped

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    return plt


def _grid(n: int, ncols: int = 4):
    cols = max(1, min(ncols, n))
    return math.ceil(n / cols), cols


def _band(n: int, p: np.ndarray):
    lo, hi = stats.binom.interval(BAND, n, np.clip(p, 0.0, 1.0))
    return np.nan_to_num(lo) / max(n, 1), np.nan_to_num(hi) / max(n, 1)


def _fit_panel(ax, fit, xlabel: str) -> None:
    n = max(int(fit.n), 1)
    exp = np.asarray(fit.expected, dtype=np.float64)
    obs = np.asarray(fit.observed, dtype=np.float64) / n
    k = min(exp.shape[0], MAX_TOKENS_PLOTTED)
    x = np.arange(k)
    lo, hi = _band(n, exp[:k])
    ax.bar(x, exp[:k], color="0.85", edgecolor="0.6", width=0.8, label="expected")
    ax.fill_between(x, lo, hi, step="mid", color="tab:blue", alpha=0.25, label=f"{BAND:.0%} binomial band")
    outside = (obs[:k] < lo - 1e-12) | (obs[:k] > hi + 1e-12)
    ax.plot(x[~outside], obs[:k][~outside], "o", color="tab:blue", ms=3, label="observed")
    ax.plot(x[outside], obs[:k][outside], "o", color="tab:red", ms=4, label="outside band")
    ax.set_title(f"{fit.label}\nn={fit.n}, p={fit.pvalue:.3g}", fontsize=7)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.tick_params(labelsize=6)


def plot_fits(fits, title: str, path: Path, *, xlabel: str = "token") -> Path:
    """Small multiples: one panel per fit, observed frequency vs expected with its band."""
    plt = _pyplot()
    rows, cols = _grid(len(fits))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax, fit in zip(axes.flat, fits):
        _fit_panel(ax, fit, xlabel)
    for ax in list(axes.flat)[len(fits):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.88, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_chunks(batch: SpecBatch, cap: int, title: str, path: Path) -> Path:
    """Requests as bars of their row counts; chunk boundaries at cap `cap`."""
    plt = _pyplot()
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    r = len(cu) - 1
    chunks = list(iter_request_chunks(cu, cap))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * max(int(cu[-1]), 1) + 2), 2.4))
    colors = ["tab:blue", "tab:orange"]
    for i in range(r):
        ax.barh(0, cu[i + 1] - cu[i], left=cu[i], height=0.6, color=colors[i % 2], edgecolor="black")
        ax.text((cu[i] + cu[i + 1]) / 2, 0, f"r{i}\n{cu[i + 1] - cu[i]}", ha="center", va="center", fontsize=7)
    for c, (start, end) in enumerate(chunks):
        ax.axvline(cu[start], color="red", ls="--", lw=1.5)
        ax.text((cu[start] + cu[end]) / 2, 0.45, f"chunk {c}: {cu[end] - cu[start]} rows", ha="center",
                fontsize=7, color="red")
    if r:
        ax.axvline(cu[-1], color="red", ls="--", lw=1.5)
    ax.set_xlim(0, max(int(cu[-1]), 1))
    ax.set_ylim(-0.6, 0.7)
    ax.set_yticks([])
    ax.set_xlabel("logits rows (cu_num_logits)")
    ax.set_title(f"{title}: {len(chunks)} chunk(s) at max_chunk_logits = {cap}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(results, directory: Path) -> tuple[list[dict], str | None]:
    """Every plot the results call for; returns (plots, reason they were skipped or None)."""
    try:
        _pyplot()
    except ImportError as exc:
        return [], f"plots skipped: matplotlib is not installed (pip install 'rs-verify[report]'): {exc}"
    plots = []
    for res in results:
        fits = (getattr(res, "stats", {}) or {}).get("fits", [])
        tokens = [f for f in fits if not is_acceptance_fit(f)]
        lengths = [f for f in fits if is_acceptance_fit(f)]
        if tokens:
            path = plot_fits(tokens, f"{res.name}: observed vs expected token frequencies",
                             directory / f"{res.name}.png")
            plots.append({"property": res.name, "kind": "frequencies", "path": path.name})
        if lengths:
            path = plot_fits(lengths, f"{res.name}: acceptance lengths vs closed form",
                             directory / f"{res.name}-acceptance.png", xlabel="accepted drafts")
            plots.append({"property": res.name, "kind": "acceptance lengths", "path": path.name})
        if res.status == "failed":
            batch, drawn = failing_input(res)
            cap = chunk_cap(drawn)
            if cap is not None:
                path = plot_chunks(drawn[0], cap, f"{res.name}: failing batch", directory / f"{res.name}-chunks.png")
                plots.append({"property": res.name, "kind": "chunk layout", "path": path.name})
    return plots, None


# -- writing ---------------------------------------------------------------------


def md_cell(text) -> str:
    """Text safe inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list], align: str | None = None) -> list[str]:
    """A GitHub Markdown table as lines; `align` is one character per column ("l" or "r")."""
    rule = ["---:" if c == "r" else "---" for c in (align or "l" * len(headers))]
    return ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|",
            *["| " + " | ".join(str(c) for c in row) + " |" for row in rows]]


def markdown(meta: dict, records: list[dict], plots: list[dict], note: str | None) -> str:
    lines = ["# rs-verify report", ""]
    for key in ("sampler", "reference", "profile", "device", "database", "created"):
        if meta.get(key) is not None:
            lines.append(f"- **{key}**: `{meta[key]}`")
    if meta.get("versions"):
        lines.append("- **versions**: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    passed = sum(r["status"] == "passed" for r in records)
    failed = sum(r["failures"] for r in records)
    skipped = sum(r["status"] == "skipped" for r in records)
    xfailed = sum(r["status"] == "xfail" for r in records)
    lines += ["", f"**{passed} passed, {failed} failed, {skipped} skipped" + (f", {xfailed} xfailed" if xfailed else "")
              + "**", ""]
    lines += markdown_table(["property", "status", "examples", "excused", "failures", "time (s)"],
                            [[r["property"], r["status"] + (" (self-check)" if r.get("self_check") else ""),
                              r["examples"], r["excused"], r["failures"], f"{r['seconds']:.1f}"] for r in records],
                            align="llrrrr")
    if meta.get("exercised"):  # batches answered per feature; decisions per declared deviation (SPEC 11)
        lines += ["", "## Exercised", ""]
        lines += [f"- {md_cell(line)}" for line in meta["exercised"]]
    skipped_rows = [r for r in records if r["status"] == "skipped"]
    if skipped_rows:
        lines += ["", "## Skipped", ""]
        lines += [f"- `{r['property']}`: {md_cell(r['message'])}" for r in skipped_rows]
    expected = [r for r in records if r["status"] == "xfail"]
    if expected:  # known defects (--xfails), still failing as expected
        lines += ["", "## Expected failures", ""]
        lines += [f"- `{r['property']}`: {md_cell(r['reason'])}: {md_cell(r['message'][:300])}" for r in expected]
    bad = [r for r in records if r["failures"]]
    if bad:
        lines += ["", "## Failures", ""]
        for r in bad:
            lines += [f"### {r['property']}", "", "```", r["message"][:4000], "```", ""]
            if r.get("failing_batch"):
                lines.append(f"- failing batch: `{r['failing_batch']}`")
            if r.get("failing_cap") is not None:
                lines.append(f"- chunk cap: {r['failing_cap']}")
            for b in r["bundles"]:
                lines.append(f"- bundle `{b}`: replay with `rs-verify replay {b}`")
            lines.append("")
    if plots or note:
        lines += ["", "## Plots", ""]
        if note:
            lines.append(note)
        for p in plots:
            lines += [f"### {p['property']}: {p['kind']}", "", f"![{p['property']} {p['kind']}]({p['path']})", ""]
    return "\n".join(lines).rstrip() + "\n"


def power_records(profile: str, records: list[dict]) -> list[dict]:
    """What each distribution campaign that ran can detect at this profile's trial count."""
    ran = {r["property"] for r in records if r["status"] != "skipped"}
    return [_json_safe({k: v for k, v in c.items() if k != "per_test"})
            for c in campaign_power(profile) if c["property"] in ran]


def power_markdown(power: list[dict]) -> str:
    if not power:
        return ""
    lines = ["", "## What the distribution campaigns can detect", "",
             "Smallest total-variation distance between the emitted and the target distribution that each "
             "campaign's weakest principal test detects with probability 0.99, at a family-wise false-positive "
             "rate of 1e-6 (scipy.stats: chi2.isf for the critical values, ncx2.sf for the power).", ""]
    lines += markdown_table(["property", "trials", "tests", "critical values", "min detectable TV",
                             "best law's min TV", "weakest test (expected n)"],
                            [[c["property"], c["trials"], c["tests"],
                              f"{c['critical_values'][0]:.1f}-{c['critical_values'][1]:.1f}",
                              f"{c['min_detectable_tv']:.3f}", f"{c['best_min_detectable_tv']:.3f}",
                              f"{c['weakest_test']} ({c['weakest_n']:,.0f})"] for c in power])
    return "\n".join(lines) + "\n"


def write_report(results, directory, *, meta: dict | None = None) -> dict:
    """Write report.json, report.md and the plots of `results` (runner Outcome records) into `directory`.

    Returns `{"json": path, "markdown": path, "plots": [paths]}`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    records = [result_record(r) for r in results]
    plots, note = make_plots(results, directory)
    summary = {
        "passed": sum(r["status"] == "passed" for r in records),
        "failed": sum(r["failures"] for r in records),
        "skipped": sum(r["status"] == "skipped" for r in records),
        "xfailed": sum(r["status"] == "xfail" for r in records),
    }
    power = power_records(meta.get("profile") or "ci", records)
    doc = {"meta": _json_safe(meta), "summary": summary, "results": records, "plots": plots,
           "plots_note": note, "band": BAND, "distribution_power": power}
    json_path = directory / "report.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path = directory / "report.md"
    md_path.write_text(markdown(meta, records, plots, note) + power_markdown(power))
    return {"json": json_path, "markdown": md_path, "plots": [directory / p["path"] for p in plots]}
