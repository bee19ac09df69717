"""`Context`: what a property runs against, and the capabilities it offers (`capabilities`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import methods
from ..contract.explicit import GUMBEL
from ..contract.streams import PLAIN
from .handle import SamplerUnderTest, as_sampler
from .record import SamplerRecord, record_of


@dataclass
class Context:
    """What a property runs against.

    - `sampler`: the `SamplerUnderTest` (a bare sampler given here is wrapped).
    - `reference`: the oracle of certification, or None.
    - `profile`, `batch_kwargs`: the Hypothesis profile and the strategies' knobs, narrowed to
      what the sampler declares.
    - `device`: "cuda" or "cpu" (Triton's interpreter).
    - `stats`: counters a property may add to (excused divergences, fits, ...).
    - `baseline`: an opened `rs_verify.engine.baseline.Baseline` (the regression gate), or None.
    """

    sampler: Any
    reference: Any = None
    profile: str = "dev"
    batch_kwargs: dict = field(default_factory=dict)
    device: str = "cpu"
    stats: dict = field(default_factory=dict)
    baseline: Any = None

    def __post_init__(self):
        if self.sampler is not None and not isinstance(self.sampler, SamplerUnderTest):
            self.sampler = as_sampler(self.sampler)

    @property
    def record(self) -> SamplerRecord | None:
        return None if self.sampler is None else self.sampler.record

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    @property
    def oracle(self):
        """The reference drawing the sampler's declared stream family (SPEC sections 3 and 8), or None:
        no reference, a sampler with its own streams, or a reference that cannot draw that family."""
        return certifying_reference(self.reference, self.record)


def certifying_reference(reference, record: SamplerRecord | None):
    """`reference` bound to `record`'s stream family (and, for an explicit sampler, its `resample`,
    SPEC 4; a step-mixed block seed, SPEC 3b) and applying its declared deviations (SPEC 11): its
    `with_streams(family[, resample][, block_seed][, deviations])` when it offers one, else itself when
    it declares the same, else None."""
    if reference is None or record is None or record.family is None:
        return None
    kw = {} if record.resample == GUMBEL else {"resample": record.resample}
    if record.block_seed != PLAIN:
        kw["block_seed"] = record.block_seed
    if record.deviations:
        kw["deviations"] = record.applied
    if record.tree_uniforms != "per_child":  # SPEC 4c: one coin per parent node
        kw["tree_uniforms"] = record.tree_uniforms
    bind = getattr(reference, "with_streams", None)
    if callable(bind):
        return bind(record.family, **kw)
    own = record_of(reference)
    same = (own.family is record.family and (own.resample, own.block_seed) == (record.resample, record.block_seed)
            and own.applied == record.applied and own.tree_uniforms == record.tree_uniforms)
    return reference if same else None


def capabilities(ctx: Context) -> set[str]:
    """What the context offers a property (keys of `rs_verify.properties.registry.NEEDS`)."""
    caps = {"triton"}
    rec = ctx.record
    if ctx.reference is not None:
        caps.add("reference")
    if ctx.device == "cuda":
        caps.update(("cuda", "timing"))
    if ctx.baseline is not None:
        caps.add("baseline")
    if rec is None:
        return caps
    if rec.supports_chunking:
        caps.add("chunking")
    if ctx.oracle is not None:
        caps.add("certifiable_streams")
        if rec.family.keyed_by == "seed_pos":
            caps.add("seeded_streams")
    if rec.memory_stats:
        caps.add("memory_stats")
    if rec.has_unvalidated:
        caps.add("unvalidated")
    if not rec.interpreted:
        caps.add("fast")
    caps.update(f"{mode}_drafts" for mode in rec.draft_modes)
    caps.update(c for m in rec.verification_methods for c in methods.lookup(m).needs)
    caps.update(rec.sampling_params)
    return caps
