"""The contract ships with the project (issue 12): docs/SPEC.md in the repository, the same text
as package data (rs_verify/SPEC.md, printed by `rs-verify spec`), in step with the team's copy."""

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "SPEC.md"
TEAM_COPY = ROOT.parent / "shared" / "SPEC.md"  # the working copy the SPEC is edited in, when present


def test_package_data_is_the_docs_copy():
    assert (ROOT / "rs_verify" / "SPEC.md").read_bytes() == DOC.read_bytes(), \
        "rs_verify/SPEC.md must be a copy of docs/SPEC.md: cp docs/SPEC.md rs_verify/SPEC.md"
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "SPEC.md" in data["tool"]["setuptools"]["package-data"]["rs_verify"]


def test_cli_prints_the_installed_contract(capsys):
    from rs_verify.frontends.cli import main

    assert main(["spec"]) == 0
    assert capsys.readouterr().out == DOC.read_text(encoding="utf-8")
    assert main(["spec", "--path"]) == 0
    assert Path(capsys.readouterr().out.strip()).read_bytes() == DOC.read_bytes()


@pytest.mark.skipif(not TEAM_COPY.exists(), reason=f"no team copy of the SPEC at {TEAM_COPY} (a clone)")
def test_docs_copy_is_in_step_with_the_team_copy():
    assert DOC.read_bytes() == TEAM_COPY.read_bytes(), f"update docs/SPEC.md (and rs_verify/SPEC.md) from {TEAM_COPY}"
