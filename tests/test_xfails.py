"""Expected failures (`--rs-xfails FILE`, `--xfails FILE`; rs_verify/frontends/xfails.py): the file
format, the verdicts, and both front ends on a sampler with a known defect."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rs_verify.engine.profiles import SHRINK_ENV
from rs_verify.engine.records import XPASS, Failure, Outcome
from rs_verify.frontends import options
from rs_verify.frontends.xfails import Expected, XfailsError, judge, parse
from rs_verify.properties import PROPERTIES

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
DEFECT = "examples.broken_sampler:chunk_local_cu"  # fails output_invariants (and blackbox_chunking) on its cu list
XFAILS = """
# known defects of the sampler under test
output_invariants  cu list of the last chunk (issue 7)  match: cu_num_generated_tokens = \\[0, \\d+\\]
rs-verify::rejects_bad_input  believed broken, but it is not
blackbox_chunking  fails, but not like this  match: sampled\\[
"""


def test_the_file_format():
    got = parse(XFAILS, PROPERTIES, source="x.txt")
    assert list(got) == ["output_invariants", "rejects_bad_input", "blackbox_chunking"]
    assert got["output_invariants"] == Expected("output_invariants", "cu list of the last chunk (issue 7)",
                                                r"cu_num_generated_tokens = \[0, \d+\]", "x.txt:3")
    assert got["rejects_bad_input"].pattern is None
    assert got["rejects_bad_input"].reason == "believed broken, but it is not"
    assert parse("planner why  match: a match: b", PROPERTIES)["planner"].pattern == "a match: b"


@pytest.mark.parametrize("text, says", [
    ("no_such_property  why", "x:1: unknown property 'no_such_property'"),
    ("planner", "x:1: planner: say why"),
    ("planner  match: x", "x:1: planner: say why"),
    ("planner why match:", "x:1: 'match:' without a pattern"),
    ("planner why match: (", "x:1: invalid pattern '('"),
    ("planner a\n\n# c\nplanner b", "x:4: planner is listed twice (first at x:1)"),
])
def test_malformed_files_are_refused(text, says):
    with pytest.raises(XfailsError, match=".*".join(map(__import__("re").escape, says.split("'")))):
        parse(text, PROPERTIES, source="x")


def test_the_verdicts():
    expected = Expected("p", "known", r"token 0", "x:1")
    failure = Failure("p", "s", "property", "PropertyFailure: request 0 emitted token 0 with p = 0")
    assert judge(Outcome("p", "failed", failure=failure), expected).status == "xfail"
    other = Failure("p", "s", "property", "PropertyFailure: outputs differ")
    differs = judge(Outcome("p", "failed", failure=other), expected)
    assert differs.status == "failed" and "does not match" in differs.failure.notes[0]
    xpass = judge(Outcome("p", "passed"), expected)
    assert xpass.status == "failed" and xpass.failure.kind == XPASS
    assert xpass.failure.message.startswith("[XPASS(strict)] p passed")
    assert judge(Outcome("p", "skipped", reason="r"), expected).status == "skipped"
    assert judge(Outcome("p", "passed"), None).status == "passed"
    assert options.SHARED["xfails"]["default"] is None  # one definition for --xfails and --rs-xfails


@pytest.fixture
def gate(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv(SHRINK_ENV, "1")  # the verdicts are checked here, not the shrunk batches
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return pytester


def test_plugin_reports_xfailed_xpass_strict_and_a_different_failure(gate):
    """A known defect that fails as listed is xfailed; a listed property that passes fails as
    XPASS(strict); one that fails with another message fails as usual, saying which line expected what."""
    xfails = gate.makefile(".txt", xfails=XFAILS)
    result = gate.runpytest_subprocess(
        "-p", "rs_verify", f"--rs-sampler={DEFECT}", "--rs-profile", "ci", "--rs-device", "cpu", "--rs-isolate", "off",
        f"--rs-xfails={xfails}", "-k", "output_invariants or rejects_bad_input or blackbox_chunking", "-rxf",
        "-p", "no:cacheprovider")
    result.assert_outcomes(xfailed=1, failed=2)
    result.stdout.fnmatch_lines(["*XFAIL rs-verify::output_invariants*cu list of the last chunk (issue 7)*"])
    result.stdout.fnmatch_lines(["*[[]XPASS(strict)[]] rejects_bad_input passed but is listed as an expected failure*"])
    result.stdout.fnmatch_lines(["*listed as an expected failure at *xfails.txt:? (fails, but not like this*does not match*"])


def test_plugin_usage_error_exits_2(gate):
    """A malformed line (here: no reason) stops the session before any test (the CLI below: an unknown name)."""
    xfails = gate.makefile(".txt", xfails="planner")
    result = gate.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler={DEFECT}", f"--rs-xfails={xfails}",
                                       "--rs-device", "cpu", "-p", "no:cacheprovider")
    assert result.ret == 2 and "xfails.txt:1" in result.stdout.str() + result.stderr.str()


def _cli(*args, cwd):
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(ROOT))
    env[SHRINK_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600, env=env)


def test_cli_xfail_status_exits_0_and_usage_errors_exit_2(tmp_path):
    (tmp_path / "xfails.txt").write_text("output_invariants  known  match: cu_num_generated_tokens\n")
    out = _cli("--sampler", DEFECT, "--only", "output_invariants", "planner", "--profile", "ci", "--device", "cpu",
               "--isolate", "off", "--jobs", "1", "--xfails", "xfails.txt", "--no-bundles", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 0 failed, 0 skipped, 1 xfailed" in out.stdout, out.stdout
    assert any(line.split()[1:3] == ["output_invariants", "│"] and "xfail" in line
               for line in out.stdout.splitlines() if line.startswith("│")), out.stdout
    (tmp_path / "bad.txt").write_text("output_invariant  typo\n")
    bad = _cli("--xfails", "bad.txt", "--device", "cpu", cwd=tmp_path)
    assert bad.returncode == 2 and "bad.txt:1: unknown property 'output_invariant'" in bad.stderr, bad.stderr
