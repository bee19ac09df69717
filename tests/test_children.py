"""The one child-process module (`rs_verify.harness.children`): an answer, an exception in the child
(with its traceback), an exit status and a hang are each read one way. A signal is read by the
isolated segfaulting sampler's tests (test_misbehaving.py)."""

import os
import time

import pytest

from rs_verify.harness import children


class Server:
    """A child's server with a command for each way a command can end."""

    hello = "ready to serve"

    def __init__(self, fail_setup: bool = False):
        if fail_setup:
            raise LookupError("no such sampler")

    def echo(self, value):
        return value

    def fail(self):
        exc = KeyError("missing")
        exc.call_report = {"seconds": 1.5}  # crosses with it
        exc.live = lambda: None  # cannot be pickled: stays behind
        raise exc

    def exit(self, status: int):
        os._exit(status)

    def sleep(self, seconds: float):
        time.sleep(seconds)


def test_answers_exceptions_and_deaths_are_read_one_way():
    child = children.Child(Server)
    try:
        child.send("echo", [1, 2])  # waits in the pipe while the child sets up
        assert child.receive(60) == ("ready", "ready to serve") and child.ready
        assert child.receive(60) == ("ok", [1, 2])
        with pytest.raises(children.ChildRaised) as info:
            child.ask("fail", timeout=60)
        raised = info.value.raised
        assert raised.is_a(LookupError) and not raised.is_a(ValueError) and str(raised) == "KeyError: 'missing'"
        assert "in fail" in raised.traceback and raised.attrs == {"call_report": {"seconds": 1.5}}
        assert child.ask("echo", 3, timeout=60) == 3  # it serves on after an exception
        with pytest.raises(children.ChildDied, match="exited with status 3") as died:
            child.ask("exit", 3, timeout=60)
        assert died.value.death == children.Death(exitcode=3) and not child.alive
        with pytest.raises(children.ChildDied):  # a dead child takes no command
            child.send("echo", 4)
    finally:
        child.stop()


def test_a_failed_set_up_is_raised_and_a_hang_is_killed():
    broken = children.Child(Server, True)
    with pytest.raises(children.ChildRaised, match="LookupError: no such sampler"):
        broken.start(60)
    broken.stop()
    hanging = children.Child(Server)
    hanging.start(60)
    with pytest.raises(children.ChildDied, match="killed after no answer within 0.5 s") as died:
        hanging.ask("sleep", 60, timeout=0.5)
    assert died.value.death.hung and not hanging.process.is_alive()
