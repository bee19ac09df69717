"""A sampler in a child process: a crash or a hang of the sampler becomes an ordinary failure.

`ChildSampler(spec)` loads the sampler named by `spec` (`module:attribute` or a built-in name)
in a spawned child process (`rs_verify.harness.children`) and forwards every call to it. The
child runs each call under `guards.local_call` (input integrity, reseeded global generators,
device faults: checks that must run where the sampler runs). The parent keeps the batch it
sent, so when the child dies (a segfault, an abort, a CUDA fatal error) or does not answer
within `timeout` seconds, the call raises `SamplerCrash` or `SamplerTimeout` with the signal or
the limit in the message and the batch attached. The next call starts a fresh child; so does
the call after a device fault (a CUDA context that saw an illegal address is unusable).

Levels (`LEVELS`, the front ends' `--rs-isolate` / `--isolate`): `property` runs the calls of one
property's examples in one child (`for_property` makes a fresh one per property, started on its
first call, so skipped properties cost nothing); `call` starts a fresh child for every call;
`off` loads the sampler in the test process (for debugging: a crash ends the session).

The child makes the suite's backend choice (`device.resolve`) before it loads the sampler, and
puts `sys_path` first on its import path (a baseline revision's worktree, say), so that two
versions of one package can run side by side in two children.
"""

from __future__ import annotations

import contextlib
import time

from ..harness import children, device, guards
from ..harness.handle import RemoteSampler
from ..harness.record import SamplerRecord, record_of
from .defaults import DEFAULT_TIMEOUT, ISOLATION_LEVELS as LEVELS
from ..harness.samplers import load_sampler

DEFAULT_LEVEL = LEVELS[0]
# Seconds per call. The slowest calls of the CPU profiles take seconds (a large batch through the
# Triton interpreter, ~6 s with 16-wide vocabulary blocks; a 200,000-request distribution campaign
# of the example torch sampler, 3 s; 2,000,000 requests at the nightly profile, ~30 s): 120 s
# leaves ample room, and a hang fails its property, with the child's start, within about 2 minutes
# (`DEFAULT_TIMEOUT`, engine/defaults.py).
# Once a call of a sampler has timed out, later calls of it (other properties, same session) wait
# at most this many times the longest answered call of their own child, and at least
# AFTER_HANG_FLOOR seconds: a sampler that hangs on every call still ends a whole gate of 19
# properties within minutes, not 19 timeouts.
AFTER_HANG_FACTOR = 10.0
AFTER_HANG_FLOOR = 10.0


class SamplerDied(BaseException):
    """A call ended without an answer from the sampler's process; `batch` and `kwargs` are the call's.

    A `BaseException`, like `KeyboardInterrupt`: no property's `except Exception` can mistake a
    dead process for the sampler's answer (a refusal, say), and Hypothesis neither shrinks nor
    replays through it (each try would cost a new process, or a whole timeout). The runner
    records it as a failure with this batch.
    """

    kind = "crash"

    def __init__(self, message: str, *, batch=None, kwargs: dict | None = None):
        super().__init__(message)
        self.batch = batch
        self.kwargs = dict(kwargs or {})


class SamplerCrash(SamplerDied):
    """The sampler's process died during a call (the message names the signal or exit code)."""

    kind = "crash"


class SamplerTimeout(SamplerDied):
    """A call did not return within the time limit (the child was killed)."""

    kind = "timeout"


class ChildError(RuntimeError):
    """An exception raised inside the child, re-raised here with the child's traceback."""


class _SamplerServer:
    """The sampler's process (a `children.Child` server): the sampler loaded after the suite's
    backend choice, then one `call` command per call, each run under `guards.local_call`."""

    def __init__(self, spec: str, requested_device: str | None, unvalidated: bool):
        device.resolve(requested_device)
        sampler = load_sampler(spec)
        self.sampler = sampler.unvalidated() if unvalidated else sampler
        # The record is built where the sampler lives (its declarations, whether the suite runs its
        # Triton code through the interpreter here) and crosses as plain values: nothing else does.
        rec = record_of(self.sampler)
        self.hello = rec.replace(loaded_as=rec.loaded_as or spec).to_dict()

    def call(self, batch, kwargs: dict, reseed: int | None):
        batch = batch.replace()  # read-only views again: unpickled arrays are writable
        return guards.local_call(self.sampler, batch, kwargs, reseed=reseed)


def _reraise(raised: children.Raised) -> None:
    """The sampler's exception, raised here with the meaning it had in the child."""
    report = raised.attrs.get("call_report")
    if raised.is_a(guards.InputModified):
        raise guards.InputModified(raised.text)
    device_fault = raised.is_a(guards.DeviceFault)
    if raised.is_a(ValueError) and not device_fault:  # keeps its meaning: a validation refusal (SPEC section 9)
        exc = ValueError(raised.text)
        exc.call_report = report
        raise exc
    cls = guards.DeviceFault if device_fault else ChildError
    exc = cls(f"{raised}\n--- traceback in the sampler's process ---\n{raised.traceback}")
    exc.call_report = report
    raise exc


class ChildSampler(RemoteSampler):
    """A sampler loaded by `spec` in a child process (see the module docstring).

    Constructed without `record`, it starts its child at once (a sampler that cannot be loaded
    raises `ValueError` here) and receives the sampler's `SamplerRecord` from it; `sibling()`
    makes a copy with the same record whose child starts on its first call.
    """

    def __init__(self, spec: str, *, sys_path: list[str] | None = None, device_name: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, unvalidated: bool = False, start_timeout: float = 300.0,
                 fresh_per_call: bool = False, record: SamplerRecord | None = None, history: dict | None = None):
        self.spec = spec
        self._args = (spec, list(sys_path or []), device_name, unvalidated)
        self.timeout = timeout
        # Shared by siblings: whether a call of this sampler timed out (see call_limit).
        self._history = history if history is not None else {"hung": False}
        self._longest = 0.0  # the longest answered call of this child
        self.start_timeout = start_timeout
        self.fresh_per_call = fresh_per_call
        self._proc = None  # the child process (a children.Child), started on demand
        self._unvalidated_child = None
        self.record = record if record is not None else SamplerRecord.from_dict(self._start())
        self._unused = record is None  # a child started only to read the record: a sibling adopts it

    def _start(self, batch=None, kwargs=None) -> dict:
        """Start the child; with `batch` (a start on the first call), a load error is a crash of that call."""
        spec, sys_path, device_name, unvalidated = self._args
        self._proc = children.Child(_SamplerServer, spec, device_name, unvalidated, sys_path=sys_path)
        try:
            return self._proc.start(self.start_timeout)
        except children.ChildRaised as exc:
            self._stop()
            message = f"sampler {self.spec!r} cannot be loaded in a child process: {exc.raised}"
            if batch is not None:  # never a ValueError here: a property would read it as a refusal
                raise SamplerCrash(message, batch=batch, kwargs=kwargs) from None
            raise ValueError(message) from None
        except children.ChildDied as exc:
            raise self._lost(exc.death, "loading the sampler", batch, kwargs) from None

    def _lost(self, death: children.Death, what: str, batch=None, kwargs=None, *, before: bool = False) -> SamplerDied:
        """The failure of a call whose child died or hung while `what` (`before`: before the call was sent)."""
        self._stop()
        if death.hung:
            return SamplerTimeout(f"the sampler did not return within {death.timeout:.4g} s ({what}); its process "
                                  "was killed", batch=batch, kwargs=kwargs)
        when = "before the call" if before else f"while {what}"
        return SamplerCrash(f"the sampler's process {death} {when}", batch=batch, kwargs=kwargs)

    @property
    def name(self) -> str:
        return self.record.name

    def sibling(self, *, fresh_per_call: bool | None = None) -> "ChildSampler":
        """The same sampler in a child of its own, started on its first call (or this one's child,
        when it was started only to read the declarations and never called: one start saved)."""
        spec, sys_path, device_name, unvalidated = self._args
        other = ChildSampler(spec, sys_path=sys_path, device_name=device_name, timeout=self.timeout,
                             unvalidated=unvalidated, start_timeout=self.start_timeout, record=self.record,
                             history=self._history,
                             fresh_per_call=self.fresh_per_call if fresh_per_call is None else fresh_per_call)
        if self._unused and self._proc is not None and self._proc.alive:
            other._proc, self._proc = self._proc, None
        self._unused = False
        return other

    def unvalidated(self) -> "ChildSampler":
        """The sampler's unvalidated variant in a child of its own (one per ChildSampler, closed with it)."""
        if not self.record.has_unvalidated:
            raise AttributeError(f"sampler {self.name} offers no unvalidated()")
        if self._unvalidated_child is None:
            spec, sys_path, device_name, _ = self._args
            self._unvalidated_child = ChildSampler(
                spec, sys_path=sys_path, device_name=device_name, timeout=self.timeout, unvalidated=True,
                history=self._history,
                start_timeout=self.start_timeout, fresh_per_call=self.fresh_per_call,
                record=self.record.replace(has_unvalidated=False))
        return self._unvalidated_child

    def observed_call(self, batch, kwargs: dict, *, reseed: int | None = None):
        """`guards.observed_call` run in the child: `(output, CallReport)`."""
        self._unused = False
        if self._proc is None or not self._proc.alive:
            self._stop()
            self._start(batch, kwargs)
        what = f"verifying a batch ({batch.summary()}{''.join(f', {k}={v!r}' for k, v in kwargs.items())})"
        try:
            self._proc.send("call", batch, kwargs, reseed)
        except children.ChildDied as exc:
            raise self._lost(exc.death, "sending the call", batch, kwargs, before=True) from None
        limit, sent = self.call_limit(), time.monotonic()
        if limit < self.timeout:
            what += (f"; the limit of {self.timeout:g} s was shortened after an earlier call of this sampler hung "
                     "(--rs-timeout / --timeout)")
        try:
            answer = self._proc.receive(limit)[1]
        except children.ChildDied as exc:
            self._history["hung"] = self._history["hung"] or exc.death.hung
            raise self._lost(exc.death, what, batch, kwargs) from None
        except children.ChildRaised as exc:
            answer, raised = None, exc.raised
        else:
            raised = None
        self._longest = max(self._longest, time.monotonic() - sent)
        if self.fresh_per_call or (raised is not None and raised.is_a(guards.DeviceFault)):
            self._stop()
        if raised is not None:
            _reraise(raised)
        return answer

    def call_limit(self) -> float:
        """Seconds the next call may take: the timeout, shortened once a call of this sampler hung."""
        if not self._history["hung"]:
            return self.timeout
        return min(self.timeout, max(AFTER_HANG_FLOOR, AFTER_HANG_FACTOR * self._longest))

    def __call__(self, batch, **kwargs):
        return self.observed_call(batch, kwargs)[0]

    def close(self) -> None:
        """Stop the child (and the unvalidated variant's child); a later call starts a fresh one."""
        if self._unvalidated_child is not None:
            self._unvalidated_child.close()
            self._unvalidated_child = None
        self._stop()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
        self._proc = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def load(spec: str, level: str = DEFAULT_LEVEL, *, timeout: float = DEFAULT_TIMEOUT, device_name: str | None = None,
         sys_path: list[str] | None = None):
    """The sampler named by `spec` at isolation `level`: a `ChildSampler` (loaded once to read its
    declarations; `for_property` gives each property a child of its own, the first one adopting
    this child) or, for `off`, the sampler itself loaded in this process."""
    if level not in LEVELS:
        raise ValueError(f"unknown isolation level {level!r}; expected one of {LEVELS}")
    if level == "off":
        return load_sampler(spec)
    return ChildSampler(spec, sys_path=sys_path, device_name=device_name, timeout=timeout,
                        fresh_per_call=level == "call")


@contextlib.contextmanager
def for_property(sampler):
    """The sampler one property runs against: a fresh child (closed afterwards) for a ChildSampler."""
    if not isinstance(sampler, ChildSampler):
        yield sampler
        return
    child = sampler.sibling()
    try:
        yield child
    finally:
        child.close()
