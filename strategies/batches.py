"""Valid ragged spec-decode batches (SPEC section 1) and their building blocks.

Hypothesis draws the *structure* (request count, draft steps, per-request draft
counts, vocab sizes, pattern names, temperature kind, dtype, seeds, positions
and one 32-bit content seed); NumPy fills the *contents* from
`numpy.random.default_rng(content_seed)`. Draws stay fast and shrink towards
few requests, few steps, a small vocab, float32, greedy and no logprobs.

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from rs_verify.spec.batch import LOGITS_DTYPES, LOGPROBS_MODES, SpecBatch

DRAFT_MODES = ("model", "one-hot")
TEMPERATURE_KINDS = ("greedy", "one", "random", "mixed")
PATTERNS = ("random", "peaked", "flat", "tied", "one-hot", "extreme")
LOGPROBS_CHOICES = (None,) + LOGPROBS_MODES

FLOAT32_MAX = float(np.finfo(np.float32).max)
BFLOAT16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))
DTYPE_MAX = {"float32": FLOAT32_MAX, "bfloat16": BFLOAT16_MAX, "float16": 65504.0}

# Small sizes and sizes straddling power-of-two block edges; larger ones come
# from a separate, rarer branch (see `vocab_sizes`).
DEFAULT_VOCAB_SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
LARGE_VOCAB_MIN = 255
MIN_RANDOM_TEMPERATURE = 0.05
MAX_RANDOM_TEMPERATURE = 4.0
ONE_HOT_GAP = 1e4  # exp(-1e4 / 4) underflows even float64: a one-hot row without -inf

SPECIAL_SEEDS = (0, -1, 1, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32, 2**63 - 1, -(2**63))
INT64_MAX = 2**63 - 1
POSITION_EDGES = (2**31, 2**32, INT64_MAX)


# -- small strategies ------------------------------------------------------


def seeds() -> st.SearchStrategy[int]:
    """Seeds across the whole int64 range, biased to the 32/64-bit edges; shrinks to 0."""
    return st.one_of(st.sampled_from(SPECIAL_SEEDS), st.integers(-(2**63), INT64_MAX))


def positions() -> st.SearchStrategy[int]:
    """Positions in `[0, 2**63 - 1]`: small ones, ones within 8 of 2**31, 2**32 and
    2**63 - 1, and uniform ones; shrinks to 0."""
    near_edge = st.builds(
        lambda edge, d: min(max(edge + d, 0), INT64_MAX),
        st.sampled_from(POSITION_EDGES),
        st.integers(-8, 8),
    )
    return st.one_of(st.integers(0, 4096), near_edge, st.integers(0, INT64_MAX))


def vocab_sizes(max_vocab: int = 1025) -> st.SearchStrategy[int]:
    """The default vocab sizes: 1, tiny sizes and block-edge sizes (15/16/17 ... 127/128/129)
    up to `max_vocab`, plus, one draw in eight, a size in `[255, max_vocab]`; shrinks to 1."""
    _check_int("max_vocab", max_vocab, 1)
    small = [v for v in DEFAULT_VOCAB_SIZES if v <= max_vocab]
    if max_vocab < LARGE_VOCAB_MIN:
        return st.sampled_from(small)

    @st.composite
    def _vocab(draw):
        if draw(st.integers(0, 7)) == 7:
            return draw(st.integers(LARGE_VOCAB_MIN, max_vocab))
        return draw(st.sampled_from(small))

    return _vocab()


# The knobs of `spec_batches` shadow these names inside it.
_default_seeds, _default_positions, _default_vocab_sizes = seeds, positions, vocab_sizes


# -- content helpers (NumPy only) ------------------------------------------


def round_to_dtype(x, dtype: str) -> np.ndarray:
    """float32 `x` rounded (to nearest even) to values exactly representable in `dtype`.

    Finite values are first clipped to the dtype's largest finite value, so
    nothing becomes infinite; `-inf` stays `-inf`. NaN is not supported.
    """
    x = np.array(x, dtype=np.float32)
    if dtype == "float32":
        return x
    m = np.float32(DTYPE_MAX[dtype])
    finite = np.isfinite(x)
    x[finite] = np.clip(x[finite], -m, m)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        raise ValueError(f"unknown dtype {dtype!r}")
    b = x.view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def magnitude_bound(dtype: str, temperature: float) -> float:
    """The largest logit magnitude allowed for a state: the dtype's largest finite value,
    and, when `0 < T < 1`, half of what `T` can divide without overflowing float32 (SPEC 9)."""
    m = DTYPE_MAX[dtype]
    t = float(temperature)
    if t == 0 or t >= 1:
        return m
    return min(m, FLOAT32_MAX * t * 0.5)


def logits_rows(
    rng: np.random.Generator,
    n: int,
    vocab: int,
    pattern: str,
    *,
    dtype: str = "float32",
    v_eff: int | None = None,
    max_abs: float | None = None,
    allow_inf: bool = False,
) -> np.ndarray:
    """`n` float32 logits rows over `vocab` tokens in `pattern`, representable in `dtype`.

    Patterns: "random" (Gaussian, random scale), "peaked" (one dominant logit),
    "flat" (all equal), "tied" (2-4 exactly equal maxima), "one-hot" (one finite
    logit and the rest `-inf` when `allow_inf`, else `ONE_HOT_GAP` below),
    "extreme" (magnitudes up to `max_abs`, default the dtype's limit). Peaks,
    ties and hot tokens lie in `[0, v_eff)` (default `vocab`). Finite values are
    clipped to `max_abs`.
    """
    v_eff = vocab if v_eff is None else v_eff
    bound = DTYPE_MAX[dtype] if max_abs is None else float(max_abs)
    shape = (n, vocab)
    if pattern == "random":
        x = rng.standard_normal(shape) * rng.choice([1.0, 4.0, 16.0])
    elif pattern == "peaked":
        x = rng.standard_normal(shape)
        x[np.arange(n), rng.integers(0, v_eff, n)] += rng.uniform(8.0, 30.0, n)
    elif pattern == "flat":
        x = np.repeat(np.round(rng.uniform(-8.0, 8.0, (n, 1)), 1), vocab, axis=1)
    elif pattern == "tied":
        x = rng.standard_normal(shape) * 2.0
        m = min(v_eff, int(rng.integers(2, 5)))
        if m >= 2:
            top = x.max(axis=1) + 1.0
            for row in range(n):
                x[row, rng.choice(v_eff, m, replace=False)] = top[row]
    elif pattern == "one-hot":
        hot_val = rng.standard_normal(n)
        x = np.repeat((hot_val - ONE_HOT_GAP)[:, None], vocab, axis=1)
        if allow_inf:
            x[:] = -np.inf
        x[np.arange(n), rng.integers(0, v_eff, n)] = hot_val
    elif pattern == "extreme":
        big = rng.uniform(-1.0, 1.0, shape) * bound
        x = np.where(rng.random(shape) < 0.5, big, rng.standard_normal(shape))
        if vocab:
            x[np.arange(n), rng.integers(0, vocab, n)] = bound * rng.choice([-1.0, 1.0], n)
    else:
        raise ValueError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
    x = x.astype(np.float32)
    finite = np.isfinite(x)
    x[finite] = np.clip(x[finite], -bound, bound)
    return round_to_dtype(x, dtype)


def mask_rows(rng: np.random.Generator, x: np.ndarray, v_eff: int, protect=None) -> np.ndarray:
    """Set random entries of about half the rows of `x` to `-inf` (in place), never the
    maxima over `[0, v_eff)` nor entries where `protect` holds: every row keeps a
    finite logit in `[0, v_eff)`, and its argmax and ties are kept."""
    n, vocab = x.shape
    if n == 0 or vocab == 0:
        return x
    head = x[:, :v_eff]
    keep = np.zeros(x.shape, bool)
    keep[:, :v_eff] = head == head.max(axis=1, keepdims=True)
    if protect is not None:
        keep |= protect
    frac = rng.uniform(0.05, 1.0, (n, 1)) * (rng.random((n, 1)) < 0.5)
    x[(rng.random(x.shape) < frac) & ~keep] = -np.inf
    return x


# -- knob validation ---------------------------------------------------------


def _check_int(name, value, lo):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if value < lo:
        raise InvalidArgument(f"{name}={value!r} must be >= {lo}")


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be a bool")


def _check_choices(name, values, allowed) -> tuple:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise InvalidArgument(f"{name}={values!r} must be a sequence drawn from {allowed}")
    values = tuple(values)
    if not values:
        raise InvalidArgument(f"{name} must not be empty")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InvalidArgument(f"{name}: unknown values {bad}; expected some of {allowed}")
    return tuple(dict.fromkeys(values))


def _check_strategy(name, value):
    if value is not None and not isinstance(value, st.SearchStrategy):
        raise InvalidArgument(f"{name}={value!r} must be None or a SearchStrategy")


# -- the batch strategy ------------------------------------------------------


def spec_batches(
    *,
    min_reqs: int = 0,
    max_reqs: int = 6,
    max_spec_steps: int = 8,
    min_drafts: int = 0,
    vocab_sizes: st.SearchStrategy[int] | Sequence[int] | None = None,
    max_vocab: int = 1025,
    draft_modes: Sequence[str] = DRAFT_MODES,
    draft_vocab: bool = True,
    temperatures: Sequence[str] = TEMPERATURE_KINDS,
    logits_dtypes: Sequence[str] = LOGITS_DTYPES,
    logprobs: Sequence[str | None] = LOGPROBS_CHOICES,
    max_logprobs: int = 8,
    padded_drafts: bool = True,
    masks: bool = True,
    patterns: Sequence[str] = PATTERNS,
    max_extra_states: int = 3,
    seeds: st.SearchStrategy[int] | None = None,
    positions: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[SpecBatch]:
    """Valid `SpecBatch` objects (they pass `rs_verify.validate`) covering every SPEC field.

    Every argument is keyword-only and checked when the strategy is built.
    Draws shrink towards few requests, `K = 0`, `n_r = 0`, a small vocab,
    model drafts with `Vd = V`, float32, greedy, no logprobs, no padding, no
    masks, `S = R` with the identity `idx_mapping`, seed 0 and position 0.
    Verified draft ids lean towards the target's argmax and likely tokens (so
    drafts get accepted); the unused first draft id of a request may be garbage.

    * `min_reqs`, `max_reqs`: bounds of the request count `R`.
    * `max_spec_steps`: `K = num_speculative_steps` is drawn in `[min_drafts, max_spec_steps]`.
    * `min_drafts`: the least `n_r` of every request (`n_r` is drawn in `[min_drafts, K]`).
    * `vocab_sizes`: a strategy or a sequence of target vocab sizes `V >= 1`; by default
      `vocab_sizes(max_vocab)` (1, tiny sizes, block edges, sometimes `[255, max_vocab]`).
    * `max_vocab`: the largest default vocab size (ignored when `vocab_sizes` is given).
    * `draft_modes`: some of "model" (draft logits `[S, K, Vd]`) and "one-hot" (`None`).
    * `draft_vocab`: allow a draft vocab `Vd < V` for model drafts (else `Vd == V`).
    * `temperatures`: some of "greedy" (`T = 0`), "one" (exactly 1.0), "random"
      (log-uniform in `[0.05, 4]`) and "mixed" (each request one of the three).
    * `logits_dtypes`: some of "float32", "bfloat16", "float16"; logits are exactly
      representable in the drawn one.
    * `logprobs`: some of `None` (no logprobs), "raw" and "processed".
    * `max_logprobs`: `num_logprobs` is drawn in `[0, min(V, max_logprobs)]`.
    * `padded_drafts`: allow negative (padded) draft ids: -1 and other negatives.
    * `masks`: allow `-inf` logits; every row keeps a finite logit in `[0, V')`.
    * `patterns`: per-request logits patterns, some of "random", "peaked", "flat",
      "tied", "one-hot" and "extreme" (magnitudes near the dtype limit, never
      enough to overflow `logit / T` in float32).
    * `max_extra_states`: up to this many request states beyond `R` (`S > R`), holding
      finite garbage; `idx_mapping` may then be shuffled.
    * `seeds`: the per-request seed strategy, drawing int64 values (default `seeds()`).
    * `positions`: the strategy of each request's first position, drawing values in
      `[0, 2**63 - 1]` (default `positions()`); rows of a request have consecutive
      positions (a start too close to `2**63 - 1` is moved down so they fit).
    """
    _check_int("min_reqs", min_reqs, 0)
    _check_int("max_reqs", max_reqs, min_reqs)
    _check_int("min_drafts", min_drafts, 0)
    _check_int("max_spec_steps", max_spec_steps, min_drafts)
    _check_int("max_vocab", max_vocab, 1)
    _check_int("max_logprobs", max_logprobs, 0)
    _check_int("max_extra_states", max_extra_states, 0)
    _check_bool("draft_vocab", draft_vocab)
    _check_bool("padded_drafts", padded_drafts)
    _check_bool("masks", masks)
    _check_strategy("seeds", seeds)
    _check_strategy("positions", positions)
    if vocab_sizes is None:
        vocab_st = _default_vocab_sizes(max_vocab)
    elif isinstance(vocab_sizes, st.SearchStrategy):
        vocab_st = vocab_sizes
    else:
        if isinstance(vocab_sizes, (str, bytes)) or not isinstance(vocab_sizes, Sequence) or not vocab_sizes:
            raise InvalidArgument(f"vocab_sizes={vocab_sizes!r} must be a strategy or a non-empty sequence")
        for v in vocab_sizes:
            _check_int("vocab_sizes entry", v, 1)
        vocab_st = st.sampled_from(tuple(vocab_sizes))
    cfg = dict(
        min_reqs=min_reqs,
        max_reqs=max_reqs,
        max_spec_steps=max_spec_steps,
        min_drafts=min_drafts,
        vocab=vocab_st,
        draft_modes=_check_choices("draft_modes", draft_modes, DRAFT_MODES),
        draft_vocab=draft_vocab,
        temperatures=_check_choices("temperatures", temperatures, TEMPERATURE_KINDS),
        dtypes=_check_choices("logits_dtypes", logits_dtypes, LOGITS_DTYPES),
        logprobs=_check_choices("logprobs", logprobs, LOGPROBS_CHOICES),
        max_logprobs=max_logprobs,
        padded=padded_drafts,
        masks=masks,
        patterns=_check_choices("patterns", patterns, PATTERNS),
        max_extra_states=max_extra_states,
        seeds=_default_seeds() if seeds is None else seeds,
        positions=_default_positions() if positions is None else positions,
    )
    return _spec_batches(cfg)


def _rare(draw, n: int = 4) -> bool:
    """True about once in `n` draws; shrinks to False."""
    return draw(st.integers(0, n - 1)) == n - 1


@st.composite
def _spec_batches(draw, cfg) -> SpecBatch:
    # ---- structure, drawn by Hypothesis (order chosen for shrinking) ----
    R = draw(st.integers(cfg["min_reqs"], cfg["max_reqs"]))
    K = draw(st.integers(cfg["min_drafts"], cfg["max_spec_steps"]))
    n_r = [draw(st.integers(cfg["min_drafts"], K)) for _ in range(R)]
    V = draw(cfg["vocab"])
    if isinstance(V, bool) or not isinstance(V, (int, np.integer)) or V < 1:
        raise InvalidArgument(f"vocab_sizes drew {V!r}; expected an int >= 1")
    V = int(V)
    mode = draw(st.sampled_from(cfg["draft_modes"]))
    Vd = None
    if mode == "model":
        Vd = V
        if cfg["draft_vocab"] and V >= 2 and _rare(draw):
            Vd = draw(st.integers(1, V - 1))
    v_eff = V if Vd is None else Vd
    dtype = draw(st.sampled_from(cfg["dtypes"]))
    temp_kind = draw(st.sampled_from(cfg["temperatures"]))
    lp_mode = draw(st.sampled_from(cfg["logprobs"]))
    num_logprobs = None if lp_mode is None else draw(st.integers(0, min(V, cfg["max_logprobs"])))
    padded = cfg["padded"] and _rare(draw)
    masked = cfg["masks"] and _rare(draw, 3)
    extra = draw(st.integers(1, cfg["max_extra_states"])) if cfg["max_extra_states"] and _rare(draw, 3) else 0
    shuffled = (R + extra >= 2) and _rare(draw, 3)
    patterns = [draw(st.sampled_from(cfg["patterns"])) for _ in range(R)]
    req_seeds = [_checked(draw(cfg["seeds"]), "seeds", -(2**63)) for _ in range(R)]
    req_pos = [_checked(draw(cfg["positions"]), "positions", 0) for _ in range(R)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    # ---- contents, filled by NumPy ----
    S = R + extra
    N = sum(n_r) + R
    cu = np.zeros(R + 1, np.int64)
    cu[1:] = np.cumsum(np.asarray(n_r, np.int64) + 1)
    idx = rng.permutation(S)[:R] if shuffled else np.arange(R)

    temperature = _garbage_temperatures(rng, S)
    kinds = _temperature_kinds(rng, temp_kind, R)
    for r, kind in enumerate(kinds):
        temperature[idx[r]] = _temperature(rng, kind)
    seeds_arr = rng.integers(-(2**63), 2**63 - 1, S, dtype=np.int64, endpoint=True)
    seeds_arr[idx] = np.asarray(req_seeds, dtype=np.int64).reshape(R)

    pos = np.zeros(N, np.int64)
    for r in range(R):
        base = min(int(req_pos[r]), INT64_MAX - n_r[r])
        pos[cu[r] : cu[r + 1]] = base + np.arange(n_r[r] + 1)

    target = np.empty((N, V), np.float32)
    bounds = []
    for r in range(R):
        bound = magnitude_bound(dtype, float(temperature[idx[r]]))
        bounds.append(bound)
        target[cu[r] : cu[r + 1]] = logits_rows(
            rng, n_r[r] + 1, V, patterns[r], dtype=dtype, v_eff=v_eff, max_abs=bound, allow_inf=masked
        )
    if masked:
        mask_rows(rng, target, v_eff)

    draft_ids = _draft_token_ids(rng, target, cu, v_eff, padded)

    draft = None
    if mode == "model":
        draft = round_to_dtype(rng.uniform(-20.0, 20.0, (S, K, Vd)), dtype)
        for r in range(R):
            if n_r[r]:
                rows = _draft_rows(rng, target, cu, r, n_r[r], draft_ids, Vd, dtype, bounds[r], cfg["patterns"], masked)
                draft[idx[r], : n_r[r]] = rows

    batch = SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=draft_ids,
        cu_num_logits=cu.astype(np.int32),
        pos=pos,
        idx_mapping=idx.astype(np.int32),
        temperature=temperature,
        seeds=seeds_arr,
        num_speculative_steps=K,
        logits_dtype=dtype,
        num_logprobs=num_logprobs,
        logprobs_mode=lp_mode or "raw",
    )
    _label(batch, mode, dtype, temp_kind, kinds, patterns, lp_mode, masked, idx)
    return batch


def _checked(value, name, lo):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= INT64_MAX:
        raise InvalidArgument(f"{name} drew {value!r}; expected an int in [{lo}, 2**63 - 1]")
    return int(value)


def _garbage_temperatures(rng, S) -> np.ndarray:
    """Arbitrary finite float32 temperatures, for states no request references."""
    pool = np.array([0.0, 1.0, -1.0, 1e-30, 1e30, -3e38, 3e38, 0.5], np.float32)
    t = np.where(rng.random(S) < 0.5, rng.choice(pool, S), rng.uniform(-10.0, 10.0, S))
    return t.astype(np.float32)


def _temperature_kinds(rng, kind, R) -> list[str]:
    if kind != "mixed":
        return [kind] * R
    kinds = list(rng.choice(["greedy", "one", "random"], R))
    if R >= 2 and len(set(kinds)) == 1:
        kinds[int(rng.integers(R))] = "random" if kinds[0] != "random" else "greedy"
    return [str(k) for k in kinds]


def _temperature(rng, kind) -> np.float32:
    if kind == "greedy":
        return np.float32(0.0)
    if kind == "one":
        return np.float32(1.0)
    lo, hi = np.log(MIN_RANDOM_TEMPERATURE), np.log(MAX_RANDOM_TEMPERATURE)
    return np.float32(np.exp(rng.uniform(lo, hi)))


def _softmax_head(row, v_eff) -> np.ndarray:
    z = row[:v_eff].astype(np.float64)
    z = np.exp(z - z.max())
    return z / z.sum()


def _draft_token_ids(rng, target, cu, v_eff, padded) -> np.ndarray:
    """Draft ids in the vLLM layout: the id verified by row j sits at j + 1.

    Verified ids lean towards the target row's argmax and high-probability tokens
    (so acceptances happen); with `padded`, some are negative. The first entry of
    each request is never read: it holds valid ids or garbage.
    """
    N = target.shape[0]
    R = cu.shape[0] - 1
    ids = rng.integers(0, v_eff, N, dtype=np.int64)
    garbage = np.array([-1, v_eff, v_eff + 1, 2**40, -(2**63), 2**63 - 1], np.int64)
    firsts = cu[:-1]
    ids[firsts] = np.where(rng.random(R) < 0.5, ids[firsts], rng.choice(garbage, R))
    verified = np.ones(N, bool)
    verified[firsts] = False
    for p in np.flatnonzero(verified):
        u = rng.random()
        row = target[p - 1]
        if u < 0.45:
            ids[p] = int(np.argmax(row[:v_eff]))
        elif u < 0.7:
            ids[p] = int(rng.choice(v_eff, p=_softmax_head(row, v_eff)))
    if padded and verified.any():
        where = np.flatnonzero(verified)
        pad = where[rng.random(where.size) < rng.uniform(0.1, 0.6)]
        if pad.size == 0:
            pad = where[rng.integers(where.size, size=1)]
        negatives = np.array([-2, -3, -v_eff - 1, -(2**31), -(2**63)], np.int64)
        ids[pad] = np.where(rng.random(pad.size) < 0.7, -1, rng.choice(negatives, pad.size))
    return ids


def _draft_rows(rng, target, cu, r, n, draft_ids, Vd, dtype, bound, patterns, masked) -> np.ndarray:
    """Draft logits of the `n` verified steps of request `r`: a noisy copy of the target
    row or a pattern; a one-hot draft is hot at its draft id; masks spare the draft id."""
    lo = int(cu[r])
    out = np.empty((n, Vd), np.float32)
    ids = draft_ids[lo + 1 : lo + 1 + n]
    for i in range(n):
        kind = "correlated" if rng.random() < 0.4 else str(rng.choice(patterns))
        if kind == "correlated":
            row = target[lo + i, :Vd].astype(np.float64) * rng.uniform(0.5, 1.0)
            row = row + rng.standard_normal(Vd) * rng.choice([0.1, 1.0, 3.0])
            row = np.where(np.isfinite(row), np.clip(row, -bound, bound), row)
            out[i] = round_to_dtype(row.astype(np.float32), dtype)
        else:
            out[i] = logits_rows(rng, 1, Vd, kind, dtype=dtype, max_abs=bound, allow_inf=masked)[0]
            d = int(ids[i])
            if kind == "one-hot" and 0 <= d < Vd and rng.random() < 0.8:
                out[i] = np.roll(out[i], d - int(np.argmax(out[i])))
    if masked:
        protect = np.zeros(out.shape, bool)
        for i, d in enumerate(ids):
            if 0 <= d < Vd and rng.random() < 0.9:
                protect[i, d] = True
        mask_rows(rng, out, Vd, protect)
    return out


def _label(batch, mode, dtype, temp_kind, kinds, patterns, lp_mode, masked, idx):
    """Label the draw (shown by `--hypothesis-show-statistics`)."""
    R, V = batch.num_reqs, batch.vocab_size
    event(f"drafts: {mode}")
    event(f"logits_dtype: {dtype}")
    mixed = f" ({'/'.join(sorted(set(kinds)))})" if temp_kind == "mixed" and kinds else ""
    event(f"temperature: {temp_kind}{mixed}")
    for p in sorted(set(patterns)):
        event(f"pattern: {p}")
    event(f"logprobs: {lp_mode}")
    event(f"S > R: {batch.num_states > R}")
    event(f"idx_mapping shuffled: {not np.array_equal(idx, np.arange(R))}")
    verified = np.concatenate([batch.draft_tokens(r) for r in range(R)]) if R else np.zeros(0)
    event(f"padded drafts: {bool((verified < 0).any())}")
    event(f"masks: {masked}")
    bucket = "1" if V == 1 else "2-16" if V <= 16 else "17-129" if V <= 129 else ">129"
    event(f"vocab: {bucket}")
    if batch.draft_logits is not None:
        event(f"Vd < V: {batch.draft_vocab_size < V}")
    event(f"R: {R}")
