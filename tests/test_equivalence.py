"""Chunked == full, black-box chunking, batch invariance and determinism, bit for bit."""

import pytest


def test_the_compared_output_includes_cu_num_generated_tokens():
    """SPEC section 7: `LogprobsTensors.cat` keeps the full batch's `cu_num_generated_tokens` and it is
    compared: two outputs that differ only there (a chunk's own list) are not the same output."""
    import numpy as np

    from rs_verify import LogprobsTensors, SamplerOutput
    from rs_verify.properties.assertions import assert_same_output
    from rs_verify.properties.registry import PropertyFailure

    def out(cu):
        lp = LogprobsTensors(np.zeros((4, 1), np.int64), np.zeros((4, 1), np.float32), np.ones(4, np.int64), cu)
        return SamplerOutput(np.zeros((2, 2), np.int64), np.ones(2, np.int32), lp)

    assert_same_output(out([0, 2, 4]), out([0, 2, 4]), what="same", batch=None)
    for other in ([0, 2], None):
        with pytest.raises(PropertyFailure, match="logprobs.cu_num_generated_tokens"):
            assert_same_output(out(other), out([0, 2, 4]), what="chunked vs full", batch=None)
