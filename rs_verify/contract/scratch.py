"""Reusable per-thread temporary arrays.

Fresh multi-megabyte NumPy temporaries are mmapped and page-faulted on every
call, which cost the reference sampler about a third of its time. A hot path
declares each big temporary once, at module level, as a `Scratch`, and takes
its array from it on every call:

    _NOISE = Scratch("resample noise uniforms")
    ...
    v = _NOISE((rows, vocab), np.float32)

Each `Scratch` owns one buffer per thread, grown on demand and never shared
with another `Scratch`, so two temporaries can only alias when they are the
same declared object. The array a `Scratch` returns is valid until the same
`Scratch` is called again on the same thread; its contents are undefined on
return, and a function never hands one to its caller.
"""

from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["Scratch"]

_MIN_BYTES = 4096


class Scratch:
    """One reusable temporary: `scratch(shape, dtype)` is a C-contiguous array backed by this
    thread's buffer (grown by at least 25% when too small, so slowly growing shapes do not
    reallocate every call).

    - `what`: what the temporary holds (shown in `repr`).
    """

    __slots__ = ("what", "_local")

    def __init__(self, what: str):
        self.what = str(what)
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"Scratch({self.what!r})"

    def __call__(self, shape, dtype) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.nbytes < nbytes:
            size = max(nbytes, _MIN_BYTES)
            if buf is not None:
                size = max(size, buf.nbytes * 5 // 4)
            buf = self._local.buf = np.empty(size, np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)
