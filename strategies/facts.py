"""What a batch decides, in float64, from the contract's own formulas: the facts the labels read.

`batch_facts(batch)` computes once per drawn batch the processed logits, the sampling-parameter
masks (`rs_verify.contract.masks`), the target probabilities with and without them, the draft
probabilities, the acceptance uniforms of SPEC section 3 and, for a block batch, the quantities
of section 4b (`rs_verify.contract.block`) and `tau` of every request. Only the labels
(`strategies.events`) and the strategies' own tuning read them; no property relies on them.

Imports only NumPy and the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rs_verify.contract import block as spec_block
from rs_verify.contract import explicit
from rs_verify.contract import probs
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.masks import MaskResult, RowParams, apply_masks, batch_masks
from rs_verify.contract.methods import BLOCK
from rs_verify.contract.streams import PLAIN, StreamFamily, family as family_of
from rs_verify.contract.triton_philox import TRITON_PHILOX

# The default stream family the strategies plant decisions at and label with; the batch strategies'
# `streams` knob (the sampler's declared family) replaces it. Its acceptance uniform is also that of
# SPEC 3b (murmur3), so the planted near-ties hold for both families.
STREAMS = TRITON_PHILOX


@dataclass(frozen=True)
class Facts:
    """Float64 facts of one batch (rows `[N, V']` unless noted).

    - `v`: `V'`; `temps`: per-request temperature `[R]`; `stochastic`: per request, `T > 0`.
    - `z`: processed logits without the masks (float32); `masks`: the SPEC section 2 masks of
      every row, or None when no parameter is on; `p`: target probabilities (masked), `p_raw`:
      without the masks (the same array when none is on); `q`: draft probabilities or None.
    - `u`: the acceptance uniform of every row `[N]` (a family keyed by the batch: its
      `accept_uniforms`, or the family's draw); `family`: the stream family of `u` and of the
      resampling noise the labels read.
    - `block`: `BlockResult` of every request (`[R, K]`) for a block batch, else None;
      `u_steps`: `u` per request and step `[R, K]`; `tau`: per request `[R]` (block batches).
    """

    batch: SpecBatch
    v: int
    temps: np.ndarray
    stochastic: np.ndarray
    z: np.ndarray
    masks: MaskResult | None
    p: np.ndarray
    p_raw: np.ndarray
    q: np.ndarray | None
    u: np.ndarray
    block: spec_block.BlockResult | None = None
    u_steps: np.ndarray | None = None
    tau: np.ndarray | None = None
    family: StreamFamily = STREAMS

    @property
    def param_masked(self) -> np.ndarray:
        """bool `[N, V']`: tokens with `p_raw > 0` that the sampling parameters removed."""
        if self.masks is None:
            return np.zeros(self.z.shape, bool)
        return ~self.masks.kept & np.isfinite(self.z)


def uniforms(seeds, pos, family: StreamFamily = STREAMS) -> np.ndarray:
    """SPEC section 3's acceptance uniforms of `family` as float64. A family keyed by the batch (SPEC
    3c, `explicit`): the uniforms it draws for rows with these seeds and positions, what a batch that
    carries none gets (`rs_verify.contract.explicit.filled`)."""
    if family.keyed_by == "batch":
        return explicit.drawn_uniforms(seeds, pos)
    return family.uniforms(seeds, pos).astype(np.float64)


def block_uniforms(seeds, pos, steps, family: StreamFamily = STREAMS, block_seed: str = PLAIN) -> np.ndarray:
    """The acceptance uniforms of block steps `steps` at `(seeds, pos)` (SPEC 3b, 4b): `uniforms`
    under the plain block seed, else keyed by the step-mixed seed the family declares."""
    if block_seed == PLAIN:
        return uniforms(seeds, pos, family)
    return family.block_uniforms(seeds, pos, steps, block_seed).astype(np.float64)


def gumbel_noise(seed, pos, v: int, family: StreamFamily = STREAMS) -> np.ndarray:
    """SPEC section 3's resampling noise `G_x` of one row in `family` (float64 `[v]`)."""
    return family.gumbel([seed], [pos], v)[0]


def masked_rows(rows, t: float, params: tuple, v: int) -> tuple[np.ndarray, MaskResult]:
    """Processed logits (float32 `[n, v]`) of raw target rows of one state and their SPEC section 2
    masks; `params` is `(min_p, top_k, top_p)` of that state."""
    z = probs.process(np.asarray(rows, np.float32)[:, :v], np.float32(t))
    n = z.shape[0]
    min_p, top_k, top_p = params
    rp = RowParams(min_p=np.full(n, float(min_p)), top_k=np.full(n, int(top_k), np.int64),
                   top_p=np.full(n, float(top_p)), stochastic=np.full(n, t > 0))
    return z, apply_masks(z, rp)


def masked_probs(z: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Float64 softmax of `z` with the tokens not `kept` at `-inf`."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        return probs.softmax64(np.where(kept, z, -np.inf))


def per_request(batch: SpecBatch, a: np.ndarray, steps: int, fill=0) -> np.ndarray:
    """Rows `cu[r] + i` for `i < steps` of a per-row array, `[R, steps, ...]` (rows past a request's
    end hold its last row; callers ignore them)."""
    cu = np.asarray(batch.cu_num_logits, np.int64)
    if a.shape[0] == 0 or steps == 0:
        return np.full((cu.size - 1, steps) + a.shape[1:], fill, dtype=a.dtype)
    rows = np.minimum(cu[:-1, None] + np.arange(steps)[None, :], cu[1:, None] - 1)
    return a[rows]


def batch_facts(batch: SpecBatch, family: StreamFamily | str = STREAMS, block_seed: str = PLAIN) -> Facts:
    """The facts of `batch` (see `Facts`) in stream family `family` (a record or a registered name);
    a block batch's step uniforms keyed by `block_seed` (SPEC 3b)."""
    family = family_of(family)
    v = batch.effective_vocab_size
    states = np.asarray(batch.idx_mapping, np.int64)
    temps = np.asarray(batch.temperature)[states]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        z = probs.processed_logits(batch, masked=False)
        masks = batch_masks(batch, z) if batch.sampling_params_on() else None
        p_raw = probs.softmax64(z) if z.shape[0] else z.astype(np.float64)
        p = p_raw if masks is None else masked_probs(z, masks.kept)
        q = probs.draft_probs(batch)
        rows = np.arange(batch.num_logits)  # the batch's own noise fields, in a family keyed by the batch
        u = (family.at_rows(batch, rows, np.asarray(batch.seeds)[probs.row_states(batch)], batch.pos).astype(np.float64)
             if batch.num_logits else np.zeros(0))
        facts = dict(batch=batch, v=v, temps=temps, stochastic=temps > 0, z=z, masks=masks, p=p, p_raw=p_raw, q=q, u=u,
                     family=family)
        if batch.verification == BLOCK.name and batch.num_reqs:
            k = batch.num_speculative_steps
            n = batch.num_draft_tokens
            drafts = per_request(batch, np.concatenate([np.asarray(batch.draft_token_ids)[1:], [0]]), k)
            steps = np.arange(k)[None, :]
            drafts = np.where(steps < n[:, None], drafts, 0)
            pr = per_request(batch, p, k + 1)
            qr = None if q is None else per_request(batch, q, k)
            if k:
                res = spec_block.block_quantities(pr, qr, drafts, n)
            else:  # K = 0: nothing to verify (block_quantities needs a step axis)
                empty = np.zeros((batch.num_reqs, 0))
                res = spec_block.BlockResult(m=np.zeros(batch.num_reqs, np.int64), log_prefix=empty, h=empty, z=empty)
            u_steps = per_request(batch, u, k)
            if block_seed != PLAIN and k:  # step i's uniform under the step-mixed seed (SPEC 3b)
                seeds = per_request(batch, np.asarray(batch.seeds)[probs.row_states(batch)], k)
                pos = per_request(batch, np.asarray(batch.pos), k)
                u_steps = block_uniforms(seeds, pos, np.broadcast_to(np.arange(k), seeds.shape), family,
                                         block_seed).reshape(seeds.shape)
            facts.update(block=res, u_steps=u_steps, tau=res.tau(u_steps))
    return Facts(**facts)
