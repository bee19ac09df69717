"""Fixtures: the samplers under test, built once per session."""

import os

import pytest

from rs_verify.reference import ReferenceSampler
from rs_verify.harness import device
from rs_verify.triton_sampler import TritonSampler

SAMPLERS = ["reference", "triton"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: `pytest -n 2` on 2 cores, with tests that start their
    # own subprocesses, is oversubscribed already.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def reference():
    return ReferenceSampler()


@pytest.fixture(scope="session")
def triton_sampler():
    # Tiny vocab blocks under the interpreter so small vocabularies still take multi-block reductions.
    return TritonSampler(block_v=16) if device.interpreted() else TritonSampler()


@pytest.fixture(params=SAMPLERS)
def sampler(request, reference):
    return reference if request.param == "reference" else request.getfixturevalue("triton_sampler")
