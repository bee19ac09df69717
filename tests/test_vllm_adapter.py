"""The vLLM adapter (rs_verify.adapters.vllm) without vLLM: its conversion, checked against a
function with vLLM's calling convention built from this project's own Triton kernels.

`convention_rejection_sample` takes exactly what vLLM's MRV2 `rejection_sample` takes (processed
fp32 logits, the expanded index arrays, ...), checks what vLLM's kernels rely on, and verifies
with the built-in kernels. The adapter over it must reproduce the built-in sampler bit for bit
on generated batches: any slip in the conversion (temperature, layouts, dtypes, the -1 padding
of `sampled`) changes a token or trips a check.
"""

import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from rs_verify.adapters.vllm import VllmSampler
from rs_verify.properties.assertions import assert_same_output, call
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


@pytest.fixture(scope="module")
def adapter(triton_sampler):
    def fn(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
           expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None,
           use_fp64=False, use_block_verification=False):
        return convention_rejection_sample(
            target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, seed, num_speculative_steps,
            use_block_verification=use_block_verification, block_v=triton_sampler.block_v)

    return VllmSampler(rejection_sample=fn, device=triton_sampler.device)


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
    assert adapter.streams == "triton-philox" and adapter.interpreted == (adapter.device.type != "cuda")
    assert adapter.verification_methods == {"token", "block"} and adapter.sampling_params == frozenset()
    raw = adapter.unvalidated()
    assert raw.validate is False and raw.rejection_sample is adapter.rejection_sample
    assert raw.verification_methods == adapter.verification_methods


def test_block_declared_only_with_use_block_verification():
    """A rejection_sample without the parameter (vLLM before #46781) is token-wise only: block
    batches are refused, never verified token by token; batches with sampling parameters too."""
    from rs_verify import SpecBatch

    def older(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
              expanded_local_pos, temperature, seed, num_speculative_steps):
        raise AssertionError("never called")

    sampler = VllmSampler(rejection_sample=older, device="cpu")
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
