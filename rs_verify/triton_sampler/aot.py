"""Ahead-of-time CUDA compilation of the built-in sampler's kernels, on any machine (issue 12).

Triton's CPU wheel ships `ptxas` and `cuobjdump`: `triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", arch, 32))` lowers a kernel to a cubin without a GPU.
The interpreter accepts code the compiler rejects (a loop-carried variable whose integer width
changes, for one), so only a compile shows such errors before a GPU run.

Which specializations: `launches()` (launches.py) runs `rejection_sample` on `meta` tensors with
the kernels swapped for recorders, over every logits dtype, draft mode, logprobs mode, block
size, stream family (the constexpr `STREAM`) and explicit resampling (`RESAMPLE`) asked for, and
over vocabularies of each class Triton specializes an int on (a multiple of 16, any other size, and 1; the draft vocabulary independently). Each
recorded launch is bound with Triton's own binder for the target, the code that picks a
specialization at launch time (pointer dtypes and 16-byte alignment, ints equal to 1 or
divisible by 16, int32 or int64), and each distinct specialization is compiled once per arch.
Pointers are 16-byte aligned, as every tensor `TritonSampler` allocates; a misaligned view passed
to `rejection_sample` directly would launch a specialization without alignment hints.
The `int64` width binds every launch again with each size and offset scalar moved above 2**31
(by 2**32, which keeps its divisibility by 16), as Triton types a Python int >= 2**31.

Registers, static shared memory and local memory (stack frame + local arrays) come from
`cuobjdump -res-usage` on the cubin, so they are reported also when Triton's cache skipped
ptxas; shared memory adds the dynamic shared memory Triton launches the kernel with. Local
memory is what Triton counts as spills (`n_spills` is the driver's local size / 4): the kernels
call no functions and allocate no local arrays, so any local memory is spilled registers.

Interpreter: when `TRITON_INTERPRET=1` was set as triton was imported, `@triton.jit` (Triton's own
`tl.max`, `tl.sum`, ... included) built interpreted functions, which cannot be compiled. Then
`compile_all` runs the compile in a child process (`python -m rs_verify.triton_sampler.aot`) with
`TRITON_INTERPRET=0`, which streams one JSON line per result back; otherwise it compiles in process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import triton
from rich.table import Table
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.language import standard
from triton.runtime.jit import JITFunction, create_function_from_signature

from ..contract.explicit import RESAMPLE
from . import kernels
from .launches import DRAFT_MODES, KERNELS, VOCAB_CLASSES, Launch, launches
from .sampler import TORCH_DTYPES
from .streams import STREAMS

__all__ = ["ARCHS", "DRAFT_MODES", "KERNELS", "VOCAB_CLASSES", "WIDTHS", "CompileResult", "Launch", "compile_all",
           "gate_failures", "launches", "mixed_widths", "specialization", "table"]

ARCHS = (80, 90, 100)
WIDTHS = ("int32", "int64")
# Scalar arguments that are flags, not sizes or offsets: never >= 2**31.
FLAGS = frozenset({"PROCESSED", "MASKED", "BLOCK", "DEFER", "HAS_DRAFT", "HAS_Q", "WR", "PER_NODE"})
WIDEN = 2**32
RESULT_PREFIX = "rs-verify-aot "


@dataclass
class CompileResult:
    """The outcome of compiling one specialization for one arch."""

    kernel: str
    arch: int
    width: str
    label: str
    signature: dict
    constexprs: dict
    error: str | None = None
    registers: int | None = None
    shared: int | None = None  # bytes per block: static (cubin) + dynamic (launch)
    local: int | None = None  # bytes of local memory per thread (stack frame + local arrays): spills
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def spills(self) -> bool:
        return bool(self.local)


def mixed_widths(kernels=KERNELS) -> list[str]:
    """One `int64:NAME` width per size / offset scalar of the kernels (each alone >= 2**31)."""
    module = kernels_for_compile()
    names = [n for k in kernels for n in scalar_names(getattr(module, k))]
    return [f"int64:{n}" for n in dict.fromkeys(names)]


def compilable_here() -> bool:
    """Whether this process can compile: triton was imported with its interpreter off."""

    return isinstance(standard.max, JITFunction)


def kernels_for_compile(kernels_file=None):
    """A private copy of `kernels.py` (or `kernels_file`, a variant of it) defined with Triton's
    interpreter off: compilable JIT functions, whatever the interpreter setting of this process."""


    # kernels.py imports kernels and helpers from its sibling modules (block.py, masks.py, ...): a
    # private package over the same folder gives it fresh, compilable copies of those too. It sits
    # beside this package (at the same depth), so the siblings' `..contract` imports resolve.
    path = str(kernels_file or kernels.__file__)
    private = __package__.rpartition(".")[0] + "._aot_triton_sampler"
    for name in [m for m in sys.modules if m == private or m.startswith(private + ".")]:
        del sys.modules[name]
    package = types.ModuleType(private)
    package.__path__ = [os.path.dirname(kernels.__file__)]
    sys.modules[private] = package
    with knobs.runtime.scope():
        knobs.runtime.interpret = False
        spec = importlib.util.spec_from_file_location(private + ".kernels", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def scalar_names(fn) -> list[str]:
    """The size and offset scalars of kernel `fn` (its int arguments that are not flags)."""
    return [p.name for p in fn.params if not p.is_constexpr and not p.name.endswith("_ptr") and p.name not in FLAGS]


def specialization(fn, launch, backend, width):
    """(signature, constexprs, attrs, options) that Triton compiles `launch` with for `backend`'s target.

    `width`: "int32" (the scalars as recorded), "int64" (every size and offset >= 2**31) or
    "int64:NAME" (only scalar NAME >= 2**31: mixed widths)."""

    args = launch.args
    if width != "int32":  # "int64": every size and offset; "int64:NAME": only NAME
        only = width.partition(":")[2]
        args = tuple(a + WIDEN if type(a) is int and not p.is_constexpr and p.name not in FLAGS
                     and only in ("", p.name) else a for a, p in zip(args, fn.params))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, spec, options)
    return signature, constexprs, attrs, options


def resource_usage(cubin: bytes) -> dict:
    """REG, STACK, SHARED and LOCAL of a one-kernel cubin, from `cuobjdump -res-usage` ({} without it)."""

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next((ln for ln in text.splitlines() if "REG:" in ln), "")
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def _error_text(exc: BaseException) -> str:
    """The compiler's reason and the kernel line it points at.

    Triton's CompilationError reads "at L:C:", the source, a caret line, then the reason; an error
    inside a called @jit function is the `__cause__` of the caller's. The deepest one wins."""
    reason = where = None
    chain = 0
    while exc is not None and chain < 16:
        lines = [ln.rstrip() for ln in str(exc).splitlines() if ln.strip()]
        carets = [i for i, ln in enumerate(lines) if ln.strip() == "^"]
        if carets:
            where = f"`{lines[carets[-1] - 1].strip()}` ({type(exc).__name__} {lines[0].strip()})"
            if carets[-1] + 1 < len(lines):
                reason = " ".join(ln.strip() for ln in lines[carets[-1] + 1:])
        elif lines:
            reason = f"{type(exc).__name__}: " + "\n".join(lines[:20])
        exc, chain = exc.__cause__, chain + 1
    return (reason or "compile failed") + (f" [at {where}]" if where else "")


def compile_one(fn, signature, constexprs, attrs, options, arch) -> tuple[str | None, dict]:
    """Compile one specialization for sm_<arch>: (error text or None, resource usage)."""

    with knobs.runtime.scope(), contextlib.redirect_stdout(io.StringIO()):  # Triton prints PTX on ptxas errors
        knobs.runtime.interpret = False
        try:
            kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs),
                                    target=GPUTarget("cuda", arch, 32), options=options.__dict__)
        except Exception as exc:  # noqa: BLE001 - the compiler's error is the result
            return _error_text(exc), {}
    usage = resource_usage(kernel.asm["cubin"])
    # static shared memory of the cubin plus the dynamic shared memory Triton launches it with
    usage["SHARED"] = usage.get("SHARED", 0) + kernel.metadata.shared
    return None, usage


def _compile_here(archs, widths, on_result, grid, kernels=KERNELS, kernels_file=None):

    module = kernels_for_compile(kernels_file)
    recorded = [launch for launch in launches(**grid) if launch.kernel in kernels]
    results = []
    for arch in archs:
        backend = make_backend(GPUTarget("cuda", arch, 32))
        seen = set()
        for width in widths:
            for launch in recorded:
                fn = getattr(module, launch.kernel)
                if width.startswith("int64:") and width[6:] not in scalar_names(fn):
                    continue
                signature, constexprs, attrs, options = specialization(fn, launch, backend, width)
                key = (launch.kernel, repr(signature), repr(constexprs), repr(attrs), repr(options))
                if key in seen:
                    continue
                seen.add(key)
                start = time.perf_counter()
                error, usage = compile_one(fn, signature, constexprs, attrs, options, arch)
                res = CompileResult(
                    launch.kernel, arch, width, launch.label, signature,
                    {fn.arg_names[path[0]]: value for path, value in constexprs.items()},
                    error=error, registers=usage.get("REG"), shared=usage.get("SHARED"),
                    local=usage.get("STACK", 0) + usage.get("LOCAL", 0) if usage else None,
                    seconds=round(time.perf_counter() - start, 3))
                results.append(res)
                if on_result is not None:
                    on_result(res)
    return results


def _compile_in_child(archs, widths, on_result, grid, kernels=KERNELS, kernels_file=None):
    """Run `main` in a child process with the interpreter off; one JSON line per result."""

    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the rs_verify package
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    argv = [sys.executable, "-m", "rs_verify.triton_sampler.aot", "--arch", *map(str, archs), "--width", *widths,
            "--kernels", *kernels]
    if kernels_file is not None:
        argv += ["--kernels-file", str(kernels_file)]
    for name, values in grid.items():
        argv += ["--" + name.replace("_", "-"), *map(str, values)]
    results = []
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            if line.startswith(RESULT_PREFIX):
                res = CompileResult(**json.loads(line[len(RESULT_PREFIX):]))
                results.append(res)
                if on_result is not None:
                    on_result(res)
        code = proc.wait()
        if code != 0:
            err.seek(0)
            raise RuntimeError(f"the compile process {' '.join(argv)} exited {code}:\n{err.read()[-4000:]}")
    return results


def compile_all(archs=ARCHS, *, widths=WIDTHS, kernels=KERNELS, kernels_file=None, on_result=None,
                **grid) -> list[CompileResult]:
    """Compile every distinct specialization of `launches(**grid)` for each arch and integer width.

    - archs: CUDA compute capabilities (80 is sm_80).
    - widths: `int32` (the scalars as recorded), `int64` (every size and offset >= 2**31) and / or
      `int64:NAME` (only NAME: mixed widths; `mixed_widths()` lists one per scalar).
    - kernels: names of the kernels to compile (default: all of `KERNELS`).
    - kernels_file: compile this variant of `kernels.py` instead (same kernel names and signatures).
    - on_result: called with each `CompileResult` as it is made (progress).
    - grid: the batch shapes, as for `launches`.

    Compiler errors are results, never raised. Runs in a child process when this one runs
    Triton's interpreter (see the module docstring).
    """
    archs, widths, kernels = [int(a) for a in archs], list(widths), list(kernels)
    run = _compile_here if compilable_here() else _compile_in_child
    return run(archs, widths, on_result, grid, kernels=kernels, kernels_file=kernels_file)


def gate_failures(results) -> list[CompileResult]:
    """The results that fail the compile gate: a compile error, or register spills (local memory)."""
    return [r for r in results if not r.ok or r.spills]


def table(results, *, verbose: bool = False):
    """A rich Table, kernel x arch: specializations compiled, registers, spills and shared memory.

    `verbose`: one row per specialization (width and batch shape) instead of one per kernel."""

    archs = sorted({r.arch for r in results})
    t = Table(title="CUDA compile of the built-in sampler (per thread: registers, spilled bytes; "
                    "per block: shared memory)")
    t.add_column("kernel" + (" / specialization" if verbose else ""), no_wrap=True)
    for arch in archs:
        t.add_column(f"sm_{arch}")
    rows = {}
    for r in results:
        key = (r.kernel, r.width, r.label) if verbose else (r.kernel,)
        rows.setdefault(key, {}).setdefault(r.arch, []).append(r)
    for key, by_arch in rows.items():
        t.add_row(" / ".join(key), *(_cell(by_arch.get(arch, [])) for arch in archs))
    return t


def _cell(rs) -> str:
    if not rs:
        return "-"
    ok = [r for r in rs if r.ok]
    text = f"{len(ok)}/{len(rs)} compiled"
    if ok:
        regs = [r.registers for r in ok if r.registers is not None]
        spill = max((r.local or 0) for r in ok)
        smem = max((r.shared or 0) for r in ok)
        text += (f", {min(regs)}-{max(regs)} regs" if regs else ", regs ?") + f", spills {spill} B, smem {smem} B"
    return text if len(ok) == len(rs) and not any(r.spills for r in rs) else f"[red]{text}[/]"


def main(argv=None) -> int:
    """The child process of `compile_all`: compile here, one `RESULT_PREFIX` + JSON line per result."""
    p = argparse.ArgumentParser(prog="python -m rs_verify.triton_sampler.aot")
    p.add_argument("--arch", nargs="+", type=int, default=list(ARCHS))
    p.add_argument("--width", nargs="+", default=list(WIDTHS))
    p.add_argument("--dtypes", nargs="+", choices=tuple(TORCH_DTYPES))
    p.add_argument("--draft-modes", nargs="+", choices=DRAFT_MODES)
    p.add_argument("--block-sizes", nargs="+", type=int)
    p.add_argument("--vocab-classes", nargs="+", choices=tuple(VOCAB_CLASSES))
    p.add_argument("--streams", nargs="+", choices=tuple(STREAMS))
    p.add_argument("--resamples", nargs="+", choices=RESAMPLE)
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    p.add_argument("--kernels-file", default=None)
    args = p.parse_args(argv)
    if not compilable_here():
        print("rs-verify aot: triton was imported with TRITON_INTERPRET=1; run with TRITON_INTERPRET=0",
              file=sys.stderr)
        return 2
    grid = {k: v for k in ("dtypes", "draft_modes", "block_sizes", "vocab_classes", "streams", "resamples")
            if (v := getattr(args, k)) is not None}
    _compile_here(args.arch, args.width, lambda r: print(RESULT_PREFIX + json.dumps(asdict(r)), flush=True), grid,
                  kernels=args.kernels, kernels_file=args.kernels_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
