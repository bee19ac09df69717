"""The released libraries `rs-verify releases` gates: their catalogue and their installs.

A sampler author's CI installs a library from the package registry, so the gate runs the
release's own wheel, not a copy of its source. The catalogue, `rs_verify/adapters/releases.toml`
(package data; `--catalogue FILE` reads another), has one table per release, keyed by its pip
requirement:

    ["vllm==0.33.0"]
    adapters = ["rs_verify.adapters.vllm_v1:VllmV1Sampler", ...]   # module:attribute, each gated alone
    pure_python = ["pydantic==2.14.4", ...]  # what its sampler modules import, pinned, installed --no-deps
    env = { CUDA_VISIBLE_DEVICES = "" }      # environment of the gate's processes
    absent = { "module:attr" = "why" }       # adapters this release cannot have (a skip with the reason)

`install` puts the wheel (`pip install --no-deps`) and the pins into one `--target` directory per
release, `<cache>/<name>-<version>/site`, outside the repository: `~/.cache/rs-verify/releases`,
or `$RS_VERIFY_RELEASES_CACHE`, or `--cache DIR`. torch, triton and numpy are never installed
there: the gate runs on the environment's own. A finished install leaves `installed.json`
(the requirement and the pins) and is reused while they match; an install is built in a
temporary directory and renamed, so an interrupted one is never reused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (pyproject's dependencies)
    import tomli as tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

CACHE_ENV = "RS_VERIFY_RELEASES_CACHE"
DEFAULT_CACHE = Path("~/.cache/rs-verify/releases")
MARKER = "installed.json"
KEYS = {"adapters", "pure_python", "env", "absent"}
SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


class CatalogueError(ValueError):
    """A malformed catalogue or release requirement (a usage error)."""


@dataclass(frozen=True)
class Release:
    spec: str  # "vllm==0.33.0"
    adapters: tuple[str, ...] = ()
    pure_python: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    absent: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return parse_spec(self.spec)[0]

    @property
    def version(self) -> str:
        return parse_spec(self.spec)[1]


@dataclass(frozen=True)
class Installed:
    """Where a release lives, or why it could not be installed (`error`; `site` is then None)."""

    release: Release
    site: Path | None
    error: str | None = None
    reused: bool = False


def parse_spec(spec: str) -> tuple[str, str]:
    """`("vllm", "0.33.0")` from `"vllm==0.33.0"`; a CatalogueError for anything but `name==version`."""
    m = SPEC_RE.match(spec.strip())
    if not m:
        raise CatalogueError(f"{spec!r}: a release is named as pip pins it, name==version (e.g. vllm==0.33.0)")
    return m.group(1), m.group(2)


def _strings(spec: str, key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogueError(f"[{spec!r}] {key}: expected a list of strings, found {value!r}")
    return tuple(value)


def _table(spec: str, key: str, value) -> dict:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CatalogueError(f"[{spec!r}] {key}: expected a table of strings, found {value!r}")
    return dict(value)


def load_catalogue(path: str | os.PathLike | None = None) -> dict[str, Release]:
    """requirement -> Release, from `path` or the packaged releases.toml; a CatalogueError names the fault."""
    source = Path(path) if path is not None else files("rs_verify.adapters").joinpath("releases.toml")
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{source}: {exc}") from exc
    out = {}
    for spec, entry in data.items():
        parse_spec(spec)
        if not isinstance(entry, dict) or set(entry) - KEYS:
            raise CatalogueError(f"[{spec!r}]: unknown keys {sorted(set(entry) - KEYS) if isinstance(entry, dict) else entry!r}"
                                 f" (known: {sorted(KEYS)})")
        out[spec] = Release(spec, adapters=_strings(spec, "adapters", entry.get("adapters", [])),
                            pure_python=_strings(spec, "pure_python", entry.get("pure_python", [])),
                            env=_table(spec, "env", entry.get("env", {})),
                            absent=_table(spec, "absent", entry.get("absent", {})))
    return out


def cache_root(requested: str | None = None) -> Path:
    """`requested`, else `$RS_VERIFY_RELEASES_CACHE`, else `~/.cache/rs-verify/releases`."""
    return Path(requested or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def release_dir(release: Release, root: Path) -> Path:
    return root / f"{release.name}-{release.version}"


def _pip(args: list[str], timeout: float) -> str | None:
    """Run pip in this interpreter; None on success, else the reason (pip's last error line)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"pip did not finish within {timeout:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and not ln.startswith("WARNING")]
    errors = [ln for ln in lines if "ERROR" in ln]
    return (errors or lines or [f"pip exited {proc.returncode}"])[-1].strip()


def install(release: Release, root: Path, *, find_links: str | None = None, no_index: bool = False,
            offline: bool = False, timeout: float = 900.0) -> Installed:
    """The release's wheel and pins in `root/<name>-<version>/site` (reused when already there).

    - find_links: a directory of wheels pip looks in too; no_index: pip asks no registry.
    - offline: never call pip; a release not in the cache is reported as such.
    """
    home = release_dir(release, root)
    site, marker = home / "site", home / MARKER
    wanted = {"spec": release.spec, "pure_python": list(release.pure_python)}
    try:
        if json.loads(marker.read_text()) == wanted and site.is_dir():
            return Installed(release, site, reused=True)
    except (OSError, ValueError):
        pass
    if offline:
        return Installed(release, None, f"not in the cache {home} (offline: nothing is fetched)")
    source = (["--no-index"] if no_index else []) + (["--find-links", str(find_links)] if find_links else [])
    tmp = home / "site.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    error = _pip([*source, "--target", str(tmp), release.spec], timeout)
    if error:
        shutil.rmtree(tmp, ignore_errors=True)
        return Installed(release, None, f"cannot install {release.spec}: {error}")
    if release.pure_python:
        error = _pip([*source, "--target", str(tmp), *release.pure_python], timeout)
        if error:
            shutil.rmtree(tmp, ignore_errors=True)
            return Installed(release, None, f"cannot install the pins of {release.spec}: {error}")
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    marker.write_text(json.dumps(wanted, indent=1))
    return Installed(release, site)
