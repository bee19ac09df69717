"""SPEC section 9 defects of the fields added with sections 2 and 4b: `top_k`, `top_p`, `min_p` and
`verification` (the classes `strategies.invalid` registers beside the others).

- values: `top_k` negative; `top_p` outside `(0, 1]` (0 and -0.0 included, one float32 ulp above
  1) or not finite; `min_p` outside `[0, 1]` or NaN. Each at one referenced state; the contract
  reports `field[state]` of the first request whose state is bad (here the only one).
- dtype and shape: `strategies.invalid` applies its generic breakers to a batch that carries the
  array (`with_param` adds a valid one when the base batch has none).
- `verification`: a method the contract does not know.

`PARAM_CLASS_NEEDS` names the parameter each class sends, so that a suite can keep bad values of
a parameter away from a sampler that declares it does not take that parameter (SPEC section 10);
`unknown_verification` is for every sampler (validation rejects it whatever the declarations).

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import SAMPLING_PARAMS, SpecBatch

PARAM_DTYPES = {"top_k": np.int32, "top_p": np.float32, "min_p": np.float32}
ONE_UP = float(np.nextafter(np.float32(1.0), np.float32(2.0)))  # the float32 just above 1

BAD_VALUES = {
    "top_k_negative": ("top_k", (-1, -2, -(2**31))),
    "top_p_out_of_range": ("top_p", (0.0, -0.0, -0.5, -1e-30, ONE_UP, 1.5, 3e38)),
    "top_p_not_finite": ("top_p", (np.nan, np.inf, -np.inf)),
    "min_p_out_of_range": ("min_p", (-1e-30, -0.5, ONE_UP, 2.0, np.inf, -np.inf)),
    "min_p_nan": ("min_p", (np.nan,)),
}
UNKNOWN_METHODS = ("Block", "tokens", "", None, "blockwise", "Tree", "TOKEN")  # "tree" is SPEC 4c's


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def with_param(b: SpecBatch, name: str, rng) -> SpecBatch:
    """`b` with a valid `name` array: its own, or fresh per-state values (some off)."""
    if getattr(b, name) is not None:
        return b
    S = b.num_states
    if name == "top_k":
        values = np.where(rng.random(S) < 0.3, 0, rng.integers(1, 9, S))
    elif name == "top_p":
        values = np.where(rng.random(S) < 0.3, 1.0, rng.uniform(0.05, 1.0, S))
    else:
        values = np.where(rng.random(S) < 0.3, 0.0, rng.uniform(0.0, 1.0, S))
    return b.replace(**{name: values.astype(PARAM_DTYPES[name])})


def _bad_value(name, values):
    def defect(b, rng):
        b = with_param(b, name, rng)
        a = np.array(getattr(b, name), copy=True)
        a[int(b.idx_mapping[int(rng.integers(b.num_reqs))])] = _pick(rng, values)
        return b.replace(**{name: a})

    return defect


def _unknown_verification(b, rng):
    return b.replace(verification=_pick(rng, UNKNOWN_METHODS))


def param_defects(wrong_dtype, wrong_shape, needs: dict) -> dict:
    """The registry entries `class -> (expected field, base batch knobs, defect)`; `wrong_dtype`
    and `wrong_shape` are `strategies.invalid`'s breakers (field -> defect)."""
    out = {}
    for cls, (name, values) in BAD_VALUES.items():
        out[cls] = (name, needs, _bad_value(name, values))
    for name in SAMPLING_PARAMS:
        for kind, breaker in (("dtype", wrong_dtype), ("shape", wrong_shape)):
            broken = breaker(name)
            out[f"{kind}:{name}"] = (name, needs, lambda b, rng, broken=broken, name=name: broken(
                with_param(b, name, rng), rng))
    out["unknown_verification"] = ("verification", {}, _unknown_verification)
    return out


PARAM_CLASS_NEEDS = {**{cls: name for cls, (name, _) in BAD_VALUES.items()},
                     **{f"{kind}:{name}": name for name in SAMPLING_PARAMS for kind in ("dtype", "shape")}}
