"""The random streams are Triton's, bit for bit (SPEC section 3).

Each stream family says how its NumPy bits are checked against Triton
(`StreamFamily.triton_check`); the `philox_streams` property runs the check of every shipped
family. `check_philox_matches_triton`, the check of `triton-philox`, compares the NumPy Philox
of `rs_verify.contract.philox` and the family's acceptance uniforms and resampling noise with
`tl.randint` / `tl.rand` run in the probe kernel of `rs_verify.harness.stream_probe` (the
compiled kernel on a GPU, the interpreter on CPU). It needs triton (and torch) at call time only.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..harness import stream_probe
from ..contract import philox
from ..contract.streams import report_mismatch, resolve_path, shipped
from ..contract.triton_philox import TRITON_PHILOX
from .registry import PropertyFailure, register

__all__ = ["check_philox_matches_triton", "EDGE_SEEDS", "EDGE_OFFSETS"]

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
# Values that broke ports before: the sign and word boundaries of both widths.
EDGE_SEEDS = [-1, 0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), -(2**31), -(2**31) - 1]
EDGE_OFFSETS = {
    "int64": [0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), -(2**31)],
    "int32": [0, 1, -1, 2**31 - 1, -(2**31), 255, 256],
}

CHAIN_ROWS = 8  # (seed, pos) pairs whose full resample chain is also checked
CHAIN_VOCAB = 37  # tokens per chained row (not a power of two: a masked tail)


def _as_offsets(offsets, offsets_dtype) -> np.ndarray:
    dtype = np.dtype(offsets_dtype)
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"offsets_dtype must be int32 or int64, got {dtype}")
    raw = np.asarray(offsets)
    if raw.dtype == dtype:
        return raw
    wide = raw.astype(np.int64)
    info = np.iinfo(dtype)
    if wide.size and (wide.min() < info.min or wide.max() > info.max):
        raise ValueError(f"offsets do not fit in {dtype}")
    return wide.astype(dtype)


def check_philox_matches_triton(seeds, offsets_dtype, offsets) -> None:
    """Reference Philox equals Triton's `tl.randint` and `tl.rand` bit for bit.

    - `seeds`: int64 seeds (any value of the int64 range), broadcast against `offsets`.
    - `offsets_dtype`: `np.int32` or `np.int64`, the dtype of the offsets in the kernel.
    - `offsets`: integer offsets that fit in `offsets_dtype`.

    Checked for both seed kinds: int64 seeds (the per-state seeds) and int32
    seeds (their low 32 bits, standing for a resample seed `g`, which Triton
    widens without sign extension). With int64 offsets it also runs the whole
    resample chain `g = randint(seed, pos)`, `rand(g, x)` in one kernel for a
    few pairs, and compares the `triton-philox` family's acceptance uniforms and noise there with
    the same formulas on Triton's bits. Raises `AssertionError` naming the first mismatching
    seed and offset and both values.
    """
    seeds64 = np.asarray(seeds)
    if seeds64.dtype != np.int64:
        seeds64 = seeds64.astype(np.int64)  # Python ints beyond int64 raise OverflowError
    offs = _as_offsets(offsets, offsets_dtype)
    seeds32 = seeds64.astype(np.int32)  # low 32 bits (NumPy's integer cast wraps)
    for kind, s in (("int64 seeds", seeds64), ("int32 seeds", seeds32)):
        at = {"seed": s, "offset": offs}
        report_mismatch(f"randint, {kind}, {offs.dtype} offsets", philox.randint(s, offs),
                        stream_probe.triton_randint(s, offs), at)
        report_mismatch(f"rand, {kind}, {offs.dtype} offsets", philox.rand(s, offs),
                        stream_probe.triton_rand(s, offs), at)
    if offs.dtype == np.int64:
        s_b, o_b = np.broadcast_arrays(seeds64, offs)
        s_c, o_c = s_b.reshape(-1)[:CHAIN_ROWS], o_b.reshape(-1)[:CHAIN_ROWS]
        x = np.arange(CHAIN_VOCAB, dtype=np.int32)
        g = philox.randint(s_c, o_c)
        ref = philox.rand(g[:, None], x[None, :])
        tri = stream_probe.triton_resample_noise(s_c, o_c, CHAIN_VOCAB)
        report_mismatch("resample chain rand(randint(seed, pos), x)", ref, tri,
                        {"seed": s_c[:, None], "pos": o_c[:, None], "g": g[:, None], "x": x[None, :]})
        _check_family(s_c, o_c, tri)


def _check_family(seeds: np.ndarray, pos: np.ndarray, v_triton: np.ndarray) -> None:
    """`triton-philox`'s acceptance uniforms and noise equal SPEC 3a's formulas on Triton's bits."""
    fam = TRITON_PHILOX
    u = fam.uniforms(seeds, pos)
    u_tri = np.maximum(stream_probe.triton_rand(seeds, pos), np.float32(fam.floor))
    g = fam.gumbel(seeds, pos, v_triton.shape[1])
    g_tri = -np.log(-np.log1p(-np.maximum(v_triton, np.float32(fam.floor)).astype(np.float64)))
    report_mismatch(f"{fam.name} acceptance uniforms (SPEC 3a on Triton's bits)", u, u_tri, {"seed": seeds, "pos": pos})
    report_mismatch(f"{fam.name} resampling noise (SPEC 3a on Triton's bits)", g, g_tri,
                    {"seed": seeds[:, None], "pos": pos[:, None], "x": np.arange(g.shape[1])[None, :]})


def family_checks() -> list:
    """`(family, check)` of every shipped family that says how its bits are checked against Triton."""
    out = []
    for fam in shipped():
        check = fam.triton_check
        if check is not None:
            out.append((fam, resolve_path(check) if isinstance(check, str) else check))
    return out


def _seed_offset_pairs(ctx):
    def pairs(dtype):
        lo, hi = INT64 if dtype == "int64" else INT32
        seeds = st.one_of(st.sampled_from(EDGE_SEEDS), st.integers(*INT64))
        offsets = st.one_of(st.sampled_from(EDGE_OFFSETS[dtype]), st.integers(lo, hi))
        return st.tuples(st.just(dtype), st.lists(st.tuples(seeds, offsets), min_size=1, max_size=64))

    return st.sampled_from(["int64", "int32"]).flatmap(pairs)


@register("philox_streams", "streams", strategy=_seed_offset_pairs, needs=("triton",), cost=40, self_check=True,
          why_kept=("Checks every shipped family's NumPy bits against Triton (Philox: tl.rand / tl.randint; murmur3: "
                    "its tl hash and noise), no sampler involved: the "
                    "certification and the edge campaigns are only as good as these streams."))
def philox_streams(ctx, drawn) -> None:
    """Every shipped stream family's NumPy bits equal Triton's (for triton-philox: tl.rand / tl.randint,
    int32/int64 seeds and offsets)."""
    dtype, pairs = drawn
    seeds = np.array([s for s, _ in pairs], dtype=np.int64)
    offsets = np.array([o for _, o in pairs], dtype=dtype)
    for fam, check in family_checks():
        try:
            check(seeds, dtype, offsets)
        except AssertionError as exc:
            raise PropertyFailure(f"stream family {fam.name}: {exc}") from exc
