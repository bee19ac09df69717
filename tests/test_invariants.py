"""Output invariants and the greedy argmax chain (SPEC sections 4 and 5)."""

import pytest

from rs_verify.engine.runner import pytest_run


@pytest.mark.parametrize("prop", ["output_invariants", "greedy_chain"])
def test_invariants(prop, sampler):
    pytest_run(prop, sampler)
