"""Batches with exactly one defect of each class of SPEC section 9 (the sampling parameters'
and the verification method's classes come from `strategies.bad_params`, the explicit noise's
from `strategies.bad_noise`).

`invalid_batches()` draws a valid batch from `spec_batches` (with whatever the
defect needs: a request, a verified draft row, model drafts, a dtype) and
breaks one thing with `batch.replace(...)` and fresh arrays. Defects sit where
`rs_verify.validate` looks: referenced states and verified draft rows.

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from rs_verify.contract.batch import ARRAY_FIELDS, NOISE_FIELDS, SAMPLING_PARAMS, SpecBatch

from .bad_noise import NOISE_CLASSES, noise_defects
from .bad_params import PARAM_CLASS_NEEDS, param_defects
from .batches import spec_batches
from .logits import FLOAT32_MAX


class InvalidBatch(tuple):
    """A `(batch, expected_field)` pair; `.defect` names its class in `INVALID_CLASSES`."""

    def __new__(cls, batch: SpecBatch, expected_field: str, defect: str):
        self = super().__new__(cls, (batch, expected_field))
        self.defect = defect
        return self

    @property
    def batch(self) -> SpecBatch:
        return self[0]

    @property
    def expected_field(self) -> str:
        return self[1]

    def __reduce__(self):  # picklable, so failure records cross process boundaries (check --jobs)
        return (InvalidBatch, (self[0], self[1], self.defect))

    def __repr__(self) -> str:
        return f"InvalidBatch(defect={self.defect!r}, expected_field={self[1]!r}, batch={_safe_repr(self[0])})"


def _safe_repr(batch) -> str:
    """`batch.summary()`, or array shapes when the defect breaks it."""
    try:
        return batch.summary()
    except Exception:  # noqa: BLE001 - a broken batch must still print
        parts = []
        for name in ARRAY_FIELDS:
            a = getattr(batch, name, None)
            kind = getattr(a, "dtype", type(a).__name__)
            parts.append(f"{name}=None" if a is None else f"{name}={kind}{list(np.shape(a))}")
        return "SpecBatch(" + ", ".join(parts) + ")"


# -- helpers -----------------------------------------------------------------


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _req(rng, b: SpecBatch) -> int:
    return int(rng.integers(b.num_reqs))


def _row(rng, b: SpecBatch) -> int:
    return int(rng.integers(b.num_logits))


def _verified_step(rng, b: SpecBatch) -> tuple[int, int, int]:
    """A verified draft step: (request r, its state s, step i < n_r)."""
    r = _req(rng, b)
    i = int(rng.integers(b.num_draft_tokens[r]))
    return r, int(b.idx_mapping[r]), i


def _copy(a) -> np.ndarray:
    return np.array(a, copy=True)


def _finite_absmax(a) -> float:
    f = np.abs(a[np.isfinite(a)])
    return float(f.max()) if f.size else 0.0


def _finite_cell(rng, a: np.ndarray) -> tuple:
    """A random index of a finite entry of `a` (every row has one)."""
    cells = np.flatnonzero(np.isfinite(a).ravel())
    return np.unravel_index(int(cells[rng.integers(cells.size)]), a.shape)


def _unrepresentable(rng, value: np.float32, dtype: str) -> np.float32:
    """A float32 close to the representable `value` that `dtype` cannot hold."""
    if dtype == "float16" and rng.random() < 0.25:
        return np.float32(_pick(rng, [65536.0, -65536.0, 1e5, 1e-8]))
    # One float32 ulp away from a bf16/fp16 value needs more mantissa bits than either has.
    return np.nextafter(np.float32(value), np.float32(np.inf) if value < 0 else np.float32(-np.inf))


# -- defects: each takes (batch, rng) and returns the broken batch --------------

_WRONG_DTYPES = {
    np.dtype(np.float32): (np.float64, np.float16, np.int32),
    np.dtype(np.int64): (np.int32, np.uint64, np.float64),
    np.dtype(np.int32): (np.int64, np.uint32, np.int16),
    np.dtype(np.float64): (np.float32, np.float16, np.int64),
}


def _wrong_dtype(field):
    def defect(b, rng):
        a = getattr(b, field)
        with np.errstate(all="ignore"):  # -inf or huge values cast to int16 / float16
            return b.replace(**{field: a.astype(_pick(rng, _WRONG_DTYPES[a.dtype]))})

    return defect


def _wrong_shape(field):
    def defect(b, rng):
        a = getattr(b, field)
        variant = int(rng.integers(3))
        if field == "target_logits":
            new = [a[..., None], a.reshape(-1), np.zeros((a.shape[0], 0), a.dtype)][variant]
        elif field == "draft_logits":
            s, k, vd = a.shape
            new = [np.zeros((s + 1, k, vd), a.dtype), np.zeros((s, k + 1, vd), a.dtype), a.reshape(s, k * vd)]
            new = (new + [np.zeros((s, k, 0), a.dtype)])[int(rng.integers(4))]
        elif field in ("cu_num_logits", "temperature"):  # a longer or shorter one only moves R or S
            new = [a[None, :], a[:, None], a[:0] if field == "cu_num_logits" else a.reshape(1, -1)][variant]
        else:  # 1-D fields whose length is fixed by another field
            longer = np.concatenate([a, a[:1] if a.size else np.zeros(1, a.dtype)])
            new = [longer, a[None, :], a[:-1] if a.size else longer][variant]
        return b.replace(**{field: new})

    return defect


def _cu_first_nonzero(b, rng):
    shift = _pick(rng, [1, -1, 2**31 - 1 - int(b.num_logits)])
    return b.replace(cu_num_logits=(b.cu_num_logits.astype(np.int64) + shift).astype(np.int32))


def _cu_not_increasing(b, rng):
    cu = _copy(b.cu_num_logits)
    i = int(rng.integers(1, b.num_reqs + 1))
    cu[i] = cu[i - 1] - int(rng.integers(0, 2))  # an empty or a negative request
    return b.replace(cu_num_logits=cu)


def _cu_last_mismatch(b, rng):
    """N rows but `cu[-1]` counts one more or one less (all arrays agree on N)."""
    if b.num_logits and rng.random() < 0.5:
        sl = slice(0, b.num_logits - 1)
        return b.replace(target_logits=b.target_logits[sl], draft_token_ids=b.draft_token_ids[sl], pos=b.pos[sl])
    row = np.zeros((1, b.vocab_size), np.float32)
    return b.replace(
        target_logits=np.concatenate([b.target_logits, row]),
        draft_token_ids=np.concatenate([b.draft_token_ids, [0]]).astype(np.int64),
        pos=np.concatenate([b.pos, [0]]).astype(np.int64),
    )


def _request_too_long(b, rng):
    """Request r gets K + 2 rows (copies of its bonus row appended)."""
    r = _req(rng, b)
    cu = b.cu_num_logits.astype(np.int64)
    m = b.num_speculative_steps + 2 - int(cu[r + 1] - cu[r])
    at = int(cu[r + 1])
    rows = np.full(m, at - 1)
    new_cu = cu.copy()
    new_cu[r + 1 :] += m
    return b.replace(
        target_logits=np.insert(b.target_logits, at, b.target_logits[rows], axis=0),
        draft_token_ids=np.insert(b.draft_token_ids, at, np.zeros(m, np.int64)),
        pos=np.insert(b.pos, at, np.full(m, b.pos[at - 1], np.int64)),
        cu_num_logits=new_cu.astype(np.int32),
    )


def _idx_negative(b, rng):
    idx = _copy(b.idx_mapping)
    idx[_req(rng, b)] = _pick(rng, [-1, -(2**31), -b.num_states - 1])
    return b.replace(idx_mapping=idx)


def _idx_too_large(b, rng):
    idx = _copy(b.idx_mapping)
    idx[_req(rng, b)] = _pick(rng, [b.num_states, b.num_states + 1, 2**31 - 1])
    return b.replace(idx_mapping=idx)


def _idx_repeated(b, rng):
    idx = _copy(b.idx_mapping)
    i, j = sorted(rng.choice(b.num_reqs, 2, replace=False))
    idx[j] = idx[i]
    return b.replace(idx_mapping=idx)


def _set_temperature(values):
    def defect(b, rng):
        t = _copy(b.temperature)
        t[b.idx_mapping[_req(rng, b)]] = _pick(rng, values)
        return b.replace(temperature=t)

    return defect


def _temperature_overflow(b, rng):
    """A temperature so small that some finite logit of its request divided by it overflows float32."""
    r = _req(rng, b)
    s = int(b.idx_mapping[r])
    rows = b.request_rows(r)
    target = b.target_logits
    absmax = _finite_absmax(target[rows.start : rows.stop])
    if b.draft_logits is not None:
        absmax = max(absmax, _finite_absmax(b.draft_logits[s, : b.num_draft_tokens[r]]))
    if absmax < 1.0:  # too small a logit cannot overflow any positive float32 temperature: make one 1.0
        target = _copy(target)
        j, c = _finite_cell(rng, target[rows.start : rows.start + 1])
        target[rows.start + j, c] = 1.0
        absmax = 1.0
    t = _copy(b.temperature)
    t[s] = np.float32(absmax / FLOAT32_MAX / _pick(rng, [4.0, 64.0, 2.0**20]))
    return b.replace(temperature=t, target_logits=target)


def _pos_negative(b, rng):
    pos = _copy(b.pos)
    pos[_row(rng, b)] = _pick(rng, [-1, -(2**31), -(2**63)])
    return b.replace(pos=pos)


def _draft_vocab_too_large(b, rng):
    s, k, vd = b.draft_logits.shape
    new = np.zeros((s, k, b.vocab_size + int(rng.integers(1, 4))), np.float32)
    new[:, :, :vd] = b.draft_logits
    return b.replace(draft_logits=new)


def _draft_id_out_of_range(b, rng):
    r, _, i = _verified_step(rng, b)
    ids = _copy(b.draft_token_ids)
    v = b.effective_vocab_size
    ids[int(b.cu_num_logits[r]) + 1 + i] = v + _pick(rng, [0, 1, b.vocab_size, 2**31, 2**40])
    return b.replace(draft_token_ids=ids)


def _target_value(value):
    def defect(b, rng):
        x = _copy(b.target_logits)
        x[_row(rng, b), int(rng.integers(b.vocab_size))] = value
        return b.replace(target_logits=x)

    return defect


def _draft_value(value):
    def defect(b, rng):
        _, s, i = _verified_step(rng, b)
        d = _copy(b.draft_logits)
        d[s, i, int(rng.integers(b.draft_vocab_size))] = value
        return b.replace(draft_logits=d)

    return defect


def _target_row_no_finite(b, rng):
    x = _copy(b.target_logits)
    x[_row(rng, b), : b.effective_vocab_size] = -np.inf  # columns >= V' may stay finite
    return b.replace(target_logits=x)


def _draft_row_no_finite(b, rng):
    _, s, i = _verified_step(rng, b)
    d = _copy(b.draft_logits)
    d[s, i, : b.effective_vocab_size] = -np.inf
    return b.replace(draft_logits=d)


def _target_unrepresentable(b, rng):
    x = _copy(b.target_logits)
    cell = _finite_cell(rng, x)
    x[cell] = _unrepresentable(rng, x[cell], b.logits_dtype)
    return b.replace(target_logits=x)


def _draft_unrepresentable(b, rng):
    _, s, i = _verified_step(rng, b)
    d = _copy(b.draft_logits)
    c = _finite_cell(rng, d[s, i])[0]
    d[s, i, c] = _unrepresentable(rng, d[s, i, c], b.logits_dtype)
    return b.replace(draft_logits=d)


def _unknown_logits_dtype(b, rng):
    return b.replace(logits_dtype=_pick(rng, ["float64", "bf16", "fp16", "float8_e4m3fn", "", "FLOAT32"]))


def _unknown_logprobs_mode(b, rng):
    return b.replace(logprobs_mode=_pick(rng, ["logits", "RAW", "processed_logprobs", "", None]))


def _num_logprobs_negative(b, rng):
    return b.replace(num_logprobs=_pick(rng, [-1, -2, -b.vocab_size - 1]))


def _num_logprobs_too_large(b, rng):
    return b.replace(num_logprobs=b.vocab_size + int(_pick(rng, [1, 2, 100])))


# -- the registry: class -> (expected field, what the base batch needs, defect) --

_R1 = dict(min_reqs=1)
_STEP = dict(min_reqs=1, min_drafts=1)
_MODEL = dict(draft_modes=("model",))
_MODEL_STEP = dict(_STEP, **_MODEL)
_BF16 = dict(logits_dtypes=("bfloat16",))
_FP16 = dict(logits_dtypes=("float16",))

_DEFECTS: dict[str, tuple[str, dict, object]] = {}
_TREE_FIELDS = ("tree_parent", "node_draft_logits")  # SPEC 4c: tree batches only (tests/test_tree_contract.py)
for _f in (f for f in ARRAY_FIELDS if f not in (*SAMPLING_PARAMS, *NOISE_FIELDS, *_TREE_FIELDS)):  # optional arrays: their own classes
    _needs = _MODEL if _f == "draft_logits" else {}
    _DEFECTS[f"dtype:{_f}"] = (_f, _needs, _wrong_dtype(_f))
    _DEFECTS[f"shape:{_f}"] = (_f, _needs, _wrong_shape(_f))
_DEFECTS.update(
    {
        "cu_first_nonzero": ("cu_num_logits", {}, _cu_first_nonzero),
        "cu_not_increasing": ("cu_num_logits", _R1, _cu_not_increasing),
        "cu_last_mismatch": ("cu_num_logits", {}, _cu_last_mismatch),
        "request_too_long": ("cu_num_logits", _R1, _request_too_long),
        "idx_mapping_negative": ("idx_mapping", _R1, _idx_negative),
        "idx_mapping_too_large": ("idx_mapping", _R1, _idx_too_large),
        "idx_mapping_repeated": ("idx_mapping", dict(min_reqs=2), _idx_repeated),
        "temperature_negative": ("temperature", _R1, _set_temperature([-1e-30, -0.5, -1.0, -3e38])),
        "temperature_nan": ("temperature", _R1, _set_temperature([np.nan])),
        "temperature_inf": ("temperature", _R1, _set_temperature([np.inf, -np.inf])),
        "temperature_overflow": ("temperature", _R1, _temperature_overflow),
        "pos_negative": ("pos", _R1, _pos_negative),
        "draft_vocab_too_large": ("draft_logits", _MODEL, _draft_vocab_too_large),
        "draft_id_out_of_range": ("draft_token_ids", _STEP, _draft_id_out_of_range),
        "target_nan": ("target_logits", _R1, _target_value(np.nan)),
        "target_posinf": ("target_logits", _R1, _target_value(np.inf)),
        "draft_nan": ("draft_logits", _MODEL_STEP, _draft_value(np.nan)),
        "draft_posinf": ("draft_logits", _MODEL_STEP, _draft_value(np.inf)),
        "target_row_no_finite": ("target_logits", _R1, _target_row_no_finite),
        "draft_row_no_finite": ("draft_logits", _MODEL_STEP, _draft_row_no_finite),
        "target_unrepresentable_bf16": ("target_logits", dict(_R1, **_BF16), _target_unrepresentable),
        "target_unrepresentable_fp16": ("target_logits", dict(_R1, **_FP16), _target_unrepresentable),
        "draft_unrepresentable_bf16": ("draft_logits", dict(_MODEL_STEP, **_BF16), _draft_unrepresentable),
        "draft_unrepresentable_fp16": ("draft_logits", dict(_MODEL_STEP, **_FP16), _draft_unrepresentable),
        "unknown_logits_dtype": ("logits_dtype", {}, _unknown_logits_dtype),
        "unknown_logprobs_mode": ("logprobs_mode", {}, _unknown_logprobs_mode),
        "num_logprobs_negative": ("num_logprobs", {}, _num_logprobs_negative),
        "num_logprobs_too_large": ("num_logprobs", {}, _num_logprobs_too_large),
    }
)

_DEFECTS.update(param_defects(_wrong_dtype, _wrong_shape, _R1))  # top_k, top_p, min_p, verification
_DEFECTS.update(noise_defects(_wrong_dtype, _wrong_shape, _R1))  # accept_uniforms, resample_gumbel, resample_uniforms

INVALID_CLASSES: tuple[str, ...] = tuple(_DEFECTS)
EXPECTED_FIELD: dict[str, str] = {name: spec[0] for name, spec in _DEFECTS.items()}


def classes_for(sampling_params: Sequence[str] = SAMPLING_PARAMS, noise: bool = True) -> tuple[str, ...]:
    """`INVALID_CLASSES` without those that send a parameter outside `sampling_params` (SPEC 10:
    a sampler is never sent a parameter it does not declare; `PARAM_CLASS_NEEDS`), and without the
    explicit noise's (`NOISE_CLASSES`) unless `noise` (SPEC 9: a sampler of a family that does not
    read the noise ignores it)."""
    return tuple(c for c in INVALID_CLASSES if PARAM_CLASS_NEEDS.get(c) in (None, *sampling_params)
                 and (noise or c not in NOISE_CLASSES))

# Small base batches: a defect needs no size to show.
_BASE = dict(max_reqs=4, max_spec_steps=4, max_vocab=129)


def invalid_batches(*, classes: Sequence[str] | None = None) -> st.SearchStrategy[InvalidBatch]:
    """`(batch, expected_field)` pairs: a valid batch with exactly one SPEC section 9 defect.

    `rs_verify.validate(batch)` must raise `ValueError` whose message starts
    with `expected_field`. Each pair is an `InvalidBatch` whose `.defect` names
    its class; each draw is labelled with `hypothesis.event`.

    * `classes`: the defect classes to draw from (default: all of `INVALID_CLASSES`).
    """
    if classes is None:
        classes = INVALID_CLASSES
    if isinstance(classes, str) or not isinstance(classes, Sequence) or not classes:
        raise InvalidArgument(f"classes={classes!r} must be a non-empty sequence of INVALID_CLASSES entries")
    unknown = [c for c in classes if c not in _DEFECTS]
    if unknown:
        raise InvalidArgument(f"classes: unknown defect classes {unknown}; see INVALID_CLASSES")
    classes = tuple(dict.fromkeys(classes))
    bases = {c: spec_batches(**_BASE, **_DEFECTS[c][1]) for c in classes}
    return _invalid_batches(classes, bases)


@st.composite
def _invalid_batches(draw, classes, bases) -> InvalidBatch:
    defect = draw(st.sampled_from(classes))
    field, _, breaks = _DEFECTS[defect]
    batch = draw(bases[defect])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    event(f"invalid: {defect}")
    return InvalidBatch(breaks(batch, rng), field, defect)
