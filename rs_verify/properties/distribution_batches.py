"""The batches of the distribution campaigns, and the law each of their tests compares against.

A campaign (`Campaign`) is one request shape (K draft steps, V tokens) replicated over many
trials: every row of a request has its own target p and draft q (a wrong-row lookup cannot
hide behind identical rows), the trials spread over several temperatures and a shuffled
`idx_mapping` with unreferenced states, and each trial has its own seed and positions.
Trial `i` takes temperature `i % len(temperatures)` and draft pattern
`(i // len(temperatures)) % len(patterns)`; a pattern names each step's draft kind:

- `q`: model drafts drawn from q by Gumbel-max with the triton-philox noise (SPEC 3a) at
  `pos + draft_salt` (a salted drafter stream, as vLLM does; the drafter is the suite's, so its
  stream does not follow the sampler's family); one-hot drafts: a fixed likely, unlikely or middling
  token of the row;
- `o`: a masked token (-inf in both rows of saturated rows), so p(d) = q(d) = 0: rejected,
  and the residual max(p - q, 0) is empty;
- `-`: a padded draft (-1): rejected, and the resample is p itself (SPEC section 4).

Rows are `random` (normal logits, one masked token per row, the draft ranked opposite to the
target on even steps) or `saturated`: target and draft logits identical, 0 on a support of
1, 2, 4 or 8 tokens (row i: `support_sizes[i % 4]`) and -1e4 or -inf elsewhere, so p = q is
uniform on that support, exactly in any floating-point format; a masked draft is rejected with
an empty residual max(p - q, 0) = 0, and SPEC section 4 falls back to p.

`plan_fits` lists a campaign's tests (fixed by the design, not by the outcome) with their
laws and expected counts; `closed_form_laws` does the same per draft token for `closed_forms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract import probs
from ..contract.batch import SpecBatch
from ..contract.chunking import select_requests
from ..contract.triton_philox import TRITON_PHILOX

DRAFT_SALT = 2**30
TRIALS = {"dev": 60_000, "ci": 200_000, "gpu": 400_000, "nightly": 2_000_000}  # trials per campaign and profile
FILLER = -1e4  # underflows to probability 0 at every temperature used here, in any precision
# At a tie p(d) = q(d) (saturated rows), a float32 sampler compares log p(d) with log u + log q(d)
# rounded to float32: for |log q(d)| < 2**7 an ulp is <= 2**-17, so the comparison can flip only
# when -log u is within an ulp or two of 0, probability about 2**-17 per decision. The laws allow
# 2**-16 (the float64 reference never flips); the tail tests then admit a few such rejections.
TIE_SLACK = 2.0**-16
KIND_NAMES = {"q": "drafts from q", "o": "drafts outside q's support (empty residual)", "-": "padded drafts"}


@dataclass(frozen=True)
class Campaign:
    name: str
    draft_mode: str = "model"  # "model" or "one_hot"
    vocab: int = 16
    steps: int = 3
    temperatures: tuple = (0.7, 1.0, 1.6)
    seed: int = 20261130
    draft_salt: int = DRAFT_SALT
    patterns: tuple = ()  # draft kinds per step; () means ("q" * steps,); repeats weigh a pattern
    rows: str = "random"  # "random" or "saturated"
    support_sizes: tuple = (1, 2, 4, 8)  # saturated rows
    filler: bool = True  # saturated rows: half the tokens off the support at -1e4 (the rest -inf)
    verification: str = "token"  # SPEC section 4 ("token") or 4b ("block")
    # Sampling parameters (SPEC section 2) per temperature: one dict of top_k / top_p / min_p values
    # per entry of `temperatures` (() for none). The target rows are masked, the drafts are not.
    params: tuple = ()
    # rows = "given": the target's and the drafter's probabilities, `(p [K + 1][V], q [K][V])`, as
    # nested tuples (logits log p and log q; a probability of 0 is a masked token, logit -inf).
    given: tuple = ()

    def __post_init__(self):
        for pat in self.draft_patterns:
            if len(pat) != self.steps or set(pat) - set(KIND_NAMES):
                raise ValueError(f"{self.name}: pattern {pat!r} needs {self.steps} kinds out of {sorted(KIND_NAMES)}")
            if "o" in pat and (self.draft_mode, self.rows) != ("model", "saturated"):
                raise ValueError(f"{self.name}: kind 'o' needs model drafts on saturated rows")
        if self.params and len(self.params) != len(self.temperatures):
            raise ValueError(f"{self.name}: params needs one dict per temperature")

    @property
    def param_names(self) -> tuple:
        """The sampling parameters the campaign sets (SPEC section 2), as declarations name them."""
        return tuple(sorted({k for d in self.params for k in d}))

    @property
    def draft_patterns(self) -> tuple:
        return self.patterns or ("q" * self.steps,)

    @property
    def distinct_patterns(self) -> tuple:
        return tuple(dict.fromkeys(self.draft_patterns))

    def kind_name(self, kind: str) -> str:
        return "fixed one-hot drafts" if kind == "q" and self.draft_mode == "one_hot" else KIND_NAMES[kind]


def _rows(rng, c: Campaign):
    """Target logits float32 [K + 1, V] and draft logits [K, V] (see the module docstring)."""
    k1, v = c.steps + 1, c.vocab
    if c.rows == "given":
        with np.errstate(divide="ignore"):
            x, d = (np.log(np.array(a, np.float64)).astype(np.float32) for a in c.given)
        return x, d
    if c.rows == "saturated":
        x = np.where(rng.random((k1, v)) < 0.5 * c.filler, np.float32(FILLER), np.float32(-np.inf)).astype(np.float32)
        x[:, -1] = -np.inf
        for i in range(k1):  # row i: a support of support_sizes[i % len] tokens, never the masked last one
            x[i, rng.choice(v - 1, size=c.support_sizes[i % len(c.support_sizes)], replace=False)] = 0.0
        return x, x[: c.steps].copy()
    x = rng.normal(0.0, 1.5, size=(k1, v)).astype(np.float32)
    x[:, -1] = -np.inf  # a masked token in every row: it must never be emitted
    d = rng.normal(0.0, 1.5, size=(c.steps, v)).astype(np.float32)
    for i in range(0, c.steps, 2):  # a draft ranked opposite to the target exposes shared noise
        order = np.argsort(x[i, :-1])
        d[i, order] = np.sort(d[i, :-1])[::-1]
    return x, d


def draft_tokens_from_q(q_rows: np.ndarray, seeds: np.ndarray, pos: np.ndarray, salt: int) -> np.ndarray:
    """Gumbel-max draws from q with the triton-philox resample noise keyed at `pos + salt` (int64 [n])."""
    gumbel = TRITON_PHILOX.gumbel(seeds, (pos + salt).astype(np.int64), q_rows.shape[1])
    with np.errstate(divide="ignore"):
        return np.argmax(np.log(q_rows) + gumbel, axis=1).astype(np.int64)


def assignment(c: Campaign, trials: int) -> tuple[np.ndarray, np.ndarray]:
    """Each trial's temperature index and distinct-pattern index (int64 [trials] each)."""
    i = np.arange(trials)
    nt = len(c.temperatures)
    distinct = c.distinct_patterns
    which = np.array([distinct.index(p) for p in c.draft_patterns])
    return i % nt, which[(i // nt) % len(c.draft_patterns)]


def build_batch(c: Campaign, trials: int, drafts: np.ndarray | None = None):
    """The campaign's batch (one request per trial), each request's temperature and pattern index.

    `drafts` (int64 [trials, steps]) forces the draft ids instead of drawing them by pattern.
    """
    rng = np.random.default_rng(c.seed)
    x, d = _rows(rng, c)
    k1 = c.steps + 1
    s = trials + max(1, trials // 8)
    temps = np.asarray(c.temperatures, dtype=np.float32)
    group, pattern = assignment(c, trials)
    idx = rng.permutation(s)[:trials].astype(np.int32)
    temperature = rng.choice(temps, size=s).astype(np.float32)
    temperature[idx] = temps[group]
    seeds = rng.integers(-(2**63), 2**63 - 1, size=s, dtype=np.int64, endpoint=True)
    base = rng.integers(0, 2**40, size=trials, dtype=np.int64)
    pos = (base[:, None] + np.arange(k1)).reshape(-1)
    draft_logits = None if c.draft_mode == "one_hot" else np.ascontiguousarray(np.broadcast_to(d, (s, *d.shape)))
    params = _state_params(c, temperature, temps)
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
        verification=c.verification,
        **params,
    )
    ids = np.zeros((trials, k1), np.int64)
    if drafts is not None:
        ids[:, 1:] = drafts
    else:
        kinds = kind_matrix(c)[pattern]
        if c.draft_mode == "one_hot":
            p = probs.softmax64(x[: c.steps])
            # Fixed drafts: likely, unlikely and middling tokens of each row.
            ids[:, 1:] = [np.argsort(-p[i])[[0, 3, 1][i % 3]] for i in range(c.steps)]
        else:
            # Every state shares the draft rows d: q depends on the temperature and step only.
            q_table = np.stack([probs.softmax64(probs.process(d, t)) for t in temps])  # [T, K, V]
            req, step = np.nonzero(kinds == "q")
            ids[req, 1 + step] = draft_tokens_from_q(q_table[group[req], step], seeds[idx[req]],
                                                     pos[req * k1 + step], c.draft_salt)
            for i in range(c.steps):  # "o": a masked (-inf) draft token, p(d) = q(d) = 0 in any precision
                out = kinds[:, i] == "o"
                if out.any():
                    ids[out, 1 + i] = rng.choice(np.flatnonzero(np.isneginf(d[i])), size=int(out.sum()))
        ids[:, 1:][kinds == "-"] = -1
    # vLLM layout: row j verifies draft_token_ids[j + 1]; the first entry of a request is unused.
    return batch.replace(draft_token_ids=ids.reshape(-1)), group, pattern


def _state_params(c: Campaign, temperature: np.ndarray, temps: np.ndarray) -> dict:
    """Per-state top_k / top_p / min_p arrays: each state takes its temperature's entry of `c.params`."""
    if not c.params:
        return {}
    group = np.searchsorted(np.sort(temps), temperature)
    order = np.argsort(temps)
    out = {}
    for name, dtype, off in (("top_k", np.int32, 0), ("top_p", np.float32, 1.0), ("min_p", np.float32, 0.0)):
        if name in c.param_names:
            values = np.array([c.params[i].get(name, off) for i in order], dtype=dtype)
            out[name] = values[group]
    return out


def kind_matrix(c: Campaign) -> np.ndarray:
    """The draft kind of each distinct pattern and step ('<U1' [patterns, K])."""
    return np.array([list(p) for p in c.distinct_patterns]).reshape(len(c.distinct_patterns), c.steps)


def _log_probs(logits: np.ndarray, temperature) -> np.ndarray:
    """Float64 log-softmax of the processed logits (finite for -1e4 fillers, where p underflows)."""
    z = probs.process(logits, temperature).astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def acceptance_probability(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """P(accept d) of a model draft d, `log p(d) > log u + log q(d)` (SPEC section 4): min(1, p/q),
    0 when p(d) = 0, 1 when q(d) = 0 < p(d). At a tie (0 <= log p - log q < `TIE_SLACK`) a float32
    sampler may round the comparison the other way for u within `TIE_SLACK` of 1: 1 - TIE_SLACK."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = logp - logq
        alpha = np.where(r >= 0, 1.0, np.exp(np.minimum(r, 0.0)))
    alpha = np.where((r >= 0) & (r < TIE_SLACK), 1.0 - TIE_SLACK, alpha)
    alpha = np.where(np.isneginf(logq) & ~np.isneginf(logp), 1.0, alpha)
    return np.where(np.isneginf(logp), 0.0, alpha)


def acceptance_lengths(batch: SpecBatch, request: int, from_q=True) -> np.ndarray:
    """P(num_sampled = m) for m = 1..n + 1 of `request`, in closed form (SPEC section 4).

    `from_q` (per step, or one bool): a model draft drawn from q is accepted with probability
    sum_x q(x) P(accept x) (= sum(min(p, q)) away from ties); a given model draft d with
    `acceptance_probability`; a one-hot draft with p(d); a padded or out-of-range draft never.
    """
    sub = select_requests(batch, [request])
    n = sub.num_logits - 1
    state = int(sub.idx_mapping[0])
    t = sub.temperature[state]
    v = sub.effective_vocab_size
    logp = _log_probs(probs.processed_logits(sub)[:n], 1.0)  # SPEC 2: temperature, then the masks
    d = sub.draft_tokens(0)
    valid = (d >= 0) & (d < v)
    ds = np.where(valid, d, 0)
    rows = np.arange(n)
    if sub.draft_logits is None:
        alpha = np.exp(logp[rows, ds])
    else:
        logq = _log_probs(sub.draft_logits[state, :n, :v], t)
        each = acceptance_probability(logp, logq)
        drawn = (np.exp(logq) * each).sum(axis=1)
        alpha = np.where(np.broadcast_to(from_q, (n,)), drawn, each[rows, ds])
    alpha = np.where(valid, alpha, 0.0)
    reach = np.concatenate([[1.0], np.cumprod(alpha)])
    return np.append(reach[:-1] * (1 - alpha), reach[-1])


@dataclass(frozen=True)
class FitPlan:
    """One test of a campaign: which requests it observes and the law they follow."""

    label: str
    temp: int  # temperature index
    position: int | None  # the emitted token at this position; None: the acceptance length
    pattern: int | None  # acceptance length: of this distinct pattern
    kind: str | None  # position: only requests whose draft at `position` has this kind (None: all)
    expected: np.ndarray
    n: float  # expected number of observations


def plan_fits(c: Campaign, batch: SpecBatch, group: np.ndarray, pattern: np.ndarray, counts: np.ndarray) -> list:
    """The campaign's tests: per temperature, the token at each position over every request that
    reaches it, and over those with each draft kind there (when kinds differ); per temperature and
    pattern, the acceptance length. `counts[t, u]`: the trials with temperature t and pattern u;
    `batch` holds at least one request of every such pair (its rows are the campaign's)."""
    kinds = kind_matrix(c)
    plans = []
    for g, t in enumerate(c.temperatures):
        reach, laws, p = {}, {}, None
        for u, pat in enumerate(c.distinct_patterns):
            if counts[g, u] == 0:
                continue
            r0 = int(np.flatnonzero((group == g) & (pattern == u))[0])
            if p is None:
                p = probs.target_probs(select_requests(batch, [r0]))
            laws[u] = acceptance_lengths(batch, r0, from_q=kinds[u] == "q")
            reach[u] = laws[u][::-1].cumsum()[::-1]  # P(length >= i): the request reaches position i
        for i in range(c.steps + 1):
            n = sum(counts[g, u] * reach[u][i] for u in reach)
            if n > 0:
                plans.append(FitPlan(f"T={t} position {i}", g, i, None, None, p[i], n))
            present = sorted({kinds[u, i] for u in reach if reach[u][i] > 0}) if i < c.steps else []
            for kind in present if len(present) > 1 else []:
                n = sum(counts[g, u] * reach[u][i] for u in reach if kinds[u, i] == kind)
                plans.append(FitPlan(f"T={t} position {i}, {c.kind_name(kind)}", g, i, None, kind, p[i], n))
        for u in laws:
            label = f"T={t} acceptance length, drafts {c.distinct_patterns[u]!r}"
            plans.append(FitPlan(label, g, None, u, None, laws[u], float(counts[g, u])))
    return plans


def counts_of(c: Campaign, trials: int) -> np.ndarray:
    """Trials per (temperature, distinct pattern) at `trials` trials (int64 [T, patterns])."""
    group, pattern = assignment(c, trials)
    shape = (len(c.temperatures), len(c.distinct_patterns))
    return np.bincount(group * shape[1] + pattern, minlength=shape[0] * shape[1]).reshape(shape)


def closed_form_drafts(c: Campaign, trials: int) -> np.ndarray:
    """The drafts `closed_forms` enumerates, cycled over the trials: -1 (padded) and every token."""
    return (np.arange(trials) % (c.vocab + 1) - 1).astype(np.int64)[:, None]


def closed_form_laws(c: Campaign, batch: SpecBatch, drafts: np.ndarray) -> list:
    """Per enumerated draft d (one step, model drafts): (d, acceptance probability, law of the
    token emitted on rejection or None when d is always accepted, what that law is)."""
    laws = []
    for d in np.unique(drafts[:, 0]):
        r0 = int(np.flatnonzero(drafts[:, 0] == d)[0])
        want = float(acceptance_lengths(batch, r0, from_q=False)[1])
        sub = select_requests(batch, [r0])
        p, q = probs.target_probs(sub)[0], probs.draft_probs(sub)[0]
        resid = np.maximum(p - q, 0.0) if d >= 0 else np.zeros_like(p)
        if want == 1.0:
            law, what = None, ""
        elif d < 0:
            law, what = p, "resample from p"
        elif resid.sum() > 0:
            law, what = resid / resid.sum(), "residual max(p - q, 0)"
        else:
            law, what = p, "empty residual: falls back to p"
        laws.append((int(d), want, law, what))
    return laws
