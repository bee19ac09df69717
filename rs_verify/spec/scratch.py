"""Per-thread scratch arrays reused across calls.

Fresh multi-megabyte NumPy temporaries are mmapped and page-faulted on every
call, which cost the reference sampler about a third of its time. The hot
paths take their big temporaries from here instead. Contents are undefined on
return; a caller never hands a scratch array to its own caller.
"""

from __future__ import annotations

import math
import threading

import numpy as np

_LOCAL = threading.local()


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A C-contiguous array of `shape` and `dtype` backed by this thread's buffer `name`."""
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    pool = _LOCAL.__dict__.setdefault("pool", {})
    buf = pool.get(name)
    if buf is None or buf.nbytes < nbytes:
        size = max(nbytes, 4096)
        if buf is not None:
            size = max(size, buf.nbytes * 5 // 4)
        buf = pool[name] = np.empty(size, np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)


def clear() -> None:
    """Release this thread's buffers."""
    _LOCAL.__dict__.pop("pool", None)
