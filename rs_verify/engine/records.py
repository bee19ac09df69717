"""What running a property hands back: an `Outcome`, and for a failure a `Failure` record.

Failure state travels in these records, never on exception attributes: the runner builds
them, `bundle` encodes and decodes them, the front ends (CLI, plugin, reports) and the
mutation campaign read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract.batch import SpecBatch

# Failure kinds: the property does not hold; an exception escaped the sampler or the suite;
# the sampler's process died (a signal); a call did not return within the time limit; a property
# listed as an expected failure passed (rs_verify.frontends.xfails).
PROPERTY, ERROR, CRASH, TIMEOUT, XPASS = "property", "error", "crash", "timeout", "xpass"


@dataclass
class Failure:
    """One failing input of one property."""

    property: str
    sampler: str
    kind: str
    message: str  # "<ExceptionType>: <text>"
    batch: SpecBatch | None = None  # the (shrunk) failing batch, when the property names one
    drawn: Any = None  # everything the strategy drew (the batch, a cap, a transform, ...)
    notes: list[str] = field(default_factory=list)  # input summary, reproducer, bundle path
    found_at: int | None = None  # 1-based index of the first failing example
    replayable: bool = True  # False when the input is unknown (raised outside the property's check)
    bundles: list[str] = field(default_factory=list)
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def failing_batch(self) -> SpecBatch | None:
        """The failing batch: the one the property named, else the first batch in the draw."""
        if self.batch is not None:
            return self.batch
        for cand in (self.drawn, self.drawn[0] if isinstance(self.drawn, tuple) and self.drawn else None):
            if isinstance(cand, SpecBatch):
                return cand
        return None

    def headline(self, limit: int = 400) -> str:
        """The message on one line (at most three of its lines joined), cut at `limit` characters."""
        lines = [ln for ln in self.message.splitlines() if ln.strip()]
        out = " | ".join(lines[:3])
        return out if len(out) <= limit else out[: limit - 3] + "..."

    def text(self) -> str:
        """The message and its notes, as a person reads them (CLI, plugin)."""
        return "\n".join([self.message, *self.notes]).rstrip()


@dataclass
class Outcome:
    """The result of running one property against one sampler."""

    name: str
    status: str  # "passed", "failed", "skipped", or "xfail" (an expected failure: rs_verify.frontends.xfails)
    seconds: float = 0.0
    examples: int = 0
    excused: int = 0
    reason: str = ""  # why it was skipped (or, for "xfail", why it is expected to fail)
    failure: Failure | None = None
    stats: dict = field(default_factory=dict, repr=False)  # ctx.stats after the run (e.g. "fits")
    self_check: bool = False  # the property checks the suite itself, not the sampler

    @property
    def message(self) -> str:
        return self.failure.message if self.failure is not None else self.reason

    @property
    def bundles(self) -> list[str]:
        return self.failure.bundles if self.failure is not None else []
