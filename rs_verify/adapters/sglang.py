"""SGLang's chain speculative-sampling verification (its Triton kernel) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.sglang:SglangSampler

`SglangSampler` wraps `chain_speculative_sampling_triton` from an installed sglang (the first of
`SGLANG_MODULES` that imports); sglang is imported only when a sampler is built, and no SGLang
code lives in this repository. The calling convention, read from SGLang's source
(`python/sglang/kernels/ops/speculative/reject_sampling.py`; `python/sglang/srt/speculative/
reject_sampling.py` before the move), passed by parameter name:

    chain_speculative_sampling_triton(
        predicts,                  # int32 [bs * D], out: the emitted token at each accepted slot's index
        accept_index,              # int32 [bs, D], out: the global indices of the accepted slots (-1 past them)
        accept_token_num,          # int32 [bs], out: the number of accepted drafts
        candidates,                # int64 [bs, D]: slot 0 the last verified token, slots 1.. the drafts
        retrive_index,             # int64 [bs, D]: global index of each slot (b * D + s)
        retrive_next_token,        # int64 [bs, D]: the chain (s + 1, -1 at the end); unused by the chain kernel
        retrive_next_sibling,      # int64 [bs, D]: -1 (a chain has no siblings); unused
        uniform_samples,           # float32 [bs, D]: the coin of draft slot s is column s - 1
        uniform_samples_for_final_sampling,  # float32 [bs]: the inverse-CDF uniform of the final token
        target_probs,              # float32 [bs, D, V]: p of the row verifying slot s + 1 (row D - 1: the bonus row)
        draft_probs,               # float32 [bs, D, V]: q of the draft in slot s + 1 (row D - 1 unused)
        threshold_single, threshold_acc, deterministic,  # 1.0, 1.0, True: SGLang's exact-sampling values
    ) -> None

with `D = n + 1` for `n` drafts. It accepts draft `s` iff `coin * q < p` and samples the final
token by inverse CDF over `max(p - q, 0)` (over `p` when every draft was accepted): the
`explicit` stream family with `resample = "inverse_cdf"` (SPEC 3c, 4).

What the adapter does in SGLang's place (docs/explicit-adapters.md):
- Probabilities: `p = softmax(z)` with `z = fp32(x) / T` (SPEC 2) and `q = softmax(d / T)` in
  torch float32 over `[0, V')` (SGLang computes `softmax(logits / T)` before the kernel, and
  renormalises by top-k / top-p, which the adapter does not: `sampling_params` is empty). One-hot
  drafts (`draft_logits is None`) get `q` a point mass at the draft: then `coin * 1 < p(d)` and
  `max(p - q, 0)` (`p` with the draft's mass removed) are SPEC 4's one-hot rules exactly.
- Noise: `uniform_samples[b, s] = accept_uniforms[cu[r] + s]` and
  `uniform_samples_for_final_sampling[b] = resample_uniforms[r]`, rounded to float32 as SGLang's
  `torch.rand` coins are. `resample_gumbel` is not read.
- Draft counts: SGLang's scheduler gives every request of a batch the same number of draft
  tokens, so the kernel takes one `D` per call. The adapter verifies each request with the
  drafts up to its first padded one (SPEC 3c) and calls the kernel once per distinct draft count
  `n`, on the stochastic requests with that count (`n = 0`, `D = 1`: the kernel's final step
  alone, inverse CDF over `p`).
- Greedy requests: SGLang verifies them with `torch.argmax` and `verify_tree_greedy` (an
  sgl_kernel CUDA kernel), not with the chain kernel; the adapter does that comparison itself
  (`explicit_inputs.greedy_tokens`), so greedy decisions gate the adapter, not SGLang.
- Block verification (SPEC 4b): declared when the chain function takes the keyword
  `block_verification` (SGLang 0.5.23: block batches call it with `block_verification=True`) or,
  in older trees, when the module also has `chain_block_speculative_sampling_triton` (same
  calling convention), which block batches call.
- Declared deviation (SPEC 11): `inverse_cdf_last_token`, measured on 0.5.23 (docs/releases.md):
  when rounding leaves no float32 prefix sum above `U * S`, or the residual is empty, the kernel
  emits the value it initialises `final_token` to, `V' - 1`, whatever its mass.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import inspect
import sys

import numpy as np
import torch

from ..contract import explicit, methods
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..harness import device as backend
from . import explicit_inputs
from .explicit_inputs import Prepared

SGLANG_MODULES = ("sglang.kernels.ops.speculative.reject_sampling", "sglang.srt.speculative.reject_sampling")
CHAIN, BLOCK = "chain_speculative_sampling_triton", "chain_block_speculative_sampling_triton"
BLOCK_KEYWORD = "block_verification"  # 0.5.23: the chain function verifies blocks with this keyword True
PARAMETERS = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
              "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
              "draft_probs", "threshold_single", "threshold_acc", "deterministic")
NOISE = explicit.READS[explicit.INVERSE_CDF]


def block_keyword(chain):
    """`chain` with `block_verification=True` when it takes that keyword (SGLang 0.5.23), else None."""
    try:
        params = inspect.signature(chain).parameters
    except (TypeError, ValueError):
        return None
    if BLOCK_KEYWORD not in params:
        return None
    return functools.partial(chain, **{BLOCK_KEYWORD: True})


def load_sglang() -> tuple:
    """`(chain, block or None)` from the first importable module of `SGLANG_MODULES`: the block
    function is the chain function's `block_verification=True` (0.5.23) or the module's separate
    `BLOCK` function (older trees). A module whose package does not import here (SGLang 0.5.20's
    `__init__` imports torchvision, which the gate does not install) is loaded from its file: the
    kernel module itself imports only Triton."""
    errors = []
    for name in SGLANG_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            _forget_partial(name)
            module = _from_file(name)
            if module is None:
                errors.append(f"{name}: {exc}")
                continue
        if hasattr(module, CHAIN):
            chain = getattr(module, CHAIN)
            return chain, block_keyword(chain) or getattr(module, BLOCK, None)
        errors.append(f"{name} has no {CHAIN}")
    raise ImportError(f"rs_verify.adapters.sglang needs SGLang's Triton chain verification ({CHAIN}), which could "
                      f"not be imported ({'; '.join(errors)}). Install sglang, or pass chain_speculative_sampling= a "
                      f"function with the same calling convention.")


def _forget_partial(name: str) -> None:
    """Drop the half-imported package a failed import leaves behind (its submodules without their
    parent), which would make every later import under it fail with a KeyError."""
    top = name.partition(".")[0]
    if top not in sys.modules:
        for key in [k for k in sys.modules if k.startswith(top + ".")]:
            del sys.modules[key]


def _from_file(name: str):
    """Module `name` executed from its file under the installed package, without the package's
    `__init__`; None when there is no such file or it does not execute here."""
    spec = importlib.util.find_spec(name.partition(".")[0])
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    for root in roots:
        path = os.path.join(root, *name.split(".")[1:]) + ".py"
        if not os.path.isfile(path):
            continue
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
        try:
            module.__spec__.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - the import error before it is what the caller reports
            return None
        return module
    return None


def check_convention(fn) -> None:
    """TypeError if `fn` requires a parameter the adapter does not supply."""
    unknown = [p.name for p in inspect.signature(fn).parameters.values()
               if p.name not in PARAMETERS and p.name != BLOCK_KEYWORD and p.default is inspect.Parameter.empty
               and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if unknown:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} requires parameters {unknown} that the SGLang adapter does "
                        f"not supply (it knows {list(PARAMETERS)}): the calling convention changed")


class SglangSampler:
    """SGLang's chain verification as a sampler (see the module docstring).

    - chain_speculative_sampling: the function to wrap (default: imported from sglang when built).
    - block_speculative_sampling: its block-verification twin, or None (default: the chain
      function with `block_verification=True` when it takes that keyword, else the sglang
      module's separate block function when the chain function is imported, else none).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()` turns it off).
    - deviations: the declared deviations (SPEC 11); None: what 0.5.23 carries, as measured
      (`inverse_cdf_last_token`); `()` for a function known to follow SPEC 4 exactly.
    """

    name = "sglang-chain"
    streams = "explicit"
    resample = "inverse_cdf"
    supports_chunking = False
    supports_logprobs = False
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # SGLang renormalises by top-k / top-p before the kernel
    deviations = frozenset({"inverse_cdf_last_token"})  # SPEC 11: V' - 1 when no prefix sum exceeds U * S

    def __init__(self, *, chain_speculative_sampling=None, block_speculative_sampling=None, device=None,
                 validate: bool = True, deviations=None):
        if deviations is not None:
            self.deviations = frozenset(deviations)
        if "triton" not in sys.modules:  # SGLang's kernel is Triton code: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.interpreted = self.device.type != "cuda"
        if chain_speculative_sampling is None:
            chain_speculative_sampling, found = load_sglang()
            block_speculative_sampling = block_speculative_sampling or found
        elif block_speculative_sampling is None:
            block_speculative_sampling = block_keyword(chain_speculative_sampling)
        self.chain = chain_speculative_sampling
        self.block = block_speculative_sampling
        for fn in (self.chain, self.block):
            if fn is not None:
                check_convention(fn)
        offered = (methods.BLOCK,) if self.block is not None else ()
        self.verification_methods = frozenset(m.name for m in (methods.TOKEN, *offered))
        self.validate = bool(validate)

    def unvalidated(self) -> "SglangSampler":
        return type(self)(chain_speculative_sampling=self.chain, block_speculative_sampling=self.block,
                          device=self.device, validate=False, deviations=self.deviations)

    def __repr__(self) -> str:
        name = getattr(self.chain, "__module__", "?") + "." + getattr(self.chain, "__name__", "?")
        return (f"SglangSampler(chain_speculative_sampling={name}, block={self.block is not None}, "
                f"device={str(self.device)!r}, validate={self.validate})")

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        explicit_inputs.admit(self, batch, NOISE, "SGLang renormalises by them before the kernel",
                              f"no {BLOCK} was found or given")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, self.device)
        fn = self.block if batch.verification == methods.BLOCK.name else self.chain
        tokens: list = [None] * batch.num_reqs
        for r in np.flatnonzero(prep.greedy):
            tokens[r] = explicit_inputs.greedy_tokens(batch, prep, int(r))
        for n in sorted(set(prep.drafts[~prep.greedy].tolist())):
            reqs = np.flatnonzero(~prep.greedy & (prep.drafts == n))
            for r, toks in zip(reqs, self._verify(fn, batch, prep, reqs, n)):
                tokens[r] = toks
        return explicit_inputs.output(batch, tokens)

    def arguments(self, batch: SpecBatch, prep: Prepared, reqs: np.ndarray, n: int) -> dict:
        """The keyword arguments of one kernel call: requests `reqs`, each with `n` drafts."""
        dev, bs, d, vp = self.device, len(reqs), n + 1, prep.vocab
        rows = prep.rows[reqs][:, None] + np.arange(d)[None, :]  # [bs, D]: the batch rows of each slot
        ids = np.asarray(batch.draft_token_ids, np.int64)
        candidates = np.zeros((bs, d), np.int64)  # slot 0, the last verified token, is never read
        candidates[:, 1:] = ids[rows[:, 1:]]
        slots = np.arange(bs * d, dtype=np.int64).reshape(bs, d)
        nxt = np.where(np.arange(d) < n, np.arange(d) + 1, -1)
        draft_probs = torch.zeros((bs, d, vp), dtype=torch.float32, device=dev)
        draft_probs[:, :n] = prep.q[torch.from_numpy(reqs).to(dev), :n]

        def tensor(a, dtype):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dtype)

        u = np.asarray(batch.accept_uniforms, np.float64)[rows]
        return dict(
            predicts=torch.full((bs * d,), -1, dtype=torch.int32, device=dev),
            accept_index=torch.full((bs, d), -1, dtype=torch.int32, device=dev),
            accept_token_num=torch.zeros(bs, dtype=torch.int32, device=dev),
            candidates=tensor(candidates, torch.int64), retrive_index=tensor(slots, torch.int64),
            retrive_next_token=tensor(np.tile(nxt, (bs, 1)), torch.int64),
            retrive_next_sibling=torch.full((bs, d), -1, dtype=torch.int64, device=dev),
            uniform_samples=tensor(u.astype(np.float32), torch.float32),
            uniform_samples_for_final_sampling=tensor(
                np.asarray(batch.resample_uniforms, np.float64)[reqs].astype(np.float32), torch.float32),
            target_probs=prep.p[torch.from_numpy(rows.reshape(-1)).to(dev)].reshape(bs, d, vp).contiguous(),
            draft_probs=draft_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True,
        )

    def _verify(self, fn, batch: SpecBatch, prep: Prepared, reqs: np.ndarray, n: int) -> list[list[int]]:
        args = self.arguments(batch, prep, reqs, n)
        fn(**args)
        accepted = args["accept_token_num"].cpu().numpy().astype(np.int64)
        index = args["accept_index"].cpu().numpy().astype(np.int64)
        predicts = args["predicts"].cpu().numpy().astype(np.int64)
        out = []
        for b, r in enumerate(reqs):
            a = int(accepted[b])
            if not 0 <= a <= n or not ((0 <= index[b, : a + 1]) & (index[b, : a + 1] < predicts.size)).all():
                raise RuntimeError(f"request {int(r)}: the wrapped function returned accept_token_num {a} and "
                                   f"accept_index {index[b].tolist()} for {n} drafts")
            out.append([int(t) for t in predicts[index[b, : a + 1]]])
        return out
