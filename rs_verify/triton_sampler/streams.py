"""The Triton sampler's random streams (SPEC section 3): one home for each family's kernel code.

A family the sampler offers has its helpers here or in a module of its own, named by its record's
`StreamFamily.triton` (`rs_verify.contract.streams`), and is listed in `KERNEL_STREAMS`: the
kernels that draw noise take that name as their constexpr `STREAM`; `stream_family` checks a
sampler's `streams` against `STREAMS`, the registered families so offered. `murmur3` (SPEC 3b)
is murmur3.py's `murmur3_noise`; `explicit` (SPEC 3c) draws nothing: the kernels load the batch's
float64 `accept_uniforms[j]` (brought into float32's range by `explicit_uniform`) and
`resample_gumbel[r, x]`, rounded to float32, and resample by
Gumbel-max or, declared `resample="inverse_cdf"` (`resample_method`), by inverse CDF over
`resample_uniforms[r]` (inverse_cdf.py); `triton-philox` (SPEC 3a) is `philox`:

- `philox_acceptance(seed, pos)`: `u = max(rand(seed, pos), TINY)`, float32;
- `philox_resample_seed(seed, pos)`: `g = randint(seed, pos)`, the uint32 block `tl.randint`
  returns (passed on unchanged: held as int32, `tl.rand` would sign-extend it);
- `philox_gumbel(g, x)`: `G_x = -log(-log(1 - v_x))`, `v_x = max(rand(g, x), TINY)`, with
  `log(1 - v)` for small `v` without log1p (Goldberg): `w = 1 - v`; `log(w) * -v / (w - 1)`,
  or `-v` when `w == 1`.

Each helper is one nested `@triton.jit` call, which the interpreter pays per call (it re-patches
`triton.language`); `tl.rand` is written out as `tl.randint4x` and `tl.uint_to_uniform_float`'s
own definition (`w < 0 ? ~w : w` times the scale), so a helper costs no more nested calls than
the `tl.rand` it replaces and the kernels' interpreter time stays as it was.
The mutants of mutants/catalogue.py patch this file's text by exact match: keep their anchors in step.
"""

import triton
import triton.language as tl

from ..contract import streams as stream_families
from ..contract.explicit import EXPLICIT, GUMBEL, RESAMPLE
from .murmur3 import called_directly, murmur3_fp64_noise, murmur3_noise

TINY = tl.constexpr(4.6566127342e-10)  # SPEC 3's floor of every uniform
SCALE = tl.constexpr(4.6566127342e-10)  # Triton's int32 -> uniform scale (tl.uint_to_uniform_float)


@triton.jit
def philox_acceptance(seed, pos):
    """SPEC 3a's acceptance uniform of a row (`pos` scalar or vector)."""
    w = tl.randint4x(seed, pos)[0].to(tl.int32, bitcast=True)
    return tl.maximum(tl.where(w < 0, ~w, w) * SCALE, TINY)


@triton.jit
def philox_resample_seed(seed, pos):
    """SPEC 3a's resample seed `g` of a row (a uint32 block)."""
    return tl.randint4x(seed, pos)[0]


@triton.jit
def philox_gumbel(g, x):
    """SPEC 3a's resampling noise `G_x` of tokens `x` for the resample seed `g`."""
    w = tl.randint4x(g, x)[0].to(tl.int32, bitcast=True)
    v = tl.maximum(tl.where(w < 0, ~w, w) * SCALE, TINY)
    w1 = 1.0 - v
    log1m_v = tl.where(w1 == 1.0, -v, tl.log(w1) * (-v) / tl.where(w1 == 1.0, -1.0, w1 - 1.0))
    return -tl.log(-log1m_v)


# SPEC 3c's acceptance uniforms are float64 in (0, 1); float32 holds them faithfully only in its
# normal range, and below 2**-126 rounding would make u subnormal or 0 and log u -inf (a draft
# accepted whatever p / q). So `explicit_uniform` brings u into that range first by exact float64
# products with 2**200 while u < 2**-100 (at most five: 2**-1074 * 2**1000 = 2**-74; each product
# stays below 2**100, and the float64 constant needs no libdevice), and returns
# `(fp32(u 2**(200 k)), 200 k log 2)`: the kernel's log u is `log(first) - second`. For
# u >= 2**-100 (every drawn uniform) k = 0: fp32(u), as before.
EXPLICIT_SMALL_U = tl.constexpr(2.0**-100)
EXPLICIT_U_SCALE = tl.constexpr(2.0**200)  # a float64 constant (beyond float32's range)
EXPLICIT_LOG_SCALE = tl.constexpr(138.62943611198907)  # 200 log 2


@triton.jit
def explicit_uniform(u):
    """`(fp32(u * 2**(200 k)), 200 k log 2)` of a float64 uniform `u` (see above)."""
    k = tl.full(u.shape, 0.0, tl.float32)
    for _ in tl.static_range(5):
        small = u < EXPLICIT_SMALL_U
        u = tl.where(small, u * EXPLICIT_U_SCALE, u)
        k += small.to(tl.float32)
    return u.to(tl.float32), k * EXPLICIT_LOG_SCALE


# -- the one choice of noise: every kernel that resamples asks these two ------------------------
# A family's noise is chosen here alone, by the kernels' constexpr STREAM (its record's `triton`);
# an unknown value fails to compile (and to run under the interpreter), so a family the kernels
# do not know can never draw another's noise.
# SPEC 3c allows any finite float64 noise: beyond float32 it is held at the largest float32, so no
# token scores +inf or -inf by its noise alone (a row of noise at -inf would leave only p = 0 tokens).
EXPLICIT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def resample_key(seed, pos, STREAM: tl.constexpr):
    """What a row's drawn noise is keyed by: philox, the resample seed `g` (SPEC 3a); murmur3 and
    murmur3_fp64, the request's seed itself (3b: the hash takes `pos` too). (The explicit family's
    key is the request's row of `resample_gumbel`, a pointer only `resample_kernel` holds.)"""
    if STREAM == "philox":
        key = philox_resample_seed(seed, pos)
    elif STREAM == "murmur3" or STREAM == "murmur3_fp64":
        key = seed
    else:
        tl.static_assert(False, "resample_key: a STREAM the kernels do not draw")
    return key


@triton.jit
def resample_noise(key, pos, idx, mask, STREAM: tl.constexpr):
    """`G_x` of the tokens `idx` of a row keyed by `key` (`resample_key`; explicit: the pointer to the
    request's row of `resample_gumbel`) at `pos`: float32, or float64
    for murmur3_fp64 (whose scores are float64 too); explicit noise is loaded under `mask` and held
    within float32's range (no token scores +-inf by its noise alone)."""
    if STREAM == "philox":
        gum = philox_gumbel(key, idx)
    elif STREAM == "murmur3":
        gum = murmur3_noise(key, pos, idx)
    elif STREAM == "murmur3_fp64":
        gum = murmur3_fp64_noise(key, pos, idx)
    elif STREAM == "explicit":
        gum = tl.load(key + idx, mask=mask, other=0.0)
        gum = tl.minimum(tl.maximum(gum, -EXPLICIT_MAX), EXPLICIT_MAX).to(tl.float32)
    else:
        tl.static_assert(False, "resample_noise: a STREAM the kernels do not draw")
    return gum


@triton.jit
def score_dtype(x, STREAM: tl.constexpr):
    """`x` in the dtype of STREAM's scores `log r(x) + G_x`: float64 for murmur3_fp64 (SPEC 3b: float64
    noise on float64 scores), float32 for the others (called once per row, on the running maxima)."""
    if STREAM == "murmur3_fp64":
        x = x.to(tl.float64)
    return x


# Under the interpreter the three are plain functions (murmur3.called_directly): the noise costs one
# nested call per vocabulary block (philox_gumbel's, or none for murmur3's), as before they were one.
resample_key, resample_noise, score_dtype = map(called_directly, (resample_key, resample_noise, score_dtype))


# -- which family the kernels draw (a constexpr of theirs), host side --------------------------
# The `StreamFamily.triton` helpers the kernels hold (streams.py, murmur3.py): the values of their
# constexpr STREAM; STREAMS, the registered families the sampler draws with them (SPEC 3).
KERNEL_STREAMS = ("philox", "murmur3", "murmur3_fp64", "explicit")
STREAMS = tuple(f.name for f in stream_families.shipped() if f.triton in KERNEL_STREAMS)
DEFAULT_STREAMS = "triton-philox"


def stream_family(streams) -> stream_families.StreamFamily:
    """The registered record of the stream family `streams` (a name, an alias such as "spec", or a
    registered record) when the kernels draw it (`STREAMS`); `ValueError` otherwise."""
    try:
        record = stream_families.family(streams)
    except KeyError:
        record = None
    if record is None or record.name not in STREAMS or not stream_families.registered(record):
        raise ValueError(f"streams: the Triton sampler draws the stream families {list(STREAMS)} (SPEC 3, "
                         f"by name or alias), not {streams!r}")
    return record


def resample_method(record: stream_families.StreamFamily, resample) -> str:
    """How a sampler of the family `record` resamples (SPEC 4): "gumbel", or "inverse_cdf" with the
    explicit family only (its batch carries `resample_uniforms`); `ValueError` otherwise."""
    if resample not in RESAMPLE:
        raise ValueError(f"resample: one of {list(RESAMPLE)}, not {resample!r}")
    if resample != GUMBEL and record is not EXPLICIT:
        raise ValueError(f"resample: {resample!r} needs the explicit stream family (SPEC 3c and 4), "
                         f"not {record.name!r}")
    return resample
