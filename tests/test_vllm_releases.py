"""The vLLM adapter over fakes of the releases users install (vLLM 0.33.0 and 0.34.0), without vLLM.

`release_0_33` has 0.33.0's signature of `rejection_sample` (every optional parameter: `use_fp64`,
`use_block_verification`, the lossy modes and their knobs), `release_0_34` 0.34.0's
(`draft_logits_cache: DraftLogitsCache` instead of a tensor, `skip_masked_vocab_blocks`); both
verify with the float64 reference (murmur3, raw draft logits, the plain block seed) and assert
that every lossy mode arrives at its default. `DraftLogitsCache` below has 0.34.0's constructor
and fields; the adapter finds it among the wrapped function's globals, as it finds vLLM's.
"""

import os
import sys
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as libdevice

from rs_verify.adapters import vllm_convention
from rs_verify.adapters.vllm import VllmFp64Sampler, VllmSampler
from rs_verify.adapters.vllm_chunks import VllmChunkedSampler
from rs_verify.adapters.vllm_probe import block_predictions, block_probe_batch
from rs_verify.contract.batch import SpecBatch
from rs_verify.contract.known_deviations import EMPTY_RESIDUAL_TOKEN0_LOG
from rs_verify.contract.streams import FAMILIES
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.harness import device as backend
from rs_verify.properties import PROPERTIES
from rs_verify.reference import ReferenceSampler

LOSSY_DEFAULTS = dict(synthetic_conditional_rates=None, contexts=None, watermarking=None, watermarking_skip_mask=None,
                      watermark_key=None, fly_window_size=0, fly_entropy_threshold=0.3, fly_entropy_top_k=3)


def _verify(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, temperature, seed,
            num_speculative_steps, use_fp64, use_block_verification, lossy):
    """The reference's answer in vLLM's layout: processed target logits (verified at T = 1), raw
    draft logits divided by T here, `sampled` past `num_sampled` left as token 0 (vLLM's new_empty)."""
    assert lossy == LOSSY_DEFAULTS, f"a lossy mode was enabled: {lossy}"
    assert isinstance(use_fp64, bool) and isinstance(use_block_verification, bool)
    streams = "murmur3-fp64" if use_fp64 else "murmur3"
    t = temperature.cpu().numpy()
    drafts = None
    if draft_logits is not None:
        with np.errstate(over="ignore"):
            drafts = draft_logits.float().cpu().numpy() / np.where(t > 0, t, np.float32(1))[:, None, None]
    batch = SpecBatch(target_logits=target_logits.cpu().numpy(), draft_logits=drafts,
                      draft_token_ids=draft_sampled.cpu().numpy(), cu_num_logits=cu_num_logits.cpu().numpy(),
                      pos=pos.cpu().numpy(), idx_mapping=idx_mapping.cpu().numpy(),
                      temperature=np.where(t > 0, 1, 0).astype(np.float32), seeds=seed.cpu().numpy(),
                      num_speculative_steps=num_speculative_steps,
                      verification="block" if use_block_verification else "token")
    out = ReferenceSampler(streams=streams, validate=False)(batch)
    return torch.from_numpy(np.maximum(out.sampled, 0)), torch.from_numpy(out.num_sampled.astype(np.int32))


def release_0_33(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None,
                 use_fp64=False, use_block_verification=False, contexts=None, watermarking=None,
                 watermarking_skip_mask=None, watermark_key=None, fly_window_size=0, fly_entropy_threshold=0.3,
                 fly_entropy_top_k=3):
    lossy = {k: v for k, v in locals().items() if k in LOSSY_DEFAULTS}
    assert target_logits.ndim == 2 and (draft_logits is None or draft_logits.ndim == 3)
    return _verify(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, temperature, seed,
                   num_speculative_steps, use_fp64, use_block_verification, lossy)


class DraftLogitsCache:
    """vLLM 0.34.0's constructor and fields (replicated: no row mapping unless sharded)."""

    def __init__(self, max_num_reqs, num_steps, vocab_size, *, dtype, fill, device, sharded=False):
        assert not sharded, "the adapter builds a replicated cache"
        self.row_mapping = None
        self.values = torch.full((max_num_reqs, num_steps, vocab_size), fill, dtype=dtype, device=device)


def release_0_34(target_logits, draft_logits_cache, draft_sampled, cu_num_logits, pos, idx_mapping,
                 expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                 synthetic_conditional_rates=None, use_fp64=False, use_block_verification=False, contexts=None,
                 watermarking=None, watermarking_skip_mask=None, watermark_key=None, fly_window_size=0,
                 fly_entropy_threshold=0.3, fly_entropy_top_k=3, skip_masked_vocab_blocks=False):
    lossy = {k: v for k, v in locals().items() if k in LOSSY_DEFAULTS}
    assert draft_logits_cache is None or isinstance(draft_logits_cache, DraftLogitsCache)
    assert isinstance(skip_masked_vocab_blocks, bool)
    draft_logits = None if draft_logits_cache is None else draft_logits_cache.values
    return _verify(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, temperature, seed,
                   num_speculative_steps, use_fp64, use_block_verification, lossy)


RELEASES = {"0.33.0": release_0_33, "0.34.0": release_0_34}


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_is_bound_and_gated(release, reference):
    declared = record_of(VllmSampler(rejection_sample=RELEASES[release], device="cpu")).applied
    assert declared.names == ("block_nan_prefix_resets", "empty_residual_token0")  # what the releases carry
    # SPEC 11 "as the sampler sees it": MRV2's resample kernel keeps the residual in float32 log space.
    assert declared.at("empty_residual") is EMPTY_RESIDUAL_TOKEN0_LOG
    # The fakes follow SPEC 4 and 4b exactly: a declared deviation they do not have would fail (SPEC 11).
    sampler = VllmSampler(rejection_sample=RELEASES[release], device="cpu", deviations=())
    assert (sampler.streams, sampler.draft_logits, sampler.block_seed) == ("murmur3", "raw", "plain")
    assert sampler.verification_methods == {"token", "block"}
    assert ("draft_logits_cache" in sampler.parameters) == (release == "0.34.0")
    for name in ("certified_equivalence", "output_invariants"):
        outcome = run(PROPERTIES[name], make_context(sampler, reference, profile="ci"))
        assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason


def test_the_draft_logits_cache_holds_the_batch_draft_logits_replicated():
    sampler = VllmSampler(rejection_sample=release_0_34, device="cpu", streams="murmur3", draft_logits="raw")
    batch = block_probe_batch().replace(draft_logits=np.arange(2 * 2 * 16, dtype=np.float32).reshape(2, 2, 16),
                                        logits_dtype="bfloat16")
    args = sampler.arguments(batch)
    cache = args["draft_logits_cache"]
    assert isinstance(cache, DraftLogitsCache) and cache.row_mapping is None and "draft_logits" not in args
    assert cache.values.dtype == torch.bfloat16 and torch.equal(cache.values.float(), torch.from_numpy(
        np.asarray(batch.draft_logits)).bfloat16().float())
    assert sampler.arguments(batch.replace(draft_logits=None))["draft_logits_cache"] is None


def test_skip_masked_vocab_blocks_is_passed_as_asked_and_refused_where_absent():
    batch = block_probe_batch()
    for asked in (False, True):
        sampler = VllmSampler(rejection_sample=release_0_34, device="cpu", streams="murmur3", draft_logits="raw",
                              block_seed="plain", skip_masked_vocab_blocks=asked)
        assert sampler.arguments(batch)["skip_masked_vocab_blocks"] is asked
    with pytest.raises(ValueError, match="skip_masked_vocab_blocks: .*has no parameter"):
        VllmSampler(rejection_sample=release_0_33, device="cpu", skip_masked_vocab_blocks=True)


@pytest.mark.parametrize("option, value", [("fly_window_size", 4), ("synthetic_conditional_rates", [0.5]),
                                           ("watermark_key", 7), ("watermarking", True)])
def test_lossy_modes_are_refused_by_name(option, value):
    with pytest.raises(ValueError, match=f"{option}=.*lossy by design"):
        VllmSampler(rejection_sample=release_0_33, device="cpu", **{option: value})
    with pytest.raises(TypeError, match="unexpected option 'fly_windows'"):
        VllmSampler(rejection_sample=release_0_33, device="cpu", fly_windows=4)


def test_an_unknown_parameter_is_an_error_naming_it():
    def required(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps, bonus_mask):
        raise AssertionError("never called")

    def optional(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps, use_block_verification=False,
                 lenient_accept=False):
        return release_0_33(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                            expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                            use_block_verification=use_block_verification)

    with pytest.raises(TypeError, match=r"requires parameters \['bonus_mask'\]"):
        VllmSampler(rejection_sample=required, device="cpu")
    with pytest.raises(TypeError, match=r"takes parameters \['lenient_accept'\] .*allow_defaults"):
        VllmSampler(rejection_sample=optional, device="cpu")
    sampler = VllmSampler(rejection_sample=optional, device="cpu", allow_defaults=["lenient_accept"])
    assert "lenient_accept" not in sampler.parameters and sampler.streams == "murmur3"
    assert sampler.unvalidated().allow_defaults == ("lenient_accept",)


def test_use_fp64_is_gated_as_its_stream_family():
    with pytest.raises(ValueError, match="use_fp64=True draws the 'murmur3-fp64' stream family, not 'murmur3'"):
        VllmSampler(rejection_sample=release_0_33, device="cpu", use_fp64=True, streams="murmur3")

    def older(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
              expanded_local_pos, temperature, seed, num_speculative_steps):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="use_fp64: .*has no parameter use_fp64"):
        VllmFp64Sampler(rejection_sample=older, device="cpu")
    if "murmur3-fp64" not in FAMILIES:
        pytest.skip("the murmur3-fp64 stream family (rs_verify/contract/murmur3_fp64.py) is not in this tree")
    sampler = VllmFp64Sampler(rejection_sample=release_0_33, device="cpu")
    assert sampler.streams == "murmur3-fp64" and sampler.use_fp64 is True
    assert record_of(sampler).applied.at("empty_residual").empty_view == "log"  # SPEC 11: as its kernel sees it
    assert sampler.arguments(block_probe_batch())["use_fp64"] is True
    assert VllmSampler(rejection_sample=release_0_33, device="cpu").arguments(block_probe_batch())["use_fp64"] is False


def test_the_probe_tells_the_block_seed():
    """The plain-seed fakes answer `plain`; the batch tells the two seeds apart by design."""
    assert {k: v.tolist() for k, v in block_predictions().items()} == {"plain": [3, 2], "step": [2, 3]}
    assert VllmSampler(rejection_sample=release_0_33, device="cpu").block_seed == "plain"
    try:
        step = ReferenceSampler(streams="murmur3", block_seed="step", validate=False)
    except TypeError:
        pytest.skip("ReferenceSampler(block_seed=) is not in this tree")

    def stepped(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                expanded_local_pos, temperature, seed, num_speculative_steps, use_block_verification=False):
        batch = SpecBatch(target_logits=target_logits.numpy(), draft_logits=None, draft_token_ids=draft_sampled.numpy(),
                          cu_num_logits=cu_num_logits.numpy(), pos=pos.numpy(), idx_mapping=idx_mapping.numpy(),
                          temperature=temperature.numpy(), seeds=seed.numpy(), num_speculative_steps=num_speculative_steps,
                          verification="block" if use_block_verification else "token")
        out = step(batch)
        return torch.from_numpy(np.maximum(out.sampled, 0)), torch.from_numpy(out.num_sampled)

    sampler = VllmSampler(rejection_sample=stepped, device="cpu", streams="murmur3", draft_logits="raw")
    assert sampler.block_seed == "step"


def test_without_validation_the_layout_is_still_checked():
    """The adapter's own code indexes by cu_num_logits and the shapes: a malformed layout is a
    ValueError before the wrapped function sees anything."""
    def never(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
              expanded_local_pos, temperature, seed, num_speculative_steps):
        raise AssertionError("the wrapped function was called on a malformed batch")

    sampler = VllmSampler(rejection_sample=never, device="cpu", streams="murmur3", draft_logits="raw",
                          validate=False)
    batch = block_probe_batch().replace(verification="token")
    with pytest.raises(ValueError, match="cu_num_logits"):
        sampler(batch.replace(cu_num_logits=np.array([0, 4, 3], np.int32)))
    with pytest.raises(ValueError, match="target_logits"):
        sampler(batch.replace(target_logits=np.zeros((6, 2, 16), np.float32)))


def test_the_chunk_loop_adapter_says_what_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm...` now raises ImportError
    with pytest.raises(ImportError, match="needs vLLM with the model runner v2 rejection sampler"):
        VllmChunkedSampler()


def test_the_masked_load_probe_is_right_where_the_interpreter_is(monkeypatch):
    """float32 and float16 masked loads are right under the interpreter, so the probe says so; the
    chunk-loop adapter drops bfloat16 only where the probe finds it wrong (Triton 3.9's interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the probe's kernel is decorated
    vllm_convention.interpreter_masks_wrong.cache_clear()
    try:
        assert not vllm_convention.interpreter_masks_wrong("float32")
        assert not vllm_convention.interpreter_masks_wrong("float16")
    finally:
        vllm_convention.interpreter_masks_wrong.cache_clear()


def test_the_environment_a_release_needs_is_set_by_the_adapter(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    vllm_convention.prepare_environment(interpreted=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    vllm_convention.prepare_environment(interpreted=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


# vLLM's way of reaching libdevice, given the stand-in as the adapter gives it to the wrapped module.
STAND_IN = types.SimpleNamespace(tldevice=libdevice)
vllm_convention.install_log1p(STAND_IN)


@triton.jit
def _log1p_kernel(x_ptr, out_ptr):
    i = tl.arange(0, 8)
    tl.store(out_ptr + i, STAND_IN.tldevice.log1p(tl.load(x_ptr + i)))


@pytest.mark.skipif(not backend.interpreted(), reason="the stand-in is for Triton's interpreter, which has no libdevice")
def test_the_log1p_stand_in_matches_torch():
    x = torch.tensor([-1e-8, -1e-4, -0.25, -0.5, -0.999, 0.0, 0.5, -1.0], dtype=torch.float32)
    out = torch.empty_like(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        _log1p_kernel[(1,)](x, out)
    torch.testing.assert_close(out, torch.log1p(x), rtol=2e-7, atol=0)
    assert STAND_IN.tldevice.exp is libdevice.exp  # every other name is libdevice's


def test_before_0_32_the_chunk_loop_processes_every_state_the_release_would():
    """Before 0.32.0 `SamplingStates.add_request` returns nothing and `Sampler.add_request` decides
    whether a state's logits are processed at all: the adapter follows its rule (temperature other
    than 0 and 1, min-p, top-k, top-p), else a temperature never reaches the target logits."""
    from rs_verify.adapters.vllm_chunks import _needs_processing

    def states(t, min_p=0.0, top_k=5, top_p=1.0):
        col = lambda v: types.SimpleNamespace(np=np.array([v]))  # noqa: E731
        return types.SimpleNamespace(temperature=col(t), min_p=col(min_p), top_k=col(top_k), top_p=col(top_p),
                                     vocab_size=5)

    assert _needs_processing(states(0.5), 0, None)
    assert not _needs_processing(states(1.0), 0, None) and not _needs_processing(states(0.0), 0, None)
    assert _needs_processing(states(1.0, min_p=0.1), 0, None) and _needs_processing(states(1.0, top_k=2), 0, None)
    assert _needs_processing(states(1.0), 0, True) and not _needs_processing(states(0.5), 0, False)
