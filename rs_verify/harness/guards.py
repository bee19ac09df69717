"""The sampler's side of one call: what the suite checks in the process where the sampler runs.

Every sampler call of the property library goes through `observed_call`. An in-memory sampler
is observed in the test process; an isolated one (`rs_verify.engine.isolation`) in its child,
which runs `local_call` there: what can only be seen where the sampler runs is seen there.

- **Input integrity.** Every array of the batch is copied before the call and compared bit for
  bit after it, also when the sampler raised: `InputModified` names the first modified field
  and index. The batch holds read-only views, but `torch.from_numpy(a).clamp_()` writes
  through them (torch only warns).
- **Global random state.** With `reseed`, Python's `random`, NumPy's global generator and
  torch's (when torch is loaded) are seeded with that value just before the call and restored
  after it. Hypothesis seeds `random` and NumPy before each example, so two calls inside one
  example see the same global state unless the suite changes it between them.
- **Device faults.** When the sampler's process has initialised CUDA, the device is
  synchronised after the call, so an asynchronous fault (an illegal memory access) is raised
  at the call that caused it, as `DeviceFault`.
- **Device work.** `CallReport` holds the Triton kernel launches seen during the call (Triton's
  launch hook: compiled kernels only; the interpreter has no launcher, so `None` there) and, on
  CUDA, the peak device memory beyond what was allocated before the call. An exception the
  sampler raised carries the report as `call_report`.
- **Explicit noise.** A sampler whose stream family is keyed by the batch (SPEC 3c, `explicit`)
  gets the batch with the noise fields it lacks drawn by the family's `fill` (deterministic in
  the seeds and positions; the reference reads a missing field as the same draw), so every
  property, on drawn batches and fixed campaigns alike, hands it its random numbers; fields the
  batch carries (planted edges, bad-input defects, a replayed bundle) are kept.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..contract.batch import ARRAY_FIELDS, SCALAR_FIELDS as _SCALARS, SpecBatch
from . import device
from .handle import RemoteSampler, SamplerUnderTest
from .record import record_of


class InputModified(AssertionError):
    """The sampler changed the batch it was given (SPEC section 10: it must not)."""


class DeviceFault(RuntimeError):
    """The device reported an error when synchronised after the call (an asynchronous fault)."""


@dataclass
class CallReport:
    """What was observed around one call in the sampler's process (see the module docstring)."""

    seconds: float = 0.0
    triton_launches: int | None = None  # None: not observable (no compiled Triton launcher in use)
    peak_bytes: int | None = None  # CUDA only: peak allocated memory beyond the allocation before the call


def observed_call(sampler, batch: SpecBatch, kwargs: dict | None = None, *, reseed: int | None = None):
    """Call `sampler(batch, **kwargs)` under the checks above; return `(output, CallReport)`.

    A `SamplerUnderTest` counts the call, and what the batch exercised once the sampler answered
    it (a batch it rejected, as a bad input must be, exercised nothing); an isolated sampler (a
    `RemoteSampler`) runs the checks in its own process.
    """
    handle = sampler if isinstance(sampler, SamplerUnderTest) else None
    batch = with_explicit_noise(sampler, batch)
    if handle is not None:
        handle.count_call()
        sampler = handle.obj
    if isinstance(sampler, RemoteSampler):
        answer = sampler.observed_call(batch, dict(kwargs or {}), reseed=reseed)
    else:
        answer = local_call(sampler, batch, dict(kwargs or {}), reseed=reseed)
    if handle is not None:
        handle.count_answered(batch)
    return answer


def with_explicit_noise(sampler, batch: SpecBatch) -> SpecBatch:
    """`batch` with the noise fields it lacks filled when `sampler`'s family is keyed by the batch
    (see the module docstring); the batch as given otherwise, or when its structure is too broken
    to key a draw by (a bad input: the sampler must name that defect itself)."""
    try:
        family = record_of(sampler).family
    except Exception:  # a declaration the suite reports elsewhere
        return batch
    if family is None or family.keyed_by != "batch":
        return batch
    try:
        with warnings.catch_warnings():  # a bad value among the keys (a NaN position): no draw, no warning
            warnings.simplefilter("error", RuntimeWarning)
            return family.fill(batch)
    except (ValueError, IndexError, TypeError, AttributeError, RuntimeWarning):
        return batch


def local_call(sampler, batch: SpecBatch, kwargs: dict, *, reseed: int | None = None):
    """`observed_call` in this process (the child of an isolated sampler runs this)."""
    before = snapshot(batch)
    launches = _LaunchCounter()
    report = CallReport()
    base = _cuda_begin(_cuda_torch())
    saved = _reseed(reseed) if reseed is not None else None
    start = time.perf_counter()
    try:
        with launches:
            out = sampler(batch, **kwargs)
    except Exception as exc:
        report.seconds, report.triton_launches = time.perf_counter() - start, launches.count
        _restore(saved)
        changed = modified(batch, before)
        if changed:
            raise InputModified(f"sampler modified {changed} in place, then raised {type(exc).__name__}: "
                                f"{_short(exc)}") from exc
        fault = _cuda_fault(_cuda_torch())
        if fault is not None:
            raise DeviceFault(f"{fault} (surfaced after the sampler raised {type(exc).__name__}: {_short(exc)})") from exc
        try:
            exc.call_report = report
        except AttributeError:  # an exception type with __slots__
            pass
        raise
    except BaseException:  # KeyboardInterrupt and the like: only the global generators are put back
        _restore(saved)
        raise
    report.seconds, report.triton_launches = time.perf_counter() - start, launches.count
    _restore(saved)
    changed = modified(batch, before)
    if changed:
        raise InputModified(f"sampler modified {changed} in place")
    torch = _cuda_torch()  # the call may have been the first to use CUDA in this process
    fault = _cuda_fault(torch)
    if fault is not None:
        raise DeviceFault(f"{fault} (surfaced when the device was synchronised after the call)")
    report.peak_bytes = _cuda_peak(torch, base)
    return out, report


# -- input integrity --------------------------------------------------------------


def snapshot(batch: SpecBatch) -> dict:
    """Copies of every field of `batch` (arrays copied, scalars as they are)."""
    snap = {}
    for name in ARRAY_FIELDS:
        a = getattr(batch, name, None)
        snap[name] = None if a is None else np.array(a, copy=True)
    for name in _SCALARS:
        snap[name] = getattr(batch, name, None)
    return snap


def modified(batch: SpecBatch, snap: dict) -> str | None:
    """The first field of `batch` that differs from `snap` bit for bit, with its first changed
    index and values; None if none."""
    for name in ARRAY_FIELDS:
        was, now = snap[name], getattr(batch, name, None)
        if was is None or now is None:
            if (was is None) != (now is None):
                return name
            continue
        now = np.ascontiguousarray(now)
        if now.shape != was.shape or now.dtype != was.dtype:
            return f"{name} (now {now.dtype} {list(now.shape)}, was {was.dtype} {list(was.shape)})"
        flat_now, flat_was = now.reshape(-1), was.reshape(-1)
        diff = _bits(flat_now) != _bits(flat_was)  # bit for bit: NaN payloads and -0.0 count
        if diff.ndim > 1:
            diff = diff.any(axis=1)
        if diff.any():
            k = int(np.flatnonzero(diff)[0])
            idx = ", ".join(str(int(i)) for i in np.unravel_index(k, now.shape))
            return f"{name}[{idx}] ({flat_was[k].item()!r} became {flat_now[k].item()!r})"
    for name in _SCALARS:
        if getattr(batch, name, None) != snap[name]:
            return f"{name} ({snap[name]!r} became {getattr(batch, name, None)!r})"
    return None


def _bits(flat: np.ndarray) -> np.ndarray:
    """A 1-D array's elements as unsigned integers of their width (rows of bytes for other widths)."""
    if flat.dtype.hasobject:
        return flat
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(flat.dtype.itemsize)
    return flat.view(width) if width is not None else flat.view(np.uint8).reshape(flat.size, -1)


# -- global random state ---------------------------------------------------------


def _reseed(seed: int):
    """Seed the global generators with `seed`; return their previous states."""
    torch = sys.modules.get("torch")
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state() if torch is not None else None,
             _cuda_rng(torch))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if torch is not None:
        torch.manual_seed(seed)
    return saved


def _cuda_rng(torch):
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state_all()
    return None


def _restore(saved) -> None:
    if saved is None:
        return
    py, npy, cpu, cuda = saved
    random.setstate(py)
    np.random.set_state(npy)
    torch = sys.modules.get("torch")
    if torch is not None and cpu is not None:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# -- device work and faults --------------------------------------------------------


def _cuda_torch():
    """torch, when this process has initialised CUDA (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a flag: cheap on every call
        return torch
    return None


def _cuda_begin(torch) -> int | None:
    """Allocated CUDA memory before the call (0 when CUDA is not initialised yet: a fresh context's
    statistics start at zero)."""
    if torch is None:
        return 0
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    except RuntimeError:  # a fault left by an earlier call: reported by _cuda_fault after this one
        return None


def _cuda_fault(torch) -> str | None:
    if torch is None:
        return None
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:  # torch raises CUDA errors (illegal address, device-side assert) so
        return f"{type(exc).__name__}: {_short(exc)}"
    return None


def _cuda_peak(torch, base: int | None) -> int | None:
    if torch is None or base is None:
        return None
    return int(torch.cuda.max_memory_allocated() - base)


class _LaunchCounter:
    """Counts compiled Triton kernel launches through Triton's launch hook while active."""

    def __init__(self):
        self.count: int | None = None
        self._chain = None

    def _hook(self, *_args, **_kwargs) -> None:
        self.count += 1

    def __enter__(self):
        triton = sys.modules.get("triton")
        chain = getattr(getattr(getattr(triton, "knobs", None), "runtime", None), "launch_enter_hook", None)
        if chain is not None and hasattr(chain, "add") and not device.interpreted():
            self.count, self._chain = 0, chain
            chain.add(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._chain is not None:
            self._chain.remove(self._hook)
            self._chain = None


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    out = text[0] if text else ""
    return out if len(out) <= limit else out[: limit - 3] + "..."
