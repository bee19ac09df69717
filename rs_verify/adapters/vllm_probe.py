"""What the wrapped vLLM `rejection_sample` draws, and how it takes draft logits: a probe.

vLLM's model runner v2 rejection sampler changed twice under the same calling convention:
- its resample and bonus noise: Triton Philox (SPEC 3a, `"triton-philox"`) before vLLM PR 51367,
  a MurmurHash3 of `(seed, pos, token)` (SPEC 3b, `"murmur3"`) from it on; the acceptance
  uniform is Philox in both;
- its draft logits: processed (divided by the temperature) by the model runner before vLLM
  PR 50910; from it on cached before temperature, in the logits' dtype, and divided by the
  temperature inside the rejection kernels (`"raw"`).
Neither change shows in the signature, so `detect` asks the function itself: one call on
`probe_batch()`, whose output differs under each of the four combinations, compared with the
float64 reference's output under each (`predictions`).

The batch: `V = 16`, model drafts, `K = 1`, two stochastic requests with `T = 0.5` (a power of
two, so scaling logits by `T` is exact):
- request 0 (state 0, seed 1, positions 100, 101) drafts token 5, which the target excludes
  (logit `-2**14`, so `p(5) = 0`): rejected whatever the draft logits, and resampled from the
  target's other 15 tokens, all equally likely, so the token is the argmax of the row's noise
  over them: 1 under triton-philox, 7 under murmur3 (the noise family);
- request 1 (state 1, seed 1, positions 200, 201) drafts token 1 with target logit 2.5 (after
  temperature; 0 elsewhere) and draft logit 2 (0 elsewhere), handed to vLLM before temperature.
  If vLLM divides the draft logits by `T` (raw convention), `q(1) = e**4 / (e**4 + 15) = 0.78`
  and `p(1) / q(1) = 0.57` is below the row's acceptance uniform `u = 0.977`: rejected,
  `num_sampled = 1`. If it takes them as processed, `q(1) = e**2 / (e**2 + 15) = 0.33 < p(1) =
  0.45`: accepted, `num_sampled = 2` (the draft-logit convention).
Every emitted token leads the next-best of its row by at least 0.12 in noise in both families, and
every acceptance decision is at least 0.3 from its threshold in log, so a float32 kernel decides
as the reference does.

The block seed (SPEC 3b; vLLM 0.33.0 on keys block step `i` by `seed ^ (i << 32)`) is asked by
`detect_block_seed` with a second batch, `block_probe_batch()`: block verification, one-hot
drafts, `K = 2`, `T = 1`, two requests (seeds 6 and 2, positions 300..302). Step 0's draft has
`p = 1`, so `P_0 = 1`, `h_0 = 1` and step 0 always accepts; step 1's draft has `p = e**3 / (e**3
+ 15) = 0.57 = h_1`, so the block takes both drafts (`num_sampled = 3`) exactly when step 1's
acceptance uniform is at most 0.57. At position 301 that uniform is 0.313 (seed 6) and 0.733
(seed 2) with the plain seed, 0.897 and 0.470 step-mixed: `num_sampled` `[3, 2]` or `[2, 3]`,
every decision at least 0.1 from its threshold. The acceptance uniform is the same Triton Philox
in every family, so this needs no family.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.triton_philox import acceptance_uniforms
from ..contract.streams import StreamFamily, family as family_of
from ..reference import ReferenceSampler

__all__ = ["BLOCK_SEEDS", "DRAFT_LOGITS", "block_probe_batch", "block_predictions", "detect_block_seed", "PROCESSED", "RAW", "STREAMS", "ProbeError", "detect", "predictions", "probe_batch"]

PROCESSED, RAW = "processed", "raw"
DRAFT_LOGITS = (PROCESSED, RAW)  # divided by T by the model runner (before PR 50910) / inside the kernels (from it on)
STREAMS = ("triton-philox", "murmur3")  # before / from vLLM PR 51367
BLOCK_SEEDS = ("plain", "step")  # the block acceptance seed: before / from vLLM 0.33.0
VOCAB, TEMPERATURE, EXCLUDED = 16, 0.5, -2.0**14  # exact in every logits dtype


OVERRIDE = ("If you know its convention, pass VllmSampler(streams=..., draft_logits=...): then the probe is "
            "skipped and the gate's properties report any wrong output.")


class ProbeError(RuntimeError):
    """The wrapped function's answer to the probe fits none of the conventions the adapter knows."""


def probe_batch() -> SpecBatch:
    """The probe's batch (see the module docstring); raw logits, as a `SpecBatch` holds them."""
    t = TEMPERATURE
    x = np.zeros((4, VOCAB), np.float32)
    x[0, 5] = EXCLUDED  # request 0: the draft (token 5) is excluded by the target
    x[2, 1] = 2.5 * t  # request 1: z(1) = 2.5 after temperature
    d = np.zeros((2, 1, VOCAB), np.float32)
    d[0, 0, :] = EXCLUDED
    d[0, 0, 5] = 0.0  # q of request 0: all on token 5
    d[1, 0, 1] = 2.0  # request 1's draft logit of token 1, before temperature
    return SpecBatch(target_logits=x, draft_logits=d, draft_token_ids=np.array([0, 5, 0, 1], np.int64),
                     cu_num_logits=np.array([0, 2, 4], np.int32), pos=np.array([100, 101, 200, 201], np.int64),
                     idx_mapping=np.array([0, 1], np.int32), temperature=np.full(2, t, np.float32),
                     seeds=np.array([1, 1], np.int64), num_speculative_steps=1)


def _as_processed(batch: SpecBatch) -> SpecBatch:
    """The batch whose correct output is what a function that takes `batch`'s draft logits as
    already divided by `T` returns: draft logits scaled by `T` (exact for a power of two)."""
    t = np.asarray(batch.temperature, np.float32)[:, None, None]
    return batch.replace(draft_logits=(np.asarray(batch.draft_logits) * t).astype(np.float32))


def predictions(streams=STREAMS, draft_logits=DRAFT_LOGITS) -> dict[tuple[str, str], SamplerOutput]:
    """The reference's output of `probe_batch()` with its draft logits handed before temperature,
    under each stream family and draft-logit convention: `{(family name, convention): output}`."""
    batch = probe_batch()
    out = {}
    for which in streams:
        ref = ReferenceSampler(streams=which)
        for convention in draft_logits:
            out[(ref.family.name, convention)] = ref(_as_processed(batch) if convention == PROCESSED else batch)
    keys = list(out)
    for i, a in enumerate(keys):  # the shipped families' answers differ by design; another family's may not
        for b in keys[i + 1:]:
            if _same(out[a], out[b]):
                raise ProbeError(f"the vLLM adapter's probe batch cannot tell {a} from {b}. {OVERRIDE}")
    return out


def _same(a: SamplerOutput, b: SamplerOutput) -> bool:
    return np.array_equal(a.num_sampled, b.num_sampled) and np.array_equal(a.sampled, b.sampled)


def _show(out: SamplerOutput) -> str:
    return f"sampled {np.asarray(out.sampled).tolist()}, num_sampled {np.asarray(out.num_sampled).tolist()}"


def detect(run: Callable[[SpecBatch], SamplerOutput], *, streams: str | StreamFamily | None = None,
           draft_logits: str | None = None) -> tuple[StreamFamily, str]:
    """`(stream family, draft-logit convention)` of the function behind `run`, which verifies a
    batch with its draft logits handed before temperature (the `"raw"` way) and returns its output
    with `-1` past `num_sampled`. A given `streams` or `draft_logits` is taken as known: only the
    other is asked. `ProbeError` when the answer fits none of the candidates."""
    families = {f.name: f for f in map(family_of, STREAMS if streams is None else (streams,))}
    conventions = DRAFT_LOGITS if draft_logits is None else (draft_logits,)
    expected = predictions(tuple(families.values()), conventions)
    got = run(probe_batch())
    for (name, convention), out in expected.items():
        if _same(got, out):
            return families[name], convention
    lines = "\n".join(f"  {name} noise, {convention} draft logits: {_show(out)}"
                      for (name, convention), out in expected.items())
    given = [f"{k}={v!r}" for k, v in (("streams", streams), ("draft_logits", draft_logits)) if v is not None]
    given = f"with {' and '.join(given)} as given " if given else ""
    raise ProbeError(
        f"the vLLM adapter cannot tell what the wrapped rejection_sample draws: on its probe batch "
        f"(rs_verify.adapters.vllm_probe.probe_batch()) it returned {_show(got)}, where the candidates "
        f"{given}predict\n{lines}\nIt may draw another stream family, take draft logits another way, or be "
        f"wrong on this batch. {OVERRIDE}")


def block_probe_batch() -> SpecBatch:
    """The block seed's probe batch (see the module docstring)."""
    x = np.zeros((6, VOCAB), np.float32)
    x[[0, 3], :] = EXCLUDED
    x[[0, 3], 3] = 0.0  # step 0: p(3) = 1
    x[[1, 4], 4] = 3.0  # step 1: p(4) = e**3 / (e**3 + 15)
    return SpecBatch(target_logits=x, draft_logits=None, draft_token_ids=np.array([0, 3, 4] * 2, np.int64),
                     cu_num_logits=np.array([0, 3, 6], np.int32), pos=np.array([300, 301, 302] * 2, np.int64),
                     idx_mapping=np.array([0, 1], np.int32), temperature=np.ones(2, np.float32),
                     seeds=np.array([6, 2], np.int64), num_speculative_steps=2, verification="block")


def block_uniforms(seeds: np.ndarray, pos: np.ndarray, step: int, block_seed: str) -> np.ndarray:
    """SPEC 3b's acceptance uniform of block step `step`: the seed itself (`"plain"`) or step-mixed,
    `seed ^ (step << 32)` (`"step"`)."""
    seeds = np.asarray(seeds, np.int64)
    return acceptance_uniforms(seeds ^ np.int64(step << 32) if block_seed == "step" else seeds, pos)


def block_predictions() -> dict[str, np.ndarray]:
    """`{block seed: num_sampled}` of `block_probe_batch()`: 3 where step 1's uniform is at most its
    threshold `p(4)` (step 0 always accepts), else 2."""
    probe = block_probe_batch()
    row = np.asarray(probe.target_logits, np.float64)[[1, 4]]
    p = np.exp(row[:, 4]) / np.exp(row).sum(axis=1)
    pos = np.asarray(probe.pos)[[1, 4]]
    return {which: np.where(block_uniforms(probe.seeds, pos, 1, which) <= p, 3, 2).astype(np.int32)
            for which in BLOCK_SEEDS}


def detect_block_seed(run: Callable[[SpecBatch], SamplerOutput]) -> str:
    """`"plain"` or `"step"`: the block seed of the function behind `run` (module docstring);
    `ProbeError` when its `num_sampled` fits neither."""
    expected = block_predictions()
    got = np.asarray(run(block_probe_batch()).num_sampled)
    for which, num in expected.items():
        if np.array_equal(got, num):
            return which
    raise ProbeError(
        f"the vLLM adapter cannot tell which seed the wrapped rejection_sample draws block acceptances from: on "
        f"rs_verify.adapters.vllm_probe.block_probe_batch() it returned num_sampled {got.tolist()}, where the plain "
        f"seed predicts {expected['plain'].tolist()} and the step-mixed seed (seed ^ (i << 32)) "
        f"{expected['step'].tolist()}. If you know it, pass VllmSampler(block_seed=...).")
