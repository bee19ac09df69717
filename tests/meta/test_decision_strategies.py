"""Meta-tests of the decision-rich strategy (`strategies.decision_batches`) and the properties' inputs.

The ci budget is what counts: within the 40 derandomized examples the ci profile gives a
property, the strategy each decision-comparing property draws from (certification, output
invariants, determinism) must reach every knob of `strategies.DECISION_KNOBS` and the
vocabulary-block knobs, and (nearly) every batch must carry a stochastic acceptance
decision. The derandomized examples depend on the test function (Hypothesis seeds them
from its digest), so each property's strategy is swept under three digests.
"""

from __future__ import annotations

from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import InvalidArgument
from scipy import stats

from rs_verify.engine import profiles
from rs_verify.properties import PROPERTIES, Context
from rs_verify.spec import philox
from rs_verify.spec.batch import SpecBatch
from rs_verify.spec.validation import validate
from rs_verify.strategies import (DECISION_KNOBS, acceptance_tests, block_knobs, decision_batches, decision_knobs,
                        stochastic_decisions)
from rs_verify.strategies.drafts import gumbel_max_drafts, salted_positions

FAST = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CI_EXAMPLES = settings.get_profile("ci").max_examples  # 40
CI_KWARGS = dict(profiles.BATCH_KWARGS["ci"])
DECISION_PROPERTIES = ("certified_equivalence", "output_invariants", "determinism")
# Measured over 40 digests x 40 examples: every batch but 3 of 1,600 carries a stochastic
# acceptance decision; the threshold leaves room for 2 of 40 without one.
MIN_DECISION_SHARE = 0.95


class _Sampler:
    """What the inputs read of a sampler: its name and, optionally, its vocabulary block."""

    name = "triton"

    def __init__(self, block_v):
        if block_v is not None:
            self.block_v = block_v


# Vocabulary blocks whose multi-block and partial-tail knobs must be reached: the sampler's own
# (64: the size proposed for the CPU gate; 16: the tests' Triton sampler) or, for a sampler that
# declares none, the tests' (16), the mutants' (32) and the gate's (64) (V <= 300 in ci).
CASES = [(prop, digest, 64) for prop in DECISION_PROPERTIES for digest in ("triton", "reference", "vllm")]
CASES += [(prop, "triton", block) for prop in DECISION_PROPERTIES for block in (16, None)]


def _ci_strategy(name, block_v):
    ctx = Context(sampler=_Sampler(block_v), profile="ci", batch_kwargs=dict(CI_KWARGS))
    return PROPERTIES[name].strategy(ctx)


def _sweep(strategy, digest: str, n: int = CI_EXAMPLES) -> list:
    drawn = []

    def record(batch):
        drawn.append(batch[0] if isinstance(batch, tuple) else batch)  # determinism draws (batch, seed)

    test = settings(FAST, max_examples=n, derandomize=True, phases=[Phase.generate])(given(strategy)(record))
    test.hypothesis.inner_test._hypothesis_internal_add_digest = digest.encode()
    test()
    return drawn


@pytest.mark.parametrize("prop, digest, block_v", CASES)
def test_every_knob_within_the_ci_budget(prop, digest, block_v):
    batches = _sweep(_ci_strategy(prop, block_v), f"{prop}:{digest}")
    assert len(batches) == CI_EXAMPLES
    blocks = (16, 32, 64) if block_v is None else (block_v,)
    seen = set().union(*(decision_knobs(b, blocks) for b in batches))
    wanted = set(DECISION_KNOBS).union(*(block_knobs(b) for b in blocks))
    assert not wanted - seen, f"not reached in {CI_EXAMPLES} ci examples: {sorted(wanted - seen)}"
    with_decision = sum(stochastic_decisions(b) > 0 for b in batches)
    assert with_decision >= MIN_DECISION_SHARE * len(batches), f"{with_decision} of {len(batches)}"


def test_acceptance_probabilities_spread_where_u_decides():
    """Drafts drawn from q close to p: most acceptance tests are decided by u. Measured on 200
    examples: 54% of the tests have 0 < a < 1 and 32% have a in [0.1, 0.95] (spec_batches: 23%
    and 5%); the rest are a = 1 (q under-proposes d: 36%) and p(d) = 0 (saturated rows, masks)."""
    tests = [t for b in _sweep(decision_batches(**CI_KWARGS), "spread", 200) for t in acceptance_tests(b)]
    a = np.array([t.probability for t in tests if not t.padded])
    assert a.size >= 400, a.size
    undecided = (a > 0) & (a < 1)
    assert undecided.mean() >= 0.4, undecided.mean()
    assert ((a >= 0.1) & (a <= 0.95)).mean() >= 0.2, np.quantile(a, [0.1, 0.5, 0.9])


def test_drafts_drawn_from_q_follow_q():
    """Gumbel-max drafts with the salted stream are draws from q: a chi-square test of fit over
    20,000 (seed, position) pairs at a fixed seed. False-positive rate 1e-6; against the same
    draws from q' = q with its two largest entries swapped (total variation 0.15) the expected
    statistic is about 20,000 * chi2(q', q) = 3,300 on 7 degrees of freedom: power ~1."""
    rng = np.random.default_rng(7)
    q = rng.dirichlet(np.ones(8))
    n = 20_000
    seeds = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    pos = rng.integers(0, 2**40, n, dtype=np.int64)
    d = gumbel_max_drafts(np.log(np.tile(q, (n, 1))), seeds, pos)
    counts = np.bincount(d, minlength=q.size)
    assert stats.chisquare(counts, n * q).pvalue > 1e-6, (counts, n * q)


def _spec_noise(seeds, offsets, vocab):
    """SPEC section 3's resampling noise G_x of (seed, offset), written out from the Philox streams."""
    g = philox.randint(seeds, offsets)
    v = np.maximum(philox.rand(g[:, None], np.arange(vocab, dtype=np.int32)[None, :]), philox.TINY)
    return -np.log(-np.log1p(-v.astype(np.float64)))


def test_draft_stream_is_salted():
    """Drafts are Gumbel-max draws with the noise at pos + 2**30 (wrapping as int64 past 2**63 - 1),
    not with the resample noise at pos (DESIGN.md: sharing it biases the output)."""
    rng = np.random.default_rng(11)
    n, v = 2000, 16
    logq = np.log(rng.dirichlet(np.ones(v), n))
    seeds = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    pos = np.concatenate([rng.integers(0, 2**40, n - 2), [2**63 - 1, 2**63 - 2**29]]).astype(np.int64)
    drafts = gumbel_max_drafts(logq, seeds, pos)
    salted = (pos.astype(np.uint64) + np.uint64(2**30)).view(np.int64)
    assert salted[-2] == -(2**63) + 2**30 - 1 and np.array_equal(salted_positions(pos), salted)
    assert np.array_equal(drafts, np.argmax(logq + _spec_noise(seeds, salted, v), axis=1))
    unsalted = np.argmax(logq + _spec_noise(seeds, pos, v), axis=1)
    assert (drafts != unsalted).mean() > 0.5  # independent draws from q disagree often


def _one_request(target, draft, drafts, t=1.0) -> SpecBatch:
    n = len(drafts)
    return SpecBatch(
        target_logits=np.asarray(target, np.float32),
        draft_logits=None if draft is None else np.asarray(draft, np.float32)[None],
        draft_token_ids=np.asarray([0] + list(drafts), np.int64),
        cu_num_logits=np.asarray([0, n + 1], np.int32),
        pos=np.arange(n + 1, dtype=np.int64),
        idx_mapping=np.zeros(1, np.int32),
        temperature=np.asarray([t], np.float32),
        seeds=np.zeros(1, np.int64),
        num_speculative_steps=n,
    )


def test_knob_labels_read_the_batch():
    """The labels the meta-tests rely on are right on batches whose answer is known."""
    hot = [[0.0, -1e4, -1e4], [0.0, 0.0, 0.0]]
    empty = _one_request(hot, [[0.0, -300.0, -300.0]], [2])  # p, q saturated on 0; draft 2 rejected
    assert {"empty residual", "rejected draft: residual resample"} <= decision_knobs(empty)
    padded = _one_request([[0.0, 1.0, 2.0]] * 2, [[0.0, 1.0, 2.0]], [-1])
    assert "padded draft with model logits" in decision_knobs(padded)
    assert stochastic_decisions(padded) == 0
    same = _one_request([[0.0, 1.0, 2.0]] * 2, [[0.0, 1.0, 2.0]], [1])  # q == p: always accepted
    (test,) = acceptance_tests(same)
    assert test.probability == 1.0 and test.accepted and decision_knobs(same) & set(DECISION_KNOBS) == {
        "stochastic acceptance decision"}
    half = _one_request([[0.0, 0.0, 0.0]] * 2, [[np.log(2.0), 0.0, 0.0]], [0])  # p(0) / q(0) = 1/3 / 1/2
    assert abs(acceptance_tests(half)[0].probability - 2 / 3) < 1e-6
    assert "acceptance probability in [0.1, 0.95]" in decision_knobs(half)
    assert decision_knobs(_one_request([[0.0, 0.0, 0.0]] * 2, None, [1], t=0.0)) & set(DECISION_KNOBS) == set()
    assert block_knobs(64)[0] in decision_knobs(_one_request([[0.0] * 65] * 2, None, [1]), (64,))


@settings(FAST, max_examples=150)
@given(decision_batches())
def test_decision_batches_validate(batch):
    validate(batch)


@settings(FAST, max_examples=60)
@given(decision_batches(max_vocab=300, masks=True, padded_drafts=True, saturated=True))
def test_ci_sized_decision_batches_validate(batch):
    validate(batch)
    assert batch.vocab_size <= 300


KNOB_CASES = [
    (dict(draft_modes=("one_hot",)), lambda b: b.draft_logits is None),
    (dict(temperatures=("greedy",)), lambda b: (b.temperature[b.idx_mapping] == 0).all()),
    (dict(temperatures=("random",)), lambda b: (b.temperature[b.idx_mapping] >= 0.05).all()),
    (dict(padded_drafts=False), lambda b: all((b.draft_tokens(r) >= 0).all() for r in range(b.num_reqs))),
    (dict(masks=False), lambda b: not np.isneginf(b.target_logits).any()),
    (dict(logits_dtypes=("bfloat16",)), lambda b: b.logits_dtype == "bfloat16"),
    (dict(vocab_sizes=[70]), lambda b: b.vocab_size == 70),
    (dict(max_vocab=40, block_sizes=(8,)), lambda b: b.vocab_size <= 40),
    (dict(min_reqs=2, max_reqs=3, min_drafts=2, max_spec_steps=3),
     lambda b: 2 <= b.num_reqs <= 3 and (b.num_draft_tokens >= 2).all()),
    (dict(max_extra_states=0), lambda b: b.num_states == b.num_reqs),
]


@pytest.mark.parametrize("kwargs, holds", KNOB_CASES, ids=[repr(k) for k, _ in KNOB_CASES])
def test_decision_knobs_restrict_draws(kwargs, holds):
    @settings(FAST, max_examples=25)
    @given(decision_batches(**kwargs))
    def check(batch):
        validate(batch)
        assert holds(batch), batch.summary()

    check()


@pytest.mark.parametrize("kwargs", [dict(block_sizes=()), dict(block_sizes=[0]), dict(saturated="yes"),
                                    dict(min_reqs=3, max_reqs=2), dict(patterns=("zigzag",)), dict(seeds=5)], ids=repr)
def test_bad_decision_knobs_raise_eagerly(kwargs):
    with pytest.raises(InvalidArgument):
        decision_batches(**kwargs)


def test_decision_batches_shrink_to_a_minimal_batch():
    b = find(decision_batches(), lambda b: b.num_reqs >= 2, settings=settings(FAST, max_examples=200),
             random=Random(0))
    assert b.num_reqs == 2 and b.num_speculative_steps == 1 and b.vocab_size == 2, b.summary()
    assert b.logits_dtype == "float32" and b.num_logprobs is None, b.summary()
    assert (b.temperature[b.idx_mapping] == 1).all() and b.draft_logits is not None, b.summary()

