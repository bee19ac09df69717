"""Declared capabilities (SPEC section 10): the strategies draw only what a sampler supports, and
the gate says what it therefore did not exercise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.torch_sampler import TorchSampler
from rs_verify.reference import ReferenceSampler
from rs_verify.engine.context import make_context, skip_reason
from rs_verify.harness.record import DeclarationError, SamplerRecord, record_of
from rs_verify.engine.runner import run
from rs_verify.properties import PROPERTIES

ROOT = Path(__file__).resolve().parents[1]


class _Toy:
    name = "toy"
    supports_logprobs = False
    draft_modes = {"model"}
    logits_dtypes = {"float32"}
    min_spec_steps = 2

    def __call__(self, batch, **kw):  # pragma: no cover - never called here
        raise AssertionError


def test_declarations_narrow_the_strategies():
    ctx = make_context(_Toy(), profile="ci")
    kw = ctx.batch_kwargs
    assert kw["logprobs"] == (None,) and kw["draft_modes"] == ("model",) and kw["logits_dtypes"] == ("float32",)
    assert kw["min_drafts"] == 2 and kw["max_spec_steps"] >= 2
    missing = " ".join(record_of(_Toy()).not_exercised())
    for what in ("logprobs", "one-hot drafts", "bfloat16", "float16", "fewer than 2 drafts", "block verification",
                 "min_p, top_k, top_p"):
        assert what in missing
    everything = SamplerRecord(name="all", streams="explicit", verification_methods={"token", "block", "tree"},
                               sampling_params={"min_p", "top_k", "top_p"})
    assert everything.not_exercised() == []  # a sampler declaring the whole SPEC is exercised on all of it


@pytest.mark.parametrize("attr, value", [("draft_modes", {"one-hot"}), ("verification_methods", {"block"}),
                                         ("sampling_params", {"top_q"}), ("streams", "numpy"),
                                         ("min_spec_steps", -1), ("logits_dtypes", "float32")])
def test_declarations_the_spec_forbids_are_refused(attr, value):
    toy = _Toy()
    setattr(toy, attr, value)
    with pytest.raises(DeclarationError, match=attr):
        record_of(toy)


def test_triton_sampler_without_logprobs_passes_on_cpu_without_device_options(tmp_path):
    """From an empty directory, no --rs-device and no TRITON_INTERPRET: the suite picks the
    interpreter itself, draws no logprobs, passes, and says logprobs were not exercised."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RS_VERIFY_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-p", "rs_verify", "--rs-sampler=examples.no_logprobs:NoLogprobsSampler",
           "--rs-profile", "ci", "-q", "-p", "no:cacheprovider", "-k",
           "stream_edges or tiny_temperatures"]  # the reference-certified fixed campaigns: cheap, and they call it
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "2 passed" in text, text
    assert "not exercised" in text and "supports_logprobs = False" in text, text


OWN_KERNEL = '''
import numpy as np
import torch
import triton
import triton.language as tl

from examples.torch_sampler import TorchSampler


@triton.jit
def _scale(x_ptr, o_ptr):
    r = tl.program_id(0)
    tl.store(o_ptr + r, tl.load(x_ptr + r) * 1.0)


class OwnKernelSampler(TorchSampler):
    """Launches its own Triton kernel, one program per request, on every call (through the interpreter:
    minutes for a campaign's 200,000 requests); says nothing about being interpreted."""

    name = "own-kernel"
    supports_logprobs = False

    def __call__(self, batch, **kw):
        if batch.num_logprobs is not None:
            raise ValueError("num_logprobs: this sampler computes no logprobs")
        t = torch.from_numpy(np.array(batch.temperature, dtype=np.float32)[np.asarray(batch.idx_mapping)])
        if batch.num_reqs:
            _scale[(batch.num_reqs,)](t, torch.empty_like(t))
        return super().__call__(batch, **kw)
'''
CAMPAIGNS = ("distribution_model_drafts", "distribution_one_hot_drafts", "distribution_saturated_residuals",
             "closed_forms")


def test_a_third_party_triton_sampler_is_treated_as_interpreted_on_cpu(tmp_path):
    """A sampler module with its own @triton.jit kernel, no `interpreted` declaration, gated with no
    device option on a CPU machine: the suite runs its kernel through the interpreter, so it skips
    the 200,000-request campaigns with that reason (instead of timing out in each) and says so."""
    (tmp_path / "ownkernel.py").write_text(OWN_KERNEL)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RS_VERIFY_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # --rs-timeout bounds a regression (a campaign sent to the interpreter) to seconds per campaign.
    cmd = [sys.executable, "-m", "pytest", "-p", "rs_verify", "--rs-sampler=ownkernel:OwnKernelSampler",
           "--rs-profile", "ci", "--rs-timeout", "10", "-q", "-p", "no:cacheprovider", "-rs",
           "-k", "(" + " or ".join(CAMPAIGNS) + ") and not block or (determinism and not large)"]  # determinism: its kernel runs
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "1 passed, 4 skipped" in text, text
    assert "SamplerTimeout" not in text and "did not return" not in text, text
    why = "too slow for a distribution campaign: the suite runs its Triton kernels through the interpreter"
    for name in CAMPAIGNS:
        assert f"rs-verify::{name}: {why}" in text, text
    assert "not exercised" in text and "the distribution campaigns: the suite runs its Triton kernels" in text, text


class _ModelOnly(TorchSampler):
    """Takes model drafts only, and says so; a one-hot batch is an error here."""
    name = "model-only"
    draft_modes = {"model"}

    def __call__(self, batch, **kw):
        if batch.draft_logits is None:
            raise TypeError("model-only: got a one-hot batch")
        return super().__call__(batch, **kw)


class _OneHotOnly(TorchSampler):
    name = "one-hot-only"
    draft_modes = {"one_hot"}

    def __call__(self, batch, **kw):
        if batch.draft_logits is not None:
            raise TypeError("one-hot-only: got a model-draft batch")
        return super().__call__(batch, **kw)


# The campaigns of block verification and of the sampling parameters (SPEC 4b, 2).
UNDECLARED = {"distribution_block_sequences", "block_closed_forms", "distribution_sampling_params", "distribution_tree"}


@pytest.mark.parametrize("sampler, skipped", [
    (_ModelOnly(), {"tiny_temperatures", "distribution_one_hot_drafts"}),
    (_OneHotOnly(), {"closed_forms", "distribution_model_drafts", "distribution_saturated_residuals"}),
])
def test_fixed_campaigns_send_only_declared_draft_modes(sampler, skipped):
    """The fixed campaigns (no strategy) build their own batches: they too send only the draft
    modes a sampler declares, and the campaigns of the other mode skip with the reason."""
    ctx = make_context(sampler, ReferenceSampler(), profile="dev", device="cpu")
    fixed = [p for p in PROPERTIES.values() if p.strategy is None and p.family in ("edges", "distribution", "equivalence")]
    assert skipped <= {p.name for p in fixed}
    for prop in fixed:
        reason = skip_reason(prop, ctx)
        if prop.name in skipped:
            assert reason and "draft_modes" in reason, (prop.name, reason)
            continue
        if prop.name in UNDECLARED:  # neither sampler declares block verification or parameters
            assert reason and ("verification_methods" in reason or "sampling_params" in reason), (prop.name, reason)
            continue
        assert reason is None, (prop.name, reason)
        outcome = run(prop, ctx)
        assert outcome.status == "passed", (prop.name, outcome.failure and outcome.failure.text())


DECLARING = '''
class Declaring:
    name = "declaring"
    streams = "spec"
    supports_chunking = True
    supports_logprobs = False
    draft_modes = {"one_hot"}
    logits_dtypes = {"float32", "bfloat16"}
    min_spec_steps = 1
    verification_methods = {"token", "block"}
    sampling_params = {"top_k"}
    memory_stats = True
    block_v = 32

    def unvalidated(self):
        return self

    def __call__(self, batch, *, max_chunk_logits=None):  # pragma: no cover - never called here
        raise AssertionError
'''


def _records_here_and_in_a_child(tmp_path, monkeypatch, module: str, text: str, attr: str):
    """`(record in process, record from a child, the child)` of `module:attr` written from `text`."""
    from rs_verify.engine import isolation
    from rs_verify.harness.samplers import load_sampler

    (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    here = record_of(load_sampler(f"{module}:{attr}"))
    child = isolation.load(f"{module}:{attr}", "property", device_name="cpu", sys_path=[str(tmp_path)])
    try:
        return here, record_of(child), child
    finally:
        child.close()


def test_an_isolated_sampler_is_seen_exactly_as_in_process(tmp_path, monkeypatch):
    """The child sends its record and nothing else, so every declaration (`block_v` included: the
    vocabularies the strategies tailor to the sampler's block) crosses the process boundary."""
    from rs_verify.harness.samplers import load_sampler

    here, there, child = _records_here_and_in_a_child(tmp_path, monkeypatch, "declaring", DECLARING, "Declaring")
    assert there == here.replace(loaded_as="declaring:Declaring") and there.block_v == 32 and there.has_unvalidated
    assert make_context(child, profile="ci").batch_kwargs == make_context(load_sampler("declaring:Declaring"),
                                                                          profile="ci").batch_kwargs


OWN_FAMILY = '''
from rs_verify.contract.streams import StreamFamily
from rs_verify.contract.triton_philox import acceptance_uniforms, gumbel_noise

PHILOX_COPY = StreamFamily(name="philox-copy", section="3d", acceptance=acceptance_uniforms, noise=gumbel_noise)


class OwnFamily:
    name = "own-family"
    streams = PHILOX_COPY

    def __call__(self, batch, *, max_chunk_logits=None):  # pragma: no cover - never called here
        raise AssertionError
'''


def test_an_isolated_samplers_own_stream_family_crosses_by_its_path(tmp_path, monkeypatch):
    """A family the suite does not ship (SPEC 3d) is sent by its module:attribute path and read back
    as the same record."""
    here, there, _ = _records_here_and_in_a_child(tmp_path, monkeypatch, "own_family", OWN_FAMILY, "OwnFamily")
    assert here.family.name == "philox-copy" and there.family is here.family
    assert there == here.replace(loaded_as="own_family:OwnFamily")


# -- what a run exercised (SPEC sections 2 and 4b) ---------------------------------------


class _Refuses(TorchSampler):
    """Refuses every block-verified batch (as a bad input); answers the rest."""

    name = "refuses-block"
    verification_methods = {"token", "block"}
    sampling_params = {"min_p", "top_k", "top_p"}

    def __call__(self, batch, **kw):
        if batch.verification == "block":
            raise ValueError("verification: block is refused here")
        return super().__call__(batch.replace(top_k=None, top_p=None, min_p=None), **kw)


def test_only_answered_batches_count_as_exercised():
    """A block batch the sampler refused (a bad input must be refused) exercised nothing; the
    answered ones are counted per feature, and a declared feature never answered is said so."""
    from hypothesis import HealthCheck, find, settings

    from rs_verify.harness.guards import observed_call
    from rs_verify.harness.handle import SamplerUnderTest
    from rs_verify.strategies.batches import spec_batches

    block = find(spec_batches(verifications=("block",), sampling_params=("top_p",)),
                 lambda b: set(b.exercises()) == {"block", "top_p"},
                 settings=settings(database=None, derandomize=True, suppress_health_check=list(HealthCheck)))
    handle = SamplerUnderTest(_Refuses())
    with pytest.raises(ValueError):
        observed_call(handle, block)
    assert handle.calls == 1 and handle.sent == {}
    observed_call(handle, block.replace(verification="token"))
    assert handle.calls == 2 and handle.sent == {"top_p": 1}
    lines = handle.record.exercised([handle.sent, {"top_p": 2, "min_p": 1}])
    assert lines == ["block verification (SPEC section 4b): declared, but no batch with it was answered in this run",
                     "min-p (SPEC section 2): 1 batches, in 1 property",
                     "top-k (SPEC section 2): declared, but no batch with it was answered in this run",
                     "top-p (SPEC section 2): 3 batches, in 2 properties"]
    assert record_of(TorchSampler()).exercised([{"block": 5}]) == []  # declared nothing of 2 / 4b: nothing to say


def test_check_and_plugin_say_what_they_exercised(tmp_path):
    """`rs-verify check` and the plugin both list block verification and the three parameters
    with the number of batches the sampler answered (the reference declares all four)."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    check = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--sampler", "reference",
                            "--only", "output_invariants", "--profile", "ci", "--device", "cpu", "--no-bundles"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-p", "rs_verify", "--rs-sampler=reference",
                             "--rs-profile", "ci", "--rs-device", "cpu", "-k", "output_invariants", "-q",
                             "-p", "no:cacheprovider"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    for out, heading in ((check, "exercised (batches the sampler answered):"),
                         (plugin, "rs-verify: exercised (batches the sampler answered)")):
        text = out.stdout + out.stderr
        assert out.returncode == 0 and heading in text, text
        for what in ("block verification (SPEC section 4b)", "min-p (SPEC section 2)", "top-k (SPEC section 2)",
                     "top-p (SPEC section 2)"):
            line = next((x for x in text.splitlines() if what in x), "")
            assert line.endswith("in 1 property") and int(line.split(": ")[1].split()[0]) > 0, text
