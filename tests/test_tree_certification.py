"""Tree verification (SPEC 4c) caught at the ci profile: each planted tree defect of examples/tree_sampler.py
fails the property that guards it, each declared deviation certifies its sampler, and the tree strategy
reaches every draft kind and edge."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import no_shrink
from examples import tree_sampler as ts
from rs_verify.contract.tree import children, distinct_bounds, node_probs
from rs_verify.engine.context import make_context
from rs_verify.engine.runner import run
from rs_verify.properties import PROPERTIES
from rs_verify.reference import ReferenceSampler
from rs_verify.strategies import tree_batches


def _ci(prop, sampler, shrink=True):
    """`prop` at the ci profile's budget; `shrink=False` stops at the first failing example (a kill)."""
    return run(PROPERTIES[prop], make_context(sampler, ReferenceSampler(), profile="ci"), None if shrink else no_shrink())


pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("factory, prop, says", [
    (ts.forgets_residual, "certified_equivalence", "p~ excludes them|differ from the reference"),
    (ts.undeclared_raw_bonus, "certified_equivalence", "looks like `tree_bonus_unprocessed`"),
])
def test_a_tree_defect_fails_at_ci(factory, prop, says):
    outcome = _ci(prop, factory(), shrink=False)
    assert outcome.failure is not None, f"{prop} passed {factory.__name__}"
    assert any(s in outcome.failure.text() for s in says.split("|")), outcome.failure.text()


@pytest.mark.long
@pytest.mark.parametrize("factory, prop, says", [
    ("forgets_residual", "certified_equivalence", "differ from the reference|p~ excludes them"),
    ("forgets_residual", "output_invariants", "p~ excludes them"),
    ("undeclared_repeated_siblings", "certified_equivalence", "tree_duplicate_siblings"),
    ("undeclared_raw_bonus", "certified_equivalence", "tree_bonus_unprocessed"),
])
def test_a_tree_defect_fails_through_the_plugin(pytester, monkeypatch, factory, prop, says):
    """From an empty directory at the ci profile, as a sampler author's CI gates it."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    result = pytester.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler=examples.tree_sampler:{factory}",
                                           "--rs-profile", "ci", "-k", prop, "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert result.ret == 1 and any(s in text for s in says.split("|")), text[-3000:]


@pytest.mark.parametrize("factory", [ts.per_node_repeated, ts.raw_bonus])
def test_a_declared_tree_deviation_is_certified_and_counted(factory):
    sampler = factory()
    outcome = _ci("certified_equivalence", sampler)
    assert outcome.status == "passed", outcome.failure and outcome.failure.text()
    assert outcome.stats.get("stochastic_decisions", 0) >= 100


def _edges(b) -> set:
    """The kinds and edges a tree batch carries, read from the batch itself."""
    out = {b.tree_kind()}
    cu, vp = np.asarray(b.cu_num_logits), b.effective_vocab_size
    for r in range(b.num_reqs):
        lo, hi = int(cu[r]), int(cu[r + 1])
        par, tok = np.asarray(b.tree_parent[lo:hi]), np.asarray(b.draft_token_ids[lo:hi])
        for n, cs in enumerate(children(par)):
            real = [c for c in cs if 0 <= tok[c] < vp]
            if len(real) < len(cs):
                out.add("padded child")
            if len({int(tok[c]) for c in real}) < len(real) and b.node_draft_logits is None:
                out.add("duplicate one-hot siblings")
            if b.temperature[r] == 0 or not real:
                continue
            nd = b.node_draft_logits
            if nd is not None and any(np.isneginf(nd[lo + n, tok[c]]) for c in real):
                out.add("q~(x) = 0 sibling")
            if nd is not None and len(real) == 1 and np.array_equal(nd[lo + n, :vp], b.target_logits[lo + n, :vp]):
                out.add("empty residual after the last sibling")
            if nd is None and len(real) >= 2:
                p = node_probs(np.divide(b.target_logits[lo + n, :vp], b.temperature[r], dtype=np.float32))
                if b.accept_uniforms[lo + n] in distinct_bounds(p, [int(tok[c]) for c in real]):
                    out.add("coin on a bound")
    return out


def test_the_tree_strategy_reaches_every_kind_and_edge():
    seen = set()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    # the empty-residual edge is planted only without sampling parameters (they would make p differ from Q)
    @given(tree_batches(sampling_params=("min_p", "top_k", "top_p")) | tree_batches()
           | tree_batches(tree_uniforms="per_node"))
    def draw(b):
        seen.update(_edges(b))

    draw()
    assert seen >= {"one_hot", "iid", "without_replacement", "padded child", "duplicate one-hot siblings",
                    "q~(x) = 0 sibling", "empty residual after the last sibling", "coin on a bound"}, seen


def test_certification_draws_every_tree_kind_often():
    """The draft kind of a tree batch is content, uniform over the declared kinds: of the 60 batches
    certification draws at ci for the Triton sampler (about half of them trees), each kind makes at least 6.
    A structural draw leaned to the first kind (30 one-hot, 1 iid, 2 without replacement of 33 trees), and
    a break of the renormalised `Q~` that only a batch drawn without replacement can show was then
    certified by one example."""
    from rs_verify.properties.inputs import certifiable_batches
    from rs_verify.triton_sampler import TritonSampler

    ctx = make_context(TritonSampler(block_v=32, streams="explicit"), ReferenceSampler(), profile="ci")
    kinds = Counter()

    @settings(settings.get_profile("ci"), max_examples=60, suppress_health_check=list(HealthCheck))
    @given(certifiable_batches(ctx))
    def draw(b):
        kinds[b.tree_kind() if b.verification == "tree" else b.verification] += 1

    draw()
    assert min(kinds[k] for k in ("one_hot", "iid", "without_replacement")) >= 6, kinds


def test_the_tree_verifying_reference_is_a_built_in_sampler():
    """`reference-explicit` and `reference-explicit-per-node` name the reference verifying trees (SPEC 4c), so
    the plugin gates it from an empty directory; one coin per node declares one-hot trees only."""
    from rs_verify.harness.record import record_of
    from rs_verify.harness.samplers import load_sampler

    child, node = (record_of(load_sampler(n)) for n in ("reference-explicit", "reference-explicit-per-node"))
    assert "tree" in child.verification_methods and child.tree_uniforms == "per_child"
    assert child.tree_drafts == {"one_hot", "iid", "without_replacement"}
    assert node.tree_uniforms == "per_node" and node.tree_drafts == {"one_hot"}
