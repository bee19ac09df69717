"""The `rs-verify` command line: check, list, replay, bench.

Importing this module imports neither torch nor triton: the device is chosen first
(`rs_verify.harness.device`), then samplers are loaded.
"""

from __future__ import annotations

import argparse
import os
from importlib.resources import files
import sys
import time
from pathlib import Path

from hypothesis import settings
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine import bundle as bundles
from ..engine import database, isolation, pool, profiles, replay, runner
from ..harness import device
from ..engine.baseline import open_baseline, require_reference
from ..harness.handle import parse_deviations, with_deviations
from ..harness.record import record_of
from ..harness.samplers import BUILTIN, load_sampler
from ..engine.versions import versions
from ..properties import NEEDS, PROPERTIES, by_cost
from ..properties.baseline import gate_summary
from ..properties.conventions import summary as convention_summary
from ..engine.records import XPASS
from . import bench, options, releases, xfails
from .report import write_report

STATUS_STYLE = {"passed": "green", "failed": "red", "skipped": "yellow", "xfail": "magenta"}


def _usage(message: str) -> SystemExit:
    """A usage error: the message on stderr, exit status 2."""
    print(f"rs-verify: {message}", file=sys.stderr)
    return SystemExit(2)


def _device(requested: str | None, profile: str | None = None) -> str:
    """The suite's backend choice; exit 2 with the reason when the requested device is not usable."""
    try:
        chosen = device.resolve(requested)
    except device.DeviceError as exc:
        raise _usage(str(exc)) from None
    if profile == "gpu" and chosen != "cuda":
        raise _usage(f"the gpu profile needs CUDA, which is not usable here ({device.cuda_status()[1]})")
    return chosen


def _selected(only, skip):
    unknown = [n for n in (only or []) + (skip or []) if n not in PROPERTIES]
    if unknown:
        raise _usage(f"unknown properties {unknown}; see `rs-verify list`")
    names = [n for n in PROPERTIES if (not only or n in only) and n not in (skip or [])]
    return [PROPERTIES[n] for n in names]


def cmd_check(args) -> int:
    console = Console(stderr=False)
    try:
        expected = xfails.load(args.xfails, PROPERTIES) if args.xfails else {}
    except xfails.XfailsError as exc:
        raise _usage(str(exc)) from None
    dev = _device(args.device, args.profile)
    profile = profiles.load(args.profile)
    url = database.redis_url(args.redis)
    if url:
        try:
            database.apply(url)
        except database.DatabaseError as exc:
            console.print(f"[red]rs-verify: {escape(str(exc))}[/]")
            return 2
    reference_spec = None if args.reference == "none" else args.reference
    try:
        # Isolated, the sampler runs in a child process per property (rs_verify.engine.isolation);
        # the reference is the suite's oracle and runs here.
        sampler = isolation.load(args.sampler, args.isolate, timeout=args.timeout, device_name=dev)
        sampler = with_deviations(sampler, parse_deviations(args.deviations))  # SPEC 11, named here
        reference = load_sampler(reference_spec) if reference_spec else None
        baseline = None
        if args.baseline:  # a BaselineError is a ValueError: a usage error, like an unloadable sampler
            require_reference(args.baseline_mode, reference_spec)
            baseline = open_baseline(args.baseline, sampler_spec=args.sampler, mode=args.baseline_mode,
                                     max_slowdown=args.max_slowdown, device=dev, timing_path=args.timing_table,
                                     catalogue=args.baseline_catalogue)
    except (ValueError, isolation.SamplerDied) as exc:
        console.print(f"[red]rs-verify: {escape(str(exc))}[/]")
        return 2
    base = settings() if args.max_examples is None else settings(max_examples=args.max_examples)
    props = _selected(args.only, args.skip)
    bundle_dir = None
    if not args.no_bundles:
        bundle_dir = args.bundle_dir or (str(Path(args.report) / "bundles") if args.report else bundles.DEFAULT_DIR)
    run_options = {"profile": profile, "device": dev, "runner": "cli", "isolate": args.isolate, "timeout": args.timeout}
    if args.deviations:  # recorded in bundles (replayed with them) and sent to the workers
        run_options["deviations"] = parse_deviations(args.deviations)
    if baseline:
        run_options.update(baseline=baseline.spec.pinned(), baseline_mode=args.baseline_mode)
        if args.baseline_catalogue:  # a release: baseline's pins, read again by replay
            run_options["baseline_catalogue"] = args.baseline_catalogue
    if args.max_examples is not None:
        run_options["max_examples"] = args.max_examples
    where = (f"isolated per {args.isolate}, timeout {args.timeout:g} s per call" if args.isolate != "off"
             else "in this process")
    console.print(f"[bold]rs-verify check[/]: sampler [cyan]{escape(args.sampler)}[/] on {dev} ({where}), "
                  f"profile {profile}, {len(props)} properties, example database: "
                  f"{database.describe(settings().database)}")
    jobs = min(_jobs(args.jobs, dev, baseline), len(props))
    if jobs > 1:
        setup = pool.Setup(args.sampler, reference_spec, dev, profile, args.isolate, args.timeout, url,
                           args.max_examples, bundle_dir, run_options)
        done = {}
        with console.status(f"{len(props)} properties on {jobs} worker processes, the longest first"):
            for i, res in enumerate(pool.run_parallel([p.name for p in props], setup, jobs), 1):
                res = done[res.name] = xfails.judge(res, expected.get(res.name), sampler=args.sampler)
                _print_outcome(console, i, len(props), res)
        results = [done[p.name] for p in props]
    else:
        results = []
        for i, prop in enumerate(props, 1):
            ctx = runner.make_context(sampler, reference, profile=profile, device=dev)
            ctx.baseline = baseline
            with console.status(f"[{i}/{len(props)}] {prop.name}: {escape(prop.doc)}"):
                res = runner.run(prop, ctx, base, bundle_dir=bundle_dir, sampler_spec=args.sampler,
                                 reference_spec=reference_spec, options=run_options)
            res = xfails.judge(res, expected.get(prop.name), sampler=args.sampler)
            results.append(res)
            _print_outcome(console, i, len(props), res)
    _print_summary(console, args.sampler, results)
    _print_exercised(console, sampler, results)
    missing = False
    if baseline:
        timing = next((r.stats.get("timing_table") for r in results if r.name == "baseline_speed"), None)
        changes = next((convention_summary(r.stats) for r in results if r.name == "matches_baseline"
                        and r.status == "passed"), "")
        lines, missing = gate_summary(args.baseline_mode, {r.name: r.status for r in results}, timing, changes)
        console.print("\n".join(lines), markup=False, highlight=False)
    if args.report:
        meta = {"sampler": args.sampler, "reference": reference_spec, "profile": profile, "device": dev,
                "database": database.describe(settings().database), "versions": versions(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "max_examples": args.max_examples,
                # what the run exercised, each declared deviation (SPEC 11) with the decisions it decided
                "exercised": record_of(sampler).exercised([r.stats.get("sent", {}) for r in results])}
        paths = write_report(results, args.report, meta=meta)
        console.print(f"report: {paths['markdown']}, {paths['json']} and {len(paths['plots'])} plot(s) in "
                      f"{args.report}", markup=False, highlight=False)
    return 1 if missing or any(r.status == "failed" for r in results) else 0


def _jobs(requested: int | None, dev: str, baseline) -> int:
    """Worker processes for `check`: as asked, else one per CPU core (at most 4) through the
    interpreter, and one on CUDA or with a baseline (its timing and memory want the device alone);
    never more than there are properties to run."""
    if requested is not None:
        if requested < 1:
            raise _usage(f"--jobs must be >= 1, not {requested}")
        return 1 if baseline else requested
    return 1 if dev == "cuda" or baseline else max(1, min(4, os.cpu_count() or 1))


def _print_outcome(console, i: int, total: int, res) -> None:
    status = "self-check" if res.self_check and res.status == "passed" else _status(res)
    note = " - " + escape(res.reason) if res.status == "skipped" else ""
    if res.status == "xfail":  # the known defect, still there: its first line, not the whole report
        console.print(f"[{i}/{total}] [{STATUS_STYLE['xfail']}]xfail     [/] {res.name} ({res.examples} examples, "
                      f"{res.seconds:.1f} s) - expected: {escape(res.reason)}: {escape(res.failure.headline(200))}")
        return
    if res.status == "passed" and res.stats.get("self_reported"):
        note = " - " + escape(res.stats["self_reported"])
    console.print(f"[{i}/{total}] [{STATUS_STYLE[res.status]}]{status:10}[/] {res.name} "
                  f"({res.examples} examples, {res.seconds:.1f} s){note}")
    if res.failure is not None:
        console.print(res.failure.text(), markup=False, highlight=False)


def _status(res) -> str:
    """The status as the table shows it: a listed property that passed is `XPASS(strict)`."""
    return "XPASS(strict)" if res.failure is not None and res.failure.kind == XPASS else res.status


def _print_exercised(console, sampler, results) -> None:
    record = record_of(sampler)
    done = record.exercised([r.stats.get("sent", {}) for r in results])
    if done:
        console.print("\n".join(["exercised (batches the sampler answered):", *("  " + d for d in done)]),
                      markup=False, highlight=False)
    missing = record.not_exercised()
    if missing:
        console.print("not exercised (declared away by the sampler, SPEC section 10): " + "; ".join(missing),
                      markup=False)


def _print_summary(console, sampler_spec: str, results) -> None:
    table = Table(title=f"rs-verify: {sampler_spec}")
    for col in ("property", "status", "examples", "excused", "failures", "time (s)"):
        table.add_column(col, no_wrap=col == "property")
    for r in results:
        status = f"{r.status} (self-check)" if r.self_check else _status(r)
        table.add_row(r.name, status, str(r.examples), str(r.excused), str(int(r.status == "failed")),
                      f"{r.seconds:.1f}")
    console.print(table)
    failed = sum(r.status == "failed" for r in results)
    xfailed = sum(r.status == "xfail" for r in results)
    console.print(f"{sum(r.status == 'passed' for r in results)} passed, {failed} failed, "
                  f"{sum(r.status == 'skipped' for r in results)} skipped" + (f", {xfailed} xfailed" if xfailed else ""))
    checks = [r.name for r in results if r.self_check and r.status == "passed"]
    if checks:
        console.print("self-checks of the suite (they do not call the sampler): " + ", ".join(checks))
    trusted = [f"{r.name} ({r.stats['self_reported']})" for r in results
               if r.status == "passed" and r.stats.get("self_reported")]
    if trusted:
        console.print("passes resting on the sampler's own figures: " + "; ".join(trusted), markup=False)


def cmd_replay(args) -> int:
    """Re-run the failure stored in a bundle: exit 1 if it still fails, 0 if not, 2 if unusable."""
    try:
        b = bundles.load(args.bundle)
    except bundles.BundleError as exc:
        print(f"rs-verify replay: {exc}", file=sys.stderr)
        return 2
    recorded = b.options.get("device")
    dev = _device(args.device or (recorded if recorded in device.DEVICES else None))
    sampler = args.sampler or b.sampler
    what = b.batch.summary() if b.batch is not None else "its fixed-seed campaign"
    print(f"replaying property {b.property!r} on sampler {sampler} ({dev}, profile "
          f"{args.profile or b.options.get('profile')}); recorded with rs-verify {b.versions.get('rs_verify')}, "
          f"sampler {b.sampler}\ninput: {what}")
    try:
        prop, ctx = replay.prepare_bundle(b, sampler=args.sampler, reference=args.reference, device=dev,
                                          profile=args.profile, isolate=args.isolate, timeout=args.timeout)
    except replay.ReplayError as exc:
        print(f"rs-verify replay: {exc}", file=sys.stderr)
        return 2
    try:
        replay.check(prop, ctx, b.drawn)
    except (Exception, isolation.SamplerDied) as exc:  # noqa: BLE001 - the failure is the result
        notes = "\n".join(getattr(exc, "__notes__", []))
        print(f"STILL FAILS: {prop.name} on {sampler}\n{type(exc).__name__}: {exc}\n{notes}".rstrip())
        return 1
    print(f"PASSES: {prop.name} holds on this input for {sampler} (the bundle's failure no longer reproduces)")
    return 0


def cmd_list(args) -> int:
    table = Table(title="properties (cheapest first)")
    for col in ("name", "family", "needs", "what it checks"):
        table.add_column(col)
    for name in by_cost():
        p = PROPERTIES[name]
        doc = p.doc + (" [self-check of the suite: does not call the sampler]" if p.self_check else "")
        table.add_row(p.name, p.family, ", ".join(sorted(p.needs)) or "-", doc)
    console = Console()
    console.print(table)
    samplers = Table(title="built-in samplers")
    samplers.add_column("name")
    samplers.add_column("module:attribute")
    for name, target in BUILTIN.items():
        samplers.add_row(name, target)
    console.print(samplers)
    console.print("capabilities a property may need: " + "; ".join(f"{k}: {v}" for k, v in NEEDS.items()))
    return 0


def cmd_compile(args) -> int:
    """Ahead-of-time CUDA compile of every kernel specialization (rs_verify.triton_sampler.aot)."""
    if "triton" not in sys.modules:  # compile in this process unless the interpreter was chosen already
        device.resolve(device.COMPILE)
    from ..triton_sampler import aot  # lazy: imports triton, after the backend choice

    archs = [int(a) for part in args.arch for a in part.split(",") if a.strip()]
    grid = {} if args.block_v is None else {"block_sizes": args.block_v}
    console, start = Console(), time.perf_counter()
    with console.status("compiling") as status:
        results = aot.compile_all(archs, **grid, on_result=lambda r: status.update(
            f"sm_{r.arch} {r.kernel} ({r.width}, {escape(r.label)}): {'ok' if r.ok else 'ERROR'}"))
    console.print(aot.table(results, verbose=args.verbose))
    failed = aot.gate_failures(results)
    for r in failed:
        what = escape(r.error) if r.error else f"{r.local} bytes of local memory (register spills)"
        console.print(f"[red]{'ERROR' if r.error else 'SPILLS'}[/] sm_{r.arch} {r.kernel} ({r.width}, "
                      f"{escape(r.label)}): {what}")
    console.print(f"{len(results)} specializations for {', '.join(f'sm_{a}' for a in archs)} in "
                  f"{time.perf_counter() - start:.1f} s: {len(failed)} failed")
    return 1 if failed else 0


def cmd_spec(args) -> int:
    """The contract (docs/SPEC.md, installed as package data rs_verify/SPEC.md)."""
    doc = files("rs_verify").joinpath("SPEC.md")
    if args.path:
        print(doc)
    else:
        sys.stdout.write(doc.read_text(encoding="utf-8"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rs-verify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the property library against a sampler")
    check.add_argument("--sampler", default="triton", help="built-in name or module:attribute (default: triton)")
    check.add_argument("--reference", default="reference", help="the oracle sampler, or 'none'")
    check.add_argument("--profile", choices=profiles.PROFILE_NAMES, default=None,
                       help="Hypothesis profile (default: HYPOTHESIS_PROFILE, ci under CI, else dev)")
    check.add_argument("--device", choices=device.DEVICES, default=None,
                       help="default: cuda when usable, else the Triton interpreter on CPU (never a silent "
                            "fallback on a machine with an NVIDIA driver; see rs_verify.harness.device)")
    options.add(check.add_argument, options.ISOLATION)
    check.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                       help="run properties on N worker processes (default: one per CPU core, at most 4, through "
                            "the interpreter; 1 on CUDA and with --baseline)")
    check.add_argument("--max-examples", type=int, default=None, help="override the profile's max_examples")
    check.add_argument("--only", nargs="+", metavar="PROPERTY", help="run only these properties")
    check.add_argument("--skip", nargs="+", metavar="PROPERTY", help="skip these properties")
    check.add_argument("--report", metavar="DIR", default=None,
                       help="write report.json, report.md and PNG plots into DIR (bundles into DIR/bundles)")
    check.add_argument("--bundle-dir", metavar="DIR", default=None,
                       help="where failure bundles go (default: DIR/bundles with --report, else .rs-verify/bundles)")
    check.add_argument("--no-bundles", action="store_true", help="write no failure bundles")
    options.add(check.add_argument, ("redis", "xfails", "deviations", *options.BASELINE))
    check.set_defaults(func=cmd_check)
    lst = sub.add_parser("list", help="list the properties and built-in samplers")
    lst.set_defaults(func=cmd_list)
    rep = sub.add_parser("replay", help="re-run the failure stored in a bundle (exit 1: still fails, 0: passes)")
    rep.add_argument("bundle", metavar="BUNDLE", help="a .npz failure bundle written by check or the pytest plugin")
    rep.add_argument("--sampler", default=None, help="replay on this sampler instead of the bundle's")
    rep.add_argument("--reference", default=None, help="the oracle (default: the bundle's)")
    rep.add_argument("--device", choices=device.DEVICES, default=None,
                     help="default: the bundle's device, else cuda when available")
    rep.add_argument("--profile", choices=profiles.PROFILE_NAMES, default=None,
                     help="default: the bundle's profile (sets e.g. a distribution campaign's trials)")
    options.add(rep.add_argument, options.ISOLATION, timeout=dict(
        default=None, help=f"a sampler call that does not return within this time fails (isolated samplers only; "
                           f"default: the bundle's, else {isolation.DEFAULT_TIMEOUT:g})"))
    rep.set_defaults(func=cmd_replay)
    bench.add_parser(sub)
    comp = sub.add_parser("compile", help="compile the built-in sampler's kernels for CUDA archs, no GPU needed "
                                          "(exit 1: a compile error or a register spill)")
    comp.add_argument("--arch", nargs="+", default=["80", "90", "100"], metavar="CC",
                      help="compute capabilities, e.g. 80 90 100 or 80,90,100 (default: 80 90 100)")
    comp.add_argument("--block-v", nargs="+", type=int, default=None, metavar="N",
                      help="vocabulary block sizes to compile (default: the sampler's default block)")
    comp.add_argument("-v", "--verbose", action="store_true", help="one table row per specialization")
    comp.set_defaults(func=cmd_compile)
    spec = sub.add_parser("spec", help="print the rejection-sampling contract (SPEC.md) shipped with the package")
    spec.add_argument("--path", action="store_true", help="print where the installed SPEC.md is instead")
    spec.set_defaults(func=cmd_spec)
    releases.add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    code = args.func(args)
    if args.command == "check":
        print(f"total time {time.perf_counter() - start:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
