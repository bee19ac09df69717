"""The rs-verify pytest plugin: gate any rejection sampler with the property library.

Installed as a `pytest11` entry point (`rs_verify = "rs_verify.frontends.plugin"`), or loaded with
`pytest -p rs_verify.frontends.plugin`. Loading it imports neither torch nor triton: the sampler,
the properties and the device checks are imported when a test needs them.

With `--rs-sampler=module:attribute` (or `--rs-gate` for the built-in Triton sampler) the
plugin adds one test item per registered property, `rs-verify::<property>`, in registry
order (deterministic, so pytest-xdist can distribute them, also across hosts). Each item
runs `rs_verify.engine.runner` for that property and skips, with the runner's reason, properties
the sampler cannot take (internal chunking, SPEC streams, ...). A failing item writes a
failure bundle (`--rs-bundle-dir`) and prints `rs-verify replay <bundle>`. Without
`--rs-sampler` / `--rs-gate` the plugin adds nothing and only registers its markers
(`gpu`, `slow`, `interpreter`, `rs_verify`) and options.
"""

from __future__ import annotations

import os
import sys

import pytest

PROFILE_NAMES = ("dev", "ci", "gpu", "nightly")  # = rs_verify.engine.profiles.PROFILE_NAMES
DEFAULT_SAMPLER = "triton"
DEFAULT_REFERENCE = "reference"
DEFAULT_BUNDLE_DIR = ".rs-verify/bundles"  # = rs_verify.engine.bundle.DEFAULT_DIR
BUNDLE_PROPERTY = "rs_verify_bundle"  # user_properties key of a report's bundle path

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
    group.addoption("--rs-bundle-dir", default=DEFAULT_BUNDLE_DIR, metavar="DIR",
                    help=f"where failure bundles are written (default {DEFAULT_BUNDLE_DIR})")
    group.addoption("--rs-redis", default=None, metavar="URL",
                    help="share Hypothesis failures through Redis (redis://host:port/db); default "
                         "$RS_VERIFY_REDIS_URL; the local directory database is still written")


def _set_device_env(device: str | None) -> None:
    if device != "cpu":
        return
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        import warnings

        warnings.warn("--rs-device cpu: triton was imported before the plugin could set TRITON_INTERPRET=1",
                      stacklevel=2)
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Before any conftest (which may import triton) is loaded.
    _set_device_env(getattr(early_config.known_args_namespace, "rs_device", None))


class Gate:
    """The options of one session and the samplers they name, loaded lazily once per process."""

    def __init__(self, config):
        opt = config.getoption
        self.enabled = bool(opt("--rs-sampler") or opt("--rs-gate") or opt("--rs-gate-only"))
        self.only = bool(opt("--rs-gate-only"))
        self.sampler_spec = opt("--rs-sampler") or DEFAULT_SAMPLER
        ref = opt("--rs-reference")
        self.reference_spec = None if ref in (None, "", "none") else ref
        self.device = opt("--rs-device")
        self.profile = opt("--rs-profile")
        self.bundle_dir = opt("--rs-bundle-dir")
        self.redis = opt("--rs-redis") or os.environ.get("RS_VERIFY_REDIS_URL") or None
        self._loaded: dict = {}

    def _load(self, spec: str, what: str):
        """Load a sampler once per process; a load error fails every item that needs it, cleanly."""
        if spec not in self._loaded:
            from ..engine.samplers import load_sampler

            try:
                self._loaded[spec] = (load_sampler(spec), None)
            except Exception as exc:  # noqa: BLE001 - reported on every item that needs the sampler
                self._loaded[spec] = (None, f"rs-verify: cannot load the {what} {spec!r}: {exc}")
        obj, error = self._loaded[spec]
        if error:
            pytest.fail(error, pytrace=False)
        return obj

    def sampler(self):
        return self._load(self.sampler_spec, "sampler (--rs-sampler)")

    def reference(self):
        return None if self.reference_spec is None else self._load(self.reference_spec, "reference (--rs-reference)")

    def profile_name(self) -> str:
        from ..engine import profiles

        if self.profile:
            return self.profile
        active = profiles.active()
        return active if active in PROFILE_NAMES else profiles.default_profile_name()

    def settings(self):
        from hypothesis import settings

        return settings.get_profile(self.profile_name())

    def options(self) -> dict:
        """Recorded in failure bundles (the device actually used is added by the runner)."""
        return {"profile": self.profile_name(), "runner": "pytest"}

    def header(self) -> str:
        return (f"rs-verify: sampler {self.sampler_spec}, reference {self.reference_spec or 'none'}, "
                f"profile {self.profile or 'auto'}, device {self.device or 'auto'}, bundles {self.bundle_dir}"
                + (", shared Redis database" if self.redis else ""))


GATE_KEY = pytest.StashKey[Gate]()


@pytest.hookimpl(trylast=True)  # after Hypothesis's own plugin has loaded --hypothesis-profile
def pytest_configure(config):
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    gate = Gate(config)
    config.stash[GATE_KEY] = gate
    _set_device_env(gate.device)
    if gate.profile:
        from ..engine import profiles

        profiles.load(gate.profile)
    if gate.redis:
        from ..engine import database

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


class PropertyItem(pytest.Item):
    """One registered property run against the session's sampler."""

    def __init__(self, *, prop_name: str, **kwargs):
        super().__init__(**kwargs)
        self.prop_name = prop_name

    @property
    def gate(self) -> Gate:
        return self.config.stash[GATE_KEY]

    def runtest(self):
        from ..engine import runner
        from ..properties import PROPERTIES

        gate = self.gate
        prop = PROPERTIES[self.prop_name]
        if gate.device == "cuda" and not runner.cuda_available():
            pytest.fail("--rs-device cuda: CUDA is not available on this machine", pytrace=False)
        reference = gate.reference() if "reference" in prop.needs else None
        ctx = runner.make_context(gate.sampler(), reference, profile=gate.profile_name(), device=gate.device)
        reason = runner.skip_reason(prop, ctx)
        if reason:
            # Reported at the item (rs-verify::<property>), not at this line of the plugin.
            raise pytest.skip.Exception(f"{self.prop_name}: {reason}", _use_item_location=True)
        try:
            runner.check(prop, ctx, gate.settings(), bundle_dir=gate.bundle_dir, sampler_spec=gate.sampler_spec,
                         reference_spec=gate.reference_spec, options=gate.options())
        except Exception as exc:
            for path in getattr(exc, "rs_bundles", []) or []:
                self.user_properties.append((BUNDLE_PROPERTY, path))
            raise
        finally:
            self.user_properties.append(("rs_verify_examples", ctx.stats.get("examples", 0)))
            if ctx.stats.get("excused"):
                self.user_properties.append(("rs_verify_excused", ctx.stats["excused"]))

    def repr_failure(self, excinfo, style=None):
        exc = excinfo.value
        # A property failure is its message and notes (input, reproducer, bundle); anything else
        # (a crash of the sampler, a Hypothesis error) keeps pytest's traceback.
        if isinstance(exc, AssertionError) and hasattr(exc, "rs_drawn"):
            notes = "\n".join(getattr(exc, "__notes__", []))
            return f"{type(exc).__name__}: {exc}\n{notes}".rstrip()
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        # Point at the property's source (skips and failures are reported there).
        import inspect

        from ..properties import PROPERTIES

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
    from ..properties import PROPERTIES  # numpy, scipy, hypothesis: no torch, no triton

    parent = GateCollector.from_parent(session, name="rs-verify", nodeid="rs-verify")
    new = []
    for name in PROPERTIES:  # registry order: identical on every xdist worker
        item = PropertyItem.from_parent(parent, name=name, prop_name=name)
        item.add_marker("rs_verify")
        prop = PROPERTIES[name]
        if prop.family == "distribution":
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
        from ..engine.runner import cuda_available

        if not cuda_available():
            pytest.skip("needs a CUDA device (gpu marker): torch.cuda.is_available() is False")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    bundles = []
    for report in terminalreporter.stats.get("failed", []):
        bundles += [v for k, v in getattr(report, "user_properties", []) if k == BUNDLE_PROPERTY]
    if bundles:
        terminalreporter.section("rs-verify failure bundles")
        for path in dict.fromkeys(bundles):
            terminalreporter.write_line(f"rs-verify replay {path}")
