"""Work in a spawned child process: one command channel, one message shape, one way to read a death.

The isolated sampler (`rs_verify.engine.isolation`), the worker pool of `rs-verify check --jobs`
(`rs_verify.engine.pool`) and the speed check's timing (`timing`) all run their child processes
through `Child` (pytest-xdist's worker controller is the model):

- `Child(server_cls, *args, sys_path=...)` spawns a process that puts `sys_path` first on its
  import path, builds one server, `server_cls(*args)`, and answers `("ready", server.hello)`.
- The parent sends commands, `(name, args)`, each run in the child as
  `getattr(server, name)(*args)` and answered `("ok", value)`, one at a time and in order (a
  command sent before the child is ready waits in the pipe); `None`, or a closed pipe, ends it.
- An exception raised in the child, by the set-up or by a command, is answered `("raised", ...)`
  with the fields of a `Raised`: its type and classes, its text, its traceback and the
  attributes that can cross (a `call_report`, say). The parent raises `ChildRaised` with it.
- A child that ends without answering, or does not answer within the time given (it is then
  killed), makes the parent raise `ChildDied`, whose `death` (a `Death`) reads the exit code:
  `killed by signal SIGSEGV`, `exited with status 3`, or the limit it did not answer within.

`ready(children)` waits on several children at once (their pipes and their process sentinels),
so a death is seen as soon as it happens. Children are daemons unless they start children of
their own; `stop` ends one and is safe to repeat.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

JOIN_SECONDS = 5.0  # how long a dead or killed child is waited for, and a stopped one given to end


@dataclass(frozen=True)
class Death:
    """How a child ended without an answer: its exit code (negative: the signal that killed it), or
    `timeout`, the seconds it did not answer within (it was killed then)."""

    exitcode: int | None = None
    timeout: float | None = None

    @property
    def hung(self) -> bool:
        return self.timeout is not None

    def __str__(self) -> str:
        if self.timeout is not None:
            return f"was killed after no answer within {self.timeout:.4g} s"
        code = self.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Raised:
    """An exception raised in a child, as plain values: `name` (its type's), `text`, the child's
    `traceback`, `classes` (`module.qualname` of its type and every base: `is_a` reads them) and
    `attrs`, the attributes set on it that can be pickled."""

    name: str
    text: str
    traceback: str
    classes: tuple[str, ...]
    attrs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> "Raised":
        attrs = {}
        for key, value in vars(exc).items():
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001 - an attribute that cannot cross stays behind
                continue
            attrs[key] = value
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - a broken __str__ still reports the type
            text = f"<{type(exc).__name__} whose text cannot be read>"
        return cls(type(exc).__name__, text, "".join(traceback.format_exception(exc)),
                   tuple(_qualname(c) for c in type(exc).__mro__), attrs)

    def is_a(self, cls: type) -> bool:
        """Whether the exception was an instance of `cls` (matched by module and name)."""
        return _qualname(cls) in self.classes

    def __str__(self) -> str:
        return f"{self.name}: {self.text}"


class ChildDied(Exception):
    """The child ended without answering, or was killed for not answering in time (`death`)."""

    def __init__(self, death: Death):
        super().__init__(f"the child process {death}")
        self.death = death


class ChildRaised(Exception):
    """The child answered with an exception (`raised`, a `Raised`)."""

    def __init__(self, raised: Raised):
        super().__init__(str(raised))
        self.raised = raised


def _serve(conn, sys_path: list[str], server_cls, args: tuple) -> None:
    """The child's life (see the module docstring)."""
    sys.path[:0] = sys_path
    try:
        server = server_cls(*args)
        hello = ("ready", getattr(server, "hello", None))
    except BaseException as exc:  # noqa: BLE001 - answered to the parent, which raises it
        _send_raised(conn, exc)
        return
    conn.send(hello)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        command, command_args = message
        try:
            conn.send(("ok", getattr(server, command)(*command_args)))
        except BaseException as exc:  # noqa: BLE001 - answered to the parent, which raises it
            _send_raised(conn, exc)


def _send_raised(conn, exc: BaseException) -> None:
    """Answer `("raised", fields of a Raised)`: plain values, so that the answer crosses even when a
    failed import left this module's own classes unimportable here (a baseline revision's
    checkout that lacks them, say); without its attributes if they cannot cross."""
    r = Raised.of(exc)
    try:
        conn.send(("raised", (r.name, r.text, r.traceback, r.classes, r.attrs)))
    except Exception:  # noqa: BLE001 - an attribute's class cannot be imported where it is pickled
        conn.send(("raised", (r.name, r.text, r.traceback, r.classes, {})))


class Child:
    """One spawned process serving `server_cls(*args)` (see the module docstring).

    `daemon=False` for a child that starts children of its own (a daemon may not); it ends when
    told to, when killed, or when its pipe closes (the parent is gone)."""

    def __init__(self, server_cls, *args, sys_path=(), daemon: bool = True):
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(theirs, list(sys_path), server_cls, args), daemon=daemon)
        self.process.start()
        theirs.close()
        self.ready = False  # its "ready" answer has been read
        self.hello = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return not self._conn.closed and self.process.is_alive()

    def send(self, command: str, *args) -> None:
        """Hand the child a command (it waits in the pipe while the child sets up)."""
        try:
            self._conn.send((command, args))
        except (OSError, ValueError):  # a broken pipe, or one this side closed
            raise ChildDied(self._death()) from None

    def receive(self, timeout: float | None = None) -> tuple[str, object]:
        """The child's next answer, `("ready", hello)` or `("ok", value)`, waiting at most `timeout`
        seconds (None: as long as it takes). Raises `ChildRaised` for an exception in the child and
        `ChildDied` when it ends, or is killed for not answering in time."""
        try:
            answered = self._conn.poll(timeout)
        except (EOFError, OSError):
            answered = True
        if not answered:
            self.stop()
            raise ChildDied(Death(timeout=timeout))
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise ChildDied(self._death()) from None
        if kind == "raised":
            raise ChildRaised(Raised(*value))
        if kind == "ready":
            self.ready, self.hello = True, value
        return kind, value

    def start(self, timeout: float | None = None):
        """Wait for the child to be set up (at most `timeout` seconds); its `hello`."""
        while not self.ready:
            self.receive(timeout)
        return self.hello

    def ask(self, command: str, *args, timeout: float | None = None):
        """Run `command(*args)` in the child; its value (at most `timeout` seconds for the set-up, if
        still under way, and as many for the answer)."""
        self.start(timeout)
        self.send(command, *args)
        return self.receive(timeout)[1]

    def stop(self, grace: float = 0.0) -> None:
        """End the child: with `grace`, ask it to end and give it that many seconds; then kill it."""
        if self._conn.closed:
            return
        if grace and self.process.is_alive():
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self.process.join(grace)
        if self.process.is_alive():
            self.process.kill()
        self.process.join(JOIN_SECONDS)
        self._conn.close()

    def _death(self) -> Death:
        """The death of a child whose pipe closed (it is stopped, if it lingers)."""
        self.process.join(JOIN_SECONDS)
        code = self.process.exitcode
        self.stop()
        return Death(exitcode=code)

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def ready(children: list[Child], timeout: float | None = None) -> list[Child]:
    """Those of `children` with an answer to read or a death to report, after waiting at most
    `timeout` seconds (None: until there is one)."""
    handles = {}
    for child in children:
        handles[child._conn] = handles[child.process.sentinel] = child
    hit = set(wait(list(handles), timeout))
    return [c for c in children if c._conn in hit or c.process.sentinel in hit]
