"""The regression gate in the front ends: a changed sampler against its base version.

The pytest plugin (`rs_verify.frontends.plugin`) adds the options here to its group and, when
the gate runs with `--rs-baseline`, registers a `RegressionGate` that opens the baseline
(`rs_verify.engine.baseline`) once per process, hands it to the `baseline` properties through
`attach()`, prints the timing table and enforces certified mode's extra requirement (the CLI,
`rs-verify check --baseline`, does the same with `rs_verify.properties.baseline.gate_summary`).

- Usage errors: an unknown revision or a baseline that cannot be loaded ends the session with
  exit status 2 and the reason, before any test runs (`pytest.exit`, like an unusable device).
  Under pytest-xdist the controller loads the baseline once to check it, then each worker
  loads its own when its first baseline property runs.
- Certified mode (`--rs-baseline-mode certified`) accepts differences within the certification
  tolerance, so it also requires every distribution campaign to *pass*: a campaign that failed,
  was skipped (e.g. an interpreted sampler) or was deselected fails the session, named in a
  "certified baseline mode" section. Run certified gates where the campaigns run (CUDA).

Loading this module imports nothing heavy (the plugin's rule): the engine is imported lazily.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from . import options

PREFIX = "rs-verify::"
CONVENTIONS_PROPERTY = "rs_verify_baseline_conventions"  # user_properties key: a passing convention change


def add_options(group) -> None:
    """The regression gate's options, in the plugin's `rs-verify` group."""
    options.add(group.addoption, options.BASELINE, prefix="rs-")


class RegressionGate:
    """One session's baseline: opened lazily once per process, closed at the end."""

    def __init__(self, config, gate):
        opt = config.getoption
        self.config, self.gate = config, gate
        self.text = opt("--rs-baseline")
        self.mode = opt("--rs-baseline-mode")
        self.max_slowdown = opt("--rs-max-slowdown")
        self.timing_path = opt("--rs-timing-table")
        self.catalogue = opt("--rs-baseline-catalogue")
        self.baseline = None
        self.error = None
        self.outcomes: dict[str, str] = {}
        self.changes = ""  # a passing matches_baseline's convention change, as its summary line
        self.missing = False
        self.started = time.time()

    def open(self):
        if self.baseline is None and self.error is None:
            from ..engine import baseline as baselines  # lazy: see the module docstring

            try:
                if self.mode == "certified":
                    baselines.require_reference(self.mode, self.gate.reference_spec)
                self.baseline = baselines.open_baseline(
                    self.text, sampler_spec=self.gate.sampler_spec, mode=self.mode, max_slowdown=self.max_slowdown,
                    device=self.gate.device, timing_path=self.timing_path,
                    catalogue=self.catalogue)
            except baselines.BaselineError as exc:
                self.error = f"rs-verify: {exc}"
        if self.error:
            raise pytest.UsageError(self.error)
        return self.baseline

    def close(self) -> None:
        if self.baseline is not None:
            self.baseline.close()
            self.baseline = None

    def pytest_report_header(self, config):
        return (f"rs-verify baseline: {self.text} (mode {self.mode}, max slowdown {self.max_slowdown:g}, "
                f"timing table {self.timing_path})")

    def pytest_sessionstart(self, session):
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller checked the baseline
            return
        try:
            self.open()
        except pytest.UsageError as exc:
            pytest.exit(str(exc), returncode=2)
        if self.config.pluginmanager.hasplugin("dsession"):  # xdist controller: workers load their own
            self.close()

    def pytest_runtest_logreport(self, report):
        if report.nodeid.startswith(PREFIX) and (report.when == "call" or report.outcome != "passed"):
            self.outcomes[report.nodeid[len(PREFIX):]] = report.outcome
            self.changes = dict(getattr(report, "user_properties", [])).get(CONVENTIONS_PROPERTY, self.changes)

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput"):
            return
        from ..properties.baseline import gate_summary  # lazy: see the module docstring

        _, self.missing = gate_summary(self.mode, self.outcomes, None)
        if self.missing and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        path = Path(self.timing_path)
        fresh = path.is_file() and path.stat().st_mtime >= self.started
        from ..properties.baseline import gate_summary  # lazy: see the module docstring

        lines, _ = gate_summary(self.mode, self.outcomes, path.read_text() if fresh else None, self.changes)
        if lines:
            terminalreporter.section("rs-verify regression gate")
            for line in lines:
                terminalreporter.write_line(line)

    def pytest_unconfigure(self, config):
        self.close()


KEY = pytest.StashKey[RegressionGate]()


def configure(config, gate) -> None:
    """Register the session's `RegressionGate` when the gate runs with a baseline."""
    if gate.enabled and config.getoption("--rs-baseline"):
        config.stash[KEY] = rg = RegressionGate(config, gate)
        config.pluginmanager.register(rg, "rs-verify-baseline")


def attach(config, ctx, prop) -> None:
    """Give a `baseline` property its baseline and the reference (certified mode certifies differences
    against it, and either mode a convention change between the two versions)."""
    rg = config.stash.get(KEY, None)
    if rg is None or "baseline" not in prop.needs:
        return
    try:
        ctx.baseline = rg.open()
    except pytest.UsageError as exc:
        pytest.fail(str(exc), pytrace=False)
    if ctx.reference is None:  # certified mode, and a declared convention change, certify against it
        ctx.reference = rg.gate.reference()


def bundle_options(config) -> dict:
    """Recorded in failure bundles, so that a baseline property's bundle names its baseline."""
    rg = config.stash.get(KEY, None)
    if rg is None or rg.baseline is None:
        return {}
    extra = {"baseline_catalogue": rg.catalogue} if rg.catalogue else {}  # a release: baseline's pins
    return {"baseline": rg.baseline.spec.pinned(), "baseline_mode": rg.mode, **extra}


def conventions_line(stats: dict) -> str:
    """A run's convention change against its baseline, as the summary prints it ("" without one)."""
    if not stats.get("baseline_change"):
        return ""
    from ..properties.conventions import summary  # lazy: see the module docstring

    return summary(stats)
