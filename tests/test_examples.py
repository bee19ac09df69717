"""The third-party example sampler: public types only, SPEC Philox bit for bit (its properties, certification
included, run in tests/test_properties.py)."""

import ast
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from examples.torch_sampler import murmur3_hash, murmur3_noise, philox_rand, philox_randint  # noqa: E402

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


def test_murmur3_port_matches_an_independent_murmurhash3():
    """The example's int64 port of SPEC 3b: its hash equals the mmh3 package's MurmurHash3_x86_32 of the
    16-byte key (seeds and positions at the int64 edges, positions above 2**32, large token ids), and its
    noise is the contract's (u = 1.0 included: the planted top edge gets the finite floored noise)."""
    mmh3 = pytest.importorskip("mmh3")
    from rs_verify.contract.murmur3 import MURMUR3

    seeds, pos = _pairs(512)
    pos = np.abs(pos)
    tok = np.random.default_rng(7).integers(0, 2**31, seeds.size)
    tok[:3] = [0, 2**31 - 1, 151935]
    words = [seeds & 0xFFFFFFFF, (seeds >> 32) & 0xFFFFFFFF, pos & 0xFFFFFFFF, tok]
    got = murmur3_hash(*(torch.from_numpy(np.ascontiguousarray(w, np.int64)) for w in words)).numpy()
    key = np.stack(words, 1).astype("<u4").tobytes()
    assert [mmh3.hash(key[16 * i : 16 * i + 16], 0, signed=False) for i in range(seeds.size)] == got.tolist()
    v = 300
    g = murmur3_noise(torch.from_numpy(seeds)[:, None], torch.from_numpy(pos)[:, None], torch.arange(v)[None, :])
    np.testing.assert_allclose(g.numpy(), MURMUR3.gumbel(seeds, pos, v), rtol=1e-14, atol=1e-14)
    for s, p, x in (MURMUR3.edges.top_noise, MURMUR3.edges.tiny_noise):
        one = murmur3_noise(torch.tensor([s]), torch.tensor([p]), torch.tensor([x])).item()
        assert one == pytest.approx(MURMUR3.gumbel([s], [p], x + 1)[0, x], rel=1e-14)
