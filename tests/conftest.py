"""Fixtures: the samplers under test, built once per session."""

import os

import pytest
from hypothesis import settings

from rs_verify.reference import ReferenceSampler
from rs_verify.harness import device
from rs_verify.triton_sampler import TritonSampler

SAMPLERS = ["reference", "triton"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: `pytest -n 2` on 2 cores, with tests that start their
    # own subprocesses, is oversubscribed already.
    import torch

    torch.set_num_threads(1)


# The default run checks the Triton sampler's properties, under the interpreter, at a quarter of
# the active profile's examples (10 of ci's 40): every property and strategy path still runs on it,
# and the reference takes the whole budget. The whole budget on the Triton sampler is the
# README's main job (`rs-verify check`, the gate itself) and this suite with RS_VERIFY_FULL=1 (the
# long run: `RS_VERIFY_FULL=1 pytest -n 2`); on CUDA the tests always take it.
TRITON_SHARE = 0.25


def budget(sampler):
    """The Hypothesis settings a property test of `sampler` starts from (None: the profile's)."""
    if getattr(sampler, "name", None) != "triton" or not device.interpreted() or os.environ.get("RS_VERIFY_FULL"):
        return None
    base = settings.get_profile(settings._current_profile)
    return settings(base, max_examples=max(1, round(base.max_examples * TRITON_SHARE)))


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
