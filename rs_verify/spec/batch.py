"""The batch contract (SPEC sections 1, 5 and 6): `SpecBatch`, `SamplerOutput`, `LogprobsTensors`.

This module imports nothing else of the project; NumPy only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

LOGITS_DTYPES = ("float32", "bfloat16", "float16")
LOGPROBS_MODES = ("raw", "processed")

ARRAY_FIELDS = (
    "target_logits",
    "draft_logits",
    "draft_token_ids",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "temperature",
    "seeds",
)


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
        return None if self.draft_logits is None else int(self.draft_logits.shape[2])

    @property
    def effective_vocab_size(self) -> int:
        """`V' = min(V, Vd)` with draft logits, else `V` (SPEC section 1)."""
        vd = self.draft_vocab_size
        return self.vocab_size if vd is None else min(self.vocab_size, vd)

    @property
    def num_draft_tokens(self) -> np.ndarray:
        """`n_r` for every request: rows owned minus the bonus row."""
        return np.diff(np.asarray(self.cu_num_logits, dtype=np.int64)) - 1

    def request_rows(self, r: int) -> range:
        return range(int(self.cu_num_logits[r]), int(self.cu_num_logits[r + 1]))

    def draft_tokens(self, r: int) -> np.ndarray:
        """The `n_r` draft ids verified by request `r` (vLLM layout: row j verifies id j + 1)."""
        lo, hi = int(self.cu_num_logits[r]), int(self.cu_num_logits[r + 1])
        return np.asarray(self.draft_token_ids[lo + 1 : hi])

    def replace(self, **changes) -> "SpecBatch":
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        """A compact one-paragraph description, for failure messages (tolerates malformed batches)."""
        try:
            n = self.num_draft_tokens.tolist()
            temps = [float(self.temperature[int(s)]) for s in self.idx_mapping]
        except (IndexError, TypeError, ValueError):
            n, temps = "?", "?"
        try:
            shape = f"R={self.num_reqs}, K={self.num_speculative_steps}, V={self.vocab_size}, N={self.num_logits}, "
            shape += f"S={self.num_states}"
        except (IndexError, TypeError, AttributeError):
            shape = "malformed"
        if self.draft_logits is None:
            drafts = "one-hot"
        else:
            drafts = f"model(draft_logits shape {list(np.shape(self.draft_logits))})"
        lp = "off" if self.num_logprobs is None else f"k={self.num_logprobs},{self.logprobs_mode}"
        return (
            f"SpecBatch({shape}, drafts={drafts}, dtype={self.logits_dtype}, "
            f"logprobs={lp}, n_r={n}, T={temps})"
        )

    def __repr__(self) -> str:
        return self.summary()


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

    def arrays(self) -> dict:
        """Every compared field as a name -> array mapping (logprobs fields prefixed)."""
        out = {"sampled": self.sampled, "num_sampled": self.num_sampled}
        if self.logprobs is not None:
            out.update({f"logprobs.{k}": v for k, v in self.logprobs.fields().items()})
        return out

    def request(self, r: int) -> list[int]:
        """The tokens emitted for request `r`."""
        return [int(t) for t in self.sampled[r, : int(self.num_sampled[r])]]
