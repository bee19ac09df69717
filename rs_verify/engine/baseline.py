"""The baseline of the regression gate: the sampler a change is compared with, bit for bit.

A baseline spec is either

- `module:attribute` or a built-in name (`triton`, `reference`): a sampler importable here,
  loaded in this process like `--rs-sampler`; or
- `release:NAME==VERSION[:module:attribute]`: the sampler spec (default: the one under test, the
  same adapter) loaded, in a child process, from that release installed in the release cache
  (`rs_verify.engine.release_baseline`: its site directory first on the child's path, the
  library under test's own copy left out); or
- `git:<rev>[:module:attribute]`: the sampler spec (default: the one under test) as it is at
  revision `<rev>` of the git repository around the current directory. The revision is resolved
  with `git rev-parse --verify <rev>^{commit}`, checked out into a temporary worktree
  (`git worktree add --detach`, removed by `Baseline.close()` or at exit) and loaded there in a
  child process (`isolation.ChildSampler`), so that both versions of one package run side by
  side. In the child, the modules of the worktree's top-level packages that the child imported
  from this tree (`rs_verify` itself, to run the child) are forgotten first, so that the
  sampler and everything it imports come from the revision. A built-in name means this tree's
  mapping (`samplers.BUILTIN`), looked up in the revision's files.

Anything that keeps the baseline from loading (no repository, an unknown revision, a module
that the revision lacks or that does not come from the revision, a release that cannot be
installed or whose library is not the one imported) raises `BaselineError`: the
front ends turn it into a usage error (exit status 2) with this reason.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .defaults import BASELINE_MODES as MODES, DEFAULT_MAX_SLOWDOWN, DEFAULT_TIMING_TABLE
from ..harness.record import record_of
from . import release_baseline, releases
from .isolation import ChildSampler, SamplerDied
from ..harness.samplers import BUILTIN, load_sampler

GIT_PREFIX = "git:"
DEFAULT_MODE = MODES[0]
LOADER_MODULE = "rs_verify_baseline_loader"  # written next to the worktree; loads the revision's sampler


class BaselineError(ValueError):
    """The baseline cannot be used (the message says why): a usage error, exit status 2."""


@dataclass(frozen=True)
class BaselineSpec:
    """A parsed baseline spec: what to load, and from which revision (None: this tree)."""

    text: str  # as given
    sampler_spec: str  # module:attribute or a built-in name
    rev: str | None = None  # as given after `git:`
    commit: str | None = None  # the full commit id `rev` resolves to
    repo: str | None = None  # the repository's top-level directory
    release: str | None = None  # `name==version` after `release:`
    catalogue: str | None = None  # the releases.toml its entry is read from (None: the packaged one)

    def describe(self) -> str:
        if self.release is not None:
            return f"{self.sampler_spec} at release:{self.release}"
        if self.rev is None:
            return self.sampler_spec
        return f"{self.sampler_spec} at git:{self.rev} ({self.commit[:12]})"

    def pinned(self) -> str:
        """The spec with the revision resolved to its commit (recorded in failure bundles)."""
        if self.release is not None:
            return f"{release_baseline.PREFIX}{self.release}:{self.sampler_spec}"
        return self.text if self.rev is None else f"{GIT_PREFIX}{self.commit}:{self.sampler_spec}"


def _git(repo, *args) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise BaselineError("a git: baseline needs the git command, which is not installed") from exc


def parse(text: str, *, sampler_spec: str, cwd=None, catalogue: str | None = None) -> BaselineSpec:
    """Parse and resolve a baseline spec (see the module docstring); `BaselineError` if unusable."""
    text = (text or "").strip()
    if not text:
        raise BaselineError("empty baseline spec: expected module:attribute, a built-in name, "
                            "release:NAME==VERSION[:module:attribute] or git:<rev>[:module:attribute]")
    if text.startswith(release_baseline.PREFIX):
        try:
            requirement, spec = release_baseline.split(text, sampler_spec)
        except releases.CatalogueError as exc:
            raise BaselineError(f"baseline {text!r}: {exc}") from exc
        return BaselineSpec(text=text, sampler_spec=spec, release=requirement, catalogue=catalogue)
    if not text.startswith(GIT_PREFIX):
        return BaselineSpec(text=text, sampler_spec=text)
    rev, _, spec = text[len(GIT_PREFIX):].partition(":")
    if not rev:
        raise BaselineError(f"baseline {text!r}: no revision after 'git:' (e.g. git:origin/main, git:HEAD~1)")
    spec = spec or sampler_spec
    where = Path(cwd or Path.cwd())
    top = _git(where, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise BaselineError(f"baseline {text!r}: {where} is not inside a git repository ({top.stderr.strip()})")
    repo = top.stdout.strip()
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if found.returncode != 0 or not found.stdout.strip():
        raise BaselineError(f"baseline {text!r}: unknown revision {rev!r} in the repository {repo} "
                            "(a CI checkout may need `git fetch` of that ref, or fetch-depth: 0)")
    return BaselineSpec(text=text, sampler_spec=spec, rev=rev, commit=found.stdout.strip(), repo=repo)


def import_root(repo: str, sampler_spec: str, cwd=None) -> str:
    """The directory, relative to the repository's top, that the sampler's package is imported
    from here (e.g. "" or "python"); the same directory of the worktree is put on the path."""
    module = BUILTIN.get(sampler_spec, sampler_spec).partition(":")[0]
    top_name = module.split(".")[0]
    repo_path = Path(repo).resolve()
    try:
        found = importlib.util.find_spec(top_name)
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None) if found is not None else None
    if origin:
        path = Path(origin).resolve()
        parent = path.parent.parent if path.name == "__init__.py" else path.parent
        if parent == repo_path or repo_path in parent.parents:
            return str(parent.relative_to(repo_path))
    here = Path(cwd or Path.cwd()).resolve()
    return str(here.relative_to(repo_path)) if repo_path in [here, *here.parents] else ""


# -- in the child: load the revision's sampler ------------------------------------------------


def _forget_modules_of(root: Path) -> list[str]:
    """Drop from `sys.modules` every module of a top-level package or module that `root` holds."""
    tops = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    tops |= {p.stem for p in root.glob("*.py")}
    gone = [name for name in sys.modules if name.partition(".")[0] in tops]
    for name in gone:
        del sys.modules[name]
    importlib.invalidate_caches()
    return gone


HARNESS = ("rs_verify.engine.", "rs_verify.harness.")


def load_from_tree(root: str, spec: str):
    """Load sampler `spec` from the checkout at `root` (runs in the baseline's child process)."""
    root_path = Path(root).resolve()
    if str(root_path) not in sys.path:
        sys.path.insert(0, str(root_path))
    # The harness running in this child (the call loop, its guards and the records it sends back)
    # stays this tree's: its classes must be the ones the parent unpickles. Only the sampler and
    # what it imports (the contract included) come from the revision.
    harness = {name: mod for name, mod in sys.modules.items() if name.startswith(HARNESS)}
    _forget_modules_of(root_path)
    target = BUILTIN.get(spec, spec)
    try:
        sampler = load_sampler(target)
    finally:  # a failed load leaves this tree's harness in place too, for the error it reports
        sys.modules.update(harness)
    module = sys.modules.get(target.partition(":")[0])
    origin = Path(getattr(module, "__file__", None) or "/").resolve()
    if root_path not in origin.parents:
        raise BaselineError(f"module {target.partition(':')[0]!r} was imported from {origin}, not from the "
                            f"revision's checkout {root_path}: a git: baseline must name a module of the repository")
    return sampler


_LOADER_TEXT = '''"""Written by rs_verify.engine.baseline: the baseline sampler of one git revision."""

from rs_verify.engine.baseline import load_from_tree


def sampler():
    return load_from_tree({root!r}, {spec!r})
'''


# -- the opened baseline ----------------------------------------------------------------------


@dataclass
class Baseline:
    """An opened baseline: its sampler and how the regression gate compares with it.

    - `loader`: `(spec, sys_path)` that loads the same sampler in another process (timing).
    - `mode`: "exact" (bit for bit) or "certified" (differences within the certification
      tolerance against the reference; the distribution campaigns must then pass too).
    - `max_slowdown`: the most the change may be slower (ratio of medians, CUDA only).
    - `timing_path`: where the speed comparison's table is written (Markdown), or None.
    """

    spec: BaselineSpec
    sampler: Any
    loader: tuple
    mode: str = DEFAULT_MODE
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN
    timing_path: str | None = None
    _tmp: Path | None = field(default=None, repr=False)

    def describe(self) -> str:
        name = record_of(self.sampler).name
        return f"{name} [{self.spec.describe()}]"

    def close(self) -> None:
        """Stop the child process and remove the worktree (idempotent)."""
        if isinstance(self.sampler, ChildSampler):
            self.sampler.close()
        if self._tmp is not None and self.spec.repo is None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            atexit.unregister(self.close)
            self._tmp = None
        if self._tmp is not None:
            _remove_worktree(self.spec.repo, self._tmp)
            atexit.unregister(self.close)
            self._tmp = None


def _remove_worktree(repo: str, tmp: Path) -> None:
    tree = tmp / "tree"
    if tree.exists():
        done = _git(repo, "worktree", "remove", "--force", str(tree))
        if done.returncode != 0:
            shutil.rmtree(tree, ignore_errors=True)
            _git(repo, "worktree", "prune")
    shutil.rmtree(tmp, ignore_errors=True)


def check_options(mode: str, max_slowdown: float) -> None:
    if mode not in MODES:
        raise BaselineError(f"unknown baseline mode {mode!r}; expected one of {MODES}")
    if not (max_slowdown >= 1.0 and max_slowdown < float("inf")):
        raise BaselineError(f"max slowdown must be a finite ratio >= 1, got {max_slowdown!r}")


def require_reference(mode: str, reference_spec: str | None) -> None:
    """Certified mode certifies differences against the reference: it needs one."""
    if mode == "certified" and not reference_spec:
        raise BaselineError("baseline mode 'certified' certifies differences against the reference sampler, "
                            "but the reference is disabled ('none')")


def open_baseline(text: str, *, sampler_spec: str, mode: str = DEFAULT_MODE,
                  max_slowdown: float = DEFAULT_MAX_SLOWDOWN, device: str | None = None,
                  timing_path: str | None = None, cwd=None, catalogue: str | None = None) -> Baseline:
    """Resolve and load the baseline named by `text` (see the module docstring).

    `sampler_spec` is the spec under test (the default sampler of a bare `git:<rev>`); `device`
    the backend the child uses ("cpu" or "cuda", None: its own choice). `BaselineError` when
    the baseline cannot be loaded. `catalogue`: the releases.toml a `release:` baseline's entry is
    read from (None: the packaged one).
    """
    check_options(mode, max_slowdown)
    spec = parse(text, sampler_spec=sampler_spec, cwd=cwd, catalogue=catalogue)
    options = dict(mode=mode, max_slowdown=float(max_slowdown), timing_path=timing_path)
    if spec.release is not None:
        return _open_release(spec, device, options)
    if spec.rev is None:
        try:
            sampler = load_sampler(spec.sampler_spec)
        except Exception as exc:  # noqa: BLE001 - any load failure is the usage error's reason
            raise BaselineError(f"baseline {text!r} cannot be loaded: {exc}") from exc
        return Baseline(spec, sampler, (spec.sampler_spec, []), **options)
    tmp = Path(tempfile.mkdtemp(prefix="rs-verify-baseline-"))
    try:
        added = _git(spec.repo, "worktree", "add", "--detach", str(tmp / "tree"), spec.commit)
        if added.returncode != 0:
            raise BaselineError(f"baseline {text!r}: git worktree add failed: {added.stderr.strip()}")
        root = tmp / "tree" / import_root(spec.repo, spec.sampler_spec, cwd)
        (tmp / "loader").mkdir()
        (tmp / "loader" / f"{LOADER_MODULE}.py").write_text(_LOADER_TEXT.format(root=str(root), spec=spec.sampler_spec))
        loader = (f"{LOADER_MODULE}:sampler", [str(tmp / "loader"), str(root)])
        try:
            sampler = ChildSampler(loader[0], sys_path=loader[1], device_name=device)
        except (Exception, SamplerDied) as exc:  # noqa: BLE001 - the child's load error (or its death) is the reason
            raise BaselineError(f"baseline {text!r} cannot be loaded from revision {spec.commit[:12]}: "
                                f"{str(exc).replace(repr(loader[0]), repr(spec.sampler_spec))}") from exc
    except BaseException:
        _remove_worktree(spec.repo, tmp)
        raise
    baseline = Baseline(spec, sampler, loader, _tmp=tmp, **options)
    atexit.register(baseline.close)
    return baseline


def _open_release(spec: BaselineSpec, device: str | None, options: dict) -> Baseline:
    """A `release:` baseline: the release installed in the cache, its sampler in a child process."""
    try:
        found = release_baseline.installed(spec.release, catalogue_path=spec.catalogue)
    except releases.CatalogueError as exc:
        raise BaselineError(f"baseline {spec.text!r}: {exc}") from exc
    if found.error:
        raise BaselineError(f"baseline {spec.text!r}: {found.error}")
    tmp = Path(tempfile.mkdtemp(prefix="rs-verify-baseline-"))
    try:
        release_baseline.write_loader(tmp / "loader", LOADER_MODULE, found, spec.sampler_spec)
        loader = (f"{LOADER_MODULE}:sampler", [str(tmp / "loader"), str(found.site)])
        try:
            sampler = ChildSampler(loader[0], sys_path=loader[1], device_name=device)
        except (Exception, SamplerDied) as exc:  # noqa: BLE001 - the child's load error (or its death) is the reason
            raise BaselineError(f"baseline {spec.text!r} cannot be loaded from {found.site}: "
                                f"{str(exc).replace(repr(loader[0]), repr(spec.sampler_spec))}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    baseline = Baseline(spec, sampler, loader, _tmp=tmp, **options)
    atexit.register(baseline.close)
    return baseline
