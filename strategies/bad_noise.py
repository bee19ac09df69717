"""SPEC section 9 defects of the explicit noise (section 3c): `accept_uniforms`, `resample_gumbel`
and `resample_uniforms` (the classes `strategies.invalid` registers beside the others).

- values: a uniform at 0 (and -0.0), at 1, one ulp outside `(0, 1)`, further out or not finite;
  Gumbel noise NaN or infinite. Each at one entry; the contract reports `field[index]` of the first
  bad entry (here the only one).
- dtype and shape: `strategies.invalid`'s generic breakers (`resample_gumbel`'s shape: its own)
  applied to a batch that carries the field.

Every class starts from a batch that carries all three fields, valid (`with_noise`), so a sampler
that reads them finds none missing and only the planted defect to name. `NOISE_CLASSES` lists the
classes: SPEC section 9 lets samplers of other families ignore the fields, so a suite sends these
only to a sampler whose family reads explicit noise.

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import NOISE_FIELDS, SpecBatch

BELOW_ONE = float(np.nextafter(1.0, 0.0))
UNIFORM_OUT = (0.0, -0.0, 1.0, -(2.0**-1074), float(np.nextafter(1.0, 2.0)), -0.5, 2.0, 3e300)
NOT_FINITE = (np.nan, np.inf, -np.inf)

BAD_VALUES = {
    "accept_uniforms_out_of_range": ("accept_uniforms", UNIFORM_OUT),
    "accept_uniforms_not_finite": ("accept_uniforms", NOT_FINITE),
    "resample_gumbel_not_finite": ("resample_gumbel", NOT_FINITE),
    "resample_uniforms_out_of_range": ("resample_uniforms", UNIFORM_OUT),
    "resample_uniforms_not_finite": ("resample_uniforms", NOT_FINITE),
}


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _uniforms(rng, shape) -> np.ndarray:
    """Float64 uniforms in `(0, 1)`, the edges `2**-53` and `1 - 2**-53` among them now and then."""
    u = rng.integers(1, 2**53, size=shape, dtype=np.int64).astype(np.float64) * 2.0**-53
    edge = rng.random(shape) < 0.1
    return np.where(edge, np.where(rng.random(shape) < 0.5, 2.0**-53, BELOW_ONE), u)


def with_noise(b: SpecBatch, rng) -> SpecBatch:
    """`b` carrying every explicit noise field, valid: its own where present, else fresh values."""
    shapes = {"accept_uniforms": (b.num_logits,), "resample_gumbel": (b.num_reqs, b.effective_vocab_size),
              "resample_uniforms": (b.num_reqs,)}
    fresh = {}
    for name in NOISE_FIELDS:
        if getattr(b, name) is None:
            u = _uniforms(rng, shapes[name])
            fresh[name] = -np.log(-np.log(u)) if name == "resample_gumbel" else u
    return b.replace(**fresh) if fresh else b


def _bad_value(name, values):
    def defect(b, rng):
        b = with_noise(b, rng)
        a = np.array(getattr(b, name), copy=True)
        a[np.unravel_index(int(rng.integers(a.size)), a.shape)] = _pick(rng, values)
        return b.replace(**{name: a})

    return defect


def _gumbel_wrong_shape(b, rng):
    """`resample_gumbel` `[R + 1, V']`, `[R, V' + 1]` or flattened (the generic 1-D breakers do not fit)."""
    a = b.resample_gumbel
    r, v = a.shape
    new = [np.zeros((r + 1, v)), np.zeros((r, v + 1)), a.reshape(-1)][int(rng.integers(3))]
    return b.replace(resample_gumbel=new)


def noise_defects(wrong_dtype, wrong_shape, needs: dict) -> dict:
    """The registry entries `class -> (expected field, base batch knobs, defect)`; `wrong_dtype`
    and `wrong_shape` are `strategies.invalid`'s breakers (field -> defect). `needs` asks for a
    request (so every field has an entry to break)."""
    out = {cls: (name, needs, _bad_value(name, values)) for cls, (name, values) in BAD_VALUES.items()}
    for name in NOISE_FIELDS:
        for kind, breaker in (("dtype", wrong_dtype), ("shape", wrong_shape)):
            broken = _gumbel_wrong_shape if (kind, name) == ("shape", "resample_gumbel") else breaker(name)
            out[f"{kind}:{name}"] = (name, needs, lambda b, rng, broken=broken: broken(with_noise(b, rng), rng))
    return out


NOISE_CLASSES = (*BAD_VALUES, *(f"{kind}:{name}" for name in NOISE_FIELDS for kind in ("dtype", "shape")))
