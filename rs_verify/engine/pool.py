"""Whole properties in parallel worker processes (`rs-verify check --jobs N`).

Hypothesis runs one test at a time per process, so the unit of parallel work is a property:
each worker is a long-lived spawned process that makes the suite's backend choice, loads the
profile, the example database, the sampler (isolated as asked: its own child per property)
and the reference once, then runs whole properties, one at a time, and returns their
`Outcome` records over its pipe. Work is handed out most expensive first (the registry's cost
order, reversed), which keeps the workers busy until the end; outcomes arrive in completion
order.

A worker that dies (the sampler run with `--isolate off` segfaults, say, or the kernel kills
it for memory) fails only the property it was running, with a message naming the death
(the signal or the exit status), and a fresh worker takes its place; the pending properties
still run (pytest-xdist's `worker crashed while running ...` and its replacement worker are
the model). Workers are `rs_verify.harness.children.Child` processes: the parent watches every
worker's pipe and process sentinel at once (`children.ready`), so a death is seen as soon as it
happens.
"""

from __future__ import annotations

import pickle
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from hypothesis import settings

from ..properties.registry import PROPERTIES, by_cost
from ..harness import children, device
from . import database, isolation, profiles, runner
from .records import CRASH, ERROR, Failure, Outcome
from ..harness.handle import with_deviations
from ..harness.samplers import load_sampler


@dataclass(frozen=True)
class Setup:
    """What every worker needs to run a property exactly as the front end would."""

    sampler_spec: str
    reference_spec: str | None
    device: str
    profile: str
    isolate: str
    timeout: float
    redis_url: str | None = None
    max_examples: int | None = None
    bundle_dir: str | None = None
    options: dict = field(default_factory=dict)


class _WorkerServer:
    """A worker's life (a `children.Child` server): set up once, then run the properties it is named.

    A set-up that fails fails every property the worker is given, with the set-up's error."""

    def __init__(self, setup: Setup):
        self.setup = setup
        try:
            device.resolve(setup.device)
            profiles.load(setup.profile)
            if setup.redis_url:
                database.apply(setup.redis_url)
            self.sampler = with_deviations(isolation.load(setup.sampler_spec, setup.isolate, timeout=setup.timeout,
                                                          device_name=setup.device), setup.options.get("deviations"))
            self.reference = load_sampler(setup.reference_spec) if setup.reference_spec else None
            self.broken = None
        except BaseException as exc:  # noqa: BLE001 - every property this worker is given fails with it
            self.broken = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"

    def run(self, name: str) -> Outcome:
        setup = self.setup
        if self.broken:
            return _failed(name, setup, f"the worker process could not set up: {self.broken}")
        ctx = runner.make_context(self.sampler, self.reference, profile=setup.profile, device=setup.device)
        base = settings() if setup.max_examples is None else settings(max_examples=setup.max_examples)
        return portable(runner.run(PROPERTIES[name], ctx, base, bundle_dir=setup.bundle_dir,
                                   sampler_spec=setup.sampler_spec, reference_spec=setup.reference_spec,
                                   options=setup.options))


def portable(outcome: Outcome) -> Outcome:
    """The outcome as it can cross to the parent process: without the live exception (the record
    carries its text), and without a drawn value that cannot be pickled (the bundle keeps it)."""
    failure = outcome.failure
    if failure is not None:
        failure.exception = None
        try:
            pickle.dumps(failure.drawn)
        except Exception:  # noqa: BLE001 - whatever a strategy drew; the record must still cross
            failure.drawn = None
            failure.notes.append("(the drawn value could not be sent from the worker process; the bundle keeps it)")
    return outcome


def _failed(name: str, setup: Setup, message: str) -> Outcome:
    return Outcome(name, "failed", failure=Failure(property=name, sampler=setup.sampler_spec, kind=ERROR,
                                                   replayable=False, message=message))


class _Worker:
    """One worker process (a `children.Child`) and the property it is running (or None)."""

    def __init__(self, setup: Setup):
        # Not a daemon: it starts the sampler's child processes. It ends when told to, when killed by
        # `stop`, or when its pipe closes (the parent is gone).
        self.child = children.Child(_WorkerServer, setup, daemon=False)
        self.task: str | None = None

    def assign(self, name: str) -> None:
        self.task = name
        try:
            self.child.send("run", name)  # queued in the pipe until the worker has set up
        except children.ChildDied:  # it died already: its sentinel reports it, and the task fails with the death
            pass

    def stop(self) -> None:
        self.child.stop(grace=children.JOIN_SECONDS)


def run_parallel(names: list[str], setup: Setup, jobs: int) -> Iterator[Outcome]:
    """Run the properties `names` on `jobs` worker processes; yield each Outcome when it is done.

    A worker that dies fails the property it was running (CRASH, with the signal) and is
    replaced while properties are still pending."""
    pending = deque(reversed(by_cost(names)))
    workers = [_Worker(setup) for _ in range(min(max(1, jobs), len(pending)))]
    try:
        for w in workers:
            if pending:
                w.assign(pending.popleft())
        while any(w.task is not None for w in workers):
            busy = [w for w in workers if w.task is not None]
            answered = children.ready([w.child for w in busy])
            for w in busy:
                if w.child not in answered:
                    continue
                try:
                    kind, outcome = w.child.receive()
                except children.ChildDied as exc:  # the worker died running its task
                    name, w.task = w.task, None
                    yield _died(name, setup, w, exc.death)
                    w.stop()
                    workers.remove(w)
                    if pending:  # a fresh worker takes its place
                        workers.append(_Worker(setup))
                        workers[-1].assign(pending.popleft())
                    continue
                except children.ChildRaised as exc:  # the suite's own error, not the property's
                    kind, outcome = "ok", _failed(w.task, setup, f"{exc.raised.name} in the worker process: "
                                                                 f"{exc.raised.text}\n{exc.raised.traceback}")
                if kind == "ok":
                    w.task = None
                    yield outcome
                    if pending:
                        w.assign(pending.popleft())
    finally:
        for w in workers:
            w.stop()


def _died(name: str, setup: Setup, worker: _Worker, death: children.Death) -> Outcome:
    what = "while running this property" if worker.child.ready else "while setting up (loading the sampler)"
    return Outcome(name, "failed", failure=Failure(
        property=name, sampler=setup.sampler_spec, kind=CRASH, replayable=False,
        message=f"WorkerCrash: the worker process {death} {what} (rs-verify check "
                f"--jobs); a fresh worker took its place for the pending properties" + (
                    ". With --isolate off the sampler runs in the worker itself: --isolate property keeps a crash "
                    "of the sampler in a child of its own and records its batch" if setup.isolate == "off" else "")))
