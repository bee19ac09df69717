"""The tree campaign (SPEC 4c and 8): the path's first and second tokens follow the target, for each
`tree_drafts` kind the sampler declares.

One fixed tree per request (`TREE_PARENTS`: the root with three children, the first of them with two,
the second with one; `K = 2`), `V = 8`, `T = 1`. A node's target row and draft row depend only on its
token path (the root's rows, then one pair of rows per first token), as a model's would: the law of
the second token after first token `x` is `p_x` whichever sibling carried `x`. The children are drawn
as the kind declares, per request, from a fixed generator: one-hot trees take fixed tokens (a repeated
sibling included), `iid` independent draws from the parent's `Q`, `without_replacement` a draw without
replacement in sampling order (Gumbel top-k). The batch carries its noise (SPEC 3c), drawn from the
same generator: the campaign is the same for every run.

Tests, per kind: the first emitted token against `p_root` over every request; the second token
against `p_x` over the requests whose first token `x` was accepted (`num_sampled >= 2`; recursive
rejection sampling at the accepted node emits `p_x` whatever its subtree): `1 + V` chi-square tests.

Decision rule (as `rs_verify.properties.distribution`): fail when a p-value is below `ALPHA / m` over
the `m` tests of the kinds run, a family-wise false-positive rate of at most `ALPHA = 1e-6` over the
choice of the fixed seeds. Power (`tree_power`, scipy.stats, no sampler run): with the 27 tests of three
kinds, the first-token test detects every bias of total variation >= d with probability 0.99, d = 0.044
at dev (10,000 requests per kind), 0.022 at ci (40,000), 0.014 at gpu, 0.007 at nightly. A sampler that
forgets to update the residual after a rejected child (`examples.tree_sampler:forgets_residual`) moves
the first token's law by a total variation of 0.16 (one-hot), 0.22 (iid) and 0.11 (without replacement)
here, measured over 40,000 requests each (a correct float32 sampler: 0.004 to 0.005, sampling noise);
tests/test_tree_distribution.py runs both with the fixed seeds.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..contract.batch import SpecBatch
from ..contract.methods import TREE
from .assertions import campaign_call
from .distribution_fit import ALPHA, POWER, chisquare_fit, chisquare_power
from .distribution import CampaignResult, check_campaign
from .registry import register

__all__ = ["TREE_PARENTS", "TREE_TRIALS", "tree_batch", "tree_campaign", "tree_laws", "tree_power"]

TREE_TRIALS = {"dev": 10_000, "ci": 40_000, "gpu": 100_000, "nightly": 400_000}  # requests per kind and profile
TREE_PARENTS = (-1, 0, 0, 0, 1, 1, 2)  # root; three children; two under the first, one under the second
VOCAB, STEPS, SEED = 8, 2, 20261205
ONE_HOT_TOKENS = (3, 5, 3, 1, 6, 0)  # nodes 1..6: the third child repeats the first's token


def _rows(rng):
    """Target and draft logits: the root's, and one row of each per first token (float32)."""
    target = rng.normal(0.0, 1.2, (1 + VOCAB, VOCAB)).astype(np.float32)
    draft = (target + rng.normal(0.0, 0.9, target.shape)).astype(np.float32)
    return target, draft


def _softmax(x) -> np.ndarray:
    z = np.asarray(x, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def tree_laws() -> tuple[np.ndarray, np.ndarray]:
    """`(p_root [V], p_after [V, V])`: the first token's law and the second's after each first token."""
    target, _ = _rows(np.random.default_rng(SEED))
    return _softmax(target[0]), _softmax(target[1:])


def _draw(rng, q: np.ndarray, c: int, kind: str) -> np.ndarray:
    """`c` children per row of `q` `[n, V]`, drawn as `kind` declares."""
    n = q.shape[0]
    if kind == "iid":
        u = rng.random((n, c, 1))
        return (u > np.cumsum(q, axis=1)[:, None, :]).sum(axis=2).clip(0, VOCAB - 1)
    keys = np.log(q) + rng.gumbel(size=q.shape)  # Gumbel top-k: without replacement, in sampling order
    return np.argsort(-keys, axis=1, kind="stable")[:, :c]


def tree_batch(kind: str, trials: int) -> SpecBatch:
    """The campaign's batch for one draft kind (`"one_hot"`, `"iid"`, `"without_replacement"`)."""
    rng = np.random.default_rng([SEED, ("one_hot", "iid", "without_replacement").index(kind)])
    target, draft = _rows(np.random.default_rng(SEED))
    size = len(TREE_PARENTS)
    if kind == "one_hot":
        tokens = np.tile(np.array((0, *ONE_HOT_TOKENS)), (trials, 1))
    else:
        q = _softmax(draft)
        tokens = np.zeros((trials, size), np.int64)
        tokens[:, 1:4] = _draw(rng, np.repeat(q[:1], trials, 0), 3, kind)
        tokens[:, 4:6] = _draw(rng, q[1 + tokens[:, 1]], 2, kind)
        tokens[:, 6:7] = _draw(rng, q[1 + tokens[:, 2]], 1, kind)
    first = np.zeros((trials, size), np.int64)  # a node's row: the root's, or that of its first token
    first[:, 1:4] = 1 + tokens[:, 1:4]
    first[:, 4:6] = (1 + tokens[:, 1])[:, None]
    first[:, 6] = 1 + tokens[:, 2]
    rows = first.reshape(-1)
    n = trials * size
    return SpecBatch(
        target_logits=target[rows], draft_logits=None, draft_token_ids=tokens.reshape(-1),
        cu_num_logits=(np.arange(trials + 1) * size).astype(np.int32), pos=np.tile(np.arange(size), trials),
        idx_mapping=np.arange(trials, dtype=np.int32), temperature=np.ones(trials, np.float32),
        seeds=np.arange(trials, dtype=np.int64), num_speculative_steps=STEPS, verification=TREE.name,
        tree_parent=np.tile(np.array(TREE_PARENTS, np.int32), trials),
        node_draft_logits=None if kind == "one_hot" else draft[rows], tree_drafts="iid" if kind == "one_hot" else kind,
        accept_uniforms=rng.integers(1, 2**53, n).astype(np.float64) * 2.0**-53,
        resample_gumbel=-np.log(-np.log(rng.integers(1, 2**53, (trials, VOCAB)).astype(np.float64) * 2.0**-53)),
        resample_uniforms=rng.integers(1, 2**53, trials).astype(np.float64) * 2.0**-53)


def tree_campaign(sampler, kinds, trials: int) -> CampaignResult:
    """Run `sampler` on each kind's batch and test the first and second tokens (module docstring)."""
    p_root, p_after = tree_laws()
    result = CampaignResult(SimpleNamespace(name="tree paths"), trials)
    for kind in kinds:
        out = campaign_call(sampler, tree_batch(kind, trials))
        first = out.sampled[:, 0]
        result.fits.append(chisquare_fit(f"{kind} trees: first token", first, p_root))
        on = out.num_sampled >= 2
        for x in range(VOCAB):
            result.fits.append(chisquare_fit(f"{kind} trees: second token after accepted {x}",
                                             out.sampled[on & (first == x), 1], p_after[x]))
    return result


def tree_power(trials: int, kinds: int = 3):
    """The first-token test's power (`distribution_fit.Power`): the least total variation detected with
    probability `POWER` at `trials` requests, with the Bonferroni level of `kinds * (1 + V)` tests."""
    p_root, _ = tree_laws()
    return chisquare_power(p_root, trials, ALPHA / (kinds * (1 + VOCAB)), POWER)


@register("distribution_tree", "distribution", needs=("fast", "tree_verification"), cost=190, slow=True,
          why_kept=("Test of fit of the tree path's first and second tokens for each declared tree_drafts kind: "
                    "the only check of tree verification for a sampler with its own RNG."))
def distribution_tree(ctx, _drawn) -> None:
    """Over fixed trees of each declared kind and many requests, the path's first and second tokens fit the
    target (fixed seeds, family-wise false-positive rate 1e-6)."""
    kinds = [k for k in ("one_hot", "iid", "without_replacement") if k in ctx.record.tree_drafts]
    trials = TREE_TRIALS.get(ctx.profile, TREE_TRIALS["dev"])
    result = tree_campaign(ctx.sampler, kinds, trials)
    ctx.stats.setdefault("fits", []).extend(result.fits)
    check_campaign(result, f"V={VOCAB}, K={STEPS}, T=1, tree {TREE_PARENTS}, kinds {'/'.join(kinds)}")
