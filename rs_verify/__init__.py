"""rs-verify: a verification and equivalence suite for speculative-decoding rejection samplers.

The top level exposes the contract (SPEC.md): batch types, validation and the
chunk planner. The Triton sampler is imported lazily (`rs_verify.TritonSampler`)
so that importing the contract never imports torch or triton.
"""

from .contract.batch import LogprobsTensors, SamplerOutput, SpecBatch
from .contract.chunking import (
    DEFAULT_CAP_BYTES,
    iter_request_chunks,
    max_chunk_logits,
    select_requests,
    slice_batch,
    verify_chunked,
)
from .contract.validation import validate

__all__ = [
    "DEFAULT_CAP_BYTES",
    "LogprobsTensors",
    "SamplerOutput",
    "SpecBatch",
    "TritonSampler",
    "iter_request_chunks",
    "max_chunk_logits",
    "select_requests",
    "slice_batch",
    "validate",
    "verify_chunked",
]

__version__ = "0.1.0"

class _SourceFolders:
    """Import `rs_verify.reference` and `rs_verify.strategies` from a source checkout used without
    installing it (`PYTHONPATH=checkout`): the repository keeps them as top-level folders, and the
    installed distribution maps them under `rs_verify` (pyproject's package-dir). Consulted only
    when the ordinary import finds nothing (an installed wheel has them inside `rs_verify/`)."""

    FOLDERS = {"rs_verify.reference": "reference", "rs_verify.strategies": "strategies"}

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        import importlib.util  # lazy: only a source checkout without an install needs it
        from pathlib import Path  # lazy: as above

        folder = cls.FOLDERS.get(fullname)
        if folder is None:
            return None
        here = Path(__file__).resolve().parent
        root = here.parent
        init = root / folder / "__init__.py"
        # Only in this package's own source checkout (its pyproject beside it), never in site-packages.
        if (here / folder).exists() or not (root / "pyproject.toml").is_file() or not init.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def _install_source_folders() -> None:
    import sys  # lazy: kept out of the package namespace

    if not any(isinstance(f, type) and f.__name__ == "_SourceFolders" for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFolders)


_install_source_folders()

# `pytest -p rs_verify` without the installed pytest11 entry point imports this package as
# the plugin: point pytest at the plugin module (read by pytest only, imports nothing here).
pytest_plugins = ["rs_verify.frontends.plugin"]


def __getattr__(name):
    if name == "TritonSampler":
        from .triton_sampler import TritonSampler  # lazy: the contract alone never imports torch or triton

        return TritonSampler
    raise AttributeError(f"module 'rs_verify' has no attribute {name!r}")
