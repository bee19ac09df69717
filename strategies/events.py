"""What a drawn batch exercises: labels for `hypothesis.event` and for the meta-tests.

`decision_knobs(batch)` reads the knobs off the batch itself (not off the draw), so
the meta-tests check what the properties actually receive. It walks the acceptance
tests of SPEC section 4 in float64 with the SPEC uniforms, only to label the draw
(which tests are evaluated, their acceptance probability, whether a rejection's
residual is empty); no property relies on it. Block batches (SPEC section 4b) and
sampling parameters (section 2) are labelled from the contract's own formulas
(`rs_verify.contract.block`, `rs_verify.contract.masks`) in `strategies.block_events` and
`strategies.param_events`, whose knobs this module re-exports:

- `DECISION_KNOBS`: token-wise acceptance decisions (stochastic requests of token batches);
- `BLOCK_KNOBS`: block decisions (stochastic requests of block batches; `BLOCK_EXTRA_KNOBS` are
  labelled but rarer);
- `PARAM_KNOBS`: the masks of min-p, top-k and top-p and the decisions they change;
- `STREAM_KNOBS`: the stream family's planted edges (murmur3: `u = 1.0` and the smallest `u` deciding
  a bonus token, requests at `p` and `p + 2**32`; `strategies.stream_edges`), labelled when the
  batch is read in that family;
- `EXPLICIT_KNOBS`: the explicit family's planted noise (SPEC 3c: uniforms at `2**-53` and
  `1 - 2**-53`, `u = p(d) / q(d)`, tied scores, `U` on a prefix sum or at the top;
  `strategies.explicit_edges`), labelled when the batch is read in that family.

Imports only NumPy, Hypothesis and the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import event

from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.methods import BLOCK
from rs_verify.contract.streams import PLAIN

from .block_events import (BLOCK_EXTRA_KNOBS, BLOCK_KNOBS, block_decisions, block_k_knob, block_knobs_of,
                           block_near_ties)
from .facts import STREAMS, Facts, batch_facts
from .param_events import PARAM_KNOBS, mask_near_ties, param_knobs_of, state_params_on
from .explicit_edges import EXPLICIT_KNOBS, explicit_knobs
from .stream_edges import STREAM_KNOBS, stream_knobs

__all__ = ["ACCEPT_BAND", "BLOCK_EXTRA_KNOBS", "BLOCK_KNOBS", "DECISION_KNOBS", "EXPLICIT_KNOBS", "PARAM_KNOBS", "STREAM_KNOBS",
           "acceptance_tests", "block_k_knob", "block_knobs", "decision_knobs", "label_decisions", "label_structure",
           "near_ties", "stochastic_decisions"]

ACCEPT_BAND = (0.1, 0.95)  # acceptance probabilities where the uniform u decides

STOCHASTIC = "stochastic acceptance decision"
IN_BAND = "acceptance probability in [0.1, 0.95]"
REJECTED = "rejected draft: residual resample"
PADDED_MODEL = "padded draft with model logits"
EMPTY_RESIDUAL = "empty residual"
TIE = "exact tie in target logits"
MIXED = "greedy and stochastic requests in one batch"
ONE_HOT = "one-hot drafts: stochastic decision"
MODEL_T = "model drafts at T != 1: stochastic decision"

DECISION_KNOBS = (STOCHASTIC, IN_BAND, REJECTED, PADDED_MODEL, EMPTY_RESIDUAL, TIE, MIXED, ONE_HOT, MODEL_T)


def block_knobs(block: int) -> tuple[str, str]:
    """The vocab knobs of a sampler with vocabulary block `block`."""
    return f"multi-block vocab (V > {block})", f"partial tail block (V > {block}, V % {block} != 0)"


@dataclass(frozen=True)
class Test:
    """One acceptance test that SPEC section 4 evaluates for a stochastic request."""

    request: int
    step: int
    draft: int
    padded: bool  # a padded or out-of-range draft: rejected without a test
    probability: float  # min(1, p(d) / q(d)) (q = 1 for one-hot drafts); 0 when padded
    accepted: bool
    empty_residual: bool  # rejected model draft whose max(p - q, 0) has no positive mass


def _facts(batch, family=STREAMS, block_seed=PLAIN) -> Facts:
    return batch if isinstance(batch, Facts) else batch_facts(batch, family, block_seed)


def acceptance_tests(batch: SpecBatch | Facts) -> list[Test]:
    """The token-wise acceptance tests of every stochastic request, up to and including its first
    rejection (none for the stochastic requests of a block batch: they verify by block)."""
    f = _facts(batch)
    batch = f.batch
    if batch.num_reqs == 0 or batch.num_logits == 0 or batch.verification == BLOCK.name:
        return []
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    v, p, q, u = f.v, f.p, f.q, f.u
    tests = []
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        for r in np.flatnonzero(f.stochastic):
            for i, d in enumerate(batch.draft_tokens(r)):
                j = int(cu[r] + i)
                d = int(d)
                if not 0 <= d < v:
                    tests.append(Test(int(r), i, d, True, 0.0, False, False))
                    break
                qd = q[j, d] if q is not None else 1.0
                prob = 0.0 if p[j, d] == 0 else 1.0 if p[j, d] >= qd else float(p[j, d] / qd)
                accepted = bool(np.log(p[j, d]) > np.log(u[j]) + (np.log(q[j, d]) if q is not None else 0.0))
                empty = bool(q is not None and not accepted and not (p[j] - q[j] > 0).any())
                tests.append(Test(int(r), i, d, False, prob, accepted, empty))
                if not accepted:
                    break
    return tests


def _has_tie(batch: SpecBatch) -> bool:
    """Some row has >= 2 exactly equal maxima over [0, V') and is not flat there."""
    h = np.asarray(batch.target_logits)[:, : batch.effective_vocab_size]
    if h.shape[0] == 0 or h.shape[1] < 3:
        return False
    ties = (h == h.max(axis=1, keepdims=True)).sum(axis=1)
    return bool(((ties >= 2) & (ties < h.shape[1])).any())


def _bonus_rows(f: Facts, tests) -> list[tuple[int, int]]:
    """`(request, row)` of every stochastic request that emits its bonus token."""
    b = f.batch
    cu = np.asarray(b.cu_num_logits, np.int64)
    n = b.num_draft_tokens
    if f.block is not None:
        return [(int(r), int(cu[r] + n[r])) for r in np.flatnonzero(f.stochastic) if f.tau[r] == n[r]]
    accepted = {}
    for t in tests:
        accepted[t.request] = accepted.get(t.request, 0) + t.accepted
    return [(int(r), int(cu[r] + n[r])) for r in np.flatnonzero(f.stochastic) if accepted.get(int(r), 0) == n[r]]


def decision_knobs(batch: SpecBatch | Facts, block_sizes=(), family=STREAMS, block_seed=PLAIN) -> set[str]:
    """The knobs of `DECISION_KNOBS`, `BLOCK_KNOBS`, `PARAM_KNOBS`, `STREAM_KNOBS` and `EXPLICIT_KNOBS` (and
    `block_knobs(b)` for `b` in `block_sizes`) the batch has, read in stream family `family` with its
    block steps keyed by `block_seed` (the facts' own when `batch` is a `Facts`)."""
    f = _facts(batch, family, block_seed)
    batch = f.batch
    tests = acceptance_tests(f)
    real = [t for t in tests if not t.padded and t.probability > 0]
    temps = f.temps
    model = batch.draft_logits is not None
    knobs = set()
    if real:
        knobs.add(STOCHASTIC)
        if not model:
            knobs.add(ONE_HOT)
        elif any(temps[t.request] != 1 for t in real):
            knobs.add(MODEL_T)
    if any(ACCEPT_BAND[0] <= t.probability <= ACCEPT_BAND[1] for t in real):
        knobs.add(IN_BAND)
    if any(not t.padded and not t.accepted for t in tests):
        knobs.add(REJECTED)
    if model and any(t.padded for t in tests):
        knobs.add(PADDED_MODEL)
    if any(t.empty_residual for t in tests):
        knobs.add(EMPTY_RESIDUAL)
    if _has_tie(batch):
        knobs.add(TIE)
    if (temps == 0).any() and (temps > 0).any():
        knobs.add(MIXED)
    v = batch.vocab_size
    for b in block_sizes:
        multi, tail = block_knobs(b)
        if v > b:
            knobs.add(multi)
            if v % b:
                knobs.add(tail)
    knobs |= block_knobs_of(f)
    bonus = _bonus_rows(f, tests)
    knobs |= param_knobs_of(f, tests, bonus)
    knobs |= stream_knobs(f, bonus)
    knobs |= explicit_knobs(f)
    return knobs


def stochastic_decisions(batch: SpecBatch | Facts) -> int:
    """How many stochastic decisions the batch's stochastic requests evaluate: acceptance tests
    with `p(d) > 0` (token batches) and block decisions with `h_i > 0` (block batches)."""
    f = _facts(batch)
    return sum(1 for t in acceptance_tests(f) if not t.padded and t.probability > 0) + block_decisions(f)


def near_ties(batch: SpecBatch | Facts) -> tuple[int, int]:
    """`(mask decisions, block decisions)` within `1e-6 * L` of their boundary (SPEC section 8's
    scale), where float32 and float64 may decide differently: the strategies never aim there."""
    f = _facts(batch)
    return mask_near_ties(f), block_near_ties(f)


def _bucket(n: int) -> str:
    return "0" if n == 0 else "1-3" if n <= 3 else "4-9" if n <= 9 else "10+"


def label_decisions(batch: SpecBatch, block_sizes=(), family=STREAMS, block_seed=PLAIN) -> None:
    """`hypothesis.event` for every decision knob the batch has (read in stream family `family`, block
    steps keyed by `block_seed`) and its count of decisions, its verification method and the sampling
    parameters it carries."""
    f = batch_facts(batch, family, block_seed)
    for knob in sorted(decision_knobs(f, block_sizes)):
        event(knob)
    event(f"stochastic acceptance decisions: {_bucket(stochastic_decisions(f))}")
    event(f"verification: {batch.verification}")
    if batch.verification == BLOCK.name:
        event(block_k_knob(batch.num_speculative_steps))
    on = state_params_on(batch)
    present = [f"{name}{'' if on[name].any() else ' (all off)'}" for name in on if getattr(batch, name) is not None]
    event(f"sampling params: {', '.join(present) or 'none'}")
    if batch.noise_carried():  # SPEC 3c's explicit noise fields, when the batch carries them
        event(f"explicit noise: {'/'.join(batch.noise_carried())}")


def label_structure(batch, mode, dtype, temp_kind, kinds, patterns, lp_mode, masked, idx) -> None:
    """Structural labels of a draw (shown by `--hypothesis-show-statistics`)."""
    R, V = batch.num_reqs, batch.vocab_size
    event(f"drafts: {mode}")
    event(f"logits_dtype: {dtype}")
    mixed = f" ({'/'.join(sorted(set(kinds)))})" if temp_kind == "mixed" and kinds else ""
    event(f"temperature: {temp_kind}{mixed}")
    for p in sorted(set(patterns)):
        event(f"pattern: {p}")
    event(f"logprobs: {lp_mode}")
    event(f"S > R: {batch.num_states > R}")
    event(f"idx_mapping shuffled: {not np.array_equal(idx, np.arange(R))}")
    verified = np.concatenate([batch.draft_tokens(r) for r in range(R)]) if R else np.zeros(0)
    event(f"padded drafts: {bool((verified < 0).any())}")
    event(f"masks: {masked}")
    bucket = "1" if V == 1 else "2-16" if V <= 16 else "17-129" if V <= 129 else ">129"
    event(f"vocab: {bucket}")
    if batch.draft_logits is not None:
        event(f"Vd < V: {batch.draft_vocab_size < V}")
    event(f"R: {R}")
