"""A float32 NumPy rejection sampler of the `explicit` stream family (SPEC 3c): its random numbers
are the batch's `accept_uniforms`, `resample_gumbel` and `resample_uniforms`, as SGLang's and
FlashInfer's verification kernels take theirs.

Written only against rs-verify's public types. It rounds the uniforms and the noise to float32
(the certification tolerance covers that), accepts with `u * q < p` (SGLang's writing) or
`p / q >= u` (vLLM V1's, which rejects a draft with `q(d) = 0`), and resamples by Gumbel-max
(`resample="gumbel"`), by the equivalent race of exponentials `argmax r / exp(-G)`
(`resample="race"`, declared as Gumbel) or by inverse CDF over float32 prefix sums of the
residual (`resample="inverse_cdf"`: the smallest `x` with `r(x) > 0` and `S_x > U * S`, the last
token with `r > 0` when rounding leaves none). Token verification, model and one-hot drafts, no
sampling parameters, no logprobs; it refuses a batch without the noise it reads (SPEC 9).

Gate it with:  pytest -p rs_verify --rs-sampler=examples.explicit_sampler:inverse_cdf_sampler

`cdf_over="p"` (inverse CDF over `p` instead of the residual) is a defect the suite catches at
the ci profile through the plugin. `cdf_boundary=">="` (the prefix sum compared with `>=`) differs
only where `U * S` equals a prefix sum exactly, a boundary SPEC 8 excuses decision by decision: it
fails only when such ties outnumber the excusal cap (tests/test_explicit.py builds that batch),
not on drawn noise.
"""

from __future__ import annotations

import numpy as np

from rs_verify import SamplerOutput, SpecBatch, validate

__all__ = ["ExplicitSampler", "inverse_cdf_sampler", "race_sampler"]

_F32 = np.float32


class ExplicitSampler:
    streams = "explicit"
    supports_logprobs = False
    verification_methods = frozenset({"token"})

    def __init__(self, resample: str = "gumbel", *, accept: str = "u*q<p", cdf_boundary: str = ">",
                 cdf_over: str = "residual"):
        self.mode = resample
        self.resample = "inverse_cdf" if resample == "inverse_cdf" else "gumbel"  # the declaration
        self.accept, self.cdf_boundary, self.cdf_over = accept, cdf_boundary, cdf_over
        self.name = f"explicit-{resample}"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        validate(batch)
        for field in ("accept_uniforms", "resample_gumbel") + (("resample_uniforms",) * (self.mode == "inverse_cdf")):
            if getattr(batch, field) is None:
                raise ValueError(f"{field}: the explicit family reads it, and the batch carries none")
        vp, k1 = batch.effective_vocab_size, batch.num_speculative_steps + 1
        cu = np.asarray(batch.cu_num_logits, np.int64)
        sampled = np.full((batch.num_reqs, k1), -1, np.int64)
        num = np.zeros(batch.num_reqs, np.int32)
        for r in range(batch.num_reqs):
            tokens = self._request(batch, r, int(cu[r]), int(cu[r + 1] - cu[r] - 1), vp)
            sampled[r, : len(tokens)] = tokens
            num[r] = len(tokens)
        return SamplerOutput(sampled=sampled, num_sampled=num)

    def _request(self, b: SpecBatch, r: int, lo: int, n: int, vp: int) -> list:
        s = int(b.idx_mapping[r])
        t = _F32(b.temperature[s])
        z = np.asarray(b.target_logits[lo : lo + n + 1, :vp], _F32)
        if t == 0:
            out = []
            for i in range(n + 1):
                a = int(np.argmax(z[i]))
                out.append(a)
                if i == n or int(b.draft_token_ids[lo + i + 1]) != a:
                    return out
        p = _softmax(z / t)
        out = []
        for i in range(n):
            d = int(b.draft_token_ids[lo + i + 1])
            if not 0 <= d < vp:
                return out + [self._sample(b, r, p[i], None, None)]
            q = None if b.draft_logits is None else _softmax(np.asarray(b.draft_logits[s, i, :vp], _F32) / t)
            u = _F32(b.accept_uniforms[lo + i])
            qd = _F32(1.0) if q is None else q[d]
            ok = u * qd < p[i, d] if self.accept == "u*q<p" else (qd > 0 and p[i, d] / qd >= u)
            if not ok:
                return out + [self._sample(b, r, p[i], q, d)]
            out.append(d)
        return out + [self._sample(b, r, p[n], None, None)]

    def _sample(self, b: SpecBatch, r: int, p: np.ndarray, q, d) -> int:
        """The resample (residual of draft `d`) or the bonus (`d` None)."""
        res = p.copy()
        if d is not None and q is not None:
            res = np.maximum(p - q, _F32(0))
        elif d is not None:
            res[d] = 0
        if not (res > 0).any():
            res = p
        if self.cdf_over == "p":
            res = p
        if self.mode == "inverse_cdf":
            u = _F32(b.resample_uniforms[r])
            cum = np.cumsum(res, dtype=_F32)
            bound = u * cum[-1]
            hit = (res > 0) & ((cum >= bound) if self.cdf_boundary == ">=" else (cum > bound))
            return int(np.argmax(hit)) if hit.any() else int(np.flatnonzero(res > 0)[-1])
        g = np.asarray(b.resample_gumbel[r], _F32)
        with np.errstate(divide="ignore"):
            if self.mode == "race":
                return int(np.argmax(res / np.exp(-g)))
            return int(np.argmax(np.log(res) + g))


def _softmax(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # -inf and extreme logits: their exp is 0
        e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(_F32)


def inverse_cdf_sampler() -> ExplicitSampler:
    return ExplicitSampler("inverse_cdf")


def race_sampler() -> ExplicitSampler:
    return ExplicitSampler("race")
