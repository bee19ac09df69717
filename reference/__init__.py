"""The NumPy float64 reference sampler, the oracle of rs-verify (SPEC sections 2-6 and 8).

`ReferenceSampler` verifies a `SpecBatch` in float64 with the SPEC random streams
(`rs_verify.spec.philox`, bit for bit Triton's `tl.rand` / `tl.randint`) and can
report every decision with its margin (`verify_with_trace`). Imports only NumPy
and the batch contract: never torch, triton or the Triton sampler.
"""

from . import sampler
from .sampler import *  # noqa: F403 - the sampler module's public names (its __all__)

__all__ = list(sampler.__all__)
