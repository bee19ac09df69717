"""A third-party rejection sampler in plain torch, written only against rs-verify's public types.

This is what a project gated by rs-verify looks like from the outside: it imports
`SpecBatch`, `SamplerOutput`, `LogprobsTensors` and `validate` from `rs_verify` and
nothing else of the project. It implements SPEC sections 2-6 exactly, including the
random streams of section 3a (Philox-4x32-10, written here in int64 torch arithmetic), so
it declares `streams = "triton-philox"` and is certified against the reference. With
`streams="murmur3"` it draws its resampling noise from SPEC 3b instead (MurmurHash3_x86_32 of
`(seed_lo, seed_hi, pos_lo, token)`, also in int64 torch arithmetic), as vLLM's rejection
sampler does from PR 51367 on, and declares that family. It has no internal chunking
(`supports_chunking = False`); the suite chunks it from outside.

Gate it with:  pytest -p rs_verify --rs-sampler=examples.torch_sampler:TorchSampler
(the murmur3 family:  --rs-sampler=examples.torch_sampler:murmur3_sampler)

Vectorised over rows: the acceptance tests of every row at once, then one Gumbel-max draw
per request. Decisions are computed in float64 from the float32 processed logits.
"""

from __future__ import annotations

import numpy as np
import torch

from rs_verify import LogprobsTensors, SamplerOutput, SpecBatch, validate

__all__ = ["TorchSampler", "murmur3_hash", "murmur3_noise", "murmur3_sampler", "philox_randint", "philox_rand",
           "uniform_from_int"]

# -- Philox-4x32-10 (SPEC section 3), exact in int64 arithmetic ------------------

_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_M32, _M16 = 0xFFFFFFFF, 0xFFFF
_SCALE = 4.6566127342e-10  # Triton's int32 -> uniform scale (a float32 constant)
TINY = 4.6566127342e-10


def _mulhilo(const: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of `const * x` for `x` in [0, 2**32), without int64 overflow.

    `const` is split into 16-bit halves: each partial product stays below 2**48.
    """
    hi_part = x * (const >> 16)  # < 2**48; the product is hi_part * 2**16 + lo_part
    low = x * (const & _M16)  # < 2**48
    low.add_((hi_part & _M16).bitwise_left_shift_(16))  # < 2**49: the low 48 bits of the product, plus carry
    hi = hi_part.bitwise_right_shift_(16).add_(low >> 32)
    return hi, low.bitwise_and_(_M32)


def _words(a: torch.Tensor, bits64: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) 32-bit words of an int64 tensor as int64 in [0, 2**32); hi = 0 for 32-bit values."""
    a = a.to(torch.int64)
    lo = a & _M32
    hi = (a >> 32) & _M32 if bits64 else torch.zeros_like(lo)
    return lo, hi


_BLOCK = 1 << 14  # elements per block: in cache, and below torch's parallel grain (no thread-pool sync per op)


def philox_randint(seed: torch.Tensor, offset: torch.Tensor, *, seed_is_int32: bool = False,
                   offset_is_int32: bool = False) -> torch.Tensor:
    """`tl.randint(seed, offset)`: the first Philox-4x32-10 output word as int32 (broadcasts).

    Widening as Triton does it: an int64 seed/offset gives its low and high words; an int32
    one (`seed_is_int32`, `offset_is_int32`) its 32 bits and a zero high word, without sign
    extension (the resample seed `g` and the token offset `x`).
    """
    shape = torch.broadcast_shapes(seed.shape, offset.shape)
    k0, k1 = (w.expand(shape).reshape(-1) for w in _words(seed, not seed_is_int32))
    c0, c1 = (w.expand(shape).reshape(-1) for w in _words(offset, not offset_is_int32))
    out = torch.empty(k0.shape, dtype=torch.int64, device=k0.device)
    for i in range(0, out.numel(), _BLOCK):
        sl = slice(i, i + _BLOCK)
        out[sl] = _philox_block(k0[sl], k1[sl], c0[sl], c1[sl])
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32).reshape(shape)


def _philox_block(k0, k1, c0, c1):
    """Ten rounds on counters `(c0, c1, 0, 0)` with key `(k0, k1)`; the first output word."""
    # Round 1 with c2 = c3 = 0: B * c2 = 0.
    hi_a, lo_a = _mulhilo(_ROUND_A, c0)
    c0, c2, c1, c3 = c1 ^ k0, hi_a ^ k1, torch.zeros_like(c0), lo_a
    for r in range(1, 10):
        k0r = (k0 + ((r * _KEY_A) & _M32)) & _M32
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        if r == 9:
            return hi_b ^ c1 ^ k0r
        k1r = (k1 + ((r * _KEY_B) & _M32)) & _M32
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c2, c1, c3 = hi_b.bitwise_xor_(c1).bitwise_xor_(k0r), hi_a.bitwise_xor_(c3).bitwise_xor_(k1r), lo_b, lo_a
    raise AssertionError("unreachable")


def uniform_from_int(w: torch.Tensor) -> torch.Tensor:
    """Triton's int32 -> float32 uniform: `(w < 0 ? ~w : w) * 4.6566127342e-10` in float32."""
    w = torch.where(w < 0, ~w, w)
    return w.to(torch.float32) * torch.tensor(_SCALE, dtype=torch.float32)


def philox_rand(seed: torch.Tensor, offset: torch.Tensor, **kw) -> torch.Tensor:
    """`tl.rand(seed, offset)`: float32 uniforms in [0, 1)."""
    return uniform_from_int(philox_randint(seed, offset, **kw))


# -- MurmurHash3_x86_32 (SPEC section 3b), exact in int64 arithmetic ----------

_C1, _C2, _N_ADD, _F1, _F2 = 0xCC9E2D51, 0x1B873593, 0xE6546B64, 0x85EBCA6B, 0xC2B2AE35
_NOISE_FLOOR = -24.0 * float(np.log(2.0))  # log(2**-24): u = 1.0 gets the finite noise -log(24 log 2)


def _mul32(const: int, x: torch.Tensor) -> torch.Tensor:
    """`const * x mod 2**32` for `x` in [0, 2**32)."""
    return _mulhilo(const, x)[1]


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def murmur3_hash(*words: torch.Tensor) -> torch.Tensor:
    """MurmurHash3_x86_32 with hash seed 0 of the key made of the given 32-bit words (int64 tensors
    in [0, 2**32), broadcast), as int64 in [0, 2**32)."""
    shape = torch.broadcast_shapes(*(w.shape for w in words))
    h = torch.zeros(shape, dtype=torch.int64, device=words[0].device)
    for w in words:
        k = _mul32(_C2, _rotl32(_mul32(_C1, w.expand(shape)), 15))
        h = (_rotl32(h ^ k, 13) * 5 + _N_ADD) & _M32
    h = h ^ (4 * len(words))
    h = _mul32(_F1, h ^ (h >> 16))
    h = _mul32(_F2, h ^ (h >> 13))
    return h ^ (h >> 16)


def murmur3_noise(seed: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """`G_x` of SPEC 3b (float64, broadcast): the hash of `(seed_lo, seed_hi, pos_lo, x)`, its float32
    uniform `fp32(h >> 16) * 2**-16 + (fp32(h & 0xFFFF) + 0.5) * 2**-32`, then
    `-log(-log(max(1 - u, 2**-24)))` (`log(1 - u)` by `log1p(-u)`)."""
    seed_lo, seed_hi = _words(seed, True)
    pos_lo, _ = _words(pos, True)
    h = murmur3_hash(seed_lo, seed_hi, pos_lo, tok & _M32)
    hi = (h >> 16).to(torch.float32) * torch.tensor(2.0**-16, dtype=torch.float32)
    lo = ((h & _M16).to(torch.float32) + 0.5) * torch.tensor(2.0**-32, dtype=torch.float32)
    u = (hi + lo).double()  # the float32 sum, rounded to nearest
    return -torch.log(-torch.clamp(torch.log1p(-u), min=_NOISE_FLOOR))


# -- the sampler -------------------------------------------------------------


def _processed(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`fp32(x) / T` with IEEE division, untouched when T is 0 or 1 (SPEC section 2); t per row."""
    t = t.reshape(t.shape + (1,) * (x.dim() - t.dim()))
    keep = (t == 0) | (t == 1)
    return torch.where(keep, x, x / torch.where(keep, torch.ones_like(t), t))


class TorchSampler:
    """SPEC sections 2-6 in torch on CPU (or any torch device), validated, no internal chunking.

    - validate: reject bad batches with `rs_verify.validate` (SPEC section 9) before any work.
    - device: the torch device computations run on (default "cpu").
    - streams: "triton-philox" (SPEC 3a, the default) or "murmur3" (3b: the resampling noise is
      hashed; the acceptance uniforms are 3a's in both).
    """

    name = "torch"
    streams = "triton-philox"
    supports_chunking = False
    STREAMS = ("triton-philox", "murmur3")

    def __init__(self, *, validate: bool = True, device: str = "cpu", streams: str = "triton-philox"):
        if streams not in self.STREAMS:
            raise ValueError(f"streams={streams!r}: this sampler draws one of {self.STREAMS}")
        self.validate = bool(validate)
        self.device = torch.device(device)
        self.streams = streams
        if streams != type(self).streams:
            self.name = f"{type(self).name} ({streams})"

    def __repr__(self) -> str:
        extra = "" if self.streams == type(self).streams else f", streams={self.streams!r}"
        return f"{type(self).__name__}(validate={self.validate}, device={str(self.device)!r}{extra})"

    def resample_noise(self, seed: torch.Tensor, pos: torch.Tensor, v_eff: int) -> torch.Tensor:
        """`G_x` (float64 `[rows, v_eff]`) of the rows keyed by `(seed, pos)` in the sampler's family."""
        tok = torch.arange(v_eff, device=seed.device, dtype=torch.int64)
        if self.streams == "murmur3":
            return murmur3_noise(seed[:, None], pos[:, None], tok[None, :])
        g = philox_randint(seed, pos)  # int32: the resample seed
        v = torch.clamp(philox_rand(g[:, None], tok[None, :], seed_is_int32=True, offset_is_int32=True), min=TINY)
        return -torch.log(-torch.log1p(-v.double()))

    # The hooks a deliberately broken subclass overrides (examples/broken_sampler.py).
    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Residual mass of model drafts: `max(p - q, 0)` (unnormalised)."""
        return torch.clamp(p - q, min=0.0)

    def bonus_rows(self, cu: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """The row whose noise and p a request's bonus token uses: its last row."""
        return cu[:-1] + n

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        del max_chunk_logits  # no internal chunking (SPEC section 10)
        if self.validate:
            validate(batch)
        dev = self.device
        r_count, k = batch.num_reqs, int(batch.num_speculative_steps)
        n_rows = batch.num_logits
        if r_count == 0:
            return self._empty(batch)

        def t(a, dtype):
            return torch.from_numpy(np.array(a, copy=True)).to(device=dev, dtype=dtype)

        cu = t(batch.cu_num_logits, torch.int64)
        n = cu[1:] - cu[:-1] - 1  # drafts per request
        states = t(batch.idx_mapping, torch.int64)
        req_of_row = torch.repeat_interleave(torch.arange(r_count, device=dev), n + 1)
        state_of_row = states[req_of_row]
        step_of_row = torch.arange(n_rows, device=dev) - cu[:-1][req_of_row]
        temp = t(batch.temperature, torch.float32)[state_of_row]
        seed = t(batch.seeds, torch.int64)[state_of_row]
        pos = t(batch.pos, torch.int64)
        greedy = temp == 0
        v_eff = batch.effective_vocab_size

        x = t(batch.target_logits, torch.float32)
        z_full = _processed(x, temp)  # [N, V]
        z = z_full[:, :v_eff]
        logp = torch.log_softmax(z.double(), dim=1)  # -inf for masked tokens
        argmax = torch.argmax(z, dim=1)  # first maximal index on ties

        # Draft of row j: draft_token_ids[j + 1] for verifying rows (step < n_r).
        ids = t(batch.draft_token_ids, torch.int64)
        verifying = step_of_row < n[req_of_row]
        draft = torch.full((n_rows,), -1, dtype=torch.int64, device=dev)
        draft[:-1] = ids[1:]
        draft = torch.where(verifying, draft, torch.full_like(draft, -1))
        valid = verifying & (draft >= 0) & (draft < v_eff)
        d_safe = torch.where(valid, draft, torch.zeros_like(draft))
        logp_d = logp.gather(1, d_safe[:, None])[:, 0]

        model = batch.draft_logits is not None
        logq = None
        if model and k > 0:
            dl = t(batch.draft_logits, torch.float32)
            step = torch.clamp(step_of_row, max=k - 1)
            q_rows = _processed(dl[state_of_row, step, :v_eff], temp)
            logq = torch.log_softmax(q_rows.double(), dim=1)

        # Acceptance (SPEC section 4).
        u = torch.clamp(philox_rand(seed, pos), min=TINY)
        log_u = torch.log(u.double())
        if logq is not None:
            stochastic_accept = logp_d > log_u + logq.gather(1, d_safe[:, None])[:, 0]
        else:
            stochastic_accept = logp_d > log_u
        accept = valid & torch.where(greedy, draft == argmax, stochastic_accept)

        # First rejected step per request (n_r when every draft is accepted).
        acc = torch.zeros((r_count, k + 1), dtype=torch.bool, device=dev)
        acc[req_of_row, step_of_row] = accept
        stop = torch.cumprod(acc.to(torch.int64), dim=1).sum(dim=1)  # leading accepts
        stop = torch.minimum(stop, n)
        rejected = stop < n
        final_row = torch.where(rejected, cu[:-1] + stop, self.bonus_rows(cu, n))

        # The emitted token: argmax for greedy, else Gumbel-max over the residual or p.
        emitted = argmax[final_row].clone()
        sto = ~greedy[final_row]
        if bool(sto.any()):
            rows = final_row[sto]
            d = draft[rows]
            d_ok = valid[rows] & rejected[sto]  # a real draft was rejected: use the residual
            log_target = logp[rows].clone()  # the bonus row, or a padded draft: p itself
            if logq is not None:
                resid = self.residual(torch.exp(logp[rows]), torch.exp(logq[rows]))
                log_target = torch.where(d_ok[:, None], torch.log(resid), log_target)
            else:
                hit = torch.nonzero(d_ok)[:, 0]
                log_target[hit, d[hit]] = -torch.inf  # one-hot: p with r(d) = 0
            empty = ~torch.isfinite(log_target).any(dim=1)  # no positive mass: p itself
            log_target = torch.where(empty[:, None], logp[rows], log_target)
            gumbel = self.resample_noise(seed[rows], pos[rows], v_eff)
            emitted[sto] = torch.argmax(log_target + gumbel, dim=1)

        sampled = torch.full((r_count, k + 1), -1, dtype=torch.int64, device=dev)
        keep = verifying & (step_of_row < stop[req_of_row])
        sampled[req_of_row[keep], step_of_row[keep]] = draft[keep]
        sampled[torch.arange(r_count, device=dev), stop] = emitted
        num_sampled = (stop + 1).to(torch.int32)

        logprobs = None
        if batch.num_logprobs is not None:
            lp_rows = x if batch.logprobs_mode == "raw" else z_full
            row_token = torch.zeros(n_rows, dtype=torch.int64, device=dev)
            emits = step_of_row <= stop[req_of_row]
            row_token[emits] = sampled[req_of_row[emits], step_of_row[emits]]
            logprobs = self._logprobs(lp_rows, row_token, int(batch.num_logprobs), batch)
        return SamplerOutput(sampled=sampled.cpu().numpy(), num_sampled=num_sampled.cpu().numpy(),
                             logprobs=logprobs)

    @staticmethod
    def _logprobs(rows: torch.Tensor, token: torch.Tensor, k: int, batch: SpecBatch) -> LogprobsTensors:
        """SPEC section 6 over the whole vocabulary [0, V): column 0 the emitted token, then top-k."""
        lp = torch.log_softmax(rows.double(), dim=1).float()
        chosen = lp.gather(1, token[:, None])
        order = torch.sort(-lp, dim=1, stable=True).indices[:, :k]  # descending, ties by ascending id
        ids = torch.cat([token[:, None], order], dim=1)
        values = torch.cat([chosen, lp.gather(1, order)], dim=1)
        ranks = 1 + (lp > chosen).sum(dim=1)
        cu = [int(c) for c in np.asarray(batch.cu_num_logits)]
        return LogprobsTensors(
            token_ids=ids.cpu().numpy().astype(np.int64),
            logprobs=values.cpu().numpy().astype(np.float32),
            ranks=ranks.cpu().numpy().astype(np.int64),
            cu_num_generated_tokens=None if batch.num_logits == batch.num_reqs else cu,
        )

    @staticmethod
    def _empty(batch: SpecBatch) -> SamplerOutput:
        k1 = int(batch.num_speculative_steps) + 1
        logprobs = None
        if batch.num_logprobs is not None:
            kk = int(batch.num_logprobs) + 1
            logprobs = LogprobsTensors(np.zeros((0, kk), np.int64), np.zeros((0, kk), np.float32),
                                       np.zeros(0, np.int64), None)
        return SamplerOutput(np.zeros((0, k1), np.int64), np.zeros(0, np.int32), logprobs)


def murmur3_sampler(**kwargs) -> TorchSampler:
    """The sampler of the murmur3 family (SPEC 3b): `TorchSampler(streams="murmur3", ...)`."""
    return TorchSampler(streams="murmur3", **kwargs)
