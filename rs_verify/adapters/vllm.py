"""vLLM's model runner v2 (MRV2) rejection sampler under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.vllm:VllmSampler

`VllmSampler` wraps `rejection_sample` from an installed vllm (`VLLM_MODULE`); no vLLM code
lives in this repository and vllm is imported only when a `VllmSampler` is built. The calling
convention, read from vLLM's source (`vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`)
and passed by parameter name (a parameter the adapter does not know fails at construction):

    rejection_sample(
        target_logits,          # float32 [N, V]: processed logits (SPEC 2), stride(-1) == 1
        draft_logits,           # [S, K, Vd] draft logits (processed or raw, below), or None (one-hot drafts)
        draft_sampled,          # int64 [N]: row j verifies draft_sampled[j + 1] (SpecBatch.draft_token_ids)
        cu_num_logits,          # int32 [R + 1]
        pos,                    # int64 [N]
        idx_mapping,            # int32 [R]
        expanded_idx_mapping,   # int32 [N]: idx_mapping of the request owning each row
        expanded_local_pos,     # int32 [N]: row - cu_num_logits[request]
        temperature,            # float32 [S]
        seed,                   # int64 [S]
        num_speculative_steps,  # int K
        use_block_verification, # bool, optional (vLLM #46781): SPEC 4b for the whole batch
    ) -> (sampled int64 [R, K + 1], num_sampled int32 [R])

What the adapter does in vLLM's place:
- Processed logits (SPEC section 2): vLLM passes `Sampler.apply_sampling_params(logits)`; the
  adapter computes `z = fp32(x) / T` with IEEE division (torch `/`), `T = 1` for greedy states,
  for the target rows, from logits held in the batch's `logits_dtype`. (vLLM's own temperature
  kernel may round differently, and it also applies top-k / top-p / penalties, which the SPEC
  does not have.)
- Draft logits as vLLM's model runner hands them (`draft_logits`): `"processed"` (before vLLM
  PR 50910) divided by `T` the same way, in float32; `"raw"` (from PR 50910 on, which caches
  them before temperature and divides inside the rejection kernels) as the batch holds them,
  in its `logits_dtype`.
- `expanded_idx_mapping` / `expanded_local_pos` as vLLM's `expand_idx_mapping` builds them.
- Every input is a freshly allocated C-contiguous tensor, so empty ones (`K = 0`) have
  ordinary strides too.
- `sampled` past `num_sampled[r]` is whatever vLLM left there (`new_empty`): set to -1 (SPEC 5).
- Block batches (SPEC 4b) pass `use_block_verification=True`, token batches `False`; the adapter
  declares `verification_methods = {"token", "block"}` only when the wrapped function takes that
  parameter (`{"token"}` otherwise, and a block batch is refused).

Declared capabilities (SPEC section 10): no logprobs (`supports_logprobs = False`: vLLM computes
them outside `rejection_sample`, and logprobs made here would test the adapter), no internal
chunking (vLLM chunks in `RejectionSampler._verify_in_chunks`; the suite chunks from outside),
`streams` = `"triton-philox"` (SPEC 3a, before vLLM PR 51367) or `"murmur3"` (3b, from it on),
every draft mode and logits dtype, no sampling parameters (`sampling_params` is empty: vLLM
applies top-k / top-p / min-p in `Sampler.apply_sampling_params`, outside `rejection_sample`;
docs/vllm.md says what gating that would take). On a machine without CUDA the kernels run under
Triton's interpreter (`interpreted = True`).

Which stream family and draft-logit convention the wrapped function has is not in its signature:
building the sampler asks it, with one call on a four-row probe batch whose output differs under
each combination (`rs_verify.adapters.vllm_probe`); `streams=` and `draft_logits=` given to the
constructor are taken as known and not asked.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys

import numpy as np

from ..harness import device as backend
from ..contract import methods
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.streams import StreamFamily, family as family_of, registered
from ..contract.validation import validate as validate_batch
from . import vllm_probe
from .vllm_probe import DRAFT_LOGITS, RAW
import torch

VLLM_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
# The parameters the adapter supplies, by the names vLLM's `rejection_sample` uses.
KNOWN_PARAMETERS = ("target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping",
                    "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed", "num_speculative_steps",
                    "use_block_verification")
BLOCK_PARAMETER = "use_block_verification"


def load_vllm_rejection_sample():
    """vLLM's MRV2 `rejection_sample`, or an ImportError that says what is missing."""
    try:
        module = importlib.import_module(VLLM_MODULE)
    except ImportError as exc:
        raise ImportError(
            f"rs_verify.adapters.vllm needs vLLM with the model runner v2 rejection sampler "
            f"({VLLM_MODULE}.rejection_sample), which could not be imported: {exc}. Install vllm "
            f"(on a GPU runner), or pass rejection_sample= a function with the same calling convention."
        ) from exc
    fn = getattr(module, "rejection_sample", None)
    if fn is None:
        raise ImportError(f"{VLLM_MODULE} has no rejection_sample: this vllm version predates or renamed it")
    return fn


def bind_convention(fn) -> list[str]:
    """The parameters of `fn` the adapter will pass; TypeError if `fn` requires one it does not know."""
    params = inspect.signature(fn).parameters.values()
    unknown = [p.name for p in params if p.name not in KNOWN_PARAMETERS and p.default is inspect.Parameter.empty
               and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if unknown:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} requires parameters {unknown} that the vLLM adapter "
                        f"does not supply (it knows {list(KNOWN_PARAMETERS)}): the calling convention changed")
    return [p.name for p in params if p.name in KNOWN_PARAMETERS]


class VllmSampler:
    """vLLM's MRV2 `rejection_sample` as a sampler (see the module docstring).

    - rejection_sample: the function to wrap (default: imported from vllm when the sampler is built).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()` turns it off).
    - streams: the stream family the function draws (`"triton-philox"`, `"murmur3"`, or another
      family's name or record); None: asked by the probe.
    - draft_logits: `"processed"` (the function takes draft logits divided by the temperature) or
      `"raw"` (before temperature, in the logits' dtype; it divides); None: asked by the probe.
    """

    name = "vllm-mrv2"
    supports_chunking = False
    supports_logprobs = False
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # vLLM applies them before rejection_sample (docs/vllm.md)

    def __init__(self, *, rejection_sample=None, device=None, validate: bool = True,
                 streams: str | StreamFamily | None = None, draft_logits: str | None = None):

        if "triton" not in sys.modules:  # vLLM's kernels are Triton code: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.interpreted = self.device.type != "cuda"
        self.rejection_sample = load_vllm_rejection_sample() if rejection_sample is None else rejection_sample
        self.parameters = bind_convention(self.rejection_sample)
        offered = (methods.BLOCK,) if BLOCK_PARAMETER in self.parameters else ()
        self.verification_methods = frozenset(m.name for m in (methods.TOKEN, *offered))
        self.validate = bool(validate)
        if draft_logits is not None and draft_logits not in DRAFT_LOGITS:
            raise ValueError(f"draft_logits must be one of {list(DRAFT_LOGITS)} or None (asked by the probe), "
                             f"not {draft_logits!r}")
        self.draft_logits = draft_logits  # None while the probe asks (its calls hand drafts raw)
        if streams is None or draft_logits is None:
            found, draft_logits = vllm_probe.detect(self._probe_run, streams=streams, draft_logits=draft_logits)
        else:
            found = family_of(streams)
        self.streams = found.name if registered(found) else found  # the declaration (SPEC section 10)
        self.draft_logits = draft_logits

    def _probe_run(self, batch: SpecBatch) -> SamplerOutput:
        """The wrapped function's output for the probe's batch, its draft logits handed raw."""
        try:
            return self._verify(batch, self.arguments(batch, draft_logits=RAW))
        except Exception as exc:
            raise vllm_probe.ProbeError(
                f"the vLLM adapter's probe call of {self._function_name()} failed ({type(exc).__name__}: {exc}). "
                f"{vllm_probe.OVERRIDE}") from exc

    def unvalidated(self) -> "VllmSampler":
        """The same sampler with validation off (SPEC section 9: the kernels must stay in bounds)."""
        return type(self)(rejection_sample=self.rejection_sample, device=self.device, validate=False,
                          streams=self.streams, draft_logits=self.draft_logits)

    def _function_name(self) -> str:
        return getattr(self.rejection_sample, "__module__", "?") + "." + getattr(self.rejection_sample, "__name__", "?")

    def __repr__(self) -> str:
        streams = self.streams if isinstance(self.streams, str) else self.streams.name
        return (f"VllmSampler(rejection_sample={self._function_name()}, device={str(self.device)!r}, "
                f"validate={self.validate}, streams={streams!r}, draft_logits={self.draft_logits!r})")

    def arguments(self, batch: SpecBatch, *, draft_logits: str | None = None) -> dict:
        """The keyword arguments of the wrapped function for `batch` (device tensors, vLLM's layout);
        `draft_logits`: the convention to hand draft logits in (default: the sampler's)."""

        dev = self.device

        def tensor(a, dtype):
            a = np.array(a, copy=True)
            out = torch.empty(a.shape, dtype=dtype, device=dev)  # ordinary strides, also when empty
            return out.copy_(torch.from_numpy(a)) if a.size else out

        logits_dtype = getattr(torch, batch.logits_dtype, None) if batch.logits_dtype in self.logits_dtypes else None
        if logits_dtype is None:
            raise ValueError(f"logits_dtype: unknown dtype {batch.logits_dtype!r}")
        n, r = batch.num_logits, batch.num_reqs
        cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
        idx_mapping = np.asarray(batch.idx_mapping, dtype=np.int32)
        rows = np.arange(n)
        req = np.clip(np.searchsorted(cu[1:], rows, side="right"), 0, max(r - 1, 0))
        temperature = tensor(batch.temperature, torch.float32)
        t_div = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
        expanded_idx_mapping = idx_mapping[req] if r else np.zeros(n, np.int32)
        row_t = t_div[torch.from_numpy(np.clip(expanded_idx_mapping, 0, len(t_div) - 1).astype(np.int64)).to(dev)]
        target = tensor(batch.target_logits, logits_dtype).float() / row_t.unsqueeze(1)
        draft = None
        if batch.draft_logits is not None:
            draft = tensor(batch.draft_logits, logits_dtype)  # raw: vLLM divides by T in its kernels
            if (draft_logits or self.draft_logits) != RAW:  # processed: the model runner divided
                draft = draft.float()
                s = min(draft.shape[0], len(t_div))
                draft[:s] /= t_div[:s].view(-1, 1, 1)
        values = dict(
            target_logits=target.contiguous(), draft_logits=None if draft is None else draft.contiguous(),
            draft_sampled=tensor(batch.draft_token_ids, torch.int64),
            cu_num_logits=tensor(batch.cu_num_logits, torch.int32), pos=tensor(batch.pos, torch.int64),
            idx_mapping=tensor(idx_mapping, torch.int32),
            expanded_idx_mapping=tensor(expanded_idx_mapping, torch.int32),
            expanded_local_pos=tensor(rows - (cu[req] if r else 0), torch.int32),
            temperature=temperature, seed=tensor(batch.seeds, torch.int64),
            num_speculative_steps=int(batch.num_speculative_steps),
            use_block_verification=batch.verification == methods.BLOCK.name,
        )
        if batch.sampling_params_on():
            raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                             f"(vLLM applies them outside rejection_sample; sampling_params is empty)")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (its "
                             f"rejection_sample has no {BLOCK_PARAMETER} parameter)")
        return {name: values[name] for name in self.parameters}

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self.validate:
            validate_batch(batch)
        if batch.num_reqs == 0:
            return dataclasses.replace(empty_output(batch), logprobs=None)
        return self._verify(batch, self.arguments(batch))

    def _verify(self, batch: SpecBatch, arguments: dict) -> SamplerOutput:
        sampled, num_sampled = self.rejection_sample(**arguments)[:2]
        sampled = sampled.cpu().numpy().astype(np.int64, copy=False)
        num_sampled = num_sampled.cpu().numpy().astype(np.int32, copy=False)
        cols = np.arange(batch.num_speculative_steps + 1)
        sampled = np.where(cols[None, :] < num_sampled[:, None], sampled, -1).astype(np.int64)
        return SamplerOutput(sampled=sampled, num_sampled=num_sampled, logprobs=None)
