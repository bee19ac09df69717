"""The arrays of a batch while `decision_batches` fills them, and what a request's rows decide.

`Contents` holds the mutable arrays (target and draft logits, draft ids, per-state sampling
parameters) with the layout, so that the tilts of `strategies.params` and `strategies.block`
can read a request's masked target probabilities (SPEC section 2, `rs_verify.contract.masks`), its
draft probabilities and its block quantities (section 4b, `rs_verify.contract.block`) and change a
logit, kept representable in the batch's dtype and within its magnitude bound.

Imports only NumPy and the contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from rs_verify.contract import block as spec_block
from rs_verify.contract import probs

from rs_verify.contract.masks import MaskResult
from rs_verify.contract.streams import PLAIN

from .facts import STREAMS, block_uniforms, masked_probs, masked_rows
from .logits import round_to_dtype

OFF = {"min_p": 0.0, "top_k": 0, "top_p": 1.0}  # each parameter's canonical "off" (SPEC section 2)
MASK_FIELDS = tuple(f.name for f in fields(MaskResult))
ZERO_GAP = (800.0, 1500.0)  # processed gap below a row's largest logit: exp underflows, p = 0 in float64


@dataclass
class Contents:
    """A batch being filled (arrays are changed in place). Per request: `temps`, `n_r`, `bounds`;
    per state: `seeds`, `params[name]` (or None); `protected`: rows (global indices) a tilt has
    built and later tilts must leave alone."""

    target: np.ndarray
    draft: np.ndarray | None
    draft_ids: np.ndarray
    cu: np.ndarray
    idx: np.ndarray
    temps: np.ndarray
    n_r: list
    v: int
    dtype: str
    bounds: list
    seeds: np.ndarray
    pos: np.ndarray
    masked: bool  # a masked batch: -inf logits drawn across its rows
    stochastic: list  # stochastic requests that verify drafts
    block_mode: bool = False  # a block batch (SPEC 4b)
    inf_allowed: bool = False  # -inf logits allowed at all (the masks knob): a tilt may plant one
    params: dict = field(default_factory=dict)
    protected: set = field(default_factory=set)
    designated: int | None = None  # a block batch's request kept for a rescue or a partial block
    family: object = STREAMS  # the stream family whose acceptance uniforms the tilts aim at
    block_seed: str = PLAIN  # how its block steps key their uniforms (SPEC 3b)
    _u: dict = field(default_factory=dict, repr=False)
    _mz: dict = field(default_factory=dict, repr=False)

    def designate(self, rng) -> None:
        """In a block batch, one stochastic request of two drafts or more (once per batch)."""
        if self.block_mode and self.designated is None:
            multi = [r for r in self.stochastic if self.n_r[r] >= 2]
            self.designated = int(rng.choice(multi)) if multi else -1

    def state_params(self, r: int) -> tuple:
        """`(min_p, top_k, top_p)` of request `r`'s state (off for a parameter that is None)."""
        s = int(self.idx[r])
        return tuple(OFF[k] if self.params.get(k) is None else self.params[k][s] for k in ("min_p", "top_k", "top_p"))

    def lo(self, r: int) -> int:
        return int(self.cu[r])

    def masked_z(self, r: int, rows=None):
        """Processed logits and masks of request `r`'s rows (all `n_r + 1`, or `rows`: offsets).
        Cached per request on the bytes of its rows and its parameters (tilts edit both in place)."""
        lo = self.lo(r)
        target = self.target[lo : lo + self.n_r[r] + 1]
        key = (r, self.state_params(r), target.tobytes())
        if self._mz.get(r, (None,))[0] != key:
            self._mz[r] = (key, masked_rows(target, float(self.temps[r]), key[1], self.v))
        z, mr = self._mz[r][1]
        if rows is None:
            return z, mr
        sel = np.asarray(rows, np.int64)
        return z[sel], MaskResult(**{k: getattr(mr, k)[sel] for k in MASK_FIELDS})

    def probs(self, r: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Masked target probabilities `[n + 1, V']` and draft probabilities `[n, V']` (None: one-hot)."""
        z, mr = self.masked_z(r)
        p = masked_probs(z, mr.kept)
        if self.draft is None:
            return p, None
        rows = self.draft[int(self.idx[r]), : self.n_r[r], : self.v]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return p, probs.softmax64(probs.process(rows, self.temps[r]))

    def drafts(self, r: int) -> np.ndarray:
        lo = self.lo(r)
        return self.draft_ids[lo + 1 : lo + 1 + self.n_r[r]]

    def block(self, r: int):
        """`(BlockResult, p, q, u)` of request `r` alone (`[1, K]` arrays)."""
        p, q = self.probs(r)
        n = self.n_r[r]
        res = spec_block.block_quantities(p[None], None if q is None else q[None], self.drafts(r)[None],
                                          np.asarray([n]))
        if r not in self._u:  # seeds and positions never change: the uniforms once per request
            lo = self.lo(r)
            self._u[r] = block_uniforms(np.full(n, self.seeds[int(self.idx[r])]), self.pos[lo : lo + n], np.arange(n),
                                        self.family, self.block_seed)
        return res, p, q, self._u[r]

    def put(self, j: int, tokens, value) -> None:
        """Set target row `j`'s raw logits at `tokens` to `value` (rounded, within the bound)."""
        self.target[j, tokens] = self._fit(value, self._bound_of_row(j))

    def put_draft(self, r: int, i: int, tokens, value) -> None:
        self.draft[int(self.idx[r]), i, tokens] = self._fit(value, self.bounds[r])

    def raw(self, r: int, z) -> np.ndarray:
        """Raw logits whose processing gives (about) processed logits `z` for request `r`."""
        t = float(self.temps[r])
        return np.asarray(z, np.float64) * (t if t > 0 else 1.0)

    def zero_logit(self, rng, r: int, row) -> float:
        """A raw logit for request `r` whose probability is 0 in float64 beside the row's largest
        (processed gap in `ZERO_GAP`), or `-inf` half the time in a masked batch."""
        finite = row[np.isfinite(row)]
        if self.masked and rng.random() < 0.5 or not finite.size:
            return -np.inf
        t = float(self.temps[r])
        return float(finite.max()) - (t if t > 0 else 1.0) * rng.uniform(*ZERO_GAP)

    def _bound_of_row(self, j: int) -> float:
        r = int(np.searchsorted(self.cu, j, side="right") - 1)
        return self.bounds[r]

    def _fit(self, value, bound) -> np.ndarray:
        x = np.asarray(value, np.float64)
        x = np.where(np.isfinite(x), np.clip(x, -bound, bound), x)
        return round_to_dtype(x.astype(np.float32), self.dtype)
