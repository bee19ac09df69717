"""A Triton sampler that computes no logprobs and says so (SPEC section 10 `supports_logprobs`).

It wraps the built-in Triton sampler: a third-party kernel that leaves logprobs to its engine
(vLLM's `rejection_sample` does) looks like this to the suite.
"""

from rs_verify import SamplerOutput, SpecBatch
from rs_verify.triton_sampler import TritonSampler


class NoLogprobsSampler:
    name = "triton-no-logprobs"
    supports_chunking = True
    streams = "triton-philox"
    supports_logprobs = False

    def __init__(self):
        self._inner = TritonSampler(block_v=64)
        self.interpreted = self._inner.interpreted

    def __call__(self, batch: SpecBatch, *, max_chunk_logits=None) -> SamplerOutput:
        if batch.num_logprobs is not None:
            raise ValueError("num_logprobs: this sampler computes no logprobs (supports_logprobs = False)")
        return self._inner(batch, max_chunk_logits=max_chunk_logits)
