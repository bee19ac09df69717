"""vLLM MRV2's own chunk loop (`RejectionSampler._verify_in_chunks`) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.vllm_chunks:VllmChunkedSampler

Where `rs_verify.adapters.vllm` wraps `rejection_sample` alone, `VllmChunkedSampler` drives the
loop vLLM 0.33.0 and 0.34.0 run around it (`vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`):
`_iter_request_chunks` splits the batch into whole requests of at most `max_chunk_logits` rows
(the argument the suite passes is the one vLLM's loop takes; None: vLLM's own
`get_max_chunk_logits(V)`, from `MAX_CHUNK_BYTES`), `Sampler.apply_sampling_params` (vLLM's own
method: its temperature kernel) processes each chunk's raw logits, `rejection_sample` verifies
it, `_get_logprobs_tensors` computes its logprobs (vLLM's `compute_topk_scores`, from the
processed or the raw logits by `logprobs_mode`) and `LogprobsTensors.cat(...,
cu_num_generated_tokens=...)` joins them. So the suite's chunking properties run on vLLM's
chunker (`supports_chunking = True`) and its logprobs on vLLM's (`supports_logprobs = True`).

The real vLLM objects it builds: `RejectionSampler` (its constructor), `SamplingStates` (filled by
its `add_request`, one per batch state, then `apply_staged_writes`), `DraftLogitsCache` (0.34.0).
Model-runner state is stood in for, because building vLLM's `Sampler`, `InputBatch` and
`SpeculativeConfig` takes a whole `VllmConfig` with a model behind it:
- `_SamplerState`: the fields of `Sampler` the loop reads, with no logits processor (the SPEC
  has no penalties, bias or bad words), no thinking budget, no trace replay, no sampling mask,
  and `apply_sampling_params` bound from vLLM's `Sampler` class;
- the request parameters handed to `SamplingStates.add_request`: temperature, seed and the
  logprob count of each state, top-k / top-p / min-p off (a `SimpleNamespace` with the fields of
  `SamplingParams`: vLLM's own validation refuses seeds the SPEC allows);
- on a machine without an accelerator, the `UvaBackedTensor` that `SamplingStates` allocates
  (pinned host memory, which needs one) is a host tensor that is its own device view;
- the input batch (`SimpleNamespace`): the index arrays `rs_verify.adapters.vllm` builds,
  with their NumPy copies, and `seq_lens_cpu_upper_bound` (read only by logits processors);
- the speculative config (`SimpleNamespace`): `num_speculative_tokens`, method `"block"` for
  block batches, else `"strict"`; adaptive verification off.
Stream family, draft-logit convention and block seed are the inner `VllmSampler`'s probe's.
"""

from __future__ import annotations

import importlib
import inspect
import types

import numpy as np
import torch

from ..contract import methods
from ..contract.batch import LogprobsTensors, SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate as validate_batch
from . import vllm_convention
from .vllm import LOGIT_BOUND, VllmSampler

__all__ = ["REJECTION_SAMPLER_MODULE", "VllmChunkedSampler"]

REJECTION_SAMPLER_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
SAMPLER_MODULE = "vllm.v1.worker.gpu.sample.sampler"
STATES_MODULE = "vllm.v1.worker.gpu.sample.states"
LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}


class _HostTensor:
    """vLLM's `UvaBackedTensor` on a machine without an accelerator, where pinned memory does not
    exist: the host tensor is its own device view (`.cpu`, `.np`, `.gpu`, `copy_to_uva`)."""

    def __init__(self, size, dtype, max_concurrency=None):
        self.dtype = dtype
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu

    def copy_to_uva(self, n=None):
        return self.gpu


class _Inert:
    """A pipeline stage the SPEC does not have (logit bias, penalties, bad words, the thinking
    budget): applies nothing, whichever arguments a release calls it with."""

    def apply(self, logits, *args, **kwargs):
        return logits

    apply_logit_bias = apply_penalties = apply_bad_words = apply


class _SamplerState:
    """The fields of vLLM's `Sampler` that `RejectionSampler` reads (module docstring)."""

    def __init__(self, states, needs_processing: np.ndarray, logprobs_mode: str, use_fp64: bool, apply):
        self.sampling_states = states
        self.needs_logits_processing = needs_processing
        self.logprobs_mode = logprobs_mode
        self.use_fp64_gumbel = use_fp64
        self.logits_processors = []
        self.thinking_budget_state = _Inert()
        self.logit_bias_state = self.penalties_state = self.bad_words_state = _Inert()  # read before 0.32.0
        self.trace_replay_state = None
        self.return_sampling_mask = False
        self.compute_nans = False
        self.may_mask_logits = np.zeros(len(needs_processing), bool)  # no top-k / top-p: nothing masked
        self.logprob_token_ids_state = None
        self._apply = apply

    def apply_sampling_params(self, *args, **kwargs):
        return self._apply(self, *args, **kwargs)

    def get_logprobs_dims(self, idx_mapping_np, include_token_ids: bool = True):
        """vLLM 0.34.0's `(num_logprobs, max_per_req_token_ids)`, or None (no custom token ids here)."""
        k = self.sampling_states.max_num_logprobs(idx_mapping_np)
        return None if k < 0 else (k, 0)


class VllmChunkedSampler:
    """vLLM's `RejectionSampler` chunk loop as a sampler (module docstring); options as `VllmSampler`'s."""

    name = "vllm-mrv2-chunks"
    supports_chunking = True
    supports_logprobs = True
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()
    logit_bound = LOGIT_BOUND  # SPEC 10: the wrapped rejection_sample's (vllm.py); its logprobs z - lse alike

    def __init__(self, *, validate: bool = True, **options):
        self.inner = VllmSampler(validate=validate, **options)
        self.validate = self.inner.validate
        self.device, self.interpreted = self.inner.device, self.inner.interpreted
        for attr in ("streams", "block_seed", "deviations", "verification_methods", "detected"):
            setattr(self, attr, getattr(self.inner, attr))
        self._options = {k: getattr(self.inner, k) for k in ("streams", "draft_logits", "block_seed")}
        self.loop = importlib.import_module(REJECTION_SAMPLER_MODULE)
        states_module = importlib.import_module(STATES_MODULE)
        if self.interpreted:  # no pinned memory without an accelerator: module docstring
            states_module.UvaBackedTensor = _HostTensor
        self.states_cls = states_module.SamplingStates
        self.apply = importlib.import_module(SAMPLER_MODULE).Sampler.apply_sampling_params
        params = inspect.signature(self.loop.RejectionSampler._verify_in_chunks).parameters
        self.logprobs_dims = "logprobs_dims" in params  # 0.34.0; 0.33.0 takes max_num_logprobs
        if self.interpreted and vllm_convention.interpreter_masks_wrong("bfloat16"):
            # The interpreter's masked bfloat16 loads are wrong (vllm_convention; docs/vllm.md): vLLM's
            # logprob ranks from bfloat16 logits would fail on the interpreter, not on vLLM. On CUDA, all three.
            self.logits_dtypes = self.logits_dtypes - {"bfloat16"}

    def unvalidated(self) -> "VllmChunkedSampler":
        return type(self)(validate=False, **self._options)

    def __repr__(self) -> str:
        return f"VllmChunkedSampler({self.loop.__name__}._verify_in_chunks, inner={self.inner!r})"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate_batch if self.validate else check_layout)(batch)
        if batch.num_reqs == 0:
            return empty_output(batch)
        args = self.inner.arguments(batch)
        r, k, vocab = batch.num_reqs, batch.num_speculative_steps, batch.vocab_size
        states, needs = self._states(batch)
        sampler = _SamplerState(states, needs, LOGPROBS_MODES[batch.logprobs_mode], self.inner.use_fp64, self.apply)
        spec = types.SimpleNamespace(num_speculative_tokens=k, enable_adaptive_verification=False,
                                     rejection_sample_method="block" if batch.verification == methods.BLOCK.name
                                     else "strict", fly_entropy_threshold=0.3, fly_entropy_top_k=3,
                                     synthetic_acceptance_rates=None, fly_window_size=None)
        rs = self.loop.RejectionSampler(sampler, spec, self.device)
        cu_np = np.asarray(batch.cu_num_logits, np.int32)
        idx_np = np.asarray(batch.idx_mapping, np.int32)
        input_batch = types.SimpleNamespace(
            num_reqs=r, cu_num_logits=args["cu_num_logits"], cu_num_logits_np=cu_np.copy(),
            idx_mapping=args["idx_mapping"], idx_mapping_np=idx_np.copy(),
            expanded_idx_mapping=args["expanded_idx_mapping"], expanded_local_pos=args["expanded_local_pos"],
            seq_lens_cpu_upper_bound=torch.zeros(r, dtype=torch.int32))
        x = np.array(batch.target_logits, copy=True)
        logits = torch.from_numpy(x.astype(np.float32)).to(getattr(torch, batch.logits_dtype)).to(self.device)
        drafts = args.get("draft_logits_cache", args.get("draft_logits"))
        cap = self.loop.get_max_chunk_logits(vocab) if max_chunk_logits is None else int(max_chunk_logits)
        wanted = states.max_num_logprobs(idx_np)
        last = sampler.get_logprobs_dims(idx_np) if self.logprobs_dims else wanted
        sampled, num_sampled, logprobs = rs._verify_in_chunks(logits, input_batch, drafts, args["draft_sampled"],
                                                              args["pos"], cap, last)[:3]
        num_sampled = num_sampled.cpu().numpy().astype(np.int32)
        cols = np.arange(k + 1)
        sampled = np.where(cols[None, :] < num_sampled[:, None], sampled.cpu().numpy(), -1).astype(np.int64)
        return SamplerOutput(sampled=sampled, num_sampled=num_sampled, logprobs=_logprobs(logprobs, batch))

    def _states(self, batch: SpecBatch):
        """vLLM's `SamplingStates` holding each batch state's temperature, seed and logprob count."""
        s = len(batch.temperature)
        states = self.states_cls(s, batch.vocab_size)
        needs = np.zeros(s, bool)
        k = batch.num_logprobs
        for i, (t, seed) in enumerate(zip(np.asarray(batch.temperature), np.asarray(batch.seeds))):
            params = types.SimpleNamespace(temperature=float(t), top_k=0, top_p=1.0, min_p=0.0, seed=int(seed),
                                           logprobs=k)
            needs[i] = _needs_processing(states, i, states.add_request(i, params))
        states.apply_staged_writes()
        return states, needs


def _needs_processing(states, i: int, said) -> bool:
    """Whether vLLM processes state `i`'s logits at all: what `SamplingStates.add_request` returns
    from 0.32.0 on; before it (0.29.0 to 0.31.0) `Sampler.add_request` decided, from the states'
    temperature, min-p, top-k and top-p (its logit bias, penalties, bad words and thinking budget
    are off here). Without it a temperature other than 1 would never reach the target logits."""
    if said is not None:
        return bool(said)
    t = states.temperature.np[i]
    return bool((t != 0.0 and t != 1.0) or states.min_p.np[i] != 0.0 or states.top_k.np[i] != states.vocab_size
                or states.top_p.np[i] != 1.0)


def _logprobs(found, batch: SpecBatch) -> LogprobsTensors | None:
    """vLLM's `LogprobsTensors` as the SPEC's (section 6), or None when the batch asks none."""
    if batch.num_logprobs is None:
        return None
    cu = found.cu_num_generated_tokens
    return LogprobsTensors(token_ids=found.logprob_token_ids.cpu().numpy().astype(np.int64),
                           logprobs=found.logprobs.cpu().numpy().astype(np.float32),
                           ranks=found.selected_token_ranks.cpu().numpy().astype(np.int64),
                           cu_num_generated_tokens=None if cu is None else [int(c) for c in cu])


