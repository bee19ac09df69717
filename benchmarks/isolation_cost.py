"""What running the sampler in a child process costs: the child's start, and each call's round trip.

`rs_verify.engine.isolation.ChildSampler` spawns a child that imports the sampler (and with it
torch), then pickles every batch to it and every output back. This script times, on this
machine:

- the start of a child for the example torch sampler and for the built-in Triton sampler;
- one call of a sampler that does no work (`NullSampler`: an all-rejected output of the right
  shape), in this process and in a child, for a ci-profile batch and for larger ones: the
  difference is the isolation's per-call cost (pickling both ways, the pipe, the input
  snapshot in the child).

    python benchmarks/isolation_cost.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rs_verify import SamplerOutput  # noqa: E402
from rs_verify.engine import isolation  # noqa: E402
from rs_verify.harness import device, guards  # noqa: E402
from rs_verify.properties.memory import large_batch  # noqa: E402


class NullSampler:
    """Answers every batch at once: each request emits nothing but its (padded) first token."""

    name = "null"

    def __call__(self, batch, *, max_chunk_logits=None):
        r, k = batch.num_reqs, batch.num_speculative_steps
        sampled = np.full((r, k + 1), -1, np.int64)
        sampled[:, 0] = 0
        return SamplerOutput(sampled=sampled, num_sampled=np.ones(r, np.int32))


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dev = device.resolve()
    print(f"device {dev}; median of {args.repeats}")
    for spec in ("examples.torch_sampler:TorchSampler", "triton"):
        start = _time(lambda s=spec: isolation.ChildSampler(s, device_name=dev).close(), args.repeats)
        print(f"child start, {spec}: {start:.2f} s")
    child = isolation.ChildSampler("isolation_cost:NullSampler", sys_path=[str(HERE)], device_name=dev)
    local = NullSampler()
    sizes = {"ci-size (R=6, K=4, V=300)": (6, 4, 300), "R=16, K=4, V=1024": (16, 4, 1024),
             "R=64, K=8, V=32768": (64, 8, 32768)}
    for label, (r, k, v) in sizes.items():
        batch = large_batch(r=r, k=k, v=v)
        mb = sum(np.asarray(getattr(batch, f)).nbytes for f in ("target_logits", "draft_logits")) / 2**20
        here = _time(lambda b=batch: guards.observed_call(local, b), args.repeats)
        there = _time(lambda b=batch: guards.observed_call(child, b), args.repeats)
        print(f"call, {label} ({mb:.1f} MiB of logits): {here * 1e3:.1f} ms in process, "
              f"{there * 1e3:.1f} ms in a child (+{(there - here) * 1e3:.1f} ms)")
    child.close()


if __name__ == "__main__":
    main()
