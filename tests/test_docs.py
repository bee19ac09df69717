"""The documentation's option tables are in step with the code: docs/options.md has one table for
the pytest plugin and one per `rs-verify` command; every option the code defines has a row, every
row names an option that exists, and a default written as a value is the code's default. The
README's and the docs' relative links lead to files that exist."""

import argparse
import re
from pathlib import Path

import pytest

from rs_verify.frontends import cli, plugin

ROOT = Path(__file__).resolve().parents[1]
OPTIONS_DOC = ROOT / "docs" / "options.md"
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")


def _tables(text: str) -> dict[str, list[list[str]]]:
    """Each heading's option table: the rows (cells) under `| option | default | meaning |`."""
    tables, heading, rows = {}, None, None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, rows = line.lstrip("#").strip(), None
        elif line.startswith("| option | default |"):
            rows = tables.setdefault(heading, [])
        elif rows is not None and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
        elif not line.strip():
            rows = None
    return tables


def _documented(rows) -> dict[str, str]:
    """Option string -> its row's default cell."""
    return {opt: default for name, default, *_ in rows for opt in OPTION.findall(name)}


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def _check(where: str, defined: dict[str, object], rows) -> None:
    """`defined` maps each option's strings (joined by ', ') to its default."""
    documented = _documented(rows)
    flat = {opt: default for names, default in defined.items() for opt in names.split(", ")}
    missing = sorted(set(flat) - set(documented))
    unknown = sorted(set(documented) - set(flat))
    assert not missing, f"{where}: options without a row in docs/options.md: {missing}"
    assert not unknown, f"{where}: rows of docs/options.md for options that do not exist: {unknown}"
    for opt, default in flat.items():
        cell = documented[opt]
        if default in (None, False):
            assert not cell.startswith("`"), \
                f"{where}: {opt} has no fixed default in the code, the table shows {cell}"
        else:
            assert cell == f"`{_shown(default)}`", \
                f"{where}: {opt} defaults to {_shown(default)!r} in the code, the table shows {cell}"


class _Group:
    """Stands in for pytest's option group: records what the plugin adds."""

    def __init__(self):
        self.options = {}

    def addoption(self, *names, **kwargs):
        self.options[", ".join(names)] = kwargs.get("default")

    def getgroup(self, *args, **kwargs):
        return self


@pytest.fixture(scope="module")
def tables():
    return _tables(OPTIONS_DOC.read_text(encoding="utf-8"))


def test_plugin_options_match_the_table(tables):
    group = _Group()
    plugin.pytest_addoption(group)
    assert group.options, "the plugin added no options"
    _check("pytest plugin", group.options, tables["The pytest plugin"])


def _commands():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_cli_options_match_the_table(tables, command):
    parser = _commands()[command]
    defined = {", ".join(a.option_strings): a.default for a in parser._actions
               if a.option_strings and not isinstance(a, argparse._HelpAction)}
    heading = next((h for h in tables if h.startswith(f"`rs-verify {command}")), None)
    if heading is None:
        assert not defined, f"rs-verify {command} has options but docs/options.md has no table for it"
        assert any(h.startswith(f"`rs-verify {command}") for h in _headings()), \
            f"docs/options.md has no section for rs-verify {command}"
        return
    _check(f"rs-verify {command}", defined, tables[heading])


def _headings():
    return [line.lstrip("#").strip() for line in OPTIONS_DOC.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")]


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md")),
                                  "benchmarks/NOTES.md"])
def test_relative_links_lead_to_files_and_headings(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    broken = []
    for target, anchor in LINK.findall(text) + [(page.rsplit("/", 1)[-1], a) for a in SELF_LINK.findall(text)]:
        if "://" in target:
            continue
        linked = path.parent / target
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor[1:] not in _anchors(linked)):
            broken.append(target + anchor)
    assert not broken, f"{page} links to missing files or headings: {broken}"


SELF_LINK = re.compile(r"\]\((#[^)]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}
