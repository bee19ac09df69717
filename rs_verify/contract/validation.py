"""Input validation (SPEC section 9): every bad batch raises `ValueError` naming the field
and the first offending index, before any device work. Imports only the batch contract."""

from __future__ import annotations

import numpy as np

from . import tree as tree_rules
from .batch import LOGITS_DTYPES, LOGPROBS_MODES, NOISE_FIELDS, VERIFICATION_METHODS, SpecBatch

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _fail(field: str, index, why: str):
    where = field if index is None else f"{field}[{index}]"
    raise ValueError(f"{where}: {why}")


def _first(mask: np.ndarray):
    """The first index (as an int or a tuple) where `mask` holds."""
    flat = int(np.flatnonzero(mask.ravel())[0])
    idx = np.unravel_index(flat, mask.shape)
    return int(idx[0]) if len(idx) == 1 else tuple(int(i) for i in idx)


def _check_array(batch: SpecBatch, field: str, dtype, shape):
    a = getattr(batch, field)
    if not isinstance(a, np.ndarray):
        _fail(field, None, f"expected a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        _fail(field, None, f"expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != len(shape) or any(s is not None and a.shape[i] != s for i, s in enumerate(shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        _fail(field, None, f"expected shape {want}, got {list(a.shape)}")
    return a


def _representable(x: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise: is float32 `x` exactly representable in `dtype` (NaN excluded elsewhere)."""
    if dtype == "float32":
        return np.ones(x.shape, bool)
    if dtype == "bfloat16":
        return (x.view(np.uint32) & np.uint32(0xFFFF)) == 0
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32) == x


# SPEC section 2's per-state sampling parameters and their dtypes (each optional: None is off for all).
SAMPLING_PARAM_DTYPES = (("top_k", np.int32), ("top_p", np.float32), ("min_p", np.float32))


def _check_structure(batch: SpecBatch) -> None:
    k = batch.num_speculative_steps
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        _fail("num_speculative_steps", None, f"expected an int >= 0, got {k!r}")
    if batch.logits_dtype not in LOGITS_DTYPES:
        _fail("logits_dtype", None, f"unknown dtype {batch.logits_dtype!r}; expected one of {LOGITS_DTYPES}")
    if batch.logprobs_mode not in LOGPROBS_MODES:
        _fail("logprobs_mode", None, f"unknown mode {batch.logprobs_mode!r}; expected one of {LOGPROBS_MODES}")
    if batch.verification not in VERIFICATION_METHODS:
        _fail("verification", None, f"unknown method {batch.verification!r}; expected one of {VERIFICATION_METHODS}")
    tl = _check_array(batch, "target_logits", np.float32, (None, None))
    n, v = tl.shape
    if v < 1:
        _fail("target_logits", None, "vocab size must be >= 1")
    cu = _check_array(batch, "cu_num_logits", np.int32, (None,))
    if cu.shape[0] < 1:
        _fail("cu_num_logits", None, "must hold R + 1 >= 1 entries")
    r = cu.shape[0] - 1
    temp = _check_array(batch, "temperature", np.float32, (None,))
    s = temp.shape[0]
    _check_array(batch, "seeds", np.int64, (s,))
    _check_array(batch, "idx_mapping", np.int32, (r,))
    _check_array(batch, "draft_token_ids", np.int64, (n,))
    _check_array(batch, "pos", np.int64, (n,))
    for name, dtype in SAMPLING_PARAM_DTYPES:
        if getattr(batch, name) is not None:
            _check_array(batch, name, dtype, (s,))
    if batch.draft_logits is not None:
        dl = _check_array(batch, "draft_logits", np.float32, (s, k, None))
        if dl.shape[2] < 1:
            _fail("draft_logits", None, "draft vocab size must be >= 1")
        if dl.shape[2] > v:
            _fail("draft_logits", None, f"draft vocab {dl.shape[2]} exceeds target vocab {v}")
    _check_noise_structure(batch, n, r)
    tree_rules.check_structure(batch, _check_array, _fail)
    nl = batch.num_logprobs
    if nl is not None:
        if isinstance(nl, bool) or not isinstance(nl, (int, np.integer)) or not 0 <= nl <= v:
            _fail("num_logprobs", None, f"expected None or an int in [0, {v}], got {nl!r}")


def _check_noise_structure(batch: SpecBatch, n: int, r: int) -> None:
    """SPEC section 3c's explicit noise, each optional: float64 `[N]`, `[R, V']`, `[R]`."""
    shapes = {"accept_uniforms": (n,), "resample_gumbel": (r, batch.effective_vocab_size), "resample_uniforms": (r,)}
    for name in NOISE_FIELDS:
        if getattr(batch, name) is not None:
            _check_array(batch, name, np.float64, shapes[name])


def _check_noise_values(batch: SpecBatch) -> None:
    """Uniforms finite and in (0, 1), Gumbel noise finite (SPEC section 9), wherever they are."""
    rules = (
        ("accept_uniforms", lambda a: ~(a > 0) | ~(a < 1), "must be finite and in (0, 1)"),
        ("resample_gumbel", lambda a: ~np.isfinite(a), "must be finite"),
        ("resample_uniforms", lambda a: ~(a > 0) | ~(a < 1), "must be finite and in (0, 1)"),
    )
    for name, bad_value, why in rules:
        a = getattr(batch, name)
        if a is None:
            continue
        bad = bad_value(a)
        if bad.any():
            i = _first(bad)
            _fail(name, i, f"{why}, got {a[i]}")


def _check_layout(batch: SpecBatch) -> None:
    cu = batch.cu_num_logits.astype(np.int64)
    k = batch.num_speculative_steps
    if cu[0] != 0:
        _fail("cu_num_logits", 0, f"must be 0, got {cu[0]}")
    steps = np.diff(cu)
    if (steps <= 0).any():
        i = _first(steps <= 0) + 1
        _fail("cu_num_logits", i, f"not strictly increasing ({cu[i - 1]} then {cu[i]})")
    if batch.tree:  # SPEC 4c: a tree's depth, not its node count, is bounded by K
        tree_rules.check_layout(batch, _fail)
    elif (steps > k + 1).any():
        i = _first(steps > k + 1)
        _fail("cu_num_logits", i + 1, f"request {i} owns {steps[i]} rows, more than K + 1 = {k + 1}")
    if cu[-1] != batch.num_logits:
        _fail("cu_num_logits", len(cu) - 1, f"must equal num_logits {batch.num_logits}, got {cu[-1]}")
    idx = batch.idx_mapping.astype(np.int64)
    bad = (idx < 0) | (idx >= batch.num_states)
    if bad.any():
        i = _first(bad)
        _fail("idx_mapping", i, f"state {idx[i]} out of range [0, {batch.num_states})")
    order = np.argsort(idx, kind="stable")
    dup = np.zeros(idx.shape[0], bool)
    dup[order[1:]] = idx[order[1:]] == idx[order[:-1]]
    if dup.any():
        i = _first(dup)
        _fail("idx_mapping", i, f"state {idx[i]} repeated")
    if (batch.pos < 0).any():
        i = _first(batch.pos < 0)
        _fail("pos", i, f"negative position {batch.pos[i]}")


SLAB_ELEMS = 1 << 22  # scan big logits arrays in slabs of rows: bounded temporaries


def _row_slabs(n_rows: int, width: int):
    step = max(1, SLAB_ELEMS // max(1, width))
    for lo in range(0, n_rows, step):
        yield lo, min(n_rows, lo + step)


def _scan_rows(x: np.ndarray, v_eff: int, dtype: str, field: str, index_of) -> np.ndarray:
    """Check rows of logits (NaN, +inf, no finite logit in [0, V'), representability) and
    return each row's largest finite |value|. `index_of(row, col)` names an offending entry."""
    absmax = np.zeros(x.shape[0], np.float64)
    for lo, hi in _row_slabs(x.shape[0], x.shape[1]):
        rows = x[lo:hi]
        bad = np.isnan(rows) | (rows == np.inf)
        if bad.any():
            i, j = _first(bad)
            _fail(field, index_of(lo + i, j), "NaN or +inf logit")
        finite = np.isfinite(rows)
        empty = ~finite[:, :v_eff].any(axis=1)
        if empty.any():
            _fail(field, index_of(lo + _first(empty), None), f"row has no finite logit in [0, {v_eff})")
        rep = ~_representable(rows, dtype)
        if rep.any():
            i, j = _first(rep)
            _fail(field, index_of(lo + i, j), f"value not representable in {dtype}")
        absmax[lo:hi] = np.where(finite, np.abs(rows), 0).max(axis=1, initial=0.0)
    return absmax


def _check_values(batch: SpecBatch) -> None:
    v_eff = batch.effective_vocab_size
    cu = batch.cu_num_logits.astype(np.int64)
    n_rows = np.diff(cu)
    states = batch.idx_mapping.astype(np.int64)
    temp = batch.temperature[states].astype(np.float64)
    bad = ~np.isfinite(temp) | (temp < 0)
    if bad.any():
        r = _first(bad)
        _fail("temperature", int(states[r]), f"must be finite and >= 0, got {temp[r]} (request {r})")
    _check_sampling_params(batch, states)
    _check_noise_values(batch)
    # Verified draft ids: every row of a request but its first holds one (row j verifies id j + 1).
    first_row = np.zeros(batch.num_logits, bool)
    first_row[cu[:-1]] = True
    bad = ~first_row & (batch.draft_token_ids >= v_eff)
    if bad.any():
        _fail("draft_token_ids", _first(bad), f"draft id >= V' = {v_eff}")
    absmax = _scan_rows(batch.target_logits, v_eff, batch.logits_dtype, "target_logits",
                        lambda i, j: i if j is None else (i, j))
    nd = batch.node_draft_logits
    if nd is not None and batch.num_logits:  # SPEC 4c: the Q rows of nodes with children
        parents = tree_rules.parent_rows(batch)
        if parents.size:
            q_abs = _scan_rows(nd[parents], v_eff, batch.logits_dtype, "node_draft_logits",
                               lambda i, j: int(parents[i]) if j is None else (int(parents[i]), j))
            np.maximum.at(absmax, parents, q_abs)
    # Largest finite |logit| per request, target rows and the draft rows it verifies.
    req_absmax = np.zeros(batch.num_reqs)
    if batch.num_logits:
        req_absmax = np.maximum.reduceat(absmax, cu[:-1]) if batch.num_reqs else req_absmax
    dl = batch.draft_logits
    if dl is not None and batch.num_reqs:
        req = np.repeat(np.arange(batch.num_reqs), n_rows - 1)
        step = np.arange(req.shape[0]) - np.repeat(np.cumsum(n_rows - 1) - (n_rows - 1), n_rows - 1)
        if req.size:
            used = dl[states[req], step]
            d_abs = _scan_rows(used, v_eff, batch.logits_dtype, "draft_logits",
                               lambda i, j: (int(states[req[i]]), int(step[i])) + (() if j is None else (j,)))
            np.maximum.at(req_absmax, req, d_abs)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        overflow = (temp > 0) & (temp != 1) & (req_absmax / np.where(temp > 0, temp, 1) > FLOAT32_MAX)
    if overflow.any():
        r = _first(overflow)
        _fail("temperature", int(states[r]), f"{temp[r]} overflows float32 for a logit of magnitude {req_absmax[r]}")


def _check_sampling_params(batch: SpecBatch, states: np.ndarray) -> None:
    """SPEC section 9: `top_k >= 0`, `top_p` finite in (0, 1], `min_p` in [0, 1], at the referenced states."""
    rules = (
        ("top_k", lambda a: a < 0, "must be >= 0 (0 is off)"),
        ("top_p", lambda a: ~np.isfinite(a) | (a <= 0) | (a > 1), "must be finite and in (0, 1] (1 is off)"),
        ("min_p", lambda a: ~(a >= 0) | (a > 1), "must be in [0, 1] (0 is off)"),
    )
    for name, bad_value, why in rules:
        a = getattr(batch, name)
        if a is None or not states.size:
            continue
        vals = np.asarray(a)[states]
        bad = bad_value(vals)
        if bad.any():
            r = _first(bad)
            _fail(name, int(states[r]), f"{why}, got {vals[r]} (request {r})")


def check_structure(batch: SpecBatch) -> SpecBatch:
    """Only the dtypes and shapes of SPEC section 1 (O(1), no value is read): what a sampler run
    without validation still needs before it can size a single buffer. `ValueError` otherwise."""
    if not isinstance(batch, SpecBatch):
        raise ValueError(f"batch: expected a SpecBatch, got {type(batch).__name__}")
    _check_structure(batch)
    return batch


def check_layout(batch: SpecBatch) -> SpecBatch:
    """`check_structure` and the batch's layout (`cu_num_logits`, `idx_mapping`, `pos`: O(R + N), no
    logit is read): what a sampler whose host code lays requests out needs before it can index
    them, with the values (logits, temperatures, draft ids, noise) left unchecked. `ValueError`
    otherwise."""
    check_structure(batch)
    _check_layout(batch)
    return batch


def validate(batch: SpecBatch) -> SpecBatch:
    """Check `batch` against SPEC section 1 and raise `ValueError` on the first problem.

    Only the states referenced by `idx_mapping` (and the draft rows their
    requests verify) are checked: other states must be ignored by samplers.
    Returns the batch, so calls can be chained.
    """
    if not isinstance(batch, SpecBatch):
        raise ValueError(f"batch: expected a SpecBatch, got {type(batch).__name__}")
    _check_structure(batch)
    _check_layout(batch)
    _check_values(batch)
    return batch
