"""The pytest plugin: silent without --rs-sampler, one item per property with it, and a failing
sampler leaves a bundle that `rs-verify replay` reproduces. That it is light to load (neither torch
nor triton) is tests/test_layout.py's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rs_verify.properties import PROPERTIES

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
TORCH = "examples.torch_sampler:TorchSampler"
BROKEN = "examples.broken_sampler:BrokenSampler"


@pytest.fixture
def gate(pytester, monkeypatch):
    """A project directory outside this repository in which `examples` is importable."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return pytester


def test_without_a_sampler_the_plugin_adds_nothing(gate):
    gate.makepyfile(test_one="def test_one():\n    pass\n")
    result = gate.runpytest_subprocess("-p", "rs_verify", "--co", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes()
    assert "rs-verify::" not in result.stdout.str()
    assert "1 test collected" in result.stdout.str()


def test_gpu_marker_skips_cleanly_without_cuda(gate):
    import torch

    gate.makepyfile(test_gpu="import pytest\n\n@pytest.mark.gpu\ndef test_kernel():\n    pass\n")
    result = gate.runpytest_subprocess("-p", "rs_verify", "-rs", "-p", "no:cacheprovider", "--strict-markers")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*needs a CUDA device*"])


def test_one_item_per_property_in_registry_order(gate):
    result = gate.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler={TORCH}", "--co", "-q",
                                       "-p", "no:cacheprovider")
    ids = [line for line in result.stdout.lines if line.startswith("rs-verify::")]
    assert ids == [f"rs-verify::{name}" for name in PROPERTIES]


@pytest.mark.long  # long run: tests/test_examples.py runs the example sampler's properties by default
def test_torch_sampler_passes_the_library(gate):
    """A subset on two xdist workers (the full library: benchmarks/NOTES.md, isolation; ~1 min on 2 CPU cores)."""
    pytest.importorskip("xdist")
    keep = "planner or determinism or output_invariants or greedy_chain or certified or chunk or bad_input"
    result = gate.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler={TORCH}", "--rs-profile", "ci",
                                       "--rs-device", "cpu", "-k", keep, "-n", "2", "-p", "no:cacheprovider", "-rs")
    # chunked_equals_full needs internal chunking: skipped with the runner's reason.
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) >= 7 and outcomes.get("skipped", 0) >= 1
    result.stdout.fnmatch_lines(["*chunked_equals_full: the sampler does not support internal chunking*"])
    # The plugin's own summary: skip reasons (shown under -q too) and the suite's self-checks,
    # which are not passes of the sampler.
    result.stdout.fnmatch_lines(["*rs-verify: properties not run on this sampler*",
                                 "rs-verify::chunked_equals_full: the sampler does not support internal chunking*"])
    result.stdout.fnmatch_lines(["*rs-verify: self-checks and self-reported figures*",
                                 "rs-verify::planner: a self-check of the suite; it does not call the sampler"])


def test_broken_sampler_fails_and_its_bundle_replays(gate, tmp_path):
    """The |p - q| residual fails the model-draft campaign (fixed seeds: the verdict does not depend
    on what Hypothesis draws); its bundle replays the campaign and fails again, and the correct
    sampler passes it. A sampler that answers wrongly needs no child process: the sampler runs in
    the pytest and the replay processes (tests/test_misbehaving.py isolates crashes and hangs)."""
    bundles = tmp_path / "bundles"
    result = gate.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler={BROKEN}", "--rs-profile", "dev",
                                       "--rs-device", "cpu", f"--rs-bundle-dir={bundles}", "--rs-isolate", "off",
                                       "-k", "distribution_model_drafts", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    written = sorted(bundles.glob("distribution_model_drafts-*.npz"))
    assert len(written) == 1
    meta = json.loads(written[0].with_suffix(".json").read_text())
    assert meta["sampler"] == BROKEN and meta["options"]["profile"] == "dev" and meta["property"] == written[0].name.split("-")[0]
    result.stdout.fnmatch_lines(["*does not fit the target*", "*rs-verify failure bundles*",
                                 f"rs-verify replay {written[0]}"])

    def replay(*extra):
        return subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "replay", str(written[0]),
                               "--isolate", "off", *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)

    again = replay()
    assert again.returncode == 1, again.stdout + again.stderr
    assert "STILL FAILS" in again.stdout and "does not fit the target" in again.stdout
    fixed = replay("--sampler", TORCH)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "PASSES" in fixed.stdout


def test_buffer_within_cap_says_it_trusts_the_sampler(gate):
    """A pass resting on the sampler's own figure (extras["max_buffer_rows"]) says so in the summary."""
    gate.makepyfile(instrumented=(
        "from rs_verify.reference import ReferenceSampler\n\n"
        "class Instrumented(ReferenceSampler):\n"
        "    memory_stats = True\n\n"
        "    def __call__(self, batch, *, max_chunk_logits=None):\n"
        "        out = super().__call__(batch, max_chunk_logits=max_chunk_logits)\n"
        "        out.extras['max_buffer_rows'] = 0  # claimed, not measured\n"
        "        return out\n"))
    result = gate.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=instrumented:Instrumented", "--rs-profile", "ci",
                                       "--rs-device", "cpu", "-k", "buffer_within_cap", "-p", "no:cacheprovider",
                                       "-q", "--rs-isolate", "off")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*rs-verify: self-checks and self-reported figures*",
                                 "rs-verify::buffer_within_cap: relies on the sampler's self-reported extras*"])


def test_sampler_that_cannot_load_fails_cleanly(gate):
    result = gate.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=no_such_module:thing", "-k", "planner",
                                       "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot load the sampler (--rs-sampler) 'no_such_module:thing'*"])


WARNING_SAMPLER = '''
import torch
import triton
import triton.language as tl

from examples.torch_sampler import TorchSampler


@triton.jit
def _masked_exp(x_ptr, o_ptr):
    x = tl.load(x_ptr + tl.arange(0, 4))
    tl.store(o_ptr + tl.arange(0, 4), tl.exp(x) / (x - x))  # overflow, 1/0 and 0/0: NumPy warns


class Sampler(TorchSampler):
    def __call__(self, batch, **kw):
        _masked_exp[(1,)](torch.tensor([1e3, 0.0, -1e3, 1.0]), torch.empty(4))
        return super().__call__(batch, **kw)
'''


@pytest.mark.parametrize("isolate", ["off", "property"])
def test_interpreter_warnings_are_filtered(gate, isolate):
    """The interpreter's NumPy RuntimeWarnings (IEEE overflow inside a kernel) are not the sampler's
    fault: neither printed nor turned into errors by a project's `filterwarnings = error`, in the
    pytest process (isolation off) or in the sampler's child process (`-s`: its stderr is shown)."""
    gate.makepyfile(warny=WARNING_SAMPLER)
    gate.makeini("[pytest]\nfilterwarnings =\n    error\n")
    result = gate.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=warny:Sampler", "--rs-device", "cpu",
                                       "--rs-profile", "ci", f"--rs-isolate={isolate}", "-k", "determinism and not large",
                                       "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1)
    out = result.stdout.str() + result.stderr.str()
    assert "RuntimeWarning" not in out and "warnings summary" not in out, out


NAMELESS_SAMPLER = '''
from examples.torch_sampler import TorchSampler


class Nameless:
    """A sampler instance with no `name` (optional, SPEC 10): callable, but not a factory."""

    streams = "spec"

    def __init__(self):
        self._inner = TorchSampler()

    def __call__(self, batch, *, max_chunk_logits=None):
        return self._inner(batch, max_chunk_logits=max_chunk_logits)


SAMPLER = Nameless()
'''


def test_an_instance_without_a_name_is_gated(gate):
    """`module:attribute` naming a callable instance without `name` is the sampler itself, not a
    factory to call with no batch: it is gated (its record named after its class)."""
    from rs_verify.harness.samplers import is_factory

    assert is_factory(type) and is_factory(lambda: None) and not is_factory(NamelessProbe())
    gate.makepyfile(nameless=NAMELESS_SAMPLER)
    result = gate.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=nameless:SAMPLER", "--rs-device", "cpu",
                                       "--rs-profile", "ci", "-k", "determinism and not large or greedy_chain",
                                       "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


class NamelessProbe:
    def __call__(self, batch):
        return batch
