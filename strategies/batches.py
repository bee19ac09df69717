"""Valid ragged spec-decode batches (SPEC section 1): `spec_batches`, the broad strategy.

Hypothesis draws the *structure* (request count, draft steps, per-request draft
counts, vocab sizes, pattern names, temperature kind, dtype, seeds, positions
and one 32-bit content seed); NumPy fills the *contents* from
`numpy.random.default_rng(content_seed)`. Draws stay fast and shrink towards
few requests, few steps, a small vocab, float32, greedy and no logprobs.
`strategies.decisions.decision_batches` draws from the same building blocks,
tilted towards stochastic acceptance decisions.

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from rs_verify.contract.batch import DRAFT_MODES, LOGITS_DTYPES, LOGPROBS_MODES, SAMPLING_PARAMS, VERIFICATION_METHODS, SpecBatch
from rs_verify.contract.logit_bound import checked as checked_bound
from rs_verify.contract.methods import TOKEN

from .drafts import lean_draft_ids, pattern_draft_rows
from .events import label_decisions, label_structure
from .knobs import (INT64_MAX, check_bool, check_choices, check_int, check_strategy, drawn_int64, drawn_vocab, rare,
                    vocab_strategy)
from .logits import PATTERNS, clip_to_bounds, logits_rows, magnitude_bound, mask_rows, round_to_dtype
from .params import broad_params
from .scalars import (DEFAULT_BLOCK_SIZES, TEMPERATURE_KINDS, garbage_temperatures, positions as default_positions,
                      seeds as default_seeds, temperature as kind_temperature, temperature_kinds,
                      vocab_sizes as default_vocab_sizes)

LOGPROBS_CHOICES = (None,) + LOGPROBS_MODES


# The contract spells the mode "one_hot" (SPEC section 10); earlier releases of these strategies said "one-hot".
_DRAFT_ALIASES = {"one-hot": "one_hot"}


def _seq(values):
    return values if isinstance(values, str) or not hasattr(values, "__iter__") else list(values)


# -- shared layout helpers (also used by strategies.decisions) ----------------------------


def row_offsets(n_r) -> np.ndarray:
    """`cu_num_logits` (int64) for per-request draft counts `n_r`."""
    cu = np.zeros(len(n_r) + 1, np.int64)
    cu[1:] = np.cumsum(np.asarray(n_r, np.int64) + 1)
    return cu


def row_positions(cu, n_r, req_pos) -> np.ndarray:
    """Consecutive positions per request from its first one (moved down to fit below 2**63)."""
    pos = np.zeros(int(cu[-1]), np.int64)
    for r in range(len(n_r)):
        base = min(int(req_pos[r]), INT64_MAX - n_r[r])
        pos[cu[r] : cu[r + 1]] = base + np.arange(n_r[r] + 1)
    return pos


def state_seeds(rng, S, idx, req_seeds) -> np.ndarray:
    """Per-state seeds: random for unreferenced states, the drawn ones at `idx`."""
    seeds_arr = rng.integers(-(2**63), 2**63 - 1, S, dtype=np.int64, endpoint=True)
    seeds_arr[idx] = np.asarray(req_seeds, dtype=np.int64).reshape(len(idx))
    return seeds_arr


def check_common(**kw) -> dict:
    """Check the knobs `spec_batches` and `decision_batches` share; return the config dict."""
    check_int("min_reqs", kw["min_reqs"], 0)
    check_int("max_reqs", kw["max_reqs"], kw["min_reqs"])
    check_int("min_drafts", kw["min_drafts"], 0)
    check_int("max_spec_steps", kw["max_spec_steps"], kw["min_drafts"])
    check_int("max_vocab", kw["max_vocab"], 1)
    check_int("max_logprobs", kw["max_logprobs"], 0)
    check_int("max_extra_states", kw["max_extra_states"], 0)
    check_bool("draft_vocab", kw["draft_vocab"])
    check_bool("padded_drafts", kw["padded_drafts"])
    check_bool("masks", kw["masks"])
    check_strategy("seeds", kw["seeds"])
    check_strategy("positions", kw["positions"])
    bound = kw.get("logit_bound")
    try:
        bound = checked_bound(bound)
    except ValueError as exc:
        raise InvalidArgument(f"logit_bound={bound!r}: {exc}") from None
    return dict(
        logit_bound=bound,
        min_reqs=kw["min_reqs"],
        max_reqs=kw["max_reqs"],
        max_spec_steps=kw["max_spec_steps"],
        min_drafts=kw["min_drafts"],
        draft_modes=check_choices("draft_modes", [_DRAFT_ALIASES.get(m, m) for m in _seq(kw["draft_modes"])],
                                  DRAFT_MODES),
        draft_vocab=kw["draft_vocab"],
        temperatures=check_choices("temperatures", kw["temperatures"], TEMPERATURE_KINDS),
        dtypes=check_choices("logits_dtypes", kw["logits_dtypes"], LOGITS_DTYPES),
        logprobs=check_choices("logprobs", kw["logprobs"], LOGPROBS_CHOICES),
        max_logprobs=kw["max_logprobs"],
        padded=kw["padded_drafts"],
        masks=kw["masks"],
        patterns=check_choices("patterns", kw["patterns"], PATTERNS),
        max_extra_states=kw["max_extra_states"],
        seeds=default_seeds() if kw["seeds"] is None else kw["seeds"],
        positions=default_positions() if kw["positions"] is None else kw["positions"],
        verifications=check_choices("verifications", kw["verifications"], VERIFICATION_METHODS),
        sampling_params=() if not kw["sampling_params"] else check_choices("sampling_params", kw["sampling_params"],
                                                                            SAMPLING_PARAMS),
    )


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
    verifications: Sequence[str] = (TOKEN.name,),
    sampling_params: Sequence[str] = (),
    logit_bound: float | None = None,
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
    * `draft_modes`: some of "model" (draft logits `[S, K, Vd]`) and "one_hot" (`None`; "one-hot" is accepted too).
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
    * `verifications`: some of "token" and "block" (SPEC sections 4 and 4b); the batch's
      `verification` is drawn among them. Default `("token",)`: what a sampler that declares
      no `verification_methods` is sent.
    * `sampling_params`: some of "min_p", "top_k", "top_p" (SPEC section 2), or empty. With
      any, one batch in two carries per-state values of those (each referenced state off,
      loose, tight or all of them on; garbage at unreferenced states; an unused parameter
      `None` or all off). Default `()`: no parameters, what a sampler that declares no
      `sampling_params` is sent. The engine passes the sampler's declarations explicitly.
    * `logit_bound`: a positive finite number, or None (every finite float32 logit): the
      sampler's declared bound (SPEC section 10); every finite processed logit `fp32(x) / T` of a
      request (target rows and its state's draft rows) has `|z| <= logit_bound`, dtype rounding
      included; `-inf` logits are drawn as without it.
    """
    cfg = check_common(min_reqs=min_reqs, max_reqs=max_reqs, max_spec_steps=max_spec_steps, min_drafts=min_drafts,
                       max_vocab=max_vocab, draft_modes=draft_modes, draft_vocab=draft_vocab,
                       temperatures=temperatures, logits_dtypes=logits_dtypes, logprobs=logprobs,
                       max_logprobs=max_logprobs, padded_drafts=padded_drafts, masks=masks, patterns=patterns,
                       max_extra_states=max_extra_states, seeds=seeds, positions=positions,
                       verifications=verifications, sampling_params=sampling_params, logit_bound=logit_bound)
    cfg["vocab"] = vocab_strategy(vocab_sizes, default_vocab_sizes(max_vocab))
    return _spec_batches(cfg)


@st.composite
def _spec_batches(draw, cfg) -> SpecBatch:
    # ---- structure, drawn by Hypothesis (order chosen for shrinking) ----
    R = draw(st.integers(cfg["min_reqs"], cfg["max_reqs"]))
    K = draw(st.integers(cfg["min_drafts"], cfg["max_spec_steps"]))
    n_r = [draw(st.integers(cfg["min_drafts"], K)) for _ in range(R)]
    V = drawn_vocab(draw(cfg["vocab"]))
    mode = draw(st.sampled_from(cfg["draft_modes"]))
    Vd = None
    if mode == "model":
        Vd = V
        if cfg["draft_vocab"] and V >= 2 and rare(draw):
            Vd = draw(st.integers(1, V - 1))
    v_eff = V if Vd is None else Vd
    dtype = draw(st.sampled_from(cfg["dtypes"]))
    temp_kind = draw(st.sampled_from(cfg["temperatures"]))
    lp_mode = draw(st.sampled_from(cfg["logprobs"]))
    chains = [v for v in cfg["verifications"] if v != "tree"] or ["token"]  # trees: strategies.tree_batches
    verification = chains[0] if len(chains) == 1 else draw(st.sampled_from(chains))
    num_logprobs = None if lp_mode is None else draw(st.integers(0, min(V, cfg["max_logprobs"])))
    padded = cfg["padded"] and rare(draw)
    masked = cfg["masks"] and rare(draw, 3)
    extra = draw(st.integers(1, cfg["max_extra_states"])) if cfg["max_extra_states"] and rare(draw, 3) else 0
    shuffled = (R + extra >= 2) and rare(draw, 3)
    patterns = [draw(st.sampled_from(cfg["patterns"])) for _ in range(R)]
    req_seeds = [drawn_int64(draw(cfg["seeds"]), "seeds", -(2**63)) for _ in range(R)]
    req_pos = [drawn_int64(draw(cfg["positions"]), "positions", 0) for _ in range(R)]
    params_on = bool(cfg["sampling_params"]) and rare(draw, 2)  # no draw unless parameters are allowed
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    # ---- contents, filled by NumPy ----
    S = R + extra
    cu = row_offsets(n_r)
    idx = rng.permutation(S)[:R] if shuffled else np.arange(R)

    temperature = garbage_temperatures(rng, S)
    kinds = temperature_kinds(rng, temp_kind, R)
    for r, kind in enumerate(kinds):
        temperature[idx[r]] = kind_temperature(rng, kind)
    seeds_arr = state_seeds(rng, S, idx, req_seeds)
    pos = row_positions(cu, n_r, req_pos)

    target = np.empty((int(cu[-1]), V), np.float32)
    bounds = []
    for r in range(R):
        bound = magnitude_bound(dtype, float(temperature[idx[r]]), cfg["logit_bound"])
        bounds.append(bound)
        target[cu[r] : cu[r + 1]] = logits_rows(
            rng, n_r[r] + 1, V, patterns[r], dtype=dtype, v_eff=v_eff, max_abs=bound, allow_inf=masked
        )
    if masked:
        mask_rows(rng, target, v_eff)

    draft_ids = lean_draft_ids(rng, target, cu, v_eff, padded)

    draft = None
    if mode == "model":
        draft = round_to_dtype(rng.uniform(-20.0, 20.0, (S, K, Vd)), dtype)
        for r in range(R):
            if n_r[r]:
                rows = pattern_draft_rows(rng, target, cu, r, n_r[r], draft_ids, Vd, dtype, bounds[r],
                                          cfg["patterns"], masked)
                draft[idx[r], : n_r[r]] = rows
    if cfg["logit_bound"] is not None:  # the unrelated draft rows (SPEC 10)
        clip_to_bounds(target, draft, cu, idx, bounds)

    params = broad_params(rng, cfg["sampling_params"], S, idx, v_eff, V) if params_on else {}

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
        verification=verification,
        top_k=params.get("top_k"),
        top_p=params.get("top_p"),
        min_p=params.get("min_p"),
    )
    label_structure(batch, mode, dtype, temp_kind, kinds, patterns, lp_mode, masked, idx)
    label_decisions(batch, DEFAULT_BLOCK_SIZES)
    return batch
