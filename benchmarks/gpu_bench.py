"""End-to-end timing of the Triton sampler on one GPU (SPEC sections 2-7).

Measures, with `triton.testing.do_bench` (median), the device entry point
`rejection_sample` on inputs already on the device: temperature processing (on
load), statistics, accept/reject, resample and bonus, for model drafts, one-hot
drafts and greedy, fp32 and bf16 target logits. Reports the ratio to the read
floor (bytes of logits read once / 4.3 TB/s, the H200's measured copy bandwidth),
chunked (>= 8 chunks) over single-chunk time, peak extra memory of a chunked call
with processed logprobs against the cap, and an R = 1..4096 scaling table.

    python benchmarks/gpu_bench.py [--out benchmarks/results/gpu_bench.md] [--small]

`--small` runs a tiny shape (also under the Triton interpreter on CPU) to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import numpy as np

COPY_BANDWIDTH = 4.3e12  # bytes/s, H200 device copy (read + write), measured (DESIGN.md)


def _setup_device():
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return "cpu"
    return "cuda"


def make_inputs(r, k, v, mode, dtype, device, seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    n = r * (k + 1)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    target = torch.randn((n, v), generator=g, device=device, dtype=torch.float32).mul_(2).to(tdtype)
    draft = None
    if mode == "model":
        draft = torch.randn((r, k, v), generator=g, device=device, dtype=torch.float32).mul_(2).to(tdtype)
    ids = torch.randint(0, v, (n,), generator=g, device=device, dtype=torch.int64)
    cu = torch.arange(0, n + 1, k + 1, device=device, dtype=torch.int32)
    pos = torch.randint(0, 2**40, (n,), generator=g, device=device, dtype=torch.int64)
    idx = torch.randperm(r, generator=g, device=device).to(torch.int32)
    if mode == "greedy":
        temp = torch.zeros(r, device=device, dtype=torch.float32)
    else:
        temp = torch.rand(r, generator=g, device=device).mul_(1.0).add_(0.5)
    seeds = torch.randint(-(2**62), 2**62, (r,), generator=g, device=device, dtype=torch.int64)
    args = (target, draft, ids, cu, pos, idx, temp, seeds)
    return args, np.arange(0, n + 1, k + 1)


def logits_bytes(args):
    target, draft = args[0], args[1]
    b = target.numel() * target.element_size()
    if draft is not None:
        b += draft.numel() * draft.element_size()
    return b


def bench(fn, device):
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
    import time

    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def run(args_ns):
    device = _setup_device()
    import torch
    import triton

    from rs_verify.triton_sampler.sampler import rejection_sample

    if args_ns.small:
        r, k, v, scales = 8, 4, 300, [1, 2, 8]
    else:
        r, k, v, scales = 1024, 4, 152064, [1, 4, 16, 64, 256, 1024, 4096]
    lines = []
    say = lambda s="": (print(s, flush=True), lines.append(s))  # noqa: E731

    gpu = torch.cuda.get_device_name() if device == "cuda" else f"CPU interpreter ({platform.processor()})"
    say(f"# Triton sampler benchmark\n")
    say(f"- date: {datetime.date.today().isoformat()}")
    say(f"- device: {gpu}")
    say(f"- torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}")
    say(f"- shape: R = {r}, K = {k}, V = {v}; median of triton.testing.do_bench; inputs already on the device")
    say(f"- read floor: bytes of logits read once / {COPY_BANDWIDTH / 1e12:.1f} TB/s\n")

    def call(a, cu_host, **kw):
        return lambda: rejection_sample(*a, num_speculative_steps=k, cu_num_logits_host=cu_host, **kw)

    say("| mode | logits | time (ms) | read floor (ms) | ratio to floor | 8+ chunks (ms) | chunked / single |")
    say("|---|---|---:|---:|---:|---:|---:|")
    for mode, dtype in [("model", "float32"), ("one_hot", "float32"), ("greedy", "float32"), ("model", "bfloat16")]:
        a, cu_host = make_inputs(r, k, v, mode, dtype, device)
        single = bench(call(a, cu_host, max_chunk_logits=r * (k + 1)), device)
        chunk_cap = max(1, (r * (k + 1)) // 8)
        info = {}
        rejection_sample(*a, num_speculative_steps=k, cu_num_logits_host=cu_host, max_chunk_logits=chunk_cap,
                         info=info)
        chunked = bench(call(a, cu_host, max_chunk_logits=chunk_cap), device)
        floor = logits_bytes(a) / COPY_BANDWIDTH * 1e3
        say(f"| {mode} | {dtype} | {single:.3f} | {floor:.3f} | {single / floor:.2f} | {chunked:.3f} "
            f"({info['num_chunks']} chunks) | {chunked / single:.3f} |")
        del a
        if device == "cuda":
            torch.cuda.empty_cache()

    say("\n## Peak extra memory of a chunked call (processed logprobs, k = 5)\n")
    say("| cap (MiB) | chunks | buffer rows | peak extra (MiB) | cap + 64 MiB | within |")
    say("|---:|---:|---:|---:|---:|---|")
    a, cu_host = make_inputs(r, k, v, "model", "float32", device)
    for cap_mib in ([1] if args_ns.small else [256, 1024]):
        cap_rows = max(1, cap_mib * 2**20 // (v * 4))
        info = {}
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        out = rejection_sample(*a, num_speculative_steps=k, cu_num_logits_host=cu_host, max_chunk_logits=cap_rows,
                               num_logprobs=5, logprobs_mode="processed", info=info)
        if device == "cuda":
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        else:
            peak = float("nan")
        del out
        ok = "yes" if peak <= cap_mib + 64 else ("n/a" if peak != peak else "NO")
        say(f"| {cap_mib} | {info['num_chunks']} | {info['max_buffer_rows']} | {peak:.1f} | {cap_mib + 64} | {ok} |")
    del a

    say("\n## Scaling with R (model drafts, fp32, K = 4)\n")
    say("| R | time (ms) | read floor (ms) | ratio |")
    say("|---:|---:|---:|---:|")
    for rr in scales:
        a, cu_host = make_inputs(rr, k, v, "model", "float32", device)
        t = bench(lambda: rejection_sample(*a, num_speculative_steps=k, cu_num_logits_host=cu_host), device)
        floor = logits_bytes(a) / COPY_BANDWIDTH * 1e3
        say(f"| {rr} | {t:.3f} | {floor:.3f} | {t / floor:.2f} |")
        del a
        if device == "cuda":
            torch.cuda.empty_cache()

    if args_ns.out:
        os.makedirs(os.path.dirname(args_ns.out) or ".", exist_ok=True)
        with open(args_ns.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {args_ns.out}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write the Markdown table here")
    p.add_argument("--small", action="store_true", help="a tiny shape (works on CPU through the interpreter)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
