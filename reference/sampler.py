"""The float64 NumPy reference sampler: the oracle of the suite (SPEC sections 2-6 and 8).

Every decision is taken in float64 from the exact float32 uniforms of the SPEC
random streams (`rs_verify.spec.philox`) and can be reported with its margin
(`verify_with_trace`). The work is vectorized over rows and requests and done
in slabs of whole requests, so memory stays bounded:

1. processed logits `z` of the slab (float32, IEEE division by `T`);
2. every acceptance test at once: `log p_j(d) > log u_j + log q_i(d)` (model
   drafts) or `log p_j(d) > log u_j` (one-hot); greedy `d_i == argmax z`;
3. each request's first rejection `t_r` by a segmented minimum;
4. one resample/bonus pass: one row of `V'` Gumbel noises per request,
   `argmax_x (log r(x) + G_x)`.

Residual scores use the unnormalized `log max(p - q, 0)`: a per-row constant
changes no argmax and no gap. The big temporaries come from per-thread scratch
buffers (`reference._workspace`). Imports only NumPy and the batch contract
(never torch or triton).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rs_verify.spec.batch import LogprobsTensors, SamplerOutput, SpecBatch
from rs_verify.spec.chunking import empty_output, iter_request_chunks, verify_chunked
from rs_verify.spec.validation import validate as validate_batch

from rs_verify.spec import philox
from rs_verify.spec.scratch import scratch

__all__ = [
    "Decision",
    "ReferenceSampler",
    "RequestTrace",
    "acceptance_uniforms",
    "draft_probs",
    "gumbel_noise",
    "log_softmax64",
    "processed_logits",
    "target_probs",
]

#: float64 elements per slab working array (rows x vocab): bounds memory, keeps slabs cache-sized.
SLAB_ELEMS = 1 << 18


# -- traces (SPEC section 8) ---------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Decision:
    """One decision of the reference, with its margin.

    - `request`: batch index `r`; `step`: `i` (`n_r` for the bonus); `row`: `j = cu[r] + step`.
    - `kind`: `"accept"` (a stochastic acceptance test) or `"argmax"` (a greedy
      argmax, a resample or a bonus).
    - `token`: the draft id tested (accept) or the winning token (argmax).
    - `accepted`: the outcome of an acceptance test; None for an argmax.
    - `margin`: accept: `log p(d) - log q(d) - log u` (`log q = 0` for one-hot
      drafts; `-inf` for padded or out-of-range drafts and whenever `p(d) = 0`);
      argmax: best minus second-best score (`inf` with a single candidate).
    - `gaps`: argmax only: float64 `[V']`, best score minus each candidate's
      (0 at the winner, `inf` where the score is `-inf`).
    - `scale`: `L = max(1, largest finite |z|)` over the target row and, where
      a draft distribution enters the decision (model-draft acceptance tests
      and residual resamples), the processed draft row.
    """

    request: int
    step: int
    row: int
    kind: str
    token: int
    accepted: bool | None
    margin: float
    gaps: np.ndarray | None
    scale: float


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """The tokens emitted for one request and the decisions that produced them, in order."""

    request: int
    tokens: list
    decisions: list


# -- pure helpers -----------------------------------------------------------------------


def _row_layout(cu: np.ndarray):
    """Per row of `cu` (int64, rebased or not): request index, step, and whether it is the bonus row."""
    sizes = np.diff(cu)
    req = np.repeat(np.arange(sizes.shape[0]), sizes)
    step = np.arange(int(cu[-1] - cu[0]), dtype=np.int64) - (cu[:-1] - cu[0])[req]
    bonus = step == (sizes - 1)[req]
    return req, step, bonus


def _divide(x: np.ndarray, t: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`fp32(x) / T` per row (IEEE float32 division); rows with `T` in {0, 1} are left untouched.

    `x` float32 `[rows, V]`, `t` float32 `[rows]`. Returns `x` itself when no
    row divides; otherwise writes into `out` (may be `x`) or a new array.
    """
    div = (t != 0) & (t != 1)
    if not div.any():
        return x
    if out is None:
        out = np.empty(x.shape, np.float32)
    if div.all():
        return np.divide(x, t[:, None], out=out)
    if out is not x:
        np.copyto(out, x)
    rows = np.flatnonzero(div)
    out[rows] = np.divide(x[rows], t[rows, None], dtype=np.float32)
    return out


def _softmax_parts(z32: np.ndarray, y: np.ndarray, e: np.ndarray | None):
    """Per row of float32 logits, in float64: `y = z - max z`, `e = exp(y)` (into `y` when `e` is None), `s = sum(e)`.

    Then `log p = y - log s` and `p = e / s`. Returns `(m, y, e, s)` with `m`
    the row max (exact: a float32 value).
    """
    m = z32.max(axis=1).astype(np.float64)
    np.subtract(z32, m[:, None], out=y)
    if e is None:
        e = y
    np.exp(y, out=e)
    return m, y, e, e.sum(axis=1)


def log_softmax64(z: np.ndarray) -> np.ndarray:
    """Float64 log-softmax over the last axis (`-inf` logits get `-inf`)."""
    z = np.asarray(z)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(z, axis=-1, keepdims=True).astype(np.float64)  # exact for float32 input
        y = np.subtract(z, m, dtype=np.float64)
        s = np.exp(y).sum(axis=-1, keepdims=True)
        y -= np.log(s)
    return y


def processed_logits(batch: SpecBatch, *, full_vocab: bool = False) -> np.ndarray:
    """`z` of every row (SPEC section 2): float32 `[N, V']` (`[N, V]` with `full_vocab`); raw for greedy rows."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    v = batch.vocab_size if full_vocab else batch.effective_vocab_size
    temp = np.asarray(batch.temperature)[np.repeat(np.asarray(batch.idx_mapping, np.int64), np.diff(cu))]
    x = np.asarray(batch.target_logits)[:, :v]
    with np.errstate(over="ignore"):
        return np.array(_divide(x, temp), dtype=np.float32)


def target_probs(batch: SpecBatch) -> np.ndarray:
    """`p` of every row over `[0, V')`, float64 `[N, V']` (greedy rows: softmax of the raw logits)."""
    return np.exp(log_softmax64(processed_logits(batch)))


def draft_probs(batch: SpecBatch) -> np.ndarray | None:
    """`q_i` of every row `j = cu[r] + i` over `[0, V')`, float64 `[N, V']`; bonus rows NaN; None for one-hot drafts."""
    if batch.draft_logits is None:
        return None
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    v = batch.effective_vocab_size
    req, step, bonus = _row_layout(cu)
    states = np.asarray(batch.idx_mapping, np.int64)[req]
    q = np.full((batch.num_logits, v), np.nan)
    rows = np.flatnonzero(~bonus)
    if rows.size:
        d = np.asarray(batch.draft_logits)[states[rows], step[rows], :v]
        with np.errstate(over="ignore"):
            d = _divide(d, np.asarray(batch.temperature)[states[rows]])
        q[rows] = np.exp(log_softmax64(d))
    return q


def acceptance_uniforms(batch: SpecBatch) -> np.ndarray:
    """`u_j = max(rand(seeds[s], pos[j]), TINY)` of every row, float32 `[N]`."""
    cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
    seeds = np.asarray(batch.seeds)[np.repeat(np.asarray(batch.idx_mapping, np.int64), np.diff(cu))]
    return np.maximum(philox.rand(seeds, np.asarray(batch.pos)), philox.TINY)


def gumbel_noise(seeds, pos, vocab: int) -> np.ndarray:
    """Resampling noise `G_x` of rows with the given seeds and positions: float64 `[len, vocab]`.

    `g = randint(seed, pos)` (int32, widened without sign extension),
    `v_x = max(rand(g, x), TINY)` for int32 `x`, `G_x = -log(-log1p(-v_x))`.
    """
    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    out = np.empty((seeds.shape[0], int(vocab)), np.float64)
    _log_exponential_noise(seeds, np.asarray(pos, dtype=np.int64).reshape(-1), out)
    return np.negative(out, out=out)


def _log_exponential_noise(seeds: np.ndarray, pos: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`log E_x` with `E_x = -log1p(-v_x)` into float64 `out [len, vocab]`; `G_x = -log E_x`."""
    rows, vocab = out.shape
    g = philox.randint(seeds, pos)
    v = philox.rand(g[:, None], _token_offsets(vocab), out=scratch("noise.v", (rows, vocab), np.float32))
    np.maximum(v, philox.TINY, out=v)
    np.negative(v, out=out)
    np.log1p(out, out=out)
    np.negative(out, out=out)
    return np.log(out, out=out)


def _token_offsets(vocab: int) -> np.ndarray:
    """int32 token offsets `[1, vocab]` (the resample offsets are int32: `offset_hi = 0`)."""
    return np.arange(vocab, dtype=np.int32)[None, :]


def _finite_absmax(a: np.ndarray) -> np.ndarray:
    """Per row: the largest finite `|a|` (0 if none)."""
    m = np.abs(a.astype(np.float64))
    m[~np.isfinite(m)] = 0.0
    return m.max(axis=1) if m.shape[1] else np.zeros(m.shape[0])


def _argmax_stats(scores: np.ndarray):
    """Per row of float64 scores: gaps (best minus each; inf at -inf) and the best/second-best margin."""
    best = scores.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        gaps = best - scores
    gaps[np.isneginf(scores) & np.isfinite(best)] = np.inf
    if scores.shape[1] < 2:
        margin = np.full(scores.shape[0], np.inf)
    else:
        margin = np.partition(gaps, 1, axis=1)[:, 1]  # the winner's gap, 0, is the smallest
    return gaps, margin


def _topk(lp: np.ndarray, k: int) -> np.ndarray:
    """Per row: the ids of the `k` largest entries, descending, ties by ascending id (int64 `[rows, k]`)."""
    rows, v = lp.shape
    if k == 0 or rows == 0:
        return np.zeros((rows, k), dtype=np.int64)
    neg = -lp
    if 4 * k >= v:
        return np.argsort(neg, axis=1, kind="stable")[:, :k].astype(np.int64)
    # The k-th largest value; rows whose ties straddle it take the full stable sort.
    kth = np.partition(neg, k - 1, axis=1)[:, k - 1 : k]
    cand = np.argpartition(neg, k - 1, axis=1)[:, :k]
    order = np.lexsort((cand, np.take_along_axis(neg, cand, axis=1)), axis=1)
    out = np.take_along_axis(cand, order, axis=1).astype(np.int64)
    straddle = np.flatnonzero((neg <= kth).sum(axis=1) > k)
    if straddle.size:
        out[straddle] = np.argsort(neg[straddle], axis=1, kind="stable")[:, :k]
    return out


# -- the sampler --------------------------------------------------------------------


class ReferenceSampler:
    """The float64 reference sampler (SPEC sections 2-6; the protocol of section 10).

    - `validate`: validate every batch (SPEC section 9) before verifying it.
    - `slab_elems`: float64 elements per working array; slabs of whole requests
      of at most `max(1, slab_elems // V)` rows are verified one at a time.
    """

    name = "reference"
    supports_chunking = True
    streams = "spec"

    def __init__(self, *, validate: bool = True, slab_elems: int = SLAB_ELEMS):
        self.validate = bool(validate)
        self.slab_elems = int(slab_elems)

    def __repr__(self) -> str:
        return f"ReferenceSampler(validate={self.validate})"

    def unvalidated(self) -> ReferenceSampler:
        """The same sampler without input validation."""
        return ReferenceSampler(validate=False, slab_elems=self.slab_elems)

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        """Verify `batch` (SPEC sections 4-6); `max_chunk_logits` None: the whole batch at once."""
        if self.validate:
            validate_batch(batch)
        if max_chunk_logits is None:
            return self._verify(batch, trace=False)[0]
        return verify_chunked(batch, lambda b: self._verify(b, trace=False)[0], max_chunk_logits)

    def verify_with_trace(self, batch: SpecBatch) -> tuple[SamplerOutput, list[RequestTrace]]:
        """The output and one `RequestTrace` per request, with every decision's margin (SPEC section 8)."""
        if self.validate:
            validate_batch(batch)
        return self._verify(batch, trace=True)

    def _verify(self, batch: SpecBatch, trace: bool):
        if batch.num_reqs == 0:
            return empty_output(batch), []
        cu = np.asarray(batch.cu_num_logits, dtype=np.int64)
        rows_cap = max(1, self.slab_elems // max(1, batch.vocab_size))
        k1 = batch.num_speculative_steps + 1
        sampled = np.empty((batch.num_reqs, k1), dtype=np.int64)
        num = np.empty(batch.num_reqs, dtype=np.int32)
        shared = _BatchArrays(batch)
        lp_parts, traces = [], []
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for ra, rb in iter_request_chunks(cu, rows_cap):
                slab = _Slab(shared, cu, ra, rb, trace)
                s_sampled, s_num, s_lp, s_traces = slab.run()
                sampled[ra:rb] = s_sampled
                num[ra:rb] = s_num
                lp_parts.append(s_lp)
                traces.extend(s_traces)
        logprobs = None
        if batch.num_logprobs is not None:
            logprobs = LogprobsTensors.cat(lp_parts, batch.cu_num_logits)
        return SamplerOutput(sampled=sampled, num_sampled=num, logprobs=logprobs), traces


class _BatchArrays:
    """The batch's arrays as the slabs read them (draft logits flattened to `[S * K, Vd]` once)."""

    def __init__(self, batch: SpecBatch):
        self.batch = batch
        self.k = batch.num_speculative_steps
        self.v = batch.vocab_size
        self.vp = batch.effective_vocab_size
        self.x = np.asarray(batch.target_logits)
        self.dti = np.asarray(batch.draft_token_ids)
        self.pos = np.asarray(batch.pos)
        self.idx = np.asarray(batch.idx_mapping, dtype=np.int64)
        self.temperature = np.asarray(batch.temperature)
        self.seeds = np.asarray(batch.seeds)
        dl = batch.draft_logits
        self.draft = None if dl is None else np.asarray(dl).reshape(-1, dl.shape[2])


class _Slab:
    """Requests `[ra, rb)` of a batch, verified together (all arrays slab-local)."""

    def __init__(self, b: _BatchArrays, cu: np.ndarray, ra: int, rb: int, trace: bool):
        self.b, self.trace = b, trace
        self.ra = ra
        self.lo, self.hi = int(cu[ra]), int(cu[rb])
        self.cu = cu[ra : rb + 1] - cu[ra]
        self.nreq, self.nrow = rb - ra, self.hi - self.lo
        self.k1 = b.k + 1
        self.vp = b.vp
        self.states = b.idx[ra:rb]
        self.temp = b.temperature[self.states]
        self.seeds = b.seeds[self.states]
        self.n = np.diff(self.cu) - 1
        self.req, self.step, self.bonus = _row_layout(self.cu)
        self.greedy = self.temp == 0
        self.pos = b.pos[self.lo : self.hi]
        d = np.full(self.nrow, -1, dtype=np.int64)
        d[:-1] = b.dti[self.lo + 1 : self.hi]
        d[self.bonus] = -1
        self.d = d
        self.row_temp = self.temp[self.req]
        # Processed logits over [0, V'), float32 (raw for greedy rows and T == 1).
        self.x = b.x[self.lo : self.hi]
        self.z = _divide(self.x[:, : self.vp], self.row_temp, scratch("slab.z", (self.nrow, self.vp), np.float32))

    # -- pieces -----------------------------------------------------------------------

    def _gather(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Processed target logits of the given slab rows, float32 `[len, V']` (scratch)."""
        return np.take(self.z, rows, axis=0, out=scratch(name, (rows.shape[0], self.vp), np.float32))

    def _draft_rows(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Processed draft logits of the given slab rows (the draft row of their step), float32 `[len, V']`."""
        flat = self.states[self.req[rows]] * self.b.k + self.step[rows]
        buf = scratch(name, (rows.shape[0], self.b.draft.shape[1]), np.float32)
        q = np.take(self.b.draft, flat, axis=0, out=buf)[:, : self.vp]
        return _divide(q, self.row_temp[rows], out=q)

    @staticmethod
    def _at(z32: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """`z[i, tok[i]]` as float64 (`tok` already clipped into range)."""
        return z32[np.arange(z32.shape[0]), tok].astype(np.float64)

    # -- verification -----------------------------------------------------------------

    def run(self):
        nrow, nreq = self.nrow, self.nreq
        greedy_row = self.greedy[self.req]
        draft_row = ~self.bonus
        valid = (self.d >= 0) & (self.d < self.vp)
        d_safe = np.where(valid, self.d, 0)

        # Greedy rows: argmax of the raw logits over [0, V') (lowest index on ties).
        argmax = np.full(nrow, -1, dtype=np.int64)
        g_rows = np.flatnonzero(greedy_row)
        if g_rows.size:
            argmax[g_rows] = np.argmax(self.z if g_rows.size == nrow else self.z[g_rows], axis=1)

        # Every acceptance test at once; the bonus row ends every request.
        reject = self.bonus.copy()
        g_draft = g_rows[draft_row[g_rows]]
        reject[g_draft] = self.d[g_draft] != argmax[g_draft]
        s_rows = np.flatnonzero(~greedy_row & draft_row)
        acc = None
        if s_rows.size:
            acc = self._acceptance(s_rows, valid[s_rows], d_safe[s_rows])
            reject[s_rows] = ~acc["accepted"]

        # First rejection per request (the bonus row when all were accepted).
        t = np.minimum.reduceat(np.where(reject, self.step, self.k1), self.cu[:-1])
        final_row = self.cu[:-1] + t

        # The token emitted at the final row: greedy argmax, or the resample / bonus.
        tokens = argmax[final_row]
        s_req = np.flatnonzero(~self.greedy)
        res = None
        if s_req.size:
            res = self._resample(s_req, final_row[s_req], (t == self.n)[s_req], valid, d_safe)
            tokens[s_req] = res["tokens"]

        sampled = np.full((nreq, self.k1), -1, dtype=np.int64)
        keep = draft_row & (self.step < t[self.req])
        sampled[self.req[keep], self.step[keep]] = self.d[keep]
        sampled[np.arange(nreq), t] = tokens
        num = (t + 1).astype(np.int32)

        lp = self._logprobs(sampled, num) if self.b.batch.num_logprobs is not None else None
        traces = self._traces(sampled, num, t, argmax, acc, s_rows, res, s_req) if self.trace else []
        return sampled, num, lp, traces

    def _acceptance(self, rows, valid, d):
        """Acceptance tests of stochastic draft rows: accepted flags (and margins and scales for traces)."""
        zt = self._gather(rows, "acc.z")
        y = scratch("acc.y", zt.shape, np.float64)
        m, _, _, s = _softmax_parts(zt, y, None)
        logp = self._at(zt, d) - m - np.log(s)
        u = np.maximum(philox.rand(self.seeds[self.req[rows]], self.pos[rows]), philox.TINY)
        logu = np.log(u.astype(np.float64))
        out = {}
        zq = None
        if self.b.draft is not None:
            zq = self._draft_rows(rows, "acc.q")
            mq, _, _, sq = _softmax_parts(zq, y, None)
            logq = self._at(zq, d) - mq - np.log(sq)
            accepted = valid & (logp > logu + logq)
        else:
            logq = np.zeros_like(logp)
            accepted = valid & (logp > logu)
        out["accepted"] = accepted
        if self.trace:
            margin = logp - logq - logu
            margin[np.isneginf(logp)] = -np.inf  # p(d) = 0: never accepted
            margin[~valid] = -np.inf
            scale = _finite_absmax(zt)
            if zq is not None:
                scale = np.maximum(scale, _finite_absmax(zq))
            out.update(margin=margin, scale=np.maximum(1.0, scale))
        return out

    def _resample(self, reqs, rows, bonus, valid, d_safe):
        """One Gumbel-max pass over the final rows of stochastic requests: `argmax_x (log r(x) + G_x)`."""
        nr, vp = rows.shape[0], self.vp
        zf = self._gather(rows, "res.z")
        base = scratch("res.base", (nr, vp), np.float64)
        e = scratch("res.e", (nr, vp), np.float64)
        _, base, e, s = _softmax_parts(zf, base, e)
        base -= np.log(s)[:, None]  # log p
        rej = np.flatnonzero(~bonus & valid[rows])  # rejected real drafts: residuals
        used_q = np.zeros(nr, dtype=bool)
        zq = None
        if rej.size:
            d = d_safe[rows[rej]]
            if self.b.draft is not None:
                zq = self._draft_rows(rows[rej], "res.q")
                eq = scratch("res.eq", zq.shape, np.float64)
                _, _, eq, sq = _softmax_parts(zq, eq, None)
                eq /= sq[:, None]  # q
                r = np.take(e, rej, axis=0, out=scratch("res.r", zq.shape, np.float64))
                r /= s[rej, None]  # p
                r -= eq
                np.maximum(r, 0.0, out=r)
                keep = np.flatnonzero(r.any(axis=1))  # a residual with no positive mass falls back to p
                np.log(r, out=r)
                base[rej[keep]] = r[keep]
                used_q[rej[keep]] = True
            else:
                logr = base[rej]
                logr[np.arange(rej.size), d] = -np.inf
                keep = np.flatnonzero((logr > -np.inf).any(axis=1))
                base[rej[keep]] = logr[keep]
        noise = _log_exponential_noise(self.seeds[reqs], self.pos[rows], e)  # e is free again
        scores = base
        scores -= noise  # log r(x) + G_x, G_x = -log E_x
        out = {"tokens": np.argmax(scores, axis=1)}
        if self.trace:
            scale = _finite_absmax(zf)
            if zq is not None:
                sq_abs = np.zeros(nr)
                sq_abs[rej] = _finite_absmax(zq)
                scale = np.where(used_q, np.maximum(scale, sq_abs), scale)
            out.update(scores=scores.copy(), scale=np.maximum(1.0, scale))
        return out

    def _logprobs(self, sampled, num) -> LogprobsTensors:
        """SPEC section 6, over the whole vocabulary `[0, V)`; ordered and ranked by the float32 logprobs."""
        b = self.b.batch
        k = int(b.num_logprobs)
        if b.logprobs_mode == "processed":
            y = self.z if self.vp == self.b.v else _divide(self.x, self.row_temp)
        else:
            y = self.x
        lp = log_softmax64(y).astype(np.float32)
        emitted = self.step < num[self.req]
        tok = np.where(emitted, sampled[self.req, np.minimum(self.step, self.k1 - 1)], 0)
        col0 = lp[np.arange(self.nrow), tok]
        ranks = 1 + (lp > col0[:, None]).sum(axis=1)
        ids = np.empty((self.nrow, k + 1), dtype=np.int64)
        ids[:, 0] = tok
        ids[:, 1:] = _topk(lp, k)
        return LogprobsTensors(
            token_ids=ids,
            logprobs=np.take_along_axis(lp, ids, axis=1),
            ranks=ranks.astype(np.int64),
            cu_num_generated_tokens=None if self.nrow == self.nreq else [int(c) for c in self.cu],
        )

    def _traces(self, sampled, num, t, argmax, acc, s_rows, res, s_req):
        """One `RequestTrace` per request of the slab (a loop over requests: trace mode only)."""
        s_index = np.full(self.nrow, -1, dtype=np.int64)
        s_index[s_rows] = np.arange(s_rows.size)
        r_index = np.full(self.nreq, -1, dtype=np.int64)
        r_index[s_req] = np.arange(s_req.size)
        traces = []
        for r in range(self.nreq):
            req, tr, base = self.ra + r, int(t[r]), int(self.cu[r])
            decisions = []
            if self.greedy[r]:
                rows = np.arange(base, base + tr + 1)
                gaps, margin = _argmax_stats(self.z[rows].astype(np.float64))
                scale = np.maximum(1.0, _finite_absmax(self.z[rows]))
                for i in range(tr + 1):
                    decisions.append(Decision(req, i, self.lo + base + i, "argmax", int(argmax[base + i]), None,
                                              float(margin[i]), gaps[i], float(scale[i])))
            else:
                for i in range(min(tr + 1, int(self.n[r]))):
                    j = base + i
                    si = s_index[j]
                    decisions.append(Decision(req, i, self.lo + j, "accept", int(self.d[j]), bool(acc["accepted"][si]),
                                              float(acc["margin"][si]), None, float(acc["scale"][si])))
                ri = r_index[r]
                gaps, margin = _argmax_stats(res["scores"][ri : ri + 1])
                decisions.append(Decision(req, tr, self.lo + base + tr, "argmax", int(sampled[r, tr]), None,
                                          float(margin[0]), gaps[0], float(res["scale"][ri])))
            traces.append(RequestTrace(req, [int(v) for v in sampled[r, : num[r]]], decisions))
        return traces
