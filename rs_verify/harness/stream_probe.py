"""A probe Triton kernel that draws `tl.rand` / `tl.randint` exactly as a sampler kernel would.

Used by `rs_verify.properties.streams` to prove that the NumPy Philox in
`rs_verify.contract.philox` reproduces Triton bit for bit (SPEC section 3), on the GPU or
under the Triton interpreter on CPU. Seeds are loaded from memory inside the
kernel, as a sampler does. An int64 seed tensor gives an int64 seed. An int32
seed tensor stands for the resample seed `g = tl.randint(seed, pos)`: Triton's
`tl.randint` returns a *uint32* block, so the probe bitcasts the loaded int32
to uint32 and Triton widens it to 64 bits without sign extension, as the
resample path `tl.rand(g, x)` does. (A seed held as `tl.int32` IS sign
extended by `tl.rand`, on triton 3.9's interpreter at least: a sampler that
stores `g` in an int32 buffer and reloads it must bitcast it back to uint32.
`signed_seed=True` reproduces that trap.) `triton_resample_noise` runs the
whole chain in one kernel. Offsets are int32 or int64 tensors.

torch and triton are imported lazily, so importing this module is cheap.
"""

from __future__ import annotations

import sys

import numpy as np

from . import device

__all__ = ["probe_device", "triton_rand", "triton_randint", "triton_resample_noise"]

BLOCK = 1024

_KERNELS = None


def _ensure_backend():
    """Make the suite's backend choice if triton has not been imported yet."""
    if "triton" not in sys.modules:
        device.resolve()


def probe_device() -> str:
    """`"cuda"` when kernels run compiled on a GPU, `"cpu"` under the Triton interpreter."""
    _ensure_backend()
    return "cpu" if device.interpreted() else "cuda"


def _kernels():
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    _ensure_backend()
    import triton  # lazy: after the backend choice (see the module docstring)
    import triton.language as tl

    @triton.jit
    def _probe_kernel(
        seed_ptr, off_ptr, out_ptr, n, IS_RAND: tl.constexpr, SEED_U32: tl.constexpr, BLOCK: tl.constexpr
    ):
        # One seed per element, loaded with the dtype of seed_ptr (int64 or int32).
        pid = tl.program_id(0)
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        seed = tl.load(seed_ptr + idx, mask=mask, other=0)
        if SEED_U32:
            seed = seed.to(tl.uint32, bitcast=True)  # what tl.randint returns
        off = tl.load(off_ptr + idx, mask=mask, other=0)
        if IS_RAND:
            val = tl.rand(seed, off)
        else:
            val = tl.randint(seed, off)
        tl.store(out_ptr + idx, val, mask=mask)

    @triton.jit
    def _resample_noise_kernel(seed_ptr, pos_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
        # The sampler's resample pattern: one program per row, scalar int64 seed
        # loaded from memory, g = randint(seed, pos) kept as Triton returns it
        # (uint32), then rand(g, x) for int32 token offsets x.
        row = tl.program_id(0)
        seed = tl.load(seed_ptr + row)
        pos = tl.load(pos_ptr + row)
        g = tl.randint(seed, pos)
        for start in range(0, vocab, BLOCK):
            x = start + tl.arange(0, BLOCK)
            mask = x < vocab
            tl.store(out_ptr + row * vocab + x, tl.rand(g, x), mask=mask)

    _KERNELS = (_probe_kernel, _resample_noise_kernel)
    return _KERNELS


def _run(seed, offsets, is_rand: bool, signed_seed: bool = False) -> np.ndarray:
    import torch  # lazy: see the module docstring

    dev = probe_device()
    seed = np.asarray(seed)
    if seed.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise TypeError(f"seed must be int64 or int32, got {seed.dtype}")
    offsets = np.asarray(offsets)
    if offsets.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise TypeError(f"offsets must be int64 or int32, got {offsets.dtype}")
    shape = np.broadcast_shapes(seed.shape, offsets.shape)
    seeds = np.ascontiguousarray(np.broadcast_to(seed, shape)).reshape(-1)
    offs = np.ascontiguousarray(np.broadcast_to(offsets, shape)).reshape(-1)
    n = seeds.shape[0]
    out_dtype = torch.float32 if is_rand else torch.int32
    if n == 0:
        return np.zeros(shape, np.float32 if is_rand else np.int32)
    t_seed = torch.from_numpy(seeds.copy()).to(dev)
    t_off = torch.from_numpy(offs.copy()).to(dev)
    out = torch.empty(n, dtype=out_dtype, device=dev)
    kernel, _ = _kernels()
    seed_u32 = seeds.dtype == np.int32 and not signed_seed
    grid = ((n + BLOCK - 1) // BLOCK,)
    kernel[grid](t_seed, t_off, out, n, IS_RAND=is_rand, SEED_U32=seed_u32, BLOCK=BLOCK)
    return out.cpu().numpy().reshape(shape)


def triton_randint(seed, offsets, *, signed_seed: bool = False) -> np.ndarray:
    """`tl.randint(seed, offsets)` run in a Triton kernel; int32 array of the broadcast shape.

    - `seed`: int64 or int32 (scalar or array), loaded in the kernel; an int32
      seed is bitcast to uint32 (a resample seed `g`) unless `signed_seed`.
    - `offsets`: an int32 or int64 array, loaded with that dtype.
    - `signed_seed`: keep an int32 seed as `tl.int32` (Triton sign-extends it).
    """
    return _run(seed, offsets, is_rand=False, signed_seed=signed_seed)


def triton_rand(seed, offsets, *, signed_seed: bool = False) -> np.ndarray:
    """`tl.rand(seed, offsets)` run in a Triton kernel; float32 array of the broadcast shape.

    Arguments as for `triton_randint`.
    """
    return _run(seed, offsets, is_rand=True, signed_seed=signed_seed)


def triton_resample_noise(seeds, pos, vocab: int) -> np.ndarray:
    """The resample path in one kernel program per row: `g = tl.randint(seed, pos)`, then
    `tl.rand(g, x)` for int32 `x` in `[0, vocab)`; float32 `[len(seeds), vocab]`.
    """
    import torch  # lazy: see the module docstring

    dev = probe_device()
    seeds = np.array(seeds, dtype=np.int64).reshape(-1)
    pos = np.array(pos, dtype=np.int64).reshape(-1)
    rows = seeds.shape[0]
    if pos.shape[0] != rows:
        raise ValueError(f"seeds and pos differ in length: {rows} vs {pos.shape[0]}")
    if rows == 0 or vocab == 0:
        return np.zeros((rows, vocab), np.float32)
    out = torch.empty(rows * vocab, dtype=torch.float32, device=dev)
    _, kernel = _kernels()
    block = min(1024, 1 << max(0, (vocab - 1).bit_length()))
    kernel[(rows,)](torch.from_numpy(seeds).to(dev), torch.from_numpy(pos).to(dev), out, vocab, BLOCK=block)
    return out.cpu().numpy().reshape(rows, vocab)
