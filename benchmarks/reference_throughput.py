"""Throughput of the NumPy reference sampler (no trace) on one CPU thread.

V = 256, K = 4 (every request drafts K tokens, so N = 5 R rows), random model-draft
and one-hot batches, stochastic and greedy. Reports rows/s by wall clock and by
process CPU time (the host is often shared: CPU time is the steadier number) and
writes a Markdown table to benchmarks/results/reference_throughput.md.

    python benchmarks/reference_throughput.py [--reqs 20000] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rs_verify.reference import ReferenceSampler  # noqa: E402
from rs_verify.contract.batch import SpecBatch  # noqa: E402

V, K = 256, 4
TARGET = 100_000  # rows/s
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "reference_throughput.md"


def make_batch(num_reqs: int, *, one_hot: bool, greedy: bool = False, ragged: bool = False, seed: int = 0) -> SpecBatch:
    """Random logits N(0, 2^2), drafts uniform over the vocab, distinct states, random seeds and positions."""
    rng = np.random.default_rng(seed)
    states = num_reqs + 8  # unreferenced states exist
    n = rng.integers(0, K + 1, num_reqs) if ragged else np.full(num_reqs, K)
    cu = np.concatenate([[0], np.cumsum(n + 1)]).astype(np.int32)
    rows = int(cu[-1])
    temperature = rng.uniform(0.5, 1.5, states).astype(np.float32)
    if greedy:
        temperature[:] = 0
    return SpecBatch(
        target_logits=(rng.standard_normal((rows, V)) * 2).astype(np.float32),
        draft_logits=None if one_hot else (rng.standard_normal((states, K, V)) * 2).astype(np.float32),
        draft_token_ids=rng.integers(0, V, rows).astype(np.int64),
        cu_num_logits=cu,
        pos=rng.integers(0, 1 << 20, rows).astype(np.int64),
        idx_mapping=rng.permutation(states)[:num_reqs].astype(np.int32),
        temperature=temperature,
        seeds=rng.integers(-(2**63), 2**63 - 1, states, dtype=np.int64),
        num_speculative_steps=K,
    )


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure(sampler, batch, repeats: int) -> dict:
    sampler(batch)  # warm-up (buffers, caches)
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        sampler(batch)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    rows = batch.num_logits
    return {
        "rows": rows,
        "wall_best": rows / min(walls),
        "wall_median": rows / float(np.median(walls)),
        "cpu_best": rows / min(cpus),
        "seconds": float(np.median(walls)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reqs", type=int, default=20000, help="requests per batch (N = 5 R rows)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    args = ap.parse_args(argv)

    sampler = ReferenceSampler(validate=False)
    cases = [
        ("model drafts, T>0", dict(one_hot=False)),
        ("one-hot drafts, T>0", dict(one_hot=True)),
        ("model drafts, ragged n_r", dict(one_hot=False, ragged=True)),
        ("greedy (T=0)", dict(one_hot=False, greedy=True)),
    ]
    results = []
    for name, kw in cases:
        res = measure(sampler, make_batch(args.reqs, **kw), args.repeats)
        results.append((name, res))
        print(
            f"{name:28s} N={res['rows']:7d}  wall best {res['wall_best']:9.0f} rows/s  "
            f"median {res['wall_median']:9.0f}  cpu {res['cpu_best']:9.0f}  ({res['seconds']:.2f} s/batch)"
        )
    ok = all(r["wall_best"] >= TARGET for _, r in results[:2])
    print(f"target {TARGET} rows/s (model and one-hot, full drafts): {'met' if ok else 'NOT met'}")

    if not args.no_write:
        today = datetime.date.today().isoformat()
        lines = [
            "# Reference sampler throughput",
            "",
            f"- date: {today}",
            f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs on the host; one thread used)",
            f"- Python {platform.python_version()}, NumPy {np.__version__}",
            f"- V = {V}, K = {K}, R = {args.reqs} requests, no trace, no validation, no logprobs; "
            f"best and median of {args.repeats} runs after a warm-up",
            "- rows/s = logits rows (N) verified per second; CPU = process CPU time "
            "(the host was shared with other jobs, so wall-clock numbers are noisy)",
            f"- target: {TARGET:,} rows/s",
            "",
            "| batch | N rows | rows/s (wall, best) | rows/s (wall, median) | rows/s (CPU time) |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, r in results:
            lines.append(
                f"| {name} | {r['rows']:,} | {r['wall_best']:,.0f} | {r['wall_median']:,.0f} | {r['cpu_best']:,.0f} |"
            )
        lines.append("")
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(lines))
        print(f"wrote {RESULTS}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
