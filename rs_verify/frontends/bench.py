"""`rs-verify bench`: list and run the scripts under ./benchmarks (a source checkout's, not the
installed package's: run it from the repository root)."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from pathlib import Path


def bench_dirs() -> list:
    """Where benchmark scripts are looked up: ./benchmarks (the scripts live in a source checkout,
    not in the installed package: run `rs-verify bench` from the repository root)."""
    d = Path.cwd() / "benchmarks"
    return [d] if d.is_dir() else []


def benchmarks() -> dict:
    """name -> path of every `benchmarks/<name>.py` (first directory wins)."""
    found = {}
    for d in bench_dirs():
        for path in sorted(d.glob("*.py")):
            if not path.name.startswith("_"):
                found.setdefault(path.stem, path)
    return found


def _first_doc_line(path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, OSError, UnicodeDecodeError):
        return ""
    return (doc or "").strip().split("\n")[0]


def cmd_bench(args) -> int:
    found = benchmarks()
    if args.list or not (args.name or args.all):
        if not found:
            print("no benchmarks found (looked in: " + ", ".join(str(d) for d in bench_dirs()) + " and ./benchmarks)")
            return 0 if args.list else 2
        width = max(len(n) for n in found)
        for name, path in found.items():
            print(f"{name:{width}}  {_first_doc_line(path)}  [{path}]")
        return 0
    names = list(found) if args.all else [args.name.removesuffix(".py")]
    missing = [n for n in names if n not in found]
    if missing:
        print(f"rs-verify bench: no benchmark {missing[0]!r}; available: {sorted(found) or 'none'}", file=sys.stderr)
        return 2
    worst = 0
    for name in names:
        cmd = [sys.executable, str(found[name]), *(args.args or [])]
        print(f"rs-verify bench: {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(cmd)
        print(f"rs-verify bench: {name} exited {code} after {time.perf_counter() - start:.1f} s", flush=True)
        worst = worst or code
    return worst


def add_parser(sub) -> None:
    """The `bench` subcommand of `rs-verify` (wired in rs_verify.frontends.cli)."""
    p = sub.add_parser("bench", help="run the scripts under benchmarks/ (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--all", action="store_true", help="run every benchmark (without arguments)")
    p.add_argument("name", nargs="?", help="the benchmark: benchmarks/<name>.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark script")
    p.set_defaults(func=cmd_bench)
