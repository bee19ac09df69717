"""Labels of the sampling parameters (SPEC section 2): what the masks of a batch exercise.

Read off the batch's facts (`strategies.facts`: `rs_verify.contract.masks`' kept tokens and margins).
A decision that the walk of SPEC sections 4 and 4b evaluates is one the sampler makes: a draft
step is "verified" when token-wise verification reaches it (`reached` below) or when it lies
before the block's first padded draft. Re-exported by `strategies.events`.

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.batch import SAMPLING_PARAMS
from rs_verify.contract.methods import BLOCK

from .facts import Facts

PARAMS_MIXED = "sampling params: off and on among the stochastic states of one batch"
MASKS = {"min_p": "min-p masks a token", "top_k": "top-k masks a token", "top_p": "top-p masks a token"}
PARAMS_TIGHT = "sampling params: a row left with at most 2 of 3+ tokens"
PARAMS_LOOSE = "sampling params: a row loses a token and keeps more than half"
TOP_K_TIES = "top-k: tokens tied with the k-th value kept beyond k"
TOP_P_TIES = "top-p: boundary between tied tokens"
MIN_P_ONE = "min-p = 1 with tied maxima"
ALL_THREE = "min-p, top-k and top-p all on for one stochastic state"
MASKED_DRAFT = "verified draft of a masked token (p(d) = 0 after the mask, q(d) > 0)"
MASKED_DRAFT_Q0 = "verified draft of a masked token with q(d) = 0"
MASK_EMPTIES = "mask empties the residual"
BONUS_CHANGED = "mask changes an emitted bonus token"
PARAMS_BLOCK = "sampling params with block verification"
PARAMS_GREEDY = "sampling params on a greedy state (ignored)"
PARAMS_VD = "sampling params with V' < V (masks over [0, V'))"
PARAMS_LOGPROBS = "processed logprobs of a masked row"

PARAM_KNOBS = (PARAMS_MIXED, *MASKS.values(), PARAMS_TIGHT, PARAMS_LOOSE, TOP_K_TIES, TOP_P_TIES, MIN_P_ONE, ALL_THREE,
               MASKED_DRAFT, MASKED_DRAFT_Q0, MASK_EMPTIES, BONUS_CHANGED, PARAMS_BLOCK, PARAMS_GREEDY, PARAMS_VD,
               PARAMS_LOGPROBS)

_OFF = {"min_p": 0, "top_k": 0, "top_p": 1}
TOP_P_NEAR, MIN_P_NEAR = 1e-5, 2.5e-7


def state_params_on(batch) -> dict[str, np.ndarray]:
    """Per request: whether each parameter is on for its state (ignoring the temperature; top-k
    at or above `V'` is off)."""
    states = np.asarray(batch.idx_mapping, np.int64)
    out = {}
    for name in SAMPLING_PARAMS:
        a = getattr(batch, name)
        on = np.zeros(states.size, bool) if a is None else np.asarray(a)[states] != _OFF[name]
        if name == "top_k" and a is not None:
            on &= np.asarray(a)[states] < batch.effective_vocab_size
        out[name] = on
    return out


def mask_near_ties(f: Facts) -> int:
    """Mask decisions a float32 sampler may decide otherwise than the float64 reference: min-p
    margins within `MIN_P_NEAR * L` of the threshold but not on it (a float32 `M + log m` is off
    by about an ulp of L), top-p margins (masses) within `TOP_P_NEAR` (float32 sums of a few
    hundred probabilities are off by ~1e-5). Top-k compares the same float32 logits, and
    min-p = 1 puts the maxima exactly on the threshold: both exact."""
    if f.masks is None:
        return 0
    with np.errstate(invalid="ignore"):
        mp, tp = f.masks.min_p_margin, f.masks.top_p_margin
        near_min_p = np.isfinite(mp) & (np.abs(mp) <= MIN_P_NEAR * f.masks.min_p_scale[:, None]) & (mp != 0)
        near_top_p = np.isfinite(tp) & (np.abs(tp) <= TOP_P_NEAR) & np.isfinite(f.z)
    return int(near_min_p.sum() + near_top_p.sum())


def param_knobs_of(f: Facts, tests=(), bonus_rows=()) -> set[str]:
    """The knobs of `PARAM_KNOBS` the batch has. `tests`: the token-wise acceptance tests
    (`events.acceptance_tests`); `bonus_rows`: `(request, row)` of every bonus token emitted."""
    b = f.batch
    knobs = set()
    on = state_params_on(b)
    any_on = np.any([on[name] for name in SAMPLING_PARAMS], axis=0) if b.num_reqs else np.zeros(0, bool)
    if (f.stochastic & any_on).any() and (f.stochastic & ~any_on).any():
        knobs.add(PARAMS_MIXED)
    if (~f.stochastic & any_on).any():
        knobs.add(PARAMS_GREEDY)
    if (f.stochastic & on["min_p"] & on["top_k"] & on["top_p"]).any():
        knobs.add(ALL_THREE)
    if f.masks is None:
        return knobs
    mr, removed = f.masks, f.param_masked
    finite = np.isfinite(f.z)
    kept_n, finite_n, removed_n = (mr.kept & finite).sum(axis=1), finite.sum(axis=1), removed.sum(axis=1)
    if (removed_n > 0).any():
        if b.verification == BLOCK.name:
            knobs.add(PARAMS_BLOCK)
        if b.effective_vocab_size < b.vocab_size:
            knobs.add(PARAMS_VD)
        if b.num_logprobs is not None and b.logprobs_mode == "processed":
            knobs.add(PARAMS_LOGPROBS)
    if ((removed_n > 0) & (kept_n <= 2) & (finite_n >= 3)).any():
        knobs.add(PARAMS_TIGHT)
    if ((removed_n > 0) & (2 * kept_n > finite_n)).any():
        knobs.add(PARAMS_LOOSE)
    with np.errstate(invalid="ignore"):
        for what, margin, _ in mr.margins():  # top-p keeps a margin > 0, the others a margin >= 0
            if (finite & ((margin <= 0) if what == "top_p" else (margin < 0))).any():
                knobs.add(MASKS[what])
        knobs |= _tie_knobs(f)
    knobs |= _draft_knobs(f, tests)
    knobs |= _bonus_knobs(f, bonus_rows)
    return knobs


def _tie_knobs(f: Facts) -> set[str]:
    mr, z = f.masks, f.z
    knobs = set()
    tk = mr.top_k_margin
    tied = (tk == 0).sum(axis=1)
    kept_by_k = (tk >= 0).sum(axis=1)
    from_rows = _row_top_k(f)
    if ((tied >= 2) & (kept_by_k > from_rows)).any():
        knobs.add(TOP_K_TIES)
    tp = mr.top_p_margin
    for j in np.flatnonzero(np.isfinite(tp).any(axis=1)):
        decided = np.isfinite(tp[j])
        vals = z[j][decided]
        keep = tp[j][decided] > 0
        for val in np.unique(vals[keep]):
            same = vals == val
            if same.sum() >= 2 and not keep[same].all():
                knobs.add(TOP_P_TIES)
                break
    mp = mr.min_p_margin
    one = _row_param(f, "min_p") == 1.0
    if (one & ((mp == 0).sum(axis=1) >= 2)).any():
        knobs.add(MIN_P_ONE)
    return knobs


def _row_param(f: Facts, name: str) -> np.ndarray:
    """A parameter of every row's state (its off value when the array is None)."""
    a = getattr(f.batch, name)
    n = np.diff(np.asarray(f.batch.cu_num_logits, np.int64))
    states = np.repeat(np.asarray(f.batch.idx_mapping, np.int64), n)
    return np.full(states.size, _OFF[name]) if a is None else np.asarray(a)[states]


def _row_top_k(f: Facts) -> np.ndarray:
    return _row_param(f, "top_k").astype(np.int64)


def _draft_knobs(f: Facts, tests) -> set[str]:
    """Masked drafts the verification evaluates, and residuals the mask empties."""
    b, removed = f.batch, f.param_masked
    cu = np.asarray(b.cu_num_logits, np.int64)
    knobs = set()
    steps = [(t.request, t.step, t.draft) for t in tests if not t.padded]
    if f.block is not None:
        ids = np.asarray(b.draft_token_ids)
        steps += [(int(r), i, int(ids[cu[r] + 1 + i])) for r in np.flatnonzero(f.stochastic)
                  for i in range(int(f.block.m[r]))]
    for r, i, d in steps:
        j = int(cu[r] + i)
        if removed[j, d]:
            qd = 1.0 if f.q is None else f.q[j, d]
            knobs.add(MASKED_DRAFT if qd > 0 else MASKED_DRAFT_Q0)
    for t in tests:
        if not t.padded and not t.accepted and f.q is not None:
            j = int(cu[t.request] + t.step)
            if not (f.p[j] - f.q[j] > 0).any() and (f.p_raw[j] - f.q[j] > 0).any():
                knobs.add(MASK_EMPTIES)
    if f.block is not None:
        ids = np.asarray(b.draft_token_ids)
        for r in np.flatnonzero(f.stochastic):
            tau, m = int(f.tau[r]), int(f.block.m[r])
            if tau >= m:
                continue
            j = int(cu[r] + tau)
            scale = 1.0 if tau == 0 else float(np.exp(f.block.log_prefix[r, tau - 1]))
            if f.q is None:
                rest, rest_raw = np.delete(f.p[j], ids[j + 1]), np.delete(f.p_raw[j], ids[j + 1])
            else:
                rest, rest_raw = scale * f.p[j] - f.q[j], scale * f.p_raw[j] - f.q[j]
            if not (rest > 0).any() and (rest_raw > 0).any():
                knobs.add(MASK_EMPTIES)
    return knobs


def _bonus_knobs(f: Facts, bonus_rows) -> set[str]:
    """Emitted bonus tokens that the mask changes: the Gumbel-max token of the masked row differs
    from the unmasked row's with the same SPEC noise."""
    b = f.batch
    seeds = np.asarray(b.seeds)[np.asarray(b.idx_mapping, np.int64)]
    for r, j in bonus_rows:
        if not f.param_masked[j].any():
            continue
        g = f.family.at_requests(b, [r], [seeds[r]], [b.pos[j]], f.v)[0]  # the request's own noise (SPEC 3c)
        with np.errstate(divide="ignore"):
            if np.argmax(np.log(f.p[j]) + g) != np.argmax(np.log(f.p_raw[j]) + g):
                return {BONUS_CHANGED}
    return set()
