"""A chunked sampler of the seed's design (vLLM PR 48630), written against the public contract.

`SeedChunkedSampler` verifies a batch chunk by chunk as the seed PR's `_iter_request_chunks`
does: each chunk takes whole requests while its rows stay within `max_chunk_logits`, and
always at least one request, so a request of more than `max_chunk_logits` rows is a chunk of
its own. Its processed-logits buffer holds the chunk's rows (`extras["max_buffer_rows"]`):
at most `max(max_chunk_logits, n_r + 1)` where a chunk is one request larger than the cap,
which SPEC section 7 allows. Each chunk is verified by `TorchSampler` and the outputs are
concatenated (`rs_verify.verify_chunked`), so the output is the full batch's bit for bit.

`TwiceCapSampler` is the same sampler with a planner that packs twice the cap into a chunk,
its buffer reported honestly: a correct output, a buffer over the SPEC bound, and
`buffer_within_cap` must fail it.

Gate it with:  pytest -p rs_verify --rs-sampler=examples.seed_chunker:SeedChunkedSampler
"""

from __future__ import annotations

from rs_verify import SamplerOutput, SpecBatch, max_chunk_logits as default_cap, validate, verify_chunked

from .torch_sampler import TorchSampler

__all__ = ["SeedChunkedSampler", "TwiceCapSampler"]


class SeedChunkedSampler(TorchSampler):
    """TorchSampler verified in chunks of whole requests, one FP32 buffer of the chunk's rows each."""

    name = "seed-chunked"
    supports_chunking = True
    memory_stats = True  # extras["max_buffer_rows"] is reported
    pack = 1  # rows per chunk: at most pack * max_chunk_logits (the seed: 1)

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        if self.validate:
            validate(batch)
        cap = default_cap(batch.vocab_size) if max_chunk_logits is None else int(max_chunk_logits)
        buffers = []

        def verify(chunk: SpecBatch) -> SamplerOutput:
            buffers.append(chunk.num_logits)  # the chunk's processed logits, FP32 [rows, V]
            return TorchSampler.__call__(self, chunk)

        out = verify_chunked(batch, verify, self.pack * cap)
        out.extras["max_buffer_rows"] = max(buffers, default=0)
        return out


class TwiceCapSampler(SeedChunkedSampler):
    """Packs up to twice the cap into a chunk (a planner bug); the buffer is reported as it is."""

    name = "seed-chunked-twice-the-cap"
    pack = 2
