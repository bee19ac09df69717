"""The processed-logits buffer stays within the cap (SPEC section 7)."""

from rs_verify.runner import pytest_run


def test_buffer_within_cap(triton_sampler):
    pytest_run("buffer_within_cap", triton_sampler)
