"""The batch contract (SPEC sections 1, 4c, 5 and 6): `SpecBatch`, `SamplerOutput`, `LogprobsTensors`.

This module imports nothing else of the project but its verification methods (`methods`); NumPy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from . import methods

LOGITS_DTYPES = ("float32", "bfloat16", "float16")
LOGPROBS_MODES = ("raw", "processed")
DRAFT_MODES = ("model", "one_hot")  # draft logits, or None (one-hot drafts: n-gram, suffix, ...)
VERIFICATION_METHODS = tuple(methods.METHODS)  # SPEC sections 4, 4b and 4c: one record each in `methods`
# SPEC 4c: how a node's children were drawn from its Q (a tree batch with `node_draft_logits`), and the
# declarations of a tree-verifying sampler (SPEC 10): the kinds it takes ("one_hot": no node draft logits)
# and how it draws its acceptance uniforms (one per child, or one coin per parent node).
TREE_DRAFTS = ("iid", "without_replacement")
TREE_DRAFT_KINDS = ("one_hot", *TREE_DRAFTS)
TREE_UNIFORMS = ("per_child", "per_node")
SAMPLING_PARAMS = ("min_p", "top_k", "top_p")  # SPEC section 2, in the order they mask
EXERCISED = (*(m.name for m in methods.OFFERED), *SAMPLING_PARAMS)  # what `SpecBatch.exercises` reports

ARRAY_FIELDS = (
    "target_logits",
    "draft_logits",
    "draft_token_ids",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "temperature",
    "seeds",
    "top_k",
    "top_p",
    "min_p",
    "accept_uniforms",
    "resample_gumbel",
    "resample_uniforms",
    "tree_parent",
    "node_draft_logits",
)
# SPEC section 3c's explicit noise: float64, None unless the sampler's family is `explicit`.
NOISE_FIELDS = ("accept_uniforms", "resample_gumbel", "resample_uniforms")
# What moves with a request when a batch is cut or rearranged (SPEC section 7): arrays indexed by
# row (`[N, ...]`) and by request (`[R, ...]`); optional ones are skipped when None.
ROW_FIELDS = ("target_logits", "draft_token_ids", "pos", "accept_uniforms", "tree_parent", "node_draft_logits")
REQUEST_FIELDS = ("idx_mapping", "resample_gumbel", "resample_uniforms")
# Arrays indexed by request state (`[S]`, `draft_logits` `[S, K, Vd]`): never sliced by chunking.
STATE_FIELDS = ("temperature", "seeds", "top_k", "top_p", "min_p")
SCALAR_FIELDS = ("num_speculative_steps", "logits_dtype", "num_logprobs", "logprobs_mode", "verification", "tree_drafts")
# How many values of a per-request list a summary shows before "..." (a campaign has 200,000 requests).
SUMMARY_ITEMS = 8


def _standard_strides(shape, itemsize: int) -> tuple:
    """C-order strides computed as if no dimension were empty (NumPy gives an empty array all-zero
    strides, which trip kernels that assert `stride(-1) == 1`)."""
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


def _frozen(a):
    """A read-only, C-contiguous view of `a` with ordinary strides, empty arrays included (a copy
    only when `a` is not C-contiguous; the caller's array is left writable)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if a.size == 0:
        a = np.lib.stride_tricks.as_strided(np.empty(1, a.dtype), a.shape, _standard_strides(a.shape, a.itemsize))
    else:
        a = a.view()
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class SpecBatch:
    """One speculative-decoding verification batch (SPEC section 1).

    Host-side NumPy arrays, stored as read-only views. `R` requests, `K` draft
    steps, `V` target vocab, `N` logits rows, `S` request states.
    """

    target_logits: np.ndarray  # float32 [N, V]
    draft_logits: np.ndarray | None  # float32 [S, K, Vd] or None (one-hot drafts)
    draft_token_ids: np.ndarray  # int64 [N]; row j verifies draft_token_ids[j + 1]
    cu_num_logits: np.ndarray  # int32 [R + 1]
    pos: np.ndarray  # int64 [N]
    idx_mapping: np.ndarray  # int32 [R]
    temperature: np.ndarray  # float32 [S]; 0 is greedy
    seeds: np.ndarray  # int64 [S]
    num_speculative_steps: int
    logits_dtype: str = "float32"
    num_logprobs: int | None = None
    logprobs_mode: str = "raw"
    top_k: np.ndarray | None = None  # int32 [S]; 0 (or >= V') is off (SPEC section 2)
    top_p: np.ndarray | None = None  # float32 [S] in (0, 1]; 1 is off
    min_p: np.ndarray | None = None  # float32 [S] in [0, 1]; 0 is off
    verification: str = methods.BASELINE.name  # a name of `methods.METHODS`: "token" (SPEC 4) or "block" (4b)
    accept_uniforms: np.ndarray | None = None  # float64 [N] in (0, 1): explicit noise (SPEC 3c), u of each row
    resample_gumbel: np.ndarray | None = None  # float64 [R, V'], finite: per request, G of the token it samples
    resample_uniforms: np.ndarray | None = None  # float64 [R] in (0, 1): per request, U of an inverse-CDF resample
    # SPEC 4c (verification == "tree"): each row is a node; its parent's local index (-1 for the root)
    tree_parent: np.ndarray | None = None  # int32 [N]
    node_draft_logits: np.ndarray | None = None  # float32 [N, Vd]: the Q that proposed row j's children; None: one-hot
    tree_drafts: str = TREE_DRAFTS[0]  # "iid" or "without_replacement": how children were drawn from Q

    def __post_init__(self):
        for name in ARRAY_FIELDS:
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    # -- sizes -------------------------------------------------------------
    @property
    def num_reqs(self) -> int:
        return int(self.cu_num_logits.shape[0]) - 1

    @property
    def num_logits(self) -> int:
        return int(self.target_logits.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.target_logits.shape[1])

    @property
    def num_states(self) -> int:
        return int(self.temperature.shape[0])

    @property
    def draft_vocab_size(self) -> int | None:
        if self.node_draft_logits is not None:  # a tree batch's drafts (SPEC 4c)
            return int(self.node_draft_logits.shape[1])
        return None if self.draft_logits is None else int(self.draft_logits.shape[2])

    @property
    def tree(self) -> bool:
        """Whether the batch verifies trees (SPEC 4c)."""
        return self.verification == methods.TREE.name

    def tree_kind(self) -> str:
        """A tree batch's draft kind: `"one_hot"` without node draft logits, else `tree_drafts`."""
        return "one_hot" if self.node_draft_logits is None else self.tree_drafts

    @property
    def effective_vocab_size(self) -> int:
        """`V' = min(V, Vd)` with draft logits, else `V` (SPEC section 1)."""
        vd = self.draft_vocab_size
        return self.vocab_size if vd is None else min(self.vocab_size, vd)

    @property
    def num_draft_tokens(self) -> np.ndarray:
        """`n_r` for every request: rows owned minus the bonus row."""
        return np.diff(np.asarray(self.cu_num_logits, dtype=np.int64)) - 1

    @property
    def method(self) -> methods.VerificationMethod:
        """The record of `verification` (`methods.UnknownMethod` for a name the SPEC does not define)."""
        return methods.lookup(self.verification)

    def request_rows(self, r: int) -> range:
        return range(int(self.cu_num_logits[r]), int(self.cu_num_logits[r + 1]))

    def draft_tokens(self, r: int) -> np.ndarray:
        """The `n_r` draft ids verified by request `r` (vLLM layout: row j verifies id j + 1)."""
        lo, hi = int(self.cu_num_logits[r]), int(self.cu_num_logits[r + 1])
        return np.asarray(self.draft_token_ids[lo + 1 : hi])

    def replace(self, **changes) -> "SpecBatch":
        return dataclasses.replace(self, **changes)

    def _stochastic_states(self) -> tuple[np.ndarray, np.ndarray] | None:
        """`(states, stochastic)`: each request's state index and whether it samples (T > 0); None
        for a batch too malformed to tell (these helpers also describe invalid batches)."""
        try:
            states = np.asarray(self.idx_mapping, dtype=np.int64)
            return states, np.asarray(self.temperature)[states] > 0
        except (IndexError, TypeError, ValueError):
            return None

    def sampling_params_on(self) -> tuple[str, ...]:
        """The sampling parameters (SPEC section 2) that are on for at least one referenced stochastic state."""
        found = self._stochastic_states()
        if found is None:
            return ()
        states, stochastic = found
        out = []
        for name, off in (("min_p", 0), ("top_k", 0), ("top_p", 1)):
            a = getattr(self, name)
            try:
                if a is not None and (np.asarray(a)[states[stochastic]] != off).any():
                    out.append(name)
            except (IndexError, TypeError, ValueError):
                return tuple(out)
        return tuple(out)

    def exercises(self) -> tuple[str, ...]:
        """What of SPEC sections 2 and 4b this batch puts to a sampler (`EXERCISED` names): its
        verification method when that is one offered besides the baseline ("block") and a
        stochastic request has drafts, and the sampling parameters on for at least one referenced
        stochastic state."""
        method = methods.METHODS.get(self.verification) if isinstance(self.verification, str) else None
        found = self._stochastic_states() if method is not None and not method.baseline else None
        verified = False
        if found is not None:
            try:
                verified = bool((found[1] & (self.num_draft_tokens > 0)).any())
            except (IndexError, TypeError, ValueError):
                pass
        return (*((method.name,) if verified else ()), *self.sampling_params_on())

    def noise_carried(self) -> tuple[str, ...]:
        """The explicit noise fields (SPEC section 3c) this batch carries, in `NOISE_FIELDS` order."""
        return tuple(name for name in NOISE_FIELDS if getattr(self, name, None) is not None)

    def summary(self) -> str:
        """A compact one-paragraph description, for failure messages (tolerates malformed batches).

        Bounded whatever the batch size (as OpInfo's `summary()`): per-request values are shown
        for the first `SUMMARY_ITEMS` requests, then `...` and the count; the whole batch stays
        in the failure bundle."""
        try:
            n = _head(self.num_draft_tokens.tolist())
            states = np.asarray(self.idx_mapping, dtype=np.int64)[:SUMMARY_ITEMS + 1]
            temps = _head([float(self.temperature[int(s)]) for s in states], total=self.num_reqs)
        except (IndexError, TypeError, ValueError):
            n, temps = "?", "?"
        try:
            shape = f"R={self.num_reqs}, K={self.num_speculative_steps}, V={self.vocab_size}, N={self.num_logits}, "
            shape += f"S={self.num_states}"
        except (IndexError, TypeError, AttributeError):
            shape = "malformed"
        if self.tree:
            drafts = f"tree {self.tree_kind()}" + ("" if self.node_draft_logits is None else
                                                    f"(node_draft_logits shape {list(np.shape(self.node_draft_logits))})")
        elif self.draft_logits is None:
            drafts = "one-hot"
        else:
            drafts = f"model(draft_logits shape {list(np.shape(self.draft_logits))})"
        lp = "off" if self.num_logprobs is None else f"k={self.num_logprobs},{self.logprobs_mode}"
        extra = "" if self.verification == methods.BASELINE.name else f", verification={self.verification}"
        params = self.sampling_params_on()
        if params:
            extra += ", sampling params " + "/".join(params)
        noise = self.noise_carried()
        if noise:
            extra += ", explicit noise " + "/".join(noise)
        return (
            f"SpecBatch({shape}, drafts={drafts}, dtype={self.logits_dtype}, "
            f"logprobs={lp}{extra}, n_r={n}, T={temps})"
        )

    def __repr__(self) -> str:
        return self.summary()


def _head(values: list, total: int | None = None) -> str:
    """`values` as a list literal, cut to the first `SUMMARY_ITEMS` and `... (N in all)`."""
    total = len(values) if total is None else total
    if total <= SUMMARY_ITEMS:
        return str(values[:total])
    shown = ", ".join(str(v) for v in values[:SUMMARY_ITEMS])
    return f"[{shown}, ... ({total} in all)]"


@dataclass(frozen=True, eq=False)
class LogprobsTensors:
    """Per-row logprobs (SPEC section 6)."""

    token_ids: np.ndarray  # int64 [N, k + 1]
    logprobs: np.ndarray  # float32 [N, k + 1]
    ranks: np.ndarray  # int64 [N]
    cu_num_generated_tokens: list | None = None

    @classmethod
    def cat(cls, parts, cu_num_logits) -> "LogprobsTensors":
        """Concatenate chunk results row-wise; `cu_num_logits` is the full batch's."""
        parts = list(parts)
        if not parts:
            raise ValueError("LogprobsTensors.cat: no parts")
        cu = [int(c) for c in np.asarray(cu_num_logits)]
        n = cu[-1] if cu else 0
        return cls(
            token_ids=np.concatenate([p.token_ids for p in parts], axis=0),
            logprobs=np.concatenate([p.logprobs for p in parts], axis=0),
            ranks=np.concatenate([p.ranks for p in parts], axis=0),
            cu_num_generated_tokens=None if n == len(cu) - 1 else cu,
        )

    def fields(self) -> dict:
        return {"token_ids": self.token_ids, "logprobs": self.logprobs, "ranks": self.ranks}


@dataclass(frozen=True, eq=False)
class SamplerOutput:
    """What a sampler returns (SPEC section 5)."""

    sampled: np.ndarray  # int64 [R, K + 1], -1 padded
    num_sampled: np.ndarray  # int32 [R]
    logprobs: LogprobsTensors | None = None
    extras: dict = field(default_factory=dict)  # optional instrumentation, never compared
    accepted_nodes: np.ndarray | None = None  # int32 [R, K] for tree batches (SPEC 4c and 5), -1 padded

    def arrays(self) -> dict:
        """Every compared field as a name -> array mapping (logprobs fields prefixed), including
        `logprobs.cu_num_generated_tokens` (SPEC section 7: part of the compared output; `None`
        as an empty array, which no real `cu` list is)."""
        out = {"sampled": self.sampled, "num_sampled": self.num_sampled}
        if self.accepted_nodes is not None:
            out["accepted_nodes"] = self.accepted_nodes
        if self.logprobs is not None:
            out.update({f"logprobs.{k}": v for k, v in self.logprobs.fields().items()})
            cu = self.logprobs.cu_num_generated_tokens
            out["logprobs.cu_num_generated_tokens"] = np.asarray([] if cu is None else list(cu), dtype=np.int64)
        return out

    def request(self, r: int) -> list[int]:
        """The tokens emitted for request `r`."""
        return [int(t) for t in self.sampled[r, : int(self.num_sampled[r])]]

    def path(self, r: int) -> list[int]:
        """The local node indices of request `r`'s accepted path (SPEC 4c; tree batches only)."""
        m = int(self.num_sampled[r]) - 1
        return [int(c) for c in self.accepted_nodes[r, :m]]
