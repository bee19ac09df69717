"""Chunked == full, black-box chunking, batch invariance and determinism, bit for bit."""

import pytest

from rs_verify.engine.runner import pytest_run


@pytest.mark.parametrize("prop", ["chunked_equals_full", "blackbox_chunking", "batch_invariance", "determinism",
                                  "determinism_large_batch"])
def test_equivalence(prop, sampler):
    pytest_run(prop, sampler)
