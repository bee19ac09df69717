"""The production Triton rejection sampler (see `sampler.py` for the kernel pipeline, `protocol.py`
for `TritonSampler`, its SPEC 10 front).

Without CUDA the kernels run under Triton's interpreter on CPU tensors: importing this
package first makes the suite's one backend choice (`rs_verify.harness.device.resolve`),
unless triton was imported already (the variable is read when kernels are defined).
"""

import os
import sys

from ..harness import device

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ:
    device.resolve()

from .protocol import TritonSampler  # noqa: E402
from .sampler import DEFAULT_BLOCK_V, default_device, rejection_sample  # noqa: E402

__all__ = ["DEFAULT_BLOCK_V", "TritonSampler", "default_device", "rejection_sample"]
