"""Expected failures: a file of properties known to fail (`--rs-xfails FILE`, `--xfails FILE`).

A project can adopt the gate while it tracks a known defect without deselecting the property
(which would hide every other failure of it too); array-api-tests' `--xfails-file` is the
model. The file has one entry per line:

    PROPERTY REASON... [match: REGEX]

- `PROPERTY`: a registered property name (`rs-verify list`; `rs-verify::PROPERTY`, the plugin's
  item id, is accepted too);
- `REASON`: why it is expected to fail (required: an issue link, a defect's name);
- `match: REGEX` (optional, at the end): a Python regular expression that must be found
  (`re.search`) in the failure's message, the `<ExceptionType>: <text>` line(s) the report
  prints first. The first ` match:` of the line starts the pattern, so a reason never
  contains one and a pattern may.

Blank lines and `#` comments (a line whose first non-blank character is `#`) are ignored.
An unknown property, a line without a reason, an empty or invalid pattern and a property
listed twice are usage errors (`XfailsError`; exit 2 in both front ends).

Verdicts (`judge`): a listed property that fails, and whose message matches, is an expected
failure (`xfail`: pytest's xfailed outcome; the CLI's `xfail` status, exit 0); one that passes
is a strict failure (`XPASS(strict)`: the defect is fixed, remove the line); one that fails
differently is an ordinary failure (with a note saying which line expected what); a skipped
property stays skipped. Imports only the standard library and the engine's records.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from ..engine.records import XPASS, Failure, Outcome

PREFIX = "rs-verify::"
_LINE = re.compile(r"(?P<prop>\S+)(?:\s+(?P<rest>.*))?$")
_MATCH = re.compile(r"(?:^|\s)match:")


class XfailsError(ValueError):
    """The expected-failures file cannot be used (the message names the file and the line)."""


@dataclass(frozen=True)
class Expected:
    """One entry: `property` is expected to fail for `reason`, its message matching `pattern`."""

    property: str
    reason: str
    pattern: str | None = None
    where: str = ""  # "FILE:LINE", for messages

    def matches(self, failure: Failure) -> bool:
        return self.pattern is None or re.search(self.pattern, failure.message) is not None

    def describe(self) -> str:
        return f"{self.where} ({self.reason}" + (f"; match: {self.pattern}" if self.pattern else "") + ")"


def parse(text: str, known, source: str = "<xfails>") -> dict[str, Expected]:
    """The entries of an expected-failures file's `text`; `known`: the property names."""
    known = set(known)
    out: dict[str, Expected] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        m = _LINE.match(line)
        prop, rest = m.group("prop").removeprefix(PREFIX), (m.group("rest") or "").strip()
        reason, pattern = rest, None
        cut = _MATCH.search(rest)
        if cut is not None:
            reason, pattern = rest[: cut.start()].strip(), rest[cut.end():].strip()
            if not pattern:
                raise XfailsError(f"{where}: 'match:' without a pattern")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise XfailsError(f"{where}: invalid pattern {pattern!r}: {exc}") from None
        if prop not in known:
            raise XfailsError(f"{where}: unknown property {prop!r} (see `rs-verify list`)")
        if not reason:
            raise XfailsError(f"{where}: {prop}: say why it is expected to fail (PROPERTY REASON... [match: REGEX])")
        if prop in out:
            raise XfailsError(f"{where}: {prop} is listed twice (first at {out[prop].where})")
        out[prop] = Expected(prop, reason, pattern, where)
    return out


def load(path, known) -> dict[str, Expected]:
    """The entries of the file at `path` (`XfailsError` when it cannot be read or used)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise XfailsError(f"cannot read the expected-failures file {path}: {exc}") from None
    return parse(text, known, source=str(path))


def judge(outcome: Outcome, expected: Expected | None, *, sampler: str = "") -> Outcome:
    """The outcome as the expected-failures file makes it (see the module docstring)."""
    if expected is None or outcome.status == "skipped":
        return outcome
    if outcome.status == "passed":
        return dataclasses.replace(outcome, status="failed", failure=Failure(
            property=outcome.name, sampler=sampler, kind=XPASS, replayable=False,
            message=f"[XPASS(strict)] {outcome.name} passed but is listed as an expected failure at "
                    f"{expected.describe()}: remove the line once the defect is fixed"))
    failure = outcome.failure
    if failure is not None and expected.matches(failure):
        return dataclasses.replace(outcome, status="xfail", reason=expected.reason)
    if failure is not None:
        failure.notes.insert(0, f"(listed as an expected failure at {expected.describe()}, but this failure's "
                                "message does not match: an ordinary failure)")
    return outcome
