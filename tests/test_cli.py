"""The `rs-verify` command line: list, check with a report, replay errors, bench; and the report plots."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rs_verify import SpecBatch
from rs_verify.properties import PROPERTIES, PropertyFailure
from rs_verify.properties.distribution import Fit
from rs_verify.engine.records import Failure, Outcome

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def cli(*args, cwd=ROOT, timeout=600):
    env = dict(os.environ, COLUMNS="200")  # rich tables wide enough that names are not cut
    return subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def test_list_shows_every_property():
    out = cli("list")
    assert out.returncode == 0, out.stderr
    for name in PROPERTIES:
        assert name in out.stdout
    assert "rs_verify.reference:ReferenceSampler" in out.stdout


def test_check_writes_table_report_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    out = cli("check", "--sampler", "reference", "--only", "planner", "closed_forms", "--profile", "dev",
              "--device", "cpu", "--report", str(report))
    assert out.returncode == 0, out.stdout + out.stderr
    for col in ("property", "status", "examples", "excused", "failures", "time (s)"):
        assert col in out.stdout
    assert "2 passed, 0 failed, 0 skipped" in out.stdout
    doc = json.loads((report / "report.json").read_text())
    assert [r["property"] for r in doc["results"]] == ["closed_forms", "planner"]  # registry order
    assert doc["summary"] == {"passed": 2, "failed": 0, "skipped": 0, "xfailed": 0}
    assert doc["meta"]["sampler"] == "reference" and doc["meta"]["profile"] == "dev"
    closed = doc["results"][0]
    assert closed["sent"] == {}  # the reference's closed-form campaign is token-wise, without sampling parameters
    assert closed["fits"] and all(0.0 <= f["pvalue"] <= 1.0 for f in closed["fits"])
    md = (report / "report.md").read_text()
    assert "| property | status | examples | excused | failures | time (s) |" in md
    assert "![closed_forms frequencies](closed_forms.png)" in md
    assert (report / "closed_forms.png").read_bytes().startswith(PNG)
    assert not (report / "bundles").exists()  # nothing failed, no bundle


@pytest.mark.long  # long run: the pool itself: test_a_dead_worker_fails_only_its_property_and_is_replaced runs by default
def test_check_on_worker_processes_reports_a_failure_like_one_process(tmp_path):
    """`--jobs 2`: properties run on two worker processes; a failure still prints its record,
    writes its bundle and sets the exit status, and the table keeps the registry order."""
    runs = {}
    for jobs in ("1", "2"):
        bundles = tmp_path / f"bundles-{jobs}"
        out = cli("check", "--sampler", "examples.broken_sampler:BrokenSampler", "--only", "planner", "closed_forms",
                  "--profile", "ci", "--device", "cpu", "--jobs", jobs, "--bundle-dir", str(bundles))
        assert out.returncode == 1, out.stdout + out.stderr
        assert "1 passed, 1 failed, 0 skipped" in out.stdout and "failure bundle:" in out.stdout
        runs[jobs] = sorted(p.name for p in bundles.glob("*.npz"))
        table = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("│")]
        assert table.index("closed_forms") < table.index("planner"), out.stdout
    assert runs["1"] == runs["2"] and len(runs["1"]) == 1  # the same failure, the same bundle name


def test_replay_rejects_a_foreign_file(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_text("hello")
    out = cli("replay", str(junk))
    assert out.returncode == 2 and "not an rs-verify bundle" in out.stderr


def test_bench_list_and_unknown(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "toy_bench.py").write_text('"""A toy benchmark."""\nimport sys\nprint("ran", sys.argv[1:])\n')
    listed = cli("bench", "--list", cwd=tmp_path)
    assert listed.returncode == 0 and "toy_bench" in listed.stdout and "A toy benchmark." in listed.stdout
    ran = cli("bench", "toy_bench", "--fast", cwd=tmp_path)
    assert ran.returncode == 0 and "ran ['--fast']" in ran.stdout
    missing = cli("bench", "no_such_bench", cwd=tmp_path)
    assert missing.returncode == 2 and "no benchmark" in missing.stderr


def _chunk_batch() -> SpecBatch:
    cu = np.array([0, 3, 4, 9, 11], np.int32)
    n = int(cu[-1])
    return SpecBatch(
        target_logits=np.zeros((n, 4), np.float32), draft_logits=None,
        draft_token_ids=np.zeros(n, np.int64), cu_num_logits=cu, pos=np.arange(n, dtype=np.int64),
        idx_mapping=np.arange(4, dtype=np.int32), temperature=np.ones(4, np.float32),
        seeds=np.zeros(4, np.int64), num_speculative_steps=4,
    )


def test_report_plots_every_kind(tmp_path):
    pytest.importorskip("matplotlib")
    from rs_verify.frontends.report import write_report

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    fits = [Fit(f"T=1.0 position {i}", 1000, rng.multinomial(1000, p).astype(float), p, 3.0, 0.5) for i in range(3)]
    lengths = np.array([0.5, 0.3, 0.2])
    fits.append(Fit("T=1.0 acceptance length", 1000, np.array([480.0, 320, 200]), lengths, 1.0, 0.6))
    campaign = Outcome("distribution_model_drafts", "passed", 1.0, 1, stats={"fits": fits})
    batch = _chunk_batch()
    failure = Failure("chunked_equals_full", "toy", "property", "PropertyFailure: chunked output differs",
                      batch=batch, drawn=(batch, 5), bundles=["b.npz"])
    chunked = Outcome("chunked_equals_full", "failed", 0.5, 7, failure=failure)
    paths = write_report([campaign, chunked], tmp_path, meta={"sampler": "toy"})
    names = sorted(p.name for p in paths["plots"])
    assert names == ["chunked_equals_full-chunks.png", "distribution_model_drafts-acceptance.png",
                     "distribution_model_drafts.png"]
    for path in paths["plots"]:
        assert path.read_bytes().startswith(PNG)
    doc = json.loads(paths["json"].read_text())
    failed = doc["results"][1]
    assert failed["failing_cap"] == 5 and failed["bundles"] == ["b.npz"] and failed["failures"] == 1
    md = paths["markdown"].read_text()
    assert "rs-verify replay b.npz" in md and "chunk cap: 5" in md
    # The campaign that ran states what it can detect (scipy-computed power at the profile's trials).
    (power,) = doc["distribution_power"]
    assert power["property"] == "distribution_model_drafts" and 0 < power["min_detectable_tv"] < 1
    assert "What the distribution campaigns can detect" in md


def test_a_worker_outcome_crosses_processes():
    """`check --jobs`: a failure record goes back to the parent without its live exception and,
    when the drawn value cannot be pickled, without it (the bundle keeps it), never breaking the pool."""
    import pickle

    from rs_verify.engine.pool import portable

    failure = Failure(property="p", sampler="s", kind="error", message="ValueError: x",
                      drawn=(lambda: None), exception=ValueError("x"))
    out = portable(Outcome("p", "failed", failure=failure))
    assert out.failure.exception is None and out.failure.drawn is None and "worker process" in out.failure.notes[-1]
    assert pickle.loads(pickle.dumps(out)).failure.message == "ValueError: x"
