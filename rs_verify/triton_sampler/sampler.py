"""The production Triton rejection sampler (SPEC sections 2-7).

Kernel pipeline, per call (`rejection_sample`):

1. Once per call, on the device: `req_of_row` (the request owning each target
   row, by `searchsorted` over `cu_num_logits`), the per-row statistics
   buffers (O(N) floats, no logits copies), `sampled` filled with -1 and
   `num_sampled`; one host copy of `cu_num_logits` (given by the caller, or one
   device-to-host copy) feeds the chunk planner.
2. For every chunk of whole requests from `iter_request_chunks(cu, max_chunk_logits)`
   (row and request offsets are scalar kernel arguments; nothing is allocated
   and nothing is synchronised per chunk):
   a. `row_stats_kernel`, one program per `block_rows` target rows: online max, sum-exp
      and argmax (lowest index on ties, NaN read as -inf) of the processed
      logits `z = div_rn(fp32(x), T)` (temperature applied on load; T = 0 and
      T = 1 leave x untouched) over `[0, V')`; for model drafts also max and
      sum-exp of `draft / T` of the (request, step) that row verifies.
   a'. Only for a batch with sampling parameters (SPEC 2): `mask_stats_kernel`, one
      program per `block_rows` target rows: the row's keep threshold `thr` and tie-id cutoff `cut`
      (masks.py: exact radix selects over the float bits, no sort), and the masked
      row's log-sum-exp. Every later load of a target logit applies the mask.
   a''. Only for a block batch (SPEC 4b): `block_tau_kernel`, one program per
      `block_rows` requests: tau, log P_{tau-1} and the accepted drafts of each stochastic
      request (block.py; model drafts take one more pass per step for Z).
   b. `verify_kernel`, one program per request: the acceptance tests of
      SPEC section 4 for all steps at once (they are independent; vectors of
      16 steps), first rejection `t` = the lowest failing step (greedy:
      `d == argmax`; one-hot: `log p(d) > log u`; model drafts:
      `log p(d) > log u + log q(d)`; `u = max(rand(seed, pos), TINY)`, or the explicit
      family's `accept_uniforms[j]` rounded to float32 (SPEC 3c);
      padded or out-of-range drafts rejected), then ONE Gumbel-max draw at
      row `t` (the first rejection, or the bonus row):
      `argmax_x log r(x) + G_x`, `G_x` the noise of the family `streams` (SPEC 3),
      `r = max(p - q, 0)` (model drafts, in the log domain; probabilities
      below the float64 range count as 0, as for the reference), `p` with
      `r(d) = 0` (one-hot) or `p` (padded draft, bonus, or a residual with no
      positive mass: both argmaxes are tracked in the same vocabulary pass).
      Greedy rows emit the argmax. It writes the accepted drafts and the
      emitted token into `sampled[r]`, and `num_sampled[r] = t + 1`. In a
      block batch a stochastic request skips the acceptance tests: `t = tau`
      and the model residual is `max(P_{tau-1} p - q, 0)`.
   b'. Only for a batch with sampling parameters, block verification or the explicit family:
      `resample_kernel`, one program per `block_rows` requests, draws each stochastic request's
      token instead of `verify_kernel` (residual.py): masked `p`, the block residual, the batch's
      `resample_gumbel[r]`, or the inverse CDF of `resample_uniforms[r]` for an explicit sampler
      that declares `resample="inverse_cdf"` (SPEC 4; inverse_cdf.py).
   b''. A tree batch (SPEC 4c; the explicit family) instead of a'' to b': with model drafts
      `row_stats_kernel` once more over the chunk's `node_draft_logits` rows (Q's max and log-sum-exp),
      then `tree_kernel`, one program per `block_rows` requests (tree.py): the forward scan over each
      request's nodes, the residual of a level in the FP32 buffer `[requests of the chunk, V']`, the last
      token by residual.py's Gumbel-max or the inverse CDF; it writes `accepted_nodes` too.
   c. Only with logprobs: the chunk's rows, in blocks of at most
      `max_chunk_logits` rows, go through `log_softmax_kernel` into ONE
      preallocated FP32 buffer (log-softmax over the whole `[0, V)` of the raw
      logits, or of `z` in "processed" mode, masked tokens of `[0, V')` at
      -inf), then top-k / ranks / the emitted
      token's logprob are derived in torch (`logprobs.row_logprobs`).

Every program reduces each of its rows (or requests) with a lane layout fixed by
`BLOCK_V` alone, so results never depend on the batch size, the chunking,
the request order, the other requests or `block_rows` (`BLOCK_R`: 1 on CUDA, 16 rows
or requests per program through the interpreter, where a program's cost is its `tl`
operations, not its lanes; `verify_kernel` keeps one request per program: its tiled
form spilled registers at sm_80). Kernels are specialized on `BLOCK_V`,
`HAS_DRAFT`, `STREAM` (the family's noise: streams.py), `RESAMPLE` (resample_kernel: "gumbel" or
"inverse_cdf"), the logits dtype and, by Triton's default, on the vocabulary sizes
`V` / `Vd` (equal to 1, divisible by 16) and `PROCESSED`; offsets, counts and the
flags `MASKED` / `BLOCK` are `do_not_specialize` (a batch with parameters or block
verification reuses the token-wise kernels' specializations; `mask_stats_kernel` and
`block_tau_kernel` do not specialize the vocabulary sizes either). Any integer scalar may arrive as int32 or int64. `rs-verify
compile` (aot.py) compiles every such specialization for CUDA, also without a GPU.
Kernels are compiled with `enable_fp_fusion=False` so the rounding does not
change with Triton's fusion default. Without validation,
every index read from the batch (`cu`, `idx_mapping`, draft ids, the row of
a request) is clamped or masked, so no access leaves its tensor and every
emitted token lies in `[0, V')` (NaN logits never win an argmax).
"""

from __future__ import annotations

import numpy as np
import torch
import triton

from ..contract.chunking import iter_request_chunks, max_chunk_logits as default_max_chunk_logits
from ..contract.explicit import GUMBEL
from ..contract.methods import TREE
from ..contract.streams import PLAIN, STEP
from . import kernels
from .logprobs import emitted_tokens, row_logprobs
from .shapes import PER_CHILD, PER_NODE, check_noise, check_shapes, check_tree
from .streams import DEFAULT_STREAMS, resample_method, stream_family

DEFAULT_BLOCK_V = 1024
NUM_WARPS = 4
# Lanes of the radix-select passes of SPEC 2's masks (masks.py): per-lane [MASK_BLOCK, 16] bin
# accumulators, 16 elements per thread at 4 warps (at most BLOCK_V); interpreted: see below. The
# lanes fix the order of the top-p mass sums: an interpreted and a compiled sampler may round them
# apart (within SPEC 8's tolerance).
MASK_BLOCK = 32
# Rows (requests) per program of every kernel but verify_kernel: one per program
# on CUDA (the grid is the parallelism; registers as for one row), several under the interpreter,
# which pays per tl operation and per program, not per element. The radix-select lanes there:
# [rows, lanes, 16] accumulators, lanes = INTERPRETED_MASK_ELEMS // rows (at most BLOCK_V).
INTERPRETED_BLOCK_ROWS = 16
INTERPRETED_MASK_ELEMS = 1024

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _interpreted() -> bool:
    """Whether the kernels were defined under Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return type(kernels.verify_kernel).__name__ == "InterpretedFunction"


def _power_of_two(name: str, value, least: int) -> int:
    value = int(value)
    if value < least or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {least}, got {value}")
    return value


def _check_block_rows(block_rows) -> int:
    """Rows (or requests) per program of the tiled kernels: as given, else 1 compiled and
    INTERPRETED_BLOCK_ROWS interpreted."""
    if block_rows is None:
        return INTERPRETED_BLOCK_ROWS if _interpreted() else 1
    return _power_of_two("block_rows", block_rows, 1)


def _check_block_v(block_v) -> int:
    return _power_of_two("block_v", DEFAULT_BLOCK_V if block_v is None else block_v, 16)


def rejection_sample(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    *,
    num_speculative_steps: int,
    max_chunk_logits: int | None = None,
    num_logprobs: int | None = None,
    logprobs_mode: str = "raw",
    block_v: int | None = None,
    block_rows: int | None = None,
    cu_num_logits_host=None,
    info: dict | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    verification: str = "token", streams: str = DEFAULT_STREAMS,
    accept_uniforms: torch.Tensor | None = None,
    resample_gumbel: torch.Tensor | None = None,
    resample_uniforms: torch.Tensor | None = None,
    resample: str = GUMBEL,
    block_seed: str = PLAIN,
    tree_parent: torch.Tensor | None = None,
    node_draft_logits: torch.Tensor | None = None,
    tree_drafts: str = "iid",
    tree_uniforms: str = PER_CHILD,
    accepted_nodes: torch.Tensor | None = None,
):
    """Verify a batch held in device tensors (SPEC sections 2-7); no validation.

    Arguments follow `SpecBatch` (section 1) as torch tensors on one device;
    `target_logits` / `draft_logits` may be float32, bfloat16 or float16 and
    are read natively. `max_chunk_logits=None` means `max_chunk_logits(V)`. `block_v` is the
    vocabulary block, `block_rows` the rows (or requests) per program of every kernel but
    `verify_kernel` (None: 1 compiled, INTERPRETED_BLOCK_ROWS interpreted); a row's results do
    not depend on the rows beside it.
    `cu_num_logits_host` (NumPy or a list) saves the one device-to-host copy
    of `cu_num_logits` that the chunk planner needs. `info`, when given, is
    filled with `max_buffer_rows` and `num_chunks`. `top_k` (int32 [S]), `top_p` and `min_p`
    (float32 [S]) are SPEC 2's sampling parameters (None: off for every state; pass None rather
    than an all-off tensor, which pays the masked path's scalar loads); `verification` is
    "token" (SPEC 4) or "block" (SPEC 4b); `streams` the family of the noise (SPEC 3; `streams.STREAMS`).
    The explicit family (SPEC 3c) reads its noise from `accept_uniforms` (float64 [N]) and, as
    `resample` says (SPEC 4), `resample_gumbel` (float64 [R, V'], "gumbel") or `resample_uniforms`
    (float64 [R], "inverse_cdf"); the other families ignore them. `block_seed` keys block step `i`'s
    acceptance uniform by the seed ("plain") or by `seed ^ (i << 32)` ("step": SPEC 3b, for a family
    whose record offers it).
    `verification="tree"` (SPEC 4c; explicit family only, no logprobs): `tree_parent` (int32 [N]), the
    optional `node_draft_logits` ([N, Vd], the logits dtype; None: one-hot trees), `tree_drafts` ("iid"
    or "without_replacement"), `tree_uniforms` ("per_child" or "per_node") and `accepted_nodes`, an int32
    [R, K] tensor the path's local nodes are written into (pre-filled with -1 here).

    Returns `(sampled int64 [R, K+1], num_sampled int32 [R], logprobs)` on the
    device, with `logprobs = (token_ids int64 [N, k+1], logprobs float32
    [N, k+1], ranks int64 [N])` or `None`.
    """
    k = int(num_speculative_steps)
    params = (("top_k", top_k), ("top_p", top_p), ("min_p", min_p))
    check_shapes(target_logits, draft_logits, draft_token_ids, cu_num_logits, pos, idx_mapping,
                  temperature, seeds, num_speculative_steps, num_logprobs, logprobs_mode, params, verification)
    tree = verification == TREE.name
    if tree:
        check_tree(target_logits, draft_logits, tree_parent, node_draft_logits, tree_drafts, tree_uniforms,
                   accepted_nodes, num_speculative_steps, num_logprobs, streams)
    block = _check_block_v(block_v)
    rows_per = _check_block_rows(block_rows)
    family = stream_family(streams)
    stream, resample = family.triton, resample_method(family, resample)
    if block_seed not in family.block_seeds:
        raise ValueError(f"block_seed: the stream family {family.name!r} draws the block seeds "
                         f"{list(family.block_seeds)} (SPEC 3b), not {block_seed!r}")
    mask_block = (min(block, max(16, INTERPRETED_MASK_ELEMS // rows_per)) if _interpreted()
                  else min(block, MASK_BLOCK))
    device = target_logits.device
    if device.type == "cpu" and not _interpreted():
        raise RuntimeError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
                           "imported (importing rs_verify.triton_sampler first does it when CUDA is absent)")
    n, v = target_logits.shape
    r = cu_num_logits.shape[0] - 1
    s = temperature.shape[0]
    has_draft = draft_logits is not None
    vd = draft_logits.shape[2] if has_draft else node_draft_logits.shape[1] if tree and node_draft_logits is not None else v
    v_eff = min(v, vd)
    noise = check_noise(stream == "explicit", resample, n, r, v_eff, accept_uniforms, resample_gumbel,
                        resample_uniforms)
    cap = default_max_chunk_logits(v) if max_chunk_logits is None else int(max_chunk_logits)
    if cap < 1:
        raise ValueError(f"max_chunk_logits must be >= 1, got {cap}")

    def dev(t, dtype):
        return t.to(device=device, dtype=dtype).contiguous()

    target = target_logits.contiguous()
    draft = draft_logits.to(device).contiguous() if has_draft else target
    ids = dev(draft_token_ids, torch.int64)
    cu = dev(cu_num_logits, torch.int32)
    pos_d = dev(pos, torch.int64)
    idx = dev(idx_mapping, torch.int32)
    temp = dev(temperature, torch.float32)
    seeds_d = dev(seeds, torch.int64)

    sampled = torch.full((r, k + 1), -1, dtype=torch.int64, device=device)
    num_sampled = torch.zeros(r, dtype=torch.int32, device=device)
    logprobs = None
    if num_logprobs is not None:
        kk = int(num_logprobs)
        lp_ids = torch.zeros((n, kk + 1), dtype=torch.int64, device=device)
        lp_vals = torch.zeros((n, kk + 1), dtype=torch.float32, device=device)
        lp_ranks = torch.zeros(n, dtype=torch.int64, device=device)
        logprobs = (lp_ids, lp_vals, lp_ranks)
    if info is not None:
        info.update(max_buffer_rows=0, num_chunks=0)
    if tree:
        accepted_nodes.fill_(-1)
    if r == 0 or n == 0:
        return sampled, num_sampled, logprobs

    cu_host = np.asarray(cu_num_logits.cpu() if cu_num_logits_host is None else cu_num_logits_host,
                         dtype=np.int64)
    chunks = []
    for a, b in iter_request_chunks(cu_host, cap):
        lo = min(max(int(cu_host[a]), 0), n)
        hi = min(max(int(cu_host[b]), lo), n)
        chunks.append((a, b, lo, hi))

    req_of_row = torch.searchsorted(cu[1:], torch.arange(n, dtype=torch.int32, device=device),
                                    right=True, out_int32=True).clamp_(max=r - 1)
    t_max = torch.empty(n, dtype=torch.float32, device=device)
    t_logsum = torch.empty(n, dtype=torch.float32, device=device)
    t_arg = torch.empty(n, dtype=torch.int32, device=device)
    d_max = torch.empty(n if has_draft else 1, dtype=torch.float32, device=device)
    d_logsum = torch.empty(n if has_draft else 1, dtype=torch.float32, device=device)
    # SPEC 2's parameters (an absent one: its off value) and each row's mask statistics; without
    # any, tensors of the same dtypes stand in (never read), so the kernels' signatures are unchanged.
    masked = int(any(x is not None for _, x in params))
    if masked:
        tk = dev(top_k, torch.int32) if top_k is not None else torch.zeros(s, dtype=torch.int32, device=device)
        tp = dev(top_p, torch.float32) if top_p is not None else torch.ones(s, dtype=torch.float32, device=device)
        mp = dev(min_p, torch.float32) if min_p is not None else torch.zeros(s, dtype=torch.float32, device=device)
        t_thr = torch.empty(n, dtype=torch.float32, device=device)
        t_cut = torch.empty(n, dtype=torch.int32, device=device)
    else:
        tk, tp, mp, t_thr, t_cut = t_arg, temp, temp, t_max, t_arg
    block_mode = int(verification == "block")
    # SPEC 4b: tau and log P_{tau-1} per request (block batches; else stand-ins of the same dtypes)
    tau = torch.empty(r, dtype=torch.int32, device=device) if block_mode else t_arg
    l_res = torch.empty(r, dtype=torch.float32, device=device) if block_mode else t_max
    # SPEC 3c's noise, float64 on the device; its acceptance u feeds verify_kernel / block_tau_kernel,
    # its draws are resample_kernel's. The field an explicit sampler does not read: a stand-in, never
    # read. Another family passes None (a constexpr to Triton): its kernels compile as without them.
    accept_d, gumbel_d, unif_d = (dev(x, torch.float64) if x is not None else t_max if stream == "explicit" else None
                                  for x in noise)
    # SPEC 3b's acceptance is 3a's, its block steps keyed by the step-mixed seed when so declared
    accept_stream = "explicit" if stream == "explicit" else "philox_step" if block_seed == STEP else "philox"
    defer = int(masked or block_mode or stream == "explicit")  # their stochastic draws: resample_kernel (residual.py)

    buf = None
    if tree:  # SPEC 4c: one FP32 residual row of V' per request of the chunk (tree.py)
        rows = max((b - a for a, b, _, _ in chunks), default=0)
        buf = torch.empty((rows, v_eff), dtype=torch.float32, device=device)
        node_q = node_draft_logits.contiguous() if node_draft_logits is not None else target
        q_max = torch.empty(n, dtype=torch.float32, device=device) if node_draft_logits is not None else t_max
        q_logsum = torch.empty(n, dtype=torch.float32, device=device) if node_draft_logits is not None else t_logsum
        parent = dev(tree_parent, torch.int32)
        t_arg_q = torch.empty(n, dtype=torch.int32, device=device)  # Q's argmax: not read
        if info is not None:
            info["max_buffer_rows"] = rows
    elif logprobs is not None:
        rows = max((min(hi - lo, cap) for _, _, lo, hi in chunks), default=0)
        if rows > 0:
            buf = torch.empty((rows, v), dtype=torch.float32, device=device)
        if info is not None:
            info["max_buffer_rows"] = rows
    if info is not None:
        info["num_chunks"] = len(chunks)

    launch = dict(num_warps=NUM_WARPS, enable_fp_fusion=False)
    processed = int(logprobs_mode == "processed")
    # The interpreter evaluates kernels with NumPy: log(0) = -inf and the like are intended.
    with np.errstate(all="ignore"):
        for a, b, lo, hi in chunks:
            if hi > lo:
                tiles = (triton.cdiv(hi - lo, rows_per),)
                kernels.row_stats_kernel[tiles](
                    target, draft, req_of_row, cu, idx, temp,
                    t_max, t_logsum, t_arg, d_max, d_logsum,
                    lo, hi, n, r, s, k, v, vd if has_draft else v, v_eff,
                    HAS_DRAFT=has_draft, BLOCK_R=rows_per, BLOCK_V=block, **launch,
                )
                if tree and node_draft_logits is not None:  # Q's statistics per node row (SPEC 4c)
                    kernels.row_stats_kernel[tiles](
                        node_q, node_q, req_of_row, cu, idx, temp,
                        q_max, q_logsum, t_arg_q, d_max, d_logsum,
                        lo, hi, n, r, s, k, vd, vd, v_eff,
                        HAS_DRAFT=False, BLOCK_R=rows_per, BLOCK_V=block, **launch,
                    )
                if masked:
                    kernels.mask_stats_kernel[tiles](
                        target, req_of_row, idx, temp, tk, tp, mp,
                        t_max, t_logsum, t_thr, t_cut,
                        lo, hi, n, r, s, v, v_eff,
                        BLOCK_R=rows_per, BLOCK_V=block, MASK_BLOCK=mask_block, **launch,
                    )
            if tree:
                kernels.tree_kernel[(triton.cdiv(b - a, rows_per),)](
                    target, node_q, ids, parent, cu, idx, temp,
                    t_max, t_logsum, t_arg, q_max, q_logsum, t_thr, t_cut,
                    accept_d, gumbel_d, unif_d, buf,
                    sampled, num_sampled, accepted_nodes,
                    a, b, n, r, s, k, v, vd, v_eff, masked, int(node_draft_logits is not None),
                    int(tree_drafts == "without_replacement"), int(tree_uniforms == PER_NODE),
                    RESAMPLE=resample, BLOCK_R=rows_per, BLOCK_V=block, **launch,
                )
                continue
            if block_mode:
                kernels.block_tau_kernel[(triton.cdiv(b - a, rows_per),)](
                    target, draft, ids, pos_d, cu, idx, temp, seeds_d,
                    t_max, t_logsum, d_max, d_logsum, t_thr, t_cut, accept_d,
                    sampled, tau, l_res,
                    a, b, n, r, s, k, v, vd, v_eff, masked,
                    HAS_DRAFT=has_draft, STREAM=accept_stream, BLOCK_R=rows_per, BLOCK_V=block, **launch,
                )
            kernels.verify_kernel[(b - a,)](
                target, draft, ids, pos_d, cu, idx, temp, seeds_d, accept_d,
                t_max, t_logsum, t_arg, d_max, d_logsum, t_thr, t_cut, tau,
                sampled, num_sampled,
                a, n, r, s, k, v, vd, v_eff, masked, block_mode, defer,
                HAS_DRAFT=has_draft, STREAM=stream, BLOCK_V=block, **launch,
            )
            if defer:
                kernels.resample_kernel[(triton.cdiv(b - a, rows_per),)](
                    target, draft, ids, pos_d, cu, idx, temp, seeds_d,
                    t_max, t_logsum, d_max, d_logsum, t_thr, t_cut, l_res, gumbel_d, unif_d,
                    sampled, num_sampled,
                    a, b, n, r, s, k, v, vd, v_eff, masked, block_mode, int(has_draft),
                    STREAM=stream, RESAMPLE=resample, BLOCK_R=rows_per, BLOCK_V=block, **launch,
                )
            if buf is None:
                continue
            for blo in range(lo, hi, cap):
                bhi = min(blo + cap, hi)
                kernels.log_softmax_kernel[(triton.cdiv(bhi - blo, rows_per),)](
                    target, buf, req_of_row, idx, temp, t_thr, t_cut,
                    blo, bhi, n, r, s, v, v_eff, processed, masked & processed,
                    BLOCK_R=rows_per, BLOCK_V=block, **launch,
                )
                rows = torch.arange(blo, bhi, device=device)
                tok = emitted_tokens(rows, req_of_row, cu, sampled, num_sampled)
                t_ids, t_vals, t_ranks = row_logprobs(buf[: bhi - blo], tok, int(num_logprobs))
                lp_ids[blo:bhi] = t_ids
                lp_vals[blo:bhi] = t_vals
                lp_ranks[blo:bhi] = t_ranks
    return sampled, num_sampled, logprobs
