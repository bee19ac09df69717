"""Chunk planner (SPEC section 7)."""

import numpy as np
import pytest

from rs_verify import SpecBatch, iter_request_chunks, max_chunk_logits, select_requests, slice_batch, validate
from rs_verify.properties.transforms import merge_unrelated, reseeded_copies


def test_no_requests_no_chunks():
    assert list(iter_request_chunks(np.array([0], np.int32), 4)) == []


def test_max_chunk_logits():
    assert max_chunk_logits(152064) == 2**30 // (152064 * 4)
    assert max_chunk_logits(2**31) == 1
    with pytest.raises(ValueError):
        max_chunk_logits(0)


# -- the explicit noise moves with its rows and requests (SPEC sections 3c and 7) ----------------


def _noisy_batch():
    """Four requests of 2, 1, 3 and 2 rows whose noise names its row or request: `pos` and
    `accept_uniforms` follow the row, `resample_*` the request (state `idx_mapping[r]`)."""
    cu = np.array([0, 2, 3, 6, 8], np.int32)
    n, v = 8, 5
    idx = np.array([3, 0, 4, 1], np.int32)
    return SpecBatch(
        target_logits=np.arange(n * v, dtype=np.float32).reshape(n, v) / 8, draft_logits=None,
        draft_token_ids=np.zeros(n, np.int64), cu_num_logits=cu, pos=np.arange(n, dtype=np.int64) + 100,
        idx_mapping=idx, temperature=np.ones(5, np.float32), seeds=np.arange(5, dtype=np.int64),
        num_speculative_steps=2,
        accept_uniforms=(np.arange(n) + 1) / 16.0,
        resample_gumbel=idx[:, None] * 10.0 + np.arange(v),
        resample_uniforms=(idx + 1) / 8.0,
    )


def _assert_noise_follows(sub, full, reqs):
    """Request `i` of `sub` is request `reqs[i]` of `full`: its rows' and its own noise, bit for bit."""
    validate(sub)
    for i, r in enumerate(reqs):
        rows, old = sub.request_rows(i), full.request_rows(int(r))
        assert np.asarray(sub.pos)[rows.start:rows.stop].tolist() == np.asarray(full.pos)[old.start:old.stop].tolist()
        assert sub.accept_uniforms[rows.start:rows.stop].tobytes() == full.accept_uniforms[old.start:old.stop].tobytes()
        assert sub.resample_gumbel[i].tobytes() == full.resample_gumbel[int(r)].tobytes()
        assert sub.resample_uniforms[i] == full.resample_uniforms[int(r)]


@pytest.mark.parametrize("cap", [1, 2, 3, 4, 8])
def test_chunks_slice_the_noise_with_their_requests(cap):
    b = _noisy_batch()
    for start, end in iter_request_chunks(b.cu_num_logits, cap):
        _assert_noise_follows(slice_batch(b, start, end), b, range(start, end))


def test_permutations_and_splits_move_the_noise():
    b = _noisy_batch()
    for reqs in ([3, 1, 0, 2], [2], [1, 3], []):
        sub = select_requests(b, reqs)
        assert sub.noise_carried() == ("accept_uniforms", "resample_gumbel", "resample_uniforms")
        _assert_noise_follows(sub, b, reqs)


def test_merge_and_copies_keep_the_noise_and_add_fresh_noise():
    """Merged with unrelated requests, each request keeps its noise; the unrelated requests and the
    reseeded copies get fresh noise in range (their decisions are others)."""
    b = _noisy_batch()
    merged, where = merge_unrelated(b, np.random.default_rng(5))
    validate(merged)
    assert merged.resample_uniforms[where].tolist() == b.resample_uniforms.tolist()
    _assert_noise_follows(select_requests(merged, where), b, range(b.num_reqs))
    others = [i for i in range(merged.num_reqs) if i not in where]
    assert not np.isin(select_requests(merged, others).resample_uniforms, b.resample_uniforms).any()
    copies = reseeded_copies(b, 3, seed=1)
    _assert_noise_follows(copies, b, range(b.num_reqs))  # the drawn batch first, then its copies
    assert copies.resample_gumbel.shape == (12, 5) and len(set(copies.resample_uniforms.tolist())) == 12
