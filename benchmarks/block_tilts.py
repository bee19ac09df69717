"""How often the block strategies' designated pairs land where they aim (strategies/block.py).

A rescue wants `u_a > h_a` then `u_{a+1} <= h_{a+1}`; a partial block `u_a <= h_a` with `P_a < 1`
then `u_{a+1} > h_{a+1}`. This draws `--examples` block batches of `decision_batches`
(derandomized, Hypothesis's generate phase only) for each block seed, and counts, per pattern and
draft kind, the pairs whose two steps both land on their wanted side (`both`), only the first
(`a only`), only the second (`b only`) or neither, as the reference's block closed forms decide
them with the declared seed's uniforms.

    python benchmarks/block_tilts.py [--examples 300]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

import strategies.block as block
from strategies.decisions import decision_batches

SEEDS = {"plain": "triton-philox", "step": "murmur3"}  # block seed -> a family that offers it


def landings(block_seed: str, examples: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    pick, near = block._pick, block._near
    seen: dict = {}

    def spy_pick(rng, c, r, a, rescue):
        seen.update(a=a, rescue=rescue)
        return pick(rng, c, r, a, rescue)

    def spy_near(rng, c, r, pattern=None):
        seen.clear()
        near(rng, c, r, pattern)
        if "a" not in seen:
            return
        a, rescue = seen["a"], seen["rescue"]
        res, _, q, u = c.block(r)
        h, big_p = res.h[0], np.exp(res.log_prefix[0])
        first = u[a] > h[a] if rescue else (u[a] <= h[a] and big_p[a] < 1)
        second = u[a + 1] <= h[a + 1] if rescue else u[a + 1] > h[a + 1]
        where = "both" if first and second else "a only" if first else "b only" if second else "neither"
        counts[("rescue" if rescue else "partial", "one-hot" if q is None else "model", where)] += 1

    @settings(max_examples=examples, derandomize=True, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate], deadline=None, database=None)
    @given(decision_batches(verifications=("block",), block_seed=block_seed, streams=SEEDS[block_seed]))
    def draw(batch):
        pass

    block._pick, block._near = spy_pick, spy_near
    try:
        draw()
    finally:
        block._pick, block._near = pick, near
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300)
    args = ap.parse_args()
    print("| block seed | pattern | drafts | both | a only | b only | neither |")
    print("|---|---|---|---|---|---|---|")
    for seed in SEEDS:
        counts = landings(seed, args.examples)
        for pattern in ("rescue", "partial"):
            for drafts in ("model", "one-hot"):
                row = [counts[(pattern, drafts, w)] for w in ("both", "a only", "b only", "neither")]
                print(f"| {seed} | {pattern} | {drafts} | " + " | ".join(map(str, row)) + " |")


if __name__ == "__main__":
    main()
