"""Timing two versions of a sampler on the same batches, in one run (the regression gate's speed check).

Each version runs in a spawned process of its own (a `children.Child`), loaded by
`(spec, sys_path)` (the baseline's `Baseline.loader`; `(spec, [])` for the sampler under test),
so both are timed the same way and two versions of one package can run side by side. Each process receives the benchmark batches
once and warms up on every one of them (`warmup` calls, not counted: compilation, autotuning,
allocator growth). Then the parent alternates between the two versions, batch by batch,
`repeats` times, so that drift of the machine (clocks, other load) hits both alike. A timed
call measures, in the sampler's own process:

- `wall`: seconds of the protocol call `sampler(batch, **kwargs)`, host work and copies included;
- `device` (CUDA only): seconds of the CUDA kernels that call ran, memory copies and sets
  excluded, from `torch.profiler`'s CUDA activity (a second call, so the profiler never slows
  the wall measure). On a GPU the host-to-device copy of the logits dominates the wall time,
  so this is the measure a kernel change moves.

The comparison is the ratio of medians, changed over baseline, per batch and measure.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from . import children, device as devices
from .guards import with_explicit_noise
from .record import record_of
from .samplers import load_sampler

DEFAULT_REPEATS = 15
DEFAULT_WARMUP = 3
NOT_KERNELS = ("Memcpy", "Memset")  # CUDA activities that are copies, not the sampler's kernels


class TimingError(RuntimeError):
    """A version could not be loaded or timed (the message says which and why)."""


@dataclass
class Timed:
    """Medians of one measure of one benchmark batch, for both versions."""

    batch: str
    measure: str  # "wall" or "device"
    changed: float  # seconds, median
    baseline: float
    runs: int

    @property
    def ratio(self) -> float:
        if self.baseline > 0:
            return self.changed / self.baseline
        return 1.0 if self.changed == 0 else float("inf")


def _device_seconds(sampler, batch, kwargs) -> float:
    """Seconds of CUDA kernels run by one call, from the profiler's CUDA activity."""
    from torch.autograd import DeviceType  # lazy: only a CUDA timing child imports the profiler
    from torch.profiler import ProfilerActivity, profile  # lazy: as above

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sampler(batch, **kwargs)
    total_us = sum(e.time_range.elapsed_us() for e in prof.events()
                   if e.device_type == DeviceType.CUDA and not e.name.startswith(NOT_KERNELS))
    return total_us * 1e-6


def _time_call(sampler, batch, kwargs, on_cuda: bool) -> tuple[float, float | None, str | None]:
    """`(wall, device, why device is missing)` of one call (device: CUDA only)."""
    start = time.perf_counter()
    sampler(batch, **kwargs)  # host arrays come back: the device work is done when this returns
    wall = time.perf_counter() - start
    if not on_cuda:
        return wall, None, None
    try:
        return wall, _device_seconds(sampler, batch, kwargs), None
    except Exception as exc:  # noqa: BLE001 - no profiler (e.g. CUPTI unavailable): the wall time still counts
        return wall, None, f"device time not measured: torch.profiler failed ({type(exc).__name__}: {exc})"


class _Timer:
    """One version's timing process (a `children.Child` server): the sampler, loaded after the
    suite's backend choice; `batches` sends the benchmark batches once and warms up on each, and
    `time` times one of them."""

    def __init__(self, spec: str, requested_device: str | None):
        self.on_cuda = devices.resolve(requested_device) == "cuda"
        self.sampler = load_sampler(spec)
        self.hello = record_of(self.sampler).name
        self.work = []

    def batches(self, work: list, warmup: int) -> None:
        # An explicit sampler (SPEC 3c) is timed on the batch with its noise, as the properties call it.
        self.work = [(with_explicit_noise(self.sampler, batch), kwargs) for batch, kwargs in work]
        work = self.work
        for batch, kwargs in work:
            for _ in range(warmup):
                self.sampler(batch, **kwargs)

    def time(self, index: int):
        batch, kwargs = self.work[index]
        return _time_call(self.sampler, batch, kwargs, self.on_cuda)


class _Version:
    """One version's timing process, asked through its pipe."""

    def __init__(self, what: str, loader: tuple, device: str | None, timeout: float):
        self.what, self.timeout = what, timeout
        spec, sys_path = loader
        self._child = children.Child(_Timer, spec, device, sys_path=sys_path)
        self.name = self._ask("loading", None)

    def _ask(self, doing: str, command: str | None, *args):
        """The answer to `command` (None: the loaded sampler's name); a failure raises TimingError."""
        try:
            if command is None:
                return self._child.start(self.timeout)
            return self._child.ask(command, *args, timeout=self.timeout)
        except children.ChildDied as exc:
            raise TimingError(f"{self.what}: its process {exc.death} while {doing}") from None
        except children.ChildRaised as exc:  # a load error without its traceback, a call's with it
            tb = f"\n{exc.raised.traceback}" if command is not None else ""
            raise TimingError(f"{self.what}: {exc.raised}{tb}") from None

    def load(self, work, warmup: int) -> None:
        self._ask("warming up", "batches", work, warmup)

    def time(self, index: int, label: str):
        return self._ask(f"timing batch {label!r}", "time", index)

    def close(self) -> None:
        self._child.stop()


def time_versions(changed: tuple, baseline: tuple, batches: list, *, device: str | None = None,
                  repeats: int | None = None, warmup: int | None = None,
                  timeout: float = 600.0) -> tuple[list[Timed], list[str]]:
    """Time both versions on `batches` (`(label, batch, call kwargs)` triples), interleaved.

    `changed` and `baseline` are loaders `(spec, sys_path)`. Returns one `Timed` per batch and
    measure (`device` only when the processes run on CUDA) and notes on what was not measured.
    Defaults: `DEFAULT_REPEATS`, `DEFAULT_WARMUP`.
    """
    repeats = DEFAULT_REPEATS if repeats is None else int(repeats)
    warmup = DEFAULT_WARMUP if warmup is None else int(warmup)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    work = [(batch, dict(kwargs)) for _, batch, kwargs in batches]
    labels = [label for label, _, _ in batches]
    versions = []
    try:
        for what, loader in (("the changed sampler", changed), ("the baseline", baseline)):
            versions.append(_Version(what, loader, device, timeout))
        for v in versions:
            v.load(work, warmup)
        runs = {(i, v.what): [] for i in range(len(work)) for v in versions}
        for _ in range(repeats):
            for i, label in enumerate(labels):
                for v in versions:
                    runs[(i, v.what)].append(v.time(i, label))
    finally:
        for v in versions:
            v.close()
    out = []
    notes = sorted({note for calls in runs.values() for _, _, note in calls if note})
    for i, label in enumerate(labels):
        a, b = runs[(i, versions[0].what)], runs[(i, versions[1].what)]
        out.append(Timed(label, "wall", statistics.median(c[0] for c in a), statistics.median(c[0] for c in b),
                         repeats))
        if all(c[1] is not None for c in a + b):
            device = Timed(label, "device", statistics.median(c[1] for c in a), statistics.median(c[1] for c in b),
                           repeats)
            if device.changed or device.baseline:  # neither version ran CUDA kernels: nothing to compare
                out.append(device)
    return out, notes


def table(rows: list[Timed], *, max_slowdown: float, changed: str, baseline: str, header: str = "",
          notes=()) -> str:
    """The comparison as a Markdown table (with a short header naming both versions, and notes)."""
    lines = [header] if header else []
    lines += [f"changed: {changed}", f"baseline: {baseline}", *notes,
              f"median of {rows[0].runs if rows else 0} interleaved runs per version, warm-up excluded; "
              f"a ratio above {max_slowdown:g} fails", "",
              "| batch | measure | changed (ms) | baseline (ms) | ratio | verdict |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        verdict = "SLOWER" if r.ratio > max_slowdown else "ok"
        lines.append(f"| {r.batch} | {r.measure} | {r.changed * 1e3:.3f} | {r.baseline * 1e3:.3f} | "
                     f"{r.ratio:.3f} | {verdict} |")
    return "\n".join(lines) + "\n"


def too_slow(rows: list[Timed], max_slowdown: float) -> list[Timed]:
    return [r for r in rows if r.ratio > max_slowdown]
