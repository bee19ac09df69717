"""How the vLLM adapters call the `rejection_sample` of the release they wrap, and what a release needs on a CPU.

Every parameter of the wrapped function falls under one rule, by name (`PARAMETERS`):

- `"input"`: the batch's tensors and sizes, supplied from the `SpecBatch` (`draft_logits`, a
  tensor, before vLLM 0.34.0; `draft_logits_cache`, a `DraftLogitsCache`, from 0.34.0 on);
- `"gated"`: a switch the adapter sets deliberately: `use_block_verification` by the batch's
  verification method, `use_fp64` by the declared stream family (`"murmur3-fp64"`, SPEC 3b),
  `skip_masked_vocab_blocks` by the adapter's option of that name;
- `"lossy"`: a mode that changes the output distribution by design (synthetic acceptance rates,
  the FLy deferred-rejection window, watermarking): left at its default, never enabled, and a
  user asking for it gets a `ValueError` that says so (`refuse_lossy`);
- `"inert"`: read only when a lossy mode is on (the FLy entropy knobs, watermarking's skip mask):
  left at its default.
A parameter not in the table is a `TypeError` naming it when it is required, and also when it is
optional: its default is harmless only if someone checked, so the user names it in
`allow_defaults` after reading the release's source. `*args` / `**kwargs` are never filled.

A release on a machine without CUDA (`prepare_environment`, called before vLLM is imported):
`CUDA_VISIBLE_DEVICES` is set empty, which vLLM's `triton_utils` reads as "a distributed
worker whose GPU shows up later" and so keeps the real Triton (with it unset and no GPU driver it
substitutes a placeholder `triton`). Under Triton's interpreter, which has no libdevice,
`install_log1p` gives the wrapped module's `tldevice` a `log1p` written in `tl` operations (its
one libdevice call, in the residual of the resample kernel), and that of every loaded module of
vLLM's GPU model runner (0.29.0 calls `log1p` in the Gumbel noise of `sample/gumbel.py`); the
library's files are not touched.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys

import torch

__all__ = ["DRAFT_LOGITS_CACHE_MODULE", "LOSSY", "PARAMETERS", "VLLM_MODULE", "bind", "draft_logits_cache",
           "install_log1p", "interpreter_masks_wrong", "load_rejection_sample", "prepare_environment", "refuse_lossy"]

VLLM_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
DRAFT_LOGITS_CACHE_MODULE = "vllm.v1.worker.gpu.spec_decode.draft_logits"
INPUTS = ("target_logits", "draft_logits", "draft_logits_cache", "draft_sampled", "cu_num_logits", "pos",
          "idx_mapping", "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed", "num_speculative_steps")
LOSSY = {
    "synthetic_conditional_rates": "accepts at synthetic rates (u < rate), whatever p and q",
    "fly_window_size": "FLy's deferred-rejection window accepts drafts that rejection sampling rejects",
    "contexts": "watermarking biases the resampled tokens by a keyed draw",
    "watermarking": "watermarking biases the resampled tokens by a keyed draw",
    "watermark_key": "watermarking biases the resampled tokens by a keyed draw",
}
INERT = {
    "fly_entropy_threshold": "read only when fly_window_size > 0",
    "fly_entropy_top_k": "read only when fly_window_size > 0",
    "watermarking_skip_mask": "read only with watermarking",
}
GATED = {
    "use_block_verification": "the batch's verification method",
    "use_fp64": "streams = 'murmur3-fp64'",
    "skip_masked_vocab_blocks": "the adapter's skip_masked_vocab_blocks option",
}
PARAMETERS = {**{name: "input" for name in INPUTS}, **{name: "gated" for name in GATED},
              **{name: "lossy" for name in LOSSY}, **{name: "inert" for name in INERT}}


def prepare_environment(interpreted: bool) -> None:
    """What a vLLM release needs before it is imported on a machine running Triton's interpreter."""
    if interpreted and "vllm" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def load_rejection_sample(interpreted: bool):
    """vLLM's MRV2 `rejection_sample`, ready to run here, or an ImportError that says what is missing."""
    prepare_environment(interpreted)
    try:
        module = importlib.import_module(VLLM_MODULE)
    except ImportError as exc:
        raise ImportError(
            f"rs_verify.adapters.vllm needs vLLM with the model runner v2 rejection sampler "
            f"({VLLM_MODULE}.rejection_sample), which could not be imported: {exc}. Install vllm "
            f"(on a CPU machine: docs/vllm.md, 'What each release needs'), or pass rejection_sample= a "
            f"function with the same calling convention."
        ) from exc
    fn = getattr(module, "rejection_sample", None)
    if fn is None:
        raise ImportError(f"{VLLM_MODULE} has no rejection_sample: this vllm version predates or renamed it")
    if interpreted:  # the module and the kernel helpers it imports (0.29.0's Gumbel noise: sample/gumbel.py)
        for name, loaded in list(sys.modules.items()):
            if loaded is module or name.startswith("vllm.v1.worker.gpu."):
                install_log1p(loaded)
    return fn


tl = None  # triton.language, bound by _log1p_jit: the interpreter requires it among _log1p's globals


def _log1p(x):
    """`log(1 + x)` accurate for small `x` without libdevice (Goldberg: `log(w) * x / (w - 1)`, `w = 1 + x`)."""
    w = 1.0 + x
    return tl.where(w == 1.0, x, tl.log(w) * (x / (w - 1.0)))


@functools.cache
def _log1p_jit():
    """`_log1p` as a Triton function, decorated once the suite has chosen the backend (Triton reads
    `TRITON_INTERPRET` at decoration): importing this module imports no Triton."""
    global tl
    import triton  # noqa: PLC0415
    import triton.language

    tl = triton.language
    return triton.jit(_log1p)


class _Libdevice:
    """A module's `tldevice` with `log1p` replaced; every other name is libdevice's."""

    def __init__(self, inner):
        self._inner = inner
        self.log1p = _log1p_jit()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def install_log1p(module) -> None:
    """Under Triton's interpreter: the `log1p` of `module.tldevice` in `tl` operations (module docstring)."""
    current = getattr(module, "tldevice", None)
    if current is not None and not isinstance(current, _Libdevice):
        module.tldevice = _Libdevice(current)


def _masked_load_count(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """How many lanes of `x[:n]` loaded with `other=-inf` compare above `x[0]` (0 when right)."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
    tl.store(out_ptr, tl.sum((x > tl.load(x_ptr)).to(tl.int32)))


@functools.cache
def interpreter_masks_wrong(dtype: str = "bfloat16") -> bool:
    """True when Triton's interpreter gives a masked `dtype` load with `other=-inf` values above a
    real one (Triton 3.9, bfloat16: 15 of 16 lanes; float32 and float16: none). vLLM's
    `_ranks_kernel` loads a row that way, so its logprob ranks from bfloat16 logits are wrong under
    such an interpreter, never on a GPU (docs/vllm.md). Asked once per dtype, with a 16-lane kernel,
    only under the interpreter."""
    _log1p_jit()  # binds `tl` in this module's globals, which the interpreter reads
    import triton  # noqa: PLC0415

    kernel = triton.jit(_masked_load_count)
    out = torch.zeros(1, dtype=torch.int32)
    kernel[(1,)](torch.tensor([0.5], dtype=getattr(torch, dtype)), out, 1, BLOCK=16)
    return int(out.item()) != 0


def bind(fn, allow_defaults=()) -> list[str]:
    """The parameters of `fn` the adapter passes (its inputs and gated switches), after the rule of
    the module docstring: `TypeError` naming each parameter it does not know, unless optional and
    named in `allow_defaults`."""
    params = inspect.signature(fn).parameters.values()
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [p.name for p in params if p.name not in PARAMETERS and p.kind not in variadic
                and p.default is inspect.Parameter.empty]
    optional = [p.name for p in params if p.name not in PARAMETERS and p.kind not in variadic
                and p.default is not inspect.Parameter.empty and p.name not in allow_defaults]
    what = getattr(fn, "__qualname__", fn)
    if required:
        raise TypeError(f"{what} requires parameters {required} that the vLLM adapter does not supply (it knows "
                        f"{sorted(PARAMETERS)}): the calling convention changed")
    if optional:
        raise TypeError(f"{what} takes parameters {optional} that the vLLM adapter does not know: their defaults "
                        f"are left alone only when named harmless (VllmSampler(allow_defaults=[...]) after reading "
                        f"the release's source), since an unread default may change what it verifies")
    names = [p.name for p in params if PARAMETERS.get(p.name) in ("input", "gated")]
    if ("draft_logits" in names) == ("draft_logits_cache" in names):
        raise TypeError(f"{what} must take exactly one of draft_logits (a tensor) and draft_logits_cache "
                        f"(vLLM 0.34.0 on)")
    return names


def refuse_lossy(options: dict) -> None:
    """`ValueError` for an option that enables a lossy mode, `TypeError` for one the adapter does not have."""
    for name, value in options.items():
        if name in LOSSY:
            raise ValueError(f"{name}={value!r}: lossy by design ({LOSSY[name]}), so the adapter never enables it: "
                             f"a lossy mode is not rejection sampling and no property of the suite holds for it")
        raise TypeError(f"unexpected option {name!r} of the vLLM adapter")


def draft_logits_cache(fn, draft: torch.Tensor | None):
    """The `DraftLogitsCache` that vLLM 0.34.0 hands `rejection_sample` holding `draft` (`[S, K, Vd]`),
    built as its speculator builds one (fill 0.0, the draft logits' dtype), replicated: rows are
    request states, no row mapping. The class is the one `fn` refers to, else vLLM's."""
    if draft is None:
        return None
    cls = getattr(fn, "__globals__", {}).get("DraftLogitsCache")
    if cls is None:
        cls = importlib.import_module(DRAFT_LOGITS_CACHE_MODULE).DraftLogitsCache
    s, k, vd = draft.shape
    cache = cls(s, k, vd, dtype=draft.dtype, fill=0.0, device=draft.device)
    if cache.values.shape != draft.shape or getattr(cache, "row_mapping", None) is not None:
        raise TypeError(f"{cls.__qualname__}: built replicated for [S, K, Vd] = {list(draft.shape)}, it holds "
                        f"{list(cache.values.shape)} rows (row_mapping {getattr(cache, 'row_mapping', None)})")
    cache.values.copy_(draft)
    return cache
