"""Deliberately broken copies of `TorchSampler`: test fixtures that rs-verify must reject.

- `BrokenSampler` (= `abs_residual`): resamples a rejected model draft from `|p - q|`
  instead of `max(p - q, 0)`, a bug seen in real samplers. It over-weights tokens the
  drafter liked more than the target: the distribution campaigns see it at p ~ 0 and the
  certification against the reference sees the changed resample decisions.
- `wrong_bonus_row`: the bonus token (every draft accepted) is drawn with the first row
  of the request (its p and its noise) instead of the last one. The greedy argmax chain,
  the certification and the distribution campaigns (every row has its own p) catch it.

Gate one with:  pytest -p rs_verify --rs-sampler=examples.broken_sampler:BrokenSampler
"""

from __future__ import annotations

import torch

from .torch_sampler import TorchSampler

__all__ = ["BrokenSampler", "WrongBonusRowSampler", "abs_residual", "wrong_bonus_row"]


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


def abs_residual(**kwargs) -> BrokenSampler:
    return BrokenSampler(**kwargs)


def wrong_bonus_row(**kwargs) -> WrongBonusRowSampler:
    return WrongBonusRowSampler(**kwargs)
