"""Wall time of the fixed-seed distribution campaigns on the reference sampler (one thread).

Each campaign draws its batch (drafts by Gumbel-max from q with the salted SPEC stream),
validates and verifies it with `reference.ReferenceSampler`, and runs its tests of fit.

    python benchmarks/distribution_time.py [--trials 200000] [--no-write]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from reference import ReferenceSampler  # noqa: E402
from rs_verify.properties import distribution as dist  # noqa: E402

OUT = Path(__file__).parent / "results" / "distribution_time.md"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200_000)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    sampler = ReferenceSampler()
    rows = []
    runs = [(name, lambda c=c: dist.run_campaign(sampler, c, args.trials)) for name, c in dist.CAMPAIGNS.items()]
    runs.append(("closed_forms", lambda: dist.run_closed_forms(sampler, args.trials)))
    for name, run in runs:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        worst = result.worst()
        rows.append(f"| {name} | {args.trials:,} | {len(result.fits)} | {worst.pvalue:.3g} | {seconds:.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# Distribution campaigns on the reference sampler",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs; one thread used)",
        f"- Python {platform.python_version()}, NumPy {np.__version__}",
        "- wall time of one campaign: build the batch and its drafts, validate, verify, test every fit",
        "- target: a 200,000-trial distribution check in <= 20 s",
        "",
        "| campaign | trials | tests of fit | smallest p-value | seconds |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
    ])
    if not args.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
