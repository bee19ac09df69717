"""Load a patched copy of a package from memory: planted bugs ("mutants") without editing files.

`load_patched("rs_verify.triton_sampler", {"kernels.py": [(old, new)]})` imports a fresh
copy of the package under a private name (a sibling of the package inside its parent, so
relative imports of the parent keep working) in which each listed module has `old` replaced
by `new` (exactly once, or the patch is rejected). The copy's source lives in memory and
is served by its loader, so `inspect.getsource` (and therefore `triton.jit`) sees the
patched text. The original package is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import sys
from pathlib import Path

_counter = itertools.count()


class PatchError(ValueError):
    """A patch does not apply: its `old` text is missing or ambiguous."""


class _MemoryLoader(importlib.abc.SourceLoader):
    def __init__(self, fullname: str, path: str, source: str):
        self.fullname, self.path, self.source = fullname, path, source

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        return self.source.encode()

    def get_source(self, fullname):
        return self.source


class _MemoryFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: str, files: dict[str, tuple[str, str]]):
        self.root, self.files = root, files  # module name -> (fake path, source)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.files:
            return None
        fake, source = self.files[fullname]
        loader = _MemoryLoader(fullname, fake, source)
        is_pkg = fake.endswith("__init__.py")
        return importlib.util.spec_from_loader(fullname, loader, is_package=is_pkg)


def apply_patch(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise PatchError(f"{where}: expected exactly one occurrence of {old!r}, found {count}")
    return text.replace(old, new)


def load_patched(package: str, patches: dict[str, list[tuple[str, str]]]):
    """Import a patched copy of `package` (a directory package) and return it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not a package")
    root = Path(list(spec.submodule_search_locations)[0])
    # A subpackage's copy lives inside the same parent package, so that its relative
    # imports of the parent (`from ..batch import SpecBatch`) resolve to the real modules.
    parent = package.rpartition(".")[0]
    alias = f"{parent + '.' if parent else ''}_rs_mutant_{next(_counter)}"
    files = {}
    unknown = set(patches) - {p.name for p in root.glob("*.py")}
    if unknown:
        raise PatchError(f"{package}: no module files {sorted(unknown)}")
    for path in sorted(root.glob("*.py")):
        text = path.read_text()
        for old, new in patches.get(path.name, []):
            text = apply_patch(text, old, new, f"{package}/{path.name}")
        name = alias if path.name == "__init__.py" else f"{alias}.{path.stem}"
        files[name] = (f"<mutant {alias}>/{path.name}", text)
    # The finder stays installed (it answers for this alias only) so that lazy imports
    # inside the copy keep resolving to the patched modules.
    sys.meta_path.insert(0, _MemoryFinder(alias, files))
    return importlib.import_module(alias)
