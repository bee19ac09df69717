"""Fixtures: the samplers under test, built once per session."""

import pytest

SAMPLERS = ["reference", "triton"]


@pytest.fixture(scope="session")
def reference():
    from reference import ReferenceSampler

    return ReferenceSampler()


@pytest.fixture(scope="session")
def triton_sampler():
    from rs_verify.engine.runner import cuda_available
    from rs_verify.triton_sampler import TritonSampler

    # Tiny vocab blocks on CPU so small vocabularies still take multi-block reductions.
    return TritonSampler() if cuda_available() else TritonSampler(block_v=16)


@pytest.fixture(params=SAMPLERS)
def sampler(request, reference):
    return reference if request.param == "reference" else request.getfixturevalue("triton_sampler")
