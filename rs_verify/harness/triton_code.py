"""Whether a sampler runs Triton code: read from the modules behind it, without calling it, so
the record can say that the suite runs that code through the interpreter (SPEC 10's `interpreted`)."""

from __future__ import annotations

import sys
import types


def runs_triton(sampler) -> bool:
    """Whether the sampler's code holds Triton kernels: a Triton JIT function (compiled or
    interpreted) among the globals of its class's module or package, of the modules those
    import, or of the modules that define the callables it holds (a wrapped `rejection_sample`).
    Read without calling the sampler, so a sampler that crashes is still loaded cleanly."""
    triton = sys.modules.get("triton")
    if triton is None:
        return False
    kinds = _jit_types(triton)
    if not kinds:
        return False
    seen: set[str] = set()
    modules = [sys.modules.get(type(sampler).__module__)]
    package = type(sampler).__module__.rpartition(".")[0]
    if package:
        modules += [m for n, m in list(sys.modules.items()) if n == package or n.startswith(package + ".")]
    modules += [sys.modules.get(getattr(v, "__module__", None) or "") for v in _attributes(sampler) if callable(v)]
    for depth in range(2):
        nxt = []
        for mod in modules:
            if not isinstance(mod, types.ModuleType) or mod.__name__ in seen or mod.__name__.startswith("triton"):
                continue
            seen.add(mod.__name__)
            for value in list(vars(mod).values()):
                if isinstance(value, kinds):
                    return True
                if depth == 0:
                    owner = value if isinstance(value, types.ModuleType) else sys.modules.get(
                        getattr(value, "__module__", None) or "")
                    nxt.append(owner)
        modules = nxt
    return False


def _jit_types(triton) -> tuple:
    out = []
    jit = getattr(getattr(triton, "runtime", None), "jit", None)
    for holder, name in ((jit, "JITFunction"), (sys.modules.get("triton.runtime.interpreter"), "InterpretedFunction")):
        t = getattr(holder, name, None)
        if isinstance(t, type):
            out.append(t)
    return tuple(out)


def _attributes(sampler) -> list:
    try:
        return list(vars(sampler).values())
    except TypeError:  # no __dict__ (slots)
        return []
