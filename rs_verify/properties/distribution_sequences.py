"""Tests of fit of whole emitted sequences, and block verification's closed forms (SPEC sections 4b, 8).

Lossless verification is a statement about sequences: complete each request's emitted tokens
to `n + 1` tokens with independent draws from the target rows that follow; the completed
sequence follows the product of the rows' `p`, for token-wise and block verification alike.
Block verification conditions early tokens on later drafts, so a test of each row's marginal
alone is not enough (and the per-position laws that hold token by token, "the token at position
i of the requests that reach it follows p_i", do not hold for blocks at all).

- `distribution_sequences` (token by token) and `distribution_block_sequences` (block): V = 5
  (one token masked in every row), K = 2, T in {0.7, 1.0, 1.6}; model drafts drawn from q with
  the salted drafter stream, padded after one draft or at the first step (`qq`, `q-`, `-q`), and
  fixed one-hot drafts (`qq`, `q-`). Per temperature and draft mode, the completed sequences
  (4^3 = 64 cells) pooled over the patterns and per pattern, against the product law.
- `block_closed_forms`: V = 5 (given rows, `CLOSED_ROWS`; one token masked in the target), K = 2,
  T = 1, 16 pairs of fixed drafts (`CLOSED_DRAFTS`: padded, partly accepted, saturating and masked
  drafts), one-hot and model: with the drafts fixed the thresholds `h_i` are too, so
  `P(tau = t) = h_{t-1} prod_{t <= i < m} (1 - h_i)` exactly (`rs_verify.contract.block.tau_law`), and
  given `tau = t` the token there follows the residual of SPEC 4b (its noise is independent of the
  uniforms). Plus the one-sided test of SPEC 8's claim that block verification accepts at least as
  much: on one batch of drafts drawn from q, verified once token by token and once as blocks with
  the same seeds, the mean paired difference of `num_sampled` must not be significantly negative.

Decision rule and power as for the other campaigns (`rs_verify.properties.distribution`): a
property of m tests fails when a p-value is below 1e-6 / m. The gain test rejects when
`mean(D) < -z sd(D) / sqrt(n)` with `z = norm.isf(1e-6)` = 4.75 (one-sided, false-positive rate
1e-6 at a true gain of 0, less above); since `|D| <= K`, `sd(D) <= K` and it detects an expected loss
of at least `(z + norm.isf(0.01)) K / sqrt(n)` tokens with power >= 0.99 (0.047 at ci's 200,000
trials), whatever the sampler.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from scipy import stats

from ..contract import methods, probs
from ..contract.block import block_quantities, block_residual, tau_law
from ..contract.chunking import select_requests
from .assertions import as_declared, campaign_call, within_bound
from .distribution_batches import TRIALS, Campaign, build_batch
from .distribution_fit import ALPHA, POWER, Fit, binomial_power, chisquare_fit, chisquare_power
from .registry import PropertyFailure, register

GAIN_Z = float(stats.norm.isf(ALPHA))

SEQUENCES = (
    Campaign("sequences, model drafts", "model", vocab=5, steps=2, seed=31, patterns=("qq", "q-", "-q")),
    Campaign("sequences, one-hot drafts", "one_hot", vocab=5, steps=2, seed=32, patterns=("qq", "q-")),
)
# Rows where a partly accepted block is common and its residual max(P p - q, 0) is far from the
# token-wise max(p - q, 0): d_0 = 0 gives P_0 = 0.6, h_0 = 0.37 and, at tau = 1, residuals at total
# variation 0.23 from each other; d_0 = 1 or 3 saturate P_0 = 1; token 4 is masked in the target
# (p = 0) and proposed by the drafter (q > 0), so P collapses to 0.
CLOSED_ROWS = (
    ((0.30, 0.35, 0.20, 0.15, 0.0), (0.05, 0.15, 0.35, 0.45, 0.0), (0.25, 0.25, 0.20, 0.30, 0.0)),
    ((0.50, 0.15, 0.20, 0.05, 0.10), (0.40, 0.30, 0.20, 0.05, 0.05)),
)
# The draft pairs enumerated: at step 0 padded, P < 1, P saturated, p(d) = 0; at step 1 padded, a
# small ratio, a saturating one, p(d) = 0.
CLOSED_DRAFTS = ((-1, 0, 1, 4), (-1, 0, 3, 4))
CLOSED = Campaign("block closed forms", "model", vocab=5, steps=2, temperatures=(1.0,), seed=33,
                  verification=methods.BLOCK.name, rows="given", given=CLOSED_ROWS)
GAIN = Campaign("block gain", "model", vocab=8, steps=3, temperatures=(0.7, 1.0), seed=34)
MIN_RESIDUAL_N = 200  # a residual law is tested where its step is expected at least this often


def _group_rows(c: Campaign, batch, group) -> list[np.ndarray]:
    """p of each temperature group's rows, float64 `[K + 1, V']` (every request of a group shares them)."""
    return [probs.target_probs(select_requests(batch, [int(np.flatnonzero(group == g)[0])]))
            for g in range(len(c.temperatures))]


def completed_sequences(c: Campaign, batch, out, group, rng) -> np.ndarray:
    """Each request's emitted tokens completed to K + 1 with independent draws from its later rows' p,
    as one code `sum_s x_s V^(K - s)` per request (int64 `[trials]`)."""
    k1, v = c.steps + 1, batch.effective_vocab_size
    seq = np.array(out.sampled, dtype=np.int64)
    rows = _group_rows(c, batch, group)
    for g, p in enumerate(rows):
        for s in range(k1):
            need = np.flatnonzero((group == g) & (out.num_sampled <= s))
            if need.size:
                seq[need, s] = rng.choice(v, size=need.size, p=p[s] / p[s].sum())
    bad = (seq < 0) | (seq >= v)
    seq[bad] = v  # out of range: lands in no cell of the law (fails the test)
    return (seq * (v + 1) ** np.arange(k1 - 1, -1, -1)).sum(axis=1)


def product_law(p: np.ndarray, v: int) -> np.ndarray:
    """The product of the rows' laws over codes in base `v + 1` (the extra digit: out of range, law 0)."""
    law = np.ones(1)
    for row in p:
        law = np.outer(law, np.append(row, 0.0)).reshape(-1)
    return law


def sequence_fits(c: Campaign, sampler, trials: int, verification: str) -> list:
    """The tests of one sequence campaign: per temperature, pooled and per pattern."""
    c = replace(c, verification=verification)
    batch, group, pattern = build_batch(c, trials)
    batch = as_declared(batch, sampler)
    out = campaign_call(sampler, batch)
    codes = completed_sequences(c, batch, out, group, np.random.default_rng(c.seed + 7))
    fits = []
    for g, p in enumerate(_group_rows(c, batch, group)):
        law = product_law(p, batch.effective_vocab_size)
        sel = group == g
        fits.append(chisquare_fit(f"{c.name}, {verification}, T={c.temperatures[g]}: completed sequences",
                                  codes[sel], law))
        for u, pat in enumerate(c.distinct_patterns):
            fits.append(chisquare_fit(f"{c.name}, {verification}, T={c.temperatures[g]}, drafts {pat!r}: "
                                      "completed sequences", codes[sel & (pattern == u)], law))
    return fits


def sequence_powers(trials: int) -> list:
    """(label, kind, expected n, law) of every sequence test at `trials` (no sampler run)."""
    out = []
    for c in SEQUENCES:
        batch, group, pattern = build_batch(c, len(c.temperatures) * len(c.draft_patterns))
        counts = np.bincount(np.arange(trials) % len(c.temperatures), minlength=len(c.temperatures))
        for g, p in enumerate(_group_rows(c, batch, group)):
            law = product_law(p, batch.effective_vocab_size)
            out.append((f"{c.name}, T={c.temperatures[g]}", "chi-square", float(counts[g]), law))
            for pat in c.distinct_patterns:
                share = c.draft_patterns.count(pat) / len(c.draft_patterns)
                out.append((f"{c.name}, T={c.temperatures[g]}, drafts {pat!r}", "chi-square",
                            float(counts[g]) * share, law))
    return out


# -- block closed forms ------------------------------------------------------------------------


def closed_form_drafts(trials: int) -> np.ndarray:
    """Every pair of `CLOSED_DRAFTS`, cycled over the trials (int64 `[trials, 2]`)."""
    pairs = np.array(list(itertools.product(*CLOSED_DRAFTS)), np.int64)
    return pairs[np.arange(trials) % len(pairs)]


def closed_form_cases(c: Campaign, batch, drafts: np.ndarray) -> list:
    """Per distinct draft pair: `(pair, law of tau [K + 1], {t: law of the token emitted at t})`,
    the laws of SPEC 4b with fixed drafts (`m` the first padded step; at `tau = m` the law is `p`)."""
    pairs, first = np.unique(drafts, axis=0, return_index=True)
    sub = select_requests(batch, [int(i) for i in first])
    p = probs.target_probs(sub).reshape(len(pairs), c.steps + 1, -1)
    q = probs.draft_probs(sub)
    q = None if q is None else q.reshape(len(pairs), c.steps + 1, -1)[:, : c.steps]
    res = block_quantities(p, q, pairs, np.full(len(pairs), c.steps))
    laws = tau_law(res)
    cases = []
    for i, pair in enumerate(pairs):
        residuals = {}
        for t in range(c.steps + 1):
            if t == c.steps:
                residuals[t] = p[i, t]  # the bonus row
                continue
            scale = float(np.exp(res.log_prefix[i, t - 1])) if 0 < t <= res.m[i] else 1.0
            qrow = None if q is None else q[i, t]
            law = block_residual(p[i, t], qrow, int(pair[t]), scale, padded=t >= res.m[i])
            residuals[t] = law / law.sum()
        cases.append((tuple(int(d) for d in pair), laws[i], residuals))
    return cases


def closed_form_fits(sampler, trials: int) -> list:
    """The tau laws and the residual laws of every fixed draft pair, one-hot and model drafts."""
    fits = []
    for mode in ("model", "one_hot"):
        c = replace(CLOSED, draft_mode=mode, name=f"{CLOSED.name}, {mode.replace('_', '-')} drafts")
        drafts = closed_form_drafts(trials)
        batch, _, _ = build_batch(c, trials, drafts=drafts)
        batch = within_bound(batch, sampler)  # the laws below are read from the batch the sampler gets
        if as_declared(batch, sampler) is not batch and mode == "model":
            continue  # the sampler takes no model drafts: the one-hot half still runs
        out = campaign_call(sampler, batch)
        for pair, law, residuals in closed_form_cases(c, batch, drafts):
            reqs = np.flatnonzero((drafts == pair).all(axis=1))
            tau = out.num_sampled[reqs].astype(np.int64) - 1
            fits.append(chisquare_fit(f"{c.name} {pair}: tau", tau, law))
            for t, resid in residuals.items():
                if law[t] * reqs.size >= MIN_RESIDUAL_N:
                    fits.append(chisquare_fit(f"{c.name} {pair}: token at tau = {t}",
                                              out.sampled[reqs[tau == t], t], resid))
    return fits


def closed_form_powers(trials: int) -> list:
    """(label, kind, expected n, law) of every closed-form test at `trials` (no sampler run)."""
    out = []
    for mode in ("model", "one_hot"):
        c = replace(CLOSED, draft_mode=mode, name=f"{CLOSED.name}, {mode.replace('_', '-')} drafts")
        pairs = len(closed_form_drafts(trials)[: np.prod([len(d) for d in CLOSED_DRAFTS])])
        drafts = closed_form_drafts(pairs)
        batch, _, _ = build_batch(c, pairs, drafts=drafts)
        per_pair = trials / pairs
        for pair, law, residuals in closed_form_cases(c, batch, drafts):
            out.append((f"{c.name} {pair}: tau", "chi-square", per_pair, law))
            for t, resid in residuals.items():
                if law[t] * per_pair >= MIN_RESIDUAL_N:
                    out.append((f"{c.name} {pair}: token at tau = {t}", "chi-square", law[t] * per_pair, resid))
    return out


def gain(sampler, trials: int) -> tuple[float, float, int]:
    """Block's paired gain in `num_sampled` over token-wise verification on the same batch (drafts
    from q): `(mean, standard error, n)`."""
    token, _, _ = build_batch(GAIN, trials)
    block = token.replace(verification=methods.BLOCK.name)
    d = campaign_call(sampler, block).num_sampled.astype(np.float64) - campaign_call(sampler, token).num_sampled
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size)), int(d.size)


def gain_power(trials: int) -> float:
    """The smallest expected loss of block against token verification the gain test detects with
    power >= 0.99 (`sd(D) <= K`, see the module docstring)."""
    return (GAIN_Z + float(stats.norm.isf(1 - POWER))) * GAIN.steps / np.sqrt(trials)


def powers(name: str, trials: int) -> list:
    """(label, `Power`) of every test of property `name` at `trials`, as `distribution._test_powers`."""
    tests = sequence_powers(trials) if name != "block_closed_forms" else closed_form_powers(trials)
    alpha = ALPHA / (len(tests) + (name == "block_closed_forms"))
    return [(label, binomial_power(int(n), law, alpha, POWER) if kind == "binomial" else
             chisquare_power(law, n, alpha, POWER)) for label, kind, n, law in tests]


# -- registration -------------------------------------------------------------------------------


def check_fits(fits: list, what: str, trials: int) -> None:
    """Fail on the worst test when its p-value is below ALPHA / (number of tests)."""
    worst = min(fits, key=lambda f: f.pvalue)
    threshold = ALPHA / max(1, len(fits))
    if worst.pvalue < threshold:
        v = worst.expected.shape[0]
        top = np.argsort(-np.abs(worst.observed / max(worst.n, 1) - worst.expected))[: min(v, 4)]
        detail = ", ".join(f"cell {t}: {worst.observed[t] / max(worst.n, 1):.4f} vs {worst.expected[t]:.4f}"
                           for t in top)
        raise PropertyFailure(
            f"{what} ({trials} trials): {worst.label} does not fit the law of SPEC 4/4b: chi-square "
            f"{worst.statistic:.1f}, p = {worst.pvalue:.3g} < {threshold:.3g} (family-wise false-positive rate "
            f"{ALPHA:g}); largest deviations: {detail}", details={"fits": fits})


def _trials(ctx) -> int:
    return TRIALS.get(ctx.profile, TRIALS["dev"])


def _sequences(ctx, verification: str) -> None:
    trials = _trials(ctx)
    fits = []
    for c in SEQUENCES:
        if c.draft_mode in ctx.record.draft_modes:
            fits += sequence_fits(c, ctx.sampler, trials, verification)
    ctx.stats.setdefault("fits", []).extend(fits)
    check_fits(fits, f"completed sequences, {verification} verification", trials)


@register("distribution_sequences", "distribution", needs=("fast",), cost=220, slow=True,
          why_kept=("The joint law of whole emissions (completed with draws from the later rows), token by token: a "
                    "bias that moves mass between positions keeps every marginal."))
def distribution_sequences(ctx, _drawn) -> None:
    """Token by token, each request's emission completed with draws from its later rows follows the product of the rows' p."""
    _sequences(ctx, methods.TOKEN.name)


@register("distribution_block_sequences", "distribution", needs=("fast", "block_verification"), cost=230, slow=True,
          why_kept=("Block verification's correctness is a statement about sequences only (its per-position laws are "
                    "not p): the one test of fit of blocks for own-RNG samplers."))
def distribution_block_sequences(ctx, _drawn) -> None:
    """In block verification, each emission completed with draws from the later rows follows the product of the rows' p."""
    _sequences(ctx, methods.BLOCK.name)


@register("block_closed_forms", "distribution", needs=("fast", "block_verification"), cost=240, slow=True,
          why_kept=("Exact laws of tau and of the token at tau for fixed drafts (SPEC 4b's thresholds), and the "
                    "one-sided test that blocks accept at least as much as token-wise verification."))
def block_closed_forms(ctx, _drawn) -> None:
    """Fixed drafts: tau follows h_{t-1} prod (1 - h_i) and the token at tau its residual; blocks accept at least as much as token-wise."""
    trials = _trials(ctx)
    fits = closed_form_fits(ctx.sampler, trials)
    ctx.stats.setdefault("fits", []).extend(fits)
    check_fits(fits, "block verification with fixed drafts", trials)
    if "model" not in ctx.record.draft_modes:
        return
    mean, se, n = gain(ctx.sampler, trials)
    z = mean / se if se > 0 else (0.0 if mean >= 0 else -np.inf)
    ctx.stats["fits"].append(Fit("block gain over token-wise (paired num_sampled)", n, np.array([mean]),
                                 np.array([0.0]), z, float(stats.norm.cdf(z))))
    if z < -GAIN_Z:
        raise PropertyFailure(
            f"block verification accepts less than token-wise verification on the same p, q and drafts from q "
            f"({n} paired requests, V={GAIN.vocab}, K={GAIN.steps}): mean gain {mean:.4f} tokens per request, "
            f"z = {z:.2f} < -{GAIN_Z:.2f} (one-sided, false-positive rate {ALPHA:g}; SPEC 8)")
