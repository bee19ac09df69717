"""SPEC section 3: the NumPy Philox of `rs_verify.contract.philox` is Triton's `tl.randint` / `tl.rand`, bit for bit.

Runs the probe kernel of `rs_verify.harness.stream_probe` (compiled on a GPU, the
interpreter on CPU). The values that broke ports before are always included:
-1, 0, 2**31 - 1, 2**31, 2**32, the int64 extremes, negative and >= 2**31
offsets, and negative int32 seeds (Triton widens a resample seed without sign
extension).
"""

import importlib

import numpy as np
import pytest

from rs_verify.contract.streams import family as lookup, report_mismatch, resolve_path
from rs_verify.properties.streams import EDGE_OFFSETS, EDGE_SEEDS, INT32, INT64, check_philox_matches_triton

pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [np.int64, np.int32], ids=["int64", "int32"])
def test_philox_matches_triton_4096(dtype):
    """4096 (seed, offset) pairs: the edge values, then uniform draws over each dtype's range."""
    rng = np.random.default_rng(20261130)
    n = 4096
    lo, hi = INT64 if dtype is np.int64 else INT32
    seeds = rng.integers(*INT64, size=n, dtype=np.int64, endpoint=True)
    offsets = rng.integers(lo, hi, size=n, dtype=np.int64, endpoint=True).astype(dtype)
    seeds[: len(EDGE_SEEDS)] = EDGE_SEEDS
    offsets[: len(EDGE_OFFSETS[np.dtype(dtype).name])] = EDGE_OFFSETS[np.dtype(dtype).name]
    # Half the seeds small, so that int32 seeds hit both signs and the zero high word.
    seeds[n // 2 :] >>= 33
    check_philox_matches_triton(seeds, dtype, offsets)


def test_seed_grid_broadcasts():
    """A seed column against an offset row (the resample layout) checks every pair."""
    seeds = np.array(EDGE_SEEDS, dtype=np.int64)[:, None]
    offsets = np.arange(-3, 40, dtype=np.int32)[None, :]
    check_philox_matches_triton(seeds, np.int32, offsets)


def test_mismatch_is_reported(monkeypatch):
    """The check is not vacuous: a port that sign-extends int32 seeds fails it, naming the pair."""
    from rs_verify.contract import philox

    def sign_extending(fn):
        def draw(seed, offsets):
            seed = np.asarray(seed)
            return fn(seed.astype(np.int64) if seed.dtype == np.int32 else seed, offsets)

        return draw

    monkeypatch.setattr(philox, "randint", sign_extending(philox.randint))
    monkeypatch.setattr(philox, "rand", sign_extending(philox.rand))
    seeds = np.array([7, -5, 2**32 - 5], dtype=np.int64)  # low words 7, -5, -5
    with pytest.raises(AssertionError, match=r"int32 seeds.*first at seed=-5 \(int32\), offset=3"):
        check_philox_matches_triton(seeds, np.int32, np.array([3, 3, 3], dtype=np.int32))


def _nudged(fn):
    """`fn` with its result's last entry moved by about 2**-10 (beyond every check's tolerance)."""
    def draw(*args, **kwargs):
        out = np.array(fn(*args, **kwargs))
        flat = out.reshape(-1)
        flat[-1] = flat[-1] * (1 + 2**-10) + 2**-10
        return out

    return draw


@pytest.mark.parametrize("family, module, attr", [
    ("triton-philox", "rs_verify.contract.philox", "rand"),
    ("murmur3", "rs_verify.contract.murmur3", "uniform_from_hash"),
    ("murmur3-fp64", "rs_verify.contract.murmur3_fp64", "noise_from_hashes"),
])
def test_every_family_check_reports_a_mismatch_the_same_way(monkeypatch, family, module, attr):
    """Each shipped family's Triton check fails on a contract off by about 2**-10 in one value, and names it
    through the one report (`contract.streams.report_mismatch`): how many differ, the first one's
    coordinates and both values."""
    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, attr, _nudged(getattr(mod, attr)))
    check = lookup(family).triton_check
    check = resolve_path(check) if isinstance(check, str) else check
    seeds = np.array([3, -7, 2**40 + 1], dtype=np.int64)
    with pytest.raises(AssertionError,
                       match=r": [1-9]\d* of \d+ values differ; first at seed=-?\d+ \(int\d+\), .*: contract .* vs triton "):
        check(seeds, np.int64, np.array([0, 5, 2**33], dtype=np.int64))


def test_report_compares_floats_by_their_bits():
    """`-0.0` against `0.0` is a mismatch (bit for bit); equal values are not reported."""
    at = {"seed": np.arange(3)}
    report_mismatch("same", np.zeros(3, np.float32), np.zeros(3, np.float32), at)
    with pytest.raises(AssertionError, match=r"1 of 3 values differ; first at seed=2 \(int64\): "
                                             r"contract 0\.0 \(bits 0x00000000\) vs triton -0\.0 \(bits 0x80000000\)"):
        report_mismatch("signed zero", np.zeros(3, np.float32), np.array([0.0, 0.0, -0.0], np.float32), at)
