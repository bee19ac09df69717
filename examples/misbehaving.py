"""Misbehaving copies of `TorchSampler`: the gate must turn each into an ordinary, reported failure.

A sampler under test may be broken in ways that are not wrong tokens. Each class below is the
correct `TorchSampler` with one such defect; loaded by `module:attribute`, the plugin and the
CLI run it in a child process (the default `--rs-isolate property`), so a crash or a hang fails
the property that met it and the session goes on.

- `SegfaultSampler`: a null-pointer read (SIGSEGV) on any valid batch that asks for logprobs.
- `LargeBatchSegfaultSampler`: SIGSEGV on a batch of 16 requests or more (the large-batch repeat
  of `determinism_large_batch`; the strategies draw at most 6 at the CPU profiles), correct on
  every other: with `--isolate off` it kills the process that runs that one property.
- `HangingSampler`: never returns on any valid batch that asks for logprobs.
- `InPlaceSampler`: divides `target_logits` by the temperature in place, through
  `torch.from_numpy` (the batch's read-only views do not stop torch).
- `GlobalRngSampler`: with probability 1/2, drawn from NumPy's (or Python's, or torch's) global
  generator, answers from other random streams (every seed with its lowest bit flipped): a valid
  answer, only not reproducible: `numpy_rng`, `python_rng`, `torch_rng`.
- `VagueErrorSampler`: rejects bad batches with a ValueError that lists every field.
- `CudaFaultSampler`: its `unvalidated()` variant raises "CUDA error: an illegal memory access
  was encountered" on a batch validation would reject, as a kernel reading out of bounds does.

Gate one with:  pytest -p rs_verify --rs-sampler=examples.misbehaving:SegfaultSampler
"""

from __future__ import annotations

import ctypes
import random
import time

import numpy as np
import torch

from rs_verify import SamplerOutput, SpecBatch, validate

from .torch_sampler import TorchSampler

__all__ = ["CudaFaultSampler", "GlobalRngSampler", "HangingSampler", "InPlaceSampler", "LargeBatchSegfaultSampler",
           "SegfaultSampler", "VagueErrorSampler", "numpy_rng", "python_rng", "torch_rng"]


class SegfaultSampler(TorchSampler):
    """Dies of SIGSEGV on any valid batch with logprobs (validation still comes first)."""

    name = "misbehaving-segfault"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self.validate:
            validate(batch)
        if batch.num_logprobs is not None:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


class LargeBatchSegfaultSampler(TorchSampler):
    """Dies of SIGSEGV on a batch of 16 requests or more; correct on smaller ones."""

    name = "misbehaving-large-batch-segfault"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if batch.num_reqs >= 16:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


class HangingSampler(TorchSampler):
    """Never returns on any valid batch with logprobs (a deadlocked kernel, say)."""

    name = "misbehaving-hang"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self.validate:
            validate(batch)
        while batch.num_logprobs is not None:
            time.sleep(3600)
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


class InPlaceSampler(TorchSampler):
    """Processes the target logits in place: `x /= T` on the caller's array (not idempotent)."""

    name = "misbehaving-in-place"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self.validate:
            validate(batch)
        cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
        rows_t = np.repeat(np.asarray(batch.temperature)[np.asarray(batch.idx_mapping)], np.diff(cu))
        scale = np.where((rows_t == 0) | (rows_t == 1), 1, rows_t).astype(np.float32)
        logits = torch.from_numpy(batch.target_logits)  # shares memory with the read-only view
        logits.div_(torch.from_numpy(scale)[:, None])
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


class GlobalRngSampler(TorchSampler):
    """With probability 1/2 (global RNG) verifies the batch under other seeds (each seed's lowest bit
    flipped): every answer meets the output rules, two answers to one batch may differ."""

    name = "misbehaving-global-rng"

    def __init__(self, *, source: str = "numpy", **kwargs):
        super().__init__(**kwargs)
        self.source = source
        self.name = f"misbehaving-{source}-rng"

    def _coin(self) -> bool:
        if self.source == "python":
            return random.random() < 0.5
        if self.source == "torch":
            return bool(torch.rand(()) < 0.5)
        return bool(np.random.random() < 0.5)

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self._coin():
            batch = batch.replace(seeds=np.asarray(batch.seeds) ^ np.int64(1))
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


def numpy_rng(**kwargs) -> GlobalRngSampler:
    return GlobalRngSampler(source="numpy", **kwargs)


def python_rng(**kwargs) -> GlobalRngSampler:
    return GlobalRngSampler(source="python", **kwargs)


def torch_rng(**kwargs) -> GlobalRngSampler:
    return GlobalRngSampler(source="torch", **kwargs)


FIELDS = ("target_logits", "draft_logits", "draft_token_ids", "cu_num_logits", "pos", "idx_mapping",
          "temperature", "seeds", "num_speculative_steps", "logits_dtype", "num_logprobs", "logprobs_mode")


class VagueErrorSampler(TorchSampler):
    """Rejects every bad batch, but with a message that names every field and no index."""

    name = "misbehaving-vague-error"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        try:
            validate(batch)
        except ValueError:
            raise ValueError("invalid batch: check " + ", ".join(FIELDS)) from None
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)


class CudaFaultSampler(TorchSampler):
    """Correct with validation; `unvalidated()` faults like a kernel reading out of bounds."""

    name = "misbehaving-cuda-fault"

    def unvalidated(self) -> "CudaFaultSampler":
        return CudaFaultSampler(validate=False, device=str(self.device))

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if not self.validate:
            try:
                validate(batch)
            except ValueError:
                raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                                   "might be asynchronously reported at some other API call") from None
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)
