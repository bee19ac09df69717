"""Distribution properties (SPEC section 8): fixed-seed tests of fit over many trials.

Fixed, seeded campaigns, each run once on a sampler that is not interpreted (the Triton
interpreter is not fast enough: these run on CUDA, and in CI on the NumPy reference):

- `distribution_model_drafts`: V = 16, K = 3, T in {0.7, 1.0, 1.6}; drafts drawn from q with
  the salted drafter stream, and padded (-1) tails after 2, 1 or 0 real drafts (patterns
  `qqq`, `qq-`, `q--`, `---`): a padded draft is rejected and resamples from p itself;
- `distribution_one_hot_drafts`: V = 12, K = 3, fixed likely / unlikely / middling one-hot
  drafts, with a padded last or middle draft (`qqq`, `qq-`, `q-q`);
- `distribution_saturated_residuals`: V = 16, K = 3, target and draft rows identical and
  saturated (p = q uniform on 1, 2, 4 or 8 tokens, exactly in any precision), drafts from q
  (always accepted), masked drafts (`o`: rejected with an empty residual max(p - q, 0), which
  SPEC section 4 replaces by p) and padded drafts at every step;
- `distribution_sampling_params`: V = 16, K = 3, the target rows masked by each temperature's
  sampling parameters (SPEC 2: top-k 4 at T = 0.7, top-p 0.7 at T = 1.0, min-p 0.05 with top-k 10
  and top-p 0.9 at T = 1.6), drafts drawn from the unmasked q (`qqq`, `qq-`, `q--`): every law is the
  masked p, and a draft of a masked token is rejected;
- `distribution_sequences`, `distribution_block_sequences`, `block_closed_forms`: whole emitted
  sequences (token by token and in blocks) and block verification's exact laws of tau, in
  `distribution_sequences` (the module);
- `closed_forms`: V = 8, K = 1, T = 0.8, every draft token and a padded one enumerated over
  random rows and over saturated rows: acceptance frequency min(1, p(d) / q(d)) (0 padded;
  binomial), and the rejected trials' tokens follow max(p - q, 0) / Z, or p for a padded draft
  or an empty residual (chi-square).

Their batches and laws are in `distribution_batches`, the tests and their power in
`distribution_fit`. Each campaign's tests are fixed by its design (`plan_fits`): per
temperature, the token at each position over every request that reaches it, and over those
with each draft kind there; per temperature and pattern, the acceptance-length law.

Decision rule: a campaign of m tests fails when any p-value is below `ALPHA / m`: its
family-wise false-positive rate is at most `ALPHA` = 1e-6 (Bonferroni), so a correct sampler
fails one of these fixed-seed campaigns with probability <= 1e-6 over the choice of seeds.
The critical chi-square values that implies are chi2.isf(1e-6 / m, dof): 63.9 for 14 dof at
m = 42, 31.8 for 1 dof at m = 60 (and 63.3 for 15 dof at m = 15, where an earlier version of
this docstring said ~45, and claimed near-certain power at non-centrality 48: it is 0.47).

Power (`campaign_power`, scipy.stats, no sampler run): every bias of total variation >= d in
the law of one test with n observations is detected with probability >= 0.99 when
ncx2.sf(crit, dof, 4 n d^2) >= 0.99 (see `distribution_fit`). The table gives each property's
number of tests and range of critical values at ci, and per profile the d of its weakest
principal test (one observing >= 0.5% of the trials; rarer tests, e.g. bonus rows after an
opposite-ranked draft at T = 0.7, run too, with less power), and the d of its most
sensitive token law at ci.
`tests/test_distribution.py` checks that this table is `power_table()` and simulates the
weakest tests at the stated d.

| property | tests | critical values | min TV dev/ci/gpu/nightly | best law at ci | weakest test at ci (n) |
|---|---:|---|---|---:|---|
| distribution_model_drafts | 42 | 31.2-63.9 | 0.224/0.125/0.090/0.042 | 0.019 | T=0.7 position 1, drafts from q (1,251) |
| distribution_one_hot_drafts | 33 | 30.7-55.1 | 0.338/0.164/0.114/0.046 | 0.018 | T=1.0 position 2, padded drafts (1,063) |
| distribution_saturated_residuals | 60 | 31.8-49.7 | 0.084/0.046/0.033/0.015 | 0.018 | T=0.7 position 3 (9,524) |
| distribution_sampling_params | 33 | 30.7-50.7 | 0.207/0.114/0.080/0.036 | 0.016 | T=1.6 position 2, padded drafts (1,535) |
| closed_forms | 33 | 34.6-45.9 | 0.082/0.045/0.032/0.014 | 0.027 | draft 0: residual max(p - q, 0) (8,293) |
| distribution_sequences | 21 | 94.2-142.2 | 0.071/0.041/0.028/0.013 | 0.021 | sequences, model drafts, T=1.0, drafts 'qq' (22,222) |
| distribution_block_sequences | 21 | 94.2-142.2 | 0.071/0.041/0.028/0.013 | 0.021 | sequences, model drafts, T=1.0, drafts 'qq' (22,222) |
| block_closed_forms | 80 | 32.4-39.7 | 0.196/0.107/0.076/0.034 | 0.036 | block closed forms, model drafts (1, 0): token at tau = 2 (1,562) |
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..contract import methods
from .assertions import campaign_call, within_bound
from .registry import PROPERTIES, PropertyFailure, register
from .distribution_batches import (  # noqa: F401  (re-exported: the campaigns' public names)
    DRAFT_SALT,
    TRIALS,
    Campaign,
    FitPlan,
    acceptance_lengths,
    build_batch,
    closed_form_drafts,
    closed_form_laws,
    counts_of,
    draft_tokens_from_q,
    kind_matrix,
    plan_fits,
)
from .distribution_sequences import powers as sequence_powers
from .distribution_fit import (  # noqa: F401
    ALPHA,
    MIN_EXPECTED,
    POWER,
    Fit,
    binomial_fit,
    binomial_power,
    chisquare_fit,
    chisquare_power,
)

PRINCIPAL_SHARE = 0.005  # a test observing >= this share of the trials (expected) is a principal test

CAMPAIGNS = {
    "distribution_model_drafts": Campaign("model drafts", "model", patterns=("qqq", "qq-", "q--", "---")),
    "distribution_one_hot_drafts": Campaign("one-hot drafts", "one_hot", vocab=12, seed=7,
                                            patterns=("qqq", "qq-", "q-q")),
    "distribution_saturated_residuals": Campaign(
        "saturated residuals", "model", rows="saturated", seed=20261201,
        patterns=("qqq", "oqq", "qoq", "qqo", "-qq", "q-q", "qq-")),
    # SPEC 2: the target rows masked by each temperature's sampling parameters, the drafts (from the
    # unmasked q) not: drafts of masked tokens are rejected, and every law is the masked p.
    "distribution_sampling_params": Campaign(
        "sampling parameters", "model", seed=20261202, patterns=("qqq", "qq-", "q--"),
        params=({"top_k": 4}, {"top_p": 0.7}, {"min_p": 0.05, "top_k": 10, "top_p": 0.9})),
}
CLOSED_FORMS = (
    Campaign("closed forms", "model", vocab=8, steps=1, temperatures=(0.8,), seed=11),
    Campaign("closed forms, saturated", "model", vocab=8, steps=1, temperatures=(0.8,), seed=12,
             rows="saturated", support_sizes=(4,), filler=False),
)


@dataclass
class CampaignResult:
    campaign: Campaign
    trials: int
    fits: list = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return ALPHA / max(1, len(self.fits))

    def worst(self) -> Fit:
        return min(self.fits, key=lambda f: f.pvalue)


def run_campaign(sampler, c: Campaign, trials: int) -> CampaignResult:
    """Run `sampler` on the campaign's batch and run every test `plan_fits` lists."""
    batch, group, pattern = build_batch(c, trials)
    batch = within_bound(batch, sampler)  # its -1e4 fillers, beyond a declared logit_bound (SPEC 10)
    out = campaign_call(sampler, batch)
    kinds = kind_matrix(c)[pattern]
    result = CampaignResult(c, trials)
    for f in plan_fits(c, batch, group, pattern, counts_of(c, trials)):
        sel = group == f.temp
        if f.position is None:
            tokens = out.num_sampled[sel & (pattern == f.pattern)].astype(np.int64) - 1
        else:
            sel &= out.num_sampled > f.position
            if f.kind is not None:
                sel &= kinds[:, f.position] == f.kind
            tokens = out.sampled[sel, f.position]
        result.fits.append(chisquare_fit(f.label, tokens, f.expected))
    return result


def run_closed_forms(sampler, trials: int) -> CampaignResult:
    """Per enumerated draft d of each `CLOSED_FORMS` block (V = 8, K = 1, T = 0.8): the acceptance
    frequency is min(1, p(d) / q(d)) (0 for a padded draft; binomial test), and the tokens of the
    rejected trials follow max(p - q, 0) / Z, or p itself for a padded draft or an empty residual
    (chi-square), the closed forms of SPEC section 4."""
    result = CampaignResult(CLOSED_FORMS[0], trials)
    for c in CLOSED_FORMS:
        drafts = closed_form_drafts(c, trials)
        batch = within_bound(build_batch(c, trials, drafts=drafts)[0], sampler)
        out = campaign_call(sampler, batch)
        for d, want, law, what in closed_form_laws(c, batch, drafts):
            reqs = np.flatnonzero(drafts[:, 0] == d)
            accepted = out.num_sampled[reqs] == 2
            k, n = int(accepted.sum()), int(reqs.size)
            name = _draft_name(c, d)
            result.fits.append(binomial_fit(f"{name}: acceptance {k}/{n} vs {want:.4f}", k, n, want))
            if law is not None:
                result.fits.append(chisquare_fit(f"{name}: {what}", out.sampled[reqs[~accepted], 0], law))
    return result


def _draft_name(c: Campaign, d: int) -> str:
    return f"{c.name}, draft {d}" if d >= 0 else f"{c.name}, padded draft"


def check_campaign(result: CampaignResult, batch_hint: str) -> None:
    worst = result.worst()
    if worst.pvalue < result.threshold:
        v = worst.expected.shape[0]
        what = "outcome" if np.isnan(worst.statistic) else "token"  # binomial: 0 rejected, 1 accepted
        top = np.argsort(-np.abs(worst.observed / max(worst.n, 1) - worst.expected))[: min(v, 4)]
        detail = ", ".join(f"{what} {t}: {worst.observed[t] / max(worst.n, 1):.4f} vs {worst.expected[t]:.4f}"
                           for t in top)
        stat = "" if np.isnan(worst.statistic) else f"chi-square {worst.statistic:.1f}, "
        raise PropertyFailure(
            f"campaign {result.campaign.name!r} ({batch_hint}, {result.trials} trials): {worst.label} does not fit "
            f"the target: {stat}p = {worst.pvalue:.3g} < {result.threshold:.3g} "
            f"(family-wise false-positive rate {ALPHA:g}); largest deviations: {detail}",
            details={"fits": result.fits},
        )


# -- power (computed, not measured: scipy.stats on the campaign's own design) ----------


def _test_powers(name: str, trials: int) -> list[tuple[str, object]]:
    """(label, `Power`) of every test property `name` runs at `trials` trials."""
    tests = []
    if name == "closed_forms":
        for c in CLOSED_FORMS:
            drafts = closed_form_drafts(c, c.vocab + 1)
            batch, _, _ = build_batch(c, c.vocab + 1, drafts=drafts)
            sizes = np.bincount(closed_form_drafts(c, trials)[:, 0] + 1, minlength=c.vocab + 1)
            for d, want, law, what in closed_form_laws(c, batch, drafts):
                name = _draft_name(c, d)
                tests.append((f"{name}: acceptance", ("binomial", int(sizes[d + 1]), want)))
                if law is not None:
                    tests.append((f"{name}: {what}", ("chi-square", sizes[d + 1] * (1 - want), law)))
    elif name in SEQUENCE_PROPERTIES:
        return sequence_powers(name, trials)
    else:
        c = CAMPAIGNS[name]
        small = len(c.temperatures) * len(c.draft_patterns)
        batch, group, pattern = build_batch(c, small)
        for f in plan_fits(c, batch, group, pattern, counts_of(c, trials)):
            tests.append((f.label, ("chi-square", f.n, f.expected)))
    alpha = ALPHA / len(tests)
    return [(label, binomial_power(n, law, alpha, POWER) if kind == "binomial" else
             chisquare_power(law, n, alpha, POWER)) for label, (kind, n, law) in tests]


def campaign_power(profile: str) -> list[dict]:
    """Per distribution property at the profile's trial count (computed with scipy.stats, no sampler run):

    - `tests`, `alpha` (family-wise false-positive rate), `test_alpha` (per test, Bonferroni);
    - `critical_values`: the smallest and largest chi-square critical statistic of its tests;
    - `min_detectable_tv`: every bias of at least this total variation in the law of any one of
      its principal tests (those observing >= `PRINCIPAL_SHARE` of the trials, expected: the same
      tests at every trial count) is detected with probability >= `power`; `weakest_test` and
      `weakest_n` name the test that sets it; `rare_tests` counts the other tests (positions that
      few trials reach: they run too, with less power, and fail any unsupported token);
    - `best_min_detectable_tv`: the same for its most sensitive token law (chi-square test);
    - `per_test`: label, kind, expected n, dof, critical value and min TV of every test.
    """
    trials = TRIALS.get(profile, TRIALS["dev"])
    rows = []
    for name in (*CAMPAIGNS, "closed_forms", *SEQUENCE_PROPERTIES):
        powers = _test_powers(name, trials)
        well = [(label, p) for label, p in powers if p.n >= PRINCIPAL_SHARE * trials]
        label, weakest = max(well, key=lambda lp: lp[1].min_tv)
        crit = [p.critical for _, p in powers if p.kind == "chi-square"]
        rows.append({
            "property": name,
            "name": CAMPAIGNS[name].name if name in CAMPAIGNS else name.replace("_", " "),
            "profile": profile,
            "trials": trials,
            "tests": len(powers),
            "alpha": ALPHA,
            "test_alpha": ALPHA / len(powers),
            "critical_values": (min(crit), max(crit)),
            "power": POWER,
            "min_detectable_tv": weakest.min_tv,
            "weakest_test": label,
            "weakest_n": float(weakest.n),
            "rare_tests": len(powers) - len(well),
            "best_min_detectable_tv": min(p.min_tv for _, p in powers if p.kind == "chi-square"),
            "per_test": [{"label": label, "kind": p.kind, "n": float(p.n), "dof": p.dof, "critical": p.critical,
                          "min_tv": p.min_tv} for label, p in powers],
        })
    return rows


def power_table(profiles=("dev", "ci", "gpu", "nightly")) -> str:
    """`campaign_power` as the Markdown table the module docstring states: tests, critical values,
    the best token law's d and the weakest principal test (with its expected n) at ci; the
    weakest principal test's d at every profile."""
    rows = {p: campaign_power(p) for p in profiles}
    ci = rows.get("ci", rows[profiles[0]])
    lines = [f"| property | tests | critical values | min TV {'/'.join(profiles)} | best law at ci "
             "| weakest test at ci (n) |", "|---|---:|---|---|---:|---|"]
    for i, r in enumerate(ci):
        lo, hi = r["critical_values"]
        tvs = "/".join(f"{rows[p][i]['min_detectable_tv']:.3f}" for p in profiles)
        weakest = r["weakest_test"].removeprefix("closed forms, ")
        lines.append(f"| {r['property']} | {r['tests']} | {lo:.1f}-{hi:.1f} | {tvs} | "
                     f"{r['best_min_detectable_tv']:.3f} | {weakest} ({r['weakest_n']:,.0f}) |")
    return "\n".join(lines)


# -- registration -------------------------------------------------------------------

DRAFT_NEED = {"model": "model_drafts", "one_hot": "one_hot_drafts"}  # a campaign's draft mode, as a need
SEQUENCE_PROPERTIES = ("distribution_sequences", "distribution_block_sequences", "block_closed_forms")


def _register(name: str, **record):
    """Register campaign `CAMPAIGNS[name]` as a property; `record`: the rest of its `register` call."""
    campaign = CAMPAIGNS[name]

    def check(ctx, _drawn) -> None:
        trials = TRIALS.get(ctx.profile, TRIALS["dev"])
        result = run_campaign(ctx.sampler, campaign, trials)
        ctx.stats.setdefault("fits", []).extend(result.fits)
        check_campaign(result, f"V={campaign.vocab}, K={campaign.steps}, T={campaign.temperatures}, "
                               f"drafts {'/'.join(campaign.distinct_patterns)}")

    check.__doc__ = (f"Over {campaign.name} and many seeds, each emitted token and the acceptance length fit the "
                     f"target (fixed seeds, family-wise false-positive rate {ALPHA:g}).")
    method = methods.lookup(campaign.verification)
    needs = ("fast", DRAFT_NEED[campaign.draft_mode], *campaign.param_names, *method.needs)
    register(name, "distribution", needs=needs, **record)(check)


_register("distribution_model_drafts", cost=200, slow=True,
          why_kept=("Test of fit over drafts drawn with the salted drafter stream: the only property that sees a "
                    "shared draft/resample stream in a sampler with its own RNG."))
_register("distribution_one_hot_drafts", cost=180, slow=True,
          why_kept="Test of fit for one-hot drafts, including a padded last draft: fast samplers only.")
_register("distribution_saturated_residuals", cost=190, slow=True,
          why_kept=("Test of fit where p and q are saturated on the same tokens (an empty residual falls back to p) "
                    "and padded drafts carry model logits: the residual branches a sampler with its own RNG can only "
                    "be checked on here."))
_register("distribution_sampling_params", cost=210, slow=True,
          why_kept=("Test of fit against the masked p (top-k, top-p, min-p) with drafts from the unmasked q: the "
                    "only check of the masks for a sampler with its own RNG."))
if set(CAMPAIGNS) - set(PROPERTIES):
    raise RuntimeError(f"campaigns without a property: {sorted(set(CAMPAIGNS) - set(PROPERTIES))} (register each)")


@register("closed_forms", "distribution", needs=("fast", "model_drafts"), cost=170, slow=True,
          why_kept=("Acceptance rate min(1, p/q) and residual law per draft token: fast samplers only; with its own "
                    "RNG a sampler is checked only by the tests of fit."))
def closed_forms(ctx, _drawn) -> None:
    """Per draft token (padded included): acceptance is min(1, p/q); a rejection resamples max(p - q, 0)/Z, else p."""
    result = run_closed_forms(ctx.sampler, TRIALS.get(ctx.profile, TRIALS["dev"]))
    ctx.stats.setdefault("fits", []).extend(result.fits)
    check_campaign(result, "V=8, K=1, T=0.8, each draft token enumerated, random and saturated rows")

