"""LMDeploy's rejection samplers (0.18.0, `lmdeploy/pytorch`) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.lmdeploy:LmdeployTritonSampler
    pytest -p rs_verify --rs-sampler=rs_verify.adapters.lmdeploy:LmdeployTorchSampler

LMDeploy verifies drafts in two backends with one algorithm (docs/engines.md):
- `LmdeployTritonSampler` calls the three Triton launchers of `KERNELS`
  (`lmdeploy/pytorch/kernels/cuda/rejection_sampling.py`), which take their random numbers as
  inputs, exactly as `CudaRejectionSamplingImpl.forward` calls them:

      sample_recovered_tokens(output_token_ids,  # int64 [B, n], out: argmax max(p - q, 0) * inv_q per position
                              draft_token_ids,   # int64 [B, n]
                              draft_probs,       # float32 [B, n, V] or None (one-hot drafts: p without the draft)
                              target_probs,      # float32 [B, n, V]: softmax of the processed draft-row logits
                              inv_q)             # float32 [B, V]: 1 / E, one exponential vector per request
      random_rejection_sample(output_token_ids, num_rejected_tokens, last_token_ids,  # out [B, n + 1], [B], [B]
                              draft_token_ids, draft_probs, target_probs, bonus_token_ids,  # bonus int64 [B]
                              recovered_token_ids, uniform_probs,  # int64 [B, n]; float64 [B, n]
                              is_greedy)                           # bool [B] or None (no greedy request)
      greedy_rejection_sample(output_token_ids, num_rejected_tokens, last_token_ids, draft_token_ids,
                              target_token_ids,  # int64 [B, n]: argmax of the processed logits
                              bonus_token_ids, is_greedy)

  accept iff `q(d) > 0 and p(d) / q(d) >= u` (`p(d) >= u` for one-hot drafts), recover
  `argmax max(p - q, 0) / E`: Gumbel-max with `G = -log E`, the `explicit` family with
  `resample = "gumbel"` (SPEC 3c). The adapter hands it `uniform_probs[b, i] = accept_uniforms[row]`
  (float64, as LMDeploy's `torch.rand(..., dtype=float64)`) and `inv_q = 1 / E`, `E = exp(-G)` in
  float32 (LMDeploy's `q.exponential_(); q.reciprocal()`).
- `LmdeployTorchSampler` calls `DefaultRejectionSamplingImpl.forward(target_logits, draft_token_ids,
  bonus_token_ids, *, is_greedy, draft_probs=None)` (`backends/default/rejection_sampling.py`, the
  portable backend) and `forward_greedy(target_token_ids, draft_token_ids)` for an all-greedy call,
  as LMDeploy's `RejectionSampler` does. It draws `torch.rand` and `torch.empty(...).exponential_()`
  from torch's global generator inside `forward`; for the call the adapter gives the module a
  `torch` whose `rand` returns the batch's uniforms and whose `empty` returns `E` (its
  `exponential_` leaves the values), so the same decisions are certified bit for bit.

What the adapter does in LMDeploy's place:
- `target_logits` are the processed logits `z = fp32(x) / T` (SPEC 2; `T = 1` for greedy requests),
  `[B, n, V']` over the draft rows (LMDeploy's `RejectionSampler.forward` slices off the bonus
  row); `draft_probs = softmax(d / T)` in float32, `None` for one-hot drafts.
- The bonus token is an input (LMDeploy's `FusedLogitsProcessor.sampling` draws it outside, argmax
  for greedy requests): the adapter draws it from the bonus row's `p` with the request's own `E`
  (SPEC 3c), argmax `z` for greedy requests, so bonus decisions gate the adapter, not LMDeploy.
- Draft counts: LMDeploy verifies `[B, num_spec_tokens]`, every request with the same count; the
  adapter verifies each request with its drafts up to the first padded one (SPEC 3c) and calls
  once per distinct count. A request with no draft is LMDeploy's prefill path (its ordinary
  sampler): its token is the bonus.
- Greedy requests (`is_greedy`, LMDeploy's `top_k == 1`) go through LMDeploy's own greedy path.

Importing: `lmdeploy/__init__.py` imports the whole serving stack. The adapter imports the files
it calls, not the package: it registers `lmdeploy` and the packages above them as empty packages
over the installed directories (only when `lmdeploy` is not already imported), so each file's own
imports (`lmdeploy.pytorch.backends.rejection_sampling` -> `config` -> `messages`, pydantic,
transformers) still run as LMDeploy wrote them.
"""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import torch

from ..contract import explicit
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..harness import device as backend
from . import explicit_inputs, hollow
from .explicit_inputs import Prepared
from .signatures import check_parameters

KERNELS = "lmdeploy.pytorch.kernels.cuda.rejection_sampling"
DEFAULT = "lmdeploy.pytorch.backends.default.rejection_sampling"
IMPL = "DefaultRejectionSamplingImpl"
# The packages whose __init__ the adapter does not run (module docstring).
HOLLOW = ("lmdeploy", "lmdeploy.pytorch", "lmdeploy.pytorch.backends", "lmdeploy.pytorch.backends.default",
          "lmdeploy.pytorch.kernels", "lmdeploy.pytorch.kernels.cuda")
_OUT = ("output_token_ids", "num_rejected_tokens", "last_token_ids")
# Each function the adapter calls, with the parameters it passes (by name).
PARAMETERS = {
    "sample_recovered_tokens": ("output_token_ids", "draft_token_ids", "draft_probs", "target_probs", "inv_q"),
    "random_rejection_sample": (*_OUT, "draft_token_ids", "draft_probs", "target_probs", "bonus_token_ids",
                                "recovered_token_ids", "uniform_probs", "is_greedy"),
    "greedy_rejection_sample": (*_OUT, "draft_token_ids", "target_token_ids", "bonus_token_ids", "is_greedy"),
    "forward": ("target_logits", "draft_token_ids", "bonus_token_ids", "is_greedy", "draft_probs"),
    "forward_greedy": ("target_token_ids", "draft_token_ids"),
}
NOISE = explicit.READS[explicit.GUMBEL]
_PATCH_LOCK = threading.RLock()  # the torch backend's fed `torch` lives in its module during a call


def _import_file(name: str):
    """`name` from the installed lmdeploy without running the `__init__` of `HOLLOW` (module docstring)."""
    return hollow.import_file(name, HOLLOW, "rs_verify.adapters.lmdeploy", "lmdeploy (0.18.0) with its pure-Python "
                              "imports, or pass the functions")


def check_convention(fn, name: str) -> None:
    """TypeError if `fn` lacks a parameter the adapter passes, or requires one it does not know."""
    check_parameters(fn, PARAMETERS[name], "LMDeploy", name=name)


class _LmdeploySampler:
    """What both backends share: declarations, the groups of one draft count, the bonus, the output."""

    streams = "explicit"
    resample = "gumbel"  # argmax max(p - q, 0) / E with E = exp(-G): Gumbel-max
    supports_chunking = False
    supports_logprobs = False  # LMDeploy gathers logprobs outside the rejection sampler
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # LMDeploy's FusedLogitsProcessor applies them before the sampler
    deviations = frozenset({"empty_residual_token0"})  # SPEC 11, measured on 0.18.0 (docs/engines.md)

    def _setup(self, device, validate: bool, deviations) -> None:
        if deviations is not None:
            self.deviations = frozenset(deviations)
        if "triton" not in sys.modules:  # LMDeploy's files import Triton: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.validate = bool(validate)

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        explicit_inputs.admit(self, batch, NOISE, "LMDeploy's logits processors apply them before the sampler",
                              "LMDeploy verifies token by token")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, self.device)
        e = explicit_inputs.exponentials(batch, prep, torch.float32)
        bonus = explicit_inputs.bonus_tokens(prep, e)
        tokens: list = [[int(b)] for b in bonus]  # no draft: LMDeploy's prefill path, its ordinary sampler
        for n in sorted(set(prep.drafts.tolist()) - {0}):
            reqs = np.flatnonzero(prep.drafts == n)
            out = self.verify(self.inputs(batch, prep, reqs, n, e, bonus))
            if out.shape != (len(reqs), n + 1):
                raise RuntimeError(f"LMDeploy returned output_token_ids of shape {tuple(out.shape)} for {len(reqs)} "
                                   f"requests of {n} drafts")
            for r, row in zip(reqs, out.cpu().numpy().astype(np.int64)):
                tokens[r] = row[row >= 0].tolist()  # PLACEHOLDER_TOKEN_ID (-1) past the emitted tokens
        return explicit_inputs.output(batch, tokens)

    def inputs(self, batch: SpecBatch, prep: Prepared, reqs: np.ndarray, n: int, e: torch.Tensor,
               bonus: np.ndarray) -> dict:
        """The tensors of one call: requests `reqs`, each with `n` drafts, LMDeploy's dtypes and layout."""
        dev = self.device
        rows = prep.rows[reqs][:, None] + np.arange(n)[None, :]  # [B, n]: the draft rows
        rows_t = torch.from_numpy(rows.reshape(-1)).to(dev)
        ids = np.asarray(batch.draft_token_ids, np.int64)[rows + 1]
        greedy = prep.greedy[reqs]
        draft_probs = None
        if batch.draft_logits is not None:
            draft_probs = prep.q[torch.from_numpy(reqs).to(dev), :n].contiguous()
        return dict(
            target_logits=prep.z[rows_t].reshape(len(reqs), n, prep.vocab).contiguous(),
            target_probs=prep.p[rows_t].reshape(len(reqs), n, prep.vocab).contiguous(),
            draft_token_ids=torch.from_numpy(np.ascontiguousarray(ids)).to(dev),
            draft_probs=draft_probs,
            bonus_token_ids=torch.from_numpy(bonus[reqs].astype(np.int64)).to(dev),
            is_greedy=torch.from_numpy(greedy).to(dev) if greedy.any() else None,  # LMDeploy: None if no greedy row
            all_greedy=bool(greedy.all()),
            uniform_probs=torch.from_numpy(np.asarray(batch.accept_uniforms, np.float64)[rows]).to(dev),
            e=e[torch.from_numpy(reqs).to(dev)].contiguous(),
        )


class LmdeployTritonSampler(_LmdeploySampler):
    """LMDeploy's Triton kernels (`KERNELS`) as a sampler (see the module docstring).

    - kernels: a module (or namespace) with `sample_recovered_tokens`, `random_rejection_sample`
      and `greedy_rejection_sample` (default: LMDeploy's, imported when the sampler is built).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()` turns it off).
    - deviations: the declared deviations (SPEC 11); None: what 0.18.0 carries, as measured.
    """

    name = "lmdeploy-triton"

    def __init__(self, *, kernels=None, device=None, validate: bool = True, deviations=None):
        self._setup(device, validate, deviations)
        self.interpreted = self.device.type != "cuda"
        self.kernels = _import_file(KERNELS) if kernels is None else kernels
        for fn in ("sample_recovered_tokens", "random_rejection_sample", "greedy_rejection_sample"):
            if not callable(getattr(self.kernels, fn, None)):
                raise TypeError(f"{getattr(self.kernels, '__name__', self.kernels)} has no {fn}: the calling "
                                f"convention changed")
            check_convention(getattr(self.kernels, fn), fn)

    def unvalidated(self) -> "LmdeployTritonSampler":
        return type(self)(kernels=self.kernels, device=self.device, validate=False, deviations=self.deviations)

    def __repr__(self) -> str:
        return (f"LmdeployTritonSampler(kernels={getattr(self.kernels, '__name__', self.kernels)!r}, "
                f"device={str(self.device)!r}, validate={self.validate})")

    def verify(self, a: dict) -> torch.Tensor:
        """`CudaRejectionSamplingImpl.forward` / `forward_greedy`'s launches, with the batch's noise."""
        k, ids = self.kernels, a["draft_token_ids"]
        b, n = ids.shape
        out = ids.new_empty((b, n + 1))
        rejected, last = ids.new_empty(b), ids.new_empty(b)
        if a["all_greedy"]:  # forward_greedy: target_token_ids[:, :-1] and the bonus, is_greedy None
            k.greedy_rejection_sample(output_token_ids=out, num_rejected_tokens=rejected, last_token_ids=last,
                                      draft_token_ids=ids, target_token_ids=a["target_logits"].argmax(dim=-1),
                                      bonus_token_ids=a["bonus_token_ids"], is_greedy=None)
            return out
        if a["is_greedy"] is not None:
            k.greedy_rejection_sample(output_token_ids=out, num_rejected_tokens=rejected, last_token_ids=last,
                                      draft_token_ids=ids, target_token_ids=a["target_logits"].argmax(dim=-1),
                                      bonus_token_ids=a["bonus_token_ids"], is_greedy=a["is_greedy"])
        recovered = ids.new_empty((b, n))
        k.sample_recovered_tokens(output_token_ids=recovered, draft_token_ids=ids, draft_probs=a["draft_probs"],
                                  target_probs=a["target_probs"], inv_q=a["e"].reciprocal())
        k.random_rejection_sample(output_token_ids=out, num_rejected_tokens=rejected, last_token_ids=last,
                                  draft_token_ids=ids, draft_probs=a["draft_probs"], target_probs=a["target_probs"],
                                  bonus_token_ids=a["bonus_token_ids"], recovered_token_ids=recovered,
                                  uniform_probs=a["uniform_probs"], is_greedy=a["is_greedy"])
        return out


class _Drawn(torch.Tensor):
    """`E` as LMDeploy's `torch.empty(...)` returns it to the torch backend: `exponential_` keeps the values."""

    def exponential_(self, *args, **kwargs):
        return self


class _FedTorch(types.ModuleType):
    """`torch` for one call of the torch backend: `rand` and `empty` hand out the batch's noise."""

    def __init__(self, u: torch.Tensor, e: torch.Tensor):
        super().__init__("torch")
        self._u, self._e = u, e

    def __getattr__(self, name):
        return getattr(torch, name)

    def rand(self, size, *args, **kwargs):
        if tuple(size) != tuple(self._u.shape) or kwargs.get("dtype") != torch.float64:
            raise RuntimeError(f"torch.rand{tuple(size)}, {kwargs.get('dtype')}: the LMDeploy adapter hands out "
                               f"float64 {tuple(self._u.shape)} acceptance uniforms: the calling convention changed")
        return self._u.clone()

    def empty(self, size, *args, **kwargs):
        if tuple(size) != tuple(self._e.shape) or kwargs.get("dtype") != torch.float32:
            raise RuntimeError(f"torch.empty{tuple(size)}, {kwargs.get('dtype')}: the LMDeploy adapter hands out "
                               f"float32 {tuple(self._e.shape)} exponentials: the calling convention changed")
        return self._e.clone().as_subclass(_Drawn)


class LmdeployTorchSampler(_LmdeploySampler):
    """LMDeploy's portable torch backend (`DefaultRejectionSamplingImpl`) as a sampler (module docstring).

    - impl_module: the module holding `IMPL` (default: LMDeploy's `DEFAULT`, imported when built).
    - device, validate, deviations: as for `LmdeployTritonSampler` (no Triton: never interpreted).
    """

    name = "lmdeploy-torch"
    interpreted = False

    def __init__(self, *, impl_module=None, device=None, validate: bool = True, deviations=None):
        self._setup(device, validate, deviations)
        self.impl_module = _import_file(DEFAULT) if impl_module is None else impl_module
        cls = getattr(self.impl_module, IMPL, None)
        if cls is None:
            raise TypeError(f"{getattr(self.impl_module, '__name__', self.impl_module)} has no {IMPL}: the calling "
                            f"convention changed")
        self.impl = cls()
        for fn in ("forward", "forward_greedy"):
            check_convention(getattr(cls, fn), fn)

    def unvalidated(self) -> "LmdeployTorchSampler":
        return type(self)(impl_module=self.impl_module, device=self.device, validate=False, deviations=self.deviations)

    def __repr__(self) -> str:
        return (f"LmdeployTorchSampler(impl_module={getattr(self.impl_module, '__name__', self.impl_module)!r}, "
                f"device={str(self.device)!r}, validate={self.validate})")

    def verify(self, a: dict) -> torch.Tensor:
        """`RejectionSampler.forward`'s call of the backend, its two draws replaced by the batch's."""
        if a["all_greedy"]:  # forward_greedy: argmax of every row, the bonus row's as the bonus
            target = torch.cat([a["target_logits"].argmax(dim=-1), a["bonus_token_ids"][:, None]], dim=1)
            out = self.impl.forward_greedy(target_token_ids=target, draft_token_ids=a["draft_token_ids"])[0]
            return out.as_subclass(torch.Tensor)
        module = self.impl_module
        with _PATCH_LOCK:
            saved = module.torch
            module.torch = _FedTorch(a["uniform_probs"], a["e"])
            try:
                out = self.impl.forward(target_logits=a["target_logits"], draft_token_ids=a["draft_token_ids"],
                                        bonus_token_ids=a["bonus_token_ids"], is_greedy=a["is_greedy"],
                                        draft_probs=a["draft_probs"])[0]
            finally:
                module.torch = saved
        return out.as_subclass(torch.Tensor)
