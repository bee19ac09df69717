"""Deliberately broken copies of `TorchSampler`: test fixtures that rs-verify must reject.

- `BrokenSampler` (= `abs_residual`): resamples a rejected model draft from `|p - q|`
  instead of `max(p - q, 0)`, a bug seen in real samplers. It over-weights tokens the
  drafter liked more than the target: the distribution campaigns see it at p ~ 0 and the
  certification against the reference sees the changed resample decisions.
- `wrong_bonus_row`: the bonus token (every draft accepted) is drawn with the first row
  of the request (its p and its noise) instead of the last one. The greedy argmax chain,
  the certification and the distribution campaigns (every row has its own p) catch it.
- `chunk_local_cu`: correct tokens and logprobs rows, but `logprobs.cu_num_generated_tokens`
  is the last request's own list, as a concatenation that keeps the last part's `cu` gives
  (SPEC section 6 wants the full batch's `cu_num_logits`). `output_invariants` catches it.

Gate one with:  pytest -p rs_verify --rs-sampler=examples.broken_sampler:BrokenSampler
"""

from __future__ import annotations

import torch

from rs_verify import LogprobsTensors, SamplerOutput

from .torch_sampler import TorchSampler

__all__ = ["BrokenSampler", "ChunkLocalCuSampler", "WrongBonusRowSampler", "abs_residual", "chunk_local_cu",
           "wrong_bonus_row"]


class BrokenSampler(TorchSampler):
    """TorchSampler with the residual `|p - q|` (should be `max(p - q, 0)`)."""

    name = "broken-abs-residual"

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.abs(p - q)


class WrongBonusRowSampler(TorchSampler):
    """TorchSampler that draws the bonus token from the request's first row instead of its last."""

    name = "broken-bonus-row"

    def bonus_rows(self, cu: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return cu[:-1]


class ChunkLocalCuSampler(TorchSampler):
    """TorchSampler whose logprobs carry the last request's own cu list instead of the batch's."""

    name = "broken-chunk-local-cu"

    def __call__(self, batch, *, max_chunk_logits=None) -> SamplerOutput:
        out = super().__call__(batch, max_chunk_logits=max_chunk_logits)
        lp = out.logprobs
        if lp is None or lp.cu_num_generated_tokens is None:
            return out
        cu = lp.cu_num_generated_tokens
        local = [c - cu[-2] for c in cu[-2:]]  # the last part's own list, rebased
        return SamplerOutput(out.sampled, out.num_sampled, LogprobsTensors(lp.token_ids, lp.logprobs, lp.ranks, local))


def abs_residual(**kwargs) -> BrokenSampler:
    return BrokenSampler(**kwargs)


def wrong_bonus_row(**kwargs) -> WrongBonusRowSampler:
    return WrongBonusRowSampler(**kwargs)


def chunk_local_cu(**kwargs) -> ChunkLocalCuSampler:
    return ChunkLocalCuSampler(**kwargs)
