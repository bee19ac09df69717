"""SPEC 3c, 4 and 8: the explicit family's edges planted in drawn batches (`strategies.explicit_edges`).

Each kind lands where it claims, measured by the reference itself (the acceptance margin is 0 to an
ulp, the inverse-CDF margin is 0 with `U * S == S_b`, tied scores have margin 0, the safe plants
stay clear of the excusal); the fields stay valid; the ci budget reaches every kind with at most one
tie-class plant per draw; and the defects only the plants reach are killed at ci, while the same
runs without planting pass.
"""

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from examples.explicit_sampler import ExplicitSampler, _F32
from rs_verify.contract.validation import validate
from rs_verify.engine.runner import make_context, run
from rs_verify.properties import PROPERTIES
from rs_verify.reference import ReferenceSampler
from rs_verify.strategies import EXPLICIT_KNOBS, decision_batches
from rs_verify.strategies import explicit_edges as ee
from rs_verify.strategies.facts import batch_facts

EXAMPLES = 150
DECISION_PROPERTIES = ("certified_equivalence", "output_invariants", "determinism")


def _kwargs() -> dict:
    """What an explicit sampler's record passes to the strategies at ci (its family among them)."""
    kw = make_context(ExplicitSampler("inverse_cdf"), profile="ci").batch_kwargs
    assert kw["streams"] == "explicit"
    return kw


def _sweep(strategy, digest: str, n: int) -> list:
    drawn = []

    def record(batch):
        drawn.append(batch[0] if isinstance(batch, tuple) else batch)

    test = settings(max_examples=n, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))(given(strategy)(record))
    test.hypothesis.inner_test._hypothesis_internal_add_digest = digest.encode()
    test()
    return drawn


def _last_argmax(trace):
    return [d for d in trace.decisions if d.kind == "argmax"][-1]


def test_each_plant_lands_where_it_claims():
    inverse = ReferenceSampler(streams="explicit", resample="inverse_cdf")
    gumbel = ReferenceSampler(streams="explicit")
    seen, planted = Counter(), 0
    for b in _sweep(decision_batches(**_kwargs()), "explicit-edges", EXAMPLES):
        validate(b)  # the planted fields are valid (SPEC 9)
        if not b.noise_carried():
            continue
        planted += 1
        f = batch_facts(b, "explicit")
        knobs = ee.explicit_knobs(f)
        seen.update(knobs)
        _, t_inv = inverse.verify_with_trace(b)
        _, t_gum = gumbel.verify_with_trace(b)
        for r in ee._free(b, f.stochastic):
            w = ee.walk(b, f.z, r, f.u)
            d_inv, d_gum = _last_argmax(t_inv[r]), _last_argmax(t_gum[r])
            assert d_inv.row == d_gum.row == w.row  # the walk samples where the reference samples
            accepts = {d.row: d for d in t_inv[r].decisions if d.kind == "accept" and 0 <= d.token < f.v}
            assert sorted(accepts) == [t[0] for t in w.tests]
            for t in w.tests:
                u, m, scale = f.u[t[0]], accepts[t[0]].margin, ee._scale(t)
                if u in (ee.U_LO, ee.U_HI) and not t[3]:
                    assert abs(m) > ee.SAFE * scale, (u, m)  # the extremes are decided clear of an excusal
                if abs(ee._margin(t, u)) <= ee.BOUNDARY_ULPS * scale:
                    assert abs(m) <= ee.BOUNDARY_ULPS * scale and 0 < u < 1, m  # u = p / q to one ulp
            big_u, g = b.resample_uniforms[r], b.resample_gumbel[r]
            positive, c = (a[0] for a in ee.prefix_fractions(w.logr[None]))
            on = np.flatnonzero(positive & (c == big_u))
            if on.size:  # U on a prefix sum: the reference's own margin is 0, and U * S == S_b
                s = np.cumsum(np.exp(w.logr))
                assert d_inv.margin == 0.0 and big_u * s[-1] == s[on[0]], (d_inv.margin, big_u)
            if big_u == ee.U_HI:  # float32 reads U as 1: no prefix sum exceeds U * S
                assert np.float32(big_u) == 1 and positive[d_inv.token]
            with np.errstate(invalid="ignore"):
                scores = w.logr + g
            best = np.flatnonzero(scores == np.nanmax(scores))
            if best.size >= 2:  # an exact tie: equal logits and equal noise, margin 0, the lower token
                a, c2 = best[:2]
                assert f.z[w.row, a] == f.z[w.row, c2] and g[a] == g[c2] and w.logr[a] > ee.TIE_FLOOR
                assert d_gum.margin == 0.0 and d_gum.token == a
            for x in np.flatnonzero(g == ee.G_HI):  # the top noise: on a token of r = 0 or on the winner
                assert w.zeros(f.z[w.row])[x] or x == d_gum.token
            assert ((g >= ee.G_LO) & (g <= ee.G_HI)).all() or not knobs  # planted noise within the family's
    assert planted >= EXAMPLES // 2
    short = {k: seen[k] for k in EXPLICIT_KNOBS if seen[k] < 3}
    assert not short, (short, seen)


def test_top_noise_goes_only_where_float32_keeps_r_zero():
    """`G = 36.7` wins wherever `r > 0`: it goes on `p = 0`, the rejected one-hot draft or
    `p <= (1 - SAFE) q`, never on a token whose float64 residual is 0 by less (float32 may keep it)."""
    z = np.float32([0, 0, 0, -np.inf])
    zq = np.float32([1e-6, 0, 0, -20])
    p, q = np.exp(ee._row_logp(z)[0]), np.exp(ee._row_logp(zq)[0])
    with np.errstate(divide="ignore"):
        logr = np.log(np.maximum(p - q, 0.0))
    assert list(logr == -np.inf) == [True, False, False, True]  # token 0: p < q by 7e-7 of q
    assert list(ee.Walk([], 0, logr, zq).zeros(z)) == [False, False, False, True]
    with np.errstate(divide="ignore"):
        logr = np.log(p)
    logr[1] = -np.inf  # a rejected one-hot draft: r = p without it
    assert list(ee.Walk([], 0, logr, None, dropped=1).zeros(z)) == [False, True, False, True]


def test_other_families_and_block_batches_are_left_as_drawn():
    rng = np.random.default_rng(0)
    for b in _sweep(decision_batches(**_kwargs()), "explicit-edges:others", 20):
        bare = b.replace(accept_uniforms=None, resample_gumbel=None, resample_uniforms=None)
        assert ee.plant_explicit_edges(rng, bare, ReferenceSampler().family) is bare
        blocked = bare.replace(verification="block")
        assert ee.plant_explicit_edges(rng, blocked, ee.EXPLICIT) is blocked
        assert ee.explicit_knobs(batch_facts(bare, "explicit")) == set()  # no noise carried: nothing planted


def test_every_kind_within_the_ci_budget_one_tie_class_plant_at_most():
    """The three decision-comparing properties' 40 ci examples each: together they reach every kind,
    and no draw carries two tie-class plants (what keeps a correct sampler within SPEC 8's cap)."""
    seen = Counter()
    for prop in DECISION_PROPERTIES:
        ctx = make_context(ExplicitSampler("inverse_cdf"), profile="ci")
        for b in _sweep(PROPERTIES[prop].strategy(ctx), prop, 40):
            knobs = ee.explicit_knobs(batch_facts(b, "explicit"))
            assert len(knobs & set(ee.TIE_CLASS_KNOBS)) <= 1, knobs
            seen.update(knobs)
    assert set(EXPLICIT_KNOBS) <= set(seen), (sorted(set(EXPLICIT_KNOBS) - set(seen)), seen)


# -- defects that only the plants reach ------------------------------------------------------------


def _residual(p, q, d):
    res = p.copy()
    if d is not None and q is not None:
        res = np.maximum(p - q, _F32(0))
    elif d is not None:
        res[d] = 0
    return res if (res > 0).any() else p


class _NoFallback(ExplicitSampler):
    """Inverse CDF without SPEC 4's fallback: V' when float32 leaves no prefix sum above U * S."""

    def __init__(self):
        super().__init__("inverse_cdf")
        self.name = "no-fallback"

    def _sample(self, b, r, p, q, d):
        res = _residual(p, q, d)
        cum = np.cumsum(res, dtype=_F32)
        hit = (res > 0) & (cum > _F32(b.resample_uniforms[r]) * cum[-1])
        return int(np.argmax(hit)) if hit.any() else len(res)


class _LastTie(ExplicitSampler):
    """Gumbel-max that breaks exact ties to the highest index (SPEC 4: the lowest)."""

    def __init__(self):
        super().__init__("gumbel")
        self.name = "last-tie"

    def _sample(self, b, r, p, q, d):
        with np.errstate(divide="ignore"):
            s = np.log(_residual(p, q, d)) + np.asarray(b.resample_gumbel[r], _F32)
        return int(s.size - 1 - np.argmax(s[::-1]))


class _HalfRace(ExplicitSampler):
    """The race of exponentials with `E = exp(-G)` in float16: `E` underflows to 0 at `G = 36.7`."""

    def __init__(self):
        super().__init__("race")
        self.name = "float16-race"

    def _sample(self, b, r, p, q, d):
        e = np.exp(-np.asarray(b.resample_gumbel[r], np.float16)).astype(_F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            return int(np.argmax(_residual(p, q, d) / e))


@pytest.mark.parametrize("sampler, prop, says", [
    (_NoFallback(), "output_invariants", ("outside [0, V'",)),
    (_LastTie(), "certified_equivalence", ("excused divergences exceed",)),
    (_HalfRace(), "output_invariants", ("outside the residual", "emitted it again")),  # a token with r = 0
], ids=["no-fallback", "last-tie", "float16-race"])
def test_defects_only_the_plants_reach_are_killed(sampler, prop, says):
    """U = 1 - 2**-53 leaves no float32 prefix sum above U * S; three exact ties in a draw exceed the
    excusal cap; G = 36.7 on a token of r = 0 makes a float16 race divide 0 by 0. Drawn noise reaches
    none of them: the same run without planting (the strategies not told the family) passes."""
    ctx = make_context(sampler, ReferenceSampler(), profile="ci")
    out = run(PROPERTIES[prop], ctx)
    assert out.status == "failed" and any(s in out.failure.text() for s in says), out.failure and out.failure.text()
    ctx = make_context(sampler, ReferenceSampler(), profile="ci")
    assert ctx.batch_kwargs.pop("streams") == "explicit"
    out = run(PROPERTIES[prop], ctx)
    assert out.status == "passed", out.failure and out.failure.text()
