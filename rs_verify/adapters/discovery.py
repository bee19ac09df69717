"""Which adapters an installed release offers, read from its files without importing it.

`rs-verify releases NAME==VERSION` gates any release of a package this table knows, with no
catalogue entry: each `Offer` names an adapter (module:attribute), the package it gates and what
the release must contain for it (`needs`: a file of the installed site and a text it holds, "" for
the file alone). A release without them has the adapter as a skipped cell with `missing`; a
release that holds one of `refuses`' texts has it skipped with that reason (a mode the adapter
would certify against another family's reference, say). Reading files instead of importing keeps
the parent process free of the release; the adapter, loaded in its gate process, still checks the
call itself and refuses by name what it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VLLM_MRV2 = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
VLLM_CHUNKS = "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py"
VLLM_V1 = "vllm/v1/sample/rejection_sampler.py"
VLLM_GUMBEL = "vllm/v1/worker/gpu/sample/gumbel.py"
SGLANG_CHAIN = ("sglang/kernels/ops/speculative/reject_sampling.py", "sglang/srt/speculative/reject_sampling.py")
LMDEPLOY_KERNELS = "lmdeploy/pytorch/kernels/cuda/rejection_sampling.py"
LMDEPLOY_DEFAULT = "lmdeploy/pytorch/backends/default/rejection_sampling.py"
TRANSFORMERS_UTILS = "transformers/generation/utils.py"
EAGLE_UTILS = "eagle/model/utils.py"  # the distribution eagle-llm installs the package eagle
KERAS_HUB_SPECULATIVE = "keras_hub/src/samplers/speculative_sampler.py"
SGLANG_DSPARK = "sglang/kernels/ops/speculative/dspark/blockwise_rejection.py"
SGLANG_TREE = "sglang/kernels/ops/speculative/sampling.py"


@dataclass(frozen=True)
class Offer:
    adapter: str  # "rs_verify.adapters.vllm:VllmSampler"
    package: str  # the distribution it gates, as pip names it ("vllm")
    needs: tuple[tuple[str | tuple[str, ...], str], ...]  # (file or alternatives, text it holds or "")
    missing: str  # why a release without `needs` cannot have the adapter
    refuses: tuple[tuple[str, str, str], ...] = ()  # (file, text, why): the release has a mode the adapter refuses
    cuda_only: str = ""  # why the adapter cannot run without a CUDA device ("": it can)


ADAPTERS: tuple[Offer, ...] = (
    Offer("rs_verify.adapters.vllm_v1:VllmV1Sampler", "vllm", ((VLLM_V1, "def rejection_sample("),),
          "this vLLM has no V1 rejection sampler (vllm/v1/sample/rejection_sampler.py; removed in 0.34.0)"),
    Offer("rs_verify.adapters.vllm:VllmSampler", "vllm", ((VLLM_MRV2, "def rejection_sample("),),
          "this vLLM has no model runner v2 rejection_sample (rejection_sampler_utils.py)"),
    Offer("rs_verify.adapters.vllm_chunks:VllmChunkedSampler", "vllm",
          ((VLLM_MRV2, "def rejection_sample("), (VLLM_CHUNKS, "def _verify_in_chunks(")),
          "this vLLM has no chunk loop (RejectionSampler._verify_in_chunks, from 0.29.0 on)"),
    Offer("rs_verify.adapters.vllm:VllmFp64Sampler", "vllm", ((VLLM_MRV2, "use_fp64"), (VLLM_GUMBEL, "")),
          "this vLLM's rejection_sample has no use_fp64 mode",
          refuses=((VLLM_GUMBEL, "def tl_rand64(",
                    "use_fp64 draws a 53-bit uniform from two words of tl.randint4x (tl_rand64), a stream family "
                    "rs-verify does not ship: certifying it against murmur3-fp64's reference would be wrong"),)),
    Offer("rs_verify.adapters.sglang:SglangSampler", "sglang",
          ((SGLANG_CHAIN, "def chain_speculative_sampling_triton("),),
          "this SGLang has no Triton chain kernel (chain_speculative_sampling_triton)"),
    Offer("rs_verify.adapters.lmdeploy:LmdeployTritonSampler", "lmdeploy",
          ((LMDEPLOY_KERNELS, "def random_rejection_sample("), (LMDEPLOY_KERNELS, "def sample_recovered_tokens("),
           (LMDEPLOY_KERNELS, "def greedy_rejection_sample(")),
          "this LMDeploy has no Triton rejection kernels that take their noise (pytorch/kernels/cuda/rejection_sampling.py)"),
    Offer("rs_verify.adapters.lmdeploy:LmdeployTorchSampler", "lmdeploy",
          ((LMDEPLOY_DEFAULT, "class DefaultRejectionSamplingImpl("),),
          "this LMDeploy has no portable torch rejection sampler (pytorch/backends/default/rejection_sampling.py)"),
    Offer("rs_verify.adapters.hf_transformers:TransformersSampler", "transformers",
          ((TRANSFORMERS_UTILS, "def _speculative_sampling("),),
          "this transformers has no _speculative_sampling (transformers/generation/utils.py)"),
    Offer("rs_verify.adapters.eagle:EagleSampler", "eagle-llm",
          ((EAGLE_UTILS, "def evaluate_posterior("), (EAGLE_UTILS, "random.random()")),
          "this eagle-llm has no tree verification that draws random.random() (evaluate_posterior in "
          "eagle/model/utils.py)"),
    Offer("rs_verify.adapters.keras_hub:KerasHubSampler", "keras-hub",
          ((KERAS_HUB_SPECULATIVE, "class SpeculativeSampler("),),
          "this keras-hub has no SpeculativeSampler (keras_hub/src/samplers/speculative_sampler.py)"),
    Offer("rs_verify.adapters.sglang_dspark:DsparkTritonSampler", "sglang",
          ((SGLANG_DSPARK, "def blockwise_rejection_triton("),),
          "this SGLang has no DSpark block-wise rejection (speculative/dspark/blockwise_rejection.py, from 0.5.23 on)",
          cuda_only="its resample kernel calls libdevice.log1p, which Triton's interpreter does not implement: "
                    "it runs on a CUDA device only"),
    Offer("rs_verify.adapters.sglang_dspark:DsparkTorchSampler", "sglang",
          ((SGLANG_DSPARK, "def blockwise_rejection_torch("),),
          "this SGLang has no DSpark block-wise rejection (speculative/dspark/blockwise_rejection.py, from 0.5.23 on)"),
    Offer("rs_verify.adapters.sglang_tree:SglangTreeSampler", "sglang",
          ((SGLANG_TREE, "def tree_speculative_sampling_target_only("),),
          "this SGLang has no tree verification kernel (tree_speculative_sampling_target_only in "
          "kernels/ops/speculative/sampling.py)",
          cuda_only="its tree kernel is CUDA C++ compiled at its first call (kernels/jit/csrc/speculative/"
                    "sampling.cuh), with no CPU or interpreter path: it runs on a CUDA device only"),
)


def packages() -> tuple[str, ...]:
    """The packages some adapter gates, in table order."""
    return tuple(dict.fromkeys(o.package for o in ADAPTERS))


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them: `Keras_Hub` and `keras-hub` are one package."""
    return name.lower().replace("_", "-").replace(".", "-")


def _holds(site: Path, files: str | tuple[str, ...], text: str) -> Path | None:
    for rel in (files,) if isinstance(files, str) else files:
        path = site / rel
        try:
            if path.is_file() and (not text or text in path.read_text(encoding="utf-8", errors="replace")):
                return path
        except OSError:
            continue
    return None


def offered(package: str, site: Path, cuda: bool | None = None) -> list[tuple[str, str | None]]:
    """(adapter, None) for each adapter the release installed at `site` supports, (adapter, why) for
    each it cannot have; [] for a package no adapter gates. `cuda`: whether the gate has a CUDA
    device (None: asked of torch when an offer needs one)."""
    out = []
    for offer in ADAPTERS:
        if normalise(offer.package) != normalise(package):
            continue
        why = None if all(_holds(site, f, t) for f, t in offer.needs) else offer.missing
        for rel, text, reason in offer.refuses if why is None else ():
            if _holds(site, rel, text):
                why = reason
                break
        if why is None and offer.cuda_only:
            if cuda is None:
                from ..harness import device  # lazy: torch is imported only when an offer needs CUDA

                cuda = device.cuda_available()
            why = None if cuda else offer.cuda_only
        out.append((offer.adapter, why))
    return out
