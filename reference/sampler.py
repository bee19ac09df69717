"""The float64 reference sampler: the oracle of the suite (SPEC sections 2-6 and 8).

Every decision is taken in float64 from the exact float32 uniforms of a stream family
(SPEC section 3; `rs_verify.contract.streams`: `triton-philox` unless another is given, as
certification gives the sampler's own) and can be reported with its margin
(`verify_with_trace`). A batch is verified in slabs of whole requests
(`reference.slab`), so memory stays bounded.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract import methods
from rs_verify.contract.batch import LogprobsTensors, SamplerOutput, SpecBatch
from rs_verify.contract.chunking import empty_output, iter_request_chunks, verify_chunked
from rs_verify.contract.deviations import Applied, applied
from rs_verify.contract.explicit import GUMBEL, RESAMPLE
from rs_verify.contract.masks import state_params
from rs_verify.contract.streams import PLAIN, StreamFamily, family as family_of, registered
from rs_verify.contract.triton_philox import TRITON_PHILOX
from rs_verify.contract.validation import check_structure, validate as validate_batch

from .masks import check_flips
from .slab import Slab, verify_slab
from .trace import RequestTrace
from .tree import PER_CHILD, PER_NODE, verify_tree_slab

__all__ = ["ReferenceSampler", "SLAB_ELEMS", "explicit_per_node_reference", "explicit_reference"]

#: float64 elements per slab working array (rows x vocab): bounds memory, keeps slabs cache-sized.
SLAB_ELEMS = 1 << 18


class ReferenceSampler:
    """The float64 reference sampler (SPEC sections 2-6; the protocol of section 10).

    - `validate`: validate every batch (SPEC section 9) before verifying it; with False only
      the shapes and dtypes are checked (`check_structure`) and the value rules are assumed,
      so, unlike a production sampler, the oracle offers no `unvalidated()` (SPEC section 10).
    - `slab_elems`: float64 elements per working array; slabs of whole requests
      of at most `max(1, slab_elems // V)` rows are verified one at a time.
    - `streams`: the stream family whose random numbers it draws (a registered name or a
      `StreamFamily` record, SPEC section 3); `with_streams` gives a copy drawing another's.
      With `explicit` (SPEC 3c) it reads the batch's noise fields, and a field the batch lacks
      as the family's deterministic draw (`rs_verify.contract.explicit`: what the suite fills
      in for the sampler under test).
    - `resample`: `"gumbel"` or, with a family keyed by the batch, `"inverse_cdf"` (SPEC 4).
    - `block_seed`: how block step `i` keys its acceptance uniform (SPEC 3b and 10): `"plain"` or,
      with a family that offers it, `"step"` (`seed ^ (i << 32)`).
    - `deviations`: the declared deviations it applies instead of the SPEC's rules (SPEC section 11;
      names, paths or `Deviation` records): certification binds those of the sampler it certifies.
    - `tree_uniforms`: how tree children draw their acceptance uniforms (SPEC 4c): `"per_child"` or
      `"per_node"` (one coin per parent node, one-hot trees). Tree batches use the explicit family's noise
      (SPEC 3c) whatever `streams` is; the reference declares tree verification only with that family.
    """

    name = "reference"
    supports_chunking = True
    streams = TRITON_PHILOX.name  # the default; an instance declares its own family
    tree_drafts = frozenset({"one_hot", "iid", "without_replacement"})  # SPEC 4c: every kind
    sampling_params = frozenset({"min_p", "top_k", "top_p"})  # SPEC section 2

    def __init__(self, *, validate: bool = True, slab_elems: int = SLAB_ELEMS,
                 streams: StreamFamily | str = TRITON_PHILOX, resample: str = GUMBEL, block_seed: str = PLAIN,
                 deviations=(), tree_uniforms: str = PER_CHILD):
        self.validate = bool(validate)
        self.applied = applied(deviations)
        self.deviations = frozenset(self.applied.records)  # the declaration (SPEC section 10)
        self.slab_elems = int(slab_elems)
        self.family = family_of(streams)
        if resample not in RESAMPLE or (resample != GUMBEL and self.family.keyed_by != "batch"):
            raise ValueError(f"resample must be one of {list(RESAMPLE)}, and {resample!r} needs a family keyed by "
                             f"the batch (SPEC 3c), not {self.family.name!r}")
        self.resample = resample
        if block_seed not in self.family.block_seeds:
            raise ValueError(f"block_seed: the stream family {self.family.name!r} draws {list(self.family.block_seeds)}, "
                             f"not {block_seed!r} (SPEC 3b and 10)")
        self.block_seed = block_seed
        if tree_uniforms not in (PER_CHILD, PER_NODE):
            raise ValueError(f"tree_uniforms must be {PER_CHILD!r} or {PER_NODE!r}, not {tree_uniforms!r} (SPEC 4c)")
        self.tree_uniforms = tree_uniforms
        if tree_uniforms == PER_NODE:  # one coin per node: one-hot trees only (SPEC 4c)
            self.tree_drafts = frozenset({"one_hot"})
        # SPEC 4c: tree batches use the explicit family (SPEC 3c), so the reference verifies trees with it only.
        self.verification_methods = frozenset({methods.TOKEN.name, methods.BLOCK.name}
                                              | ({methods.TREE.name} if self.family.keyed_by == "batch" else set()))
        # The declaration (SPEC section 10): a shipped family by name, another as its record.
        self.streams = self.family.name if registered(self.family) else self.family

    def __repr__(self) -> str:
        extra = "" if self.family is TRITON_PHILOX else f", streams={self.family.name!r}"
        extra += "" if self.resample == GUMBEL else f", resample={self.resample!r}"
        extra += "" if self.block_seed == PLAIN else f", block_seed={self.block_seed!r}"
        extra += f", deviations={list(self.applied.names)}" if self.applied else ""
        extra += "" if self.tree_uniforms == PER_CHILD else f", tree_uniforms={self.tree_uniforms!r}"
        return f"ReferenceSampler(validate={self.validate}{extra})"

    def with_streams(self, streams: StreamFamily | str, resample: str = GUMBEL, block_seed: str = PLAIN,
                     deviations=None, tree_uniforms: str = PER_CHILD) -> "ReferenceSampler":
        """This reference drawing the random numbers of `streams` instead, resampling as `resample`, its
        block steps keyed by `block_seed` and applying `deviations` (None: its own) (itself when all four
        are its own)."""
        dev = self.applied if deviations is None else applied(deviations)
        if (family_of(streams) is self.family and (resample, block_seed, tree_uniforms)
                == (self.resample, self.block_seed, self.tree_uniforms) and dev == self.applied):
            return self
        return type(self)(validate=self.validate, slab_elems=self.slab_elems, streams=streams, resample=resample,
                          block_seed=block_seed, deviations=dev, tree_uniforms=tree_uniforms)

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        """Verify `batch` (SPEC sections 4-6); `max_chunk_logits` None: the whole batch at once."""
        (validate_batch if self.validate else check_structure)(batch)
        if max_chunk_logits is None:
            return self._verify(batch, trace=False)[0]
        return verify_chunked(batch, lambda b: self._verify(b, trace=False)[0], max_chunk_logits)

    def verify_with_trace(self, batch: SpecBatch, *, flips=None, decided=None) -> tuple[SamplerOutput, list[RequestTrace]]:
        """The output and one `RequestTrace` per request, with every decision's margin and
        tolerance scale (SPEC section 8; see `reference.trace.Decision`).

        `flips`: `{row j: token ids}`, tokens whose final sampling-parameter mask membership (after
        all three parameters) is inverted in row `j`: the output had a production sampler decided
        those near-ties the other way. Rows must have a mask (a stochastic state with a parameter
        on) and keep a finite logit; tokens lie in `[0, V')` (`ValueError` otherwise). The trace's
        mask decisions stay the reference's own; everything downstream sees the flipped masks.

        `decided`: `{row j: accepted}`, acceptance tests of token-wise stochastic draft rows taken
        as given: SPEC 4 leaves the test of a draft with `q(d) = 0` (or below `2**-126`) free, and
        the token emitted after either choice is certified (`Decision.what == "q_zero"`).
        """
        (validate_batch if self.validate else check_structure)(batch)
        decided = {int(j): bool(a) for j, a in (decided or {}).items()}
        if any(not 0 <= j < batch.num_logits for j in decided):
            raise ValueError(f"decided: rows {sorted(decided)} outside [0, {batch.num_logits})")
        return self._verify(batch, trace=True, flips=check_flips(batch, flips), decided=decided)

    def _verify(self, batch: SpecBatch, trace: bool, flips=None, decided=None):
        if batch.num_reqs == 0:
            return empty_output(batch), []
        cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
        rows_cap = max(1, self.slab_elems // max(1, batch.vocab_size))
        k1 = batch.num_speculative_steps + 1
        sampled = np.empty((batch.num_reqs, k1), dtype=np.int64)
        num = np.empty(batch.num_reqs, dtype=np.int32)
        shared = BatchArrays(batch, self.family, self.resample, self.block_seed, self.applied)
        shared.tree_uniforms = self.tree_uniforms
        lp_parts, traces = [], []
        nodes = np.full((batch.num_reqs, k1 - 1), -1, np.int32) if batch.tree else None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for ra, rb in iter_request_chunks(cu, rows_cap):
                slab = Slab(shared, cu, ra, rb, trace, flips, decided)
                if batch.tree:  # SPEC 4c: trees verify request by request
                    s_sampled, s_num, nodes[ra:rb], s_traces = verify_tree_slab(slab)
                    s_lp = None
                else:
                    s_sampled, s_num, s_lp, s_traces = verify_slab(slab)
                sampled[ra:rb] = s_sampled
                num[ra:rb] = s_num
                lp_parts.append(s_lp)
                traces.extend(s_traces)
        logprobs = None
        if batch.num_logprobs is not None:
            logprobs = LogprobsTensors.cat(lp_parts, batch.cu_num_logits)
        return SamplerOutput(sampled=sampled, num_sampled=num, logprobs=logprobs, accepted_nodes=nodes), traces


class BatchArrays:
    """The batch's arrays as the slabs read them (draft logits flattened to `[S * K, Vd]` once);
    `params`: the sampling parameters per state, None when none is on (SPEC section 2); `block`:
    stochastic requests verify as a block (section 4b); `family`: the stream family (section 3);
    `resample`: `"gumbel"` or `"inverse_cdf"` (section 4); `block_seed`: the block steps' seed (3b);
    `deviations`: the declared deviations applied (section 11, `rs_verify.contract.deviations.Applied`)."""

    tree_uniforms = PER_CHILD  # SPEC 4c: how tree children draw their uniforms (the sampler's declaration)

    def __init__(self, batch: SpecBatch, family: StreamFamily = TRITON_PHILOX, resample: str = GUMBEL,
                 block_seed: str = PLAIN, deviations: Applied | None = None):
        self.batch = batch
        self.deviations = applied(deviations)
        self.family = family
        self.resample = resample
        self.block_seed = block_seed
        self.k = batch.num_speculative_steps
        self.v = batch.vocab_size
        self.vp = batch.effective_vocab_size
        self.x = np.asarray(batch.target_logits)
        self.dti = np.asarray(batch.draft_token_ids)
        self.pos = np.asarray(batch.pos)
        self.idx = np.asarray(batch.idx_mapping, dtype=np.int64)
        self.temperature = np.asarray(batch.temperature)
        self.seeds = np.asarray(batch.seeds)
        dl = batch.draft_logits
        self.draft = None if dl is None else np.asarray(dl).reshape(-1, dl.shape[2])
        on = batch.sampling_params_on()
        self.params = state_params(batch, np.arange(batch.num_states)) if on else None
        self.block = batch.verification == methods.BLOCK.name


def explicit_reference() -> ReferenceSampler:
    """`ReferenceSampler(streams="explicit")` (SPEC 3c; trees with one coin per child, SPEC 4c): built-in
    name `reference-explicit`."""
    return ReferenceSampler(streams="explicit")


def explicit_per_node_reference() -> ReferenceSampler:
    """`ReferenceSampler(streams="explicit", tree_uniforms="per_node")` (SPEC 4c: one coin per parent node,
    one-hot trees): built-in name `reference-explicit-per-node`."""
    return ReferenceSampler(streams="explicit", tree_uniforms="per_node")
