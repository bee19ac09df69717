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

vLLM 0.33.0 changed the convention (`LOGITS`, told apart by the sixth parameter): it takes
`target_logits` (the processed logits `z`; it takes `softmax(z, float32)` itself and `argmax z`
for greedy requests) and six optional parameters, each passed deliberately (`OPTIONAL`: no
synthetic acceptance, no FLy window, `use_fp64_gumbel` as the sampler is built, vLLM's default
False); a parameter the adapter does not know is refused by name. Its `sample_recovered_tokens`
gained `use_fp64_gumbel`; the replacement launches vLLM's own `_sample_recovered_tokens` with
`inv_q = 1 / E` (vLLM's `q.reciprocal()`, float64 with `use_fp64_gumbel`). vLLM 0.34.0 removed
the module: the ImportError says so. Declared deviation (SPEC 11, measured on 0.33.0,
docs/releases.md): `empty_residual_token0`, token 0 recovered from a residual with no float32 mass.

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
import importlib.metadata
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
from . import explicit_inputs, vllm_convention
from .explicit_inputs import Prepared

VLLM_V1_MODULE = "vllm.v1.sample.rejection_sampler"
# The two calling conventions, named by the sixth parameter of rejection_sample: the functions the
# adapter calls or replaces, with the parameters it relies on, in order.
PROBS, LOGITS = "target_probs", "target_logits"
_HEAD = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs")
_RECOVER = ("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens", "draft_token_ids", "draft_probs",
            "target_probs", "sampling_metadata", "device")
# The optional parameters of rejection_sample the adapter knows, each passed deliberately where the
# release has it (None: the sampler's choice): up to 0.32.0 the first three, 0.33.0 all six.
OPTIONAL = {
    "synthetic_mode": False,  # acceptance `u < rate` from configured rates: lossy by design
    "synthetic_conditional_rates": None,
    "use_fp64_gumbel": None,  # float64 exponentials: VllmV1Sampler(use_fp64_gumbel=...), vLLM's default False
    "fly_window_size": None,  # FLy's deferred-rejection window: lossy by design, off
    "fly_entropy_threshold": None,  # read only with FLy
    "fly_entropy_top_k": 3,  # vLLM's default; read only with FLy
}
# Per convention: each function the adapter calls or replaces, the parameters it relies on in
# order, and the optional ones it may also have (any subset, each with a default).
CONVENTIONS = {
    PROBS: {"rejection_sample": ((*_HEAD, "target_probs", "bonus_token_ids", "sampling_metadata"), ()),
            "generate_uniform_probs": (("num_tokens", "num_draft_tokens", "generators", "device"), ()),
            "sample_recovered_tokens": (_RECOVER, ())},
    LOGITS: {"rejection_sample": ((*_HEAD, "target_logits", "bonus_token_ids", "sampling_metadata"), tuple(OPTIONAL)),
             "generate_uniform_probs": (("num_tokens", "num_draft_tokens", "generators", "device"), ()),
             "sample_recovered_tokens": (_RECOVER, ("use_fp64_gumbel",))},
}
# vLLM's own launch of the recovery kernel with inv_q (0.32.0 on); before it, the adapter launches
# the kernel as that release's sample_recovered_tokens does.
RECOVER_LAUNCH = ("_sample_recovered_tokens", ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids",
                                               "draft_probs", "target_probs", "inv_q", "max_spec_len"))
KERNEL = "sample_recovered_tokens_kernel"
# out, cu, draft ids, draft probs, target probs, q (1/E for LOGITS), vocab size, block or padded size,
# no-draft-probs flag (+ the fp64 flag for LOGITS)
KERNEL_ARGS = {PROBS: 9, LOGITS: 10}
NOISE = explicit.READS[explicit.GUMBEL]
V1_RECOVER_BLOCK = 8192  # the vocabulary block vLLM's sample_recovered_tokens launches the kernel with
_PATCH_LOCK = threading.RLock()  # the replacements live in the module's namespace during a call


def _vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def load_vllm_v1():
    """vLLM V1's rejection-sampler module, or an ImportError that says what is missing: a vLLM
    without the module (0.34.0 removed it) is named as such."""
    try:
        return importlib.import_module(VLLM_V1_MODULE)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        version = _vllm_version()
        if version and missing.startswith("vllm.") and VLLM_V1_MODULE.startswith(missing):
            raise ImportError(f"vLLM {version} has no V1 rejection sampler (removed): {VLLM_V1_MODULE} is not in this "
                              f"release. Its model runner v2 sampler has rs_verify.adapters.vllm:VllmSampler.") from exc
        raise ImportError(f"rs_verify.adapters.vllm_v1 needs vLLM's V1 rejection sampler ({VLLM_V1_MODULE}), which "
                          f"could not be imported: {exc}. Install vllm, or pass module= an object with the same "
                          f"functions.") from exc


def _follow(name: str, fn, expected: tuple, optional: tuple) -> tuple[str, ...]:
    """The parameters of `fn` if it takes `expected` first, then any of `optional` (each with a
    default); a TypeError naming each parameter the adapter does not know (required or optional)
    or each one it relies on that is missing."""
    sig = inspect.signature(fn).parameters
    names = tuple(sig)
    head, rest = names[:len(expected)], names[len(expected):]
    unknown = [n for n in rest if n not in optional]
    required = [n for n in unknown if sig[n].default is inspect.Parameter.empty]
    if head != expected or unknown:
        what = (f"; it requires parameters the adapter does not know: {required}" if required else
                f"; it takes optional parameters the adapter does not know: {unknown} (an unread default may "
                f"change what it verifies)" if unknown else "")
        raise TypeError(f"{name}{names}: the vLLM V1 adapter knows {name}{expected} followed by any of {list(optional)}"
                        f"{what}; the calling convention changed")
    missing = [n for n in rest if sig[n].default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"{name}: the parameters {missing} have no default: the calling convention changed")
    return rest


def check_convention(module) -> tuple[str, tuple[str, ...]]:
    """PROBS (probabilities in) or LOGITS (0.29.0 on: logits in, optional parameters), by
    rejection_sample's sixth parameter, and the optional parameters its rejection_sample takes; a
    TypeError naming what differs when the module matches neither."""
    name = getattr(module, "__name__", module)
    if not callable(getattr(module, "rejection_sample", None)):
        raise TypeError(f"{name} has no rejection_sample: the calling convention changed")
    params = tuple(inspect.signature(module.rejection_sample).parameters)
    conv = LOGITS if LOGITS in params else PROBS
    taken = ()
    for fn, (expected, optional) in CONVENTIONS[conv].items():
        if not callable(getattr(module, fn, None)):
            raise TypeError(f"{name} has no {fn}: the calling convention changed")
        rest = _follow(fn, getattr(module, fn), expected, optional)
        taken = rest if fn == "rejection_sample" else taken
    launch = getattr(module, RECOVER_LAUNCH[0], None)
    if launch is not None and conv == LOGITS:
        _follow(RECOVER_LAUNCH[0], launch, RECOVER_LAUNCH[1], ())
    kernel = getattr(module, KERNEL, None)
    args = getattr(kernel, "arg_names", None)
    if kernel is None or (args is not None and len(args) != KERNEL_ARGS[conv]):
        raise TypeError(f"{KERNEL}: expected a kernel of {KERNEL_ARGS[conv]} parameters, found {args}: the calling "
                        f"convention changed")
    return conv, taken


def _next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class VllmV1Sampler:
    """vLLM V1's `rejection_sample` as a sampler (see the module docstring).

    - module: vLLM's `vllm.v1.sample.rejection_sampler` or an object with its functions (default:
      imported when the sampler is built).
    - device: torch device; None picks "cuda" when available, else "cpu" (Triton's interpreter).
    - validate: run `rs_verify.validate` before any device work (`unvalidated()` turns it off).
    - use_fp64_gumbel: 0.33.0's float64 exponentials (`E` and `inv_q = 1 / E` in float64); vLLM's
      default, False, is float32. A vLLM of the older convention has no such option (ValueError).
    - deviations: the declared deviations (SPEC 11); None: what 0.33.0 carries, as measured
      (`empty_residual_token0`); `()` for a module known to follow SPEC 4 exactly.
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
    deviations = frozenset({"empty_residual_token0"})  # SPEC 11: argmax(0 / E) = token 0 from an empty residual

    def __init__(self, *, module=None, device=None, validate: bool = True, use_fp64_gumbel: bool = False,
                 deviations=None):
        if deviations is not None:  # SPEC 11: replaces what 0.33.0 carries (`()`: a SPEC-exact function)
            self.deviations = frozenset(deviations)
        if "triton" not in sys.modules:  # vLLM's kernels are Triton code: the suite's backend choice first
            backend.resolve()
        self.device = torch.device(("cpu" if backend.interpreted() else "cuda") if device is None else device)
        self.interpreted = self.device.type != "cuda"
        if module is None:  # vLLM's triton_utils reads the environment at import (vllm_convention)
            vllm_convention.prepare_environment(self.interpreted)
        self.module = load_vllm_v1() if module is None else module
        self.convention, self.optional = check_convention(self.module)
        if use_fp64_gumbel and "use_fp64_gumbel" not in self.optional:
            raise ValueError("use_fp64_gumbel: this vLLM's rejection_sample has no float64 exponentials")
        # what the adapter read from the release (the release gate's matrix shows it)
        self.detected = {"convention": self.convention, "optional": ",".join(self.optional) or "none",
                         "recover_launch": RECOVER_LAUNCH[0] if hasattr(self.module, RECOVER_LAUNCH[0]) else KERNEL}
        self.use_fp64_gumbel = bool(use_fp64_gumbel)
        self.greedy_temperature = float(getattr(self.module, "GREEDY_TEMPERATURE", 0))
        self.placeholder = int(getattr(self.module, "PLACEHOLDER_TOKEN_ID", -1))
        self.validate = bool(validate)

    def unvalidated(self) -> "VllmV1Sampler":
        return type(self)(module=self.module, device=self.device, validate=False, use_fp64_gumbel=self.use_fp64_gumbel,
                          deviations=self.deviations)

    def __repr__(self) -> str:
        return (f"VllmV1Sampler(module={getattr(self.module, '__name__', self.module)!r}, "
                f"device={str(self.device)!r}, validate={self.validate}, convention={self.convention!r}, "
                f"use_fp64_gumbel={self.use_fp64_gumbel})")

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        explicit_inputs.admit(self, batch, NOISE, "vLLM applies them before rejection_sample",
                              "vLLM V1 verifies token by token")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, self.device)
        # vLLM's exponentials are float32 (float64 with 0.33.0's use_fp64_gumbel)
        e = explicit_inputs.exponentials(batch, prep, torch.float64 if self.use_fp64_gumbel else torch.float32)
        bonus = explicit_inputs.bonus_tokens(prep, e)
        if not prep.drafts.any():  # no drafts anywhere: vLLM's ordinary sampler, the bonus tokens
            return explicit_inputs.output(batch, [[int(t)] for t in bonus])
        args = self.arguments(batch, prep, bonus)
        with self._noise(batch, prep, e):
            out = self.module.rejection_sample(**args)
        out = out.cpu().numpy().astype(np.int64)
        valid = (out != self.placeholder) & (out < prep.vocab)  # RejectionSampler.parse_output's reading
        return explicit_inputs.output(batch, [row[keep].tolist() for row, keep in zip(out, valid)])

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
        args = dict(
            draft_token_ids=torch.from_numpy(ids.astype(np.int32)).to(dev),
            num_draft_tokens=[int(n) for n in prep.drafts], max_spec_len=int(prep.drafts.max()),
            cu_num_draft_tokens=torch.from_numpy(np.cumsum(prep.drafts).astype(np.int32)).to(dev),
            draft_probs=draft_probs, bonus_token_ids=torch.from_numpy(bonus.astype(np.int32).reshape(-1, 1)).to(dev),
            sampling_metadata=metadata,
        )
        if self.convention == PROBS:
            return {**args, "target_probs": prep.p[rows_t].contiguous()}
        # 0.33.0: the processed logits z (vLLM takes softmax(z, float32) itself, argmax z for greedy requests)
        return {**args, "target_logits": prep.z[rows_t].contiguous(),
                **{k: (self.use_fp64_gumbel if k == "use_fp64_gumbel" else OPTIONAL[k]) for k in self.optional}}

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
                                    draft_probs, target_probs, sampling_metadata, device, use_fp64_gumbel=False):
            recovered = torch.empty_like(draft_token_ids)
            vocab_size = target_probs.shape[-1]
            if self.convention == LOGITS:  # vLLM's own launch, with inv_q = 1 / E (q.reciprocal() in vLLM)
                inv_q = e.to(torch.float64 if use_fp64_gumbel else torch.float32).reciprocal().contiguous()
                if hasattr(module, RECOVER_LAUNCH[0]):
                    module._sample_recovered_tokens(recovered, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                                    target_probs, inv_q, max_spec_len=max_spec_len)
                else:  # 0.29.0 to 0.31.x: the launch inside its sample_recovered_tokens, block and flags by name
                    kernel[(len(num_draft_tokens), max_spec_len)](
                        recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q, vocab_size,
                        BLOCK_SIZE=V1_RECOVER_BLOCK, NO_DRAFT_PROBS=draft_probs is None,
                        USE_FP64_GUMBEL=bool(use_fp64_gumbel))
                return recovered
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
