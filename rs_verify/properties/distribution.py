"""Distribution properties (SPEC section 8): fixed-seed tests of fit over many trials.

Every campaign gives every row of a request its own target p and draft q (a wrong-row
lookup cannot hide behind identical rows), spreads requests over several temperatures
and a shuffled `idx_mapping` with unreferenced states, and replicates the request over
many seeds and positions. Model drafts are drawn from q by Gumbel-max with the SPEC
noise at `pos + 2**30` (a salted drafter stream, as vLLM does): a sampler whose resample
shares the drafter's stream is then biased and fails, as does drafting with the unsalted
stream (`draft_salt=0`, the planted bias the tests use to prove power).

Decision rule: each campaign runs `m` tests of fit (chi-square on bins with expected
count >= 5, unsupported tokens must never appear) and fails when any p-value is below
`ALPHA / m`: the family-wise false-positive rate of a campaign is at most `ALPHA` = 1e-6
(Bonferroni), so a correct sampler fails one of these fixed-seed campaigns with
probability <= 1e-6 over the choice of seeds. Power: with n tokens in a position, a
bias of total variation d on that row's p gives a chi-square non-centrality of at least
about 4 n d^2 (Pinsker-type bound); at n >= 30,000 and d = 0.02 that is >= 48, far above
the ~45 (15 dof) critical value at p = 1e-7 plus its dof, so such biases fail with near
certainty; the planted-bias tests show it on real bugs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from ..spec import probs
from ..spec.batch import SpecBatch
from ..spec.chunking import select_requests
from .assertions import call
from .registry import PropertyFailure, register

ALPHA = 1e-6
MIN_EXPECTED = 5.0
DRAFT_SALT = 2**30
TRIALS = {"dev": 60_000, "ci": 200_000, "gpu": 400_000, "nightly": 2_000_000}


@dataclass(frozen=True)
class Campaign:
    name: str
    draft_mode: str = "model"  # "model" or "one-hot"
    vocab: int = 16
    steps: int = 3
    temperatures: tuple = (0.7, 1.0, 1.6)
    seed: int = 20261130
    draft_salt: int = DRAFT_SALT
    padded_last: bool = False  # one-hot only: the last draft is padded (-1)


@dataclass
class Fit:
    """One test of fit: tokens observed at one position of one temperature group."""

    label: str
    n: int
    observed: np.ndarray
    expected: np.ndarray  # probabilities
    statistic: float
    pvalue: float


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


def chisquare_fit(label: str, tokens: np.ndarray, expected: np.ndarray) -> Fit:
    """Chi-square test of fit of `tokens` to probabilities `expected` (small bins merged)."""
    v = expected.shape[0]
    obs = np.bincount(tokens[(tokens >= 0) & (tokens < v)], minlength=v).astype(np.float64)
    n = int(tokens.shape[0])
    out_of_support = int(n - obs.sum()) + int(obs[expected <= 0].sum())
    if out_of_support:
        return Fit(label, n, obs, expected, np.inf, 0.0)
    exp = expected * n
    big = exp >= MIN_EXPECTED
    f_obs = np.append(obs[big], obs[~big].sum())
    f_exp = np.append(exp[big], exp[~big].sum())
    keep = f_exp > 0
    f_obs, f_exp = f_obs[keep], f_exp[keep]
    if f_obs.shape[0] < 2:
        return Fit(label, n, obs, expected, 0.0, 1.0)
    f_exp = f_exp * (f_obs.sum() / f_exp.sum())
    stat, pvalue = stats.chisquare(f_obs, f_exp)
    return Fit(label, n, obs, expected, float(stat), float(pvalue))


def _rows(rng, c: Campaign):
    """Target and draft logits: each of the K + 1 rows its own p; q opposite-ranked on even steps."""
    x = rng.normal(0.0, 1.5, size=(c.steps + 1, c.vocab)).astype(np.float32)
    x[:, -1] = -np.inf  # a masked token in every row: it must never be emitted
    d = rng.normal(0.0, 1.5, size=(c.steps, c.vocab)).astype(np.float32)
    for i in range(0, c.steps, 2):  # a draft ranked opposite to the target exposes shared noise
        order = np.argsort(x[i, :-1])
        d[i, order] = np.sort(d[i, :-1])[::-1]
    return x, d


def draft_tokens_from_q(q_rows: np.ndarray, seeds: np.ndarray, pos: np.ndarray, salt: int) -> np.ndarray:
    """Gumbel-max draws from q with the SPEC resample noise keyed at `pos + salt` (int64 [n])."""
    from rs_verify.spec import philox  # the NumPy Philox: streams only, no sampler

    g = philox.randint(seeds, (pos + salt).astype(np.int64))
    x = np.arange(q_rows.shape[1], dtype=np.int32)
    v = np.maximum(philox.rand(g.view(np.uint32)[:, None], x[None, :]), np.float32(4.6566127342e-10))
    gumbel = -np.log(-np.log1p(-v.astype(np.float64)))
    with np.errstate(divide="ignore"):
        return np.argmax(np.log(q_rows) + gumbel, axis=1).astype(np.int64)


def build_batch(c: Campaign, trials: int, drafts: np.ndarray | None = None) -> tuple[SpecBatch, np.ndarray]:
    """The campaign's batch (one request per trial) and each request's temperature group.

    `drafts` (int64 [trials, steps]) forces the draft ids instead of drawing them.
    """
    rng = np.random.default_rng(c.seed)
    x, d = _rows(rng, c)
    k1 = c.steps + 1
    extra = max(1, trials // 8)
    s = trials + extra
    temps = np.asarray(c.temperatures, dtype=np.float32)
    group = np.arange(trials) % len(temps)
    idx = rng.permutation(s)[:trials].astype(np.int32)
    temperature = rng.choice(temps, size=s).astype(np.float32)
    temperature[idx] = temps[group]
    seeds = rng.integers(-(2**63), 2**63 - 1, size=s, dtype=np.int64, endpoint=True)
    base = rng.integers(0, 2**40, size=trials, dtype=np.int64)
    pos = (base[:, None] + np.arange(k1)).reshape(-1)
    draft_logits = None if c.draft_mode == "one-hot" else np.ascontiguousarray(np.broadcast_to(d, (s, *d.shape)))
    batch = SpecBatch(
        target_logits=np.tile(x, (trials, 1)),
        draft_logits=draft_logits,
        draft_token_ids=np.zeros(trials * k1, np.int64),
        cu_num_logits=(np.arange(trials + 1) * k1).astype(np.int32),
        pos=pos,
        idx_mapping=idx,
        temperature=temperature,
        seeds=seeds,
        num_speculative_steps=c.steps,
    )
    ids = np.zeros((trials, k1), np.int64)
    if drafts is not None:
        ids[:, 1:] = drafts
    elif c.draft_mode == "one-hot":
        p = probs.softmax64(x[: c.steps])
        # Fixed drafts: likely, unlikely and middling tokens of each row.
        picks = [np.argsort(-p[i])[[0, 3, 1][i % 3]] for i in range(c.steps)]
        ids[:, 1:] = picks
        if c.padded_last and c.steps:
            ids[:, -1] = -1
    else:
        rows = np.arange(trials * k1).reshape(trials, k1)[:, : c.steps]
        q = probs.draft_probs(batch)[rows.reshape(-1)]
        ids[:, 1:] = draft_tokens_from_q(q, seeds[np.repeat(idx, c.steps)], pos[rows.reshape(-1)],
                                         c.draft_salt).reshape(trials, c.steps)
    # vLLM layout: row j verifies draft_token_ids[j + 1]; the first entry of a request is unused.
    shifted = np.zeros((trials, k1), np.int64)
    shifted[:, 1:] = ids[:, 1:]
    return batch.replace(draft_token_ids=shifted.reshape(-1)), group


def acceptance_lengths(batch: SpecBatch, request: int) -> np.ndarray:
    """P(num_sampled = m) for m = 1..n + 1 of `request`, in closed form (SPEC section 4)."""
    sub = select_requests(batch, [request])
    n = sub.num_logits - 1
    p = probs.target_probs(sub)
    if sub.draft_logits is None:
        d = sub.draft_tokens(0)
        alpha = np.array([p[i, t] if 0 <= t < p.shape[1] else 0.0 for i, t in enumerate(d)])
    else:
        alpha = np.minimum(p[:n], probs.draft_probs(sub)[:n]).sum(axis=1)
    reach = np.concatenate([[1.0], np.cumprod(alpha)])
    return np.append(reach[:-1] * (1 - alpha), reach[-1])


def run_campaign(sampler, c: Campaign, trials: int) -> CampaignResult:
    """Run `sampler` on the campaign's batch and test every position and the acceptance lengths."""
    batch, group = build_batch(c, trials)
    out = call(sampler, batch)
    p = probs.target_probs(batch)
    k1 = c.steps + 1
    result = CampaignResult(c, trials)
    for g, t in enumerate(c.temperatures):
        reqs = np.flatnonzero(group == g)
        if reqs.size == 0:
            continue
        r0 = int(reqs[0])
        for i in range(k1):
            reached = reqs[out.num_sampled[reqs] > i]
            if reached.size == 0:
                continue
            result.fits.append(chisquare_fit(f"T={t} position {i}", out.sampled[reached, i], p[r0 * k1 + i]))
        lengths = out.num_sampled[reqs].astype(np.int64) - 1
        result.fits.append(chisquare_fit(f"T={t} acceptance length", lengths, acceptance_lengths(batch, r0)))
    return result


def check_campaign(result: CampaignResult, batch_hint: str) -> None:
    worst = result.worst()
    if worst.pvalue < result.threshold:
        v = worst.expected.shape[0]
        top = np.argsort(-np.abs(worst.observed / max(worst.n, 1) - worst.expected))[: min(v, 4)]
        detail = ", ".join(f"token {t}: {worst.observed[t] / max(worst.n, 1):.4f} vs {worst.expected[t]:.4f}"
                           for t in top)
        raise PropertyFailure(
            f"campaign {result.campaign.name!r} ({batch_hint}, {result.trials} trials): {worst.label} does not fit "
            f"the target: chi-square {worst.statistic:.1f}, p = {worst.pvalue:.3g} < {result.threshold:.3g} "
            f"(family-wise false-positive rate {ALPHA:g}); largest deviations: {detail}",
            details={"fits": result.fits},
        )


def run_closed_forms(sampler, trials: int, seed: int = 11) -> CampaignResult:
    """Per draft token d: acceptance frequency = min(1, p(d) / q(d)) (binomial test) and the
    rejected trials' tokens ~ max(p - q, 0) / Z (chi-square), the closed forms of SPEC section 4."""
    c = Campaign("closed forms", "model", vocab=8, steps=1, temperatures=(0.8,), seed=seed)
    v = c.vocab - 1  # the last token is masked
    drafts = (np.arange(trials) % v).astype(np.int64)[:, None]
    batch, _ = build_batch(c, trials, drafts=drafts)
    out = call(sampler, batch)
    p, q = probs.target_probs(batch), probs.draft_probs(batch)
    result = CampaignResult(c, trials)
    for d in range(v):
        reqs = np.flatnonzero(drafts[:, 0] == d)
        j = 2 * int(reqs[0])
        pd, qd = p[j], q[j]
        accepted = out.num_sampled[reqs] == 2
        want = min(1.0, pd[d] / qd[d])
        k, n = int(accepted.sum()), int(reqs.size)
        pval = 1.0 if want == 1.0 and k == n else (0.0 if want == 1.0 else stats.binomtest(k, n, want).pvalue)
        result.fits.append(Fit(f"draft {d}: acceptance {k}/{n} vs min(1, p/q) = {want:.4f}", n,
                               np.array([n - k, k], float), np.array([1 - want, want]), np.nan, float(pval)))
        resid = np.maximum(pd - qd, 0.0)
        rejected = reqs[~accepted]
        if rejected.size and resid.sum() > 0:
            result.fits.append(chisquare_fit(f"draft {d}: residual", out.sampled[rejected, 0], resid / resid.sum()))
    return result


CAMPAIGNS = {
    "distribution_model_drafts": Campaign("model drafts", "model"),
    "distribution_one_hot_drafts": Campaign("one-hot drafts", "one-hot", vocab=12, padded_last=True, seed=7),
}


def _register(name: str, campaign: Campaign):
    def check(ctx, _drawn) -> None:
        trials = TRIALS.get(ctx.profile, TRIALS["dev"])
        result = run_campaign(ctx.sampler, campaign, trials)
        ctx.stats.setdefault("fits", []).extend(result.fits)
        check_campaign(result, f"V={campaign.vocab}, K={campaign.steps}, T={campaign.temperatures}")

    check.__doc__ = (f"Over {campaign.draft_mode} drafts and many seeds, each emitted token and the acceptance "
                     "length fit the target (fixed seeds, family-wise false-positive rate 1e-6).")
    register(name, "distribution", needs=("fast",))(check)


for _name, _campaign in CAMPAIGNS.items():
    _register(_name, _campaign)


@register("closed_forms", "distribution", needs=("fast",))
def closed_forms(ctx, _drawn) -> None:
    """For every draft token, acceptance frequency is min(1, p/q) and the resample follows max(p - q, 0)/Z."""
    result = run_closed_forms(ctx.sampler, TRIALS.get(ctx.profile, TRIALS["dev"]))
    ctx.stats.setdefault("fits", []).extend(result.fits)
    check_campaign(result, "V=8, K=1, T=0.8, each draft token enumerated")
