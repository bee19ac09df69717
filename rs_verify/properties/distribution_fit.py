"""Tests of fit of the distribution campaigns, and their power (SPEC section 8), with scipy.stats.

Tests, each at a per-test level `alpha` (the campaign's family-wise rate over its number
of tests, Bonferroni):

- `chisquare_fit` (a token law): tokens expecting >= `MIN_EXPECTED` observations are bins of
  their own; the rarer tokens form one more bin if together they expect >= `MIN_EXPECTED`, and
  are otherwise tested apart by an exact binomial tail, P(Bin(n, p_rare) >= k) (Pearson's
  statistic is only chi-square distributed when every bin expects >= 5: a bin expecting 0.01
  would turn one observation into a statistic of 100). The two parts are combined by
  Bonferroni. A token the law gives probability 0 must never appear: once fails the test.
- `binomial_fit` (an acceptance frequency): exact two-sided `scipy.stats.binomtest`; a law of
  exactly 0 or 1 admits no exception at all.

Power. Under a sampler whose binned law is p', the non-centrality of Pearson's statistic is
`n * chi2(p' || p) >= 4 n TV(p', p)^2` (Cauchy-Schwarz: `(sum |p' - p|)^2 <= sum (p' - p)^2 / p`,
equality when the bias is proportional to p), so every bias of total variation >= d on the
tested bins is detected with probability >= `ncx2.sf(chi2.isf(alpha, dof), dof, 4 n d^2)`;
`chisquare_power` inverts that for the smallest such d (adding the tail test's own d when the
rare tokens are tested apart). `binomial_power` does the same for the exact binomial test
(TV of two Bernoulli laws: |a' - a|) from its exact rejection region, and `tail_power` for the
tail test (a point-mass law: any mass d off it is seen with probability 1 - (1 - d)^n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

MIN_EXPECTED = 5.0
ALPHA = 1e-6  # the family-wise false-positive rate of every campaign (Bonferroni over its tests)
POWER = 0.99  # the power at which detectable biases are stated


@dataclass
class Fit:
    """One test: the observed counts of `label` against the probabilities `expected`."""

    label: str
    n: int
    observed: np.ndarray
    expected: np.ndarray  # probabilities
    statistic: float
    pvalue: float


def bins(expected: np.ndarray, n: float) -> tuple[list, np.ndarray]:
    """(bins, rare): the token sets Pearson's statistic compares at `n` observations, and the
    tokens left to the exact tail test (empty unless they expect < `MIN_EXPECTED` in all)."""
    exp = np.asarray(expected, dtype=np.float64) * n
    support = np.flatnonzero(exp > 0)
    groups = [np.array([t]) for t in support if exp[t] >= MIN_EXPECTED]
    small = support[exp[support] < MIN_EXPECTED]
    if small.size and exp[small].sum() >= MIN_EXPECTED:
        return [*groups, small], small[:0]
    return groups, small


def _tail_pvalue(k: int, n: int, p_rare: float) -> float:
    """P(Bin(n, p_rare) >= k): more observations on the rare tokens than their law allows."""
    return 1.0 if k == 0 else float(stats.binom.sf(k - 1, n, p_rare))


def chisquare_fit(label: str, tokens: np.ndarray, expected: np.ndarray) -> Fit:
    """Test of fit of `tokens` to the probabilities `expected`: Pearson's chi-square over `bins`
    and an exact binomial tail on the rare tokens, combined by Bonferroni (twice the smaller p)."""
    v = expected.shape[0]
    tokens = np.asarray(tokens)
    obs = np.bincount(tokens[(tokens >= 0) & (tokens < v)], minlength=v).astype(np.float64)
    n = int(tokens.shape[0])
    out_of_support = int(n - obs.sum()) + int(obs[expected <= 0].sum())
    if out_of_support:
        return Fit(label, n, obs, expected, np.inf, 0.0)
    groups, rare = bins(expected, n)
    pvalues, stat = [], 0.0
    if len(groups) >= 2:
        f_obs = np.array([obs[g].sum() for g in groups])
        f_exp = np.array([expected[g].sum() for g in groups])
        stat, pvalue = stats.chisquare(f_obs, f_exp * (f_obs.sum() / f_exp.sum()))
        pvalues.append(float(pvalue))
    if rare.size:
        pvalues.append(_tail_pvalue(int(obs[rare].sum()), n, float(expected[rare].sum())))
    pvalue = min(1.0, len(pvalues) * min(pvalues)) if pvalues else 1.0
    return Fit(label, n, obs, expected, float(stat), pvalue)


def binomial_fit(label: str, k: int, n: int, want: float) -> Fit:
    """Exact two-sided binomial test of k successes in n trials against probability `want`."""
    if want in (0.0, 1.0) or n == 0:
        pvalue = 1.0 if k == round(n * want) else 0.0
    else:
        pvalue = stats.binomtest(k, n, want).pvalue
    return Fit(label, n, np.array([n - k, k], float), np.array([1 - want, want]), np.nan, float(pvalue))


# -- power --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Power:
    """What one test detects: every bias of total variation >= `min_tv` with probability >= `power`."""

    kind: str  # "chi-square", "binomial" or "tail"
    n: float  # expected observations
    dof: int
    alpha: float  # per-test level
    critical: float  # chi-square: the critical statistic; otherwise nan
    min_tv: float  # inf when no bias is detected with that power
    power: float
    passing: tuple | None = None  # binomial: the range of frequencies k / n that passes


def tail_power(n: float, p_rare: float, alpha: float, power: float) -> Power:
    """The rare tokens' tail test (a point-mass law: its complement, p_rare = 0): the smallest
    extra mass d on them detected with probability >= `power`."""
    n_int = int(round(n))
    if n_int < 1:
        return Power("tail", n, 0, alpha, math.nan, math.inf, power)
    k = 1 if p_rare == 0 else int(stats.binom.isf(alpha, n_int, p_rare)) + 1  # smallest k rejected
    while k > 1 and _tail_pvalue(k - 1, n_int, p_rare) < alpha:
        k -= 1
    while _tail_pvalue(k, n_int, p_rare) >= alpha:
        k += 1
    if k > n_int:
        return Power("tail", n, 0, alpha, math.nan, math.inf, power)
    detect = lambda d: stats.binom.sf(k - 1, n_int, min(1.0, p_rare + d)) - power  # noqa: E731
    d = optimize.brentq(detect, 0.0, 1.0 - p_rare) if detect(1.0 - p_rare) > 0 else math.inf
    return Power("tail", n, 0, alpha, math.nan, d, power)


def chisquare_power(expected: np.ndarray, n: float, alpha: float, power: float) -> Power:
    """What `chisquare_fit` detects at `n` observations: every bias of TV >= `min_tv` on the
    tested bins (Pearson part; plus, when rare tokens are tested apart, their tail's own d)."""
    groups, rare = bins(expected, n)
    parts = (len(groups) >= 2) + bool(rare.size)
    tail = tail_power(n, float(np.asarray(expected)[rare].sum()), alpha / max(1, parts), power)
    if len(groups) < 2:
        return tail
    dof = len(groups) - 1
    level = alpha / parts
    crit = float(stats.chi2.isf(level, dof))
    hi = 1.0
    while stats.ncx2.sf(crit, dof, hi) < power:
        hi *= 2.0
    lam = optimize.brentq(lambda nc: stats.ncx2.sf(crit, dof, nc) - power, 1e-9, hi, xtol=1e-9, rtol=1e-12)
    d = math.sqrt(lam / (4.0 * n)) + (tail.min_tv if rare.size else 0.0)
    return Power("chi-square", n, dof, level, crit, d if d <= 1.0 else math.inf, power)


def _binomial_edges(n: int, a: float, alpha: float) -> tuple[int, int]:
    """(lo, hi): `binomtest(k, n, a).pvalue < alpha` exactly for k <= lo or k >= hi (monotone on each side)."""

    def rejects(k: int) -> bool:
        return stats.binomtest(k, n, a).pvalue < alpha

    mode = min(n, max(0, int(round(n * a))))
    lo, hi = -1, n + 1
    a_, b_ = 0, mode  # largest rejected k below the mode
    if rejects(0):
        while a_ < b_:
            mid = (a_ + b_ + 1) // 2
            a_, b_ = (mid, b_) if rejects(mid) else (a_, mid - 1)
        lo = a_
    a_, b_ = mode, n  # smallest rejected k above the mode
    if rejects(n):
        while a_ < b_:
            mid = (a_ + b_) // 2
            a_, b_ = (a_, mid) if rejects(mid) else (mid + 1, b_)
        hi = a_
    return lo, hi


def binomial_power(n: int, a: float, alpha: float, power: float) -> Power:
    """The smallest |a' - a| the exact binomial test detects with probability >= `power`."""
    if a in (0.0, 1.0):
        return tail_power(n, 0.0, alpha, power)
    lo, hi = _binomial_edges(n, a, alpha)

    def detect(p: float) -> float:
        return float(stats.binom.cdf(lo, n, p) + stats.binom.sf(hi - 1, n, p))

    # Biases beyond [0, 1] do not exist: a side that never reaches `power` bounds d by its width.
    up = 1.0 - a if detect(1.0) < power else optimize.brentq(lambda d: detect(a + d) - power, 0.0, 1.0 - a)
    down = a if detect(0.0) < power else optimize.brentq(lambda d: detect(a - d) - power, 0.0, a)
    return Power("binomial", n, 1, alpha, math.nan, max(up, down), power, ((lo + 1) / n, (hi - 1) / n))
