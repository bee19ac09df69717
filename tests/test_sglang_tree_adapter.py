"""SGLang's tree kernel adapter (rs_verify.adapters.sglang_tree) without a GPU: it wraps
`fake_tree_kernel`, a NumPy fake of `tree_speculative_sampling_target_only`'s calling convention written
here from SPEC 4c's per-node rule (one coin per parent node against the running sum of `p` over the
siblings tried, a repeated token counted again as SGLang's kernel does: `tree_duplicate_siblings`), the
emitted token by inverse CDF over `relu(p - D)`, `D` the kernel's record of the rejected tokens' `p`.

Over the fake the adapter passes certification and the output invariants at ci; over a fake with a
planted defect (the root's coin kept for every level, the rejected tokens left in the residual) it fails.
The real kernel needs CUDA: its test skips without it (benchmarks/run_gpu.sh runs it on a GPU).
"""

import re

import numpy as np
import pytest
import torch

from conftest import no_shrink
from rs_verify.adapters.sglang_tree import SglangTreeSampler
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES

F32 = np.float32


def fake_tree_kernel(defect=None):
    def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                              retrive_next_token, retrive_next_sibling, uniform_samples,
                                              uniform_samples_for_final_sampling, target_probs, draft_probs,
                                              threshold_single=1.0, threshold_acc=1.0, deterministic=True):
        bs, d = candidates.shape
        v = target_probs.shape[-1]
        assert predicts.dtype == torch.int32 and predicts.shape == (bs * d,)
        for t in (candidates, retrive_index, retrive_next_token, retrive_next_sibling):
            assert t.dtype == torch.int64 and t.shape == (bs, d)
        assert uniform_samples.dtype == torch.float32 and uniform_samples.shape == (bs, d)
        assert target_probs.shape == draft_probs.shape == (bs, d, v) and not draft_probs.any()
        assert (threshold_single, threshold_acc, deterministic) == (1.0, 1.0, True)
        cand, index, nxt, sib = (t.numpy() for t in (candidates, retrive_index, retrive_next_token,
                                                     retrive_next_sibling))
        coins, final = uniform_samples.numpy(), uniform_samples_for_final_sampling.numpy()
        p, dp = target_probs.numpy(), draft_probs.numpy()
        pred, acc_idx, acc_num = predicts.numpy(), accept_index.numpy(), accept_token_num.numpy()
        spec = acc_idx.shape[1]
        for b in range(bs):
            cur, last, accepted, coin = 0, int(index[b, 0]), 0, coins[b, 0]
            acc_idx[b, 0] = last
            for _ in range(1, spec):
                child, total = int(nxt[b, cur]), F32(0)
                while child != -1:
                    x = int(cand[b, child])
                    assert 0 <= x < v, "a padded child was linked"
                    total = F32(total + p[b, cur, x])
                    if p[b, cur, x] > 0 and coin < total:
                        pred[last] = x
                        accepted, cur, last = accepted + 1, child, int(index[b, child])
                        acc_idx[b, accepted] = last
                        coin = coin if defect == "coin_not_renewed" else coins[b, child]
                        break
                    if defect != "residual_kept":
                        dp[b, cur, x] = p[b, cur, x]
                    child = int(sib[b, child])
                if child == -1:
                    break
            acc_num[b] = accepted
            res = np.maximum(p[b, cur] - (dp[b, cur] if accepted != spec - 1 else 0), F32(0))
            cum = np.cumsum(res, dtype=F32)
            hit = (res > 0) & (cum > F32(final[b]) * cum[-1])
            valid = np.flatnonzero(res > 0)
            pred[last] = int(np.argmax(hit)) if hit.any() else (int(valid[-1]) if valid.size else v - 1)

    return tree_speculative_sampling_target_only


def _sglang_tree(defect=None):
    return SglangTreeSampler(tree_speculative_sampling=fake_tree_kernel(defect), device="cpu")


def _gate(name, sampler, reference, shrink=True):
    return run(PROPERTIES[name], make_context(sampler, reference, profile="ci"), None if shrink else no_shrink())


def test_declarations():
    rec = record_of(_sglang_tree())
    assert (rec.streams, rec.resample, rec.tree_uniforms, rec.tree_drafts) == ("explicit", "inverse_cdf", "per_node",
                                                                             frozenset({"one_hot"}))
    assert rec.verification_methods == {"token", "tree"} and _sglang_tree().deviations == {"tree_duplicate_siblings"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel is there: the GPU test below runs it")
def test_without_cuda_building_the_real_kernel_says_so():
    with pytest.raises(RuntimeError, match="CUDA only"):
        SglangTreeSampler()


def test_a_changed_calling_convention_fails_at_construction():
    with pytest.raises(TypeError, match="calling convention changed"):
        SglangTreeSampler(tree_speculative_sampling=lambda predicts, accept_index: None, device="cpu")


@pytest.mark.parametrize("name", ["certified_equivalence", "output_invariants"])
def test_the_gate_passes_the_adapter(name, reference):
    outcome = _gate(name, _sglang_tree(), reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason


@pytest.mark.parametrize("defect", ["residual_kept", "coin_not_renewed"])
def test_a_planted_defect_fails_certification(defect, reference):
    outcome = _gate("certified_equivalence", _sglang_tree(defect), reference, shrink=False)
    assert outcome.status == "failed", outcome.status
    assert re.search("differ from the reference|p~ excludes|emitted it again", outcome.failure.text())


def test_the_duplicate_siblings_fail_undeclared(reference):
    sampler = SglangTreeSampler(tree_speculative_sampling=fake_tree_kernel(), device="cpu", deviations=())
    outcome = _gate("certified_equivalence", sampler, reference, shrink=False)
    assert outcome.status == "failed" and "differ from the reference" in outcome.failure.text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SGLang's tree kernel is CUDA only")
def test_the_real_kernel_is_certified(reference):
    pytest.importorskip("sglang")
    outcome = run(PROPERTIES["certified_equivalence"], make_context(SglangTreeSampler(), reference, profile="gpu"))
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
