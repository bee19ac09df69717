"""Misbehaving samplers (examples/misbehaving.py): each ends as a failed property with a failure
bundle, and the session goes on.

A crash and a hang need the sampler in a child process: they run through the pytest plugin and
through the CLI, one property per case (`-k` / `--only`) plus `planner`, which runs after it in
registry order: its pass shows the session survived. The other misbehaviours are caught by the
guards that run where the sampler runs (`guards.local_call`, the same code in a child as in this
process): they run in this process, through the runner the front ends call (the in-place case
also with the sampler in a child). Shrinking is cut to 2 s (`RS_VERIFY_SHRINK_SECONDS`): the
verdict is what these tests check, not the shrunk batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rs_verify.engine import isolation, runner
from rs_verify.harness import guards
from rs_verify.harness.record import SamplerRecord
from rs_verify.engine.profiles import SHRINK_ENV
from rs_verify.properties import PROPERTIES, Property, PropertyFailure
from rs_verify import SpecBatch
from rs_verify.properties.bad_input import contract_index, named_fields, names_index

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 5  # seconds per call for the hanging sampler
# What torch says, once per process, as it writes through a read-only array (InPlaceSampler does).
READ_ONLY_WARNING = "The given NumPy array is not writable"

# case: (sampler in examples.misbehaving, property, extra options, what the failure must say, failure kind)
CASES = {
    "segfault": ("SegfaultSampler", "determinism", False, "killed by signal SIGSEGV", "crash"),
    "hang": ("HangingSampler", "determinism", True, f"did not return within {TIMEOUT} s", "timeout"),
    "in-place": ("InPlaceSampler", "determinism", False, "sampler modified target_logits", "property"),
    "global-rng": ("numpy_rng", "determinism", False, "global generators reseeded", "property"),
    "vague-error": ("VagueErrorSampler", "rejects_bad_input", False, "names 'target_logits' first", "property"),
    "cuda-fault": ("CudaFaultSampler", "unvalidated_in_bounds", False,
                   "CUDA error: an illegal memory access was encountered", "property"),
}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv(SHRINK_ENV, "2")
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)


def _bundle(directory: Path, prop: str, attr: str, kind: str) -> dict:
    written = sorted(directory.glob(f"{prop}-*.npz"))
    assert len(written) == 1, written
    meta = json.loads(written[0].with_suffix(".json").read_text())
    assert meta["property"] == prop and meta["sampler"] == f"examples.misbehaving:{attr}" and meta["kind"] == kind
    assert meta["batch"] is not None  # the batch that caused it
    return meta


# The cases a child process adds something to: the process dies, or is killed. The others run
# through the plugin in the long run, and in this process by default (below).
IN_CHILD = [case for case, (*_, kind) in CASES.items() if kind in ("crash", "timeout")]


@pytest.mark.parametrize("case", [c if c in IN_CHILD else pytest.param(c, marks=pytest.mark.long) for c in CASES])
def test_plugin_reports_each_misbehaviour(pytester, env, tmp_path, case):
    attr, prop, hangs, says, kind = CASES[case]
    bundles = tmp_path / "bundles"
    extra = ["--rs-timeout", str(TIMEOUT)] if hangs else []
    result = pytester.runpytest_subprocess(
        "-p", "rs_verify", f"--rs-sampler=examples.misbehaving:{attr}", "--rs-profile", "ci", "--rs-device", "cpu",
        f"--rs-bundle-dir={bundles}", "-k", f"({prop} or planner) and not large_batch", "-p", "no:cacheprovider", "-q", *extra)
    out = result.stdout.str()
    result.assert_outcomes(failed=1, passed=1)  # the session went on: planner ran after the failure
    result.stdout.fnmatch_lines([f"FAILED rs-verify::{prop}*"])
    assert says in out, out
    _bundle(bundles, prop, attr, kind)
    result.stdout.fnmatch_lines(["*rs-verify failure bundles*", f"rs-verify replay {bundles}*"])


# The CLI twins of the plugin cases: the crash in the default run (the CLI's report of a dead child
# and the replay's isolation), the rest in the long run (a hang is the same child's timeout as
# through the plugin above; the others the in-process cases below).
@pytest.mark.parametrize("case", [c if c == "segfault" else pytest.param(c, marks=pytest.mark.long) for c in CASES])
def test_cli_reports_each_misbehaviour(env, tmp_path, case):
    attr, prop, hangs, says, kind = CASES[case]
    extra = ["--timeout", str(TIMEOUT)] if hangs else []
    if case != "vague-error":  # one case on worker processes (its draw must cross back), the others in one
        extra += ["--jobs", "1"]
    out = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--sampler",
                          f"examples.misbehaving:{attr}", "--only", prop, "planner", "--profile", "ci", "--device",
                          "cpu", "--bundle-dir", str(tmp_path / "b"), *extra],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env=dict(os.environ, COLUMNS="200"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert says in out.stdout and "1 passed, 1 failed, 0 skipped" in out.stdout, out.stdout
    meta = _bundle(tmp_path / "b", prop, attr, kind)
    if kind == "crash":  # the replay isolates too: the crash is reported, not suffered
        replay = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "replay",
                                 meta["replay"].split()[-1]], capture_output=True, text=True, cwd=tmp_path,
                                timeout=600)
        assert replay.returncode == 1 and "STILL FAILS" in replay.stdout and says in replay.stdout, replay.stdout


# In place the sampler writes to its own copy of the batch: only the child's guard sees it, and its
# report crosses back (the guards' path through a child, once in the default run).
@pytest.mark.filterwarnings(f"ignore:{READ_ONLY_WARNING}")
@pytest.mark.parametrize("case, isolate", [(case, "off") for case in CASES if case not in IN_CHILD]
                         + [("in-place", "property")])
def test_each_misbehaviour_in_process_fails_its_property_with_a_bundle(env, tmp_path, case, isolate):
    """As the plugin runs a property (`--rs-isolate off`: the sampler loaded in this process)."""
    attr, prop, _, says, kind = CASES[case]
    spec = f"examples.misbehaving:{attr}"
    sampler = isolation.load(spec, isolate, device_name="cpu")
    try:
        ctx = runner.make_context(sampler, profile="ci", device="cpu")
        outcome = runner.run(PROPERTIES[prop], ctx, bundle_dir=tmp_path / "bundles", sampler_spec=spec)
    finally:
        getattr(sampler, "close", lambda: None)()
    assert outcome.status == "failed" and says in outcome.failure.text(), outcome.message
    _bundle(tmp_path / "bundles", prop, attr, kind)


# -- the parts, in this process --------------------------------------------------------


def _batch(num_reqs: int) -> SpecBatch:
    """`num_reqs` requests of one draft each over a vocabulary of 5."""
    n = 2 * num_reqs
    return SpecBatch(
        target_logits=np.random.default_rng(num_reqs).normal(size=(n, 5)).astype(np.float32), draft_logits=None,
        draft_token_ids=np.tile(np.array([0, 1], np.int64), num_reqs),
        cu_num_logits=(2 * np.arange(num_reqs + 1)).astype(np.int32), pos=np.arange(n, dtype=np.int64),
        idx_mapping=np.arange(num_reqs, dtype=np.int32), temperature=np.ones(num_reqs, np.float32),
        seeds=np.arange(num_reqs, dtype=np.int64), num_speculative_steps=1)


@pytest.mark.filterwarnings(f"ignore:{READ_ONLY_WARNING}")
def test_modified_names_the_field_and_the_first_index():
    torch = pytest.importorskip("torch")
    batch = _batch(3)
    snap = guards.snapshot(batch)
    assert guards.modified(batch, snap) is None
    torch.from_numpy(batch.pos)[4:].add_(1)
    assert guards.modified(batch, snap).startswith("pos[4] (")


def test_reseeded_calls_see_different_global_state_and_it_is_restored():
    draws = []

    def sampler(batch):
        draws.append((np.random.random(), __import__("random").random()))
        return None

    np.random.seed(5)
    before = np.random.get_state()[1].copy()
    batch = _batch(1)
    guards.local_call(sampler, batch, {}, reseed=1)
    guards.local_call(sampler, batch, {}, reseed=2)
    guards.local_call(sampler, batch, {}, reseed=1)
    assert draws[0] != draws[1] and draws[0] == draws[2]
    assert np.array_equal(np.random.get_state()[1], before)


def test_bad_input_messages_must_name_the_field_first_and_the_index():
    assert named_fields("draft_token_ids[3]: draft id >= V' = 7 (target_logits has 7 columns)") == [
        "draft_token_ids", "target_logits"]
    assert named_fields("bad logits in row 2") == []  # `logits` alone is no field
    assert names_index("target_logits[2, 7]: NaN", (2, 7)) and names_index("NaN at (2, 7) of target_logits", (2, 7))
    assert not names_index("target_logits[7, 2]: NaN", (2, 7))
    bad = _batch(3).replace(pos=np.array([0, 1, 2, -5, 4, -1], np.int64))
    assert contract_index(bad, "pos") == (3,) and contract_index(bad, "seeds") is None


def test_no_property_passes_a_sampler_it_never_called():
    idle = Property("idle", "toy", "never calls the sampler", lambda ctx, drawn: None)
    res = runner.run(idle, runner.make_context(sampler=lambda b, **kw: None, profile="ci", device="cpu"))
    assert res.status == "failed" and "never called the sampler" in res.message
    assert runner.run(PROPERTIES["planner"], runner.make_context(sampler=None, profile="ci", device="cpu")).self_check


def test_a_crash_stops_hypothesis_at_once_with_the_batch():
    """No shrinking through crashes (each try would cost a process, or a whole timeout)."""
    tried = []

    def check(ctx, x):
        tried.append(x)
        if x >= 3:
            raise isolation.SamplerCrash("killed by signal SIGSEGV", batch=_batch(x))

    from hypothesis import strategies as st

    prop = Property("toy_crash", "toy", "toy", check, strategy=lambda ctx: st.integers(0, 100))
    res = runner.run(prop, runner.make_context(sampler=None, profile="ci", device="cpu"))
    assert res.status == "failed" and res.failure.kind == "crash" and tried[-1] >= 3
    assert tried.count(tried[-1]) == 1 and all(x < 3 for x in tried[:-1])  # stopped at the first crash
    assert res.failure.batch.num_reqs == tried[-1]


def test_front_ends_share_the_isolation_options():
    """The CLI's `--isolate/--timeout` and the plugin's `--rs-isolate/--rs-timeout` come from one
    table (rs_verify/frontends/options.py) whose defaults are the engine's."""
    import argparse

    from rs_verify.frontends import cli, options

    assert options.SHARED["isolate"]["default"] == isolation.DEFAULT_LEVEL
    assert tuple(options.SHARED["isolate"]["choices"]) == isolation.LEVELS
    assert options.SHARED["timeout"]["default"] == isolation.DEFAULT_TIMEOUT <= 600 - 60  # a hang fails within 10 min
    args = cli.build_parser().parse_args(["check"])
    assert (args.isolate, args.timeout) == (isolation.DEFAULT_LEVEL, isolation.DEFAULT_TIMEOUT)
    assert cli.build_parser().parse_args(["replay", "x.npz"]).timeout is None  # the bundle's own limit
    parser = argparse.ArgumentParser()
    options.add(parser.add_argument, options.ISOLATION, prefix="rs-")
    assert vars(parser.parse_args([])) == {"rs_isolate": "property", "rs_timeout": isolation.DEFAULT_TIMEOUT}


def test_property_failure_reports_modified_input_before_the_output():
    from rs_verify.properties.assertions import call

    def sampler(batch):
        object.__setattr__(batch, "num_logprobs", 2)
        return "not an output"

    with pytest.raises(PropertyFailure, match=r"modified num_logprobs \(None became 2\) in place"):
        call(sampler, _batch(2))


def test_a_crashed_child_is_replaced_and_call_level_isolation_restarts_every_call():
    seg = isolation.ChildSampler("examples.misbehaving:SegfaultSampler", device_name="cpu")
    try:
        crashing = _batch(2).replace(num_logprobs=1)
        with pytest.raises(isolation.SamplerCrash, match="killed by signal SIGSEGV") as info:
            seg(crashing)
        assert info.value.batch is crashing and not isinstance(info.value, Exception)
        assert seg(_batch(2)).sampled.shape == (2, 2)  # the next call started a fresh child
    finally:
        seg.close()
    per_call = isolation.load("examples.torch_sampler:TorchSampler", "call", device_name="cpu")
    try:
        first = per_call._proc.pid
        per_call(_batch(1))
        assert per_call._proc is None  # stopped after the call
        per_call(_batch(1))
        assert per_call._proc is None and first is not None
    finally:
        per_call.close()


def test_a_message_without_the_first_offending_index_fails(monkeypatch):
    """Names the right field first, but always index 0: an element-wise defect elsewhere fails."""
    from rs_verify import validate

    class FieldOnly:
        name = "field-only"

        def __call__(self, batch, *, max_chunk_logits=None):
            try:
                validate(batch)
            except ValueError as exc:
                raise ValueError(str(exc).split("[")[0].split(":")[0] + "[0]: invalid") from None
            raise AssertionError("only bad batches are sent here")

    monkeypatch.setenv(SHRINK_ENV, "1")
    res = runner.run(PROPERTIES["rejects_bad_input"], runner.make_context(FieldOnly(), profile="ci", device="cpu"))
    assert res.status == "failed" and "does not name the first offending index" in res.message, res.message


def test_a_device_fault_surfaced_after_the_call_fails_that_call(monkeypatch):
    """On CUDA the device is synchronised after every call: an asynchronous fault is raised there."""
    from types import SimpleNamespace

    def synchronize():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda = SimpleNamespace(synchronize=synchronize, reset_peak_memory_stats=lambda: None,
                           memory_allocated=lambda: 0, max_memory_allocated=lambda: 0)
    monkeypatch.setattr(guards, "_cuda_torch", lambda: SimpleNamespace(cuda=cuda))
    with pytest.raises(guards.DeviceFault, match="illegal memory access"):
        guards.local_call(lambda batch: "an output", _batch(1), {})


def test_a_value_error_after_kernel_launches_is_no_refusal(monkeypatch):
    """Compiled Triton launches are counted through Triton's launch hook (not under the interpreter)."""
    triton = pytest.importorskip("triton")
    from rs_verify.properties.bad_input import _check_rejected

    monkeypatch.setattr(guards.device, "interpreted", lambda: False)

    def sampler(batch):
        triton.knobs.runtime.launch_enter_hook(None)  # what a compiled kernel launch calls
        raise ValueError("pos[3]: negative position -5")

    bad = _batch(3).replace(pos=np.array([0, 1, 2, -5, 4, 5], np.int64))
    with pytest.raises(ValueError) as info:
        guards.local_call(sampler, bad, {})
    assert info.value.call_report.triton_launches == 1
    with pytest.raises(PropertyFailure, match="after 1 Triton kernel launches"):
        _check_rejected(sampler, bad, "pos")
    assert not triton.knobs.runtime.launch_enter_hook.calls  # the hook was removed again


def test_after_a_hang_later_calls_wait_less():
    """A sampler that hangs on every call must not cost the full timeout in every property."""
    child = isolation.ChildSampler("examples.misbehaving:HangingSampler", timeout=300,
                                    record=SamplerRecord(name="hanging"))
    other = child.sibling()  # another property's child in the same session
    assert child.call_limit() == other.call_limit() == 300
    child._history["hung"] = True  # what a timed-out call records
    child._longest = 12.0
    assert child.call_limit() == isolation.AFTER_HANG_FACTOR * 12.0
    assert other.call_limit() == isolation.AFTER_HANG_FLOOR  # it has answered no call yet


def test_a_dead_worker_fails_only_its_property_and_is_replaced():
    """`check --jobs`: the sampler, run in the worker itself (`--isolate off`), kills it on one
    property. That property fails with the signal; on one worker process, the properties still
    pending run on a fresh worker (a pool marked broken would fail them all)."""
    from rs_verify.engine import pool

    setup = pool.Setup("examples.misbehaving:LargeBatchSegfaultSampler", None, "cpu", "ci", "off", 60.0)
    names = ["planner", "greedy_chain", "determinism_large_batch"]  # run most expensive first: the crash first
    done = {o.name: o for o in pool.run_parallel(names, setup, jobs=1)}
    assert sorted(done) == sorted(names)
    dead = done["determinism_large_batch"]
    assert dead.status == "failed" and dead.failure.kind == "crash", dead.message
    assert "worker process killed by signal SIGSEGV while running this property" in dead.message, dead.message
    for name in ("planner", "greedy_chain"):
        assert done[name].status == "passed", done[name].message
