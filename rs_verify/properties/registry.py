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

__all__ = ["NEEDS", "PROPERTIES", "Context", "Property", "PropertyFailure", "by_cost", "register"]

# What a property needs of its context; the runner skips it, with this reason, otherwise.
NEEDS = {
    "chunking": "the sampler does not support internal chunking (supports_chunking is False)",
    "certifiable_streams": "the sampler declares no stream family the reference draws (streams = 'own', or a family "
                           "the given reference cannot reproduce; SPEC sections 3 and 10): certification needs the "
                           "sampler's random numbers",
    "seeded_streams": "the sampler's stream family is keyed by the batch (explicit noise, SPEC 3c): there are no "
                      "seeds and positions whose draws are edges; the batch itself carries its edge values",
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
    cost: float = 0  # rank in the cheapest-first order (mutation campaign, CLI): `by_cost`
    slow: bool = False  # a long campaign: marked `slow` by the plugin
    self_check: bool = False  # checks the suite itself, never calls the sampler
    why_kept: str = ""


PROPERTIES: dict[str, Property] = {}

def register(name: str, family: str, *, cost: float, why_kept: str, strategy=None, needs=(),
             examples_scale: float = 1.0, slow: bool = False, self_check: bool = False):
    """Decorator: register `check(ctx, drawn)` as property `name`, with everything of its record.

    - `cost`: its rank in the cheapest-first order (`by_cost`; equal ranks keep registry order), as
      measured per example on the Triton sampler under the interpreter (ci profile); the ranks
      step by 10, leaving room for a new property between two others;
    - `why_kept`: why the library keeps it even where it kills no planted bug on its own (the kill
      matrix's "mutants only it kills" column is empty for it);
    - `strategy`: what Hypothesis draws for it (None: a fixed, seeded campaign run once);
    - `needs`: keys of `NEEDS`, what it needs of the sampler (the runner skips it otherwise);
    - `examples_scale`: its example count relative to the profile's (strategies only);
    - `slow`: a long campaign (marked `slow` by the plugin);
    - `self_check`: it checks the suite itself and never calls the sampler.

    The arguments are checked here, when the family module registers the property.
    """
    where = f"register({name!r})"
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{where}: a property's name is an identifier (it names a pytest item and a CLI choice)")
    if name in PROPERTIES:
        raise ValueError(f"{where}: property {name!r} registered twice (first in family {PROPERTIES[name].family!r})")
    if not isinstance(family, str) or not family:
        raise ValueError(f"{where}: family must be a non-empty string, not {family!r}")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost != cost:
        raise TypeError(f"{where}: cost must be a number (its place in the cheapest-first order), not {cost!r}")
    if not isinstance(why_kept, str) or not why_kept.strip():
        raise ValueError(f"{where}: say why the property is kept (why_kept=...): the kill matrix prints it")
    if strategy is not None and not callable(strategy):
        raise TypeError(f"{where}: strategy must be a function of the context (or None), not {strategy!r}")
    if isinstance(needs, str):
        raise TypeError(f"{where}: needs is a tuple of keys of NEEDS, not the string {needs!r}")
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"{where}: unknown needs {unknown} (known: {', '.join(NEEDS)})")
    if isinstance(examples_scale, bool) or not isinstance(examples_scale, (int, float)) or not examples_scale > 0:
        raise ValueError(f"{where}: examples_scale must be a positive number, not {examples_scale!r}")
    if strategy is None and examples_scale != 1.0:
        raise ValueError(f"{where}: examples_scale applies to drawn examples; a fixed campaign (no strategy) runs once")
    for flag, value in (("slow", slow), ("self_check", self_check)):
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {flag} must be True or False, not {value!r}")
    if self_check and needs and set(needs) - {"triton"}:
        raise ValueError(f"{where}: a self-check never calls the sampler, so it needs nothing of it "
                         f"(needs {sorted(set(needs) - {'triton'})})")

    def wrap(check):
        if not callable(check):
            raise TypeError(f"{where}: decorates the property's check(ctx, drawn), not {check!r}")
        if name in PROPERTIES:
            raise ValueError(f"{where}: property {name!r} registered twice")
        PROPERTIES[name] = Property(
            name=name,
            family=family,
            doc=(check.__doc__ or "").strip().split("\n")[0],
            check=check,
            strategy=strategy,
            needs=frozenset(needs),
            examples_scale=examples_scale,
            cost=cost,
            slow=slow,
            self_check=self_check,
            why_kept=why_kept,
        )
        return check

    return wrap


def by_cost(names=None) -> list[str]:
    """Property names (default: all), cheapest first; ties in registry order."""
    names = list(PROPERTIES) if names is None else list(names)
    order = list(PROPERTIES)
    return sorted(names, key=lambda n: (PROPERTIES[n].cost, order.index(n)))
