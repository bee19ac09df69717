"""`decision_batches`: valid batches rich in stochastic acceptance decisions.

A property that compares decisions (certification against the reference, output
invariants, determinism) learns nothing from a greedy-only or K = 0 batch, and little
from decisions far from the uniform `u`. This strategy keeps every field of
`spec_batches` reachable but tilts the draw towards decisions a wrong sampler gets
wrong:

- most requests are stochastic (greedy one request in six, and never all of them),
  `K >= 1`, three requests in eight verify `K` drafts and seven in eight at least one;
  stochastic targets mostly have a processed scale that keeps p spread out;
- model drafts are close to the target (`q = softmax((x + T * sigma * noise) / T)`)
  and drafted *from q* by Gumbel-max with the SPEC noise at `pos + 2**30`, so the
  acceptance probabilities `min(1, p(d) / q(d))` spread over (0, 1]; one-hot drafts
  are drawn the same way from a proposal close to p; 15% of stochastic requests keep
  the broad strategy's drafts (argmax-leaning ids, unrelated draft rows);
- padded drafts (-1 and other negatives) placed in stochastic requests, often at
  step 0 (so the step is reached), with model draft logits;
- target and draft saturated on the same token with a draft the drafter gave no
  mass (empty residual: SPEC section 4 falls back to p);
- exact ties among the maxima of target rows (greedy drafts on a tied maximum above
  the lowest index);
- vocabularies just above and around multiples of small block sizes (multi-block
  reductions, partial tail tiles);
- logits of realistic magnitude: three batches in four shift each row by a common
  offset in [-64, 64] (before the division by T). Softmax ignores it; floating-point
  error does not (rounding scales with |z|, `exp` without the max subtracted overflows);
- each example a fresh draw of contents: the NumPy generator is seeded from the
  content seed and every structural draw, so Hypothesis's small mutations of an
  earlier example do not replay its logits, drafts and noise.

`sigma` spans [0.03, 2]: small values give decisions with `p(d) / q(d)` near 1, where
`u` is most sensitive to small errors in `p` or `q`; large ones spread the acceptance
probabilities. Measured: 56% of acceptance tests have `0 < a < 1` (32% in [0.1, 0.95]).

Block verification and sampling parameters (the `verifications` and `sampling_params` knobs)
are planted by `strategies.block` and `strategies.params`, and labelled from the contract's own
formulas (`strategies.events`: `BLOCK_KNOBS`, `PARAM_KNOBS`). The `streams` knob (the sampler's
stream family) sets the uniforms and noise the tilts aim at and the labels read; the murmur3
family's edges are planted by `strategies.stream_edges` (`STREAM_KNOBS`), the explicit family's
by `strategies.explicit_edges` (`EXPLICIT_KNOBS`).

Imports only NumPy, Hypothesis and the batch contract.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from rs_verify.contract.batch import LOGITS_DTYPES, SpecBatch
from rs_verify.contract.methods import BLOCK, TOKEN, TREE
from rs_verify.contract.streams import PLAIN, StreamFamily, family as family_of

from . import edges
from .batches import DRAFT_MODES, LOGPROBS_CHOICES, check_common, row_offsets, row_positions, state_seeds
from .block import choose_verification, greedy_mix, plant_block
from .contents import Contents
from .drafts import close_draft_rows, gumbel_max_drafts, lean_draft_ids, log_softmax_processed, pattern_draft_rows
from .events import label_decisions, label_structure
from .facts import STREAMS
from .knobs import check_bool, check_ints, drawn_int64, drawn_vocab, rare, vocab_strategy
from .logits import PATTERNS, clip_to_bounds, logits_rows, magnitude_bound, mask_rows, round_to_dtype, shift_rows
from .params import draw_params_on, plant_params
from .explicit_edges import plant_explicit_edges
from .stream_edges import plant_stream_edges
from .thresholds import vet_thresholds
from .tree import tree_batches
from .scalars import DEFAULT_BLOCK_SIZES, TEMPERATURE_KINDS, block_edge_vocab_sizes, garbage_temperatures
from .scalars import temperature as kind_temperature

# Per-request temperature kinds and their weights (greedy a minority; shrinks to "one").
REQUEST_KINDS = (("one", 2), ("random", 3), ("greedy", 1))
DRAFT_SIGMA = (0.03, 2.0)  # log-uniform noise between processed target and draft logits (see module doc)
SECOND_CHANCE = 1 / 3  # with block or parameters allowed: padding, saturation or parameters the structure left out
# With parameters allowed, a token-wise draw that has them drops them this often: 5/6 x 0.4 + 1/6
# = one token-wise draw in two carries none (one in six before), about one draw in five overall.
PLAIN_TOKEN_SHARE = 0.4
SPREAD_SCALE = (0.3, 3.0)  # log-uniform scale of processed "random" target logits: p keeps entropy
LEAN_SHARE = 0.15  # stochastic requests that keep lean drafts (argmax-leaning ids, pattern rows)
MAX_OFFSET = 64.0  # common logit offsets in [-64, 64]


def decision_batches(
    *,
    min_reqs: int = 1,
    max_reqs: int = 6,
    max_spec_steps: int = 8,
    min_drafts: int = 0,
    vocab_sizes: st.SearchStrategy[int] | Sequence[int] | None = None,
    max_vocab: int = 1025,
    block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
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
    saturated: bool = True,
    verifications: Sequence[str] = (TOKEN.name,),
    sampling_params: Sequence[str] = (),
    streams: str | StreamFamily = STREAMS.name,
    block_seed: str = PLAIN,
    logit_bound: float | None = None,
    tree_drafts: Sequence[str] = ("one_hot",),
    tree_uniforms: str = "per_child",
) -> st.SearchStrategy[SpecBatch]:
    """Valid `SpecBatch` objects (they pass `rs_verify.validate`) rich in stochastic decisions.

    Takes every knob of `spec_batches` with the same meaning, except where noted, plus
    `block_sizes` and `saturated`. Shrinks towards one request at `T = 1` with one
    model draft drawn from q, a tiny vocab, float32, no logprobs, padding or masks.

    * `min_reqs`, `max_reqs`: bounds of the request count `R`.
    * `max_spec_steps`, `min_drafts`: `K` is drawn in `[max(1, min_drafts), max_spec_steps]`;
      `n_r` is `K` (three requests in eight), in `[max(1, min_drafts), K]` (four in eight) or in
      `[min_drafts, K]` (one in eight); the first stochastic request verifies a draft.
    * `vocab_sizes`: a strategy or a sequence of target vocab sizes; by default
      `block_edge_vocab_sizes(max_vocab, block_sizes)`.
    * `max_vocab`: the largest default vocab size (ignored when `vocab_sizes` is given).
    * `block_sizes`: vocabulary block sizes of the samplers under test: default vocab sizes
      straddle their multiples, and the draw is labelled "multi-block vocab (V > B)" and
      "partial tail block (...)" for each.
    * `draft_modes`: some of "model" (two draws in three when both) and "one_hot".
    * `draft_vocab`: allow a draft vocab `Vd < V` for model drafts (one draw in six).
    * `temperatures`: the kinds a request may take, some of "greedy", "one", "random"
      ("mixed" allows all three); each request draws its own (weights 1 : 2 : 3), and a
      batch of greedy requests only gets one stochastic request when others are allowed.
    * `logits_dtypes`, `logprobs`, `max_logprobs`, `max_extra_states`, `seeds`,
      `positions`, `patterns`: as for `spec_batches` (target rows use "random" three
      times in four when it is allowed, a pattern from `patterns` otherwise).
    * `padded_drafts`: two draws in three pad drafts of stochastic requests (-1 mostly).
    * `masks`: one draw in four masks logits with `-inf` (never a row's maxima).
    * `saturated`: two model-draft draws in three saturate a target row and its draft row
      on the same token, with a draft id elsewhere (the residual max(p - q, 0) is empty).
    * `verifications`: some of "token" and "block" (SPEC sections 4 and 4b). With both, each
      draw takes block about one time in two (a content draw: three in five when a request
      verifies two drafts or more, one in four otherwise), tilted by `strategies.block`
      (thresholds near the known uniforms, rescued and partly accepted blocks, `Z + 1 - P = 0`,
      `p(d) = q(d) = 0`, padding mid-block, greedy requests beside stochastic ones). Default
      `("token",)`: what a sampler that declares no `verification_methods` is sent.
    * `sampling_params`: some of "min_p", "top_k", "top_p" (SPEC section 2), or empty. With
      any, three draws in four carry per-state parameters, each request its own recipe
      (`strategies.params`: off, loose, tight, all three, ties at the top-k threshold, a top-p
      boundary inside tied tokens, min-p = 1 on tied maxima, masked drafts, masks that empty
      the residual or change the bonus token). Default `()`: no parameters, what a sampler
      that declares no `sampling_params` is sent. The engine passes the sampler's declarations.
    * `streams`: the stream family of the sampler under test (a registered name or a
      `StreamFamily` record; default "triton-philox"): the tilts aim at its acceptance uniforms and
      the labels read its noise. For murmur3, three draws in four of token-wise batches also carry
      its edges (`strategies.stream_edges`): `u = 1.0` and the smallest `u` deciding bonus tokens,
      a request at another's positions plus `2**32` with its seed. For explicit (SPEC 3c), three
      draws in four of token-wise batches carry all three noise fields, the family's draw with
      edges written in (`strategies.explicit_edges`): uniforms at `2**-53` and `1 - 2**-53`,
      tied scores and, in three of those draws in four, one of `u = p(d) / q(d)`, `U` on a prefix
      sum or at the top.
      Draws of triton-philox keep
      their random choices (the block tilts' p = q = 0 step takes one more when -inf is allowed).
    * `block_seed`: how the sampler keys block step `i`'s acceptance uniform (SPEC 3b; "plain" or
      "step", one the family offers): the block tilts aim at those uniforms and the labels read them.
    * `logit_bound`: as for `spec_batches` (SPEC section 10): every drawn, planted and tilted
      finite logit keeps `|z| <= logit_bound` (`strategies.logits.magnitude_bound`); an edge that
      needs more (a one-hot row's gap, a noise edge's decisive logit) is clipped or not planted.
    * `tree_drafts`, `tree_uniforms`: with "tree" among `verifications` (SPEC 4c), one draw in two is a
      tree batch of `strategies.tree_batches` with these kinds and coin layout (kept or not by a hash of
      its contents, so the share holds within 40 examples; the other knobs it shares:
      requests, `K`, temperatures, dtypes, sampling parameters).
    * With either allowed, a draw whose structure left out padding, saturation or parameters
      gets them one time in three from the content generator (Hypothesis's generate phase
      shares structural draws across families of examples). With neither allowed, the draws
      are those of earlier releases, example for example.
    """
    cfg = check_common(min_reqs=min_reqs, max_reqs=max_reqs, max_spec_steps=max_spec_steps, min_drafts=min_drafts,
                       max_vocab=max_vocab, draft_modes=draft_modes, draft_vocab=draft_vocab,
                       temperatures=temperatures, logits_dtypes=logits_dtypes, logprobs=logprobs,
                       max_logprobs=max_logprobs, padded_drafts=padded_drafts, masks=masks, patterns=patterns,
                       max_extra_states=max_extra_states, seeds=seeds, positions=positions,
                       verifications=verifications, sampling_params=sampling_params, logit_bound=logit_bound)
    check_bool("saturated", saturated)
    cfg["block_sizes"] = check_ints("block_sizes", block_sizes, 1)
    cfg["vocab"] = vocab_strategy(vocab_sizes, block_edge_vocab_sizes(max_vocab, cfg["block_sizes"]))
    cfg["saturated"] = saturated
    try:
        cfg["family"] = family_of(streams)
    except KeyError as exc:
        raise InvalidArgument(f"streams={streams!r}: {exc.args[0]}") from None
    if block_seed not in cfg["family"].block_seeds:
        raise InvalidArgument(f"block_seed={block_seed!r}: the stream family {cfg['family'].name!r} draws the block "
                              f"seeds {list(cfg['family'].block_seeds)} (SPEC 3b)")
    cfg["block_seed"] = block_seed
    allowed = {"greedy", "one", "random"} if "mixed" in cfg["temperatures"] else set(cfg["temperatures"])
    cfg["kinds"] = tuple((k, w) for k, w in REQUEST_KINDS if k in allowed)
    if TREE.name not in cfg["verifications"]:
        return _decision_batches(cfg)
    cfg["verifications"] = tuple(v for v in cfg["verifications"] if v != TREE.name)
    trees = tree_batches(min_reqs=max(1, min_reqs), max_reqs=max(1, max_reqs), max_spec_steps=max(1, max_spec_steps),
                         vocab_sizes=tree_vocab_sizes(max_vocab, cfg["block_sizes"]),
                         tree_drafts=tree_drafts, tree_uniforms=tree_uniforms, temperatures=cfg["temperatures"],
                         logits_dtypes=cfg["dtypes"], sampling_params=cfg["sampling_params"],
                         logit_bound=cfg["logit_bound"])
    # Tree or not is content, like the method of the others: a tree batch is drawn, and a hash of its logits
    # keeps it or draws another batch. `st.one_of` made it a structural choice that the generate phase's
    # families of examples share (14 to 33 trees of 60 at ci, by the test's function); drawing both and
    # choosing repeated the tree batch across a family (7 drawn without replacement, 3 distinct).
    return trees.flatmap(lambda tree: st.just(tree) if _kept(tree) else _decision_batches(cfg))


def _kept(tree: SpecBatch) -> bool:
    return bool(zlib.crc32(np.ascontiguousarray(tree.target_logits).tobytes()) & 1)


def tree_vocab_sizes(max_vocab: int, block_sizes) -> tuple[int, ...]:
    """Tree batches' vocabularies: small ones, and one past each vocabulary block (a tail tile)."""
    small = [v for v in (2, 3, 5, 8, 17, 40) if v <= max_vocab]
    edges = [b + 1 for b in block_sizes if b + 1 <= max_vocab]
    return tuple(sorted(set(small + edges))) or (max_vocab,)


def _draft_count(draw, lo, n_lo, K) -> int:
    """`n_r`: in `[lo, K]` one request in eight, `K` three in eight (the per-request cost of a verify
    call dominates under an interpreter: long chains are the cheapest decisions), else in
    `[n_lo, K]`. Shrinks to `n_lo`."""
    kind = draw(st.integers(0, 7))
    if kind == 7:
        return draw(st.integers(lo, K))
    return K if kind >= 4 else draw(st.integers(n_lo, K))


def _request_kind(draw, kinds) -> str:
    x = draw(st.integers(0, sum(w for _, w in kinds) - 1))
    for kind, w in kinds:
        if x < w:
            return kind
        x -= w
    raise AssertionError("unreachable")


def _pattern(draw, allowed) -> str:
    """ "spread" (random logits whose processed scale keeps p spread out: decisions near u) three
    times in four when "random" is allowed, else a pattern from `allowed`."""
    if rare(draw, 4) or "random" not in allowed:
        return draw(st.sampled_from(allowed))
    return "spread"


def _target_rows(rng, n, V, pattern, t, dtype, v_eff, bound, masked) -> np.ndarray:
    if pattern != "spread":
        return logits_rows(rng, n, V, pattern, dtype=dtype, v_eff=v_eff, max_abs=bound, allow_inf=masked)
    scale = (float(t) if t > 0 else 1.0) * float(np.exp(rng.uniform(*np.log(SPREAD_SCALE))))
    x = np.clip(rng.standard_normal((n, V)) * scale, -bound, bound)
    return round_to_dtype(x.astype(np.float32), dtype)


@st.composite
def _decision_batches(draw, cfg) -> SpecBatch:
    # ---- structure, drawn by Hypothesis (order chosen for shrinking) ----
    R = draw(st.integers(cfg["min_reqs"], cfg["max_reqs"]))
    K = draw(st.integers(min(max(cfg["min_drafts"], 1), cfg["max_spec_steps"]), cfg["max_spec_steps"]))
    n_lo = min(max(cfg["min_drafts"], 1), K)
    n_r = [_draft_count(draw, cfg["min_drafts"], n_lo, K) for _ in range(R)]
    V = drawn_vocab(draw(cfg["vocab"]))
    modes = cfg["draft_modes"]
    mode = modes[0] if len(modes) == 1 else ("one_hot" if rare(draw, 3) else "model")
    Vd = None
    if mode == "model":
        Vd = V
        if cfg["draft_vocab"] and V >= 2 and rare(draw, 6):
            Vd = draw(st.integers(1, V - 1))
    v_eff = V if Vd is None else Vd
    dtype = draw(st.sampled_from(cfg["dtypes"]))
    lp_mode = draw(st.sampled_from(cfg["logprobs"]))
    num_logprobs = None if lp_mode is None else draw(st.integers(0, min(V, cfg["max_logprobs"])))
    kinds = [_request_kind(draw, cfg["kinds"]) for _ in range(R)]
    if R and all(k == "greedy" for k in kinds) and len(cfg["kinds"]) > 1:
        kinds[-1] = cfg["kinds"][0][0]  # every batch carries stochastic requests when they are allowed
    first = next((r for r, k in enumerate(kinds) if k != "greedy"), None)
    if first is not None and K and not any(n_r[r] for r, k in enumerate(kinds) if k != "greedy"):
        n_r[first] = 1  # ... and a stochastic request that verifies a draft
    patterns = [_pattern(draw, cfg["patterns"]) for _ in range(R)]
    padded = cfg["padded"] and draw(st.integers(0, 2)) > 0  # two draws in three; shrinks to none
    masked = cfg["masks"] and rare(draw)
    saturated = cfg["saturated"] and mode == "model" and draw(st.integers(0, 2)) > 0
    tied = "tied" in cfg["patterns"] and rare(draw, 3)
    shifted = draw(st.integers(0, 3)) > 0  # three draws in four; shrinks to centred logits
    extra = draw(st.integers(1, cfg["max_extra_states"])) if cfg["max_extra_states"] and rare(draw, 3) else 0
    shuffled = (R + extra >= 2) and rare(draw, 3)
    req_seeds = [drawn_int64(draw(cfg["seeds"]), "seeds", -(2**63)) for _ in range(R)]
    req_pos = [drawn_int64(draw(cfg["positions"]), "positions", 0) for _ in range(R)]
    # Sampling parameters: drawn only when allowed (token-only draws are unchanged).
    params_on = draw_params_on(draw, cfg["sampling_params"])
    # Contents from the content seed AND every structural draw: Hypothesis explores by small
    # mutations of earlier examples, and each must be a fresh draw of logits, drafts and noise.
    structure = (R, K, n_r, V, Vd, mode, dtype, lp_mode, num_logprobs, kinds, patterns, padded, masked, saturated,
                 tied, shifted, extra, shuffled, req_seeds, req_pos)
    extended = cfg["verifications"] != (TOKEN.name,) or cfg["sampling_params"]
    if extended:
        structure += (cfg["verifications"], params_on)
    rng = np.random.default_rng([draw(st.integers(0, 2**32 - 1)), zlib.crc32(repr(structure).encode())])
    # The method is content: each example draws its own (block about one in two when both are allowed).
    # A structural draw would be shared by the few-example families Hypothesis's generate phase
    # builds by mutation, and the share of block batches within 40 examples would swing widely.
    verification = choose_verification(rng, cfg["verifications"], n_r)
    kinds = greedy_mix(rng, kinds, n_r, cfg["kinds"]) if verification == BLOCK.name else kinds
    if extended:  # second chances from the content generator (the structural flags are family-shared)
        padded = padded or (cfg["padded"] and rng.random() < SECOND_CHANCE)
        saturated = saturated or (cfg["saturated"] and mode == "model" and rng.random() < SECOND_CHANCE)
        params_on = params_on or (bool(cfg["sampling_params"]) and rng.random() < SECOND_CHANCE)
        # The plain path (token by token, no parameter in the whole batch) is production's hot path
        # and where samplers keep a fast path of their own: about one token-wise draw in two is
        # plain (drawn after the method, so block draws are unchanged).
        if params_on and verification == TOKEN.name and rng.random() < PLAIN_TOKEN_SHARE:
            params_on = False

    # ---- contents, filled by NumPy ----
    if mode == "model" and Vd == V and cfg["draft_vocab"] and V >= 2 and rng.random() < (0.5 if extended else 0.25):
        # More draft vocabularies below the target's, drawn from the content generator so that the
        # structural draws (and every knob's reach within the ci budget) stay as they are.
        Vd = int(rng.integers(1, V))
        v_eff = Vd
    S = R + extra
    cu = row_offsets(n_r)
    idx = rng.permutation(S)[:R] if shuffled else np.arange(R)
    temperature = garbage_temperatures(rng, S)
    for r, kind in enumerate(kinds):
        temperature[idx[r]] = kind_temperature(rng, kind)
    temps = temperature[idx]
    seeds_arr = state_seeds(rng, S, idx, req_seeds)
    pos = row_positions(cu, n_r, req_pos)
    bounds = [magnitude_bound(dtype, float(t), cfg["logit_bound"]) for t in temps]

    target = np.empty((int(cu[-1]), V), np.float32)
    for r in range(R):
        rows = _target_rows(rng, n_r[r] + 1, V, patterns[r], temps[r], dtype, v_eff, bounds[r], masked)
        if shifted and patterns[r] != "extreme":
            rows = shift_rows(rows, rng.uniform(-1.0, 1.0, n_r[r] + 1) * min(MAX_OFFSET, bounds[r] / 4), dtype,
                              bounds[r])
        target[cu[r] : cu[r + 1]] = rows
    if v_eff < V:
        edges.heavy_tail(rng, target, v_eff, cu, bounds, dtype)
    if tied:
        edges.tie_maxima(rng, target, v_eff)
    if masked:
        mask_rows(rng, target, v_eff)

    stochastic = [r for r in range(R) if temps[r] > 0 and n_r[r] > 0]
    draft_ids = lean_draft_ids(rng, target, cu, v_eff, False)
    draft = None if mode == "one_hot" else round_to_dtype(rng.uniform(-20.0, 20.0, (S, K, Vd)), dtype)
    for r in range(R):
        n, lo, s = n_r[r], int(cu[r]), int(idx[r])
        if n == 0:
            continue
        if temps[r] == 0 or rng.random() < LEAN_SHARE:
            if temps[r] == 0:
                edges.greedy_tie_drafts(rng, target, lo, n, v_eff, draft_ids)
            if draft is not None:
                draft[s, :n] = pattern_draft_rows(rng, target, cu, r, n, draft_ids, Vd, dtype, bounds[r],
                                                  cfg["patterns"], masked)
            continue
        sigma = float(np.exp(rng.uniform(*np.log(DRAFT_SIGMA))))
        close = close_draft_rows(rng, target[lo : lo + n], v_eff if draft is None else Vd, float(temps[r]), sigma,
                                 dtype, bounds[r])
        if draft is not None:
            draft[s, :n] = close
        logq = log_softmax_processed(close[:, :v_eff], float(temps[r]))
        draft_ids[lo + 1 : lo + 1 + n] = gumbel_max_drafts(logq, np.full(n, seeds_arr[s]), pos[lo : lo + n])
    if saturated:
        edges.saturate(rng, target, draft, draft_ids, cu, idx, temps, n_r, stochastic, v_eff, dtype, masked,
                       verification == BLOCK.name)
    if padded:
        edges.pad(rng, draft_ids, cu, n_r, stochastic, v_eff, verification == BLOCK.name)
    if cfg["logit_bound"] is not None:  # saturated rows' gaps, unrelated draft rows (SPEC 10); tilts keep to it
        clip_to_bounds(target, draft, cu, idx, bounds)
    params = {}
    if params_on or verification == BLOCK.name:
        c = Contents(target=target, draft=draft, draft_ids=draft_ids, cu=cu, idx=idx, temps=temps, n_r=n_r, v=v_eff,
                     dtype=dtype, bounds=bounds, seeds=seeds_arr, pos=pos, masked=masked, stochastic=stochastic,
                     block_mode=verification == BLOCK.name, family=cfg["family"], block_seed=cfg["block_seed"],
                     inf_allowed=cfg["masks"])
        if params_on:
            plant_params(rng, c, cfg["sampling_params"], V, mode)
        if verification == BLOCK.name:
            plant_block(rng, c)
        if params_on:
            vet_thresholds(rng, c)
        params = c.params

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
    batch = plant_stream_edges(rng, batch, cfg["family"], bounds)
    batch = plant_explicit_edges(rng, batch, cfg["family"])
    label_structure(batch, mode, dtype, "per request", kinds, patterns, lp_mode, masked, idx)
    label_decisions(batch, cfg["block_sizes"], cfg["family"], cfg["block_seed"])
    return batch
