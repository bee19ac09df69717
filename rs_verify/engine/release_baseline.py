"""A released library as the regression gate's baseline: `release:NAME==VERSION[:module:attribute]`.

The release is installed in the release cache (`rs_verify.engine.releases.install`: its wheel and
pins in `<cache>/<name>-<version>/site`, reused when there; the catalogue's entry gives the pins
and the environment when it has one) and the sampler (default: the spec under test, the same
adapter) is loaded from it in a child process (`isolation.ChildSampler`, like a `git:` baseline):

- the release's site directory goes first on the child's import path;
- the path entries the library under test is imported from here are left out of it (an
  editable checkout, another release's site), unless the entry also holds the environment the
  child runs on (torch, numpy, triton, rs_verify: a virtual environment's site-packages), where
  the site directory ahead of it decides; an import hook on `sys.meta_path` that would hand out
  another copy of the library (an editable install's finder) is removed;
- the modules of the library imported before are forgotten, the release's `env` is set, and
  after the load every module of the library must come from the site directory, else the
  baseline is refused (`BaselineError`).

So a maintainer's editable vLLM is gated against the release users run, and `rs-verify releases
vllm==0.34.0 --baseline vllm==0.33.0` gates one release against the previous one.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import os
import sys
from pathlib import Path

from ..harness.samplers import load_sampler
from . import releases

PREFIX = "release:"
# Top-level packages of the environment the child itself runs on: a path entry that holds one
# stays on the child's path (behind the release's site directory).
ENVIRONMENT = ("rs_verify", "torch", "numpy", "triton", "hypothesis")
# The interpreter's own finders (the path finder reads the reordered `sys.path`): never removed.
STANDARD_FINDERS = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter,
                    importlib.machinery.PathFinder)


def split(text: str, sampler_spec: str) -> tuple[str, str]:
    """`("vllm==0.33.0", "module:attribute")` from `release:vllm==0.33.0[:module:attribute]`."""
    requirement, _, spec = text[len(PREFIX):].partition(":")
    releases.parse_spec(requirement)  # a CatalogueError (a ValueError) for anything but name==version
    return requirement, spec or sampler_spec


def release_of(requirement: str, catalogue_path: str | None = None) -> releases.Release:
    """The catalogue's entry for `requirement` (its pins and environment), else the bare release."""
    known = releases.load_catalogue(catalogue_path)
    return known.get(requirement) or releases.Release(requirement)


def installed(requirement: str, *, catalogue_path: str | None = None, cache: str | None = None,
              **pip) -> releases.Installed:
    """The release installed in the cache (`releases.install`; `pip`: find_links, no_index, offline)."""
    return releases.install(release_of(requirement, catalogue_path), releases.cache_root(cache), **pip)


def top_level(site: Path, name: str) -> list[str]:
    """The top-level import names the distribution `name` installed in `site` (its RECORD), else [name]."""
    want = name.lower().replace("-", "_").replace(".", "_")
    for dist in importlib.metadata.distributions(path=[str(site)]):
        if (dist.metadata["Name"] or "").lower().replace("-", "_").replace(".", "_") != want:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}
        tops = {t.removesuffix(".py") for t in tops
                if not t.endswith((".dist-info", ".data", ".pth")) and t not in ("..", "__pycache__")}
        if tops:
            return sorted(tops)
    return [want]


def _holds(entry: str, names) -> bool:
    base = Path(entry or ".")
    return any((base / n).is_dir() or (base / f"{n}.py").is_file() for n in names)


def _from(module, site: Path) -> bool:
    paths = [getattr(module, "__file__", None)] + list(getattr(module, "__path__", None) or [])
    paths = [Path(p).resolve() for p in paths if p]
    return bool(paths) and all(site in p.parents for p in paths)


def load_from_release(site: str, spec: str, packages: list[str], env: dict):
    """Load sampler `spec` with the library `packages` from the release's `site` (runs in the
    baseline's child process; see the module docstring)."""
    from .baseline import BaselineError  # lazy: engine.baseline imports this module

    os.environ.update(env)
    site_path = Path(site).resolve()
    sys.path[:] = [str(site_path)] + [p for p in sys.path if Path(p or ".").resolve() != site_path
                                      and (not _holds(p, packages) or _holds(p, ENVIRONMENT))]
    for finder in list(sys.meta_path):
        if finder in STANDARD_FINDERS or not hasattr(finder, "find_spec"):
            continue
        try:
            found = [finder.find_spec(name, None) for name in packages]
        except Exception:  # noqa: BLE001 - a finder that cannot answer hands out nothing
            continue
        if any(f is not None and f.origin and site_path not in Path(f.origin).resolve().parents for f in found):
            sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n.partition(".")[0] in packages]:
        del sys.modules[name]
    importlib.invalidate_caches()
    sampler = load_sampler(spec)
    stray = [f"{n} ({getattr(m, '__file__', None)})" for n, m in sorted(sys.modules.items())
             if n.partition(".")[0] in packages and m is not None and getattr(m, "__file__", None)
             and not _from(m, site_path)]
    if stray:
        raise BaselineError(f"modules of {', '.join(packages)} were imported from outside the release's site "
                            f"directory {site_path}: {', '.join(stray[:3])}")
    return sampler


LOADER_TEXT = '''"""Written by rs_verify.engine.release_baseline: the baseline sampler of one installed release."""

from rs_verify.engine.release_baseline import load_from_release


def sampler():
    return load_from_release({site!r}, {spec!r}, {packages!r}, {env!r})
'''


def write_loader(directory: Path, module: str, found: releases.Installed, spec: str) -> None:
    """The child's loader module `module` in `directory`: `module:sampler` loads `spec` from the release."""
    packages = top_level(found.site, found.release.name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(LOADER_TEXT.format(site=str(found.site), spec=spec, packages=packages,
                                                               env=dict(found.release.env)))


def gate_options(requirement: str, *, catalogue_path: str | None, cache: Path, find_links: str | None,
                 no_index: bool, offline: bool) -> tuple[list[str], str | None]:
    """For `rs-verify releases --baseline`: install the baseline release once, before the gate processes
    (which then find it in the cache), and the plugin options that name it; or the reason it cannot be."""
    try:
        found = installed(requirement, catalogue_path=catalogue_path, cache=str(cache), find_links=find_links,
                          no_index=no_index, offline=offline)
    except releases.CatalogueError as exc:
        return [], str(exc)
    if found.error:
        return [], f"baseline {requirement}: {found.error}"
    extra = [f"--rs-baseline-catalogue={Path(catalogue_path).resolve()}"] if catalogue_path else []
    return [f"--rs-baseline={PREFIX}{requirement}", *extra], None
