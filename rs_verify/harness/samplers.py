"""Loading samplers by name or by `module:attribute` (SPEC section 10)."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys

BUILTIN = {
    "triton": "rs_verify.triton_sampler:TritonSampler",
    "reference": "rs_verify.reference:ReferenceSampler",
    # the built-in sampler drawing another stream family (SPEC 3b, 3c; 3b's step-mixed block seed)
    "triton-murmur3": "rs_verify.triton_sampler.protocol:murmur3_sampler",
    "triton-murmur3-step": "rs_verify.triton_sampler.protocol:murmur3_step_sampler",
    "triton-murmur3-fp64": "rs_verify.triton_sampler.protocol:murmur3_fp64_sampler",
    "triton-explicit": "rs_verify.triton_sampler.protocol:explicit_sampler",
    "triton-explicit-icdf": "rs_verify.triton_sampler.protocol:explicit_inverse_cdf_sampler",
    # the explicit family's tree verification with one coin per parent node (SPEC 4c)
    "triton-explicit-per-node": "rs_verify.triton_sampler.protocol:explicit_per_node_sampler",
    # the reference reading the batch's noise (SPEC 3c), verifying trees with one coin per child or per node
    "reference-explicit": "rs_verify.reference.sampler:explicit_reference",
    "reference-explicit-per-node": "rs_verify.reference.sampler:explicit_per_node_reference",
}


def import_module(module_name: str):
    """Import `module_name`; like `python -m`, a module of the current directory is found too."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        top = module_name.split(".")[0]
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)
        return importlib.import_module(module_name)


def is_factory(obj) -> bool:
    """A class or a routine (a function, a bound method, a builtin) makes samplers; anything else
    callable (an instance with `__call__`, `name` declared or not: SPEC 10 makes it optional) is one."""
    return isinstance(obj, type) or inspect.isroutine(obj) or isinstance(obj, functools.partial)


def load_sampler(spec: str, **kwargs):
    """A sampler from a built-in name (`triton`, `reference`) or `module:attribute`.

    The attribute may be a sampler instance, a class, or a factory function; classes and
    factories are called with `kwargs`.
    """
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"sampler {spec!r}: expected a built-in name {sorted(BUILTIN)} or 'module:attribute'")
    module_name, attr = target.split(":", 1)
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"sampler {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ValueError(f"sampler {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if is_factory(obj):
        obj = obj(**kwargs)
    elif kwargs:
        raise ValueError(f"sampler {spec!r} is an instance; options {sorted(kwargs)} cannot be applied")
    if not callable(obj):
        raise ValueError(f"sampler {spec!r} is not callable (SPEC section 10: __call__(batch, *, max_chunk_logits))")
    if getattr(obj, "loaded_as", None) is None:
        try:  # how to load it again: used by reproducers and failure bundles
            obj.loaded_as = spec
        except (AttributeError, TypeError):
            pass
    return obj
