"""Whole properties in parallel worker processes (`rs-verify check --jobs N`).

Hypothesis runs one test at a time per process, so the unit of parallel work is a property:
each worker is a spawned process that makes the suite's backend choice, loads the profile,
the example database, the sampler (isolated as asked: its own child per property) and the
reference once, then runs whole properties and returns their `Outcome` records. Work is
handed out most expensive first (the registry's cost order, reversed), which keeps the
workers busy until the end; outcomes arrive in completion order.
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Iterator

from hypothesis import settings

from ..properties.registry import PROPERTIES, by_cost
from ..harness import device
from . import database, isolation, profiles, runner
from .records import ERROR, Failure, Outcome
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


_WORKER: dict = {}


def _start(setup: Setup) -> None:
    device.resolve(setup.device)
    profiles.load(setup.profile)
    if setup.redis_url:
        database.apply(setup.redis_url)
    _WORKER["sampler"] = isolation.load(setup.sampler_spec, setup.isolate, timeout=setup.timeout,
                                        device_name=setup.device)
    _WORKER["reference"] = load_sampler(setup.reference_spec) if setup.reference_spec else None
    _WORKER["setup"] = setup


def _run(name: str) -> Outcome:
    setup: Setup = _WORKER["setup"]
    ctx = runner.make_context(_WORKER["sampler"], _WORKER["reference"], profile=setup.profile, device=setup.device)
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


def run_parallel(names: list[str], setup: Setup, jobs: int) -> Iterator[Outcome]:
    """Run the properties `names` on `jobs` worker processes; yield each Outcome when it is done."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, initializer=_start, initargs=(setup,)) as pool:
        pending = {pool.submit(_run, name): name for name in reversed(by_cost(names))}
        for done in as_completed(pending):
            try:
                yield done.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died fails its property, not the run
                name = pending[done]
                yield Outcome(name, "failed", failure=Failure(
                    property=name, sampler=setup.sampler_spec, kind=ERROR, replayable=False,
                    message=f"{type(exc).__name__}: the worker process running this property failed: {exc}"))
