"""Output invariants (SPEC sections 4, 5 and 6's `cu_num_generated_tokens`) and the greedy argmax chain.

The rules themselves are `rs_verify.properties.output_rules` (every call of a valid batch is held
to them); `output_invariants` draws batches for them alone, four reseeded copies per example.
"""

from __future__ import annotations

import numpy as np

from ..contract import probs
from ..contract.tree import greedy_tokens
from .assertions import call, event
from ..harness.failure import PropertyFailure
from .output_rules import check_output_invariants, fail_request, undeclared_hint
from .registry import register
from .certification import REPLICAS
from .inputs import decision_rich
from .transforms import reported_on, reseeded_copies


@register("output_invariants", "invariants", strategy=decision_rich, cost=160,
          why_kept=("Reference-free structural checks (range, prefix, padding, residual support): they hold for "
                    "samplers with their own streams, where certification is skipped."))
def output_invariants(ctx, drawn) -> None:
    """Tokens in [0, V') with p > 0, accepted prefix equals the drafts, -1 padding, num_sampled bounds."""
    batch = reseeded_copies(drawn, REPLICAS, seed=int(drawn.num_logits))
    declared = ctx.record.applied  # SPEC 11: the declared deviations' rules replace the SPEC's
    with reported_on(drawn):
        out = call(ctx.sampler, batch, check=False)
        try:
            check_output_invariants(batch, out, declared)
        except PropertyFailure as exc:
            raise PropertyFailure(f"{exc}{undeclared_hint(batch, out, declared)}", batch=exc.batch,
                                  details=exc.details) from None


@register("greedy_chain", "invariants", strategy=decision_rich, cost=80,
          why_kept=("Greedy requests are compared with the exact argmax chain, independent of the reference and of "
                    "any tolerance."))
def greedy_chain(ctx, batch) -> None:
    """Greedy requests (T = 0) emit exactly the argmax chain, lowest index on ties."""
    out = call(ctx.sampler, batch)
    a = probs.greedy_argmax(batch)
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, dtype=np.int64)]
    greedy = np.flatnonzero(temps == 0)
    event(f"greedy requests: {min(len(greedy), 3)}{'+' if len(greedy) >= 3 else ''}")
    for r in greedy:
        want = greedy_tokens(batch, int(r), a) if batch.tree else _argmax_chain(batch.draft_tokens(r), a, cu, r)
        got = out.request(r)
        if got != want:
            fail_request(batch, int(r), f"greedy request emitted {got}, argmax chain is {want}")


def _argmax_chain(drafts, a, cu, r) -> list[int]:
    """What greedy request `r` emits token by token (SPEC 4): the argmax of each row up to the first draft
    that differs from it, else every draft and the bonus row's argmax."""
    want = []
    for i, d in enumerate(drafts):
        want.append(int(a[cu[r] + i]))
        if d != want[-1]:
            return want
    want.append(int(a[cu[r + 1] - 1]))
    return want
