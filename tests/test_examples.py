"""The third-party example sampler: public types only, SPEC Philox bit for bit (its properties, certification
included, run in tests/test_properties.py)."""

import ast
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from examples.torch_sampler import philox_rand, philox_randint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EDGE = [0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), -(2**31), -(2**31) - 1]


def test_written_against_the_public_types_only():
    allowed = {"SpecBatch", "SamplerOutput", "LogprobsTensors", "validate"}
    for name in ("torch_sampler.py", "broken_sampler.py"):
        tree = ast.parse((ROOT / "examples" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
                if node.module == "rs_verify":
                    assert {a.name for a in node.names} <= allowed, name
                    continue
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] not in ("rs_verify", "reference", "strategies", "triton"), (name, mod)


def _pairs(n=4096):
    rng = np.random.default_rng(20261130)
    seeds = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    offsets = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    seeds[: len(EDGE)] = EDGE
    offsets[len(EDGE) : 2 * len(EDGE)] = EDGE
    offsets[2 * len(EDGE) : 3 * len(EDGE)] = EDGE
    seeds[2 * len(EDGE) : 3 * len(EDGE)] = EDGE
    return seeds, offsets


def test_philox_matches_the_reference_bit_for_bit():
    from rs_verify.contract import philox

    seeds, offsets = _pairs()
    s, o = torch.from_numpy(seeds), torch.from_numpy(offsets)
    assert np.array_equal(philox_randint(s, o).numpy(), philox.randint(seeds, offsets))
    assert np.array_equal(philox_rand(s, o).numpy().view(np.uint32), philox.rand(seeds, offsets).view(np.uint32))
    # int32 seeds (the resample seed g) and int32 offsets (token ids): widened without sign extension.
    g, x = seeds.astype(np.int32), offsets.astype(np.int32)
    got = philox_rand(torch.from_numpy(g), torch.from_numpy(x), seed_is_int32=True, offset_is_int32=True)
    assert np.array_equal(got.numpy().view(np.uint32), philox.rand(g, x).view(np.uint32))
    # The resample layout: a column of seeds against a row of token offsets.
    g = philox.randint(seeds[:64], offsets[:64])
    tok = np.arange(37, dtype=np.int32)
    got = philox_rand(torch.from_numpy(g)[:, None], torch.from_numpy(tok)[None, :], seed_is_int32=True,
                      offset_is_int32=True)
    assert np.array_equal(got.numpy().view(np.uint32), philox.rand(g[:, None], tok[None, :]).view(np.uint32))


def test_sign_extension_would_be_caught():
    """Not vacuous: widening a negative int32 seed with sign extension changes the draws."""
    g = torch.tensor([-5, -(2**31)], dtype=torch.int32)
    x = torch.arange(8, dtype=torch.int64)[None, :]
    right = philox_randint(g[:, None], x, seed_is_int32=True, offset_is_int32=True)
    wrong = philox_randint(g[:, None].to(torch.int64), x, seed_is_int32=False, offset_is_int32=True)
    assert not torch.equal(right, wrong)
