"""Versions of the software a result depends on (recorded in bundles and reports)."""

from __future__ import annotations

import platform
from importlib import metadata

import numpy as np

from .. import __version__


def versions() -> dict:
    """Versions of Python and the packages a result depends on (without importing torch or triton)."""
    out = {"python": platform.python_version(), "numpy": np.__version__, "rs_verify": __version__}
    for name in ("torch", "triton", "hypothesis", "scipy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
