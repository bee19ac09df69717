"""SGLang's DSpark block-wise rejection (0.5.23) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.sglang_dspark:DsparkTritonSampler
    pytest -p rs_verify --rs-sampler=rs_verify.adapters.sglang_dspark:DsparkTorchSampler

Both wrap a function of `MODULE` (`sglang/kernels/ops/speculative/dspark/blockwise_rejection.py`),
imported when the sampler is built, called by keyword as SGLang's `BlockwiseRejection.execute` does:

    blockwise_rejection_triton(*,            # or blockwise_rejection_torch: "the same math"
        candidates,           # int64 [bs, n + 1]: slot 0 the last verified token, slots 1.. the drafts
        target_logits,        # [bs * (n + 1), V]: raw target logits (it divides by the temperature)
        draft_logits,         # [bs, >= n, V]: raw draft logits, or None for one-hot drafts
        target_temperatures,  # float32 [bs]
        draft_temperatures,   # float32 [bs]
        noise,                # RejectionNoise(key, counter): make_rejection_noise(random_seed, device)
        cutoff_verify_lens=None,  # a verify budget that caps the accepted drafts: not used (None)
    ) -> (correct_len int32 [bs], bonus int64 [bs], cap_trim_lens int32 [bs])

It accepts iff `log p(d) > log u + log q(d)` and resamples by Gumbel-max over `log max(p - q, 0)`
(over `p` at the bonus row). Its draws are keyed by a server key, a device counter and the row of
the call (`tl.rand` and a MurmurHash3 uniform in the kernel; a `torch.Generator` in the torch
version): no per-request seed, and the Gumbel transform of the kernel is a float32 polynomial
whose result is not specified bit for bit: `streams = "own"` (docs/engines.md).

What the adapter does in SGLang's place:
- One call per request (`bs = 1`), with the noise `make_rejection_noise(request_seed(seed, pos))`
  of the request's state seed and first position, so a request draws the same numbers in any
  batch, chunk or order (SGLang keys by its server seed and the row in the call instead).
- The request's drafts up to its first padded one (SPEC 3c); `target_logits` the raw logits over
  `[0, V')` in float32, `draft_logits` the raw draft logits over `[0, V')`, both temperatures
  the request's.
- Greedy requests: SGLang verifies them elsewhere (argmax): the adapter does it
  (`explicit_inputs.greedy_tokens`). A request with no draft: the Triton version is called with
  `n + 1 = 1` (its bonus row alone); the torch version indexes an empty draft axis there, so the
  adapter samples `softmax(z)` itself with the request's torch generator.
- Emitted: the first `correct_len` drafts, then `bonus`.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import torch

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate
from ..harness import device as backend
from . import explicit_inputs
from .per_request import one_thread, request_seed, sample_p
from .signatures import check_parameters

MODULE = "sglang.kernels.ops.speculative.dspark.blockwise_rejection"
PARAMETERS = ("candidates", "target_logits", "draft_logits", "target_temperatures", "draft_temperatures", "noise")
OPTIONAL = {"cutoff_verify_lens": None}


def check_convention(fn) -> None:
    check_parameters(fn, PARAMETERS + tuple(OPTIONAL), "DSpark")


def load(function: str):
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        raise ImportError(f"rs_verify.adapters.sglang_dspark needs SGLang's {MODULE}, which could not be imported: "
                          f"{exc}. Install sglang (0.5.23), or pass rejection= and make_noise=.") from exc
    for name in (function, "make_rejection_noise"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"{MODULE} has no {name}: the calling convention changed")
    return getattr(module, function), module.make_rejection_noise


class _DsparkSampler:
    streams = "own"
    supports_chunking = False
    supports_logprobs = False
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()
    deviations = frozenset()
    FUNCTION = ""

    def __init__(self, *, rejection=None, make_noise=None, device=None, validate: bool = True):
        if "triton" not in sys.modules:
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        if rejection is None:
            rejection, make_noise = load(self.FUNCTION)
        check_convention(rejection)
        self.rejection, self.make_noise = rejection, make_noise
        self.validate = bool(validate)

    def unvalidated(self):
        return type(self)(rejection=self.rejection, make_noise=self.make_noise, device=self.device, validate=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self.rejection, '__name__', '?')}, device={str(self.device)!r})"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate if self.validate else check_layout)(batch)
        if batch.sampling_params_on():
            raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                             f"(SGLang applies them before the verification; sampling_params is empty)")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (DSpark "
                             f"verifies a chain token by token)")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, self.device)
        states = np.asarray(batch.idx_mapping, np.int64)
        seeds, pos = np.asarray(batch.seeds, np.int64)[states], np.asarray(batch.pos, np.int64)[prep.rows]
        tokens = []
        with one_thread(), torch.inference_mode():  # one small call per request (per_request)
            a = self.prepared(batch, prep)
            for r in range(batch.num_reqs):
                if prep.greedy[r]:
                    tokens.append(explicit_inputs.greedy_tokens(batch, prep, r))
                else:
                    tokens.append(self.verify(a, prep, r, request_seed(int(seeds[r]), int(pos[r]))))
        return explicit_inputs.output(batch, tokens)

    def prepared(self, batch: SpecBatch, prep) -> dict:
        """What every call's arguments are views of (on the device): the candidates (slot 0, the last
        verified token, never read, set to 0), the raw target rows and each request's raw draft rows
        over `[0, V')`, each request's temperature."""
        dev, vp, k = self.device, prep.vocab, batch.num_speculative_steps
        states = np.asarray(batch.idx_mapping, np.int64)
        ids = np.asarray(batch.draft_token_ids, np.int64).copy()
        ids[prep.rows] = 0
        draft = None
        if batch.draft_logits is not None:
            draft = torch.from_numpy(np.array(np.asarray(batch.draft_logits)[states, : max(k, 1), :vp],
                                              np.float32)).to(dev)
        return dict(ids=torch.from_numpy(ids).to(dev), draft=draft,
                    target=torch.from_numpy(np.array(np.asarray(batch.target_logits)[:, :vp], np.float32)).to(dev),
                    t=torch.from_numpy(np.asarray(batch.temperature, np.float32)[states].copy()).to(dev),
                    drafts=np.asarray(batch.draft_token_ids, np.int64))

    def arguments(self, a: dict, prep, r: int, key: int) -> dict:
        lo, n = int(prep.rows[r]), int(prep.drafts[r])
        t = a["t"][r : r + 1]
        return dict(candidates=a["ids"][None, lo : lo + n + 1], target_logits=a["target"][lo : lo + n + 1],
                    draft_logits=None if a["draft"] is None else a["draft"][r : r + 1, : max(n, 1)],
                    target_temperatures=t, draft_temperatures=t.clone(), noise=self.make_noise(key, self.device),
                    **OPTIONAL)

    def verify(self, a: dict, prep, r: int, key: int) -> list[int]:
        n = int(prep.drafts[r])
        correct, bonus, _ = self.rejection(**self.arguments(a, prep, r, key))
        m = int(correct.reshape(-1)[0])
        if not 0 <= m <= n:
            raise RuntimeError(f"request {r}: {self.FUNCTION} returned correct_len {m} for {n} drafts")
        lo = int(prep.rows[r])
        return a["drafts"][lo + 1 : lo + 1 + m].tolist() + [int(bonus.reshape(-1)[0])]


class DsparkTritonSampler(_DsparkSampler):
    """DSpark's `blockwise_rejection_triton` (module docstring): on a CUDA device (its resample
    kernel calls `libdevice.log1p`, which Triton's interpreter does not implement), or given
    `rejection=` (a fake) on a CPU."""

    name = "sglang-dspark-triton"
    FUNCTION = "blockwise_rejection_triton"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.device.type != "cuda" and kwargs.get("rejection") is None:
            raise RuntimeError("DSpark's blockwise_rejection_triton runs on a CUDA device only: its resample kernel "
                               "calls libdevice.log1p, which Triton's interpreter does not implement")
        self.interpreted = self.device.type != "cuda"


class DsparkTorchSampler(_DsparkSampler):
    """DSpark's `blockwise_rejection_torch` (module docstring): torch on the CPU, not interpreted."""

    name = "sglang-dspark-torch"
    FUNCTION = "blockwise_rejection_torch"
    interpreted = False
    # SPEC 11, measured on 0.5.23 (docs/engines.md): an empty residual leaves every score -inf and
    # argmax returns token 0, whatever p is.
    deviations = frozenset({"empty_residual_token0"})

    def verify(self, a: dict, prep, r: int, key: int) -> list[int]:
        if int(prep.drafts[r]) == 0:  # its draft axis is empty: the adapter samples p (module docstring)
            gen = torch.Generator(device=self.device)
            gen.manual_seed(key)
            lo = int(prep.rows[r])
            return [sample_p(prep.p[lo], gen)]
        return super().verify(a, prep, r, key)
