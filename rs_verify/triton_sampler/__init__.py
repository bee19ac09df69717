"""The production Triton rejection sampler (see `sampler.py` for the kernel pipeline).

Without CUDA the kernels run under Triton's interpreter on CPU tensors: this
package sets `TRITON_INTERPRET=1` when torch sees no GPU and triton has not
been imported yet (the variable is read when kernels are defined).
"""

import os
import sys

import torch

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from .sampler import DEFAULT_BLOCK_V, TritonSampler, default_device, rejection_sample  # noqa: E402

__all__ = ["DEFAULT_BLOCK_V", "TritonSampler", "default_device", "rejection_sample"]
