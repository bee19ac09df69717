"""One frozen record of the sampler under test: everything the suite reads from it (SPEC section 10).

`record_of(sampler)` builds it and is the only code of the suite that reads a sampler's
attributes (PyTorch's OpInfo is the model: one record per op, checked when it is built,
capabilities as typed fields). An isolated sampler's child builds the record where the
sampler lives and sends exactly `SamplerRecord.to_dict()`; the parent rebuilds it with
`from_dict`, so a sampler run in process and the same sampler run in a child are seen alike.

Declarations (defaults in brackets): `name` [the class name], `streams` ["own"; a stream
family: a registered name, `"spec"` (read as `"triton-philox"`), a `module:attribute` path of a
`StreamFamily` record, or the record itself (SPEC 3d)], `resample` ["gumbel"; or "inverse_cdf":
how a sampler of the `explicit` family resamples (SPEC 4 and 10), meaningless for another],
`block_seed` ["plain"; or "step": the block steps' acceptance seed `seed ^ (i << 32)`, SPEC 3b, for a
family whose record offers it],
`supports_chunking` [False], `supports_logprobs` [True], `draft_modes` [{"model", "one_hot"}],
`logits_dtypes` [all three], `min_spec_steps` [0], `verification_methods` [{"token"}],
`sampling_params` [{}], `interpreted` [False], `memory_stats` [False], `unvalidated()`
[absent], `block_v` [None: the sampler's vocabulary block, when it has one], `tree_drafts` [{"one_hot"}; add
"iid", "without_replacement": the tree kinds a tree-verifying sampler takes, SPEC 4c], `tree_uniforms`
["per_child"; or "per_node": one coin per parent node, one-hot trees only], `deviations` [{}:
SPEC 11's declared deviations, names of shipped ones or `Deviation` records or their paths; a
front end adds those named on its command line with `replace`], `detected` [{}: facts an adapter
read from the library it wraps, e.g. `{"draft_logits": "raw"}`, shown in the summary], `logit_bound`
[None: every finite float32; else the largest `|z|` of a finite processed logit the sampler claims the
contract for, a positive finite number: the strategies draw within it, a fixed campaign's batch is
clamped to it, `rs_verify.contract.logit_bound`]. The record also
says when the suite itself runs the sampler's Triton code through the interpreter: such a
sampler is treated as interpreted (too slow for the distribution campaigns) without saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..contract.batch import (DRAFT_MODES, EXERCISED, LOGITS_DTYPES, SAMPLING_PARAMS, TREE_DRAFT_KINDS, TREE_UNIFORMS,
                              VERIFICATION_METHODS, SpecBatch)
from ..contract import methods
from ..contract import deviations as known_deviations
from ..contract import logit_bound as logit_bounds
from ..contract import streams as stream_families
from ..contract.explicit import GUMBEL, RESAMPLE
from ..contract.triton_philox import TRITON_PHILOX
from . import device
from .triton_code import runs_triton

EXERCISED_NAMES = {**{m.name: m.titled for m in methods.OFFERED}, "min_p": "min-p (SPEC section 2)",
                   "top_k": "top-k (SPEC section 2)", "top_p": "top-p (SPEC section 2)"}
#: `sent` tallies count the decisions each declared deviation decided under this prefix and its name.
DEVIATION_KEY = "deviation:"
DECLARED_INTERPRETED = "declared"
SUITE_INTERPRETED = "the suite runs its Triton kernels through the interpreter (no usable CUDA device)"


class DeclarationError(ValueError):
    """A sampler's declaration is not one the SPEC allows (the message says which)."""


@dataclass(frozen=True)
class SamplerRecord:
    """What the suite knows of one sampler (see the module docstring); checked when built."""

    name: str
    loaded_as: str | None = None  # how to load it again (`module:attribute` or a built-in name)
    # "own", a registered family's name, or a StreamFamily record the suite does not ship (SPEC 3d)
    streams: str | stream_families.StreamFamily = stream_families.OWN
    resample: str = GUMBEL  # "gumbel" or "inverse_cdf" (a family keyed by the batch only, SPEC 4)
    block_seed: str = stream_families.PLAIN  # "plain" or "step" (SPEC 3b and 10)
    supports_chunking: bool = False
    supports_logprobs: bool = True
    draft_modes: frozenset = frozenset(DRAFT_MODES)
    logits_dtypes: frozenset = frozenset(LOGITS_DTYPES)
    min_spec_steps: int = 0
    verification_methods: frozenset = frozenset({methods.BASELINE.name})
    sampling_params: frozenset = frozenset()
    interpreted: bool = False  # too slow for the distribution campaigns
    interpreted_why: str = ""  # DECLARED_INTERPRETED, SUITE_INTERPRETED or ""
    memory_stats: bool = False
    has_unvalidated: bool = False
    block_v: int | None = None
    deviations: frozenset = frozenset()  # SPEC 11: names of shipped deviations, or Deviation records
    detected: tuple = ()  # (fact, value) pairs an adapter read from the library it wraps
    logit_bound: float | None = None  # SPEC 10: the largest |z| of a finite processed logit claimed (None: all)
    tree_drafts: frozenset = frozenset({"one_hot"})  # SPEC 4c and 10: the tree kinds taken
    tree_uniforms: str = "per_child"  # SPEC 4c: "per_child" or "per_node" (one coin per parent node)

    def __post_init__(self):
        who = f"sampler {self.name}"
        for name, allowed, empty_ok in (("draft_modes", DRAFT_MODES, False), ("logits_dtypes", LOGITS_DTYPES, False),
                                        ("verification_methods", VERIFICATION_METHODS, False),
                                        ("sampling_params", SAMPLING_PARAMS, True),
                                        ("tree_drafts", TREE_DRAFT_KINDS, False)):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
                raise DeclarationError(f"{who}: {name} must be a set of {list(allowed)}, not {value!r}")
            value = frozenset(value)
            if (not value and not empty_ok) or not value <= set(allowed):
                what = "a subset" if empty_ok else "a non-empty subset"
                raise DeclarationError(f"{who}: {name} {sorted(value)} must be {what} of {list(allowed)}")
            object.__setattr__(self, name, value)
        base = methods.BASELINE
        if base.name not in self.verification_methods:
            raise DeclarationError(f"{who}: verification_methods {sorted(self.verification_methods)} must include "
                                   f"{base.name!r} (SPEC section {base.section}: "
                                   f"{', '.join(m.label for m in methods.OFFERED)} is offered besides it)")
        object.__setattr__(self, "streams", _stream_declaration(who, self.streams))
        if self.resample not in RESAMPLE:
            raise DeclarationError(f"{who}: resample must be one of {list(RESAMPLE)}, not {self.resample!r}")
        fam = self.family
        if self.resample != GUMBEL and (fam is None or fam.keyed_by != "batch"):
            raise DeclarationError(f"{who}: resample {self.resample!r} needs the explicit stream family (SPEC 3c: the "
                                   f"batch's resample_uniforms), not streams {self.streams!r}")
        if self.block_seed not in (fam.block_seeds if fam is not None else (stream_families.PLAIN,)):
            offered = list(fam.block_seeds) if fam is not None else [stream_families.PLAIN]
            raise DeclarationError(f"{who}: block_seed {self.block_seed!r}: the stream family {self.streams!r} draws "
                                   f"the block seeds {offered} (SPEC 3b and 10)")
        self._check_tree(who)
        k = self.min_spec_steps
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DeclarationError(f"{who}: min_spec_steps must be an int >= 0, not {k!r}")
        object.__setattr__(self, "deviations", _deviation_declaration(who, self.deviations))
        try:
            object.__setattr__(self, "logit_bound", logit_bounds.checked(self.logit_bound))
        except ValueError as exc:
            raise DeclarationError(f"{who}: {exc} (SPEC section 10)") from None
        b = self.block_v
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            object.__setattr__(self, "block_v", None)  # not a vocabulary block the strategies can use

    def _check_tree(self, who: str) -> None:
        """SPEC 4c and 10: tree batches use the explicit family; one coin per node is for one-hot trees."""
        if self.tree_uniforms not in TREE_UNIFORMS:
            raise DeclarationError(f"{who}: tree_uniforms must be one of {list(TREE_UNIFORMS)}, not {self.tree_uniforms!r}")
        if self.tree_uniforms != TREE_UNIFORMS[0] and self.tree_drafts != {"one_hot"}:
            raise DeclarationError(f"{who}: tree_uniforms {self.tree_uniforms!r} is for one-hot trees only (SPEC 4c), "
                                   f"not tree_drafts {sorted(self.tree_drafts)}")
        fam = self.family
        if methods.TREE.name in self.verification_methods and (fam is None or fam.keyed_by != "batch"):
            raise DeclarationError(f"{who}: tree verification uses the explicit stream family (SPEC 4c: the batch's "
                                   f"noise), not streams {self.streams!r}")

    # -- what the suite draws and reports ---------------------------------------------

    @property
    def applied(self) -> known_deviations.Applied:
        """The declared deviations as the reference and the output rules apply them (SPEC 11)."""
        return known_deviations.applied(self.deviations)

    @property
    def family(self) -> stream_families.StreamFamily | None:
        """The declared stream family's record, None for `own` (SPEC section 10)."""
        s = self.streams
        return None if s == stream_families.OWN else stream_families.family(s)

    def strategy_kwargs(self) -> dict:
        """Keyword arguments that restrict the batch strategies to what the sampler declares: the one
        narrowing of declarations, read by the strategies (drawn batches) and by `fit` (fixed ones)."""
        kw = {
            "verifications": methods.declared(self.verification_methods),
            "sampling_params": tuple(p for p in SAMPLING_PARAMS if p in self.sampling_params),
        }
        if not self.supports_logprobs:
            kw["logprobs"] = (None,)
        if self.draft_modes != frozenset(DRAFT_MODES):
            kw["draft_modes"] = tuple(m for m in DRAFT_MODES if m in self.draft_modes)
        if self.logits_dtypes != frozenset(LOGITS_DTYPES):
            kw["logits_dtypes"] = tuple(d for d in LOGITS_DTYPES if d in self.logits_dtypes)
        if self.min_spec_steps:
            kw["min_spec_steps"] = self.min_spec_steps
        fam = self.family
        if fam is not None and fam is not TRITON_PHILOX:  # triton-philox: the strategies' default family
            # The tilts aim at the family's uniforms, the labels read its noise, its edges are planted
            # (explicit, SPEC 3c: written into the drawn batch; the call fills what a batch lacks).
            kw["streams"] = fam.name if stream_families.registered(fam) else fam
        if self.block_seed != stream_families.PLAIN:  # the block tilts aim at the step-keyed uniforms (SPEC 3b)
            kw["block_seed"] = self.block_seed
        if self.logit_bound is not None:  # finite processed logits within it, -inf still drawn (SPEC 10)
            kw["logit_bound"] = self.logit_bound
        if methods.TREE.name in self.verification_methods:  # SPEC 4c: the tree kinds and coin layout it takes
            kw["tree_drafts"] = tuple(k for k in TREE_DRAFT_KINDS if k in self.tree_drafts)
            kw["tree_uniforms"] = self.tree_uniforms
        return kw

    def fit(self, batch: SpecBatch) -> SpecBatch:
        """A fixed campaign's batch narrowed as `strategy_kwargs` narrows drawn ones (SPEC section 10):
        without logprobs when the sampler computes none, with one-hot drafts (the same draft ids)
        when it takes no model drafts, verified by the baseline method (token by token) when it does
        not declare the batch's, without the sampling parameters it does not declare (one-hot drafts
        widen V' to V: carried Gumbel noise narrower than that is dropped, to be drawn again), with
        each finite processed logit beyond a declared `logit_bound` moved to it. The batch itself
        when nothing is to change; its dtype and step counts are kept."""
        kw = self.strategy_kwargs()
        changes = {}
        if batch.num_logprobs is not None and kw.get("logprobs") == (None,):
            changes["num_logprobs"] = None
        if batch.draft_logits is not None and "model" not in kw.get("draft_modes", DRAFT_MODES):
            changes["draft_logits"] = None
            if batch.resample_gumbel is not None and batch.target_logits.shape[1] != batch.effective_vocab_size:
                # V' grows to V with one-hot drafts: the carried noise is too narrow, so it is
                # dropped and drawn afresh for the wider vocabulary (SPEC 3c's fill)
                changes["resample_gumbel"] = None
        verification = methods.narrow(batch.verification, kw["verifications"])
        if verification != batch.verification:
            changes["verification"] = verification
        changes.update({p: None for p in SAMPLING_PARAMS
                        if getattr(batch, p) is not None and p not in kw["sampling_params"]})
        batch = batch.replace(**changes) if changes else batch
        return logit_bounds.clamped(batch, self.logit_bound)

    def not_exercised(self) -> list[str]:
        """What the suite does not check because the sampler declared it away (or runs interpreted)."""
        out = []
        if not self.supports_logprobs:
            out.append("logprobs (supports_logprobs = False): no logprobs field was requested or compared")
        for mode in DRAFT_MODES:
            if mode not in self.draft_modes:
                out.append(f"{mode.replace('_', '-')} drafts (draft_modes = {sorted(self.draft_modes)})")
        for dtype in LOGITS_DTYPES:
            if dtype not in self.logits_dtypes:
                out.append(f"{dtype} logits (logits_dtypes = {sorted(self.logits_dtypes)})")
        if self.min_spec_steps:
            out.append(f"requests with fewer than {self.min_spec_steps} drafts, K = 0 included "
                       f"(min_spec_steps = {self.min_spec_steps})")
        for m in methods.OFFERED:
            if m.name not in self.verification_methods:
                out.append(f"{m.label}, SPEC section {m.section} (verification_methods = "
                           f"{sorted(self.verification_methods)})")
        missing = [p for p in SAMPLING_PARAMS if p not in self.sampling_params]
        if missing:
            out.append(f"sampling parameters {', '.join(missing)}, SPEC section 2 (sampling_params = "
                       f"{sorted(self.sampling_params)})")
        if self.logit_bound is not None:
            out.append(f"finite processed logits with |z| > {self.logit_bound:.4g} (logit_bound, SPEC section 10; "
                       "masked -inf logits are still drawn)")
        if self.interpreted_why == SUITE_INTERPRETED:
            out.append(f"the distribution campaigns: {SUITE_INTERPRETED}")
        return out

    def declared(self) -> list[str]:
        """One `key: value` line per declaration a release's table shows (the plugin's summary section
        "rs-verify: sampler"), then each fact the adapter detected."""
        blocks = methods.BLOCK.name in self.verification_methods
        values = {"streams": getattr(self.streams, "name", self.streams),
                  "block_seed": self.block_seed if blocks else "-",
                  "resample": self.resample, "verification": ",".join(sorted(self.verification_methods)),
                  "draft_modes": ",".join(sorted(self.draft_modes)),
                  "deviations": ",".join(sorted(getattr(d, "name", d) for d in self.deviations)) or "none",
                  "logit_bound": getattr(self, "logit_bound", None) or "none",
                  "interpreted": "yes" if self.interpreted else "no"}
        return [f"{k}: {v}" for k, v in values.items()] + [f"{k}: {v}" for k, v in self.detected]

    def exercised(self, sent: list[dict]) -> list[str]:
        """One line for each of `EXERCISED` that the sampler declares: how many of the batches it
        answered carried it, over the properties whose `sent` tallies are given (one dict per
        property, `SamplerUnderTest.sent`), or that none did (its properties were skipped or
        deselected, or failed before sending one)."""
        declared = {**{m.name: m.name in self.verification_methods for m in methods.OFFERED},
                    **{p: p in self.sampling_params for p in SAMPLING_PARAMS}}
        out = []
        for what in EXERCISED:
            if not declared[what]:
                continue
            calls = sum(int(t.get(what, 0)) for t in sent)
            props = sum(1 for t in sent if t.get(what))
            if calls:
                out.append(f"{EXERCISED_NAMES[what]}: {calls} batches, in {props} "
                           f"propert{'y' if props == 1 else 'ies'}")
            else:
                out.append(f"{EXERCISED_NAMES[what]}: declared, but no batch with it was answered in this run")
        for dev in self.applied:
            decided = sum(int(t.get(DEVIATION_KEY + dev.name, 0)) for t in sent)
            props = sum(1 for t in sent if t.get(DEVIATION_KEY + dev.name))
            out.append(f"deviation {dev.name} (SPEC section 11, replaces section {dev.section}): "
                       + (f"{decided} decisions decided by its rule, in {props} propert{'y' if props == 1 else 'ies'}"
                          if decided else "declared, but never reached in this run"))
        return out

    # -- crossing a process boundary ----------------------------------------------------

    def to_dict(self) -> dict:
        """Plain values only (sets as sorted lists): what an isolated sampler's child sends."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for f in fields(self):
            if isinstance(out[f.name], frozenset) and f.name != "deviations":
                out[f.name] = sorted(out[f.name])
        if isinstance(self.streams, stream_families.StreamFamily):  # travels by its module:attribute path
            path = stream_families.family_path(self.streams)
            if path is None:
                raise DeclarationError(
                    f"sampler {self.name}: its stream family {self.streams.name!r} is not registered and no module "
                    "attribute holds it, so it cannot cross a process boundary: define it at module level (or "
                    "register it with rs_verify.contract.streams.register)")
            out["streams"] = path
        out["deviations"] = sorted(_deviation_path(self.name, d) for d in self.deviations)
        return out

    @classmethod
    def from_dict(cls, values: dict) -> "SamplerRecord":
        names = {f.name for f in fields(cls)}
        values = {**values, "detected": tuple(tuple(kv) for kv in values.get("detected", ()))}
        return cls(**{k: (frozenset(v) if isinstance(v, list) and k != "detected" else v)
                      for k, v in values.items() if k in names})

    def replace(self, **changes) -> "SamplerRecord":
        return type(self)(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})


def _deviation_declaration(who: str, declared) -> frozenset:
    """A frozenset of shipped deviations' names and unregistered `Deviation` records (SPEC 11)."""
    if isinstance(declared, (str, known_deviations.Deviation)) or not isinstance(declared, (set, frozenset, list, tuple)):
        raise DeclarationError(f"{who}: deviations must be a set of deviation names or Deviation records "
                               f"(SPEC section 11), not {declared!r}")
    try:
        records = known_deviations.applied(list(declared)).records
    except (KeyError, ImportError, AttributeError, ValueError) as exc:
        raise DeclarationError(f"{who}: deviations {sorted(map(str, declared))}: {exc}") from exc
    return frozenset(d.name if known_deviations.registered(d) else d for d in records)


def _deviation_path(who: str, declared) -> str:
    if isinstance(declared, str):
        return declared
    path = known_deviations.deviation_path(declared)
    if path is None:
        raise DeclarationError(f"sampler {who}: its deviation {declared.name!r} is not registered and no module "
                               "attribute holds it, so it cannot cross a process boundary: define it at module level")
    return path


def _stream_declaration(who: str, declared):
    """`own`, a registered family's canonical name, or an unregistered `StreamFamily` record."""
    if declared == stream_families.OWN:
        return declared
    if not isinstance(declared, (str, stream_families.StreamFamily)):
        raise DeclarationError(f"{who}: streams must be a stream family's name, a StreamFamily record or "
                               f"{stream_families.OWN!r}, not {declared!r}")
    try:
        fam = stream_families.family(declared)
    except (KeyError, ImportError, AttributeError) as exc:
        raise DeclarationError(f"{who}: streams {declared!r}: {exc}") from exc
    return fam.name if stream_families.registered(fam) else fam


# -- the one reader of a sampler's attributes ------------------------------------------

_UNSET = object()


def _declared(sampler, name: str, default):
    value = getattr(sampler, name, _UNSET)
    return default if value is _UNSET or value is None and default is not None else value


def record_of(sampler) -> SamplerRecord:
    """The record of `sampler` (an object implementing SPEC section 10), or the record it already
    carries (an isolated sampler, a `SamplerUnderTest`); `DeclarationError` for declarations the
    SPEC forbids."""
    own = getattr(sampler, "record", None)
    if isinstance(own, SamplerRecord):
        return own
    name = str(_declared(sampler, "name", type(sampler).__name__))
    declared_interpreted = bool(_declared(sampler, "interpreted", False))
    suite_interpreted = not declared_interpreted and device.interpreted() and runs_triton(sampler)
    why = DECLARED_INTERPRETED if declared_interpreted else SUITE_INTERPRETED if suite_interpreted else ""
    block_v = _declared(sampler, "block_v", None)
    loaded_as = getattr(sampler, "loaded_as", None)
    return SamplerRecord(
        name=name,
        loaded_as=loaded_as if isinstance(loaded_as, str) else None,
        streams=_declared(sampler, "streams", "own"),
        resample=_declared(sampler, "resample", GUMBEL),
        block_seed=_declared(sampler, "block_seed", stream_families.PLAIN),
        supports_chunking=bool(_declared(sampler, "supports_chunking", False)),
        supports_logprobs=bool(_declared(sampler, "supports_logprobs", True)),
        draft_modes=_declared(sampler, "draft_modes", frozenset(DRAFT_MODES)),
        logits_dtypes=_declared(sampler, "logits_dtypes", frozenset(LOGITS_DTYPES)),
        min_spec_steps=_declared(sampler, "min_spec_steps", 0),
        verification_methods=_declared(sampler, "verification_methods", frozenset({methods.BASELINE.name})),
        sampling_params=_declared(sampler, "sampling_params", frozenset()),
        interpreted=declared_interpreted or suite_interpreted,
        interpreted_why=why,
        memory_stats=bool(_declared(sampler, "memory_stats", False)),
        has_unvalidated=callable(getattr(sampler, "unvalidated", None)),
        block_v=block_v if isinstance(block_v, int) and not isinstance(block_v, bool) else None,
        deviations=_declared(sampler, "deviations", frozenset()),
        detected=_detected(name, _declared(sampler, "detected", {})),
        logit_bound=_declared(sampler, "logit_bound", None),
        tree_drafts=_declared(sampler, "tree_drafts", frozenset({"one_hot"})),
        tree_uniforms=_declared(sampler, "tree_uniforms", "per_child"),
    )


def _detected(who: str, declared) -> tuple:
    if not isinstance(declared, dict):
        raise DeclarationError(f"{who}: detected must be a dict of facts (str -> str), not {declared!r}")
    return tuple((str(k), str(v)) for k, v in declared.items())
