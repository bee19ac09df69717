"""Samplers that carry the known defects of SPEC section 11, declared or not.

Each rule is written here by hand from SPEC 11, apart from the reference's own deviation code, so
that the gate's handling of a declared deviation is tested against an independent carrier:

- `VllmLike`: the float64 reference for token-wise requests and its own NumPy block verification
  (SPEC 4b, `triton-philox` uniforms and noise), with vLLM MRV2's two defects as options:
  `token0` (an empty residual, decided in float32, emits token 0: `empty_residual_token0`) and
  `nan_resets` (the prefix ratio `fmin(log P + log p - log q, 0)`, NaN becoming 0:
  `block_nan_prefix_resets`). No logprobs (the emitted token is patched after the reference).
- `SglangLike`: the float32 inverse-CDF sampler of `examples.explicit_sampler` with SGLang's chain
  kernel's fallback: where no float32 prefix sum exceeds `U * S` (an empty residual included) it
  emits `V' - 1` (`inverse_cdf_last_token`).

The factories pair a carrier with what it declares (`deviations`): honest ones (`vllm_033`,
`token0_declared`, `nan_resets_declared`, `sglang_declared`), one that declares its deviation but
carries another defect (`sglang_declared_cdf_over_p`: inverse CDF over `p`), and ones that declare
a deviation they do not have (`spec_declaring_token0`, `spec_declaring_nan_resets`,
`explicit_declaring_last_token`).

Gate one with:  pytest -p rs_verify --rs-sampler=examples.deviations:vllm_033 --rs-profile ci
"""

from __future__ import annotations

import numpy as np

from rs_verify import SamplerOutput, SpecBatch, validate
from rs_verify.contract import probs
from rs_verify.contract.triton_philox import TRITON_PHILOX
from rs_verify.reference import ReferenceSampler

from .explicit_sampler import ExplicitSampler

__all__ = ["SglangLike", "VllmLike", "explicit_declaring_last_token", "nan_resets_declared", "sglang_declared",
           "sglang_declared_cdf_over_p", "spec_declaring_nan_resets", "spec_declaring_token0", "token0_declared",
           "sglang_undeclared", "vllm_033", "vllm_033_undeclared"]

_F32 = np.float32


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def _empty32(scaled_p: np.ndarray, q: np.ndarray | None, d: int) -> bool:
    """The residual has no positive mass as float32 sees it (vLLM: `exp(log q - log p) < 1` nowhere)."""
    p32 = scaled_p.astype(_F32)
    if q is None:
        others = p32 > 0
        others[d] = False
        return not others.any()
    return not (p32 > q.astype(_F32)).any()


class VllmLike:
    """See the module docstring. `deviations`: what it declares (SPEC 10 and 11)."""

    streams = "triton-philox"
    supports_logprobs = False
    verification_methods = frozenset({"token", "block"})
    sampling_params = frozenset({"min_p", "top_k", "top_p"})

    def __init__(self, *, token0: bool = False, nan_resets: bool = False, deviations=frozenset()):
        self.token0, self.nan_resets = token0, nan_resets
        self.deviations = frozenset(deviations)
        self.name = "vllm-like" + "-token0" * token0 + "-nan-resets" * nan_resets
        self._ref = ReferenceSampler()

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        validate(batch)
        if batch.num_logprobs is not None:
            batch = batch.replace(num_logprobs=None)
        out = self._ref(batch)
        sampled, num = out.sampled.copy(), out.num_sampled.copy()
        if batch.num_reqs == 0:
            return SamplerOutput(sampled=sampled, num_sampled=num)
        z = probs.processed_logits(batch)
        logp = _log_softmax(z)
        cu = np.asarray(batch.cu_num_logits, np.int64)
        temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping, np.int64)]
        for r in np.flatnonzero(temps > 0):
            lo, n = int(cu[r]), int(cu[r + 1] - cu[r] - 1)
            logq = self._draft_logq(batch, int(r), n)
            if batch.verification == "block":
                tokens = self._block(batch, int(r), lo, n, logp, logq)
                sampled[r] = -1
                sampled[r, : len(tokens)] = tokens
                num[r] = len(tokens)
            elif self.token0:
                t = int(num[r]) - 1
                d = int(batch.draft_token_ids[lo + t + 1]) if t < n else -1
                if 0 <= d < z.shape[1]:
                    q = None if logq is None else np.exp(logq[t])
                    if _empty32(np.exp(logp[lo + t]), q, d):
                        sampled[r, t] = 0
        return SamplerOutput(sampled=sampled, num_sampled=num)

    def _draft_logq(self, b: SpecBatch, r: int, n: int):
        if b.draft_logits is None or n == 0:
            return None
        s = int(b.idx_mapping[r])
        x = np.asarray(b.draft_logits[s, :n, : b.effective_vocab_size])
        return _log_softmax(probs.process(x, b.temperature[s]))

    def _block(self, b: SpecBatch, r: int, lo: int, n: int, logp: np.ndarray, logq) -> list:
        """SPEC 4b, by hand, with vLLM's prefix ratio when `nan_resets`."""
        vp = logp.shape[1]
        s = int(b.idx_mapping[r])
        drafts = [int(b.draft_token_ids[lo + i + 1]) for i in range(n)]
        m = next((i for i, d in enumerate(drafts) if not 0 <= d < vp), n)
        log_big_p, prev = [], 0.0
        with np.errstate(invalid="ignore"):
            for i in range(m):
                lp, lq = logp[lo + i, drafts[i]], (0.0 if logq is None else logq[i, drafts[i]])
                x = prev + lp - lq
                if self.nan_resets:
                    prev = float(np.fmin(x, 0.0))  # Triton's minimum: NaN gives the other operand
                else:
                    prev = -np.inf if prev == -np.inf or lp == -np.inf else min(x, 0.0)
                log_big_p.append(prev)
        u = TRITON_PHILOX.uniforms(np.full(m, b.seeds[s]), b.pos[lo : lo + m]).astype(np.float64)
        tau = 0
        for i in range(m):
            big_p = np.exp(log_big_p[i])
            if i + 1 < m:
                p_next = np.exp(logp[lo + i + 1])
                if logq is None:
                    z = big_p * (1.0 - p_next[drafts[i + 1]])
                else:
                    z = np.maximum(big_p * p_next - np.exp(logq[i + 1]), 0.0).sum()
                den = z + 1.0 - big_p
                h = z / den if den > 0 else 1.0
            else:
                h = big_p
            if u[i] <= h:
                tau = i + 1
        out = drafts[:tau]
        j = lo + tau
        g = TRITON_PHILOX.gumbel([b.seeds[s]], [b.pos[j]], vp)[0]
        scores = logp[j].copy()
        if tau < m:
            big_p = 1.0 if tau == 0 else np.exp(log_big_p[tau - 1])
            q = None if logq is None else np.exp(logq[tau])
            if q is None:
                resid = np.exp(logp[j])
                resid[drafts[tau]] = 0.0
            else:
                resid = np.maximum(big_p * np.exp(logp[j]) - q, 0.0)
            if self.token0 and _empty32(big_p * np.exp(logp[j]), q, drafts[tau]):
                return out + [0]
            if (resid > 0).any():
                with np.errstate(divide="ignore"):
                    scores = np.log(resid)
        return out + [int(np.argmax(scores + g))]


class SglangLike(ExplicitSampler):
    """`ExplicitSampler("inverse_cdf")` whose fallback is `V' - 1` wherever no float32 prefix sum
    exceeds `U * S`, an empty residual included (no fallback to `p`)."""

    def __init__(self, *, deviations=frozenset(), cdf_over: str = "residual"):
        super().__init__("inverse_cdf", cdf_over=cdf_over)
        self.deviations = frozenset(deviations)
        self.name = "sglang-like" + ("-cdf-over-p" if cdf_over == "p" else "")

    def _sample(self, b: SpecBatch, r: int, p: np.ndarray, q, d) -> int:
        res = p.copy()
        if d is not None and q is not None:
            res = np.maximum(p - q, _F32(0))
        elif d is not None:
            res[d] = 0
        if self.cdf_over == "p":
            res = p
        u = _F32(b.resample_uniforms[r])
        cum = np.cumsum(res, dtype=_F32)
        hit = (res > 0) & (cum > u * cum[-1])
        return int(np.argmax(hit)) if hit.any() else p.shape[0] - 1


def vllm_033() -> VllmLike:
    """Both vLLM MRV2 defects, both declared."""
    return VllmLike(token0=True, nan_resets=True, deviations={"empty_residual_token0", "block_nan_prefix_resets"})


def token0_declared() -> VllmLike:
    return VllmLike(token0=True, deviations={"empty_residual_token0"})


def nan_resets_declared() -> VllmLike:
    return VllmLike(nan_resets=True, deviations={"block_nan_prefix_resets"})


def sglang_declared() -> SglangLike:
    return SglangLike(deviations={"inverse_cdf_last_token"})


def sglang_declared_cdf_over_p() -> SglangLike:
    """Declares its deviation, and also resamples from `p` instead of the residual: must fail."""
    return SglangLike(deviations={"inverse_cdf_last_token"}, cdf_over="p")


def spec_declaring_token0() -> VllmLike:
    """Follows SPEC 4 (an empty residual samples p) but declares `empty_residual_token0`."""
    return VllmLike(deviations={"empty_residual_token0"})


def spec_declaring_nan_resets() -> VllmLike:
    """Follows SPEC 4b's prefix ratio but declares `block_nan_prefix_resets`."""
    return VllmLike(deviations={"block_nan_prefix_resets"})


def explicit_declaring_last_token() -> ExplicitSampler:
    """The SPEC's inverse CDF (an empty residual falls back to p) declaring `inverse_cdf_last_token`."""
    sampler = ExplicitSampler("inverse_cdf")
    sampler.deviations = frozenset({"inverse_cdf_last_token"})
    return sampler


def vllm_033_undeclared() -> VllmLike:
    """Both vLLM MRV2 defects, neither declared: fails, and says what the failure looks like."""
    return VllmLike(token0=True, nan_resets=True)


def sglang_undeclared() -> SglangLike:
    """SGLang's fallback, undeclared: fails, and says what the failure looks like."""
    return SglangLike()
