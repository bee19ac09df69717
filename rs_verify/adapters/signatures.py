"""The check every adapter makes of the call it wraps, before any batch: the parameters it passes by name
exist, and the call requires none it does not know (a release that added one changed the convention)."""

from __future__ import annotations

import inspect

__all__ = ["check_parameters"]

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def check_parameters(fn, passes, adapter: str, *, name: str | None = None):
    """`fn`'s parameters; a TypeError naming those of `passes` it lacks and those it requires (no default,
    not `self`, not variadic) that `passes` does not name. `adapter` names the adapter in the message."""
    params = inspect.signature(fn).parameters
    passes = list(passes)
    missing = [p for p in passes if p not in params]
    unknown = [p.name for p in params.values() if p.name not in passes and p.name != "self"
               and p.default is inspect.Parameter.empty and p.kind not in _VARIADIC]
    if missing or unknown:
        raise TypeError(f"{name or getattr(fn, '__name__', fn)}{tuple(params)}: the {adapter} adapter passes {passes}"
                        + (f"; this one lacks {missing}" if missing else "")
                        + (f"; it refuses the parameters it does not know: {unknown}" if unknown else "")
                        + ": the calling convention changed")
    return params
