"""EAGLE's tree verification certified on tree batches alone (SPEC 4c), decision by decision.

`rs-verify releases eagle-llm==1.2.1` draws token batches beside the tree batches (every sampler verifies
SPEC 4's chains), and a failure there stops certification before the tree decisions are reached. This
script draws tree batches only (`strategies.tree_batches` with the adapter's declarations: drafts without
replacement, its sampling parameters), certifies each against the float64 reference bound to the adapter's
record (explicit noise, inverse-CDF resampling, its declared deviation) and keeps going after a failure:
it prints how many batches and stochastic decisions were certified, how many decisions the declared
deviation decided, and every failure's first line with its batch.

    PYTHONPATH=~/.cache/rs-verify/releases/eagle-llm-1.2.1/site python benchmarks/eagle_trees.py [--examples 200]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import ReferenceSampler  # noqa: E402
from rs_verify.adapters.eagle import EagleSampler  # noqa: E402
from rs_verify.harness.context import certifying_reference  # noqa: E402
from rs_verify.harness.record import record_of  # noqa: E402
from rs_verify.properties.assertions import PropertyFailure  # noqa: E402
from rs_verify.properties.certification import certify  # noqa: E402
from rs_verify.properties.decisions import compare_decisions  # noqa: E402
from rs_verify.strategies import tree_batches  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    args = ap.parse_args(argv)
    sampler = EagleSampler()
    record = record_of(sampler)
    oracle = certifying_reference(ReferenceSampler(), record)
    tally = collections.Counter()
    failures = []

    @settings(max_examples=args.examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(tree_batches(tree_drafts=tuple(record.tree_drafts), sampling_params=tuple(record.sampling_params)))
    def check(batch):
        _, traces = oracle.verify_with_trace(batch)
        try:
            out = sampler(batch)
            cmp = compare_decisions(batch, out, traces, reference=oracle)
            tally["stochastic decisions"] += cmp.stochastic
            tally["deviation decisions"] += sum(1 for t in traces for d in t.decisions if d.deviation)
            certify(cmp, batch=batch)
            tally["batches certified"] += 1
        except (PropertyFailure, RuntimeError) as exc:
            failures.append((f"{type(exc).__name__}: " + " / ".join(str(exc).splitlines()[:2]), repr(batch)))

    check()
    print(dict(tally), f"failures: {len(failures)} of {args.examples} batches")
    for what, batch in failures:
        print(f"- {what}\n  {batch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
