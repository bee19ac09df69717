"""A release as the regression gate's baseline (`release:NAME==VERSION`): the release found in the
release cache, the same adapter loaded from it in a child process that imports the release's copy of
the library (never the copy under test), and `matches_baseline` on a declared convention change (both
sides certified: passes, counted) and on a regression (one side not certified: fails, named).

The "library" is a tiny package, `fakelib`, in two copies: a development checkout on this process's
path (the sampler under test) and a release installed in a temporary cache with its `installed.json`
marker (what `rs_verify.engine.releases.install` leaves). The adapter, `fake_adapter:Sampler`, sits
outside both and declares what the library it imports says it declares.
"""

import json
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from rs_verify.engine import baseline as baselines
from rs_verify.engine import release_baseline, releases, runner
from rs_verify.engine.context import current_device
from rs_verify.frontends import releases as release_gate
from rs_verify.harness.record import record_of
from rs_verify.properties import PROPERTIES, conventions
from rs_verify.properties.baseline import gate_summary
from rs_verify.reference import ReferenceSampler

pytest_plugins = ["pytester"]

ADAPTER = '''
import fakelib
from rs_verify.reference import ReferenceSampler

pytest_plugins = ["pytester"]


class Sampler:
    """The adapter: the reference drawing what the library draws, declaring what the library declares."""

    def __init__(self):
        self._inner = ReferenceSampler(streams="murmur3", block_seed=fakelib.DRAWS)
        self.block_seed = fakelib.DECLARES
        self.name = f"fakelib {fakelib.__version__} ({fakelib.WHERE})"

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, batch, *, max_chunk_logits=None):
        return fakelib.postprocess(self._inner(batch, max_chunk_logits=max_chunk_logits), batch)
'''

LIBRARY = '''
import dataclasses

__version__ = {version!r}
WHERE = {where!r}
DRAWS = {draws!r}  # the block seed the library's kernel keys its block uniforms with
DECLARES = {declares!r}  # the block seed its adapter declares


def postprocess(out, batch):
    if not {moves_token!r} or batch.num_reqs < 2:
        return out
    sampled = out.sampled.copy()  # a planted bug: request 1's last token moves to the next id
    last = int(out.num_sampled[1]) - 1
    sampled[1, last] = (sampled[1, last] + 1) % batch.effective_vocab_size
    return dataclasses.replace(out, sampled=sampled)
'''


def _library(root: Path, *, where: str, version: str = "1.0", draws="plain", declares=None, moves_token=False):
    pkg = root / "fakelib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(LIBRARY.format(version=version, where=where, draws=draws,
                                                    declares=declares or draws, moves_token=moves_token))
    return root


def _release(cache: Path, **kw) -> Path:
    """fakelib==1.0 as `releases.install` leaves it: the site directory, its dist-info and the marker."""
    home = cache / "fakelib-1.0"
    site = _library(home / "site", where="release", **kw)
    info = site / "fakelib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakelib\nVersion: 1.0\n")
    (info / "RECORD").write_text("fakelib/__init__.py,,\nfakelib-1.0.dist-info/METADATA,,\n")
    (home / releases.MARKER).write_text(json.dumps({"spec": "fakelib==1.0", "pure_python": []}))
    return site


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """Builds the two copies; returns a function taking the release's and the checkout's options."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "fake_adapter.py").write_text(ADAPTER)
    monkeypatch.setenv(releases.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(adapter))

    def make(release: dict, checkout: dict):
        _release(tmp_path / "cache", **release)
        monkeypatch.syspath_prepend(str(_library(tmp_path / "checkout", where="checkout", version="1.1.dev0",
                                                 **checkout)))
        for name in [n for n in sys.modules if n in ("fakelib", "fake_adapter")]:
            monkeypatch.delitem(sys.modules, name)
        from rs_verify.harness.samplers import load_sampler

        return load_sampler("fake_adapter:Sampler")

    return make


def _gate(sampler, examples=12, bundle_dir=None):
    base = baselines.open_baseline("release:fakelib==1.0", sampler_spec="fake_adapter:Sampler", device="cpu")
    try:
        ctx = runner.make_context(sampler, ReferenceSampler(), profile="ci", device=current_device())
        ctx.baseline = base
        out = runner.run(PROPERTIES["matches_baseline"], ctx, settings(max_examples=examples, derandomize=True,
                                                                        database=None, deadline=None),
                         bundle_dir=bundle_dir, sampler_spec="fake_adapter:Sampler",
                         options={"baseline": base.spec.pinned(), "baseline_mode": "exact"})
        return out, record_of(base.sampler), base.spec
    finally:
        base.close()


def test_the_child_imports_the_release_not_the_checkout_under_test_and_same_behaviour_passes(fakes):
    sampler = fakes(dict(draws="plain"), dict(draws="plain"))
    assert record_of(sampler).name == "fakelib 1.1.dev0 (checkout)"
    out, base, spec = _gate(sampler)
    assert base.name == "fakelib 1.0 (release)"  # the checkout on this process's path was left out
    assert spec.describe() == "fake_adapter:Sampler at release:fakelib==1.0"
    assert spec.pinned() == "release:fakelib==1.0:fake_adapter:Sampler"
    assert out.status == "passed", out.failure and out.failure.message
    assert conventions.summary(out.stats) == ""  # nothing declared differently: bit for bit


def test_a_declared_block_seed_change_passes_with_the_moved_decisions_counted(fakes):
    sampler = fakes(dict(draws="plain"), dict(draws="step"))
    out, base, _ = _gate(sampler)
    assert (base.block_seed, record_of(sampler).block_seed) == ("plain", "step")
    assert out.status == "passed", out.failure and out.failure.message
    moved, compared = out.stats[conventions.STATS]["kinds"]["block"]
    assert 0 < moved < compared  # the step changes some block uniforms' decisions, not all
    line = conventions.summary(out.stats)
    assert line.startswith(f"block seed plain -> step: {moved} of {compared} block decisions")
    assert line.endswith("each certified under its own conventions")
    assert gate_summary("exact", {"matches_baseline": "passed"}, None, line)[0][0].endswith(line)


def test_a_wrong_token_beside_the_convention_change_fails_naming_the_changed_side(fakes):
    sampler = fakes(dict(draws="plain"), dict(draws="step", moves_token=True))
    out, _, _ = _gate(sampler)
    assert out.status == "failed"
    text = out.failure.message
    assert "a regression, not only the convention change (block seed plain -> step)" in text
    assert "the changed sampler (fakelib 1.1.dev0 (checkout)) is not certified under its own conventions" in text
    assert "block seed step" in text and "request 1" in text
    assert "the baseline sampler" not in text


def test_a_wrong_token_of_the_release_fails_naming_the_baseline_side(fakes, tmp_path):
    # The fix is in the checkout: the release's bug shows as the baseline side not certified.
    sampler = fakes(dict(draws="plain", moves_token=True), dict(draws="step"))
    out, _, _ = _gate(sampler, bundle_dir=tmp_path / "bundles")
    assert out.status == "failed"
    text = out.failure.message
    assert "the baseline sampler (fakelib 1.0 (release)) is not certified under its own conventions" in text
    assert "block seed plain" in text and "request 1" in text
    assert "the changed sampler (" not in text
    from rs_verify.engine import bundle, replay

    assert bundle.load(out.bundles[0]).options["baseline"] == "release:fakelib==1.0:fake_adapter:Sampler"
    with pytest.raises(AssertionError, match="the baseline sampler .* is not certified"):
        replay.replay_bundle(out.bundles[0])  # the release again, from the cache


def test_a_release_missing_from_the_cache_offline_or_a_malformed_spec_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv(releases.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(baselines.BaselineError, match="release:fakelib=1.0.*name==version"):
        baselines.parse("release:fakelib=1.0", sampler_spec="x:Y")
    found = release_baseline.installed("fakelib==9.9", offline=True)
    assert found.site is None and "not in the cache" in found.error


def test_the_releases_command_passes_the_baseline_to_each_gate_process(tmp_path):
    cmd = release_gate.gate_command("a.b:C", tmp_path / "j.xml", tmp_path / "b", "ci", "matches_baseline", None,
                                    baseline=("--rs-baseline=release:vllm==0.32.0",))
    assert "--rs-baseline=release:vllm==0.32.0" in cmd and cmd[cmd.index("-k") + 1] == "matches_baseline"
    site = _release(tmp_path / "cache")
    args, why = release_baseline.gate_options("fakelib==1.0", catalogue_path=None, cache=tmp_path / "cache",
                                              find_links=None, no_index=True, offline=True)
    assert why is None and args == ["--rs-baseline=release:fakelib==1.0"]
    assert release_baseline.top_level(site, "fakelib") == ["fakelib"]
    _, why = release_baseline.gate_options("fakelib==2.0", catalogue_path=None, cache=tmp_path / "cache",
                                           find_links=None, no_index=True, offline=True)
    assert why.startswith("baseline fakelib==2.0: not in the cache")


@pytest.fixture
def front_end_env(tmp_path, monkeypatch):
    """The fakes for a front end's own process: the adapter and the checkout (block seed "step") on
    PYTHONPATH, the release (block seed "plain") in the cache the environment names."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "fake_adapter.py").write_text(ADAPTER)
    checkout = _library(tmp_path / "checkout", where="checkout", version="1.1.dev0", draws="step")
    _release(tmp_path / "cache")
    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", f"{adapter}:{checkout}:{root}")
    monkeypatch.setenv(releases.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return tmp_path


CHANGE_LINE = "declared conventions changed against the baseline: block seed plain -> step: * block decisions differ*"


def test_the_plugin_and_the_cli_report_the_convention_change(front_end_env, pytester):
    import subprocess

    pytester.chdir()
    result = pytester.runpytest_subprocess("-p", "rs_verify", "--rs-sampler=fake_adapter:Sampler", "--rs-gate-only",
                                           "--rs-baseline=release:fakelib==1.0", "--rs-profile=ci", "--rs-isolate=off",
                                           "-p", "no:cacheprovider", "-k", "matches_baseline", "--rs-max-examples=8")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*rs-verify baseline: release:fakelib==1.0*", "*rs-verify regression gate*",
                                 CHANGE_LINE])
    cli = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--sampler", "fake_adapter:Sampler",
                          "--baseline", "release:fakelib==1.0", "--only", "matches_baseline", "--profile", "ci",
                          "--max-examples", "8", "--device", "cpu", "--no-bundles"],
                         capture_output=True, text=True, cwd=front_end_env, timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    text = " ".join(cli.stdout.split())  # rich wraps long lines
    assert "block seed plain -> step: " in text and "each certified under its own conventions" in text


EDITABLE_HOOK = '''
import importlib.util, sys
from pathlib import Path


class EditableFinder:  # an editable install's hook, ahead of the path finder (as meson-python's)
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "fakelib":
            return importlib.util.spec_from_file_location(
                name, Path({checkout!r}) / "fakelib" / "__init__.py",
                submodule_search_locations=[str(Path({checkout!r}) / "fakelib")])
        return None


sys.meta_path.insert(0, EditableFinder)
import fakelib
assert fakelib.WHERE == "checkout"  # the hook serves the copy under test here
from rs_verify.engine.release_baseline import load_from_release
sampler = load_from_release({site!r}, "fake_adapter:Sampler", ["fakelib"], {{}})
print(sampler.name)
'''


def test_an_editable_install_hook_does_not_hand_the_checkout_to_the_baseline(tmp_path):
    import subprocess

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "fake_adapter.py").write_text(ADAPTER)
    checkout = _library(tmp_path / "checkout", where="checkout", version="1.1.dev0")
    site = _release(tmp_path / "cache")
    root = Path(__file__).resolve().parents[1]
    script = EDITABLE_HOOK.format(checkout=str(checkout), site=str(site))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": f"{adapter}:{root}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "fakelib 1.0 (release)"
