"""`TritonSampler`: the production Triton sampler (`sampler.rejection_sample`) under SPEC 10's protocol.

It takes a `SpecBatch` on the host, validates it (or, `validate=False`, checks only what memory
safety needs: SPEC 9), moves it to its device (CUDA, or CPU tensors through Triton's
interpreter), verifies it chunk by chunk and returns host NumPy arrays. It declares its stream
family (`streams`, SPEC 3) and, for the explicit family, how it resamples (`resample`, SPEC 4).
"""

from __future__ import annotations

import numpy as np
import torch

from ..contract import methods
from ..contract.batch import TREE_DRAFT_KINDS, TREE_UNIFORMS, LogprobsTensors, SamplerOutput, SpecBatch
from ..contract.chunking import empty_output, max_chunk_logits as default_max_chunk_logits
from ..contract.explicit import EXPLICIT, GUMBEL
from ..contract.streams import PLAIN, STEP
from ..contract.validation import check_structure, validate as validate_batch
from .sampler import TORCH_DTYPES, _check_block_rows, _check_block_v, default_device, rejection_sample
from .shapes import PER_CHILD, PER_NODE, check_noise
from .streams import DEFAULT_STREAMS, resample_method, stream_family


class TritonSampler:
    """The production sampler under the SPEC section 10 protocol.

    - cap_bytes: bytes of FP32 processed logits one chunk may hold (`max_chunk_logits(V, cap_bytes)`).
    - block_v: vocabulary block of the kernels (a power of two >= 16; default 1024).
    - block_rows: rows (or requests) per program of the tiled kernels (a power of two; default 1 on CUDA,
      INTERPRETED_BLOCK_ROWS through the interpreter).
    - validate: run `rs_verify.contract.validation.validate` before any device work.
    - device: torch device; None picks "cuda" when available, else "cpu" (the Triton interpreter).
    - streams: the noise's stream family, declared as `self.streams`: "triton-philox", "murmur3",
      "murmur3-fp64" or "explicit" (SPEC 3; explicit: the batch's `accept_uniforms` and `resample_gumbel` or
      `resample_uniforms`, and a batch without the ones read is refused, SPEC 9).
    - block_seed: how block step `i` keys its acceptance uniform, declared as `self.block_seed` (SPEC 3b
      and 10): "plain" (the default) or, for murmur3 and murmur3-fp64, "step" (`seed ^ (i << 32)`,
      vLLM 0.33.0 on).
    - resample: the explicit family's resampling, declared as `self.resample` (SPEC 4 and 10):
      "gumbel" (the default: Gumbel-max over `resample_gumbel`) or "inverse_cdf" (over
      `resample_uniforms`); any other family resamples by Gumbel-max and takes no `resample=`.
    - tree_uniforms: the explicit family verifies trees too (SPEC 4c: "tree" among its
      `verification_methods`): "per_child" (the default; `tree_drafts` one-hot, iid and without
      replacement) or "per_node" (one coin per parent node; one-hot trees only), declared as
      `self.tree_uniforms`; any other family verifies no trees and takes no `tree_uniforms=`.

    Reports `extras["max_buffer_rows"]` (rows of the FP32 processed-logits buffer
    allocated, 0 without logprobs) and `extras["num_chunks"]`.
    """

    name = "triton"
    supports_chunking = True
    streams = DEFAULT_STREAMS  # SPEC 3a; an instance declares its own (`streams=`)
    resample = GUMBEL  # SPEC 4; an explicit sampler's instance declares its own (`resample=`)
    block_seed = PLAIN  # SPEC 3b; an instance declares its own (`block_seed=`)
    memory_stats = True  # extras["max_buffer_rows"] is reported
    verification_methods = frozenset({methods.TOKEN.name, methods.BLOCK.name})
    sampling_params = frozenset({"min_p", "top_k", "top_p"})

    def __init__(self, *, cap_bytes: int = 2**30, block_v: int | None = None, validate: bool = True,
                 device=None, block_rows: int | None = None, streams: str = DEFAULT_STREAMS,
                 resample: str | None = None, block_seed: str = PLAIN, tree_uniforms: str | None = None):
        family = stream_family(streams)
        if block_seed not in family.block_seeds:
            raise ValueError(f"block_seed: the stream family {family.name!r} draws the block seeds "
                             f"{list(family.block_seeds)} (SPEC 3b and 10), not {block_seed!r}")
        self.block_seed = block_seed
        if resample is not None and family is not EXPLICIT:
            raise ValueError(f"resample: only the explicit stream family chooses how it resamples (SPEC 4), "
                             f"not {family.name!r}")
        if tree_uniforms is not None and (family is not EXPLICIT or tree_uniforms not in TREE_UNIFORMS):
            raise ValueError(f"tree_uniforms: {tree_uniforms!r}; the explicit stream family verifies trees with one "
                             f"of {list(TREE_UNIFORMS)} (SPEC 4c), {family.name!r} none")
        if family is EXPLICIT:  # SPEC 4c: tree batches carry the explicit noise
            self.verification_methods = type(self).verification_methods | {methods.TREE.name}
            self.tree_uniforms = tree_uniforms or PER_CHILD
            self.tree_drafts = frozenset({"one_hot"} if self.tree_uniforms == PER_NODE else TREE_DRAFT_KINDS)
        self.streams = family.name
        self.resample = resample_method(family, GUMBEL if resample is None else resample)
        self.cap_bytes = int(cap_bytes)
        self.block_v = _check_block_v(block_v)
        self.block_rows = _check_block_rows(block_rows)
        self.validate = bool(validate)
        self.device = torch.device(default_device() if device is None else device)
        self.interpreted = self.device.type != "cuda"

    def unvalidated(self) -> "TritonSampler":
        """The same sampler with validation off (SPEC section 9: still memory-safe)."""
        return TritonSampler(cap_bytes=self.cap_bytes, block_v=self.block_v, validate=False, device=self.device,
                             block_rows=self.block_rows, streams=self.streams, resample=self._resample_kwarg(),
                             block_seed=self.block_seed, tree_uniforms=self._tree_kwarg())

    def _tree_kwarg(self) -> str | None:
        return self.tree_uniforms if self.streams == EXPLICIT.name else None

    def _resample_kwarg(self) -> str | None:
        return self.resample if self.streams == EXPLICIT.name else None

    def __repr__(self) -> str:
        return (f"TritonSampler(cap_bytes={self.cap_bytes}, block_v={self.block_v}, block_rows={self.block_rows}, "
                f"validate={self.validate}, device={str(self.device)!r}, streams={self.streams!r}"
                + ("" if self._resample_kwarg() is None else f", resample={self.resample!r}")
                + ("" if self.block_seed == PLAIN else f", block_seed={self.block_seed!r}")
                + ("" if self._tree_kwarg() in (None, PER_CHILD) else f", tree_uniforms={self.tree_uniforms!r}") + ")")

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        # Without validation the values go unchecked (the kernels clamp every index), but a batch
        # whose arrays have the wrong dtypes or shapes cannot even be sized: refused up front.
        (validate_batch if self.validate else check_structure)(batch)
        explicit = self.streams == EXPLICIT.name
        noise = check_noise(explicit, self.resample, batch.num_logits, batch.num_reqs, batch.effective_vocab_size,
                            batch.accept_uniforms, batch.resample_gumbel, batch.resample_uniforms)
        v = batch.vocab_size
        cap = default_max_chunk_logits(v, self.cap_bytes) if max_chunk_logits is None else int(max_chunk_logits)
        if batch.num_reqs == 0:
            out = empty_output(batch)
            out.extras.update(max_buffer_rows=0, num_chunks=0)
            return out
        dtype = TORCH_DTYPES.get(batch.logits_dtype)
        if dtype is None:
            raise ValueError(f"logits_dtype: unknown dtype {batch.logits_dtype!r}")
        dev = self.device

        def t(a, dt=None):
            x = torch.from_numpy(np.array(a, copy=True))
            return x.to(device=dev, dtype=dt) if dt is not None else x.to(dev)

        # A parameter that is off for every state is not sent: such a batch takes the unmasked path.
        params = {name: t(a, dt) for name, dt, off in (("top_k", torch.int32, 0), ("top_p", torch.float32, 1),
                                                       ("min_p", torch.float32, 0))
                  if (a := getattr(batch, name)) is not None and (np.asarray(a) != off).any()}
        info = {}
        tree = {}
        if batch.tree:  # SPEC 4c
            nd = batch.node_draft_logits
            tree = dict(tree_parent=t(batch.tree_parent, torch.int32), node_draft_logits=None if nd is None else t(nd, dtype),
                        tree_drafts=batch.tree_drafts, tree_uniforms=getattr(self, "tree_uniforms", PER_CHILD),
                        accepted_nodes=torch.empty((batch.num_reqs, batch.num_speculative_steps), dtype=torch.int32,
                                                   device=dev))
        sampled, num_sampled, lp = rejection_sample(
            t(batch.target_logits, dtype),
            None if batch.draft_logits is None else t(batch.draft_logits, dtype),
            t(batch.draft_token_ids, torch.int64),
            t(batch.cu_num_logits, torch.int32),
            t(batch.pos, torch.int64),
            t(batch.idx_mapping, torch.int32),
            t(batch.temperature, torch.float32),
            t(batch.seeds, torch.int64),
            num_speculative_steps=batch.num_speculative_steps,
            max_chunk_logits=cap,
            num_logprobs=batch.num_logprobs,
            logprobs_mode=batch.logprobs_mode,
            block_v=self.block_v,
            block_rows=self.block_rows,
            cu_num_logits_host=np.asarray(batch.cu_num_logits),
            info=info,
            verification=batch.verification, streams=self.streams,
            accept_uniforms=None if noise[0] is None else t(noise[0], torch.float64),
            resample_gumbel=None if noise[1] is None else t(noise[1], torch.float64),
            resample_uniforms=None if noise[2] is None else t(noise[2], torch.float64),
            resample=self.resample,
            block_seed=self.block_seed,
            **params, **tree,
        )
        logprobs = None
        if lp is not None:
            cu = [int(c) for c in np.asarray(batch.cu_num_logits)]
            logprobs = LogprobsTensors(
                token_ids=lp[0].cpu().numpy(),
                logprobs=lp[1].cpu().numpy(),
                ranks=lp[2].cpu().numpy(),
                cu_num_generated_tokens=None if batch.num_logits == batch.num_reqs else cu,
            )
        return SamplerOutput(
            sampled=sampled.cpu().numpy(),
            num_sampled=num_sampled.cpu().numpy(),
            logprobs=logprobs,
            accepted_nodes=tree["accepted_nodes"].cpu().numpy() if tree else None,
            extras=info,
        )


# The built-in names of the sampler's other families (rs_verify.harness.samplers.BUILTIN): factories,
# so that the CLI and the plugin gate them by name like the default `triton`.
def murmur3_sampler() -> TritonSampler:
    """`TritonSampler(streams="murmur3")` (SPEC 3b): built-in name `triton-murmur3`."""
    return TritonSampler(streams="murmur3")


def murmur3_step_sampler() -> TritonSampler:
    """`TritonSampler(streams="murmur3", block_seed="step")` (SPEC 3b, the step-mixed block seed of vLLM
    0.33.0 on): built-in name `triton-murmur3-step`."""
    return TritonSampler(streams="murmur3", block_seed=STEP)


def murmur3_fp64_sampler() -> TritonSampler:
    """`TritonSampler(streams="murmur3-fp64", block_seed="step")` (SPEC 3b: vLLM 0.33.0's `use_fp64` noise
    and block seed): built-in name `triton-murmur3-fp64`."""
    return TritonSampler(streams="murmur3-fp64", block_seed=STEP)


def explicit_sampler() -> TritonSampler:
    """`TritonSampler(streams="explicit")` (SPEC 3c, Gumbel-max; trees with one coin per child, SPEC 4c):
    built-in name `triton-explicit`."""
    return TritonSampler(streams="explicit")


def explicit_inverse_cdf_sampler() -> TritonSampler:
    """`TritonSampler(streams="explicit", resample="inverse_cdf")` (SPEC 3c and 4): built-in name
    `triton-explicit-icdf`."""
    return TritonSampler(streams="explicit", resample="inverse_cdf")


def explicit_per_node_sampler() -> TritonSampler:
    """`TritonSampler(streams="explicit", tree_uniforms="per_node")` (SPEC 3c and 4c: one coin per parent
    node, one-hot trees): built-in name `triton-explicit-per-node`."""
    return TritonSampler(streams="explicit", tree_uniforms=PER_NODE)
