"""The `rs-verify` command line: check, list, replay, bench."""

from __future__ import annotations

import argparse
import os
import sys
import time


def _prepare_device(device: str | None) -> str:
    """Choose cuda or the Triton interpreter before triton is imported."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        raise SystemExit("rs-verify: --device cuda requested but CUDA is not available")
    return device


def _selected(only, skip):
    from .properties import PROPERTIES

    names = list(PROPERTIES)
    unknown = [n for n in (only or []) + (skip or []) if n not in PROPERTIES]
    if unknown:
        raise SystemExit(f"rs-verify: unknown properties {unknown}; see `rs-verify list`")
    if only:
        names = [n for n in names if n in only]
    return [PROPERTIES[n] for n in names if n not in (skip or [])]


def cmd_check(args) -> int:
    from hypothesis import settings
    from rich.console import Console
    from rich.table import Table

    from . import profiles, runner
    from .samplers import load_sampler

    device = _prepare_device(args.device)
    profile = profiles.load(args.profile)
    console = Console(stderr=False)
    sampler = load_sampler(args.sampler)
    reference = load_sampler(args.reference) if args.reference != "none" else None
    base = settings() if args.max_examples is None else settings(max_examples=args.max_examples)
    props = _selected(args.only, args.skip)
    console.print(f"[bold]rs-verify check[/]: sampler [cyan]{args.sampler}[/] on {device}, "
                  f"profile {profile}, {len(props)} properties")
    results = []
    for i, prop in enumerate(props, 1):
        ctx = runner.make_context(sampler, reference, profile=profile, device=device)
        with console.status(f"[{i}/{len(props)}] {prop.name}: {prop.doc}"):
            res = runner.run(prop, ctx, base)
        results.append(res)
        style = {"passed": "green", "failed": "red", "error": "red", "skipped": "yellow"}[res.status]
        console.print(f"[{i}/{len(props)}] [{style}]{res.status:7}[/] {prop.name} "
                      f"({res.examples} examples, {res.seconds:.1f} s){' - ' + res.message if res.status == 'skipped' else ''}")
        if res.failure is not None:
            console.print(_failure_text(res.failure), markup=False, highlight=False)
    table = Table(title=f"rs-verify: {args.sampler}")
    for col in ("property", "status", "examples", "excused", "failures", "time (s)"):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, r.status, str(r.examples), str(r.excused),
                      "1" if r.status in ("failed", "error") else "0", f"{r.seconds:.1f}")
    console.print(table)
    failed = [r for r in results if r.status in ("failed", "error")]
    console.print(f"{sum(r.status == 'passed' for r in results)} passed, {len(failed)} failed, "
                  f"{sum(r.status == 'skipped' for r in results)} skipped")
    return 1 if failed else 0


def _failure_text(exc: BaseException) -> str:
    notes = "\n".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc}\n{notes}".rstrip()


def cmd_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .properties import PROPERTIES
    from .properties.base import NEEDS
    from .samplers import BUILTIN

    table = Table(title="properties")
    for col in ("name", "family", "needs", "what it checks"):
        table.add_column(col)
    for p in PROPERTIES.values():
        table.add_row(p.name, p.family, ", ".join(sorted(p.needs)) or "-", p.doc)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rs-verify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the property library against a sampler")
    check.add_argument("--sampler", default="triton", help="built-in name or module:attribute (default: triton)")
    check.add_argument("--reference", default="reference", help="the oracle sampler, or 'none'")
    check.add_argument("--profile", choices=("dev", "ci", "gpu", "nightly"), default=None,
                       help="Hypothesis profile (default: HYPOTHESIS_PROFILE, ci under CI, else dev)")
    check.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="default: cuda when available, else the Triton interpreter on CPU")
    check.add_argument("--max-examples", type=int, default=None, help="override the profile's max_examples")
    check.add_argument("--only", nargs="+", metavar="PROPERTY", help="run only these properties")
    check.add_argument("--skip", nargs="+", metavar="PROPERTY", help="skip these properties")
    check.set_defaults(func=cmd_check)
    lst = sub.add_parser("list", help="list the properties and built-in samplers")
    lst.set_defaults(func=cmd_list)
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
