"""The calling conventions of the released libraries, each through a fake written from the release's
signature (the released code itself is gated by `rs-verify releases`, docs/releases.md):

- SGLang 0.5.23: block verification is the chain function's keyword `block_verification=True`,
  not a separate function; older trees keep the separate function;
- vLLM 0.33.0's V1 `rejection_sample`: logits in (`target_logits`), six optional parameters, each
  passed deliberately, and the recovered-token launch `_sample_recovered_tokens(..., inv_q, *,
  max_spec_len)` with `inv_q = 1 / E` (float64 with `use_fp64_gumbel`);
- vLLM 0.34.0: no V1 module; the adapter says so.
"""

import importlib
import inspect
import sys
import types

import numpy as np
import pytest
import torch
from test_explicit_adapters import _batch, _gate, fake_chain_speculative_sampling, fake_vllm_v1

from rs_verify.adapters import explicit_inputs, sglang, vllm_v1
from rs_verify.adapters.sglang import SglangSampler
from rs_verify.adapters.vllm_v1 import VllmV1Sampler
from rs_verify.harness.record import record_of


def fake_sglang_0_5_23(calls: list):
    """0.5.23's `chain_speculative_sampling_triton(..., *, block_verification=False)`: records the
    keyword of every call and verifies token by token (the fake's block path is not under test)."""
    token = fake_chain_speculative_sampling()

    def chain_speculative_sampling_triton(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single, threshold_acc, deterministic, *,
                                          block_verification: bool = False):
        calls.append(block_verification)
        args = dict(locals())
        for name in ("block_verification", "calls", "token"):
            args.pop(name, None)
        return token(**args)

    return chain_speculative_sampling_triton


def test_sglang_0_5_23_verifies_blocks_through_the_keyword():
    calls = []
    sampler = SglangSampler(chain_speculative_sampling=fake_sglang_0_5_23(calls), device="cpu")
    assert sampler.verification_methods == {"token", "block"}
    sampler(_batch())
    assert calls and not any(calls)  # token batches: the keyword left at False
    calls.clear()
    sampler(_batch().replace(verification="block"))
    assert calls and all(calls)  # block batches: block_verification=True on every call
    assert sampler.unvalidated().verification_methods == {"token", "block"}


def test_sglang_0_5_23_is_found_in_the_module(monkeypatch):
    calls = []
    module = types.ModuleType(sglang.SGLANG_MODULES[0])
    module.chain_speculative_sampling_triton = fake_sglang_0_5_23(calls)
    monkeypatch.setitem(sys.modules, sglang.SGLANG_MODULES[0], module)
    chain, block = sglang.load_sglang()
    assert chain is module.chain_speculative_sampling_triton and block.keywords == {"block_verification": True}
    # an older tree: no keyword, the separate block function
    old = types.ModuleType(sglang.SGLANG_MODULES[0])
    old.chain_speculative_sampling_triton = old.chain_block_speculative_sampling_triton = \
        fake_chain_speculative_sampling()
    monkeypatch.setitem(sys.modules, sglang.SGLANG_MODULES[0], old)
    assert sglang.load_sglang()[1] is old.chain_block_speculative_sampling_triton
    assert SglangSampler(chain_speculative_sampling=fake_chain_speculative_sampling(),
                         device="cpu").verification_methods == {"token"}


def test_the_measured_deviations_are_declared():
    assert SglangSampler(chain_speculative_sampling=fake_chain_speculative_sampling(),
                         device="cpu").deviations == {"inverse_cdf_last_token"}
    assert VllmV1Sampler(module=fake_vllm_v1(), device="cpu").deviations == {"empty_residual_token0"}
    # replaced for a function known to differ, and kept by the unvalidated twin the robustness properties use
    exact = VllmV1Sampler(module=fake_vllm_v1(), device="cpu", deviations=())
    assert exact.deviations == frozenset() and exact.unvalidated().deviations == frozenset()
    assert SglangSampler(chain_speculative_sampling=fake_chain_speculative_sampling(), device="cpu",
                         deviations=()).unvalidated().deviations == frozenset()


def fake_vllm_v1_0_33_0(seen: dict, defect=None, optional=tuple(vllm_v1.OPTIONAL), launch=True):
    """0.33.0's convention over the older fake: `target_logits` in (softmax taken inside), six
    optional parameters, and the recovered tokens through `_sample_recovered_tokens(..., inv_q)`.
    `seen` records the optional arguments and the dtype of inv_q; `defect="inv_q_is_e"` reads
    `inv_q` as E (the old kernel's input), which must fail certification. `optional`: the optional
    parameters its signature shows (0.29.0 to 0.32.0: the first three); `launch=False`: no
    `_sample_recovered_tokens` (before 0.32.0): the kernel is launched with `inv_q` and its block
    and flags by name, as those releases' `sample_recovered_tokens` does."""
    old = fake_vllm_v1()
    mod = types.ModuleType("fake_vllm_v1_0_33_0")
    mod.PLACEHOLDER_TOKEN_ID, mod.GREEDY_TEMPERATURE = -1, 0

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False,
                         synthetic_conditional_rates=None, use_fp64_gumbel=False, fly_window_size=None,
                         fly_entropy_threshold=None, fly_entropy_top_k=3):
        seen.update(synthetic_mode=synthetic_mode, synthetic_conditional_rates=synthetic_conditional_rates,
                    use_fp64_gumbel=use_fp64_gumbel, fly_window_size=fly_window_size)
        assert target_logits.dtype == torch.float32 and target_logits.is_contiguous()
        old.generate_uniform_probs = mod.generate_uniform_probs
        old.sample_recovered_tokens = lambda *a: mod.sample_recovered_tokens(*a, use_fp64_gumbel)
        return old.rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                    draft_probs, target_logits.softmax(dim=-1, dtype=torch.float32),
                                    bonus_token_ids, sampling_metadata)

    def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
        raise AssertionError("vLLM's own uniforms were drawn: the adapter must replace generate_uniform_probs")

    def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                target_probs, sampling_metadata, device, use_fp64_gumbel=False):
        raise AssertionError("vLLM's own exponentials were drawn: the adapter must replace sample_recovered_tokens")

    def _sample_recovered_tokens(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                                 inv_q, *, max_spec_len):
        seen["inv_q"] = inv_q.dtype
        e = inv_q if defect == "inv_q_is_e" else inv_q.reciprocal()
        launch = old.sample_recovered_tokens_kernel[(inv_q.shape[0], max_spec_len)]
        v = target_probs.shape[-1]
        launch(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, e.float(), v, v,
               draft_probs is None)

    class Kernel:
        arg_names = [*old.sample_recovered_tokens_kernel.arg_names, "USE_FP64_GUMBEL"]

        def __getitem__(self, grid):
            def run(out, cu, ids, draft_probs, target_probs, inv_q, vocab_size, *, BLOCK_SIZE, NO_DRAFT_PROBS,
                    USE_FP64_GUMBEL):
                assert grid[0] == inv_q.shape[0] and NO_DRAFT_PROBS == (draft_probs is None)
                assert USE_FP64_GUMBEL == (inv_q.dtype == torch.float64)
                _sample_recovered_tokens(out, cu, ids, draft_probs, target_probs, inv_q, max_spec_len=grid[1])
            return run

    params = inspect.signature(rejection_sample).parameters
    rejection_sample.__signature__ = inspect.Signature([p for n, p in params.items()
                                                        if n not in vllm_v1.OPTIONAL or n in optional])
    mod.rejection_sample, mod.generate_uniform_probs = rejection_sample, generate_uniform_probs
    mod.sample_recovered_tokens = sample_recovered_tokens
    if launch:
        mod._sample_recovered_tokens = _sample_recovered_tokens
    mod.sample_recovered_tokens_kernel = Kernel()
    return mod


def test_vllm_0_33_0_convention_is_recognised_and_its_options_passed_deliberately():
    seen = {}
    sampler = VllmV1Sampler(module=fake_vllm_v1_0_33_0(seen), device="cpu")
    assert sampler.convention == vllm_v1.LOGITS and record_of(sampler).resample == "gumbel"
    sampler(_batch())
    assert seen == {"synthetic_mode": False, "synthetic_conditional_rates": None, "use_fp64_gumbel": False,
                    "fly_window_size": None, "inv_q": torch.float32}
    VllmV1Sampler(module=fake_vllm_v1_0_33_0(seen), device="cpu", use_fp64_gumbel=True)(_batch())
    assert seen["use_fp64_gumbel"] is True and seen["inv_q"] == torch.float64
    with pytest.raises(ValueError, match="use_fp64_gumbel"):
        VllmV1Sampler(module=fake_vllm_v1(), device="cpu", use_fp64_gumbel=True)


def test_an_unknown_parameter_of_0_33_0_is_refused_by_name():
    fake = fake_vllm_v1_0_33_0({})
    original = fake.rejection_sample

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False,
                         synthetic_conditional_rates=None, use_fp64_gumbel=False, fly_window_size=None,
                         fly_entropy_threshold=None, fly_entropy_top_k=3, watermark_key=None):
        return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                        target_logits, bonus_token_ids, sampling_metadata)

    fake.rejection_sample = rejection_sample
    with pytest.raises(TypeError, match=r"takes optional parameters the adapter does not know: \['watermark_key'\]"):
        VllmV1Sampler(module=fake, device="cpu")
    assert tuple(inspect.signature(original).parameters) == sum(vllm_v1.CONVENTIONS[vllm_v1.LOGITS]["rejection_sample"], ())

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, context_lens, synthetic_mode=False):
        raise AssertionError("never called")

    fake.rejection_sample = rejection_sample
    with pytest.raises(TypeError, match=r"requires parameters the adapter does not know: \['context_lens'\]"):
        VllmV1Sampler(module=fake, device="cpu")


def test_the_0_29_0_to_0_32_0_convention_is_followed():
    """Three optional parameters (no FLy), and before 0.32.0 no `_sample_recovered_tokens`: the
    adapter passes the ones the release has and launches the kernel with inv_q itself."""
    older = ("synthetic_mode", "synthetic_conditional_rates", "use_fp64_gumbel")
    batch = _batch(drafts=((3, 5, 1), (2, 6, 4), (7, 0, 2), (1, 1, 1)), temperature=(0.7, 0.9, 1.3, 2.0))
    right = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}), device="cpu")(batch).sampled
    for launch in (True, False):
        seen = {}
        sampler = VllmV1Sampler(module=fake_vllm_v1_0_33_0(seen, optional=older, launch=launch), device="cpu")
        assert sampler.optional == older and sampler.detected["recover_launch"] == (
            "_sample_recovered_tokens" if launch else "sample_recovered_tokens_kernel")
        np.testing.assert_array_equal(sampler(batch).sampled, right)
        assert seen == {"synthetic_mode": False, "synthetic_conditional_rates": None, "use_fp64_gumbel": False,
                        "fly_window_size": None, "inv_q": torch.float32}  # FLy at the fake's default
    sampler = VllmV1Sampler(module=fake_vllm_v1_0_33_0(seen, optional=older, launch=False), device="cpu",
                            use_fp64_gumbel=True)
    sampler(batch)
    assert seen["inv_q"] == torch.float64
    wrong = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}, "inv_q_is_e", optional=older, launch=False),
                          device="cpu")(batch).sampled
    assert not np.array_equal(right, wrong)
    with pytest.raises(ValueError, match="use_fp64_gumbel"):
        VllmV1Sampler(module=fake_vllm_v1_0_33_0({}, optional=()), device="cpu", use_fp64_gumbel=True)


def test_the_gate_passes_the_0_33_0_convention(reference):
    sampler = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}), device="cpu", deviations=())  # a SPEC-exact fake
    outcome = _gate("certified_equivalence", sampler, reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason


def test_inv_q_read_as_e_changes_the_recovered_tokens():
    """The cheap twin of the certification test below: a fake reading inv_q as E recovers other tokens."""
    batch = _batch(drafts=((3, 5, 1), (2, 6, 4), (7, 0, 2), (1, 1, 1)), temperature=(0.7, 0.9, 1.3, 2.0))
    right = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}), device="cpu")(batch).sampled
    wrong = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}, "inv_q_is_e"), device="cpu")(batch).sampled
    assert not np.array_equal(right, wrong)


@pytest.mark.long  # long run: test_inv_q_read_as_e_changes_the_recovered_tokens runs by default
def test_inv_q_read_as_e_fails_certification(reference):
    outcome = _gate("certified_equivalence", VllmV1Sampler(module=fake_vllm_v1_0_33_0({}, "inv_q_is_e"),
                                                           device="cpu"), reference)
    assert outcome.status == "failed"


def test_a_vllm_without_the_v1_module_is_named(monkeypatch):
    """0.34.0 removed vllm/v1/sample/rejection_sampler.py: the error names the release."""

    def import_module(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.setattr(vllm_v1, "_vllm_version", lambda: "0.34.0")
    with pytest.raises(ImportError, match=r"^vLLM 0\.34\.0 has no V1 rejection sampler \(removed\)"):
        VllmV1Sampler(device="cpu")
    monkeypatch.setattr(vllm_v1, "_vllm_version", lambda: None)
    with pytest.raises(ImportError, match="needs vLLM's V1 rejection sampler"):
        VllmV1Sampler(device="cpu")


def test_the_0_33_0_arguments_carry_logits_not_probabilities():
    sampler = VllmV1Sampler(module=fake_vllm_v1_0_33_0({}), device="cpu")
    batch = _batch()
    from_adapter = sampler.arguments(batch, explicit_inputs.prepare(batch, "cpu"), np.zeros(2, np.int64))
    assert "target_probs" not in from_adapter and from_adapter["target_logits"].shape == (4, 8)
