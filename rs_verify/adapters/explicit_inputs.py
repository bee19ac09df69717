"""What the adapters of `explicit`-family samplers (SPEC 3c) hand their library, from a `SpecBatch`.

Shared by `rs_verify.adapters.sglang` and `rs_verify.adapters.vllm_v1`, whose libraries take
probabilities rather than logits and their random numbers as inputs:

- `effective_drafts`: each request's drafts up to its first padded one (SPEC 3c: a request whose
  drafts end in padding verifies as the shorter request; a draft id outside `[0, V')`, possible
  only without validation, ends the drafts the same way, so the library never indexes with it);
- `Prepared`: the processed logits `z = fp32(x) / T` (SPEC 2, `T = 1` for greedy states) of every
  row over `[0, V')`, their float32 softmax `p`, and each request's draft distributions `q`
  (float32 softmax of `draft_logits / T`, or a point mass at the draft for one-hot drafts);
- `admit`: the refusals of SPEC 9 before any work (validation or the layout, the noise fields the
  sampler reads, no sampling parameter, a declared verification method); `require_noise` its noise part;
- `greedy_tokens`: SPEC 4's greedy chain on `argmax z` (torch's, lowest index on ties), for the
  requests whose library path is not the wrapped function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.validation import check_layout, validate

__all__ = ["Prepared", "admit", "effective_drafts", "greedy_tokens", "output", "prepare", "require_noise"]


def require_noise(batch: SpecBatch, fields: tuple[str, ...]) -> None:
    """SPEC 9: an explicit sampler refuses a batch without the noise it reads, naming the field."""
    for name in fields:
        if getattr(batch, name) is None:
            raise ValueError(f"{name}: this sampler takes its random numbers from the batch (streams = 'explicit', "
                             f"SPEC 3c) and the batch carries none")


def admit(sampler, batch: SpecBatch, noise: tuple[str, ...], params_why: str, method_why: str) -> None:
    """The checks an adapter makes before any work, each a `ValueError` naming the field (SPEC 9):
    with `sampler.validate` the whole batch, without it its layout only (dtypes, shapes,
    `cu_num_logits`, `idx_mapping`, `pos`: its own host code indexes by them; the values go to the
    library unchecked); then the `noise` fields it reads, no sampling parameter (the adapters apply
    none: `params_why` says where the library does) and a declared verification method
    (`method_why` says why another is not)."""
    (validate if sampler.validate else check_layout)(batch)
    require_noise(batch, noise)
    if batch.sampling_params_on():
        raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                         f"({params_why}; sampling_params is empty)")
    if batch.verification not in sampler.verification_methods:
        raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler ({method_why})")


def effective_drafts(batch: SpecBatch) -> np.ndarray:
    """int64 `[R]`: the drafts each request verifies, up to its first draft id outside `[0, V')`."""
    vp = batch.effective_vocab_size
    cu = np.asarray(batch.cu_num_logits, np.int64)
    ids = np.asarray(batch.draft_token_ids, np.int64)
    n = np.diff(cu) - 1  # the slots of each request's drafts: cu[r] + 1 ... cu[r + 1] - 1
    if ids.size == 0 or n.size == 0:
        return np.maximum(n, 0)
    slot = np.arange(ids.size) - np.repeat(cu[:-1] + 1, np.diff(cu))  # draft index of each row's id, -1 at slot 0
    bad = ((ids < 0) | (ids >= vp)) & (slot >= 0)
    first = np.full(n.size, np.iinfo(np.int64).max)
    np.minimum.at(first, np.repeat(np.arange(n.size), np.diff(cu))[bad], slot[bad])
    return np.maximum(np.minimum(n, first), 0)


@dataclass
class Prepared:
    """A batch's inputs in torch float32 on `device` (module docstring)."""

    vocab: int  # V'
    rows: np.ndarray  # int64 [R]: cu_num_logits[r], the first row of each request
    drafts: np.ndarray  # int64 [R]: effective_drafts
    greedy: np.ndarray  # bool [R]
    z: torch.Tensor  # float32 [N, V']: processed logits
    p: torch.Tensor  # float32 [N, V']: softmax(z)
    q: torch.Tensor  # float32 [R, K, V']: the draft distribution of each request's step (zeros past its drafts)


def prepare(batch: SpecBatch, device) -> Prepared:
    vp, k = batch.effective_vocab_size, batch.num_speculative_steps
    cu = np.asarray(batch.cu_num_logits, np.int64)
    states = np.asarray(batch.idx_mapping, np.int64)
    temperature = np.asarray(batch.temperature, np.float32)[states]
    greedy = temperature == 0
    t_div = torch.from_numpy(np.where(greedy, np.float32(1), temperature))
    req_of_row = np.repeat(np.arange(batch.num_reqs), np.diff(cu))
    x = torch.from_numpy(np.array(np.asarray(batch.target_logits)[:, :vp], np.float32))  # a writable copy
    z = (x / t_div[torch.from_numpy(req_of_row)].unsqueeze(1)).to(device)  # IEEE division (SPEC 2)
    p = torch.softmax(z, dim=-1)
    drafts = effective_drafts(batch)
    q = torch.zeros((batch.num_reqs, k, vp), dtype=torch.float32)
    live = np.arange(k)[None, :] < np.where(greedy, 0, drafts)[:, None]  # [R, K]: each request's drafts
    reqs = np.flatnonzero(live.any(axis=1))
    if reqs.size and batch.draft_logits is None:  # one-hot drafts: q is a point mass at the draft
        r, i = np.nonzero(live)
        q[torch.from_numpy(r), torch.from_numpy(i), torch.from_numpy(np.asarray(batch.draft_token_ids, np.int64)[cu[r] + 1 + i])] = 1.0
    elif reqs.size:  # one softmax over every request's rows (row-wise: as one request at a time)
        d = torch.from_numpy(np.array(np.asarray(batch.draft_logits)[states[reqs], :k, :vp], np.float32))
        law = torch.softmax(d / t_div[torch.from_numpy(reqs)][:, None, None], dim=-1)
        q[torch.from_numpy(reqs)] = torch.where(torch.from_numpy(live[reqs])[:, :, None], law, 0.0)  # 0 past drafts
    return Prepared(vocab=vp, rows=cu[:-1], drafts=drafts, greedy=greedy, z=z, p=p, q=q.to(device))


def exponentials(batch: SpecBatch, prep: Prepared, dtype: torch.dtype) -> torch.Tensor:
    """`E = exp(-G)` of each request's `resample_gumbel` over `[0, V')`, computed in float64, then `dtype` on the
    prepared device (a `G` below about -88.7 has no float32 `E`: it overflows to inf, docs/explicit-adapters.md)."""
    with np.errstate(over="ignore"):
        e = np.exp(-np.asarray(batch.resample_gumbel, np.float64)[:, : prep.vocab])
    return torch.from_numpy(e).to(device=prep.p.device, dtype=dtype)


def bonus_tokens(prep: Prepared, e: torch.Tensor) -> np.ndarray:
    """Each request's bonus by the exponential race: `argmax p / E` of its bonus row, in `e`'s dtype (`argmax z`
    for greedy requests)."""
    dev = prep.p.device
    rows = torch.from_numpy(prep.rows + prep.drafts).to(dev)
    race = torch.argmax(prep.p[rows].to(e.dtype) / e, dim=-1)
    greedy = torch.argmax(prep.z[rows], dim=-1)
    return torch.where(torch.from_numpy(prep.greedy).to(dev), greedy, race).cpu().numpy()


def greedy_tokens(batch: SpecBatch, prep: Prepared, r: int) -> list[int]:
    """SPEC 4, greedy: accept the drafts that equal the row's argmax; then that argmax (or the bonus)."""
    lo, n = int(prep.rows[r]), int(prep.drafts[r])
    argmax = torch.argmax(prep.z[lo : lo + n + 1], dim=-1).cpu().numpy()
    ids = np.asarray(batch.draft_token_ids, np.int64)
    out = []
    for i in range(n + 1):
        out.append(int(argmax[i]))
        if i == n or ids[lo + i + 1] != argmax[i]:
            return out
    return out


def output(batch: SpecBatch, tokens: list[list[int]]) -> SamplerOutput:
    """SPEC 5: each request's emitted tokens, `-1` padded to `K + 1`."""
    sampled = np.full((batch.num_reqs, batch.num_speculative_steps + 1), -1, np.int64)
    num = np.zeros(batch.num_reqs, np.int32)
    for r, toks in enumerate(tokens):
        sampled[r, : len(toks)] = toks
        num[r] = len(toks)
    return SamplerOutput(sampled=sampled, num_sampled=num, logprobs=None)
