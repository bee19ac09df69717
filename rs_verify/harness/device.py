"""The one backend choice of the suite: CUDA when usable, else Triton's interpreter.

Triton reads `TRITON_INTERPRET` when a kernel is decorated, so the choice must be made before
any Triton code (the built-in sampler's or a third-party one) is imported. Every entry point
(the CLI, the pytest plugin, the project's conftest, the built-in sampler's package, the
mutation campaign) calls `resolve()` and nothing else sets the variable.

Rules:
- `requested="cuda"`: CUDA must be usable, else `DeviceError` with the reason (front ends
  exit 2). Never a silent fallback.
- `requested="cpu"`: Triton runs through its interpreter (`TRITON_INTERPRET=1`).
- `requested=None` (auto): CUDA when usable. When it is not, but an NVIDIA driver is present
  (a GPU runner with a broken CUDA install), `DeviceError` too: a green run through the
  interpreter would be meaningless there. Ask for `cpu` explicitly to run on such a machine.
  `TRITON_INTERPRET=1` set by the user means cpu.

Only `cuda_status()` imports torch (lazily, so that loading the pytest plugin stays light).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path

DEVICES = ("cpu", "cuda")
COMPILE = "compile"  # ahead-of-time compile for a GPU target: the interpreter off, no GPU needed
INTERPRETER_MODULE = r"triton\.runtime\.interpreter"
_NVIDIA_MARKERS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


class DeviceError(RuntimeError):
    """The requested device cannot be used (the message says why)."""


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """`(usable, reason)`: whether torch can allocate on a CUDA device, and if not, why."""
    try:
        import torch  # lazy: the plugin must not import torch when pytest loads it
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return False, f"torch cannot be imported ({exc})"
    if not torch.cuda.is_available():
        build = getattr(torch.version, "cuda", None)
        return False, ("torch.cuda.is_available() is False" +
                       ("" if build else f" (torch {torch.__version__} is a CPU-only build)"))
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure means not usable, with its reason
        return False, f"CUDA is reported available but a first allocation failed: {exc}"
    return True, f"CUDA device {torch.cuda.get_device_name(0)}"


def cuda_available() -> bool:
    return cuda_status()[0]


def nvidia_driver_present() -> bool:
    return any(Path(p).exists() for p in _NVIDIA_MARKERS)


def interpreted() -> bool:
    """Whether Triton code imported from now on runs through the interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_interpreter() -> None:
    if "triton" in sys.modules and not interpreted():
        warnings.warn("rs-verify: triton was imported before the device was chosen; kernels decorated "
                      "already will not run through the interpreter", stacklevel=3)
    os.environ["TRITON_INTERPRET"] = "1"
    quiet_interpreter()


def quiet_interpreter() -> None:
    """Ignore the NumPy RuntimeWarnings the interpreter raises while it runs a kernel.

    The interpreter evaluates `tl` ops with NumPy, so IEEE overflow, `0 / 0` or `exp(-inf)`
    inside a kernel (well defined on a GPU, and common in samplers that mask with -inf) warn
    from `triton.runtime.interpreter`; a correct sampler printed dozens of them. Only warnings
    raised from that module are ignored, in this process and in pytest's per-test filters.
    """
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=INTERPRETER_MODULE)


def resolve(requested: str | None = None) -> str:
    """Choose the backend for this process (see the module docstring); return "cuda" or "cpu"."""
    if requested not in (None, COMPILE, *DEVICES):
        raise DeviceError(f"unknown device {requested!r}; expected one of {DEVICES}")
    if requested == COMPILE:
        if "triton" in sys.modules and interpreted():
            raise DeviceError("triton was imported with its interpreter on: compile in a fresh process")
        os.environ["TRITON_INTERPRET"] = "0"
        return COMPILE
    if requested == "cpu" or (requested is None and interpreted()):
        _use_interpreter()
        return "cpu"
    usable, reason = cuda_status()
    if usable:
        if interpreted():
            raise DeviceError("device cuda requested but TRITON_INTERPRET=1 is set: unset it to run compiled kernels")
        return "cuda"
    if requested == "cuda":
        raise DeviceError(f"device cuda requested but CUDA is not usable: {reason}")
    if nvidia_driver_present():
        raise DeviceError(f"an NVIDIA driver is present but CUDA is not usable ({reason}); refusing to fall back "
                          "to the Triton interpreter silently: fix the CUDA install, or choose the cpu device "
                          "explicitly (--rs-device cpu / --device cpu)")
    _use_interpreter()
    return "cpu"
