"""The Triton sampler's decisions equal the float64 reference's, except excused near-ties."""

from rs_verify.engine.runner import pytest_run


def test_certified_equivalence(triton_sampler, reference):
    pytest_run("certified_equivalence", triton_sampler, reference)
