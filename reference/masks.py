"""The sampling-parameter masks of SPEC section 2 in a slab, and their near-tie decisions (section 8).

The masks are those of `rs_verify.contract.masks` (the one implementation of section 2), applied to
the slab's processed logits `z` (float32) of rows of stochastic states with a parameter on: a
masked token's logit becomes `-inf` before any acceptance test, residual, resample, bonus or
processed logprob reads the row. Rows without parameters are not touched (and cost nothing).

`flips` (trace mode: `ReferenceSampler.verify_with_trace(batch, flips=...)`) inverts the final
membership (after all three parameters) of the given tokens of the given rows, to show what the
output would be had a production sampler decided those near-ties the other way. The decisions in
the trace stay those the reference computed.
"""

from __future__ import annotations

import numpy as np

from rs_verify.contract.masks import MASK_PARAMS, RowParams, apply_masks, row_params

from .trace import Decision

__all__ = ["MASK_NEAR", "SlabMasks", "check_flips", "mask_decisions", "mask_slab"]

#: A mask decision is recorded in the trace when `|margin| <= MASK_NEAR * L` (generous: certification
#: applies its own `eps`).
MASK_NEAR = 1e-2


class SlabMasks:
    """The masked rows of a slab (`rows`, slab-local) and their `MaskResult` (margins in trace mode)."""

    def __init__(self, rows: np.ndarray, result):
        self.rows, self.result = rows, result


def check_flips(batch, flips) -> dict[int, np.ndarray]:
    """`flips` as `{row: int64 token ids}`, validated: rows in `[0, N)` of stochastic states with a
    sampling parameter on (only those rows have mask decisions), tokens in `[0, V')`."""
    if not flips:
        return {}
    out = {}
    for j, toks in flips.items():
        j = int(j)
        toks = np.unique(np.asarray([int(t) for t in np.asarray(list(toks)).reshape(-1)], dtype=np.int64))
        if not 0 <= j < batch.num_logits:
            raise ValueError(f"flips: row {j} outside [0, {batch.num_logits})")
        if toks.size and not ((toks >= 0) & (toks < batch.effective_vocab_size)).all():
            raise ValueError(f"flips: row {j}: token ids outside [0, {batch.effective_vocab_size})")
        out[j] = toks
    rows = np.fromiter(out, dtype=np.int64, count=len(out))
    masked = row_params(batch, rows).any
    if not masked.all():
        raise ValueError(f"flips: row {int(rows[~masked][0])} has no sampling-parameter mask "
                         "(greedy state or every parameter off)")
    return out


def mask_slab(slab, z: np.ndarray, params: RowParams, flips: dict) -> SlabMasks | None:
    """Mask the slab's processed logits `z` (float32 `[rows, V']`, writable) in place.

    `params`: the per-state parameters (`RowParams` over states); `flips`: `{batch row: tokens}`.
    Returns the masked rows and their masks, or None when no row of the slab has a parameter on.
    """
    rp = params.take(slab.states[slab.req])
    on = rp.any
    whole = bool(on.all())
    rows = np.arange(slab.nrow) if whole else np.flatnonzero(on)
    if not rows.size:
        return None
    zr = z if whole else z[rows]
    res = apply_masks(zr, rp if whole else rp.take(rows), margins=slab.trace)
    kept = res.kept
    if flips:
        local = np.full(slab.nrow, -1, np.int64)
        local[rows] = np.arange(rows.size)
        for j, toks in flips.items():
            if slab.lo <= j < slab.hi and toks.size:
                i = local[j - slab.lo]
                kept[i, toks] = ~kept[i, toks]
                if not (kept[i] & (zr[i] > -np.inf)).any():
                    raise ValueError(f"flips: row {j} would keep no token with a finite logit")
    np.putmask(zr, ~kept, np.float32(-np.inf))
    if not whole:
        z[rows] = zr
    return SlabMasks(rows, res)


def mask_decisions(slab) -> dict[int, list[Decision]]:
    """The near-tie mask decisions of the slab's masked rows, per slab-local request, each list in
    step order, then parameter order (min-p, top-k, top-p), then token id."""
    masks = slab.masks
    if masks is None:
        return {}
    res, rows = masks.result, masks.rows
    found = []  # (masked-row index, parameter index, token, margin, scale)
    for w, (name, margin, scale) in enumerate(res.margins()):
        with np.errstate(invalid="ignore"):
            near = np.abs(margin) <= MASK_NEAR * scale  # NaN (no decision) is never near
        i, x = np.nonzero(near)
        if i.size:
            found.append((i, np.full(i.size, w), x, margin[i, x], np.asarray(scale)[i, x]))
    if not found:
        return {}
    i, w, x, margin, scale = (np.concatenate(a) for a in zip(*found))
    order = np.lexsort((x, w, i))  # rows are in slab order: step order within a request
    out: dict[int, list[Decision]] = {}
    for o in order:
        row = int(rows[i[o]])
        r, name, mg = int(slab.req[row]), MASK_PARAMS[w[o]], float(margin[o])
        kept = mg > 0 if name == "top_p" else mg >= 0
        out.setdefault(r, []).append(Decision(slab.ra + r, int(slab.step[row]), slab.lo + row, "mask", int(x[o]),
                                              bool(kept), mg, None, float(scale[o]), None, name))
    return out
