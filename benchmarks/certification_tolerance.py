"""How tight certification's tolerance is (SPEC section 8), on the batches the ci profile draws.

For every batch the `certified_equivalence` property draws at the ci budget (60 derandomized
examples, each with its reseeded copies), compares two rules for the scale `L`:

- old: `L = max(1, largest finite |z|)` over the whole target row (and the draft row where q
  enters), as rs-verify did before issue 10;
- new: `L = max(1, |log p(x)|, |log q(x)|, |G_x|)` over the tokens the decision compares
  (`reference.trace`).

It reports the share of stochastic acceptance tests whose tolerance `eps * L` is at least 1 nat,
and the failures a planted draft-temperature bug (the reference mutant
`ref_own_rng_draft_temperature_ignored`, run with the triton-philox streams) keeps under each rule, on
the drawn batches and on the same batches with one never-sampled filler token (logit -1e4)
appended to every target and draft row.

    python benchmarks/certification_tolerance.py [--no-extreme]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from mutants.catalogue import by_name  # noqa: E402
from rs_verify.reference import ReferenceSampler  # noqa: E402
from rs_verify.engine import profiles, runner  # noqa: E402
from rs_verify.properties import PROPERTIES  # noqa: E402
from rs_verify.properties.certification import DEFAULT_EPS, REPLICAS, compare_decisions  # noqa: E402
from rs_verify.properties.transforms import reseeded_copies  # noqa: E402
from rs_verify.strategies.batches import PATTERNS, round_to_dtype  # noqa: E402

FILLER = -1e4


def drawn_batches(profile: str, extreme: bool) -> list:
    """The inputs `certified_equivalence` draws at `profile` (derandomized: the same on every run)."""
    prop = PROPERTIES["certified_equivalence"]
    seen = []
    ctx = runner.make_context(ReferenceSampler(), ReferenceSampler(), profile=profile)
    if not extreme:
        ctx.batch_kwargs["patterns"] = tuple(p for p in PATTERNS if p != "extreme")
    recorder = dataclasses.replace(prop, check=lambda _ctx, b: seen.append(b))
    runner.hypothesis_test(recorder, ctx)()
    return [reseeded_copies(b, REPLICAS, seed=int(b.num_logits)) for b in seen]


def with_filler(batch):
    """`batch` with one more token, logit -1e4 in every target (and draft) row: never sampled."""
    fill = float(round_to_dtype(np.array([FILLER], np.float32), batch.logits_dtype)[0])
    x = np.asarray(batch.target_logits)
    changes = {"target_logits": np.concatenate([x, np.full((x.shape[0], 1), fill, np.float32)], axis=1)}
    if batch.draft_logits is not None:
        d = np.asarray(batch.draft_logits)
        if d.shape[2] != x.shape[1]:
            return None  # Vd < V: the filler would not be a target token under the draft vocabulary
        changes["draft_logits"] = np.concatenate([d, np.full(d.shape[:2] + (1,), fill, np.float32)], axis=2)
    return batch.replace(**changes)


def old_scales(batch):
    """Per row: the old `L` of the target row alone and with its draft row (largest finite |z|)."""
    from rs_verify.reference import processed_logits

    def absmax(z):
        a = np.abs(z.astype(np.float64))
        a[~np.isfinite(a)] = 0
        return a.max(axis=-1) if a.shape[-1] else np.zeros(a.shape[:-1])

    zt = absmax(processed_logits(batch))
    zd = np.zeros_like(zt)
    if batch.draft_logits is not None and batch.num_speculative_steps:
        v = batch.effective_vocab_size
        cu = np.asarray(batch.cu_num_logits, np.int64)
        for r in range(batch.num_reqs):
            s = int(batch.idx_mapping[r])
            t = np.float32(batch.temperature[s])
            for i in range(int(cu[r + 1] - cu[r] - 1)):
                q = np.asarray(batch.draft_logits)[s, i, :v]
                zd[cu[r] + i] = absmax(q if t in (0, 1) else q / t)
    return np.maximum(1, zt), np.maximum(1, np.maximum(zt, zd))


def failures(batches, sampler, reference, rule: str) -> tuple[int, int]:
    """(failures, excused) of `sampler` against the reference under the old or new rule."""
    n_fail = n_exc = 0
    for b in batches:
        out = sampler(b)
        _, traces = reference.verify_with_trace(b)
        cmp = compare_decisions(b, out, traces)
        if rule == "new":
            n_fail += len(cmp.failed)
            n_exc += len(cmp.excused)
            continue
        lt, lq = old_scales(b)
        for d in cmp.divergences:
            if d.kind == "length":
                n_fail += 1
                continue
            j = int(b.cu_num_logits[d.request]) + d.step
            tr = traces[d.request]
            dec = next(x for x in tr.decisions if x.step == d.step and x.kind == ("accept" if d.kind == "accept"
                                                                                    else "argmax"))
            uses_q = b.draft_logits is not None and (d.kind == "accept" or any(
                x.kind == "residual" and x.step == d.step and x.accepted for x in tr.decisions))
            tol = DEFAULT_EPS * (lq[j] if uses_q else lt[j])
            m = abs(dec.margin) if d.kind == "accept" else (
                float(dec.gaps[d.prod_token]) if 0 <= d.prod_token < len(dec.gaps) else np.inf)
            ok = m <= tol
            n_exc += ok
            n_fail += not ok
    return n_fail, n_exc


def acceptance_tolerances(batches, reference):
    """Tolerance of every stochastic acceptance test under the old and the new rule, and its |margin| (nats)."""
    old, new, margin = [], [], []
    for b in batches:
        _, traces = reference.verify_with_trace(b)
        _, lq = old_scales(b)
        for tr in traces:
            for d in tr.decisions:
                if d.kind == "accept":
                    old.append(DEFAULT_EPS * lq[d.row])
                    new.append(DEFAULT_EPS * d.scale)
                    margin.append(abs(d.margin))
    return np.array(old), np.array(new), np.array(margin)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--no-extreme", action="store_true", help="draw as before issue 10 (no extreme pattern)")
    args = ap.parse_args(argv)
    profiles.load()
    reference = ReferenceSampler()
    batches = drawn_batches(args.profile, extreme=not args.no_extreme)
    old, new, margin = acceptance_tolerances(batches, reference)
    print(f"{len(batches)} batches ({'without' if args.no_extreme else 'with'} the extreme pattern), "
          f"{old.size} stochastic acceptance tests")
    for name, tol in (("old", old), ("new", new)):
        print(f"  {name} rule: tolerance >= 1 nat for {np.mean(tol >= 1):.1%}, >= 0.01 nat for "
              f"{np.mean(tol >= 0.01):.1%}; median {np.median(tol):.3g} nats; excusable whatever the sampler "
              f"does (|m| <= tolerance): {np.sum(margin <= tol)} ({np.mean(margin <= tol):.1%})")
    mutant = by_name("ref_own_rng_draft_temperature_ignored").load().ReferenceSampler()
    filled = [f for f in (with_filler(b) for b in batches) if f is not None]
    plain = [b for b in batches if with_filler(b) is not None]
    print(f"draft-temperature bug on the {len(plain)} batches a filler token can be added to:")
    for rule in ("old", "new"):
        f0, e0 = failures(plain, mutant, reference, rule)
        f1, e1 = failures(filled, mutant, reference, rule)
        print(f"  {rule} rule: {f0} failures ({e0} excused) as drawn; {f1} failures ({e1} excused) with a filler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
