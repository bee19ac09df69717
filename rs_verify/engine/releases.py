"""The released libraries `rs-verify releases` gates: what to install and where it lives.

A sampler author's CI installs a library from the package registry, so the gate runs the
release's own wheel, not a copy of its source. Any release of a package an adapter gates
(`rs_verify.adapters.discovery`) needs nothing written down: `target` reads `vllm==0.32.0`,
`vllm` (the newest release) or a wheel's path (a release candidate); `install` resolves its
dependencies from the wheel's metadata (`rs_verify.engine.resolve`) and the adapters it offers are
read from its installed files. The catalogue, `rs_verify/adapters/releases.toml` (package data;
`--catalogue FILE` reads another), overrides that per release, keyed by its pip requirement:

    ["vllm==0.33.0"]
    adapters = ["rs_verify.adapters.vllm_v1:VllmV1Sampler", ...]   # module:attribute, each gated alone
    pure_python = ["pydantic==2.14.4", ...]  # what its sampler modules import, pinned, installed --no-deps
    env = { CUDA_VISIBLE_DEVICES = "" }      # environment of the gate's processes
    absent = { "module:attr" = "why" }       # adapters this release cannot have (a skip with the reason)
    leave_out = { "pkg" = "why" }            # direct requirements the resolver leaves out (with the reason)

Every key is optional: a catalogue entry without `pure_python` has its pins resolved, one without
`adapters` has them discovered.

`install` puts the wheel (`pip install --no-deps`) and the pins into one `--target` directory per
release, `<cache>/<name>-<version>/site`, outside the repository: `~/.cache/rs-verify/releases`,
or `$RS_VERIFY_RELEASES_CACHE`, or `--cache DIR`. torch, triton and numpy are never installed
there: the gate runs on the environment's own. A finished install leaves `installed.json`
(the requirement, the pins and what was left out) and is reused while the catalogue's pins, when
it gives any, match; an install is built in a temporary directory and renamed, so an interrupted
one is never reused.
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
from dataclasses import dataclass, field, replace
from importlib.resources import files
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import resolve as resolver

CACHE_ENV = "RS_VERIFY_RELEASES_CACHE"
DEFAULT_CACHE = Path("~/.cache/rs-verify/releases")
MARKER = "installed.json"
KEYS = {"adapters", "pure_python", "env", "absent", "leave_out"}
SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


class CatalogueError(ValueError):
    """A malformed catalogue or release requirement (a usage error)."""


@dataclass(frozen=True)
class Release:
    spec: str  # "vllm==0.33.0"
    adapters: tuple[str, ...] = ()  # () = the adapters the installed release offers (discovery)
    pure_python: tuple[str, ...] = ()  # () = resolved from the wheel's metadata, unless `pinned`
    env: dict = field(default_factory=dict)
    absent: dict = field(default_factory=dict)
    wheel: str | None = None  # a wheel file to install instead of the registry's (a release candidate)
    leave_out: dict = field(default_factory=dict)  # direct requirement -> why it is not resolved
    pinned: bool = False  # `pure_python` is the catalogue's, even when empty

    @property
    def name(self) -> str:
        return self.spec.partition("==")[0]

    @property
    def version(self) -> str:
        """"" for a release named without its version (the newest, resolved at install)."""
        return self.spec.partition("==")[2]


@dataclass(frozen=True)
class Installed:
    """Where a release lives, or why it could not be installed (`error`; `site` is then None)."""

    release: Release
    site: Path | None
    error: str | None = None
    reused: bool = False
    pins: tuple[str, ...] = ()  # what was installed beside the wheel
    left_out: dict = field(default_factory=dict)  # package -> why it was not installed (resolved pins only)


def parse_spec(spec: str) -> tuple[str, str]:
    """`("vllm", "0.33.0")` from `"vllm==0.33.0"`; a CatalogueError for anything but `name==version`."""
    m = SPEC_RE.match(spec.strip())
    if not m:
        raise CatalogueError(f"{spec!r}: a release is named as pip pins it, name==version (e.g. vllm==0.33.0)")
    return m.group(1), m.group(2)


def target(text: str, known: dict[str, Release] | None = None, root: Path | None = None,
           offline: bool = False) -> Release:
    """The release a command line names: `name==version` (its catalogue entry, if any), a wheel's
    path (`name-version-...whl`: that file is installed), or `name` alone: the newest release, which
    the resolver names (`newest`), or offline the newest one in the cache."""
    known = known or {}
    if text.endswith(".whl"):
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise CatalogueError(f"{text}: no such wheel")
        parts = path.name.split("-")
        if len(parts) < 3:
            raise CatalogueError(f"{text}: not a wheel's name (name-version-...-tags.whl)")
        spec = f"{parts[0]}=={parts[1]}"
        return replace(known.get(spec, Release(spec)), wheel=str(path))
    if SPEC_RE.match(text.strip()):
        return known.get(text.strip(), Release(text.strip()))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text.strip()):
        raise CatalogueError(f"{text!r}: a release is named as pip pins it, name==version (e.g. vllm==0.33.0), "
                             f"by name alone (its newest release) or by a wheel's path")
    if offline and root is not None:
        cached = cached_versions(text.strip(), root)
        if not cached:
            raise CatalogueError(f"{text}: no release of it in the cache {root} (offline: nothing is fetched)")
        return known.get(f"{text.strip()}=={cached[-1]}", Release(f"{text.strip()}=={cached[-1]}"))
    return Release(f"{text.strip()}==")  # resolved to the newest at install


def cached_versions(name: str, root: Path) -> list[str]:
    """The versions of `name` with a finished install in the cache, oldest first."""
    versions = []
    for marker in root.glob(f"*/{MARKER}"):
        try:
            n, v = parse_spec(json.loads(marker.read_text())["spec"])
        except (OSError, ValueError, KeyError, CatalogueError):
            continue
        if resolver.canonical(n) == resolver.canonical(name):
            versions.append(v)

    def key(v):
        try:
            return (0, Version(v))
        except InvalidVersion:
            return (1, v)
    return sorted(versions, key=key)


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
                            absent=_table(spec, "absent", entry.get("absent", {})),
                            leave_out=_table(spec, "leave_out", entry.get("leave_out", {})),
                            pinned="pure_python" in entry)
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

    - pins: the catalogue's when it gives them, else resolved from the wheel's metadata
      (`rs_verify.engine.resolve`); a release named without a version is resolved to the newest.
    - find_links: a directory of wheels pip looks in too; no_index: pip asks no registry.
    - offline: never call pip; a release not in the cache is reported as such.
    """
    if release.version:
        reused = _cached(release, root)
        if reused is not None:
            return reused
    if offline:
        return Installed(release, None, f"not in the cache {release_dir(release, root)} (offline: nothing is fetched)")
    source = (["--no-index"] if no_index else []) + (["--find-links", str(find_links)] if find_links else [])
    pins, left_out, wheel = release.pure_python, {}, release.wheel
    if not release.pinned or not release.version:
        found = resolver.resolve(release.wheel or release.spec.rstrip("="), downloads=root / "downloads",
                                 find_links=find_links, no_index=no_index, timeout=timeout,
                                 leave_out=release.leave_out)
        if found.error:
            return Installed(release, None, f"cannot resolve the dependencies of {release.spec.rstrip('=')}: {found.error}")
        if not release.version:
            release = replace(release, spec=f"{release.name}=={found.version}")
            reused = _cached(release, root)
            if reused is not None:
                return reused
        if not release.pinned:
            pins, left_out = found.pins, found.left_out
        wheel = found.wheel  # fetched once: installed from the file
    home = release_dir(release, root)
    site, marker = home / "site", home / MARKER
    tmp = home / "site.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    error = _pip([*source, "--target", str(tmp), wheel or release.spec], timeout)
    if error:
        shutil.rmtree(tmp, ignore_errors=True)
        return Installed(release, None, f"cannot install {release.spec}: {error}")
    if pins:
        error = _pip([*source, "--target", str(tmp), *pins], timeout)
        if error:
            shutil.rmtree(tmp, ignore_errors=True)
            return Installed(release, None, f"cannot install the pins of {release.spec}: {error}")
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    marker.write_text(json.dumps({"spec": release.spec, "pure_python": list(pins), "left_out": left_out,
                                  "wheel": release.wheel}, indent=1))
    return Installed(release, site, pins=tuple(pins), left_out=left_out)


def _cached(release: Release, root: Path) -> Installed | None:
    """The finished install of `release` in the cache, if its pins are the ones asked for."""
    home = release_dir(release, root)
    try:
        found = json.loads((home / MARKER).read_text())
    except (OSError, ValueError):
        return None
    pins = tuple(found.get("pure_python", ()))
    same = found.get("spec") == release.spec and (not release.pinned or pins == release.pure_python)
    if release.wheel:  # a candidate's wheel is reinstalled unless it is the same file
        same = same and found.get("wheel") == release.wheel
    if not same or not (home / "site").is_dir():
        return None
    return Installed(release, home / "site", reused=True, pins=pins, left_out=found.get("left_out", {}))
