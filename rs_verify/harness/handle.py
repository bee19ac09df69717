"""`SamplerUnderTest`: the sampler a property runs against, with its record and its calls.

A property never holds a bare sampler: the context gives it a `SamplerUnderTest`, which
pairs the object (a sampler in this process, or an isolated sampler whose child runs it)
with its `SamplerRecord` and counts the calls made through it, and how many of the batches
sent had block verification or each sampling parameter on (`sent`, `SpecBatch.exercises`).
The runner reads the count to refuse a pass by a property that never called the sampler, and
the front ends the tally to say what a run exercised; calls of other samplers (the reference,
a baseline) are not counted.
"""

from __future__ import annotations

from collections import Counter

from ..contract.batch import EXERCISED, SpecBatch
from .record import DEVIATION_KEY, SamplerRecord, record_of


class RemoteSampler:
    """Base of samplers whose calls run elsewhere (`rs_verify.engine.isolation.ChildSampler`):
    `observed_call(batch, kwargs, reseed=...)` runs the checked call there and returns
    `(output, CallReport)`; `record` is the record the sampler's process built."""

    record: SamplerRecord

    def observed_call(self, batch, kwargs: dict, *, reseed: int | None = None):  # pragma: no cover - interface
        raise NotImplementedError


class SamplerUnderTest:
    """`obj` with its record (built by `record_of` unless given), a count of calls (`calls`) and
    of the calls whose batch exercised each of `EXERCISED` (`sent`).

    It is called through `guards.observed_call` (properties: `assertions.call`), which counts the
    call. Variants made by `unvalidated()` share the count: a property that calls only the
    unvalidated copy still called the sampler.
    """

    def __init__(self, obj, record: SamplerRecord | None = None, *, _tally: Counter | None = None):
        if isinstance(obj, SamplerUnderTest):
            obj, record = obj.obj, record or obj.record
        self.obj = obj
        self.record = record if record is not None else record_of(obj)
        self._tally = _tally if _tally is not None else Counter()

    @property
    def calls(self) -> int:
        return self._tally["calls"]

    @property
    def sent(self) -> dict[str, int]:
        """Answered calls whose batch exercised each of `EXERCISED`, and decisions each declared
        deviation decided (`DEVIATION_KEY` + its name; SPEC 11), only those with at least one."""
        keys = [*EXERCISED, *(DEVIATION_KEY + d.name for d in self.record.applied)]
        return {k: self._tally[k] for k in keys if self._tally[k]}

    def count_deviations(self, decided: dict[str, int]) -> None:
        """Count the decisions each declared deviation decided (`{name: n}`, read from the traces of
        the reference that certified the sampler's answers)."""
        self._tally.update({DEVIATION_KEY + name: int(n) for name, n in decided.items() if n})

    @property
    def name(self) -> str:
        return self.record.name

    def count_call(self) -> None:
        self._tally["calls"] += 1

    def count_answered(self, batch: SpecBatch) -> None:
        """Count what `batch`, which the sampler answered, exercised."""
        try:  # a malformed batch (the bad-input properties send them) exercises nothing
            self._tally.update(batch.exercises())
        except Exception:  # noqa: BLE001
            pass

    def with_object(self, obj) -> "SamplerUnderTest":
        """The same record over another object (a fresh child of an isolated sampler), counting anew."""
        return SamplerUnderTest(obj, self.record)

    def unvalidated(self) -> "SamplerUnderTest":
        """The sampler's unvalidated variant (SPEC section 10), sharing this handle's call count."""
        if not self.record.has_unvalidated:
            raise AttributeError(f"sampler {self.name} offers no unvalidated()")
        return SamplerUnderTest(self.obj.unvalidated(), self.record, _tally=self._tally)

    def __repr__(self) -> str:
        return f"SamplerUnderTest({self.obj!r})"


def as_sampler(obj) -> SamplerUnderTest:
    """`obj` as a `SamplerUnderTest` (itself when it is one)."""
    return obj if isinstance(obj, SamplerUnderTest) else SamplerUnderTest(obj)


def parse_deviations(text: str | None) -> list[str]:
    """The deviations a command line names (`NAME,...`: shipped names or `module:attribute` paths)."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def with_deviations(sampler, names) -> SamplerUnderTest:
    """`sampler` declaring the deviations `names` too (SPEC 11: a user names them on the command line
    for a sampler they cannot edit); the sampler itself when `names` is empty. `DeclarationError`
    (a ValueError) for an unknown name or two deviations ruling one edge."""
    if not names:
        return sampler
    handle = as_sampler(sampler)
    return SamplerUnderTest(handle.obj, handle.record.replace(deviations=handle.record.deviations | set(names)))
