"""The property registry: one record per property, and the context a property runs against.

A property is written once, in a family module of this package, and run by the project's
tests, the `rs-verify` CLI and the pytest plugin alike (through `rs_verify.engine.runner`).
Its record holds everything the engine and the front ends need to know about it: what it
needs of the sampler (`needs`, keys of `NEEDS`), where it stands in the cost order, whether it
is a slow campaign, how many examples it takes relative to the profile's count, whether it
exercises the sampler at all (a self-check of the suite does not), and why it is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contract import methods
from ..harness.context import Context
from ..harness.failure import PropertyFailure

__all__ = ["COST_ORDER", "NEEDS", "PROPERTIES", "Context", "Property", "PropertyFailure", "by_cost", "register"]

# What a property needs of its context; the runner skips it, with this reason, otherwise.
NEEDS = {
    "chunking": "the sampler does not support internal chunking (supports_chunking is False)",
    "spec_streams": "the sampler does not declare streams = 'spec' (SPEC section 10): certification against the reference needs the SPEC random streams",
    "reference": "no reference sampler was given",
    "cuda": "CUDA is not available",
    "triton": "needs the Triton interpreter or a CUDA device",
    "fast": "too slow for a distribution campaign (the sampler declares interpreted = True: run on CUDA)",
    "memory_stats": "the sampler reports no buffer instrumentation (memory_stats is False)",
    "unvalidated": "the sampler offers no unvalidated() variant",
    "baseline": "no baseline was given (--rs-baseline / --baseline; baseline= when replaying)",
    "model_drafts": "the sampler does not take model drafts (draft_modes, SPEC section 10)",
    "one_hot_drafts": "the sampler does not take one-hot drafts (draft_modes, SPEC section 10)",
    "timing": "not measured: timing a change against its baseline needs CUDA (interpreter times say nothing about the kernels)",
    **{m.capability: m.not_declared for m in methods.OFFERED},  # block_verification
    "min_p": "the sampler does not declare min_p (sampling_params, SPEC section 10)",
    "top_k": "the sampler does not declare top_k (sampling_params, SPEC section 10)",
    "top_p": "the sampler does not declare top_p (sampling_params, SPEC section 10)",
}


@dataclass(frozen=True)
class Property:
    """One registered property (see the module docstring for the fields' meaning)."""

    name: str
    family: str
    doc: str
    check: Callable[[Context, Any], None]
    strategy: Callable[[Context], Any] | None = None  # None: a fixed, seeded campaign run once
    needs: frozenset = frozenset()
    examples_scale: float = 1.0
    cost: int = 100  # rank in the cheapest-first order (mutation campaign, CLI); unlisted last
    slow: bool = False  # a long campaign: marked `slow` by the plugin
    self_check: bool = False  # checks the suite itself, never calls the sampler
    why_kept: str = ""


PROPERTIES: dict[str, Property] = {}

# Cheapest first, measured per example on the Triton sampler under the interpreter (ci profile).
COST_ORDER = (
    "planner", "rejects_bad_input", "unvalidated_in_bounds", "philox_streams", "stream_edges",
    "tiny_temperatures", "determinism", "greedy_chain", "buffer_within_cap", "blackbox_chunking",
    "batch_invariance", "chunked_equals_full", "determinism_large_batch", "matches_baseline", "certified_equivalence",
    "output_invariants", "closed_forms", "distribution_one_hot_drafts", "distribution_saturated_residuals",
    "distribution_model_drafts", "distribution_sampling_params", "distribution_sequences",
    "distribution_block_sequences", "block_closed_forms", "peak_memory_within_cap", "baseline_speed",
)

# Why each property stays in the library even where it kills no planted bug on its own
# (the kill matrix's "mutants only it kills" column is empty for it).
WHY_KEPT = {
    "planner": "Checks the chunk planner itself (rs_verify.contract.chunking), which no sampler mutant patches: it "
               "guards the contract that chunked samplers and the reference share (no split, cap, maximal, minimal).",
    "rejects_bad_input": "Validation is shared code outside the mutated packages; the property gates third-party "
                         "samplers that validate on their own (or not at all).",
    "unvalidated_in_bounds": "The only property that feeds invalid input to a sampler with validation off: the "
                             "NaN / no-finite-row failure mode is invisible to every other property.",
    "philox_streams": "Checks the suite's NumPy Philox against tl.rand / tl.randint (no sampler involved): the "
                      "certification and the edge campaigns are only as good as these streams.",
    "stream_edges": "Zero and tiny uniforms occur 2 and ~130 times in 2**32 draws: no generated batch reaches "
                    "them, so the TINY clamp and the accurate log(1 - v) are guarded here alone.",
    "tiny_temperatures": "The strategies draw T >= 0.05: temperatures in (0, 1e-5], where exact ties decide, "
                         "are only checked here.",
    "determinism": "Gates atomics, races, uninitialised memory and hidden global random state.",
    "determinism_large_batch": "Races between programs and uninitialised memory show on grids larger than the "
                               "strategies draw; the only property that repeats one large batch.",
    "greedy_chain": "Greedy requests are compared with the exact argmax chain, independent of the reference and "
                    "of any tolerance.",
    "buffer_within_cap": "The only property that sees memory: an over-sized processed-logits buffer changes no "
                         "output.",
    "blackbox_chunking": "Chunking from outside, for samplers without internal chunking; it also sees "
                         "batch-size-dependent numerics (sub-batches are smaller batches).",
    "batch_invariance": "Alone, split, permuted and merged: neither the streams nor the numerics may depend on "
                        "the batch row, the batch size or the other requests.",
    "chunked_equals_full": "Internal chunking against the full batch, bit for bit, at every cap.",
    "certified_equivalence": "Every decision against the float64 reference with its margin: the broadest net.",
    "output_invariants": "Reference-free structural checks (range, prefix, padding, residual support): they hold "
                         "for samplers with their own streams, where certification is skipped.",
    "closed_forms": "Acceptance rate min(1, p/q) and residual law per draft token: fast samplers only; with its "
                    "own RNG a sampler is checked only by the tests of fit.",
    "distribution_one_hot_drafts": "Test of fit for one-hot drafts, including a padded last draft: fast "
                                   "samplers only.",
    "distribution_saturated_residuals": "Test of fit where p and q are saturated on the same tokens (an empty "
                                        "residual falls back to p) and padded drafts carry model logits: the "
                                        "residual branches a sampler with its own RNG can only be checked on here.",
    "distribution_model_drafts": "Test of fit over drafts drawn with the salted drafter stream: the only "
                                 "property that sees a shared draft/resample stream in a sampler with its own RNG.",
    "distribution_sampling_params": "Test of fit against the masked p (top-k, top-p, min-p) with drafts from the "
                                    "unmasked q: the only check of the masks for a sampler with its own RNG.",
    "distribution_sequences": "The joint law of whole emissions (completed with draws from the later rows), token "
                              "by token: a bias that moves mass between positions keeps every marginal.",
    "distribution_block_sequences": "Block verification's correctness is a statement about sequences only (its "
                                    "per-position laws are not p): the one test of fit of blocks for own-RNG "
                                    "samplers.",
    "block_closed_forms": "Exact laws of tau and of the token at tau for fixed drafts (SPEC 4b's thresholds), and "
                          "the one-sided test that blocks accept at least as much as token-wise verification.",
    "peak_memory_within_cap": "CUDA only (peak device memory of a Qwen-size batch): skipped on CPU.",
    "matches_baseline": "The only comparison with the version a change replaces: a shifted token that stays within "
                        "the certification tolerance, or a changed reduction order, passes every other property.",
    "baseline_speed": "CUDA only: the only property that sees a slower kernel; skipped (not measured) on CPU.",
}

SLOW_FAMILIES = ("distribution",)
SELF_CHECKS = ("planner", "philox_streams")  # the suite's own planner and Philox, not the sampler


def register(name: str, family: str, *, strategy=None, needs=(), examples_scale: float = 1.0):
    """Decorator: register `check(ctx, drawn)` as property `name`."""

    def wrap(check):
        if name in PROPERTIES:
            raise ValueError(f"property {name!r} registered twice")
        PROPERTIES[name] = Property(
            name=name,
            family=family,
            doc=(check.__doc__ or "").strip().split("\n")[0],
            check=check,
            strategy=strategy,
            needs=frozenset(needs),
            examples_scale=examples_scale,
            cost=COST_ORDER.index(name) if name in COST_ORDER else len(COST_ORDER),
            slow=family in SLOW_FAMILIES,
            self_check=name in SELF_CHECKS,
            why_kept=WHY_KEPT.get(name, ""),
        )
        return check

    return wrap


def by_cost(names=None) -> list[str]:
    """Property names (default: all), cheapest first; ties in registry order."""
    names = list(PROPERTIES) if names is None else list(names)
    order = list(PROPERTIES)
    return sorted(names, key=lambda n: (PROPERTIES[n].cost, order.index(n)))
