"""`rs-verify releases SPEC...`: gate the released libraries, each adapter through the pytest plugin.

For each release (`vllm==0.33.0`, `sglang` for the newest, a wheel file for a candidate;
`rs_verify.engine.releases`): install it outside the repository with the dependencies its wheel's
metadata resolves to (or reuse the cache, or take the catalogue's pins), find the adapters it
offers from its files (`rs_verify.adapters.discovery`), then run each as its own
`python -m pytest -p rs_verify --rs-sampler=ADAPTER --rs-gate-only --rs-profile P` process, with
the release's site directory on `PYTHONPATH` and its `env`, in an empty working directory, and
read the outcome of each property from pytest's JUnit XML (`--junitxml`; the plugin records a
failure bundle's path as the testcase property `rs_verify_bundle`). The table, release x adapter
x property under a matrix of release x adapter (`rs_verify.frontends.release_table`), is written as
`releases.md`, `releases.json` and the pins as `catalogue.toml` into `--out`:

- `passed`; `failed` with the failure's first line and a replay command (`rs-verify replay` of its
  bundle, with the release on `PYTHONPATH`); `skipped` with the plugin's reason (or the
  catalogue's `absent` reason); `xfail` for an expected failure (`--rs-xfails`);
- `error`, one cell per adapter (property `-`): a release that could not be installed (one cell
  for the release), a package no adapter gates, a sampler
  that could not be loaded (the plugin fails every item with the same "cannot load" message:
  reported once), or a pytest run that ended without a report.

Below the table, per release and adapter, what the plugin's summary said the run exercised: each
declared deviation (SPEC 11) with the decisions its rule decided, or that it was never reached
(the deviations a release needs), and what the sampler declared away.

Exit status (`--fail-on`): `failure` (default) 1 on any failed or error cell; `error` 1 only on
error cells (the releases' own known defects are findings, not breakage: `.ci/run` uses it);
`never` 0. Usage errors exit 2.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..adapters import discovery
from ..engine import release_baseline, releases as catalogue
from . import release_table
from .release_table import Cell, Exercised
from ..engine.defaults import ISOLATION_LEVELS, PROFILE_NAMES

LOAD_ERROR = "rs-verify: cannot load the sampler"  # the plugin's message when --rs-sampler does not load
BUNDLE_PROPERTY = "rs_verify_bundle"
FAIL_ON = ("failure", "error", "never")
STYLE = {"passed": "green", "failed": "red", "skipped": "yellow", "xfail": "magenta", "error": "bold red"}
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # the rs_verify in use, ahead of any other


PYTEST_TALLY = re.compile(r"^(\d+ \w+|no tests ran)(, \d+ \w+)* in [\d.]+s")  # "1 passed, 25 deselected in 3.20s"
SECTIONS = {"exercised": "rs-verify: exercised", "not_exercised": "rs-verify: not exercised",
            "declared": "rs-verify: sampler"}


def summary_sections(output: str) -> dict:
    """The lines of the plugin's two summary sections in a gate process's output."""
    found, current = {k: [] for k in SECTIONS}, None
    for line in output.splitlines():
        title = line.strip("= ").strip()
        if line.startswith("===") or PYTEST_TALLY.match(title):  # a new section, or pytest's last line
            current = next((k for k, t in SECTIONS.items() if title.startswith(t)), None)
        elif current and line.strip():
            found[current].append(line.strip())
    return found


def first_line(text: str | None, width: int = 300) -> str:
    """The first non-empty line (and the next one when it ends with ':', the first item of a list)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines or [""])[0]
    return line if len(line) <= width else line[: width - 3] + "..."


def release_env(installed: catalogue.Installed) -> dict:
    """The environment of a gate process: the release's site directory and this rs_verify on PYTHONPATH."""
    env = dict(os.environ)
    env.update(installed.release.env)
    parts = [str(installed.site), PROJECT_ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def replay_command(installed: catalogue.Installed, bundle: str) -> str:
    assigns = [f"{k}={shlex.quote(v)}" for k, v in installed.release.env.items()]
    return " ".join([*assigns, f"PYTHONPATH={shlex.quote(str(installed.site))}", "rs-verify", "replay",
                     shlex.quote(bundle)])


def gate_command(adapter: str, junit: Path, bundles: Path, profile: str, keyword: str | None,
                 max_examples: int | None, isolate: str = "property", baseline: tuple = ()) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "rs_verify", f"--rs-sampler={adapter}", "--rs-gate-only",
           "--rs-profile", profile, f"--rs-bundle-dir={bundles}", f"--junitxml={junit}", "-q",
           "-p", "no:cacheprovider", "-o", "junit_family=xunit1", f"--rs-isolate={isolate}", *baseline]
    if keyword:
        cmd += ["-k", keyword]
    if max_examples is not None:
        cmd += ["--rs-max-examples", str(max_examples)]
    return cmd


def parse_junit(path: Path, release: str, adapter: str, installed: catalogue.Installed) -> list[Cell]:
    """One cell per property testcase of the JUnit XML at `path`; a sampler that could not be loaded
    is one error cell, not one failure per property."""
    cells = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?").removeprefix("rs-verify::")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        seconds = float(case.get("time") or 0)
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            text = (failure.get("message") or failure.text or "").removeprefix("Failed: ")
            bundle = props.get(BUNDLE_PROPERTY)
            cells.append(Cell(release, adapter, name, "failed", first_line(text) or first_line(failure.text),
                              replay_command(installed, bundle) if bundle else "", seconds))
        elif skipped is not None:
            xfail = skipped.get("type") == "pytest.xfail"
            reason = (skipped.get("message") or "").removeprefix("expected fail: ")
            reason = reason.removeprefix(f"{name}: ")
            cells.append(Cell(release, adapter, name, "xfail" if xfail else "skipped", first_line(reason), "",
                              seconds))
        else:
            cells.append(Cell(release, adapter, name, "passed", props.get("rs_verify_baseline_conventions", ""), "",
                              seconds))
    failed = [c for c in cells if c.status == "failed"]
    if failed and all(c.message.startswith(LOAD_ERROR) for c in failed):
        why = failed[0].message.split("': ", 1)[-1]
        return [Cell(release, adapter, "-", "error", f"cannot load the sampler: {why}", "",
                     sum(c.seconds for c in cells))]
    return cells


def gate_adapter(installed: catalogue.Installed, adapter: str, out: Path, *, profile: str, keyword: str | None,
                 max_examples: int | None, timeout: float, isolate: str = "property",
                 baseline: tuple = ()) -> tuple[list, Exercised]:
    """Run the plugin on one adapter of an installed release; its cells and what it exercised."""
    release = installed.release.spec
    tag = f"{installed.release.name}-{installed.release.version}-{adapter.replace(':', '.').rsplit('.', 1)[-1]}"
    junit, bundles = out / "junit" / f"{tag}.xml", (out / "bundles" / tag).resolve()
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    log = out / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rs-verify-release-") as cwd:
        try:
            proc = subprocess.run(gate_command(adapter, junit.resolve(), bundles, profile, keyword, max_examples, isolate,
                                               baseline),
                                  cwd=cwd, env=release_env(installed), capture_output=True, text=True,
                                  timeout=timeout)
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout:g} s", None
    output = output if isinstance(output, str) else output.decode(errors="replace")
    log.write_text(output)
    seconds = time.perf_counter() - start
    done = Exercised(release, adapter, **summary_sections(output))
    if code in (0, 1) and junit.is_file():
        return parse_junit(junit, release, adapter, installed), done
    last = [ln for ln in str(output).splitlines() if ln.strip()][-1:] or ["no output"]
    why = "no property selected (pytest exit 5)" if code == 5 else f"pytest exit {code}: {first_line(last[0])}"
    return [Cell(release, adapter, "-", "error", f"{why} (log: {log})", "", seconds)], done


def exit_code(cells: list[Cell], fail_on: str) -> int:
    bad = {"failure": ("failed", "error"), "error": ("error",), "never": ()}[fail_on]
    return 1 if any(c.status in bad for c in cells) else 0


def cmd_releases(args) -> int:
    console = Console(soft_wrap=True)
    if args.tables:  # no gating: the tables of earlier runs as one
        if args.specs:
            print("rs-verify releases: --tables renders earlier runs' tables; it takes no SPEC", file=sys.stderr)
            return 2
        try:
            cells, done, meta = release_table.combine(args.tables)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"rs-verify releases: --tables: {exc}", file=sys.stderr)
            return 2
        paths = release_table.write(cells, Path(args.out), meta, done)
        console.print(f"table: {paths['markdown']}, {paths['json']}", highlight=False, markup=False)
        return exit_code(cells, args.fail_on)
    if not args.specs:
        print("rs-verify releases: name at least one release (SPEC), or --tables DIR...", file=sys.stderr)
        return 2
    root, out = catalogue.cache_root(args.cache), Path(args.out)
    try:
        known = catalogue.load_catalogue(args.catalogue)
        targets = [catalogue.target(spec, known, root, args.offline) for spec in args.specs]
        if args.jobs < 1:
            raise catalogue.CatalogueError(f"--jobs must be >= 1, not {args.jobs}")
    except catalogue.CatalogueError as exc:
        print(f"rs-verify releases: {exc}", file=sys.stderr)
        return 2
    cells: list[Cell] = []
    pins: dict = {}

    def add(new: list[Cell]) -> None:
        for c in new:
            cells.append(c)
            detail = f" - {escape(c.message)}" if c.message else ""
            console.print(f"  [{STYLE[c.status]}]{c.status:8}[/] {escape(c.release)} {escape(c.adapter)} {c.property} "
                          f"({c.seconds:.1f} s){detail}", highlight=False)

    def chosen(adapter: str) -> bool:
        return not args.adapter or any(s in adapter for s in args.adapter)

    baseline, why = ([], None) if not args.baseline else release_baseline.gate_options(
        args.baseline, catalogue_path=args.catalogue, cache=root, find_links=args.find_links, no_index=args.no_index,
        offline=args.offline)  # installed once here; each gate process finds it in the cache
    if why:
        print(f"rs-verify releases: {why}", file=sys.stderr)
        return 2
    if baseline:
        os.environ[catalogue.CACHE_ENV] = str(root)  # the gate processes' release cache (the baseline's)
    gates = []  # (installed, adapter): run after every install, on --jobs processes
    for release in targets:
        label = release.wheel or (release.spec if release.version else f"{release.name} (the newest release)")
        with console.status(f"{label}: installing (--no-deps; "
                            + (f"{len(release.pure_python)} pins from the catalogue)" if release.pinned
                               else "its dependencies resolved from the wheel's metadata)")):
            installed = catalogue.install(release, root, find_links=args.find_links, no_index=args.no_index,
                                          offline=args.offline)
        release = installed.release  # a release named without its version now has it
        if installed.error:
            add([Cell(release.spec, "-", "-", "skipped" if args.offline else "error", installed.error)])
            continue
        pins[release.spec] = {"pins": list(installed.pins), "left_out": installed.left_out, "env": release.env,
                              "wheel": release.wheel}
        offered = ([(a, None) for a in release.adapters] if release.adapters
                   else discovery.offered(release.name, installed.site))
        absent = {**{a: why for a, why in offered if why}, **release.absent}
        adapters = [a for a, why in offered if not why and a not in release.absent and chosen(a)]
        console.print(f"[bold]{escape(release.spec)}[/]: {len(adapters)} adapter(s) "
                      f"({'reused' if installed.reused else 'installed'}: {installed.site})", highlight=False)
        if not offered:
            add([Cell(release.spec, "-", "-", "error", f"no adapter of rs-verify gates {release.name} "
                                                        f"(known: {', '.join(discovery.packages())})")])
        add([Cell(release.spec, a, "-", "skipped", why) for a, why in absent.items() if chosen(a)])
        gates += [(installed, adapter) for adapter in adapters]
    specs = list(dict.fromkeys([i.release.spec for i, _ in gates] + [c.release for c in cells]))
    names = ", ".join(f"{i.release.spec} {a.rsplit(':', 1)[-1]}" for i, a in gates)
    with console.status(f"gating {names} at {args.profile} (one pytest process each, {args.jobs} at a time)"), \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = [pool.submit(gate_adapter, i, a, out, profile=args.profile, keyword=args.k,
                            max_examples=args.max_examples, timeout=args.timeout, isolate=args.isolate,
                            baseline=tuple(baseline))
                for i, a in gates]
        done = []
        for run in as_completed(runs):
            new, exercised = run.result()
            add(new)
            done.append(exercised)
    order = {g: n for n, g in enumerate((i.release.spec, a) for i, a in gates)}
    cells.sort(key=lambda c: (specs.index(c.release), order.get((c.release, c.adapter), -1)))
    meta = {"releases": specs, "asked": args.specs, "profile": args.profile, "keyword": args.k,
            "max_examples": args.max_examples, "cache": str(root),
            "device": os.environ.get("RS_VERIFY_DEVICE") or "auto", "pins": pins,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    done.sort(key=lambda d: order.get((d.release, d.adapter), 0))
    paths = release_table.write(cells, out, meta, done)
    console.print(f"table: {paths['markdown']}, {paths['json']}; pins: {paths['catalogue']}",
                  highlight=False, markup=False)
    return exit_code(cells, args.fail_on)


def add_parser(sub) -> None:
    """The `releases` subcommand of `rs-verify` (wired in rs_verify.frontends.cli)."""
    p = sub.add_parser("releases", help="install released libraries (vllm==0.33.0, sglang, a wheel, ...) outside the "
                                        "repository and gate each adapter they offer through the pytest plugin")
    p.add_argument("specs", nargs="*", metavar="SPEC",
                   help="releases: name==version, a name alone (its newest release) or a wheel file (a candidate)")
    p.add_argument("--tables", nargs="+", default=None, metavar="DIR",
                   help="gate nothing: write one table (matrix, changes between releases, detail) from the "
                        "releases.json of earlier runs' --out directories")
    p.add_argument("--profile", choices=PROFILE_NAMES, default="ci", help="Hypothesis profile of the gate (default ci)")
    p.add_argument("-k", default=None, metavar="EXPR", help="pytest -k expression selecting properties")
    p.add_argument("--max-examples", type=int, default=None, help="override the profile's max_examples")
    p.add_argument("--adapter", nargs="+", default=None, metavar="TEXT",
                   help="gate only the adapters whose module:attribute contains one of these")
    p.add_argument("--out", default=".rs-verify/releases", metavar="DIR",
                   help="where releases.md, releases.json, the JUnit XML, logs and bundles go")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help=f"install cache (default ${catalogue.CACHE_ENV}, else {catalogue.DEFAULT_CACHE})")
    p.add_argument("--catalogue", default=None, metavar="FILE",
                   help="a releases.toml to read instead of the packaged one (format: rs_verify.engine.releases)")
    p.add_argument("--find-links", default=None, metavar="DIR",
                   help="look for the wheels in DIR too (pip --find-links DIR), e.g. ones fetched with pip download")
    p.add_argument("--no-index", action="store_true",
                   help="never ask the package registry: install from --find-links only (pip --no-index)")
    p.add_argument("--offline", action="store_true",
                   help="never fetch: a release not in the cache is a skipped cell with the reason")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="a gate process still running after this is stopped and reported (default 3600)")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N", help="gate N adapters at a time (default 1)")
    p.add_argument("--isolate", choices=ISOLATION_LEVELS, default=ISOLATION_LEVELS[0],
                   help="the plugin's --rs-isolate: 'property' (default) a child process per property; 'off' loads "
                        "the library once, in the pytest process (faster; a crash then ends that adapter's run)")
    p.add_argument("--baseline", default=None, metavar="NAME==VERSION",
                   help="gate each adapter against the same adapter on this release too (matches_baseline; the "
                        "plugin's --rs-baseline=release:NAME==VERSION), e.g. the previous release")
    p.add_argument("--fail-on", choices=FAIL_ON, default="failure",
                   help="exit 1 on any failed or error cell (failure), on error cells only (error), or never")
    p.set_defaults(func=cmd_releases)
