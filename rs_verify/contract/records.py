"""Named records of one kind, registered, looked up and sent between processes the same way: the
stream families (SPEC section 3, `streams.FAMILIES`) and the declared deviations (SPEC section 11,
`deviations.DEVIATIONS`).

A `Registry` maps every name of a record (its `name`, and its `names` where it has aliases) to the
record. `lookup(which)` takes a registered name, a `module:attribute` path of a record, or a record
(returned as is, registered or not: a user's own family or deviation); `module_path(record, ...)`
finds how an unregistered record crosses a process boundary.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable

__all__ = ["Registry", "module_path", "resolve_path"]


class Registry(dict):
    """name -> record of `kind`; `unknown(which, known_names)` words the error for a name it lacks."""

    def __init__(self, kind: type, what: str, unknown: Callable[[object, list], str]):
        super().__init__()
        self.kind, self.what, self.unknown = kind, what, unknown

    def register(self, record):
        """Add `record` under each of its names; a name taken by another record raises."""
        if not isinstance(record, self.kind):
            raise TypeError(f"expected a {self.kind.__name__}, got {type(record).__name__}")
        names = tuple(getattr(record, "names", (record.name,)))
        for n in names:
            if self.get(n, record) is not record:
                raise ValueError(f"{self.what} name {n!r} is taken by {self[n].name!r}")
        for n in names:
            self[n] = record
        return record

    def shipped(self) -> list:
        """The registered records, each once, in registration order."""
        return list({id(r): r for r in self.values()}.values())

    def registered(self, record) -> bool:
        """Whether `record` is the registered record of its name."""
        return self.get(record.name) is record

    def lookup(self, which):
        """The record of `which`: a registered name, a `module:attribute` path of a record, or a record."""
        if isinstance(which, self.kind):
            return which
        if isinstance(which, str) and which in self:
            return self[which]
        if isinstance(which, str) and which.count(":") == 1:
            found = resolve_path(which)
            if isinstance(found, self.kind):
                return found
            raise KeyError(f"{which!r} is a {type(found).__name__}, not a {self.kind.__name__}")
        raise KeyError(self.unknown(which, sorted(self)))


def resolve_path(path: str):
    """The object at `module:attribute` (dots in the attribute walk into it)."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def module_path(record, functions: Iterable[Callable]) -> str | None:
    """How a record that is not registered travels between processes: the `module:attribute` of a
    module-level attribute holding it, searched first in the modules that define `functions` (its
    own), then in every imported module (by name); None when there is none (a record built inside a
    function stays in its process)."""
    first = [getattr(fn, "__module__", None) or "" for fn in functions]
    for name in dict.fromkeys([*first, *sorted(sys.modules)]):
        mod = sys.modules.get(name)
        try:
            items = list(vars(mod).items()) if mod is not None else []
        except TypeError:  # a module object without a __dict__
            continue
        for attr, value in items:
            if value is record:
                return f"{name}:{attr}"
    return None
