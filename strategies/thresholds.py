"""Sampling-parameter thresholds kept away from float error (for `decision_batches`).

A top-p boundary among tokens of tiny mass lies within their mass of a decision, whatever the
value, and float32 sums of hundreds of probabilities are off by ~1e-5; a min-p threshold
`M + log m` is off by about an ulp of `L`. `vet_thresholds` moves such a threshold a little
(or turns the parameter off for that state) so that no decision of the draw is within float
error of it: certification excuses only `max(2, 1%)` of those per batch (SPEC section 8).

Imports only NumPy and the contract.
"""

from __future__ import annotations

import numpy as np

from .contents import OFF, Contents

TOP_P_SAFE, MIN_P_SAFE = 1e-4, 2e-6  # smallest top-p margin (a mass) and min-p margin / L left in a draw
VET_TOP_P_STEP, VET_MIN_P_STEP, VET_TRIES = (1e-4, 2e-3), (1e-3, 2e-2), 10  # moves of a vetted threshold


def vet_thresholds(rng, c: Contents) -> None:
    """Move a state's top-p or min-p threshold (a little, at most `VET_TRIES` times) when one of its
    request's rows has a decision within float error of it: top-p margins (masses) below
    `TOP_P_SAFE`, min-p margins below `MIN_P_SAFE * L`. A top-p boundary among tokens of tiny mass
    lies within their mass of a decision, whatever the value: float32 sums of hundreds of
    probabilities are off by ~1e-5. When no move clears it the parameter is turned off for that
    state. Top-k compares the same float32 logits (exact) and min_p = 1 is exact at the maximum:
    neither moves. Runs last (after the block tilts)."""
    for r in range(len(c.idx)):
        if c.temps[r] <= 0:
            continue
        s = int(c.idx[r])
        for name, safe, step in (("top_p", TOP_P_SAFE, VET_TOP_P_STEP), ("min_p", MIN_P_SAFE, VET_MIN_P_STEP)):
            a = c.params.get(name)
            if a is None or a[s] == OFF[name] or (name == "min_p" and a[s] == 1.0):
                continue
            base = float(a[s])
            for _ in range(VET_TRIES):
                _, mr = c.masked_z(r)
                margin = mr.top_p_margin if name == "top_p" else mr.min_p_margin / mr.min_p_scale[:, None]
                with np.errstate(invalid="ignore"):
                    if not (np.abs(margin[np.isfinite(margin)]) < safe).any():
                        break
                delta = float(rng.uniform(*step)) * float(rng.choice([-1.0, 1.0]))
                moved = base + delta if name == "top_p" else base * float(np.exp(delta))
                a[s] = np.float32(min(max(moved, 1e-3), 1.0 - 1e-3 if name == "top_p" else 0.999))
            else:  # a boundary inside a long tail of tiny masses: no small move leaves it
                a[s] = OFF[name]
