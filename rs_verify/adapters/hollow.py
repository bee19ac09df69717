"""Import one file of an installed library without running its package's `__init__`.

LMDeploy's and keras-hub's top-level `__init__` import their whole stack (a serving engine, every
model and tokenizer); their samplers' files need a few modules. `import_file` registers the
packages named in `hollow` as empty packages over their installed directories (only when the
library is not imported already), so each file's own imports still run as the library wrote them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def import_file(name: str, hollow: tuple[str, ...], adapter: str, release: str):
    """The module `name`; `hollow`: its packages whose `__init__` is not run (top-level first);
    an ImportError names the `adapter`, the file and the `release` to install."""
    top = hollow[0]
    if top not in sys.modules:
        spec = importlib.util.find_spec(top)  # a top-level package: found, not executed
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{adapter} needs {release}: no module named {top!r}", name=top)
        root = list(spec.submodule_search_locations)[0]
        for pkg in hollow:
            module = types.ModuleType(pkg)
            module.__path__ = ["/".join([root, *pkg.split(".")[1:]])]
            module.__package__ = pkg
            sys.modules.setdefault(pkg, module)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{adapter} needs {name} of {release}, which could not be imported: {exc}") from exc
