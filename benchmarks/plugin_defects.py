"""The gate against defects outside the mutant catalogue, the way a user runs it.

Each defect is a one-line text change of a copy of the example torch sampler
(`examples/torch_sampler.py`), written into a temporary directory as its own module; each is
gated with `pytest -p rs_verify --rs-sampler=<module>:TorchSampler --rs-profile ci -n 2` from
an empty directory, the unchanged copy first (it must pass). Prints a Markdown table: the
verdict, the failing properties and the wall time of each run.

    python benchmarks/plugin_defects.py [--profile ci] [--workers 2]
    python benchmarks/plugin_defects.py --declared   # samplers declaring what they drop
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DEFECTS = {
    "temperature_floor": ("T clamped to at least 0.1 for stochastic requests",
        "        temp = t(batch.temperature, torch.float32)[state_of_row]\n",
        "        temp = t(batch.temperature, torch.float32)[state_of_row]\n"
        "        temp = torch.where(temp > 0, torch.clamp(temp, min=0.1), temp)\n"),
    "no_bonus_token": ("no bonus token when every draft is accepted",
        "        num_sampled = (stop + 1).to(torch.int32)\n",
        "        num_sampled = torch.where(rejected, stop + 1, torch.clamp(stop, min=1)).to(torch.int32)\n"
        "        sampled[torch.arange(r_count, device=dev)[~rejected & (stop > 0)], "
        "stop[~rejected & (stop > 0)]] = -1\n"),
    "position_int32": ("positions truncated to 32 bits for the Philox counter",
        "        pos = t(batch.pos, torch.int64)\n", "        pos = t(batch.pos, torch.int64) & 0xFFFFFFFF\n"),
    "rank_from_zero": ("logprob ranks counted from 0",
        "        ranks = 1 + (lp > chosen).sum(dim=1)\n", "        ranks = (lp > chosen).sum(dim=1)\n"),
    "resample_seed_ignored": ("resample noise keyed by a constant instead of the request's seed",
        "            g = philox_randint(seed[rows], pos[rows])", "            g = philox_randint(seed[rows] * 0 + 1234, pos[rows])"),
    "ratio_swapped": ("acceptance test u < q/p instead of p/q",
        "            stochastic_accept = logp_d > log_u + logq.gather(1, d_safe[:, None])[:, 0]",
        "            stochastic_accept = logq.gather(1, d_safe[:, None])[:, 0] > log_u + logp_d"),
    "draft_zero_is_padding": ("draft id 0 treated as padding",
        "        valid = verifying & (draft >= 0) & (draft < v_eff)", "        valid = verifying & (draft > 0) & (draft < v_eff)"),
    "raw_logprobs_always": ("processed-mode logprobs computed from the raw logits",
        '            lp_rows = x if batch.logprobs_mode == "raw" else z_full', "            lp_rows = x"),
    "gumbel_from_log_v": ("Gumbel noise -log(-log v) instead of the SPEC's -log(-log1p(-v))",
        "            gumbel = -torch.log(-torch.log1p(-v.double()))", "            gumbel = -torch.log(-torch.log(v.double()))"),
    "one_hot_residual_halves_draft": ("one-hot rejection halves p(d) instead of removing d",
        "                log_target[hit, d[hit]] = -torch.inf  # one-hot: p with r(d) = 0",
        "                log_target[hit, d[hit]] = log_target[hit, d[hit]] - 0.69314718"),
}


def write_modules(where: Path) -> list[str]:
    src = (ROOT / "examples" / "torch_sampler.py").read_text()
    (where / "d_unchanged.py").write_text(src)
    for name, (_, old, new) in DEFECTS.items():
        if src.count(old) != 1:
            raise SystemExit(f"{name}: its text left examples/torch_sampler.py")
        (where / f"d_{name}.py").write_text(src.replace(old, new))
    return ["unchanged", *DEFECTS]


def gate(module: str, where: Path, profile: str, workers: int, attr: str = "TorchSampler",
         extra: tuple = ()) -> tuple[int, list[str], float]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"gate-{module}-"))
    cmd = [sys.executable, "-m", "pytest", "-p", "rs_verify", f"--rs-sampler={module}:{attr}",
           "--rs-profile", profile, "-q", "-rf", "-p", "no:cacheprovider", *extra] + \
        (["-n", str(workers)] if workers else [])
    env = {**os.environ, "PYTHONPATH": f"{where}{os.pathsep}{ROOT}"}
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True)
    failed = re.findall(r"^FAILED rs-verify::(\S+)", out.stdout, flags=re.M)
    return out.returncode, failed, time.perf_counter() - start


# Samplers that declare block verification or top-p and drop it (examples/declared_defects.py),
# beside the same wrapper doing nothing wrong; gated on the decision-comparing properties.
DECLARED = {"Faithful": "none (the built-in Triton sampler, wrapped)",
            "TokenWiseDeclaringBlock": "declares block verification, verifies every batch token by token",
            "TopPIgnored": "declares top-p, ignores it"}
DECLARED_PROPERTIES = "certified_equivalence or output_invariants"


def declared(profile: str, workers: int) -> int:
    print("| sampler | defect | verdict | failing properties | seconds |\n|---|---|---|---|---|")
    wrong = 0
    for attr, what in DECLARED.items():
        rc, failed, secs = gate("examples.declared_defects", ROOT, profile, workers, attr, ("-k", DECLARED_PROPERTIES))
        verdict = "passed" if rc == 0 else ("failed" if rc == 1 else f"error (exit {rc})")
        wrong += (attr == "Faithful") != (rc == 0)
        print(f"| `{attr}` | {what} | {verdict} | {', '.join(failed) or '-'} | {secs:.0f} |", flush=True)
    return 1 if wrong else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--declared", action="store_true",
                    help=f"gate examples/declared_defects.py instead, on {DECLARED_PROPERTIES}")
    args = ap.parse_args()
    if args.declared:
        return declared(args.profile, args.workers)
    where = Path(tempfile.mkdtemp(prefix="plugin-defects-"))
    print("| sampler | defect | verdict | failing properties | seconds |\n|---|---|---|---|---|")
    wrong = 0
    for name in write_modules(where):
        rc, failed, secs = gate(f"d_{name}", where, args.profile, args.workers)
        what = "none (the example sampler as shipped)" if name == "unchanged" else DEFECTS[name][0]
        verdict = "passed" if rc == 0 else ("failed" if rc == 1 else f"error (exit {rc})")
        wrong += (name == "unchanged") != (rc == 0)
        print(f"| `{name}` | {what} | {verdict} | {', '.join(failed) or '-'} | {secs:.0f} |", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
