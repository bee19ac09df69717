"""Whether a sampler runs Triton code: read from the code behind it, without calling it, so the
record can say that the suite runs that code through the interpreter (SPEC 10's `interpreted`).

The code a sampler runs is what its methods and the callables it holds name, followed through
the functions, classes and modules those names resolve to: a Triton kernel (a `KernelInterface`:
`@triton.jit`, interpreted or compiled, an autotuner over one) among them makes the sampler run
Triton. A module's other globals do not: a library file that holds a Triton version and a torch
version of one algorithm (SGLang DSpark's `blockwise_rejection_triton` / `_torch`) runs Triton
only in the sampler that calls the first. A module the sampler holds (a namespace of functions it
calls by attribute) counts as named whole.
"""

from __future__ import annotations

import sys
import types
import weakref

# Packages whose functions are not followed: no sampler's kernel lives there, and they are large.
OPAQUE = ("torch", "numpy", "triton", "scipy", "hypothesis", "keras", "jax", "tensorflow", "builtins")
BUDGET = 20_000  # code objects and module lookups visited at most, whatever the sampler holds
_KNOWN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # sampler -> answer (a walk takes ~0.2 s)


def runs_triton(sampler) -> bool:
    """Whether any Triton kernel is reachable from the sampler's code (module docstring). Read
    without calling the sampler, so a sampler that crashes is still loaded cleanly."""
    try:
        return _KNOWN[sampler]
    except (KeyError, TypeError):  # not walked yet, or not weakly referable / hashable: walked each time
        pass
    found = _walk(sampler)
    try:
        _KNOWN[sampler] = found
    except TypeError:
        pass
    return found


def _walk(sampler) -> bool:
    triton = sys.modules.get("triton")
    kinds = _kernel_types(triton) if triton is not None else ()
    if not kinds:
        return False
    todo: list = [v for c in type(sampler).__mro__ if c is not object for v in vars(c).values()]
    todo += _attributes(sampler)
    seen: set[int] = set()
    budget = BUDGET
    while todo and budget > 0:
        value = todo.pop()
        if isinstance(value, kinds):
            return True
        if id(value) in seen:
            continue
        seen.add(id(value))
        budget -= 1
        todo += _named_by(value)
    return False


def _opaque(module_name: str | None) -> bool:
    return not module_name or module_name.split(".", 1)[0] in OPAQUE


def _named_by(value) -> list:
    """What `value` names: a function's (or method's, property's) globals and the attributes of the
    modules among them that its code spells; a class's members; a held module's globals."""
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset) if f is not None]
    if isinstance(value, types.MethodType):
        return [value.__func__]
    if isinstance(value, types.ModuleType):
        return [] if _opaque(value.__name__) else list(vars(value).values())
    if isinstance(value, type):
        return [] if _opaque(value.__module__) else [v for c in value.__mro__ if c is not object
                                                     for v in vars(c).values()]
    if isinstance(value, types.FunctionType):
        if _opaque(value.__module__):
            return []
        names = _code_names(value.__code__)
        scope = value.__globals__
        out = [scope[n] for n in names if n in scope]
        out += [c.cell_contents for c in value.__closure__ or () if _filled(c)]
        modules = [m for m in out if isinstance(m, types.ModuleType) and not _opaque(m.__name__)]
        out += [vars(m)[n] for m in modules for n in names if n in vars(m)]
        wrapped = getattr(value, "__wrapped__", None)
        return out + ([wrapped] if wrapped is not None else [])
    if callable(value) and not _opaque(type(value).__module__):  # an instance with __call__: a wrapped sampler
        return [v for c in type(value).__mro__ if c is not object for v in vars(c).values()] + _attributes(value)
    return []


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _kernel_types(triton) -> tuple:
    out = []
    jit = getattr(getattr(triton, "runtime", None), "jit", None)
    for holder, name in ((jit, "KernelInterface"), (jit, "JITFunction"),
                         (sys.modules.get("triton.runtime.interpreter"), "InterpretedFunction")):
        t = getattr(holder, name, None)
        if isinstance(t, type):
            out.append(t)
    return tuple(out)


def _attributes(sampler) -> list:
    try:
        return list(vars(sampler).values())
    except TypeError:  # no __dict__ (slots)
        return []
