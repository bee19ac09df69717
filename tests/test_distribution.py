"""Distribution (SPEC section 8): fixed-seed tests of fit, and proof of their power on planted biases."""

import dataclasses

import pytest

from mutants.mutation import load_patched
from rs_verify.properties import PropertyFailure
from rs_verify.properties import distribution as dist
from rs_verify.engine.runner import pytest_run

CAMPAIGN_PROPERTIES = ["distribution_model_drafts", "distribution_one_hot_drafts", "closed_forms"]


@pytest.mark.parametrize("prop", CAMPAIGN_PROPERTIES)
def test_distribution(prop, reference):
    pytest_run(prop, reference)


@pytest.mark.parametrize("prop", CAMPAIGN_PROPERTIES)
def test_distribution_triton(prop, triton_sampler):
    """On CUDA (>= 200,000 trials per campaign in the ci and gpu profiles); skipped under the interpreter."""
    pytest_run(prop, triton_sampler)


# Planted biases in a copy of the reference (the files on disk stay untouched), each with the
# campaign that must reject it at the profile's trial count.
PLANTED = {
    "residual |p - q| instead of max(p - q, 0)": (
        {"slab.py": [("np.maximum(r, 0.0, out=r)", "np.abs(r, out=r)")]}, "distribution_model_drafts"),
    "temperature applied to the target only": (
        {"slab.py": [("return divide(q, self.row_temp[rows], out=q)", "return q")]}, "closed_forms"),
    "one-hot residual keeps the rejected draft": (
        {"slab.py": [("logr[np.arange(rej.size), d] = -np.inf", "pass")]}, "distribution_one_hot_drafts"),
}


def _run(name, sampler, profile="ci", campaign=None):
    trials = dist.TRIALS[profile]
    if name == "closed_forms":
        result = dist.run_closed_forms(sampler, trials)
    else:
        result = dist.run_campaign(sampler, campaign or dist.CAMPAIGNS[name], trials)
    dist.check_campaign(result, name)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bias_is_detected(bug):
    patches, prop = PLANTED[bug]
    mutant = load_patched("reference", patches).ReferenceSampler()
    with pytest.raises(PropertyFailure, match="does not fit"):
        _run(prop, mutant)


def test_unsalted_drafter_is_detected(reference):
    """Drafts drawn with the resample's own noise stream (no salt) bias the output (DESIGN: shared
    draft/resample noise); the same campaign with the salted stream passes (test_distribution)."""
    campaign = dataclasses.replace(dist.CAMPAIGNS["distribution_model_drafts"], draft_salt=0)
    with pytest.raises(PropertyFailure, match="does not fit"):
        _run("distribution_model_drafts", reference, campaign=campaign)

