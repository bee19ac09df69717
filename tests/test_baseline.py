"""The regression gate: a changed sampler against its own base version (matches_baseline,
baseline_speed, the git: baselines, certified mode, and the usage errors of both front ends)."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from rs_verify.reference import ReferenceSampler
from rs_verify.engine import baseline as baselines
from rs_verify.engine import runner
from rs_verify.harness import timing
from rs_verify.engine.context import current_device
from rs_verify.harness.samplers import load_sampler
from rs_verify.frontends import baseline_gate
from rs_verify.properties import PROPERTIES
from rs_verify.properties import baseline as props

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def _settings(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=False)


def _run(name, sampler, baseline, *, reference=None, examples=20):
    ctx = runner.make_context(sampler, reference, profile="ci", device=current_device())
    ctx.baseline = baseline
    return runner.run(PROPERTIES[name], ctx, _settings(examples))


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


TOY_V1 = '''
from rs_verify.reference import ReferenceSampler


class Sampler(ReferenceSampler):
    name = "toy"
'''

# The planted change: request 1's last emitted token moves to the next token id.
TOY_V2 = TOY_V1 + '''
    def __call__(self, batch, *, max_chunk_logits=None):
        import dataclasses

        out = super().__call__(batch, max_chunk_logits=max_chunk_logits)
        if batch.num_reqs < 2:
            return out
        sampled = out.sampled.copy()
        last = int(out.num_sampled[1]) - 1
        sampled[1, last] = (sampled[1, last] + 1) % batch.effective_vocab_size
        return dataclasses.replace(out, sampled=sampled)
'''


@pytest.fixture
def toy_repo(tmp_path, monkeypatch):
    """A throwaway repository: `<module>.py` committed as TOY_V1, changed to TOY_V2 in the working tree."""
    module = f"toy_sampler_{tmp_path.name.replace('-', '_')}"
    _git(tmp_path, "init", "-q")
    (tmp_path / f"{module}.py").write_text(TOY_V1)
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "v1")
    (tmp_path / f"{module}.py").write_text(TOY_V2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path, f"{module}:Sampler"


def test_triton_sampler_against_a_git_revision_passes():
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    base = baselines.open_baseline("git:HEAD", sampler_spec="triton", device=current_device(), cwd=ROOT)
    tree = base._tmp / "tree"
    try:
        assert (tree / "rs_verify" / "triton_sampler" / "sampler.py").is_file()
        assert isinstance(base.sampler, baselines.ChildSampler) and base.spec.commit
        outcome = _run("matches_baseline", load_sampler("triton"), base, examples=6)
    finally:
        base.close()
    assert outcome.status == "passed", outcome.message
    assert outcome.examples == 6
    assert not tree.exists()  # the worktree is removed


def test_planted_one_token_change_fails_naming_the_request(toy_repo):
    _, spec = toy_repo
    base = baselines.open_baseline("git:HEAD", sampler_spec=spec, device="cpu")
    try:
        changed = load_sampler(spec)
        assert changed.__call__ is not ReferenceSampler.__call__  # the working tree (v2) is loaded here
        outcome = _run("matches_baseline", changed, base, examples=30)
        certified = dataclasses.replace(base, mode="certified")
        outcome_certified = _run("matches_baseline", changed, certified, reference=ReferenceSampler(), examples=30)
    finally:
        base.close()
    assert outcome.status == "failed"
    text = outcome.failure.text()
    assert "request 1 (" in text and "request 0 (" not in text, text
    assert "changed token" in text and "baseline token" in text
    assert f"changed: toy [{spec}]" in text and f"baseline: toy [{spec} at git:HEAD (" in text
    assert outcome.failure.failing_batch().num_reqs == 2  # shrunk to the two requests it needs
    # Certified mode does not excuse a token that is not a near-tie of the reference's decision.
    assert outcome_certified.status == "failed", outcome_certified.message
    assert "request 1, step" in outcome_certified.failure.message


class Nudged(ReferenceSampler):
    """The reference with every logprob moved by `ulps` float32 ulps (or by `shift` nats) toward -inf:
    a legitimate numerics move (a new reduction order) when small."""

    name = "nudged"

    def __init__(self, *, ulps=0, shift=0.0):
        super().__init__()
        self.ulps, self.shift = ulps, shift

    def __call__(self, batch, *, max_chunk_logits=None):
        out = super().__call__(batch, max_chunk_logits=max_chunk_logits)
        if out.logprobs is None:
            return out
        lp = out.logprobs.logprobs.copy()
        for _ in range(self.ulps):
            with np.errstate(over="ignore"):
                moved = np.nextafter(lp, np.float32(-np.inf))
            lp = np.where(np.isfinite(moved), moved, lp)  # -FLT_MAX stays: no overflow to -inf
        lp = np.where(np.isfinite(lp), lp - np.float32(self.shift), lp).astype(np.float32)
        return dataclasses.replace(out, logprobs=dataclasses.replace(out.logprobs, logprobs=lp))


def test_change_within_tolerance_fails_exact_and_passes_certified():
    exact = baselines.open_baseline("reference", sampler_spec="reference")
    certified = dataclasses.replace(exact, mode="certified")
    small = Nudged(ulps=2)
    strict = _run("matches_baseline", small, exact, examples=40)
    assert strict.status == "failed" and "logprobs row" in strict.failure.message, strict.message
    lenient = _run("matches_baseline", small, certified, reference=ReferenceSampler(), examples=40)
    assert lenient.status == "passed", lenient.message
    assert lenient.stats.get("certified_differences", 0) > 0  # differences were seen and certified
    # Beyond the tolerance (1e-4 * L) certified mode fails too, and without the reference it cannot certify.
    large = _run("matches_baseline", Nudged(shift=1e-2), certified, reference=ReferenceSampler(), examples=40)
    assert large.status == "failed" and "beyond the certification tolerance" in large.failure.message
    blind = _run("matches_baseline", small, certified, examples=40)
    assert blind.status == "failed" and "no reference sampler was given" in blind.failure.message


def test_skipped_without_a_baseline_and_speed_not_measured_without_cuda():
    ref = ReferenceSampler()
    for name in ("matches_baseline", "baseline_speed"):
        out = _run(name, ref, None)
        assert out.status == "skipped" and "no baseline was given" in out.reason
    if current_device() != "cuda":
        out = _run("baseline_speed", ref, baselines.open_baseline("reference", sampler_spec="reference"))
        assert out.status == "skipped" and out.reason.startswith("not measured")


SLOW = '''
import time

from rs_verify.reference import ReferenceSampler


class Sampler(ReferenceSampler):
    name = "slow"

    def __call__(self, batch, *, max_chunk_logits=None):
        time.sleep(0.05)
        return super().__call__(batch, max_chunk_logits=max_chunk_logits)
'''


def test_speed_check_fails_a_slower_change(tmp_path, monkeypatch):
    """The timing harness and the property's verdict, on CPU wall times (the device measure needs
    CUDA): a change that adds 50 ms per call to a ~1 ms call fails; the table names both versions."""
    (tmp_path / "slow_toy.py").write_text(SLOW)
    monkeypatch.syspath_prepend(str(tmp_path))  # the timing processes inherit the path
    monkeypatch.setattr(props, "DEFAULT_BENCH_SHAPE", (3, 2, 33))
    monkeypatch.setattr(props, "BENCH_SHAPES", {})
    monkeypatch.setattr(timing, "DEFAULT_REPEATS", 3)
    table_path = tmp_path / "timing.md"
    base = dataclasses.replace(baselines.open_baseline("reference", sampler_spec="reference"),
                               timing_path=str(table_path))
    ctx = runner.make_context(load_sampler("slow_toy:Sampler"), profile="ci", device="cpu")
    ctx.baseline = base
    with pytest.raises(AssertionError, match="the change is .*x the baseline's wall time") as err:
        PROPERTIES["baseline_speed"].check(ctx, None)  # called directly: the runner skips it without CUDA
    text = table_path.read_text()
    assert text == ctx.stats["timing_table"] and text in str(err.value)
    assert "| model drafts, 8 chunks | wall |" in text and "SLOWER" in text and "| device |" not in text
    assert "changed: slow [slow_toy:Sampler]" in text and "baseline: reference [reference]" in text
    rows, notes = timing.time_versions(("reference", []), ("reference", []),
                                props.benchmark_batches("ci", chunked=False, shape=(3, 2, 33)), device="cpu",
                                repeats=3, warmup=1)
    assert [r.measure for r in rows] == ["wall"] * 4 and all(r.runs == 3 and r.baseline > 0 for r in rows)
    assert notes == []


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--device", "cpu",
                           "--profile", "ci", "--no-bundles", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


@pytest.mark.parametrize("spec, reason", [
    ("git:no-such-rev", "unknown revision 'no-such-rev'"),
    ("git:HEAD:no_such_module:Sampler", "cannot import module 'no_such_module'"),
    ("no_such_module:Sampler", "cannot import module 'no_such_module'"),
])
def test_cli_unusable_baseline_is_a_usage_error(spec, reason):
    out = _cli("--sampler", "reference", "--baseline", spec, "--only", "matches_baseline")
    assert out.returncode == 2, out.stdout + out.stderr
    assert reason in " ".join(out.stdout.split()), out.stdout


@pytest.mark.long  # long run: the plugin twin test_plugin_exact_passes_and_certified_needs_the_campaigns runs by default
def test_cli_certified_mode_requires_the_distribution_campaigns():
    campaigns = [n for n, p in PROPERTIES.items() if p.family == "distribution"]
    alone = _cli("--sampler", "reference", "--baseline", "reference", "--baseline-mode", "certified",
                 "--only", "matches_baseline")
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert "1 passed, 0 failed, 0 skipped" in alone.stdout
    assert "not passed: " + ", ".join(f"{n} (not run)" for n in campaigns) in " ".join(alone.stdout.split())
    full = _cli("--sampler", "reference", "--baseline", "reference", "--baseline-mode", "certified",
                "--only", "matches_baseline", *campaigns)
    assert full.returncode == 0, full.stdout + full.stderr
    assert "not passed" not in full.stdout


@pytest.fixture
def gate(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return pytester


@pytest.mark.parametrize("extra, reason", [
    (["--rs-baseline=git:no-such-rev"], "unknown revision 'no-such-rev'"),
    (["--rs-baseline=git:HEAD:no_such_module:Sampler"], "cannot import module 'no_such_module'"),
    (["--rs-baseline=reference", "--rs-baseline-mode=certified", "--rs-reference=none"], "reference is disabled"),
])
def test_plugin_unusable_baseline_exits_2(gate, extra, reason):
    gate.chdir()
    _git(gate.path, "init", "-q")
    _git(gate.path, "commit", "-q", "--allow-empty", "-m", "empty")
    result = gate.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=reference", "--rs-gate-only",
                                       "-p", "no:cacheprovider", *extra)
    assert result.ret == 2, result.stdout.str() + result.stderr.str()
    assert reason in result.stderr.str() + result.stdout.str()


def test_plugin_exact_passes_and_certified_needs_the_campaigns(gate):
    common = ("-p", "rs_verify", "--rs-sampler=reference", "--rs-baseline=reference", "--rs-gate-only",
              "--rs-profile=ci", "-p", "no:cacheprovider", "-k", "baseline", "-rs")
    exact = gate.runpytest_subprocess(*common)
    exact.assert_outcomes(passed=1, skipped=1)
    exact.stdout.fnmatch_lines(["*rs-verify baseline: reference (mode exact*", "*baseline_speed: not measured*"])
    certified = gate.runpytest_subprocess(*common, "--rs-baseline-mode=certified")
    certified.assert_outcomes(passed=1, skipped=1)
    assert certified.ret == 1
    certified.stdout.fnmatch_lines(["*rs-verify regression gate*", "*not passed: *distribution_model_drafts (not run)*"])


def test_cli_baseline_options_default_to_the_engine_and_refuse_a_speedup_ratio():
    from rs_verify.frontends import cli

    args = cli.build_parser().parse_args(["check"])
    assert (args.baseline, args.baseline_mode, args.max_slowdown, args.timing_table) == \
        (None, baselines.DEFAULT_MODE, baselines.DEFAULT_MAX_SLOWDOWN, baselines.DEFAULT_TIMING_TABLE)
    with pytest.raises(baselines.BaselineError, match="ratio >= 1"):
        baselines.check_options("exact", 0.9)


def test_a_failure_bundle_replays_against_its_pinned_baseline(toy_repo, tmp_path):
    from rs_verify.engine import bundle, replay

    _, spec = toy_repo
    base = baselines.open_baseline("git:HEAD", sampler_spec=spec, device="cpu")
    ctx = runner.make_context(load_sampler(spec), profile="ci", device="cpu")
    ctx.baseline = base
    try:
        outcome = runner.run(PROPERTIES["matches_baseline"], ctx, _settings(30), bundle_dir=tmp_path / "bundles",
                             sampler_spec=spec, options={"baseline": base.spec.pinned(), "baseline_mode": "exact"})
    finally:
        base.close()
    assert outcome.status == "failed" and outcome.bundles
    recorded = bundle.load(outcome.bundles[0]).options["baseline"]
    assert recorded == f"git:{base.spec.commit}:{spec}"  # pinned: HEAD may move before the replay
    with pytest.raises(AssertionError, match="request 1 "):
        replay.replay_bundle(outcome.bundles[0])


def test_ratio_of_medians():
    assert timing.Timed("b", "wall", 2.1, 2.0, 3).ratio == pytest.approx(1.05)
    assert timing.Timed("b", "device", 0.0, 0.0, 3).ratio == 1.0  # no kernels in either version
    assert timing.Timed("b", "device", 1e-3, 0.0, 3).ratio == float("inf")
    rows = [timing.Timed("a", "wall", 1.0, 1.0, 3), timing.Timed("b", "device", 1.06, 1.0, 3)]
    assert [r.batch for r in timing.too_slow(rows, 1.05)] == ["b"]
