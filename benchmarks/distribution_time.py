"""Wall time of the fixed-seed distribution campaigns on the reference sampler (one thread).

Each campaign draws its batch (drafts by Gumbel-max from q with the salted SPEC stream,
padded and masked drafts by pattern), validates and verifies it with
`reference.ReferenceSampler`, and runs its tests of fit; `--repeat` takes the fastest of N
runs (the machine may be shared). The table also gives each campaign's smallest detectable
total-variation bias (power 0.99, weakest principal test) from `campaign_power` at the
profile whose trial count is `--trials`, when there is one.

    python benchmarks/distribution_time.py [--trials 200000] [--repeat 3] [--no-write]
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

from rs_verify.reference import ReferenceSampler  # noqa: E402
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
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    sampler = ReferenceSampler()
    profile = next((p for p, t in dist.TRIALS.items() if t == args.trials), None)
    power = {r["property"]: r for r in dist.campaign_power(profile)} if profile else {}
    rows = []
    runs = [(name, lambda c=c: dist.run_campaign(sampler, c, args.trials)) for name, c in dist.CAMPAIGNS.items()]
    runs.append(("closed_forms", lambda: dist.run_closed_forms(sampler, args.trials)))
    total = total_cpu = 0.0
    for name, run in runs:
        times, cpu = [], []
        for _ in range(max(1, args.repeat)):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = run()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        seconds = min(times)
        total, total_cpu = total + seconds, total_cpu + min(cpu)
        worst = result.worst()
        tv = f"{power[name]['min_detectable_tv']:.3f}" if name in power else "-"
        rows.append(f"| {name} | {args.trials:,} | {len(result.fits)} | {worst.pvalue:.3g} | {tv} "
                    f"| {seconds:.2f} | {min(cpu):.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# Distribution campaigns on the reference sampler",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs; one thread used)",
        f"- Python {platform.python_version()}, NumPy {np.__version__}",
        "- wall time and CPU time of one campaign (fastest of {}): build the batch and its drafts, validate, "
        "verify, test every fit (CPU time is the fairer figure on a shared machine)".format(max(1, args.repeat)),
        f"- min TV: smallest total-variation bias detected with power 0.99 by the weakest principal test "
        f"(`campaign_power('{profile}')`)" if profile else "- min TV: no profile runs this trial count",
        "- target: a 200,000-trial distribution check in <= 20 s",
        "",
        "| campaign | trials | tests of fit | smallest p-value | min TV | seconds | CPU seconds |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        f"| all | | | | | {total:.2f} | {total_cpu:.2f} |",
        "",
    ])
    if not args.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
