"""The kernel launches of the built-in sampler, recorded without running them (for `aot.py`).

`launches()` calls `rejection_sample` on `meta` tensors (shapes and dtypes, no data, no device)
with the kernels swapped for recorders, so the recorded arguments are exactly what the sampler
passes: the same code path as a real call, minus the kernels.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..contract import methods
from ..contract.explicit import EXPLICIT, GUMBEL, RESAMPLE
from ..contract.streams import PLAIN
from . import sampler
from .sampler import DEFAULT_BLOCK_V, TORCH_DTYPES, rejection_sample
from .streams import DEFAULT_STREAMS, STREAMS, stream_family

KERNELS = ("row_stats_kernel", "mask_stats_kernel", "block_tau_kernel", "verify_kernel", "resample_kernel",
           "log_softmax_kernel", "tree_kernel")
DRAFT_MODES = ("model", "one_hot")
# One vocabulary size per class Triton specializes an int argument on: divisible by 16, not, and 1.
VOCAB_CLASSES = {"16n": 160, "other": 33, "1": 1}


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the arguments `rejection_sample` passed (`meta` tensors)."""

    kernel: str
    args: tuple
    kwargs: dict
    label: str


class _Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the launch instead of running it."""

    def __init__(self, name, sink, label):
        self.name, self.sink, self.label = name, sink, label

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.sink.append(Launch(self.name, args, dict(kwargs), self.label))
        return launch


@contextlib.contextmanager
def _recording(sink, label):

    real = sampler.kernels
    sampler.kernels = type("RecordingKernels", (), {k: _Recorder(k, sink, label) for k in KERNELS})()
    try:
        yield
    finally:
        sampler.kernels = real


# The recorded batch: 3 requests of 2, 0 and 1 drafts (cu_num_logits), N = 6 rows, S = 4 request slots, K = 2.
CU = [0, 3, 4, 6]
SIZES = (CU[-1], len(CU) - 1, 4, 2)  # n, r, s, k


def _empty(shape, dt):
    """A `meta` tensor: shape and dtype, no data, no device."""
    return torch.empty(shape, dtype=dt, device="meta")


def _rows_and_requests() -> tuple:
    """`rejection_sample`'s arguments after the logits: draft_token_ids, cu_num_logits, pos, idx_mapping,
    temperature, seeds."""
    n, r, s, _ = SIZES
    return (_empty(n, torch.int64), _empty(r + 1, torch.int32), _empty(n, torch.int64), _empty(r, torch.int32),
            _empty(s, torch.float32), _empty(s, torch.int64))


def _noise(v, vd, resample) -> dict:
    """The explicit family's float64 noise (SPEC 3c) and how it resamples (SPEC 4)."""
    n, r = SIZES[:2]
    return dict(accept_uniforms=_empty(n, torch.float64), resample_gumbel=_empty((r, min(v, vd)), torch.float64),
                resample_uniforms=_empty(r, torch.float64), resample=resample)


def _parameters() -> dict:
    """All three sampling parameters (SPEC 2), one entry per request slot."""
    s = SIZES[2]
    return dict(top_k=_empty(s, torch.int32), top_p=_empty(s, torch.float32), min_p=_empty(s, torch.float32))


def _record_tree(sink, label, dtype, drafts, v, vd, block_v, features, resample):
    """Record the launches of a tree batch (SPEC 4c, explicit family): the meta batch of `_record` as trees
    (node draft logits [N, Vd] for model drafts), with all three sampling parameters when `features`."""
    n, r, _, k = SIZES
    logits = TORCH_DTYPES[dtype]
    extra = _parameters() if features else {}
    with _recording(sink, label + ", tree"):
        rejection_sample(
            _empty((n, v), logits), None, *_rows_and_requests(), num_speculative_steps=k, max_chunk_logits=2,
            block_v=block_v, cu_num_logits_host=CU, verification=methods.TREE.name, streams=EXPLICIT.name,
            **_noise(v, vd, resample),
            tree_parent=_empty(n, torch.int32),
            node_draft_logits=_empty((n, vd), logits) if drafts == "model" else None,
            accepted_nodes=_empty((r, k), torch.int32), **extra)


def _record(sink, label, dtype, drafts, v, vd, block_v, logprobs_mode, features=False, streams=DEFAULT_STREAMS,
            resample=GUMBEL, block_seed=PLAIN):
    """Record the launches of `rejection_sample` on the meta batch (`CU`, `SIZES`);
    with `features`, with all three sampling parameters and block verification (SPEC 2, 4b); the
    random numbers of the stream family `streams` (SPEC 3; explicit: the batch's float64 noise,
    resampled as `resample` says, SPEC 4), block steps keyed by `block_seed` (SPEC 3b)."""
    n, _, s, k = SIZES
    logits = TORCH_DTYPES[dtype]
    extra = dict(_parameters(), verification=methods.BLOCK.name) if features else {}
    if streams == EXPLICIT.name:
        extra.update(_noise(v, vd, resample))
    with _recording(sink, label):
        rejection_sample(
            _empty((n, v), logits), _empty((s, k, vd), logits) if drafts == "model" else None, *_rows_and_requests(),
            num_speculative_steps=k, max_chunk_logits=2, block_v=block_v, cu_num_logits_host=CU,
            num_logprobs=None if logprobs_mode is None else 1, logprobs_mode=logprobs_mode or "raw", streams=streams,
            block_seed=block_seed, **extra)


def launches(*, dtypes=tuple(TORCH_DTYPES), draft_modes=DRAFT_MODES, block_sizes=(DEFAULT_BLOCK_V,),
             vocab_classes=tuple(VOCAB_CLASSES), streams=tuple(STREAMS), resamples=RESAMPLE) -> list[Launch]:
    """Every launch `rejection_sample` makes over the batch shapes asked for (repeats included),
    each batch shape without and with sampling parameters and block verification (runtime flags:
    the same specializations, plus `mask_stats_kernel`'s).

    - dtypes: logits dtypes (`float32`, `bfloat16`, `float16`).
    - draft_modes: `model` (draft logits) and / or `one_hot` (no draft logits).
    - block_sizes: `block_v` values (powers of two >= 16).
    - vocab_classes: keys of `VOCAB_CLASSES`, for the target and (model drafts, at most V) the draft vocabulary.
    - streams: stream families the sampler draws (`streams.STREAMS`, SPEC 3): the constexpr `STREAM`
      of the kernels that read or draw noise; the default family's launches come first.
    - resamples: how the explicit family resamples (SPEC 4: `resample_kernel`'s constexpr
      `RESAMPLE`); the other families resample by Gumbel-max only.
    Block batches are recorded with each block seed the family offers (SPEC 3b: `block_tau_kernel`'s
    STREAM "philox_step"); the explicit family's batch shapes also as tree batches (SPEC 4c: `tree_kernel`).
    """
    out = []
    sizes = [VOCAB_CLASSES[c] for c in vocab_classes]
    pairs = [(f, m) for f in streams for m in (resamples if f == EXPLICIT.name else (GUMBEL,))]
    for family, resample in pairs:
        for dtype in dtypes:
            for drafts in draft_modes:
                for block_v in block_sizes:
                    for v in sizes:
                        for vd in ([vd for vd in sizes if vd <= v] if drafts == "model" else [v]):
                            label = f"{dtype}, {drafts} drafts, BLOCK_V={block_v}, V={v}"
                            label += f", Vd={vd}" if drafts == "model" else ""
                            label += "" if family == DEFAULT_STREAMS else f", {family} streams"
                            label += "" if resample == GUMBEL else f", {resample} resample"
                            seeds = stream_family(family).block_seeds
                            for mode in (None, "raw", "processed"):
                                for features, block_seed in ((False, PLAIN), *((True, b) for b in seeds)):
                                    _record(out, label + ("" if block_seed == PLAIN else ", step block seed"), dtype,
                                            drafts, v, vd, block_v, mode, features, family, resample, block_seed)
                            if family == EXPLICIT.name:  # SPEC 4c: tree batches, without and with parameters
                                for features in (False, True):
                                    _record_tree(out, label, dtype, drafts, v, vd, block_v, features, resample)
    return out
