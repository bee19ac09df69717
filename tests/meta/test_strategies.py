"""Meta-tests of the strategies: validity, knobs, reachability of every feature, shrinking.

Reachability runs one derandomized sweep and falls back to `hypothesis.find`
for whatever the sweep missed, so a feature that exists is always found and a
feature the strategy cannot produce fails with its name. The decision-rich
strategy is held to more: every knob within the ci budget (tests/meta/test_decision_strategies.py).
"""

from __future__ import annotations

from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

from rs_verify.contract.chunking import iter_request_chunks
from rs_verify.contract.validation import validate
from rs_verify.strategies import (
    DTYPE_MAX,
    EXPECTED_FIELD,
    INVALID_CLASSES,
    PARAM_CLASS_NEEDS,
    chunk_caps,
    classes_for,
    invalid_batches,
    cap_candidates,
    cap_kind,
    decision_batches,
    spec_batches,
)
from rs_verify.strategies.bad_noise import NOISE_CLASSES
from rs_verify.strategies.chunks import AT_BOUNDARY, BELOW_LARGEST, ONE_CHUNK
from rs_verify.strategies.logits import ONE_HOT_GAP

FAST = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# -- helpers ---------------------------------------------------------------------


def _verified_ids(b) -> np.ndarray:
    if not b.num_reqs:
        return np.zeros(0, np.int64)
    return np.concatenate([b.draft_tokens(r) for r in range(b.num_reqs)])


def _ref_temps(b) -> np.ndarray:
    return np.asarray(b.temperature)[np.asarray(b.idx_mapping, np.int64)]


def _ref_seeds(b) -> np.ndarray:
    return np.asarray(b.seeds)[np.asarray(b.idx_mapping, np.int64)]


def _verified_draft_rows(b) -> np.ndarray:
    if b.draft_logits is None or not b.num_reqs:
        return np.zeros((0, 1), np.float32)
    n = b.num_draft_tokens
    rows = [b.draft_logits[int(s), : int(n[r])] for r, s in enumerate(b.idx_mapping)]
    return np.concatenate(rows)


def _head(b) -> np.ndarray:
    return np.asarray(b.target_logits)[:, : b.effective_vocab_size]


def _has_tied_row(b) -> bool:
    """Some row has >= 2 exactly equal maxima over [0, V') and is not flat there."""
    h = _head(b)
    if h.shape[0] == 0 or h.shape[1] < 3:
        return False
    top = h.max(axis=1, keepdims=True)
    ties = (h == top).sum(axis=1)
    return bool(((ties >= 2) & (ties < h.shape[1])).any())


def _every_row_tied(b) -> bool:
    """Every row has >= 2 exactly equal maxima over [0, V') (when V' >= 2)."""
    h = _head(b)
    return h.shape[1] < 2 or bool(((h == h.max(axis=1, keepdims=True)).sum(axis=1) >= 2).all())


def _has_flat_row(b) -> bool:
    x = np.asarray(b.target_logits)
    return x.shape[1] >= 2 and bool((np.isfinite(x).all(axis=1) & (x == x[:, :1]).all(axis=1)).any())


def _gaps(b) -> np.ndarray:
    """Per row: best minus second-best logit over [0, V') (rows with V' >= 2)."""
    h = _head(b)
    if h.shape[0] == 0 or h.shape[1] < 2:
        return np.zeros(0)
    s = np.sort(h, axis=1)
    with np.errstate(invalid="ignore"):
        return s[:, -1] - s[:, -2]


def _has_peaked_row(b) -> bool:
    h = _head(b)
    g = _gaps(b)
    return bool((np.isfinite(h).all(axis=1)[: g.size] & (g >= 8) & (g < ONE_HOT_GAP / 2)).any()) if g.size else False


def _has_one_hot_row(b) -> bool:
    g = _gaps(b)
    return bool((g >= ONE_HOT_GAP / 2).any()) if g.size else False


def _has_extreme_logit(b) -> bool:
    x = np.asarray(b.target_logits)
    f = np.abs(x[np.isfinite(x)])
    return bool(f.size) and float(f.max()) >= DTYPE_MAX[b.logits_dtype] / 64


def _pos_straddles(b, edge) -> bool:
    return any(b.pos[rows.start] < edge <= b.pos[rows.stop - 1] for rows in map(b.request_rows, range(b.num_reqs)))


def _temp_kinds(b) -> set:
    return {"greedy" if t == 0 else "one" if t == 1 else "random" for t in _ref_temps(b)}


BATCH_FEATURES = {
    "R == 0": lambda b: b.num_reqs == 0,
    "R == 6": lambda b: b.num_reqs == 6,
    "n_r == 0 (R >= 1)": lambda b: (b.num_draft_tokens == 0).any(),
    "n_r == K >= 1": lambda b: b.num_speculative_steps >= 1 and (b.num_draft_tokens == b.num_speculative_steps).any(),
    "K == 8": lambda b: b.num_speculative_steps == 8,
    "V == 1": lambda b: b.vocab_size == 1,
    "V == 129 (block edge)": lambda b: b.vocab_size == 129,
    "V >= 255": lambda b: b.vocab_size >= 255,
    "Vd < V": lambda b: b.draft_logits is not None and b.draft_vocab_size < b.vocab_size,
    "model drafts": lambda b: b.draft_logits is not None and b.num_reqs >= 1,
    "one-hot drafts": lambda b: b.draft_logits is None and b.num_reqs >= 1,
    "padded draft -1": lambda b: (_verified_ids(b) == -1).any(),
    "padded draft < -1": lambda b: (_verified_ids(b) < -1).any(),
    "garbage first draft id": lambda b: b.num_reqs >= 1 and (b.draft_token_ids[b.cu_num_logits[:-1]] < 0).any(),
    "greedy": lambda b: b.num_reqs >= 1 and _temp_kinds(b) == {"greedy"},
    "T == 1": lambda b: b.num_reqs >= 1 and _temp_kinds(b) == {"one"},
    "random T": lambda b: b.num_reqs >= 1 and _temp_kinds(b) == {"random"},
    "mixed T": lambda b: len(_temp_kinds(b)) >= 2,
    "S > R, shuffled idx_mapping": lambda b: b.num_states > b.num_reqs
    and not np.array_equal(b.idx_mapping, np.arange(b.num_reqs)),
    "-inf target": lambda b: np.isneginf(b.target_logits).any(),
    "-inf verified draft row": lambda b: np.isneginf(_verified_draft_rows(b)).any(),
    "tied row": _has_tied_row,
    "flat row": _has_flat_row,
    "peaked row": _has_peaked_row,
    "one-hot row": _has_one_hot_row,
    "extreme logit": _has_extreme_logit,
    "float32": lambda b: b.logits_dtype == "float32",
    "bfloat16": lambda b: b.logits_dtype == "bfloat16",
    "float16": lambda b: b.logits_dtype == "float16",
    "logprobs raw": lambda b: b.num_logprobs is not None and b.logprobs_mode == "raw",
    "logprobs processed": lambda b: b.num_logprobs is not None and b.logprobs_mode == "processed",
    "num_logprobs == 0": lambda b: b.num_logprobs == 0,
    "seed >= 2**31": lambda b: (_ref_seeds(b) >= 2**31).any(),
    "seed >= 2**32": lambda b: (_ref_seeds(b) >= 2**32).any(),
    "seed < 0": lambda b: (_ref_seeds(b) < 0).any(),
    "seed == -2**63": lambda b: (_ref_seeds(b) == -(2**63)).any(),
    "pos >= 2**31": lambda b: (b.pos >= 2**31).any(),
    "pos rows straddle 2**32": lambda b: _pos_straddles(b, 2**32),
    "pos == 2**63 - 1": lambda b: (b.pos == 2**63 - 1).any(),
}


def _assert_reachable(strategy, features: dict, sweep: int, fallback: int) -> None:
    """Every predicate in `features` holds for some draw of `strategy`."""
    seen = set()

    @settings(FAST, max_examples=sweep, derandomize=True, phases=[Phase.generate])
    @given(strategy)
    def sweep_test(x):
        seen.update(name for name, pred in features.items() if name not in seen and pred(x))

    sweep_test()
    missing = []
    for name in sorted(set(features) - seen):
        try:
            find(
                strategy,
                features[name],
                settings=settings(FAST, max_examples=fallback, phases=[Phase.generate]),
                random=Random(0),
            )
        except NoSuchExample:
            missing.append(name)
    assert not missing, f"never drawn: {missing}"


# -- valid batches -----------------------------------------------------------------


@settings(FAST, max_examples=150)
@given(spec_batches())
def test_spec_batches_validate(batch):
    validate(batch)


@settings(FAST, max_examples=30)
@given(spec_batches(max_reqs=3, max_vocab=4096, vocab_sizes=st.integers(1000, 4096)))
def test_larger_vocab_validates(batch):
    validate(batch)


KNOB_CASES = [
    (dict(masks=False), lambda b: not np.isneginf(b.target_logits).any() and not np.isneginf(_verified_draft_rows(b)).any()),
    (dict(padded_drafts=False), lambda b: (_verified_ids(b) >= 0).all()),
    (dict(logits_dtypes=("float16",)), lambda b: b.logits_dtype == "float16"),
    (dict(draft_modes=("one_hot",)), lambda b: b.draft_logits is None),
    (dict(draft_modes=("model",), draft_vocab=False), lambda b: b.draft_vocab_size == b.vocab_size),
    (dict(temperatures=("greedy",)), lambda b: (_ref_temps(b) == 0).all()),
    (dict(temperatures=("random",)), lambda b: ((_ref_temps(b) >= 0.05) & (_ref_temps(b) <= 4)).all()),
    (dict(logprobs=(None,)), lambda b: b.num_logprobs is None),
    (dict(logprobs=("processed",), max_logprobs=3), lambda b: b.logprobs_mode == "processed" and b.num_logprobs <= 3),
    (dict(max_extra_states=0), lambda b: b.num_states == b.num_reqs),
    (dict(min_reqs=2, max_reqs=3, min_drafts=2, max_spec_steps=3), lambda b: 2 <= b.num_reqs <= 3 and (b.num_draft_tokens >= 2).all()),
    (dict(vocab_sizes=[7, 9]), lambda b: b.vocab_size in (7, 9)),
    (dict(patterns=("tied",), vocab_sizes=[8]), _every_row_tied),
    (dict(seeds=st.just(5), positions=st.just(2**32 - 1)), lambda b: (_ref_seeds(b) == 5).all() and (b.pos[b.cu_num_logits[:-1]] == 2**32 - 1).all()),
    (dict(), lambda b: b.verification == "token" and b.top_k is None and b.top_p is None and b.min_p is None),
    (dict(verifications=("block",)), lambda b: b.verification == "block"),
    (dict(sampling_params=("top_k",)), lambda b: b.top_p is None and b.min_p is None),
]


@pytest.mark.parametrize("kwargs, holds", KNOB_CASES, ids=[repr(k) for k, _ in KNOB_CASES])
def test_knobs_restrict_draws(kwargs, holds):
    @settings(FAST, max_examples=25)
    @given(spec_batches(**kwargs))
    def check(batch):
        validate(batch)
        assert holds(batch), batch.summary()

    check()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_reqs=-1),
        dict(min_reqs=3, max_reqs=2),
        dict(max_spec_steps=1, min_drafts=2),
        dict(max_vocab=0),
        dict(vocab_sizes=[0]),
        dict(vocab_sizes=[]),
        dict(draft_modes=("ngram",)),
        dict(temperatures=()),
        dict(logits_dtypes="float32"),
        dict(logprobs=("logits",)),
        dict(patterns=("zigzag",)),
        dict(masks="yes"),
        dict(max_logprobs=-1),
        dict(seeds=5),
        dict(verifications=("trees",)),
        dict(verifications="token"),
        dict(sampling_params=("top_q",)),
        dict(sampling_params="min_p"),
    ],
    ids=repr,
)
def test_bad_knobs_raise_eagerly(kwargs):
    with pytest.raises(InvalidArgument):
        spec_batches(**kwargs)


def test_bad_invalid_classes_raise_eagerly():
    with pytest.raises(InvalidArgument):
        invalid_batches(classes=["not_a_defect"])


# The decision-rich strategy keeps the broad one's features, except those it rules out: an
# empty batch (min_reqs=1) and a greedy-only batch (every batch carries a stochastic request).
@pytest.mark.parametrize("strategy, ruled_out", [(spec_batches(), ()), (decision_batches(), ("R == 0", "greedy"))],
                         ids=["spec_batches", "decision_batches"])
def test_every_batch_feature_is_reachable(strategy, ruled_out):
    features = {k: v for k, v in BATCH_FEATURES.items() if k not in ruled_out}
    _assert_reachable(strategy, features, sweep=300, fallback=3000)


SAMPLING_FEATURES = {
    "block verification": lambda b: b.verification == "block" and b.num_reqs >= 1,
    "top_k on": lambda b: "top_k" in b.sampling_params_on(),
    "top_p on": lambda b: "top_p" in b.sampling_params_on(),
    "min_p on": lambda b: "min_p" in b.sampling_params_on(),
    "min_p = 1": lambda b: "min_p" in b.sampling_params_on() and (b.min_p[b.idx_mapping] == 1).any(),
    "parameter all off (array)": lambda b: any(getattr(b, n) is not None and n not in b.sampling_params_on()
                                               for n in ("top_k", "top_p", "min_p")),
    "parameters off and on in one batch": lambda b: b.top_k is not None and b.num_reqs >= 2
    and len(set((b.top_k[b.idx_mapping] > 0).tolist())) == 2,
    "all three on for one state": lambda b: all(getattr(b, n) is not None for n in ("top_k", "top_p", "min_p"))
    and ((b.top_k[b.idx_mapping] > 0) & (b.top_p[b.idx_mapping] < 1) & (b.min_p[b.idx_mapping] > 0)).any(),
}


def test_spec_batches_with_block_and_parameters():
    """spec_batches with every method and parameter allowed: valid batches, and each of them drawn."""
    strategy = spec_batches(verifications=("token", "block"), sampling_params=("min_p", "top_k", "top_p"))

    @settings(FAST, max_examples=40)
    @given(strategy)
    def check(batch):
        validate(batch)

    check()
    _assert_reachable(strategy, SAMPLING_FEATURES, sweep=100, fallback=1000)


def test_shrinks_to_a_minimal_batch():
    b = find(spec_batches(), lambda b: b.num_reqs >= 2, settings=settings(FAST, max_examples=200), random=Random(0))
    assert b.num_reqs == 2 and b.num_speculative_steps == 0 and b.vocab_size == 1, b.summary()
    assert b.logits_dtype == "float32" and b.num_logprobs is None and (_ref_temps(b) == 0).all(), b.summary()


# -- chunk caps --------------------------------------------------------------------


@settings(FAST, max_examples=100)
@given(st.data())
def test_chunk_caps(data):
    batch = data.draw(spec_batches(max_vocab=33))
    cap = data.draw(chunk_caps(batch))
    assert 1 <= cap <= batch.num_logits + 2
    cands = cap_candidates(batch)
    cu = [int(c) for c in batch.cu_num_logits]
    for b in cu[1:]:  # every request boundary and its neighbours are candidates
        assert {max(b - 1, 1), b, b + 1} <= set(cands)


@pytest.mark.parametrize("digest", ["triton", "reference"])
def test_chunk_caps_reach_every_kind_within_the_ci_budget(digest):
    """The chunking properties' input (a batch and a cap) reaches, within the ci budget, caps
    below the largest request (that request must stay whole), caps equal to the rows of a run of
    whole requests (a chunk ends exactly at a boundary), a single chunk, and plans of two chunks
    or more. (Caps one row off a run of whole requests need two requests: drawn, not required.)"""
    from rs_verify.engine import profiles  # noqa: lazy: only this test needs the profiles
    from rs_verify.properties import PROPERTIES, Context  # noqa: lazy: the property library

    ctx = Context(sampler=None, profile="ci", batch_kwargs=dict(profiles.BATCH_KWARGS["ci"]))
    seen = set()

    @settings(FAST, max_examples=settings.get_profile("ci").max_examples, derandomize=True, phases=[Phase.generate])
    @given(PROPERTIES["chunked_equals_full"].strategy(ctx))
    def sweep(drawn):
        batch, cap = drawn
        seen.add(cap_kind(batch, cap))
        if len(list(iter_request_chunks(batch.cu_num_logits, cap))) >= 2:
            seen.add("2+ chunks")

    sweep.hypothesis.inner_test._hypothesis_internal_add_digest = f"chunked_equals_full:{digest}".encode()
    sweep()
    wanted = {BELOW_LARGEST, AT_BOUNDARY, ONE_CHUNK, "2+ chunks"}
    assert not wanted - seen, sorted(wanted - seen)


# -- invalid batches ---------------------------------------------------------------


@pytest.mark.parametrize("defect", INVALID_CLASSES)
def test_invalid_batches_raise(defect):
    @settings(FAST, max_examples=8)
    @given(invalid_batches(classes=[defect]))
    def check(pair):
        batch, field = pair
        assert pair.defect == defect and field == EXPECTED_FIELD[defect]
        with pytest.raises(ValueError) as info:
            validate(batch)
        msg = str(info.value)
        assert msg.startswith(field + ":") or msg.startswith(field + "["), (defect, msg)

    check()


def test_invalid_batches_mix_classes():
    """Every class is reached through `classes=[c]` (test_invalid_batches_raise); the default
    strategy draws from all of them. Hypothesis replays mutations of an example, so a
    300-example run sees about two thirds of the 44 classes, not all: tests that need
    every class parametrize over INVALID_CLASSES."""
    seen = set()

    @settings(FAST, max_examples=300, derandomize=True, phases=[Phase.generate])
    @given(invalid_batches())
    def sweep(pair):
        seen.add(pair.defect)
        with pytest.raises(ValueError, match="^" + pair.expected_field):
            validate(pair.batch)

    sweep()
    assert seen <= set(INVALID_CLASSES)
    assert len(seen) >= len(INVALID_CLASSES) // 2, sorted(set(INVALID_CLASSES) - seen)


def test_invalid_classes_cover_spec_section_9():
    fields = set(EXPECTED_FIELD.values())
    assert fields == {
        "target_logits", "draft_logits", "draft_token_ids", "cu_num_logits", "pos", "idx_mapping",
        "temperature", "seeds", "logits_dtype", "logprobs_mode", "num_logprobs",
        "top_k", "top_p", "min_p", "verification", "accept_uniforms", "resample_gumbel", "resample_uniforms",
    }
    for f in ("target_logits", "draft_logits", "draft_token_ids", "cu_num_logits", "pos", "idx_mapping", "temperature",
              "seeds", "top_k", "top_p", "min_p", "accept_uniforms", "resample_gumbel", "resample_uniforms"):
        assert f"dtype:{f}" in INVALID_CLASSES and f"shape:{f}" in INVALID_CLASSES
    for c in ("top_k_negative", "top_p_out_of_range", "top_p_not_finite", "min_p_out_of_range", "min_p_nan",
              "unknown_verification", "accept_uniforms_out_of_range", "accept_uniforms_not_finite",
              "resample_gumbel_not_finite", "resample_uniforms_out_of_range", "resample_uniforms_not_finite"):
        assert c in INVALID_CLASSES


def test_invalid_classes_for_declared_parameters():
    """A sampler is never sent a parameter it does not declare (SPEC 10): `classes_for` keeps the
    other classes, the unknown verification method included (every sampler must reject it)."""
    assert classes_for() == INVALID_CLASSES
    none = set(classes_for(()))
    assert set(INVALID_CLASSES) - none == set(PARAM_CLASS_NEEDS) and "unknown_verification" in none
    assert {c for c in classes_for(("top_p",)) if c in PARAM_CLASS_NEEDS} == {
        c for c, name in PARAM_CLASS_NEEDS.items() if name == "top_p"}


def test_noise_classes_only_for_samplers_that_read_the_noise():
    """SPEC 9: samplers of a family without explicit noise ignore its fields, so they are sent none
    of its classes, and the classes they are sent are those of before, in the same order."""
    assert set(NOISE_CLASSES) <= set(INVALID_CLASSES)
    without = classes_for(noise=False)
    assert not set(without) & set(NOISE_CLASSES)
    assert without == tuple(c for c in INVALID_CLASSES if c not in NOISE_CLASSES)
    assert INVALID_CLASSES[: len(without)] == without  # the noise's classes come last
