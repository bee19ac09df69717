"""The vLLM adapter (rs_verify.adapters.vllm) without vLLM: its conversion, checked against
functions with vLLM's calling convention built from this project's own samplers.

`convention_rejection_sample` takes exactly what vLLM's MRV2 `rejection_sample` took before vLLM
PRs 50910 and 51367 (processed fp32 logits, the expanded index arrays, ...), checks what vLLM's
kernels rely on, and verifies with the built-in kernels. The adapter over it must reproduce the
built-in sampler bit for bit on generated batches: any slip in the conversion (temperature,
layouts, dtypes, the -1 padding of `sampled`) changes a token or trips a check.

`reference_rejection_sample(streams, draft_logits)` is the same convention over the float64
reference, of either stream family and either draft-logit convention (`"raw"`: the function
divides the draft logits by the temperature itself, as vLLM does from PR 50910 on). The adapter
must tell each apart by its probe and pass the gate over it; forced to the wrong convention, it
must fail.
"""

import re
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from conftest import no_shrink
from rs_verify.adapters.vllm import VllmSampler
from rs_verify.adapters.vllm_probe import ProbeError, predictions, probe_batch
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import Outcome, make_context, run
from rs_verify.properties import PROPERTIES
from rs_verify.properties.assertions import assert_same_output, call
from rs_verify.reference import ReferenceSampler
from rs_verify.strategies import spec_batches


def convention_rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                                expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                                synthetic_conditional_rates=None, use_fp64=False, use_block_verification=False, *,
                                block_v=16):
    """vLLM's MRV2 calling convention over rs_verify's kernels (see the module docstring)."""
    from rs_verify.triton_sampler import rejection_sample

    assert target_logits.dtype == torch.float32 and target_logits.dim() == 2 and target_logits.stride(-1) == 1
    assert draft_logits is None or (draft_logits.dtype == torch.float32 and draft_logits.dim() == 3
                                    and draft_logits.stride(-1) == 1)
    expected = {"draft_sampled": (draft_sampled, torch.int64), "cu_num_logits": (cu_num_logits, torch.int32),
                "pos": (pos, torch.int64), "idx_mapping": (idx_mapping, torch.int32),
                "expanded_idx_mapping": (expanded_idx_mapping, torch.int32),
                "expanded_local_pos": (expanded_local_pos, torch.int32),
                "temperature": (temperature, torch.float32), "seed": (seed, torch.int64)}
    for name, (t, dtype) in expected.items():
        assert t.dtype == dtype and t.is_contiguous() and t.device == target_logits.device, name
    n, r = target_logits.shape[0], cu_num_logits.shape[0] - 1
    cu = cu_num_logits.cpu().long()
    req = torch.searchsorted(cu[1:], torch.arange(n), right=True).clamp(max=r - 1)
    assert torch.equal(expanded_idx_mapping.cpu(), idx_mapping.cpu()[req]), "expanded_idx_mapping"
    assert torch.equal(expanded_local_pos.cpu().long(), torch.arange(n) - cu[req]), "expanded_local_pos"
    assert isinstance(use_block_verification, bool), "use_block_verification"
    # The logits arrive processed (z = x / T): the kernels must not divide again, and x / 1 == x.
    unit = torch.where(temperature == 0, temperature, torch.ones_like(temperature))
    sampled, num_sampled, _ = rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos,
                                               idx_mapping, unit, seed, num_speculative_steps=num_speculative_steps,
                                               block_v=block_v,
                                               verification="block" if use_block_verification else "token")
    # vLLM allocates `sampled` with new_empty: nothing past num_sampled is defined. Token 0 there.
    cols = torch.arange(sampled.shape[1], device=sampled.device)
    return torch.where(cols[None, :] < num_sampled[:, None].long(), sampled, 0), num_sampled


def reference_rejection_sample(streams: str, draft_logits: str):
    """vLLM's MRV2 calling convention over the float64 reference drawing `streams`, taking draft
    logits `draft_logits`: "processed" (divided by T, float32: vLLM before PR 50910) or "raw"
    (before temperature, in the logits' dtype, divided here on load as vLLM's kernels do from
    PR 50910 on)."""
    reference = ReferenceSampler(streams=streams, validate=False)  # the adapter validated the batch
    convention = draft_logits

    def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                         expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                         synthetic_conditional_rates=None, use_fp64=False, use_block_verification=False):
        assert target_logits.dtype == torch.float32 and target_logits.stride(-1) == 1
        t = temperature.cpu().numpy()
        drafts = None
        if draft_logits is not None:
            assert draft_logits.stride(-1) == 1
            assert convention == "raw" or draft_logits.dtype == torch.float32, "processed draft logits are float32"
            drafts = draft_logits.float().cpu().numpy()
            if convention == "raw":  # z = fp32(x) / T on load; greedy states' drafts are never read
                with np.errstate(over="ignore"):  # as IEEE division does, to inf
                    drafts = drafts / np.where(t > 0, t, np.float32(1))[:, None, None]
        # The target logits arrive processed: the reference verifies them at T = 1 (z / 1 == z).
        batch = SpecBatch(target_logits=target_logits.cpu().numpy(), draft_logits=drafts,
                          draft_token_ids=draft_sampled.cpu().numpy(), cu_num_logits=cu_num_logits.cpu().numpy(),
                          pos=pos.cpu().numpy(), idx_mapping=idx_mapping.cpu().numpy(),
                          temperature=np.where(t > 0, 1, 0).astype(np.float32), seeds=seed.cpu().numpy(),
                          num_speculative_steps=num_speculative_steps,
                          verification="block" if use_block_verification else "token")
        out = reference(batch)
        # vLLM allocates `sampled` with new_empty: nothing past num_sampled is defined. Token 0 there.
        return torch.from_numpy(np.maximum(out.sampled, 0)), torch.from_numpy(out.num_sampled.astype(np.int32))

    return rejection_sample


@pytest.fixture(scope="module")
def adapter(triton_sampler):
    def fn(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
           expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None,
           use_fp64=False, use_block_verification=False):
        return convention_rejection_sample(
            target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, seed, num_speculative_steps,
            use_block_verification=use_block_verification, block_v=triton_sampler.block_v)

    return VllmSampler(rejection_sample=fn, device=triton_sampler.device, deviations=())  # SPEC-exact fakes


# Bit-for-bit equality with the kernels the adapter wraps: a quarter of the ci examples (two
# interpreted calls each) covers the calling convention; the gate's properties test the kernels.
@settings(max_examples=10)
@given(batch=spec_batches(logprobs=(None,), verifications=("token", "block")))
def test_adapter_equals_builtin_sampler(adapter, triton_sampler, batch):
    out = call(adapter, batch)
    assert out.logprobs is None
    assert_same_output(out, call(triton_sampler, batch), what="vLLM adapter over the built-in kernels vs built-in",
                       batch=batch)


def test_declared_capabilities(adapter):
    assert adapter.supports_logprobs is False and adapter.supports_chunking is False
    assert adapter.streams == "triton-philox" and adapter.draft_logits == "processed"  # told by the probe
    assert adapter.interpreted == (adapter.device.type != "cuda")
    assert adapter.verification_methods == {"token", "block"} and adapter.sampling_params == frozenset()
    raw = adapter.unvalidated()
    assert raw.validate is False and raw.rejection_sample is adapter.rejection_sample
    assert raw.verification_methods == adapter.verification_methods
    assert (raw.streams, raw.draft_logits) == (adapter.streams, adapter.draft_logits)


def test_block_declared_only_with_use_block_verification():
    """A rejection_sample without the parameter (vLLM before #46781) is token-wise only: block
    batches are refused, never verified token by token; batches with sampling parameters too."""
    from rs_verify import SpecBatch

    def older(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
              expanded_local_pos, temperature, seed, num_speculative_steps):
        raise AssertionError("never called")

    sampler = VllmSampler(rejection_sample=older, device="cpu", streams="triton-philox", draft_logits="processed")
    assert sampler.verification_methods == {"token"} and "use_block_verification" not in sampler.parameters
    batch = SpecBatch(target_logits=np.zeros((1, 5), np.float32), draft_logits=None,
                      draft_token_ids=np.zeros(1, np.int64), cu_num_logits=np.array([0, 1], np.int32),
                      pos=np.zeros(1, np.int64), idx_mapping=np.array([0], np.int32),
                      temperature=np.array([0.5], np.float32), seeds=np.array([3], np.int64), num_speculative_steps=0)
    with pytest.raises(ValueError, match="verification"):
        sampler(batch.replace(verification="block"))
    with pytest.raises(ValueError, match="top_k: this adapter applies no sampling parameters"):
        sampler(batch.replace(top_k=np.array([2], np.int32)))


def test_without_vllm_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm...` now raises ImportError
    with pytest.raises(ImportError, match="needs vLLM with the model runner v2 rejection sampler"):
        VllmSampler()


def test_a_changed_calling_convention_fails_at_construction():
    def newer(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
              expanded_local_pos, temperature, seed, num_speculative_steps, bonus_mask):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"requires parameters \['bonus_mask'\]"):
        VllmSampler(rejection_sample=newer, device="cpu")


def test_empty_arrays_get_ordinary_strides(adapter):
    """K = 0: the draft logits [S, 0, Vd] reach the kernel with stride(-1) == 1 (real kernels assert it)."""
    from rs_verify import SpecBatch

    batch = SpecBatch(target_logits=np.zeros((2, 5), np.float32), draft_logits=np.zeros((2, 0, 5), np.float32),
                      draft_token_ids=np.zeros(2, np.int64), cu_num_logits=np.array([0, 1, 2], np.int32),
                      pos=np.zeros(2, np.int64), idx_mapping=np.array([1, 0], np.int32),
                      temperature=np.array([0.5, 0.0], np.float32), seeds=np.array([3, 4], np.int64),
                      num_speculative_steps=0)
    args = adapter.arguments(batch)
    assert args["draft_logits"].shape == (2, 0, 5) and args["draft_logits"].stride() == (5, 5, 1)
    assert args["expanded_idx_mapping"].tolist() == [1, 0] and args["expanded_local_pos"].tolist() == [0, 0]


# -- the stream family and the draft-logit convention: told by the probe, each gated --------------

BEFORE_BOTH, BOTH = ("triton-philox", "processed"), ("murmur3", "raw")  # vLLM before / from PRs 50910, 51367
CONVENTIONS = [BEFORE_BOTH, BOTH, ("triton-philox", "raw"), ("murmur3", "processed")]


def _vllm(convention, **forced):
    """The adapter over the reference of `convention` = (streams, draft_logits); `forced`: overrides."""
    return VllmSampler(rejection_sample=reference_rejection_sample(*convention), device="cpu", deviations=(), **forced)


def test_the_probe_batch_tells_the_four_conventions_apart():
    """The family shows in request 0's resampled token, the draft-logit convention in whether
    request 1 accepts its draft (`predictions` also checks every pair differs)."""
    got = predictions()
    assert set(got) == set(CONVENTIONS)
    assert {got[(f, "processed")].sampled[0, 0] for f in ("triton-philox", "murmur3")} == {1, 7}
    assert [got[(f, c)].num_sampled[1] for f, c in CONVENTIONS] == [2, 1, 1, 2]


@pytest.mark.parametrize("streams, draft_logits", CONVENTIONS)
def test_the_probe_tells_what_the_function_draws(streams, draft_logits):
    convention = (streams, draft_logits)
    sampler = _vllm(convention)
    assert (sampler.streams, sampler.draft_logits) == convention
    # One given, the other asked.
    assert _vllm(convention, streams=streams).draft_logits == draft_logits
    assert _vllm(convention, draft_logits=draft_logits).streams == streams
    assert f"streams={streams!r}, draft_logits={draft_logits!r}" in repr(sampler)


def _gate(name: str, sampler, reference, shrink=True) -> Outcome:
    """Property `name` on `sampler` at the ci profile, as the gate runs it; `shrink=False` stops at the first
    failing example (a kill)."""
    return run(PROPERTIES[name], make_context(sampler, reference, profile="ci"), None if shrink else no_shrink())


@pytest.mark.parametrize("name", ["certified_equivalence", "output_invariants", "blackbox_chunking"])
@pytest.mark.parametrize("convention", CONVENTIONS, ids=["before-both", "both", "philox-raw", "murmur3-processed"])
def test_the_gate_passes_each_vllm(name, convention, reference):
    """Through the shipped adapter, with what the probe found."""
    outcome = _gate(name, _vllm(convention), reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
    assert outcome.stats.get("stochastic_decisions", 100) >= 100


DECISIONS_DIFFER = "differ from the reference|outside the residual"


@pytest.mark.parametrize("convention, forced, says", [
    (BOTH, ("murmur3", "processed"), DECISIONS_DIFFER),  # the draft logits divided twice: q of d / T**2
    (BOTH, ("triton-philox", "raw"), DECISIONS_DIFFER),  # Philox noise declared
    # The draft logits never divided (q of d), and handed in bfloat16 where float32 is taken.
    (BEFORE_BOTH, ("triton-philox", "raw"), DECISIONS_DIFFER + "|processed draft logits are float32"),
], ids=["divides-twice", "philox-declared", "divides-never"])
def test_an_adapter_forced_to_the_wrong_convention_fails(convention, forced, says, reference):
    outcome = _gate("certified_equivalence", _vllm(convention, streams=forced[0], draft_logits=forced[1]), reference,
                    shrink=False)
    assert outcome.status == "failed" and re.search(says, outcome.failure.text()), outcome.status


def test_an_answer_the_probe_cannot_read_fails_with_what_to_pass():
    fake = reference_rejection_sample(*BOTH)

    def other_stream(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                     expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps):
        return fake(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                    expanded_idx_mapping, expanded_local_pos, temperature, seed + 1, num_speculative_steps)

    with pytest.raises(ProbeError, match=r"(?s)cannot tell.*murmur3 noise, raw draft logits.*streams=\.\.\., "
                                         r"draft_logits=\.\.\."):
        VllmSampler(rejection_sample=other_stream, device="cpu")

    def broken(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
               expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(ProbeError, match="probe call of .*broken failed .*illegal memory access.*streams="):
        VllmSampler(rejection_sample=broken, device="cpu")
    with pytest.raises(ValueError, match="draft_logits must be one of"):
        VllmSampler(rejection_sample=broken, device="cpu", streams="murmur3", draft_logits="divided")


@pytest.mark.parametrize("draft_logits", ["processed", "raw"])
def test_draft_logits_are_handed_as_the_convention_says(draft_logits):
    """Raw: the batch's draft logits in its logits dtype, untouched; processed: float32, divided by T."""
    batch = probe_batch().replace(logits_dtype="bfloat16")
    sampler = VllmSampler(rejection_sample=reference_rejection_sample(*BOTH), device="cpu", streams="murmur3",
                          draft_logits=draft_logits)
    handed = sampler.arguments(batch)["draft_logits"]
    raw = torch.from_numpy(np.array(batch.draft_logits))
    if draft_logits == "raw":
        assert handed.dtype == torch.bfloat16 and torch.equal(handed.float(), raw)
    else:
        assert handed.dtype == torch.float32 and torch.equal(handed, raw / 0.5)
