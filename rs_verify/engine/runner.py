"""Running properties under Hypothesis and handing back `Outcome` / `Failure` records.

The tests, the CLI, the pytest plugin and the mutation campaign all run properties through
`run()`, so a property is written once (in `rs_verify.properties`) and wrapped thinly everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings

from hypothesis import given, settings
from hypothesis.control import current_build_context
from hypothesis.errors import HypothesisWarning
from hypothesis.internal.conjecture import engine as conjecture_engine
from hypothesis.reporting import current_reporter, with_reporter

from ..harness.context import Context
from ..harness.failure import PropertyFailure
from ..properties.registry import PROPERTIES, Property
from . import bundle, isolation, profiles, replay
from .context import describe, make_context, skip_reason
from .isolation import SamplerDied
from .records import CRASH, ERROR, PROPERTY, TIMEOUT, Failure, Outcome

__all__ = ["make_context", "pytest_run", "run", "skip_reason"]


class _Capture:
    """What the property saw when it failed, keyed by the exception object.

    Hypothesis re-raises the exception of its final (shrunk) replay, so looking the raised
    exception up here gives the minimal input; the first failure's example index is kept too.
    """

    def __init__(self):
        self.by_exc: dict[int, tuple[BaseException, object]] = {}
        self.first_at: int | None = None
        self.first_time: float | None = None
        self.after_first = 0  # examples tried after the first failure (shrink candidates)

    def record(self, exc: BaseException, drawn, index: int) -> None:
        self.by_exc[id(exc)] = (exc, drawn)
        if self.first_at is None:
            self.first_at, self.first_time = index, time.monotonic()

    def drawn_for(self, exc: BaseException):
        hit = self.by_exc.get(id(exc))
        return (True, hit[1]) if hit is not None and hit[0] is exc else (False, None)


def _settings_for(prop: Property, ctx: Context, base: settings | None) -> settings:
    if base is None:
        base = settings.get_profile(ctx.profile) if ctx.profile in profiles.PROFILE_NAMES else settings()
    return settings(base, max_examples=max(1, round(base.max_examples * prop.examples_scale)))


def hypothesis_test(prop: Property, ctx: Context, base: settings | None = None, capture: _Capture | None = None):
    """A zero-argument callable that runs `prop` under Hypothesis (or once, for a fixed campaign)."""
    capture = capture if capture is not None else _Capture()

    def check(drawn):
        ctx.count("examples")
        try:
            prop.check(ctx, drawn)
        except (Exception, SamplerDied) as exc:
            # A SamplerDied (a crash or a hang of an isolated sampler) is a BaseException: it ends
            # the Hypothesis run at once, unshrunk, and `run` records it with this input.
            capture.record(exc, drawn, ctx.stats["examples"])
            raise

    if prop.strategy is None:
        return lambda: check(None)

    budget = profiles.shrink_seconds(ctx.profile)
    calls = profiles.shrink_calls(ctx.profile)

    @_settings_for(prop, ctx, base)
    @given(prop.strategy(ctx))
    def test(drawn):
        # Shrinking through the Triton interpreter can take many minutes: once the shrink
        # budget is spent, further shrink candidates pass without running the sampler, and
        # Hypothesis's own shrink deadline (`_shrink_deadline`) ends the shrink phase, so
        # Hypothesis reports the smallest failure found so far (its final replay, `is_final`,
        # always runs the real check).
        # A derandomized profile counts candidates instead (deterministic: the same shrunk example,
        # hence the same bundle name, on every rerun); the time budget is then a safety net.
        if capture.first_time is not None and not current_build_context().is_final:
            capture.after_first += 1
            if time.monotonic() - capture.first_time > budget or (calls is not None and capture.after_first > calls):
                return
        check(drawn)

    @functools.wraps(test)
    def run_test():
        with _shrink_deadline(budget):
            test()

    # Give every (property, sampler) pair its own key in the example database.
    test.hypothesis.inner_test._hypothesis_internal_add_digest = f"{prop.name}:{describe(ctx.sampler)}".encode()
    return run_test


@contextlib.contextmanager
def _shrink_deadline(seconds: float):
    """Hypothesis's shrink-phase deadline set to `seconds` (its documented, monkeypatchable
    `MAX_SHRINKING_SECONDS`, 300 s by default) and its warning about it silenced: candidates that
    pass without running still cost a draw each, which for large inputs adds minutes.
    Hypothesis's "overly large repr" warning about a failing batch is silenced too: the failure
    is reported by its record (summary, bundle, short reproducer), not by Hypothesis's repr."""
    saved = conjecture_engine.MAX_SHRINKING_SECONDS
    conjecture_engine.MAX_SHRINKING_SECONDS = min(saved, seconds)
    try:
        with with_reporter(_quiet_shrink_warning(current_reporter())), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Generating overly large repr", category=HypothesisWarning)
            yield
    finally:
        conjecture_engine.MAX_SHRINKING_SECONDS = saved


def _quiet_shrink_warning(reporter):
    def report(value) -> None:
        if "working to shrink" not in str(value):  # the budget, not a Hypothesis problem
            reporter(value)

    return report


def failure_record(prop: Property, ctx: Context, exc: BaseException, capture: _Capture) -> Failure:
    """The record of the exception Hypothesis raised: its input when the property saw one."""
    seen, drawn = capture.drawn_for(exc)
    batch = getattr(exc, "batch", None) if isinstance(exc, (PropertyFailure, SamplerDied)) else None
    if isinstance(exc, SamplerDied) and prop.strategy is None:
        batch = None  # a fixed campaign replays from its seed; its batch can be large (the message summarises it)
    if isinstance(exc, SamplerDied):
        kind = TIMEOUT if exc.kind == "timeout" else CRASH
    else:
        kind = PROPERTY if isinstance(exc, AssertionError) else ERROR
    failure = Failure(property=prop.name, sampler=describe(ctx.sampler), kind=kind,
                      message=f"{type(exc).__name__}: {exc}", batch=batch, drawn=drawn if seen else None,
                      found_at=capture.first_at, replayable=seen, exception=exc)
    failure.notes.append(f"property: {prop.name} ({prop.doc})\nsampler: {failure.sampler}")
    shown = failure.failing_batch()
    if shown is not None:
        failure.notes.append(f"batch: {shown.summary()}")
    if isinstance(exc, SamplerDied):
        call = ", ".join(["batch", *(f"{k}={v!r}" for k, v in exc.kwargs.items())])
        failure.notes.append(f"the call that did not return: sampler({call}); the run stopped there (no shrinking "
                             "through crashes and hangs)")
    if not seen:
        failure.notes.append("the failing input is unknown (the error was raised outside the property's check)")
    return failure


def run(prop: Property, ctx: Context, base: settings | None = None, *, bundle_dir=None,
        sampler_spec: str | None = None, reference_spec: str | None = None, options: dict | None = None) -> Outcome:
    """Run one property; never raises for a failure of the property or of the sampler.

    With `bundle_dir`, a failure with a known input is also written as a failure bundle there
    and its notes say how to replay it; without, its notes carry a self-contained reproducer.
    """
    reason = skip_reason(prop, ctx)
    if reason:
        return Outcome(prop.name, "skipped", reason=reason, self_check=prop.self_check)
    ctx.stats.clear()
    capture = _Capture()
    start = time.perf_counter()
    failure = None
    outer = ctx.sampler
    calls, sent = 0, {}
    try:
        # An isolated sampler gets a fresh child for this property (closed at the end); the handle
        # over it counts the property's calls of the sampler (and of its unvalidated variant).
        with isolation.for_property(outer.obj) as obj:
            ctx.sampler = outer.with_object(obj)
            try:
                hypothesis_test(prop, ctx, base, capture)()
            finally:
                calls, sent = ctx.sampler.calls, ctx.sampler.sent
    except (Exception, SamplerDied) as exc:  # noqa: BLE001 - turned into a Failure record, never swallowed
        failure = failure_record(prop, ctx, exc, capture)
    finally:
        ctx.sampler = outer
    ctx.stats["sampler_calls"] = calls
    ctx.stats["sent"] = sent  # calls per feature of SPEC 2 / 4b (`SpecBatch.exercises`): what the run exercised
    if failure is None and not prop.self_check and not ctx.stats["sampler_calls"]:
        # No property passes a sampler it never called.
        failure = Failure(property=prop.name, sampler=describe(ctx.sampler), kind=ERROR, replayable=False,
                          message=f"rs-verify: {prop.name} never called the sampler ({ctx.stats.get('examples', 0)} "
                                  "examples); a property that does not exercise the sampler cannot pass it")
    if failure is not None:
        if sampler_spec:
            failure.sampler = sampler_spec
        _attach_reproducer(failure, ctx, bundle_dir, reference_spec, options)
    return Outcome(prop.name, "failed" if failure else "passed", time.perf_counter() - start,
                   ctx.stats.get("examples", 0), ctx.stats.get("excused", 0), failure=failure,
                   stats=dict(ctx.stats), self_check=prop.self_check)


def _attach_reproducer(failure: Failure, ctx: Context, bundle_dir, reference_spec, options) -> None:
    if not failure.replayable:
        return
    if bundle_dir is None:
        failure.notes.append("reproduce with:\n" + replay.code_snippet(failure))
        return
    opts = {"profile": ctx.profile, "device": ctx.device, **(options or {})}
    try:
        path = bundle.save(bundle_dir, failure, reference_spec=reference_spec, options=opts)
    except Exception as err:  # noqa: BLE001 - never hide the failure behind a bundle problem
        failure.notes.append(f"rs-verify: no failure bundle written ({type(err).__name__}: {err})")
        failure.notes.append("reproduce with:\n" + replay.code_snippet(failure))
        return
    failure.bundles.append(str(path))
    failure.notes.append(f"failure bundle: {path}\nreplay with: {bundle.replay_command(path)}\n"
                         f"or in Python:\n{replay.bundle_snippet(path, failure.kind)}")


def pytest_run(name: str, sampler, reference=None, base: settings | None = None) -> Outcome:
    """Run property `name` inside a pytest test: skip with the reason when it does not apply,
    fail with the failure's text (the original exception chained) when it does not hold, and
    return the passed run's `Outcome` (its counters: examples, excused divergences, stats).
    `base`: the Hypothesis settings to start from (default: the context's profile)."""
    import pytest  # lazy: the engine is used outside pytest too (CLI, campaigns)

    prop = PROPERTIES[name]
    outcome = run(prop, make_context(sampler, reference), base)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    if outcome.failure is not None:
        exc = outcome.failure.exception
        if exc is None:
            pytest.fail(outcome.failure.text(), pytrace=False)
        if isinstance(exc, AssertionError):
            raise AssertionError(outcome.failure.text()) from exc
        for note in outcome.failure.notes:
            exc.add_note(note)
        raise exc
    return outcome
