"""A sampler that declares a `logit_bound` (SPEC section 10) and refuses any batch beyond it.

`BoundedSampler` is the float64 reference with `logit_bound` declared: after the usual validation
(a bad input is still refused by its field, SPEC section 9) it raises `ValueError` on the first
finite processed logit `|fp32(x) / T| > logit_bound` of a request (target rows and its state's
draft rows; `-inf` is masked, never refused). A sampler that states a bound is gated only within
it, so the whole gate passes on it: the suite's strategies and fixed campaigns keep every finite
processed logit within the bound. `UnboundedSampler` refuses the same logits without declaring
the bound: the gate draws past it (what it does for every sampler that declares none).

    pytest -p rs_verify --rs-sampler=examples.bounded_sampler:BoundedSampler
"""

from __future__ import annotations

from reference import ReferenceSampler
from rs_verify.contract.logit_bound import beyond

#: Below what the strategies draw without it (extreme rows, one-hot rows 1e4 below, offsets of 64 at
#: T = 0.05, saturated and zero-probability gaps of up to 1500) and what fixed campaigns hold (fillers
#: of -1e4, logits of -1 at T = 1e-7); above 745, where exp underflows float64, so a clamped filler
#: or gap still has probability 0 and every fixed campaign keeps its meaning.
BOUND = 1000.0


class BoundedSampler(ReferenceSampler):
    """The reference, declaring `logit_bound = BOUND` and refusing what lies beyond it."""

    name = "bounded"
    logit_bound = BOUND
    refuses_beyond = BOUND

    def __call__(self, batch, *, max_chunk_logits=None):
        out = super().__call__(batch, max_chunk_logits=max_chunk_logits)  # validation first (SPEC 9)
        hit = beyond(batch, self.refuses_beyond)
        if hit is not None:
            raise ValueError(f"{self.name}: {hit}")
        return out


class UnboundedSampler(BoundedSampler):
    """Refuses the same logits as `BoundedSampler`, but declares no bound."""

    name = "unbounded"
    logit_bound = None
