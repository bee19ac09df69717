"""SPEC 3b's `murmur3-fp64` and the step-mixed block seed, against independent oracles: `mmh3` for
both hashes (hash seeds 0 and `0x9E3779B9`), Python's exact integer and float arithmetic for the
53-bit uniform, and the step seed `seed ^ (i << 32)` written out on Python ints."""

import math
import struct

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis.errors import InvalidArgument

from rs_verify.contract import murmur3, murmur3_fp64, streams
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.triton_philox import TRITON_PHILOX
from rs_verify.harness.record import DeclarationError, SamplerRecord
from rs_verify.reference import ReferenceSampler
from rs_verify.triton_sampler.streams import resample_key, resample_noise
from strategies import decision_batches
from strategies.facts import batch_facts

mmh3 = pytest.importorskip("mmh3")


@triton.jit
def _noise_probe(out_ptr, STREAM: tl.constexpr):
    """The noise of tokens 0..15 at seed 5, position 7 as the kernels choose it for STREAM."""
    idx = tl.arange(0, 16)
    pos = tl.full([16], 7, tl.int64)
    key = resample_key(tl.full([16], 5, tl.int64), pos, STREAM)
    tl.store(out_ptr + idx, resample_noise(key, pos, idx, idx < 16, STREAM).to(tl.float32))

FP64 = murmur3_fp64.MURMUR3_FP64
KEYS = [(s, p, t) for s in (0, -1, 2**63 - 1, -(2**63), 1234567890123) for p in (0, 2**32 + 5, 2**62 + 3)
        for t in (0, 151935, 2**31 - 1)]


def _noise_oracle(seed: int, pos: int, token: int) -> float:
    s = seed & (2**64 - 1)
    key = struct.pack("<IIII", s & 0xFFFFFFFF, s >> 32, pos & 0xFFFFFFFF, token)
    lo, hi = mmh3.hash(key, 0, signed=False), mmh3.hash(key, 0x9E3779B9, signed=False)
    r = ((hi << 32) | lo) >> 11
    u = (float(r) + 0.5) * 2.0**-53  # r < 2**53 is exact; the sum rounds to nearest
    u = 1.0 - 2.0**-53 if u == 1.0 else u
    return -math.log(-math.log(u))


def test_noise_matches_two_mmh3_hashes():
    seeds, pos, toks = (np.array([k[i] for k in KEYS], np.int64) for i in range(3))
    words = murmur3.key_words(seeds, pos, toks)
    got = murmur3_fp64.noise_from_hashes(murmur3.hash_words(*words), murmur3.hash_words(*words, hash_seed=0x9E3779B9))
    assert list(got) == [_noise_oracle(s, p, t) for s, p, t in KEYS]
    small = [k for k in KEYS if k[2] < 2**20]  # the family's noise function over a vocabulary
    assert [FP64.gumbel([s], [p], t + 1)[0, t] for s, p, t in small] == [_noise_oracle(*k) for k in small]
    assert np.array_equal(murmur3.hash_words(*murmur3.key_words(seeds, pos, toks), hash_seed=0x9E3779B9),
                          [mmh3.hash(struct.pack("<IIII", *[int(w) for w in murmur3.key_words(s, p, t)]),
                                     0x9E3779B9, signed=False) for s, p, t in KEYS])


def test_uniform_edges_and_clamp():
    """r = 0 gives 2**-54; r = 2**53 - 1 rounds to 1.0 and is clamped to 1 - 2**-53 (finite noise)."""
    lo = np.array([0, 0xFFFFFFFF, 0x7FF, 0xFFFFF800], np.uint32)
    hi = np.array([0, 0xFFFFFFFF, 0, 0xFFFFFFFF], np.uint32)
    u = murmur3_fp64.uniform_from_hashes(lo, hi)
    assert u[0] == 2.0**-54 and u[2] == 2.0**-54  # the low 11 bits are dropped
    assert u[1] == 1.0 - 2.0**-53 and u[3] == 1.0 - 2.0**-53
    g = murmur3_fp64.noise_from_hashes(lo, hi)
    assert np.isfinite(g).all() and g[1] > 36.7 and g[0] < -3.6


@pytest.mark.parametrize("kind, r", [("clamp", 2**53 - 1), ("zero", 0)])
def test_edge_keys_reach_their_edge(kind, r):
    """The shipped bank: every key gives its edge's r (checked with mmh3), on distinct tokens."""
    keys = murmur3_fp64.EDGE_KEYS[kind]
    assert len({t for _, _, t in keys}) == len(keys) >= 8
    for seed, pos, token in keys:
        s = seed & (2**64 - 1)
        key = struct.pack("<IIII", s & 0xFFFFFFFF, s >> 32, pos & 0xFFFFFFFF, token)
        assert ((mmh3.hash(key, 0x9E3779B9, signed=False) << 32) | mmh3.hash(key, 0, signed=False)) >> 11 == r


def test_scan_finds_keys_of_the_edge():
    keys = murmur3_fp64.scan_keys("zero", n=1, tokens=(0,), his=2**20)
    assert keys == (murmur3_fp64.EDGE_KEYS["zero"][0],)


def test_step_seed_mixes_the_step_into_the_high_word():
    for seed in (0, -1, 2**63 - 1, -(2**63), 123456789):
        for i in (0, 1, 7):
            want = ((seed & (2**64 - 1)) ^ (i << 32)) & (2**64 - 1)
            want = want - 2**64 if want >= 2**63 else want
            assert int(streams.step_seeds([seed], [i])[0]) == want
    u_plain = FP64.block_uniforms([5, 5], [10, 11], [0, 1])
    u_step = FP64.block_uniforms([5, 5], [10, 11], [0, 1], "step")
    assert u_step[0] == u_plain[0] and u_step[1] != u_plain[1]  # step 0 keeps the plain seed
    assert u_step[1] == TRITON_PHILOX.uniforms([5 ^ (1 << 32)], [11])[0]


def test_block_seed_is_declared_by_families_that_offer_it():
    assert streams.STEP in murmur3.MURMUR3.block_seeds and streams.STEP in FP64.block_seeds
    assert TRITON_PHILOX.block_seeds == (streams.PLAIN,)
    SamplerRecord(name="m", streams="murmur3", block_seed="step")
    with pytest.raises(DeclarationError, match="block_seed"):
        SamplerRecord(name="p", streams="triton-philox", block_seed="step")
    with pytest.raises(DeclarationError, match="block_seed"):
        SamplerRecord(name="m", streams="murmur3", block_seed="steps")
    with pytest.raises(ValueError, match="block_seed"):
        ReferenceSampler(streams="triton-philox", block_seed="step")
    with pytest.raises(ValueError, match="block_seeds"):
        streams.StreamFamily(name="x", section="3d", acceptance=FP64.acceptance, noise=FP64.noise,
                             block_seeds=("step",))


def _block_batch(rng, r=6, k=3, v=50):
    cu = np.arange(r + 1, dtype=np.int32) * (k + 1)
    n = int(cu[-1])
    return SpecBatch(target_logits=rng.normal(size=(n, v)).astype(np.float32),
                     draft_logits=rng.normal(size=(r, k, v)).astype(np.float32),
                     draft_token_ids=rng.integers(0, v, n).astype(np.int64), cu_num_logits=cu,
                     pos=np.arange(n, dtype=np.int64), idx_mapping=np.arange(r, dtype=np.int32),
                     temperature=np.ones(r, np.float32), seeds=rng.integers(-2**62, 2**62, r).astype(np.int64),
                     num_speculative_steps=k, verification="block")


def test_reference_block_seed_changes_only_later_steps():
    """The step-mixed seed keys steps i >= 1 only: requests that stop at step 0 agree, and over many
    block batches some decision differs (the reference really draws it)."""
    rng = np.random.default_rng(20261203)
    plain, step = ReferenceSampler(streams="murmur3"), ReferenceSampler(streams="murmur3", block_seed="step")
    assert plain.with_streams("murmur3", block_seed="step").block_seed == "step"
    differ = 0
    for _ in range(20):
        b = _block_batch(rng)
        a, c = plain(b), step(b)
        differ += int((a.sampled != c.sampled).any())
        tok = b.replace(verification="token")
        assert np.array_equal(plain(tok).sampled, step(tok).sampled)  # token-wise: the plain seed in both
    assert differ > 0


def test_the_strategies_read_the_declared_block_seed():
    """A step-seeded sampler's batches are tilted and labelled in its block uniforms (SPEC 3b): the
    record narrows the strategies to its block seed, the facts' step uniforms are the step-keyed
    ones (step 0 shares the plain seed), and a block seed the family does not draw is refused."""
    assert SamplerRecord(name="m", streams="murmur3", block_seed="step").strategy_kwargs()["block_seed"] == "step"
    assert "block_seed" not in SamplerRecord(name="m", streams="murmur3").strategy_kwargs()
    b = _block_batch(np.random.default_rng(5))
    k, cu = b.num_speculative_steps, b.cu_num_logits
    rows = (cu[:-1, None] + np.arange(k)[None, :]).ravel()
    want = murmur3.MURMUR3.block_uniforms(np.repeat(b.seeds, k), b.pos[rows], np.tile(np.arange(k), b.num_reqs), "step")
    step = batch_facts(b, "murmur3", "step").u_steps
    plain = batch_facts(b, "murmur3").u_steps
    assert np.array_equal(step.ravel(), want.astype(np.float64))
    assert np.array_equal(step[:, 0], plain[:, 0]) and not np.array_equal(step[:, 1:], plain[:, 1:])
    with pytest.raises(InvalidArgument, match="block_seed"):
        decision_batches(streams="triton-philox", block_seed="step").example()


def test_an_unknown_stream_draws_no_noise():
    """The kernels choose noise in one place (`streams.resample_noise`): a STREAM it does not know fails
    instead of drawing another family's noise (here under the interpreter; compiled, it fails to compile)."""
    out = torch.zeros(16, dtype=torch.float32)
    _noise_probe[(1,)](out, STREAM="murmur3")
    assert np.allclose(out.numpy(), murmur3.MURMUR3.gumbel([5], [7], 16)[0], rtol=1e-5)
    with pytest.raises(Exception, match="resample_key"):
        _noise_probe[(1,)](out, STREAM="murmur3-fp64")  # the record's name, not its kernel name "murmur3_fp64"
