"""Bad input (SPEC section 9)."""

from rs_verify.engine.runner import pytest_run


def test_rejects_bad_input(sampler):
    pytest_run("rejects_bad_input", sampler)


def test_unvalidated_in_bounds(triton_sampler):
    pytest_run("unvalidated_in_bounds", triton_sampler)
