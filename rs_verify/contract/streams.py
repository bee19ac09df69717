"""Stream families (SPEC section 3): one `StreamFamily` record per family, and their registry.

A family fixes a sampler's two kinds of random numbers: the acceptance uniform `u_j` of every
verified row and the resampling noise `G_x` of the one token per request that is sampled. Its
record (PyTorch's OpInfo is the model: one constructor call per family, checked when built)
holds everything the suite needs of it:

- `name`, `aliases` (`"spec"` is the former name of `"triton-philox"`) and `section` of SPEC.md;
- `acceptance(seeds, pos)`: float32 `[n]`, `u` of rows keyed by int64 seeds and positions,
  the floor already applied; `noise(seeds, pos, vocab, out=None)`: float64 `[n, vocab]`, `G_x`
  of those rows for tokens `0 .. vocab - 1` (written into `out` when given);
- `keyed_by`: `"seed_pos"` (the functions above) or `"batch"` (SPEC 3c's explicit noise): then
  `acceptance(batch, rows)` gives float64 `u` of global rows and `noise(batch, reqs, vocab,
  out=None)` float64 `G_x` of global requests, read from the batch's noise fields, and
  `fill(batch)` returns the batch with the fields it lacks drawn (deterministically); `at_rows`
  and `at_requests` read either kind for the reference;
- `floor`: the smallest acceptance uniform (`TINY`), and `edges`: the stream points random
  draws never reach that the strategies and the edge properties plant (`StreamEdges`, with the
  noise edges the strategies plant in drawn batches as `NoisePlant`s);
- `block_seeds`: the block seeds a sampler of the family may declare (SPEC 3b and 10): `"plain"`
  (step `i` of a block is keyed by the request's seed, as token-wise rows are) and, where the
  family's releases draw it, `"step"` (`seed ^ (i << 32)`); `block_uniforms` draws either;
- `triton`: what a Triton kernel needs to reproduce the family, the name of the helper the
  Triton sampler selects (`rs_verify.triton_sampler.streams`), or None;
- `triton_check`: how the NumPy bits are checked against Triton, a `module:function` path (or
  a callable) of a routine `(seeds int64, offsets_dtype, offsets) -> None` that raises
  `AssertionError` naming the first mismatch (the `philox_streams` property runs it); every
  shipped check reports through `report_mismatch`, so a mismatch reads the same in every family.

`family(name_or_record)` looks a family up (aliases resolved; a clear `KeyError` for an unknown
name); a sampler may also declare a record the suite does not ship (SPEC 3d): it is certified
like a shipped one. `register(record)` adds a family to the registry; the shipped families are
modules of this package, each holding one `register(StreamFamily(...))` call, imported by the
package's `__init__` (this module imports none of them). Adding a family is one contract module
(and its import there) plus, where the Triton sampler offers it, its kernel helper.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .batch import SpecBatch
from .records import Registry, module_path, resolve_path

__all__ = ["BLOCK_SEEDS", "FAMILIES", "KEYED_BY", "NoisePlant", "OWN", "PLAIN", "PLANT_KINDS", "STEP", "StreamEdges",
           "StreamFamily", "family", "family_path", "register", "registered", "resolve_path", "shipped", "step_seeds"]

OWN = "own"  # a sampler with its own generator: nothing to certify (SPEC section 10)
KEYED_BY = ("seed_pos", "batch")
PLAIN, STEP = "plain", "step"
BLOCK_SEEDS = (PLAIN, STEP)  # SPEC 3b and 10: how block step i keys its acceptance uniform
#: `G_x` above this means a noise uniform `v < 2**-25`, where `1 - v` rounds to 1 in float32.
TINY_NOISE_G = 25 * math.log(2.0) + 0.01
#: The smallest finite noise a floor of `2**-24` on `1 - u` allows: `-log(24 log 2)`.
TOP_NOISE_G = -math.log(24 * math.log(2.0))


def step_seeds(seeds, steps) -> np.ndarray:
    """SPEC 3b's step-mixed block seed `seed ^ (i << 32)` (vLLM's `spec_step_seed`), int64, broadcast."""
    s = np.asarray(seeds, np.int64).view(np.uint64)
    i = np.asarray(steps, np.int64).astype(np.uint64)
    return (s ^ (i << np.uint64(32))).view(np.int64)


#: What a planted noise edge does to a sampler that mishandles it, and so how it is planted:
#: "wins": the SPEC's noise there is finite where a missing floor makes it -inf (the token is set
#: to win by 1-4 nats); "loses": finite where a missing clamp makes it +inf (the token is set to
#: lose by 1-4 nats); "near": a value a less precise noise misses (the token is set 0.2-1 nats
#: from the best other score, on either side).
PLANT_KINDS = ("wins", "loses", "near")


@dataclass(frozen=True)
class NoisePlant:
    """One noise edge of a family that the strategies plant in drawn batches (`strategies.stream_edges`).

    - `kind`: one of `PLANT_KINDS`; `label`: the knob reported when a batch carries it;
    - `keys`: `(seed, pos, token)` keys whose noise is the edge (all the same value);
    - `aim`: for a family that can reach the edge on any key, `aim(seed_hi, pos, token)` gives the
      seed with that high word that puts the edge on `token` at `pos`; None: only `keys` carry it.
    """

    kind: str
    label: str
    keys: tuple[tuple[int, int, int], ...]
    aim: Callable[[int, int, int], int] | None = None

    def __post_init__(self):
        if self.kind not in PLANT_KINDS or not self.label or not self.keys:
            raise ValueError(f"noise plant {self.label!r}: kind one of {list(PLANT_KINDS)}, a label and at least one key")


@dataclass(frozen=True)
class StreamEdges:
    """Stream points random seeds and positions never hit, planted by the edge properties.

    - `zero_uniform`: `(seed, pos)` whose raw acceptance draw is 0, so `u` is the floor
      (a sampler that skips the floor accepts any draft there: `log 0 = -inf`);
    - `tiny_noise`: `(seed, pos, token)` whose resample uniform is below `2**-25`, so `1 - v`
      is 1 in float32 (a sampler that writes `log(1 - v)` gets `G = +inf` there);
    - `top_noise`: `(seed, pos, token)` whose noise is the family's smallest, where a floor or
      the uniform's own bottom keeps `G` finite (murmur3: `u = 1.0`, `max(1 - u, 2**-24)`;
      murmur3-fp64: `u = 2**-54`), or None when the family has no such point (triton-philox).
    - `plants`, `pos_period`: see `NoisePlant`; checked with the rest.
    """

    zero_uniform: tuple[int, int]
    tiny_noise: tuple[int, int, int]
    top_noise: tuple[int, int, int] | None = None
    plants: tuple[NoisePlant, ...] = ()  # the noise edges the strategies plant in drawn batches
    pos_period: int | None = None  # positions this far apart share their noise (murmur3: only pos_lo is hashed)


@dataclass(frozen=True)
class StreamFamily:
    """One stream family (see the module docstring); checked when built."""

    name: str
    section: str
    acceptance: Callable[..., np.ndarray]
    noise: Callable[..., np.ndarray]
    aliases: tuple[str, ...] = ()
    keyed_by: str = "seed_pos"
    floor: float = 0.0
    edges: StreamEdges | None = None
    triton: str | None = None
    triton_check: str | Callable | None = None
    fill: Callable | None = None  # keyed_by "batch": the batch with its missing noise fields drawn
    block_seeds: tuple[str, ...] = (PLAIN,)
    doc: str = field(default="", compare=False)

    def __post_init__(self):
        who = f"stream family {self.name!r}"
        if not isinstance(self.name, str) or not self.name or self.name == OWN or ":" in self.name:
            raise ValueError(f"{who}: the name must be a non-empty string other than {OWN!r}, without ':'")
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) and a for a in self.aliases):
            raise ValueError(f"{who}: aliases must be a tuple of names, not {self.aliases!r}")
        if OWN in self.aliases or self.name in self.aliases:
            raise ValueError(f"{who}: aliases {self.aliases} may name neither {OWN!r} nor the family itself")
        if not isinstance(self.section, str) or not self.section.startswith("3"):
            raise ValueError(f"{who}: section must name the family's SPEC section ('3a', ...), not {self.section!r}")
        if self.keyed_by not in KEYED_BY:
            raise ValueError(f"{who}: keyed_by must be one of {list(KEYED_BY)}, not {self.keyed_by!r}")
        if (self.keyed_by == "batch") != callable(self.fill):
            raise ValueError(f"{who}: keyed_by {self.keyed_by!r}: a family keyed by the batch (SPEC 3c) and only "
                             "such a family has fill(batch), the batch with its missing noise fields drawn")
        keys = "seeds, pos" if self.keyed_by == "seed_pos" else "batch, rows or requests"
        for what in ("acceptance", "noise"):
            if not callable(getattr(self, what)):
                raise ValueError(f"{who}: {what} must be a function of ({keys}{', vocab' * (what == 'noise')})")
        if not self.block_seeds or not set(self.block_seeds) <= set(BLOCK_SEEDS) or PLAIN not in self.block_seeds:
            raise ValueError(f"{who}: block_seeds {self.block_seeds!r} must include {PLAIN!r} and be among {list(BLOCK_SEEDS)}")
        if STEP in self.block_seeds and self.keyed_by != "seed_pos":
            raise ValueError(f"{who}: a step-mixed block seed needs a family keyed by (seed, pos)")
        tc = self.triton_check
        if tc is not None and not callable(tc) and not (isinstance(tc, str) and tc.count(":") == 1):
            raise ValueError(f"{who}: triton_check must be a callable or a 'module:function' path, not {tc!r}")
        self.check()

    def check(self) -> None:
        """The functions answer in the documented shapes and dtypes, and the edges are edges (a change
        of the functions would make the edge campaigns vacuous); `ValueError` otherwise."""
        who = f"stream family {self.name!r}"
        if self.keyed_by == "batch":
            return self._check_batch_keyed(who)
        seeds, pos = np.array([0, -1, 2**62], np.int64), np.array([0, 7, 2**40], np.int64)
        u = np.asarray(self.acceptance(seeds, pos))
        if u.shape != (3,) or u.dtype != np.float32 or not ((u > 0) & (u <= 1)).all():
            raise ValueError(f"{who}: acceptance(seeds, pos) must give float32 uniforms in (0, 1], one per row; "
                             f"got {u.dtype} {u.shape} {u!r}")
        g = np.asarray(self.noise(seeds, pos, 5, out=np.empty((3, 5), np.float64)))
        if g.shape != (3, 5) or g.dtype != np.float64 or not np.isfinite(g).all():
            raise ValueError(f"{who}: noise(seeds, pos, vocab, out=None) must give finite float64 [rows, vocab]; "
                             f"got {g.dtype} {g.shape}")
        if self.edges is None:
            return
        s, p = self.edges.zero_uniform
        u0 = self.acceptance(np.array([s], np.int64), np.array([p], np.int64))[0]
        if u0 != np.float32(self.floor) or not self.floor > 0:
            raise ValueError(f"{who}: edges.zero_uniform {self.edges.zero_uniform} gives u = {u0!r}, not the "
                             f"floor {self.floor!r}: rescan the edge values")
        s, p, x = self.edges.tiny_noise
        gx = self.noise(np.array([s], np.int64), np.array([p], np.int64), x + 1)[0, x]
        if not TINY_NOISE_G < gx < np.inf:
            raise ValueError(f"{who}: edges.tiny_noise {self.edges.tiny_noise} gives G = {gx!r}, not a noise "
                             f"uniform below 2**-25 (G > {TINY_NOISE_G:.2f}): rescan the edge values")
        if self.edges.top_noise is not None:
            s, p, x = self.edges.top_noise
            gx = self.noise(np.array([s], np.int64), np.array([p], np.int64), x + 1)[0, x]
            if not -np.inf < gx <= TOP_NOISE_G + 1e-9:
                raise ValueError(f"{who}: edges.top_noise {self.edges.top_noise} gives G = {gx!r}, not the "
                                 f"floored top of the noise (G = {TOP_NOISE_G:.4f}): rescan the edge values")
        for plant in self.edges.plants:
            keys = np.array(plant.keys, np.int64).reshape(-1, 3)
            g = self.noise(keys[:, 0], keys[:, 1], int(keys[:, 2].max()) + 1)[np.arange(len(keys)), keys[:, 2]]
            if not (np.isfinite(g).all() and (g == g[0]).all()):
                raise ValueError(f"{who}: the keys of plant {plant.label!r} give the noise {g!r}, not one finite "
                                 "edge value: rescan them")

    def _check_batch_keyed(self, who: str) -> None:
        """A family keyed by the batch reads the batch's fields and fills a batch without them (SPEC 3c)."""
        base = SpecBatch(target_logits=np.zeros((3, 5), np.float32), draft_logits=None,
                         draft_token_ids=np.array([0, 1, 0], np.int64), cu_num_logits=np.array([0, 2, 3], np.int32),
                         pos=np.array([0, 7, 2**40], np.int64), idx_mapping=np.array([1, 0], np.int32),
                         temperature=np.ones(2, np.float32), seeds=np.array([-1, 2**62], np.int64),
                         num_speculative_steps=1)
        full = self.fill(base)
        if not isinstance(full, SpecBatch) or len(full.noise_carried()) != 3:
            raise ValueError(f"{who}: fill(batch) must give the batch with all three noise fields (SPEC 3c)")
        rows, reqs = np.arange(3), np.arange(2)
        for batch in (base, full):
            u = np.asarray(self.acceptance(batch, rows))
            g = np.asarray(self.noise(batch, reqs, 5, out=np.empty((2, 5), np.float64)))
            if u.shape != (3,) or u.dtype != np.float64 or not ((u > 0) & (u < 1)).all():
                raise ValueError(f"{who}: acceptance(batch, rows) must give float64 uniforms in (0, 1), one per "
                                 f"row; got {u.dtype} {u.shape}")
            if g.shape != (2, 5) or g.dtype != np.float64 or not np.isfinite(g).all():
                raise ValueError(f"{who}: noise(batch, reqs, vocab, out=None) must give finite float64 "
                                 f"[requests, vocab]; got {g.dtype} {g.shape}")
        if not (np.array_equal(self.acceptance(base, rows), full.accept_uniforms)
                and np.array_equal(self.noise(base, reqs, 5), full.resample_gumbel)):
            raise ValueError(f"{who}: a batch without noise must read as the noise fill(batch) draws for it")

    def at_rows(self, batch, rows, seeds, pos) -> np.ndarray:
        """`u` of the given global rows of `batch`, whose seeds and positions are given (either kind)."""
        if self.keyed_by == "batch":
            return self.acceptance(batch, np.asarray(rows, np.int64).reshape(-1))
        return self.uniforms(seeds, pos)

    def at_requests(self, batch, reqs, seeds, pos, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
        """`G_x` of the token that global requests `reqs` sample at rows with the given seeds and
        positions (either kind: a batch-keyed family's noise is the request's, wherever it samples)."""
        if self.keyed_by == "batch":
            return self.noise(batch, np.asarray(reqs, np.int64).reshape(-1), int(vocab), out=out)
        return self.gumbel(seeds, pos, vocab, out=out)

    def _keyed_by_seed_pos(self, what: str) -> None:
        if self.keyed_by != "seed_pos":
            raise TypeError(f"stream family {self.name!r} is keyed by the batch (SPEC 3c): {what}(seeds, pos) has no "
                            "meaning; read it with at_rows / at_requests")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def describe(self) -> str:
        return f"{self.name} (SPEC section {self.section})"

    def block_uniforms(self, seeds, pos, steps, block_seed: str = PLAIN) -> np.ndarray:
        """The acceptance uniforms of block steps `steps` (SPEC 4b) at `(seeds, pos)`: `uniforms` keyed by
        the plain seed or, `block_seed == "step"`, by `step_seeds(seeds, steps)` (SPEC 3b)."""
        if block_seed not in self.block_seeds:
            raise ValueError(f"stream family {self.name!r} draws the block seeds {list(self.block_seeds)}, "
                             f"not {block_seed!r} (SPEC 3b and 10)")
        if block_seed == STEP:
            seeds = step_seeds(np.asarray(seeds, np.int64).reshape(-1), np.asarray(steps, np.int64).reshape(-1))
        return self.uniforms(seeds, pos)

    def uniforms(self, seeds, pos) -> np.ndarray:
        """`acceptance` with its arguments as int64 arrays (a family keyed by (seed, pos))."""
        self._keyed_by_seed_pos("uniforms")
        return self.acceptance(np.asarray(seeds, np.int64).reshape(-1), np.asarray(pos, np.int64).reshape(-1))

    def gumbel(self, seeds, pos, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
        """`noise` with its arguments as int64 arrays: float64 `[n, vocab]` (a family keyed by (seed, pos))."""
        self._keyed_by_seed_pos("gumbel")
        return self.noise(np.asarray(seeds, np.int64).reshape(-1), np.asarray(pos, np.int64).reshape(-1),
                          int(vocab), out=out)


def _unknown(which, known) -> str:
    return (f"unknown stream family {which!r}: known families are {known} (and {OWN!r} for a sampler with its "
            "own generator); another family is declared as a StreamFamily record (SPEC 3d)")


FAMILIES = Registry(StreamFamily, "stream family", _unknown)  # every name and alias -> its record


def register(record: StreamFamily) -> StreamFamily:
    """Add `record` to the registry under its name and aliases; a name taken by another record raises."""
    return FAMILIES.register(record)


def shipped() -> list[StreamFamily]:
    """The registered families, each once, in registration order."""
    return FAMILIES.shipped()


def registered(record: StreamFamily) -> bool:
    """Whether `record` is the registered family of its name (a shipped one, or one added by `register`)."""
    return FAMILIES.registered(record)


def family(which) -> StreamFamily:
    """The record of `which`: a registered name or alias, a `module:attribute` path of a record, or
    a record (returned as is, registered or not: SPEC 3d)."""
    return FAMILIES.lookup(which)


def report_mismatch(what: str, want, got, at: dict, bad=None) -> None:
    """The one mismatch report of the families' Triton checks (`StreamFamily.triton_check`): raises
    `AssertionError` when `want` (the contract's values) and `got` (Triton's) differ, naming how many
    of them differ and the first, at its coordinates `at` (a name -> values broadcastable to the
    values' shape: `seed`, `pos`, `token`...) with both values and, for floats, their bits. Values
    differ where `bad` is true, or by default where their bits differ (bit for bit: `-0.0` and NaN
    payloads count)."""
    want, got = np.asarray(want), np.asarray(got)
    if want.shape != got.shape:
        raise AssertionError(f"{what}: shapes differ, contract {want.shape} vs triton {got.shape}")
    if bad is None:
        bad = _bits(want) != _bits(got) if want.dtype == got.dtype else want != got
    where = np.argwhere(np.broadcast_to(bad, want.shape))
    if not where.size:
        return
    idx = tuple(int(i) for i in where[0])
    coords = ", ".join(f"{name}={_coordinate(v, want.shape, idx)}" for name, v in at.items())
    raise AssertionError(f"{what}: {len(where)} of {want.size} values differ; first at {coords}: "
                         f"contract {_shown(want[idx])} vs triton {_shown(got[idx])}")


def _bits(values: np.ndarray) -> np.ndarray:
    """Floats as their bit patterns (unsigned integers of the same width); other values as they are."""
    return values.view(f"u{values.dtype.itemsize}") if values.dtype.kind == "f" else values


def _coordinate(values, shape, idx) -> str:
    v = np.broadcast_to(np.asarray(values), shape)[idx]
    return f"{int(v)} ({v.dtype})"


def _shown(v) -> str:
    v = np.asarray(v)
    if v.dtype.kind != "f":
        return repr(v.item())
    return f"{v.item()!r} (bits 0x{int(_bits(v.reshape(1))[0]):0{2 * v.dtype.itemsize}x})"


def family_path(record: StreamFamily) -> str | None:
    """How a record that is not registered travels between processes (`records.module_path`)."""
    return module_path(record, (record.acceptance, record.noise))
