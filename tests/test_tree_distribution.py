"""The tree campaign (SPEC 4c, 8): its stated power, a correct tree sampler fitting it and one that forgets
to update the residual failing it, with the campaign's fixed seeds."""

import pytest

from examples.tree_sampler import TreeSampler, forgets_residual, per_node
from rs_verify.properties.distribution import check_campaign
from rs_verify.properties.distribution_tree import TREE_TRIALS, tree_campaign, tree_power
from rs_verify.properties.registry import PropertyFailure
from rs_verify.reference import ReferenceSampler

KINDS = ("one_hot", "iid", "without_replacement")


def test_the_stated_power():
    """The docstring's d per profile (chi-square power with the Bonferroni level of 27 tests)."""
    got = {p: round(tree_power(TREE_TRIALS[p]).min_tv, 3) for p in TREE_TRIALS}
    assert got == {"dev": 0.044, "ci": 0.022, "gpu": 0.014, "nightly": 0.007}


@pytest.mark.parametrize("sampler, kinds", [(TreeSampler(), KINDS), (per_node(), ("one_hot",))],
                         ids=["per_child", "per_node"])
def test_a_correct_tree_sampler_fits(sampler, kinds):
    check_campaign(tree_campaign(sampler, kinds, TREE_TRIALS["dev"]), "tree campaign")


@pytest.mark.parametrize("kind", KINDS)
def test_a_sampler_that_forgets_the_residual_fails(kind):
    """Power: the first token's law moves by a total variation of 0.11 to 0.22 (the module docstring)."""
    result = tree_campaign(forgets_residual(), (kind,), TREE_TRIALS["dev"])
    with pytest.raises(PropertyFailure, match=f"{kind} trees: first token does not fit"):
        check_campaign(result, "tree campaign")


@pytest.mark.long
def test_the_reference_fits_at_ci():
    check_campaign(tree_campaign(ReferenceSampler(streams="explicit"), KINDS, TREE_TRIALS["ci"]), "tree campaign")
