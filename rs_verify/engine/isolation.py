"""A sampler in a child process: a crash or a hang of the sampler becomes an ordinary exception.

`ChildSampler(spec)` loads the sampler named by `spec` (`module:attribute` or a built-in name)
in a spawned child process and forwards every call to it over a `multiprocessing` pipe. The
parent keeps the batch it sent, so when the child dies (a segfault, an abort, a CUDA fatal
error) or does not answer within `timeout` seconds, the call raises `SamplerCrash` or
`SamplerTimeout` with the signal or the limit in the message, and the caller still holds the
input that caused it. The next call starts a fresh child.

The child makes the suite's backend choice (`device.resolve`) before it loads the sampler, and
puts `sys_path` first on its import path (a baseline revision's worktree, say), so that two
versions of one package can run side by side in two children.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import traceback

from . import device
from .samplers import load_sampler

DECLARED = ("name", "supports_chunking", "streams", "interpreted", "memory_stats", "supports_logprobs",
            "draft_modes", "logits_dtypes", "min_spec_steps")
DEFAULT_TIMEOUT = 600.0  # seconds per call: the Triton interpreter takes seconds on a large batch


class SamplerCrash(RuntimeError):
    """The sampler's process died during a call (the message names the signal or exit code)."""


class SamplerTimeout(RuntimeError):
    """A call did not return within the time limit (the child was killed)."""


def _child(conn, spec: str, sys_path: list[str], requested_device: str | None, unvalidated: bool) -> None:
    sys.path[:0] = sys_path
    try:
        device.resolve(requested_device)
        sampler = load_sampler(spec)
        if unvalidated:
            sampler = sampler.unvalidated()
        declared = {k: getattr(sampler, k) for k in DECLARED if hasattr(sampler, k)}
        declared["has_unvalidated"] = callable(getattr(sampler, "unvalidated", None))
        conn.send(("ok", declared))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
        return
    while True:
        try:
            batch, kwargs = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", sampler(batch, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


class ChildError(RuntimeError):
    """An exception raised inside the child, re-raised here with the child's traceback."""


def _raise_child_error(payload) -> None:
    name, text, tb = payload
    if name == "ValueError":  # keeps its meaning: a validation refusal (SPEC section 9)
        raise ValueError(text)
    raise ChildError(f"{name}: {text}\n--- traceback in the sampler's process ---\n{tb}")


class ChildSampler:
    """A sampler loaded by `spec` in a child process (see the module docstring)."""

    def __init__(self, spec: str, *, sys_path: list[str] | None = None, device_name: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, unvalidated: bool = False, start_timeout: float = 300.0):
        self.spec = spec
        self._args = (spec, list(sys_path or []), device_name, unvalidated)
        self.timeout = timeout
        self.start_timeout = start_timeout
        self._proc = self._conn = None
        self._declared = self._start()

    def _start(self) -> dict:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, *self._args), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        status, payload = self._receive(self.start_timeout, "loading the sampler")
        if status == "error":
            name, text, _tb = payload
            raise ValueError(f"sampler {self.spec!r} cannot be loaded in a child process: {name}: {text}")
        return payload

    def _receive(self, timeout: float, what: str):
        try:
            ready = self._conn.poll(timeout)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.close()
            raise SamplerTimeout(f"the sampler did not return within {timeout:g} s ({what}); its process was killed")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self.close()
            raise SamplerCrash(f"the sampler's process {_death(code)} while {what}") from None

    def __getattr__(self, name):
        declared = self.__dict__.get("_declared") or {}
        if name == "unvalidated" and declared.get("has_unvalidated"):
            return self._unvalidated
        if name in declared and name != "has_unvalidated":
            return declared[name]
        raise AttributeError(name)

    @property
    def name(self) -> str:
        return str(self._declared.get("name", self.spec))

    def _unvalidated(self):
        spec, sys_path, device_name, _ = self._args
        return ChildSampler(spec, sys_path=sys_path, device_name=device_name, timeout=self.timeout, unvalidated=True)

    def __call__(self, batch, **kwargs):
        if self._proc is None or not self._proc.is_alive():
            self._declared = self._start()
        try:
            self._conn.send((batch, kwargs))
        except (BrokenPipeError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self.close()
            raise SamplerCrash(f"the sampler's process {_death(code)} before the call") from None
        status, payload = self._receive(self.timeout, f"verifying a batch ({batch.summary()})")
        if status == "error":
            _raise_child_error(payload)
        return payload

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
