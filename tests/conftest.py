"""Fixtures: the samplers under test, built once per session."""

import os

import pytest
from hypothesis import Phase, settings

from rs_verify.reference import ReferenceSampler
from rs_verify.harness import device
from rs_verify.triton_sampler import TritonSampler

SAMPLERS = ["reference", "triton"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: `pytest -n 2` on 2 cores, with tests that start their
    # own subprocesses, is oversubscribed already.
    import torch

    torch.set_num_threads(1)


# The default run gates the samplers that run slowly here (the Triton sampler under the
# interpreter, the torch example on CPU) at an eighth of the active profile's examples (5 of ci's
# 40; certification 8 of its 60: about 250 stochastic decisions compared at the ci profile, above
# the floor of 100; a quarter took 68 s of CPU instead of 19): every property and strategy path
# still runs on them, and the reference takes the whole budget (tests/test_properties.py). The
# whole budget on the Triton sampler is the README's main job (`rs-verify check`, the gate itself)
# and this suite with RS_VERIFY_FULL=1 (the long run: `RS_VERIFY_FULL=1 pytest -n 2`); on CUDA the
# tests always take it. Tests marked `long` (the slow samplers' distribution campaigns, CLI twins
# of plugin tests, end-to-end runs covered by lighter tests) run in the long run only.
SHARE = 0.125
LONG_RUN = bool(os.environ.get("RS_VERIFY_FULL"))


def budget(shared: bool):
    """The Hypothesis settings a property test starts from: SHARE of the profile's examples for a
    sampler gated at a share, else None (the profile's)."""
    if not shared:
        return None
    base = settings.get_profile(settings._current_profile)
    return settings(base, max_examples=max(1, round(base.max_examples * SHARE)))


def no_shrink(profile: str = "ci") -> settings:
    """The profile's settings without the shrink phase: a test that asserts only that a defect fails (a kill,
    and what its failure says) stops at the first failing example, the same one on every run (the ci profile
    is derandomized); shrinking it took most of such a test's time (up to 10 s of CPU per failure)."""
    return settings(settings.get_profile(profile), phases=[Phase.explicit, Phase.reuse, Phase.generate])


def pytest_collection_modifyitems(config, items):
    if LONG_RUN:
        return
    skip = pytest.mark.skip(reason="long run only (RS_VERIFY_FULL=1 pytest -n 2)")
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reference():
    return ReferenceSampler()


@pytest.fixture(scope="session")
def triton_sampler():
    # 256-lane vocab blocks under the interpreter: the drawn vocabularies straddle its multiples
    # (strategies.block_edge_vocab_sizes: about 255-769 and the tiny sizes), so most rows take
    # multi-block reductions and partial tail tiles. The interpreter's cost is per `tl` op whatever
    # the lanes, so narrower blocks only add loop trips: the Triton property tests took 149 s of CPU
    # with 16-lane blocks, 128 s with 32, 108 s with 256 and 102 s with 1024 (2-core CPU machine,
    # 2026-12-01). The smoke tests build their own 16- and 32-lane samplers.
    return TritonSampler(block_v=256) if device.interpreted() else TritonSampler()


@pytest.fixture(params=SAMPLERS)
def sampler(request, reference):
    return reference if request.param == "reference" else request.getfixturevalue("triton_sampler")
