"""rs-verify: a verification and equivalence suite for speculative-decoding rejection samplers.

The top level exposes the contract (SPEC.md): batch types, validation and the
chunk planner. The Triton sampler is imported lazily (`rs_verify.TritonSampler`)
so that importing the contract never imports torch or triton.
"""

from .spec.batch import LogprobsTensors, SamplerOutput, SpecBatch
from .spec.chunking import (
    DEFAULT_CAP_BYTES,
    iter_request_chunks,
    max_chunk_logits,
    select_requests,
    slice_batch,
    verify_chunked,
)
from .spec.validation import validate

__all__ = [
    "DEFAULT_CAP_BYTES",
    "LogprobsTensors",
    "SamplerOutput",
    "SpecBatch",
    "TritonSampler",
    "iter_request_chunks",
    "max_chunk_logits",
    "select_requests",
    "slice_batch",
    "validate",
    "verify_chunked",
]

__version__ = "0.1.0"

# `pytest -p rs_verify` without the installed pytest11 entry point imports this package as
# the plugin: point pytest at the plugin module (read by pytest only, imports nothing here).
pytest_plugins = ["rs_verify.frontends.plugin"]


def __getattr__(name):
    if name == "TritonSampler":
        from .triton_sampler import TritonSampler  # lazy: the contract alone never imports torch or triton

        return TritonSampler
    raise AttributeError(f"module 'rs_verify' has no attribute {name!r}")
