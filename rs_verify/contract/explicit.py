"""The `explicit` stream family (SPEC 3c): the batch carries the random numbers.

- acceptance uniform of row `j`: `batch.accept_uniforms[j]` (float64 in `(0, 1)`);
- resampling noise of request `r`: `batch.resample_gumbel[r]` (float64 `[V']`, finite), and the
  uniform of an inverse-CDF resample (SPEC 4): `batch.resample_uniforms[r]`.

The family is keyed by the batch (`StreamFamily.keyed_by == "batch"`): `acceptance(batch, rows)`
and `noise(batch, reqs, vocab, out=None)` read those fields at global row and request indices.

A batch without the fields gets them drawn (`filled`), deterministically, by a fixed generator
keyed like the other families: a row's uniform by its state's seed and its position, a
request's noise by its state's seed and the position of its first row (its Gumbel noise per
token, its inverse-CDF uniform). The suite fills a batch where every property call reaches the
sampler (`rs_verify.harness.guards.observed_call`), and the reference reads a missing field as
the same draw: so a drawn batch, a fixed campaign's batch and their chunks, permutations and
splits get reproducible noise that moves with its row or request, and a batch that carries
noise (a planted edge, a replayed bundle) keeps it. The generator is MurmurHash3_x86_32
(`rs_verify.contract.murmur3.hash_words`) of the words `(seed_lo, seed_hi, pos_lo, pos_hi,
token, what)`, two hashes making one 52-bit uniform in `(0, 1)`; `G = -log(-log u)`.
"""

from __future__ import annotations

import numpy as np

from .murmur3 import hash_words
from .streams import StreamFamily, register

__all__ = ["EXPLICIT", "GUMBEL", "INVERSE_CDF", "PREFIX_ULP", "READS", "RESAMPLE", "drawn_gumbel", "inverse_cdf_tolerance", "drawn_uniforms", "filled", "prefix_fractions",
           "resample_gumbel", "resample_uniforms", "row_uniforms"]

#: How an explicit sampler resamples (SPEC 4 and 10): Gumbel-max, or inverse CDF over the residual.
RESAMPLE = ("gumbel", "inverse_cdf")
GUMBEL, INVERSE_CDF = RESAMPLE
#: The noise fields a sampler of the family reads, by how it resamples (SPEC 3c and 4).
READS = {GUMBEL: ("accept_uniforms", "resample_gumbel"), INVERSE_CDF: ("accept_uniforms", "resample_uniforms")}
#: float32's relative rounding, once per term of a prefix sum (SPEC section 8).
PREFIX_ULP = 2.0**-23


def inverse_cdf_tolerance(eps: float, vocab: int) -> float:
    """`max(eps, V' * 2**-23)` (SPEC section 8): how far from its prefix-sum boundary (normalised by
    the residual's total) an inverse-CDF resample that differs from the reference's is excused."""
    return max(float(eps), int(vocab) * PREFIX_ULP)


def prefix_fractions(logr: np.ndarray):
    """`(positive, S_x / S)` of residual rows given as `log r` (float64 `[n, V']`, `-inf` where `r = 0`):
    the tokens with `r(x) > 0` and the normalised prefix sums `S_x = sum_{y <= x} r(y)` in float64,
    where SPEC 4's inverse CDF takes the smallest positive `x` with `S_x / S > U` (the reference's,
    and the strategies' plants on its boundaries)."""
    r = np.exp(logr)
    positive = logr > -np.inf
    s = np.cumsum(r, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = s / s[..., -1:]
    return positive, c

# The last word of a hash key: which quantity, which half of its 53 bits.
_ACCEPT, _GUMBEL, _INVERSE = 0, 2, 4


def _uniform52(seeds, pos, tokens, what: int) -> np.ndarray:
    """float64 uniforms in `[2**-53, 1 - 2**-53]`, exact: `(a * 2**26 + b + 0.5) * 2**-52`, `a`, `b` the
    top 26 bits of two hashes of `(seed, pos, token, what)` and `(..., what + 1)` (broadcast)."""
    s = np.asarray(seeds, np.int64).view(np.uint64)
    p = np.asarray(pos, np.int64).view(np.uint64)
    lo = np.uint64(0xFFFFFFFF)
    words = [(s & lo).astype(np.uint32), (s >> np.uint64(32)).astype(np.uint32),
             (p & lo).astype(np.uint32), (p >> np.uint64(32)).astype(np.uint32),
             np.asarray(tokens, np.int64).astype(np.uint32)]
    a = (hash_words(*words, np.uint32(what)) >> np.uint32(6)).astype(np.float64)
    b = (hash_words(*words, np.uint32(what + 1)) >> np.uint32(6)).astype(np.float64)
    return (a * 2.0**26 + b + 0.5) * 2.0**-52


def drawn_uniforms(seeds, pos) -> np.ndarray:
    """The drawn acceptance uniforms of rows keyed by int64 `(seeds, pos)`: float64 in `(0, 1)`."""
    return _uniform52(np.asarray(seeds, np.int64).reshape(-1), np.asarray(pos, np.int64).reshape(-1), 0, _ACCEPT)


def drawn_gumbel(seeds, pos, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """The drawn Gumbel noise of requests keyed by `(seeds, first position)`: float64 `[n, vocab]`, finite."""
    seeds = np.asarray(seeds, np.int64).reshape(-1, 1)
    pos = np.asarray(pos, np.int64).reshape(-1, 1)
    u = _uniform52(seeds, pos, np.arange(int(vocab), dtype=np.int64)[None, :], _GUMBEL)
    if out is None:
        out = np.empty(u.shape, np.float64)
    np.log(u, out=out)
    np.negative(out, out=out)
    np.log(out, out=out)
    return np.negative(out, out=out)


def _drawn_inverse(seeds, pos) -> np.ndarray:
    return _uniform52(np.asarray(seeds, np.int64).reshape(-1), np.asarray(pos, np.int64).reshape(-1), 0, _INVERSE)


def _row_keys(batch, rows: np.ndarray):
    cu = np.asarray(batch.cu_num_logits, np.int64)
    req = np.searchsorted(cu, rows, side="right") - 1
    return np.asarray(batch.seeds)[np.asarray(batch.idx_mapping, np.int64)[req]], np.asarray(batch.pos)[rows]


def _request_keys(batch, reqs: np.ndarray):
    cu = np.asarray(batch.cu_num_logits, np.int64)
    return np.asarray(batch.seeds)[np.asarray(batch.idx_mapping, np.int64)[reqs]], np.asarray(batch.pos)[cu[reqs]]


def row_uniforms(batch, rows) -> np.ndarray:
    """`u_j` of the given global rows: the batch's `accept_uniforms`, or the drawn ones (float64)."""
    rows = np.asarray(rows, np.int64).reshape(-1)
    if batch.accept_uniforms is not None:
        return np.asarray(batch.accept_uniforms, np.float64)[rows]
    return drawn_uniforms(*_row_keys(batch, rows))


def resample_gumbel(batch, reqs, vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """`G_x` of the given global requests for tokens `0 .. vocab - 1`: the batch's `resample_gumbel`
    (its first `vocab` columns), or the drawn noise; float64 `[len, vocab]` (into `out`)."""
    reqs = np.asarray(reqs, np.int64).reshape(-1)
    if batch.resample_gumbel is None:
        return drawn_gumbel(*_request_keys(batch, reqs), vocab, out=out)
    g = np.asarray(batch.resample_gumbel, np.float64)[reqs, : int(vocab)]
    if out is None:
        return g
    np.copyto(out, g)
    return out


def resample_uniforms(batch, reqs) -> np.ndarray:
    """`U_r` of the given global requests: the batch's `resample_uniforms`, or the drawn ones."""
    reqs = np.asarray(reqs, np.int64).reshape(-1)
    if batch.resample_uniforms is not None:
        return np.asarray(batch.resample_uniforms, np.float64)[reqs]
    return _drawn_inverse(*_request_keys(batch, reqs))


def filled(batch):
    """`batch` with each noise field it lacks drawn (the module docstring); itself when it has all three."""
    if batch.accept_uniforms is not None and batch.resample_gumbel is not None \
            and batch.resample_uniforms is not None:
        return batch
    rows, reqs = np.arange(batch.num_logits), np.arange(batch.num_reqs)
    return batch.replace(accept_uniforms=row_uniforms(batch, rows),
                         resample_gumbel=np.ascontiguousarray(resample_gumbel(batch, reqs,
                                                                              batch.effective_vocab_size)),
                         resample_uniforms=resample_uniforms(batch, reqs))


EXPLICIT = register(StreamFamily(
    name="explicit",
    section="3c",
    acceptance=row_uniforms,
    noise=resample_gumbel,
    keyed_by="batch",
    fill=filled,
    triton="explicit",
    doc="The batch's own noise fields (SGLang, FlashInfer before 0.2.3, vLLM V1 through its noise functions).",
))
