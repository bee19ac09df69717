"""The adapters of `explicit`-family samplers (rs_verify.adapters.sglang, rs_verify.adapters.vllm_v1)
without their libraries: each wraps a fake of its library's calling convention, written here from
the SPEC (not from the adapter), in NumPy:

- `fake_chain_speculative_sampling`: SGLang's `chain_speculative_sampling_triton` convention
  (probabilities in `[bs, D, V]`, coins `[bs, D]`, the final uniform `[bs]`, outputs written into
  `predicts` / `accept_index` / `accept_token_num`): accept iff `coin * q < p`, then inverse CDF
  over float32 prefix sums of `max(p - q, 0)` (of `p` after the last draft);
- `fake_vllm_v1(...)`: a module with vLLM V1's `rejection_sample`, `generate_uniform_probs`,
  `sample_recovered_tokens` and `sample_recovered_tokens_kernel`: accept iff `q > 0 and p / q >= u`,
  recover `argmax max(p - q, 0) / E` per position with one `E` per request (`p` when that residual
  has no mass), bonus token an input.
  Its own two noise functions raise: the adapter must replace them with the batch's.

Each fake checks the dtypes and layouts its library relies on. The adapter over a correct fake
must pass the gate's certification, output invariants and chunking at the ci profile; over a fake
with a planted defect (another row's uniform, a residual that is `p`) it must fail certification.
"""

import re
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import settings

from conftest import LONG_RUN, SHARE, no_shrink
from rs_verify.adapters import explicit_inputs, sglang, vllm_v1
from rs_verify.adapters.sglang import SglangSampler
from rs_verify.adapters.vllm_v1 import VllmV1Sampler
from rs_verify.contract import explicit
from rs_verify.contract.batch import SpecBatch
from rs_verify.engine.runner import make_context, run
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES

F32 = np.float32


def _inverse_cdf(res: np.ndarray, u: float) -> int:
    """SPEC 4's inverse CDF in float32 prefix sums (the last token with mass when rounding leaves none;
    the last token when no value is positive: NaN probabilities of a batch run without validation)."""
    cum = np.cumsum(res, dtype=F32)
    hit = (res > 0) & (cum > F32(u) * cum[-1])
    if hit.any():
        return int(np.argmax(hit))
    return int(np.flatnonzero(res > 0)[-1]) if (res > 0).any() else len(res) - 1


def fake_chain_speculative_sampling(defect=None):
    """SGLang's chain-verification convention (module docstring); `defect`: "neighbour_uniform" (each
    request reads the next request's coins) or "cdf_over_p" (the resample draws from p, not the residual)."""

    def chain_speculative_sampling_triton(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single, threshold_acc, deterministic):
        bs, d = candidates.shape
        v = target_probs.shape[-1]
        assert predicts.dtype == torch.int32 and predicts.shape == (bs * d,)
        assert accept_index.dtype == torch.int32 and accept_index.shape == (bs, d) and (accept_index == -1).all()
        assert accept_token_num.dtype == torch.int32 and accept_token_num.shape == (bs,)
        for t in (candidates, retrive_index, retrive_next_token, retrive_next_sibling):
            assert t.dtype == torch.int64 and t.shape == (bs, d)
        assert torch.equal(retrive_index, torch.arange(bs * d).reshape(bs, d))
        assert uniform_samples.dtype == torch.float32 and uniform_samples.shape == (bs, d)
        assert uniform_samples_for_final_sampling.dtype == torch.float32 and uniform_samples_for_final_sampling.shape == (bs,)
        for t in (target_probs, draft_probs):
            assert t.dtype == torch.float32 and t.shape == (bs, d, v) and t.is_contiguous()
        assert (threshold_single, threshold_acc, deterministic) == (1.0, 1.0, True)
        cand, index = candidates.numpy(), retrive_index.numpy()
        assert ((cand[:, 1:] >= 0) & (cand[:, 1:] < v)).all(), "a draft id the kernel would read out of bounds"
        coins, final = uniform_samples.numpy(), uniform_samples_for_final_sampling.numpy()
        p, q = target_probs.numpy(), draft_probs.numpy()
        pred, acc_idx, acc_num = predicts.numpy(), accept_index.numpy(), accept_token_num.numpy()
        for b in range(bs):
            row, last, accepted, all_accepted = 0, int(index[b, 0]), 0, True
            acc_idx[b, 0] = last
            coin_row = (b + 1) % bs if defect == "neighbour_uniform" else b
            for s in range(1, d):
                tok = int(cand[b, s])
                if coins[coin_row, s - 1] * q[b, row, tok] < p[b, row, tok]:
                    pred[last] = tok
                    accepted, row, last = accepted + 1, s, int(index[b, s])
                    acc_idx[b, accepted] = last
                else:
                    all_accepted = False
                    break
            res = p[b, row] if all_accepted or defect == "cdf_over_p" else np.maximum(p[b, row] - q[b, row], F32(0))
            pred[last] = _inverse_cdf(res if (res > 0).any() else p[b, row], final[b])
            acc_num[b] = accepted

    return chain_speculative_sampling_triton


def fake_vllm_v1(defect=None):
    """A module with vLLM V1's rejection-sampler convention (module docstring); `defect`:
    "neighbour_uniform" (draft row j reads the uniform of row j + 1) or "recover_from_p"."""
    mod = types.ModuleType("fake_vllm_v1_rejection_sampler")
    mod.PLACEHOLDER_TOKEN_ID, mod.GREEDY_TEMPERATURE = -1, 0

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_probs, bonus_token_ids, sampling_metadata):
        b, (t, v) = len(num_draft_tokens), target_probs.shape
        assert draft_token_ids.dtype == torch.int32 and draft_token_ids.shape == (t,) and t == sum(num_draft_tokens)
        assert max_spec_len == max(num_draft_tokens) and bonus_token_ids.shape == (b, 1)
        assert torch.equal(cu_num_draft_tokens.long(), torch.tensor(np.cumsum(num_draft_tokens)))
        assert target_probs.dtype == torch.float32 and target_probs.is_contiguous()
        assert draft_probs is None or (draft_probs.shape == (t, v) and draft_probs.is_contiguous())
        greedy = (sampling_metadata.temperature == mod.GREEDY_TEMPERATURE).numpy()
        assert sampling_metadata.all_greedy == greedy.all() and sampling_metadata.all_random == (not greedy.any())
        out = np.full((b, max_spec_len + 1), mod.PLACEHOLDER_TOKEN_ID, np.int64)
        p, ids, bonus = target_probs.numpy(), draft_token_ids.numpy(), bonus_token_ids.numpy()[:, 0]
        if not sampling_metadata.all_greedy:
            u = mod.generate_uniform_probs(t, num_draft_tokens, sampling_metadata.generators, target_probs.device)
            assert u.dtype == torch.float64 and u.shape == (t,)
            u = u.numpy()
            if defect == "neighbour_uniform":
                u = np.roll(u, -1)
            rec = mod.sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
                                              draft_probs, target_probs, sampling_metadata, target_probs.device).numpy()
        start = 0
        for r, n in enumerate(num_draft_tokens):
            for i in range(n):
                j, d = start + i, int(ids[start + i])
                if greedy[r]:
                    ok, alt = int(np.argmax(p[j])) == d, int(np.argmax(p[j]))
                else:
                    qd = F32(1) if draft_probs is None else F32(draft_probs[j, d].item())
                    with np.errstate(over="ignore"):  # a subnormal q: p / q is inf, accepted
                        ok, alt = qd > 0 and p[j, d] / qd >= u[j], int(rec[j])
                out[r, i] = d if ok else alt
                if not ok:
                    break
            else:
                out[r, n] = bonus[r]
            start += n
        return torch.from_numpy(out.astype(np.int32))

    def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
        raise AssertionError("vLLM's own uniforms were drawn: the adapter must replace generate_uniform_probs")

    def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                target_probs, sampling_metadata, device):
        raise AssertionError("vLLM's own exponentials were drawn: the adapter must replace sample_recovered_tokens")

    class RecoveredKernel:
        arg_names = ["output_token_ids_ptr", "cu_num_draft_tokens_ptr", "draft_token_ids_ptr", "draft_probs_ptr",
                     "target_probs_ptr", "q_ptr", "vocab_size", "PADDED_VOCAB_SIZE", "NO_DRAFT_PROBS"]

        def __getitem__(self, grid):
            def launch(out, cu, ids, draft_probs, target_probs, q, vocab_size, padded, no_draft_probs):
                assert q.dtype == torch.float32 and q.shape == (grid[0], vocab_size) and padded >= vocab_size
                assert no_draft_probs == (draft_probs is None)
                cu_np, e = cu.numpy(), q.numpy()
                for r in range(grid[0]):
                    start = 0 if r == 0 else int(cu_np[r - 1])
                    for pos in range(min(grid[1], int(cu_np[r]) - start)):
                        j = start + pos
                        res = target_probs[j].numpy().copy()
                        if defect != "recover_from_p":
                            if draft_probs is None:
                                res[int(ids[j])] = 0
                            else:
                                res = np.maximum(res - draft_probs[j].numpy(), F32(0))
                        if not (res > 0).any():  # SPEC 4: a residual with no positive mass is p
                            res = target_probs[j].numpy()
                        out[j] = int(np.argmax(res / e[r]))

            return launch

    mod.rejection_sample, mod.generate_uniform_probs = rejection_sample, generate_uniform_probs
    mod.sample_recovered_tokens, mod.sample_recovered_tokens_kernel = sample_recovered_tokens, RecoveredKernel()
    return mod


# The fakes follow SPEC 4 exactly: they declare none of the releases' deviations (SPEC 11).
def _sglang(defect=None):
    return SglangSampler(chain_speculative_sampling=fake_chain_speculative_sampling(defect), device="cpu",
                         deviations=())


def _vllm_v1(defect=None):
    return VllmV1Sampler(module=fake_vllm_v1(defect), device="cpu", deviations=())


def _batch(drafts=((3, 5, 1), (2, -1, 4)), v=8, temperature=(0.7, 0.9)) -> SpecBatch:
    """Requests with the given draft ids (a negative one padded), model drafts, random logits."""
    rng = np.random.default_rng(4)
    rows = sum(len(d) + 1 for d in drafts)
    ids = np.concatenate([[0, *d] for d in drafts]).astype(np.int64)
    b = SpecBatch(target_logits=rng.standard_normal((rows, v)).astype(np.float32),
                  draft_logits=rng.standard_normal((len(drafts), 3, v)).astype(np.float32), draft_token_ids=ids,
                  cu_num_logits=np.cumsum([0] + [len(d) + 1 for d in drafts]).astype(np.int32),
                  pos=np.arange(rows, dtype=np.int64), idx_mapping=np.arange(len(drafts), dtype=np.int32),
                  temperature=np.array(temperature, np.float32), seeds=np.arange(len(drafts), dtype=np.int64),
                  num_speculative_steps=3)
    return explicit.filled(b)


# -- declarations, refusals, the calling conventions ---------------------------------------------


@pytest.mark.parametrize("make, resample", [(_sglang, "inverse_cdf"), (_vllm_v1, "gumbel")])
def test_declarations(make, resample):
    sampler = make()
    rec = record_of(sampler)
    assert (rec.streams, rec.resample, rec.supports_logprobs, rec.supports_chunking) == ("explicit", resample, False,
                                                                                        False)
    assert sampler.sampling_params == frozenset() and sampler.interpreted
    raw = sampler.unvalidated()
    assert raw.validate is False and record_of(raw) == rec


@pytest.mark.parametrize("make, field", [(_sglang, "accept_uniforms"), (_sglang, "resample_uniforms"),
                                         (_vllm_v1, "accept_uniforms"), (_vllm_v1, "resample_gumbel")])
def test_a_batch_without_the_noise_read_is_refused(make, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        make()(_batch().replace(**{field: None}))


def test_a_padded_draft_ends_the_request():
    """SPEC 3c: the request with drafts (2, -1, 4) verifies as the request with the one draft 2."""
    batch = _batch()
    assert explicit_inputs.effective_drafts(batch).tolist() == [3, 1]
    prep = explicit_inputs.prepare(batch, "cpu")
    args = _sglang().arguments(batch, prep, np.array([1]), 1)
    assert args["candidates"].tolist() == [[0, 2]] and args["target_probs"].shape == (1, 2, 8)
    assert args["uniform_samples"].tolist() == [batch.accept_uniforms[4:6].astype(np.float32).tolist()]
    v1 = _vllm_v1()
    args = v1.arguments(batch, prep, explicit_inputs.bonus_tokens(prep, torch.ones(2, 8)))
    assert args["num_draft_tokens"] == [3, 1] and args["draft_token_ids"].tolist() == [3, 5, 1, 2]
    assert args["cu_num_draft_tokens"].tolist() == [3, 4] and args["max_spec_len"] == 3


def test_sglang_declares_block_only_with_its_block_function():
    chain = fake_chain_speculative_sampling()
    assert _sglang().verification_methods == {"token"}
    with pytest.raises(ValueError, match="^verification: 'block'"):
        _sglang()(_batch().replace(verification="block"))
    both = SglangSampler(chain_speculative_sampling=chain, block_speculative_sampling=chain, device="cpu")
    assert both.verification_methods == {"token", "block"} and both.unvalidated().block is chain


def test_vllm_v1_noise_functions_are_restored():
    fake = fake_vllm_v1()
    saved = (fake.generate_uniform_probs, fake.sample_recovered_tokens)
    sampler = VllmV1Sampler(module=fake, device="cpu")
    sampler(_batch())
    assert (fake.generate_uniform_probs, fake.sample_recovered_tokens) == saved
    fake.rejection_sample = lambda *a, **k: 1 / 0  # noqa: E731 -- the call fails: still restored
    with pytest.raises(ZeroDivisionError):
        sampler(_batch())
    assert (fake.generate_uniform_probs, fake.sample_recovered_tokens) == saved


def test_without_the_libraries_the_error_says_what_to_install(monkeypatch):

    monkeypatch.setitem(sys.modules, "sglang", None)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="needs SGLang's Triton chain verification"):
        SglangSampler()
    with pytest.raises(ImportError, match="needs vLLM's V1 rejection sampler"):
        VllmV1Sampler()


def test_a_kernel_module_whose_package_does_not_import_is_loaded_from_its_file(tmp_path, monkeypatch):
    """SGLang 0.5.20's `__init__` imports a package the gate does not install: the adapter loads the
    kernel module from its file (it imports only Triton), and the half-imported package the failed
    import leaves behind does not break the next module tried."""
    pkg = tmp_path / "fakesg"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import fakesg.srt.env\nimport not_installed_anywhere\n")
    # fakesg.srt is a namespace package (no __init__.py), as sglang.srt is
    (pkg / "srt" / "env.py").write_text("")
    (pkg / "srt" / "kernels.py").write_text(f"def {sglang.CHAIN}(**kw):\n    return kw\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sglang, "SGLANG_MODULES", ("fakesg.ops.missing", "fakesg.srt.kernels"))
    for key in [k for k in sys.modules if k.startswith("fakesg")]:
        monkeypatch.delitem(sys.modules, key)
    chain, block = sglang.load_sglang()
    assert chain.__name__ == sglang.CHAIN and chain.__module__ == "fakesg.srt.kernels" and block is None


def test_a_changed_calling_convention_fails_at_construction():
    def newer(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
              retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
              threshold_single, threshold_acc, deterministic, sampling_seed):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"requires parameters \['sampling_seed'\]"):
        SglangSampler(chain_speculative_sampling=newer, device="cpu")
    fake = fake_vllm_v1()
    fake.generate_uniform_probs = lambda num_tokens, num_draft_tokens, generators: None  # noqa: E731
    with pytest.raises(TypeError, match="generate_uniform_probs"):
        VllmV1Sampler(module=fake, device="cpu")
    assert sglang.PARAMETERS[-3:] == ("threshold_single", "threshold_acc", "deterministic")
    assert vllm_v1.KERNEL_ARGS[vllm_v1.PROBS] == len(fake_vllm_v1().sample_recovered_tokens_kernel.arg_names)


# -- through the gate ----------------------------------------------------------------------------


# rejects_bad_input draws one batch of every SPEC 9 defect class per example (56 classes with the explicit
# noise's), so every class reaches the adapter from the first example on; more examples only vary the
# batches within a class, and both adapters refuse them through the same `explicit_inputs.admit` (the
# contract's `validate` first), whose messages the reference's whole-budget run (tests/test_properties.py)
# and tests/test_bad_input.py (the noise classes) check class by class. The gate here takes ci's share for
# the slow samplers (tests/conftest.py: 5 of 40 examples, each class 5 times per adapter): 12 s per
# adapter at the whole budget, about 2 s at the share, on an idle core. The long run takes the whole budget.
SHARED = set() if LONG_RUN else {"rejects_bad_input"}


def _gate(name, sampler, reference, shrink=True):
    """Property `name` at the ci profile; `shrink=False` stops at the first failing example (a kill)."""
    ci = settings.get_profile("ci") if shrink else no_shrink()
    base = settings(ci, max_examples=round(ci.max_examples * SHARE)) if name in SHARED else ci
    return run(PROPERTIES[name], make_context(sampler, reference, profile="ci"), base)


@pytest.mark.parametrize("name", ["certified_equivalence", "output_invariants", "blackbox_chunking",
                                  "unvalidated_in_bounds", "rejects_bad_input"])
@pytest.mark.parametrize("make", [_sglang, _vllm_v1], ids=["sglang", "vllm-v1"])
def test_the_gate_passes_each_adapter(name, make, reference):
    outcome = _gate(name, make(), reference)
    assert outcome.status == "passed", outcome.failure.text() if outcome.failure else outcome.reason
    assert outcome.stats.get("stochastic_decisions", 100) >= 100  # the decision floor of a whole-budget run


@pytest.mark.parametrize("make", [_sglang, _vllm_v1], ids=["sglang", "vllm-v1"])
def test_internal_chunking_is_not_claimed(make, reference):
    outcome = _gate("chunked_equals_full", make(), reference)
    assert outcome.status == "skipped" and "internal chunking" in outcome.reason


@pytest.mark.parametrize("make, defect", [(_sglang, "neighbour_uniform"), (_sglang, "cdf_over_p"),
                                          (_vllm_v1, "neighbour_uniform"), (_vllm_v1, "recover_from_p")])
def test_a_planted_defect_fails_certification(make, defect, reference):
    outcome = _gate("certified_equivalence", make(defect), reference, shrink=False)
    assert outcome.status == "failed", outcome.status
    assert re.search("differ from the reference|outside the residual|emitted it again", outcome.failure.text())
