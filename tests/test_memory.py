"""The processed-logits buffer stays within the cap (SPEC section 7)."""

import pytest

from rs_verify.engine.runner import pytest_run


def test_buffer_within_cap(triton_sampler):
    pytest_run("buffer_within_cap", triton_sampler)


@pytest.mark.gpu
def test_peak_memory_within_cap(triton_sampler):
    pytest_run("peak_memory_within_cap", triton_sampler)
