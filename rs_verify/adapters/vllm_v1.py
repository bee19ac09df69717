"""vLLM V1's rejection sampler (`vllm/v1/sample/rejection_sampler.py`) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.vllm_v1:VllmV1Sampler

`VllmV1Sampler` wraps `rejection_sample` of an installed vllm's `VLLM_V1_MODULE` (imported when
a sampler is built; no vLLM code lives in this repository). Its calling convention, read from
vLLM's source and passed by parameter name:

    rejection_sample(
        draft_token_ids,      # int32 [T]: the drafts of every request, concatenated (T = sum of num_draft_tokens)
        num_draft_tokens,     # list[int] [B]
        max_spec_len,         # int: max(num_draft_tokens)
        cu_num_draft_tokens,  # int32 [B]: inclusive prefix sums of num_draft_tokens
        draft_probs,          # float32 [T, V] or None (n-gram drafts: no probabilities)
        target_probs,         # float32 [T, V]: p of each draft's row, contiguous
        bonus_token_ids,      # int32 [B, 1]: the token emitted when every draft is accepted
        sampling_metadata,    # reads .all_greedy, .all_random, .temperature (float32 [B]), .generators
    ) -> int32 [B, max_spec_len + 1], PLACEHOLDER_TOKEN_ID (-1) past the emitted tokens

It accepts a draft iff `q > 0 and p / q >= u` and resamples ("recovers") at every draft
position `argmax max(p - q, 0) / E` with one exponential vector `E` per request
(`sample_recovered_tokens`); the bonus token is an input, sampled outside by vLLM's `Sampler`.
Its random numbers come from two module functions, which the adapter replaces, for the call,
with the batch's (SPEC 3c, the `explicit` family, `resample = "gumbel"`):
- `generate_uniform_probs` returns `accept_uniforms` of the draft rows (float64, as vLLM draws);
- `sample_recovered_tokens` launches vLLM's own `sample_recovered_tokens_kernel` exactly as
  vLLM does, with `E = exp(-G)` (`G = resample_gumbel[r]`, float32) in place of
  `q.exponential_()`: `argmax r / E = argmax log r + G`, Gumbel-max.

What the adapter does in vLLM's place (docs/explicit-adapters.md):
- `target_probs = softmax(z)`, `z = fp32(x) / T` (SPEC 2, `T = 1` for greedy rows, as vLLM's
  `apply_sampling_constraints` replaces a greedy temperature by 1), and `draft_probs =
  softmax(d / T)`, in torch float32 over `[0, V')`; no top-k / top-p (`sampling_params` empty).
- The bonus token: vLLM's `Sampler` draws it outside `rejection_sample` with the same race
  (`probs / q.exponential_()`, or argmax for greedy requests); the adapter draws it from the
  bonus row's `p` and the request's own `E` (SPEC 3c allows it: the noise is per request), so the
  bonus decision gates the adapter, not vLLM.
- Requests verify the drafts up to their first padded one (SPEC 3c), as vLLM's scheduler hands
  each request its own number of drafts; a batch in which no request has a draft is not sent to
  `rejection_sample` (vLLM samples it with its ordinary sampler): its tokens are the bonus tokens.
- Output: the emitted tokens of each row are its entries other than the placeholder (as
  `RejectionSampler.parse_output` reads them), `-1` padded (SPEC 5).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from types import SimpleNamespace

import numpy as np
import torch

from ..contract import explicit
from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..harness import device as backend
from . import explicit_inputs
from .explicit_inputs import Prepared

VLLM_V1_MODULE = "vllm.v1.sample.rejection_sampler"
# The functions the adapter calls or replaces, with the parameters it relies on, in order.
CONVENTION = {
    "rejection_sample": ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                         "target_probs", "bonus_token_ids", "sampling_metadata"),
    "generate_uniform_probs": ("num_tokens", "num_draft_tokens", "generators", "device"),
    "sample_recovered_tokens": ("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens", "draft_token_ids",
                                "draft_probs", "target_probs", "sampling_metadata", "device"),
}
KERNEL = "sample_recovered_tokens_kernel"
KERNEL_ARGS = 9  # out, cu, draft ids, draft probs, target probs, q, vocab size, padded vocab size, no-draft-probs flag
NOISE = explicit.READS[explicit.GUMBEL]
_PATCH_LOCK = threading.RLock()  # the replacements live in the module's namespace during a call


def load_vllm_v1():
    """vLLM V1's rejection-sampler module, or an ImportError that says what is missing."""
    try:
        return importlib.import_module(VLLM_V1_MODULE)
    except ImportError as exc:
        raise ImportError(f"rs_verify.adapters.vllm_v1 needs vLLM's V1 rejection sampler ({VLLM_V1_MODULE}), which "
                          f"could not be imported: {exc}. Install vllm, or pass module= an object with the same "
                          f"functions.") from exc


def check_convention(module) -> None:
    """TypeError naming what differs when `module` lacks a function or parameter the adapter relies on."""
    for fn, expected in CONVENTION.items():
        if not callable(getattr(module, fn, None)):
            raise TypeError(f"{getattr(module, '__name__', module)} has no {fn}: the calling convention changed")
        names = tuple(inspect.signature(getattr(module, fn)).parameters)
        if names != expected:
            raise TypeError(f"{fn}{names}: the vLLM V1 adapter knows {fn}{expected}; the calling convention changed")
    kernel = getattr(module, KERNEL, None)
    args = getattr(kernel, "arg_names", None)
    if kernel is None or (args is not None and len(args) != KERNEL_ARGS):
        raise TypeError(f"{KERNEL}: expected a kernel of {KERNEL_ARGS} parameters, found {args}: the calling "
                        f"convention changed")


def _next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class VllmV1Sampler:
    """vLLM V1's `rejection_sample` as a sampler (see the module docstring).

    - module: vLLM's `vllm.v1.sample.rejection_sampler` or an object with its functions (default:
      imported when the sampler is built).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()` turns it off).
    """

    name = "vllm-v1"
    streams = "explicit"
    resample = "gumbel"  # argmax r / E with E = exp(-G): Gumbel-max
    supports_chunking = False
    supports_logprobs = False
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # vLLM applies top-k / top-p before rejection_sample

    def __init__(self, *, module=None, device=None, validate: bool = True):
        if "triton" not in sys.modules:  # vLLM's kernels are Triton code: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.interpreted = self.device.type != "cuda"
        self.module = load_vllm_v1() if module is None else module
        check_convention(self.module)
        self.greedy_temperature = float(getattr(self.module, "GREEDY_TEMPERATURE", 0))
        self.placeholder = int(getattr(self.module, "PLACEHOLDER_TOKEN_ID", -1))
        self.validate = bool(validate)

    def unvalidated(self) -> "VllmV1Sampler":
        return type(self)(module=self.module, device=self.device, validate=False)

    def __repr__(self) -> str:
        return (f"VllmV1Sampler(module={getattr(self.module, '__name__', self.module)!r}, "
                f"device={str(self.device)!r}, validate={self.validate})")

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        explicit_inputs.admit(self, batch, NOISE, "vLLM applies them before rejection_sample",
                              "vLLM V1 verifies token by token")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, self.device)
        with np.errstate(over="ignore"):  # G below about -88.7 has no float32 E (docs/explicit-adapters.md)
            e = torch.from_numpy(np.exp(-np.asarray(batch.resample_gumbel, np.float64)[:, : prep.vocab]))
        e = e.to(device=self.device, dtype=torch.float32)  # vLLM's exponentials are float32
        bonus = self.bonus_tokens(prep, e)
        if not prep.drafts.any():  # no drafts anywhere: vLLM's ordinary sampler, the bonus tokens
            return explicit_inputs.output(batch, [[int(t)] for t in bonus])
        args = self.arguments(batch, prep, bonus)
        with self._noise(batch, prep, e):
            out = self.module.rejection_sample(**args)
        out = out.cpu().numpy().astype(np.int64)
        valid = (out != self.placeholder) & (out < prep.vocab)  # RejectionSampler.parse_output's reading
        return explicit_inputs.output(batch, [row[keep].tolist() for row, keep in zip(out, valid)])

    def bonus_tokens(self, prep: Prepared, e: torch.Tensor) -> np.ndarray:
        """Each request's bonus: `argmax p / E` of its bonus row (argmax z for greedy requests)."""
        rows = torch.from_numpy(prep.rows + prep.drafts).to(self.device)
        race = torch.argmax(prep.p[rows] / e, dim=-1)
        greedy = torch.argmax(prep.z[rows], dim=-1)
        return torch.where(torch.from_numpy(prep.greedy).to(self.device), greedy, race).cpu().numpy()

    def arguments(self, batch: SpecBatch, prep: Prepared, bonus: np.ndarray) -> dict:
        """The keyword arguments of `rejection_sample` for `batch` (the draft rows of each request)."""
        dev = self.device
        rows = np.concatenate([r0 + np.arange(n) for r0, n in zip(prep.rows, prep.drafts)]).astype(np.int64)
        reqs = np.repeat(np.arange(batch.num_reqs), prep.drafts)
        steps = rows - prep.rows[reqs]
        ids = np.asarray(batch.draft_token_ids, np.int64)[rows + 1]
        rows_t = torch.from_numpy(rows).to(dev)
        temperature = np.asarray(batch.temperature, np.float32)[np.asarray(batch.idx_mapping, np.int64)]
        temperature = np.where(prep.greedy, np.float32(self.greedy_temperature), temperature).astype(np.float32)
        draft_probs = None
        if batch.draft_logits is not None:
            draft_probs = prep.q[torch.from_numpy(reqs).to(dev), torch.from_numpy(steps).to(dev)].contiguous()
        metadata = SimpleNamespace(all_greedy=bool(prep.greedy.all()), all_random=bool(not prep.greedy.any()),
                                   temperature=torch.from_numpy(temperature).to(dev), generators={},
                                   top_k=None, top_p=None)
        return dict(
            draft_token_ids=torch.from_numpy(ids.astype(np.int32)).to(dev),
            num_draft_tokens=[int(n) for n in prep.drafts], max_spec_len=int(prep.drafts.max()),
            cu_num_draft_tokens=torch.from_numpy(np.cumsum(prep.drafts).astype(np.int32)).to(dev),
            draft_probs=draft_probs, target_probs=prep.p[rows_t].contiguous(),
            bonus_token_ids=torch.from_numpy(bonus.astype(np.int32).reshape(-1, 1)).to(dev),
            sampling_metadata=metadata,
        )

    @contextlib.contextmanager
    def _noise(self, batch: SpecBatch, prep: Prepared, e: torch.Tensor):
        """The module's two noise functions replaced by the batch's for the duration of a call."""
        module = self.module
        rows = np.concatenate([r0 + np.arange(n) for r0, n in zip(prep.rows, prep.drafts)]).astype(np.int64)
        u = torch.from_numpy(np.asarray(batch.accept_uniforms, np.float64)[rows]).to(self.device)
        kernel = getattr(module, KERNEL)

        def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
            if num_tokens != u.shape[0]:
                raise RuntimeError(f"generate_uniform_probs was asked for {num_tokens} uniforms; the batch has "
                                   f"{u.shape[0]} draft rows")
            return u.clone()

        def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
                                    draft_probs, target_probs, sampling_metadata, device):
            vocab_size = target_probs.shape[-1]
            recovered = torch.empty_like(draft_token_ids)
            kernel[(len(num_draft_tokens), max_spec_len)](
                recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, e.contiguous(),
                vocab_size, _next_power_of_2(vocab_size), draft_probs is None)
            return recovered

        with _PATCH_LOCK:
            saved = {name: getattr(module, name) for name in ("generate_uniform_probs", "sample_recovered_tokens")}
            module.generate_uniform_probs = generate_uniform_probs
            module.sample_recovered_tokens = sample_recovered_tokens
            try:
                yield
            finally:
                for name, fn in saved.items():
                    setattr(module, name, fn)
