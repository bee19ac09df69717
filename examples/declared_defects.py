"""Samplers that declare more than they do (SPEC section 10): the gate must fail them.

Each wraps the built-in Triton sampler, which implements block verification (SPEC 4b) and the
sampling parameters (SPEC 2), and quietly drops one of them while still declaring it:

- `TokenWiseDeclaringBlock` declares `verification_methods = {"token", "block"}` but verifies
  every batch token by token;
- `TopPIgnored` declares `sampling_params = {"min_p", "top_k", "top_p"}` but ignores `top_p`.

`Faithful` is the same wrapper doing nothing wrong: it must pass where they fail.
"""

from rs_verify import SamplerOutput, SpecBatch
from rs_verify.triton_sampler import TritonSampler


class Faithful:
    name = "triton-wrapped"
    supports_chunking = True
    streams = "triton-philox"
    memory_stats = True
    verification_methods = frozenset({"token", "block"})
    sampling_params = frozenset({"min_p", "top_k", "top_p"})

    def __init__(self):
        self._inner = TritonSampler(block_v=32)
        self.interpreted = self._inner.interpreted
        self.block_v = self._inner.block_v

    def change(self, batch: SpecBatch) -> SpecBatch:
        return batch

    def __call__(self, batch: SpecBatch, *, max_chunk_logits=None) -> SamplerOutput:
        return self._inner(self.change(batch), max_chunk_logits=max_chunk_logits)


class TokenWiseDeclaringBlock(Faithful):
    name = "token-wise-declaring-block"

    def change(self, batch: SpecBatch) -> SpecBatch:
        return batch.replace(verification="token")


class TopPIgnored(Faithful):
    name = "top-p-ignored"

    def change(self, batch: SpecBatch) -> SpecBatch:
        return batch.replace(top_p=None)
