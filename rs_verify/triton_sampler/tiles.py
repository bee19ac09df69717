"""The rows of a program (Triton, plain `tl`): every kernel works on BLOCK_R target rows or requests."""

import triton
import triton.language as tl


@triton.jit
def _tile_rows(row_off, row_end, N, BLOCK_R: tl.constexpr):
    """The BLOCK_R rows of this program: (rows clamped into [0, N), whether each is below row_end)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R) + row_off
    return tl.minimum(tl.maximum(rows, 0), N - 1), rows < row_end
