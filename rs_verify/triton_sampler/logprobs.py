"""Logprobs of one block of processed-logits rows (SPEC section 6), in torch on the device.

Everything here is row-wise and exact (top-k values, comparisons, counts,
gathers), so a row's result never depends on the other rows of its block:
chunked and full-batch logprobs are bit-identical.
"""

from __future__ import annotations

import torch


def topk_lowest_ids(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top `k` entries of every row of `lp` by descending value, ties by ascending index.

    `torch.topk` returns the right values but an unspecified index among ties.
    Every token strictly above the k-th value `thr` is in any top-k; the rest
    of the k slots go to the lowest-index tokens equal to `thr`. One more
    top-k over an int32 tie key finds those; a final sort of the k chosen
    (index, then stable by value) fixes the order.
    """
    n, vocab = lp.shape
    vals, top_ids = torch.topk(lp, k, dim=1, largest=True, sorted=True)
    thr = vals[:, k - 1 : k]
    n_gt = (vals > thr).sum(dim=1, keepdim=True)
    # tie key: V - x for tokens equal to thr (larger for lower x), 0 elsewhere
    ids = torch.arange(vocab, device=lp.device, dtype=torch.int32)
    key = torch.where(lp == thr, vocab - ids, torch.zeros((), dtype=torch.int32, device=lp.device))
    tie_ids = torch.topk(key, k, dim=1, largest=True, sorted=True).indices
    del key
    slot = torch.arange(k, device=lp.device).unsqueeze(0)
    chosen = torch.where(slot < n_gt, top_ids, tie_ids.gather(1, (slot - n_gt).clamp(min=0)))
    chosen, _ = torch.sort(chosen, dim=1)
    chosen_vals = lp.gather(1, chosen)
    order = torch.sort(chosen_vals, dim=1, descending=True, stable=True).indices
    return chosen.gather(1, order), chosen_vals.gather(1, order)


# Top-k and ranks allocate O(rows x V) temporaries (an int32 tie key, bool masks: about 1.5x
# the rows' logprobs). Taking at most this many bytes of rows at a time keeps them within the
# 64 MiB of slack allowed beside the capped buffer (SPEC section 7 / the peak-memory property).
TEMP_BYTES = 16 * 2**20


def row_logprobs(lp: torch.Tensor, token: torch.Tensor, k: int):
    """token_ids [n, k+1], logprobs [n, k+1], ranks [n] for log-softmax rows `lp` and emitted `token`.

    Rows are taken in slices of at most `TEMP_BYTES` of logprobs (row-wise results: the
    slicing changes no bit)."""
    n, vocab = lp.shape
    step = max(1, TEMP_BYTES // max(1, vocab * 4))
    if n <= step:
        return _row_logprobs(lp, token, k)
    parts = [_row_logprobs(lp[i : i + step], token[i : i + step], k) for i in range(0, n, step)]
    return tuple(torch.cat(p, dim=0) for p in zip(*parts))


def _row_logprobs(lp: torch.Tensor, token: torch.Tensor, k: int):
    token = token.to(torch.int64).unsqueeze(1)
    tok_lp = lp.gather(1, token)
    ranks = (lp > tok_lp).sum(dim=1).to(torch.int64) + 1
    if k == 0:
        return token, tok_lp, ranks
    top_ids, top_vals = topk_lowest_ids(lp, k)
    return torch.cat([token, top_ids], dim=1), torch.cat([tok_lp, top_vals], dim=1), ranks


def emitted_tokens(rows, req_of_row, cu, sampled, num_sampled):
    """The token emitted at each of `rows` (0 where that row emitted nothing), all on device."""
    r = req_of_row[rows].to(torch.int64)
    i = rows - cu[r].to(torch.int64)
    k1 = sampled.shape[1]
    valid = (i >= 0) & (i < num_sampled[r].to(torch.int64)) & (i < k1)
    tok = sampled[r, i.clamp(0, k1 - 1)]
    return torch.where(valid, tok, torch.zeros((), dtype=tok.dtype, device=tok.device)).clamp_(min=0)
