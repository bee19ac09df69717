"""vLLM's model runner v2 (MRV2) rejection sampler under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.vllm:VllmSampler
    pytest -p rs_verify --rs-sampler=rs_verify.adapters.vllm:VllmFp64Sampler   # use_fp64=True

`VllmSampler` wraps `rejection_sample` from an installed vllm (`vllm_convention.VLLM_MODULE`);
no vLLM code lives in this repository and vllm is imported only when a `VllmSampler` is built,
after the environment a release needs on a CPU is set (`vllm_convention`: `CUDA_VISIBLE_DEVICES`
empty, a `log1p` under Triton's interpreter). Every parameter of the wrapped function is passed by
name under one rule (`vllm_convention.PARAMETERS`): the batch's inputs, the switches the adapter
sets deliberately, the lossy modes it never enables; any other parameter fails at construction.
The calling convention, read from vLLM 0.33.0's and 0.34.0's
`vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`:

    rejection_sample(
        target_logits,          # float32 [N, V]: processed logits (SPEC 2), stride(-1) == 1
        draft_logits,           # [S, K, Vd] draft logits, or None (one-hot drafts); before 0.34.0
        draft_logits_cache,     # from 0.34.0 on: a DraftLogitsCache holding them (replicated rows)
        draft_sampled,          # int64 [N]: row j verifies draft_sampled[j + 1] (SpecBatch.draft_token_ids)
        cu_num_logits,          # int32 [R + 1]
        pos,                    # int64 [N]
        idx_mapping,            # int32 [R]
        expanded_idx_mapping,   # int32 [N]: idx_mapping of the request owning each row
        expanded_local_pos,     # int32 [N]: row - cu_num_logits[request]
        temperature,            # float32 [S]
        seed,                   # int64 [S]
        num_speculative_steps,  # int K
        use_fp64,               # optional: the "murmur3-fp64" noise (SPEC 3b), from the declared family
        use_block_verification, # optional (vLLM #46781): SPEC 4b for the whole batch
        skip_masked_vocab_blocks,  # optional (0.34.0): the adapter's option of that name
        synthetic_conditional_rates, fly_window_size, contexts, watermarking, watermark_key,  # lossy: never
    ) -> (sampled int64 [R, K + 1], num_sampled int32 [R])

What the adapter does in vLLM's place:
- Processed logits (SPEC section 2): vLLM passes `Sampler.apply_sampling_params(logits)`; the
  adapter computes `z = fp32(x) / T` with IEEE division (torch `/`), `T = 1` for greedy states,
  for the target rows, from logits held in the batch's `logits_dtype`.
- Draft logits as vLLM's model runner hands them: `"processed"` (before vLLM PR 50910) divided
  by `T` the same way, in float32; `"raw"` (from PR 50910 on) as the batch holds them.
- `expanded_idx_mapping` / `expanded_local_pos` as vLLM's `expand_idx_mapping` builds them.
- Every input is a freshly allocated C-contiguous tensor, so empty ones (`K = 0`) have
  ordinary strides too.
- `sampled` past `num_sampled[r]` is whatever vLLM left there (`new_empty`): set to -1 (SPEC 5).
- Without validation (`unvalidated()`) the batch's layout is still checked
  (`contract.validation.check_layout`): the adapter's own code indexes by `cu_num_logits`,
  `idx_mapping` and the shapes.

Declared capabilities (SPEC section 10): no logprobs and no internal chunking (vLLM computes
both in `RejectionSampler`, outside `rejection_sample`: `rs_verify.adapters.vllm_chunks` drives
that loop), `streams` = `"triton-philox"` (SPEC 3a, before vLLM PR 51367), `"murmur3"` (3b, from
it on) or `"murmur3-fp64"` (`use_fp64=True`), `block_seed` = `"plain"` or `"step"` (vLLM 0.33.0
on), every draft mode and logits dtype, no sampling parameters, the deviations of SPEC 11 vLLM
MRV2 carries (`DEVIATIONS`: `empty_residual_token0` with empty residuals decided in float32 log
space, as its resample kernel keeps them). On a machine without CUDA the kernels run under Triton's interpreter
(`interpreted = True`).

Which stream family, draft-logit convention and block seed the wrapped function has is not in
its signature: building the sampler asks it (`rs_verify.adapters.vllm_probe`); `streams=`,
`draft_logits=` and `block_seed=` given to the constructor are taken as known and not asked.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from ..harness import device as backend
from ..contract import methods
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.known_deviations import EMPTY_RESIDUAL_TOKEN0_LOG
from ..contract.streams import StreamFamily, family as family_of, registered
from ..contract.validation import check_layout, validate as validate_batch
from . import vllm_convention, vllm_probe
from .vllm_probe import BLOCK_SEEDS, DRAFT_LOGITS, RAW
import torch

FP64 = "murmur3-fp64"  # the stream family of use_fp64=True (SPEC 3b)
# SPEC 11, measured on vLLM 0.33.0 and 0.34.0 (docs/vllm.md): token 0 from an empty residual, empty as
# `_resample_kernel` sees it: in float32 log space (`ratio = exp(log q - log P p) < 1` nowhere), so a
# residual whose probabilities lie below float32's range is sampled, not emptied (every MRV2 release,
# 0.29.0 to 0.34.0); with block verification, a NaN prefix ratio reset to 1 by min(NaN, 0) = 0.
DEVIATIONS = frozenset({EMPTY_RESIDUAL_TOKEN0_LOG})
BLOCK_DEVIATIONS = frozenset({"block_nan_prefix_resets"})
# SPEC 10's logit_bound, from the float32 arithmetic of vLLM's kernels (rejection_sampler_utils.py,
# sample/gumbel.py) against SPEC 8's tolerance, eps = 2e-4 times L = max(1, |log p|, |log q|, |G|) >= 1:
# (a) bonus and padded rows: `z + G` (gumbel_noised_argmax on the unnormalised z, float32). Rounding is
#     monotone, so a token loses to one with a lower score only when both round to one float32 value:
#     the reference's gap is then below the spacing at |z + G|: 2**-13 = 1.2e-4 in [1024, 2048), within
#     eps; 2**-12 = 2.4e-4 in [2048, 4096), beyond eps where |G| <= 1 (L = 1). With |z| <= 2046, |z + G|
#     reaches 2048 only with |G| >= 2, where eps * L >= 4e-4 covers 2.4e-4 (|G| <= 17 keeps it below 4096).
# (b) acceptance, residual and block prefix: `log p = z - (max + log S)` (float32; the same for q): the sum
#     rounds to half the spacing at lse, 6.1e-5 below 2048, so p and q together stay within 1.2e-4 < eps;
#     lse reaches 2048 with |z| <= 2046 only when lse - max >= 2, i.e. |log p| >= 2 and eps * L >= 4e-4
#     >= 2 * 1.2e-4. Near 3.4e38 the same sum drops log S altogether: log p = 0 (the chunk loop's defect).
# (c) use_fp64 (VllmFp64Sampler): its Gumbel-max runs in float64, whose spacing passes eps only at 2**40,
#     but (b) is float32 in every mode: the same bound.
# So 2**11 - 2. It is below 1e4, which real logits reach (T = 1e-3, logits of 10): the bound is forced by
# the kernels, and the lower precision above it is a finding against the release, not hidden
# (docs/releases.md: a tie at z = 2048 decided against the reference by a noise gap of 2.2e-4).
LOGIT_BOUND = 2046.0


class VllmSampler:
    """vLLM's MRV2 `rejection_sample` as a sampler (see the module docstring).

    - rejection_sample: the function to wrap (default: imported from vllm when the sampler is built).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()`: the layout only).
    - streams: the stream family the function draws (`"triton-philox"`, `"murmur3"`,
      `"murmur3-fp64"`, or another family's name or record); None: asked by the probe.
    - use_fp64: pass `use_fp64=True` (vLLM's float64 noise), declaring `streams = "murmur3-fp64"`.
    - draft_logits: `"processed"` or `"raw"` (vllm_probe); None: asked by the probe.
    - block_seed: `"plain"` or `"step"` (`seed ^ (i << 32)`, vLLM 0.33.0 on); None: asked by the
      probe where the function verifies blocks.
    - skip_masked_vocab_blocks: the value of vLLM 0.34.0's parameter of that name (vLLM sets it
      when a request may mask logits: top-k / top-p); refused where the function lacks it.
    - allow_defaults: optional parameters the adapter does not know, named harmless at their
      defaults by the user (vllm_convention).
    - deviations: the declared deviations (SPEC 11); None: those the releases carry, as measured
      (`DEVIATIONS`, and `BLOCK_DEVIATIONS` where the function verifies blocks).
    - options: a lossy mode (`fly_window_size=`, ...) is refused by name (vllm_convention.LOSSY).
    """

    name = "vllm-mrv2"
    supports_chunking = False
    supports_logprobs = False
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # vLLM applies them before rejection_sample (docs/vllm.md)
    logit_bound = LOGIT_BOUND  # SPEC 10: float32 kernels lose SPEC 8's precision from |z| = 2048 (above)

    def __init__(self, *, rejection_sample=None, device=None, validate: bool = True,
                 streams: str | StreamFamily | None = None, draft_logits: str | None = None,
                 block_seed: str | None = None, use_fp64: bool = False, skip_masked_vocab_blocks: bool = False,
                 allow_defaults=(), deviations=None, **options):
        vllm_convention.refuse_lossy(options)
        if "triton" not in sys.modules:  # vLLM's kernels are Triton code: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.interpreted = self.device.type != "cuda"
        self.rejection_sample = (vllm_convention.load_rejection_sample(self.interpreted)
                                 if rejection_sample is None else rejection_sample)
        self.allow_defaults = tuple(allow_defaults)
        self.parameters = vllm_convention.bind(self.rejection_sample, self.allow_defaults)
        offered = (methods.BLOCK,) if "use_block_verification" in self.parameters else ()
        self.verification_methods = frozenset(m.name for m in (methods.TOKEN, *offered))
        # SPEC 11: what the releases carry, as measured (docs/vllm.md); `deviations=` replaces it for a
        # function known to differ (a mended build, or a fake of the calling convention without the defects)
        self.deviations = (DEVIATIONS | (BLOCK_DEVIATIONS if offered else frozenset()) if deviations is None
                           else frozenset(deviations))
        self.validate = bool(validate)
        self.use_fp64 = bool(use_fp64) or (streams is not None and _name(streams) == FP64)
        if self.use_fp64 and streams is not None and _name(streams) != FP64:
            raise ValueError(f"use_fp64=True draws the {FP64!r} stream family, not {_name(streams)!r}")
        for flag, on in (("use_fp64", self.use_fp64), ("skip_masked_vocab_blocks", skip_masked_vocab_blocks)):
            if on and flag not in self.parameters:
                raise ValueError(f"{flag}: {self._function_name()} has no parameter {flag} (this vLLM predates it)")
        self.skip_masked_vocab_blocks = bool(skip_masked_vocab_blocks)
        streams = FP64 if self.use_fp64 else streams
        if draft_logits is not None and draft_logits not in DRAFT_LOGITS:
            raise ValueError(f"draft_logits must be one of {list(DRAFT_LOGITS)} or None (asked by the probe), "
                             f"not {draft_logits!r}")
        if block_seed is not None and block_seed not in BLOCK_SEEDS:
            raise ValueError(f"block_seed must be one of {list(BLOCK_SEEDS)} or None (asked by the probe), "
                             f"not {block_seed!r}")
        self.draft_logits = draft_logits  # None while the probe asks (its calls hand drafts raw)
        if streams is None or draft_logits is None:
            found, draft_logits = vllm_probe.detect(self._probe_run, streams=streams, draft_logits=draft_logits)
        else:
            found = family_of(streams)
        self.streams = found.name if registered(found) else found  # the declaration (SPEC section 10)
        self.draft_logits = draft_logits
        if block_seed is None and offered:
            block_seed = vllm_probe.detect_block_seed(self._probe_run)
        self.block_seed = block_seed or "plain"
        # what the adapter read from the release (the release gate's matrix shows it with the declarations)
        self.detected = {"draft_logits": self.draft_logits, "draft_logits_in": "draft_logits_cache" if
                         "draft_logits_cache" in self.parameters else "draft_logits",
                         "optional": ",".join(p for p in self.parameters if p in vllm_convention.GATED) or "none"}

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
                          streams=self.streams, draft_logits=self.draft_logits, block_seed=self.block_seed,
                          skip_masked_vocab_blocks=self.skip_masked_vocab_blocks, allow_defaults=self.allow_defaults)

    def _function_name(self) -> str:
        return getattr(self.rejection_sample, "__module__", "?") + "." + getattr(self.rejection_sample, "__name__", "?")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rejection_sample={self._function_name()}, device={str(self.device)!r}, "
                f"validate={self.validate}, streams={_name(self.streams)!r}, draft_logits={self.draft_logits!r}, "
                f"block_seed={self.block_seed!r})")

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
            use_fp64=self.use_fp64, skip_masked_vocab_blocks=self.skip_masked_vocab_blocks,
        )
        if "draft_logits_cache" in self.parameters:  # vLLM 0.34.0 on
            values["draft_logits_cache"] = vllm_convention.draft_logits_cache(self.rejection_sample,
                                                                              values["draft_logits"])
        if batch.sampling_params_on():
            raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                             f"(vLLM applies them outside rejection_sample; sampling_params is empty)")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (its "
                             f"rejection_sample has no use_block_verification parameter)")
        return {name: values[name] for name in self.parameters}

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate_batch if self.validate else check_layout)(batch)
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


def _name(streams) -> str:
    return streams if isinstance(streams, str) else streams.name


def VllmFp64Sampler(**kwargs) -> VllmSampler:
    """`VllmSampler(use_fp64=True, ...)`: vLLM's float64 noise, the `"murmur3-fp64"` family (SPEC 3b)."""
    return VllmSampler(use_fp64=True, **kwargs)
