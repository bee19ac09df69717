"""Chunk planner (SPEC section 7)."""

import numpy as np
import pytest

from rs_verify import iter_request_chunks, max_chunk_logits


def test_no_requests_no_chunks():
    assert list(iter_request_chunks(np.array([0], np.int32), 4)) == []


def test_max_chunk_logits():
    assert max_chunk_logits(152064) == 2**30 // (152064 * 4)
    assert max_chunk_logits(2**31) == 1
    with pytest.raises(ValueError):
        max_chunk_logits(0)
