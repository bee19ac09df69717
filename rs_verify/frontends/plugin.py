"""The rs-verify pytest plugin: gate any rejection sampler with the property library.

Installed as a `pytest11` entry point (`rs_verify = "rs_verify.frontends.plugin"`), or loaded with
`pytest -p rs_verify.frontends.plugin`. Loading it imports neither torch nor triton: the sampler,
the properties and the device checks are imported when a test needs them.

With `--rs-sampler=module:attribute` (or `--rs-gate` for the built-in Triton sampler) the
plugin adds one test item per registered property, `rs-verify::<property>`, in registry
order (deterministic, so pytest-xdist can distribute them, also across hosts). Each item
runs `rs_verify.engine.runner` for that property and skips, with the runner's reason, properties
the sampler cannot take (internal chunking, a stream family the reference draws, ...). The sampler runs in a child
process per property (`--rs-isolate`, `rs_verify.engine.isolation`): a crash or a hang fails
that item, with the batch, and the session goes on. A failing item writes a failure bundle
(`--rs-bundle-dir`) and prints `rs-verify replay <bundle>`; the terminal summary lists the
bundles, the skipped properties with their reasons, the suite's self-checks (which never call
the sampler) and the passes that rest on the sampler's self-reported figures. Properties listed
in `--rs-xfails FILE` are xfailed while they fail as described (`rs_verify.frontends.xfails`). Without
`--rs-sampler` / `--rs-gate` the plugin adds nothing and only registers its markers
(`gpu`, `slow`, `interpreter`, `rs_verify`) and options.
"""

from __future__ import annotations

import inspect
import os

import pytest

from ..harness import device as devices
from ..engine.defaults import DEFAULT_BUNDLE_DIR, PROFILE_NAMES
from . import baseline_gate, options, xfails

# Loading the plugin must stay light (pytest loads it in every session of an environment where
# rs-verify is installed): the engine and the properties (numpy, scipy, hypothesis) are imported
# in the hooks that need them, and torch / triton only when a sampler is loaded.
DEFAULT_SAMPLER = "triton"
DEFAULT_REFERENCE = "reference"
BUNDLE_PROPERTY = "rs_verify_bundle"  # user_properties key of a report's bundle path
SELF_CHECK_PROPERTY = "rs_verify_self_check"  # user_properties key: the item checks the suite, not the sampler
SELF_REPORTED_PROPERTY = "rs_verify_self_reported"  # user_properties key: what the item took on trust
SENT_PROPERTY = "rs_verify_sent"  # user_properties key: answered calls per feature of SPEC 2 / 4b

MARKERS = {
    "gpu": "needs a CUDA device; skipped cleanly without one",
    "slow": "a long campaign (deselect with -m 'not slow')",
    "interpreter": "runs on CPU through the Triton interpreter (the CPU subset of the kernel tests)",
    "rs_verify": "a property of the rs-verify library run against --rs-sampler (select with -m rs_verify)",
}


def pytest_addoption(parser):
    group = parser.getgroup("rs-verify", "rs-verify: gate a speculative-decoding rejection sampler")
    group.addoption("--rs-sampler", default=None, metavar="MODULE:ATTR",
                    help="run the rs-verify property library against this sampler: a built-in name "
                         "(triton, reference) or module:attribute naming a sampler instance, class or "
                         "factory (SPEC section 10). Without it (or --rs-gate) the plugin adds no tests.")
    group.addoption("--rs-gate", action="store_true", default=False,
                    help=f"run the property library against --rs-sampler (default {DEFAULT_SAMPLER!r})")
    group.addoption("--rs-gate-only", action="store_true", default=False,
                    help="deselect every test that is not an rs-verify property (implies --rs-gate)")
    group.addoption("--rs-reference", default=DEFAULT_REFERENCE, metavar="MODULE:ATTR",
                    help="the oracle for certification (default 'reference'; 'none' disables it and "
                         "skips certification)")
    group.addoption("--rs-device", choices=("cpu", "cuda"), default=None,
                    help="cpu runs Triton through its interpreter (sets TRITON_INTERPRET=1 before triton "
                         "is imported); cuda requires a GPU. Default: cuda when available, else cpu.")
    group.addoption("--rs-profile", choices=PROFILE_NAMES, default=None,
                    help="load this rs-verify Hypothesis profile (rs_verify.engine.profiles) for the whole session; "
                         "default: the active one if it is an rs-verify profile, else HYPOTHESIS_PROFILE, "
                         "ci under CI, dev otherwise")
    group.addoption("--rs-max-examples", type=int, default=None, metavar="N",
                    help="override the profile's max_examples (as rs-verify check --max-examples)")
    options.add(group.addoption, options.ISOLATION, prefix="rs-")
    group.addoption("--rs-bundle-dir", default=DEFAULT_BUNDLE_DIR, metavar="DIR",
                    help=f"where failure bundles are written (default {DEFAULT_BUNDLE_DIR})")
    options.add(group.addoption, ("redis", "xfails", "deviations"), prefix="rs-")
    baseline_gate.add_options(group)


def _gate_enabled(config) -> bool:
    opt = config.getoption
    return bool(opt("--rs-sampler") or opt("--rs-gate") or opt("--rs-gate-only"))


def _choose_device(requested: str | None, profile: str | None) -> str:
    """The suite's one backend choice (`rs_verify.harness.device`); exit 2 with the reason when impossible."""
    try:
        chosen = devices.resolve(requested)
    except devices.DeviceError as exc:
        pytest.exit(f"rs-verify: {exc}", returncode=2)
    if profile == "gpu" and chosen != "cuda":
        pytest.exit("rs-verify: the gpu profile needs CUDA, which is not usable here "
                    f"({devices.cuda_status()[1]}); use --rs-profile ci on a CPU machine", returncode=2)
    return chosen


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Before any conftest (which may import triton): an explicit --rs-device, or a gate run.
    ns = early_config.known_args_namespace
    if getattr(ns, "rs_device", None) or getattr(ns, "rs_sampler", None) or getattr(ns, "rs_gate", False) \
            or getattr(ns, "rs_gate_only", False):
        _choose_device(getattr(ns, "rs_device", None), getattr(ns, "rs_profile", None))


class Gate:
    """The options of one session and the samplers they name, loaded lazily once per process."""

    def __init__(self, config):
        opt = config.getoption
        self.enabled = _gate_enabled(config)
        self.only = bool(opt("--rs-gate-only"))
        self.sampler_spec = opt("--rs-sampler") or DEFAULT_SAMPLER
        ref = opt("--rs-reference")
        self.reference_spec = None if ref in (None, "", "none") else ref
        self.device = opt("--rs-device")
        self.profile = opt("--rs-profile")
        self.max_examples = opt("--rs-max-examples")
        self.bundle_dir = opt("--rs-bundle-dir")
        self.isolate = opt("--rs-isolate")
        self.timeout = opt("--rs-timeout")
        self.redis = opt("--rs-redis") or os.environ.get("RS_VERIFY_REDIS_URL") or None
        self.xfails_path = opt("--rs-xfails")
        self.xfails: dict = {}  # property -> xfails.Expected, read in pytest_configure
        # SPEC 11: deviations added to the sampler's own (`NAME,...`)
        self.deviations = [n.strip() for n in (opt("--rs-deviations") or "").split(",") if n.strip()]
        self._loaded: dict = {}

    def _load(self, spec: str, what: str, isolate: str = "off"):
        """Load a sampler once per process; a load error fails every item that needs it, cleanly.

        Isolated, the sampler is loaded once in a child to read its declarations; the runner
        starts a fresh child per property (`rs_verify.engine.isolation`)."""
        if (spec, isolate) not in self._loaded:
            from ..engine import isolation  # lazy: see the note at the top

            try:
                obj = isolation.load(spec, isolate, timeout=self.timeout, device_name=self.device)
                self._loaded[spec, isolate] = (obj, None)
            except (Exception, isolation.SamplerDied) as exc:  # noqa: BLE001 - reported on every item needing it
                self._loaded[spec, isolate] = (None, f"rs-verify: cannot load the {what} {spec!r}: {exc}")
        obj, error = self._loaded[spec, isolate]
        if error:
            pytest.fail(error, pytrace=False)
        return obj

    def sampler(self):
        from ..harness.handle import with_deviations  # lazy: see the note at the top

        obj = self._load(self.sampler_spec, "sampler (--rs-sampler)", self.isolate)
        try:
            return with_deviations(obj, self.deviations)
        except ValueError as exc:
            pytest.fail(f"rs-verify: --rs-deviations: {exc}", pytrace=False)

    def reference(self):
        # The oracle is the suite's own: it runs in the pytest process.
        return None if self.reference_spec is None else self._load(self.reference_spec, "reference (--rs-reference)")

    def profile_name(self) -> str:
        from ..engine import profiles  # lazy: see the note at the top

        if self.profile:
            return self.profile
        active = profiles.active()
        return active if active in PROFILE_NAMES else profiles.default_profile_name()

    def settings(self):
        from hypothesis import settings  # lazy: see the note at the top

        base = settings.get_profile(self.profile_name())
        return base if self.max_examples is None else settings(base, max_examples=self.max_examples)

    def options(self) -> dict:
        """Recorded in failure bundles (the device actually used is added by the runner)."""
        extra = {} if self.max_examples is None else {"max_examples": self.max_examples}
        return {"profile": self.profile_name(), "runner": "pytest", "isolate": self.isolate, "timeout": self.timeout,
                **({"deviations": self.deviations} if self.deviations else {}), **extra}

    def header(self) -> str:
        where = (f"isolated per {self.isolate} (timeout {self.timeout:g} s per call)" if self.isolate != "off"
                 else "in the pytest process (--rs-isolate off)")
        return (f"rs-verify: sampler {self.sampler_spec} {where}, reference {self.reference_spec or 'none'}, "
                f"profile {self.profile or 'auto'}, device {self.device or 'auto'}, bundles {self.bundle_dir}"
                + (", shared Redis database" if self.redis else ""))


GATE_KEY = pytest.StashKey[Gate]()


@pytest.hookimpl(trylast=True)  # after Hypothesis's own plugin has loaded --hypothesis-profile
def pytest_configure(config):
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    gate = Gate(config)
    config.stash[GATE_KEY] = gate
    if gate.enabled or gate.device:
        gate.device = _choose_device(gate.device, gate.profile)
        # after the project's own filters, so a `filterwarnings = error` does not turn the
        # interpreter's NumPy warnings into failures (harness/device.py: quiet_interpreter)
        config.addinivalue_line("filterwarnings", f"ignore::RuntimeWarning:{devices.INTERPRETER_MODULE}")
    baseline_gate.configure(config, gate)
    if gate.xfails_path:
        from ..properties import PROPERTIES  # lazy: see the note at the top

        try:
            gate.xfails = xfails.load(gate.xfails_path, PROPERTIES)
        except xfails.XfailsError as exc:
            pytest.exit(f"rs-verify: {exc}", returncode=2)
    if gate.profile:
        from ..engine import profiles  # lazy: see the note at the top

        profiles.load(gate.profile)
    if gate.redis:
        from ..engine import database  # lazy: see the note at the top

        try:
            database.apply(gate.redis)
        except database.DatabaseError as exc:
            raise pytest.UsageError(f"rs-verify: {exc}") from exc


def pytest_report_header(config):
    gate = config.stash.get(GATE_KEY, None)
    if gate is not None and gate.enabled:
        return gate.header()
    return None


class GateCollector(pytest.Collector):
    """The parent of the property items (they come from the registry, not from a file)."""

    def collect(self):  # pragma: no cover - items are added by pytest_collection_modifyitems
        return []

    def reportinfo(self):
        return self.path, None, "rs-verify"


class GateFailure(Exception):
    """Raised by a property item to fail it with the runner's `Failure` record."""

    def __init__(self, failure):
        super().__init__(failure.message)
        self.failure = failure


class PropertyItem(pytest.Item):
    """One registered property run against the session's sampler."""

    def __init__(self, *, prop_name: str, **kwargs):
        super().__init__(**kwargs)
        self.prop_name = prop_name

    @property
    def gate(self) -> Gate:
        return self.config.stash[GATE_KEY]

    def runtest(self):
        from ..engine import runner  # lazy: see the note at the top
        from ..properties import PROPERTIES  # lazy: see the note at the top

        gate = self.gate
        prop = PROPERTIES[self.prop_name]
        reference = gate.reference() if "reference" in prop.needs else None
        ctx = runner.make_context(gate.sampler(), reference, profile=gate.profile_name(), device=gate.device)
        baseline_gate.attach(self.config, ctx, prop)
        outcome = runner.run(prop, ctx, gate.settings(), bundle_dir=gate.bundle_dir, sampler_spec=gate.sampler_spec,
                             reference_spec=gate.reference_spec,
                             options={**gate.options(), **baseline_gate.bundle_options(self.config)})
        self.user_properties.append(("rs_verify_examples", outcome.examples))
        if outcome.excused:
            self.user_properties.append(("rs_verify_excused", outcome.excused))
        if outcome.stats.get("sent"):
            self.user_properties.append((SENT_PROPERTY, dict(outcome.stats["sent"])))
        if outcome.status == "passed" and baseline_gate.conventions_line(outcome.stats):
            self.user_properties.append((baseline_gate.CONVENTIONS_PROPERTY, baseline_gate.conventions_line(outcome.stats)))
        if outcome.status == "skipped":
            # Reported at the item (rs-verify::<property>), not at this line of the plugin.
            raise pytest.skip.Exception(f"{self.prop_name}: {outcome.reason}", _use_item_location=True)
        outcome = xfails.judge(outcome, gate.xfails.get(self.prop_name), sampler=gate.sampler_spec)
        if outcome.status == "xfail":  # pytest's xfailed outcome; the bundle was written all the same
            pytest.xfail(f"{outcome.reason} (fails as expected: {outcome.failure.headline(200)})")
        if outcome.self_check:
            self.user_properties.append((SELF_CHECK_PROPERTY, True))
        if outcome.stats.get("self_reported"):
            self.user_properties.append((SELF_REPORTED_PROPERTY, outcome.stats["self_reported"]))
        failure = outcome.failure
        if failure is None:
            return
        for path in failure.bundles:
            self.user_properties.append((BUNDLE_PROPERTY, path))
        raise GateFailure(failure)

    def repr_failure(self, excinfo, style=None):
        # A property failure is its message and notes (input, reproducer, bundle); an exception of
        # the sampler keeps its traceback, followed by the same notes.
        if isinstance(excinfo.value, GateFailure):
            failure = excinfo.value.failure
            # A crash or a hang: the message (signal or limit) and the batch; the parent's traceback
            # through the isolation code would say nothing about the sampler.
            if failure.kind in ("property", "crash", "timeout") or failure.exception is None:
                return failure.text()
            tb = super().repr_failure(pytest.ExceptionInfo.from_exception(failure.exception), style=style)
            return f"{tb}\n" + "\n".join(failure.notes)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        # Point at the property's source (skips and failures are reported there).
        from ..properties import PROPERTIES  # lazy: see the note at the top

        check = PROPERTIES[self.prop_name].check
        try:
            path, line = inspect.getsourcefile(check), inspect.getsourcelines(check)[1]
        except (OSError, TypeError):
            path, line = self.path, 0
        return path, line, f"rs-verify::{self.prop_name} [{self.gate.sampler_spec}]"


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so they apply to the property items
def pytest_collection_modifyitems(session, config, items):
    gate = config.stash.get(GATE_KEY, None)
    if gate is None or not gate.enabled:
        return
    from ..properties import PROPERTIES  # lazy: see the note at the top

    parent = GateCollector.from_parent(session, name="rs-verify", nodeid="rs-verify")
    new = []
    for name in PROPERTIES:  # registry order: identical on every xdist worker
        item = PropertyItem.from_parent(parent, name=name, prop_name=name)
        item.add_marker("rs_verify")
        prop = PROPERTIES[name]
        if prop.slow:
            item.add_marker("slow")
        new.append(item)
    # Report them as collected (the terminal's "collected N items" and -k/-m deselection counts).
    config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, new))
    if gate.only and items:
        config.hook.pytest_deselected(items=list(items))
        items[:] = new
    else:
        items.extend(new)


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        usable, reason = devices.cuda_status()
        if not usable:
            pytest.skip(f"needs a CUDA device (gpu marker): {reason}")


def _gate_reports(terminalreporter, status: str) -> list:
    return [r for r in terminalreporter.stats.get(status, []) if str(getattr(r, "nodeid", "")).startswith("rs-verify::")]


def _properties(report) -> dict:
    return dict(getattr(report, "user_properties", []))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    bundles = []
    for report in terminalreporter.stats.get("failed", []):
        bundles += [v for k, v in getattr(report, "user_properties", []) if k == BUNDLE_PROPERTY]
    if bundles:
        terminalreporter.section("rs-verify failure bundles")
        for path in dict.fromkeys(bundles):
            terminalreporter.write_line(f"rs-verify replay {path}")
    # What a green run did not show: skipped properties with their reasons (also under -q), the
    # suite's self-checks (they never call the sampler: not the sampler's passes), and verdicts
    # that rest on the sampler's own figures.
    skipped = [(r.nodeid, r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr))
               for r in _gate_reports(terminalreporter, "skipped") if r.when in ("setup", "call")]
    if skipped:
        terminalreporter.section("rs-verify: properties not run on this sampler")
        for nodeid, reason in skipped:
            name = nodeid.removeprefix("rs-verify::")
            terminalreporter.write_line(f"{nodeid}: {reason.removeprefix('Skipped: ').removeprefix(name + ': ')}")
    gate = config.stash.get(GATE_KEY, None)
    if gate is not None and gate.enabled:
        from ..harness.record import record_of  # lazy: see the note at the top

        try:
            record = record_of(gate.sampler())
        except BaseException:  # noqa: BLE001 - a sampler that cannot load was reported on every item
            record = None
        sent = [_properties(r).get(SENT_PROPERTY, {}) for status in ("passed", "failed", "xfailed")
                for r in _gate_reports(terminalreporter, status) if r.when == "call"]
        if record is not None:  # what the sampler declared and its adapter detected (read by `rs-verify releases`)
            terminalreporter.section("rs-verify: sampler (declared and detected)")
            for line in record.declared():
                terminalreporter.write_line(line)
        done = record.exercised(sent) if record is not None else []
        if done:
            terminalreporter.section("rs-verify: exercised (batches the sampler answered)")
            for what in done:
                terminalreporter.write_line(what)
        missing = record.not_exercised() if record is not None else []
        if missing:
            terminalreporter.section("rs-verify: not exercised (declared away by the sampler)")
            for what in missing:
                terminalreporter.write_line(what)
    passed = _gate_reports(terminalreporter, "passed")
    checks = [r.nodeid for r in passed if _properties(r).get(SELF_CHECK_PROPERTY)]
    trusted = [(r.nodeid, _properties(r)[SELF_REPORTED_PROPERTY]) for r in passed
               if _properties(r).get(SELF_REPORTED_PROPERTY)]
    if checks or trusted:
        terminalreporter.section("rs-verify: self-checks and self-reported figures")
        for nodeid in checks:
            terminalreporter.write_line(f"{nodeid}: a self-check of the suite; it does not call the sampler")
        for nodeid, what in trusted:
            terminalreporter.write_line(f"{nodeid}: {what}")
