"""What `rs_verify.adapters.keras_hub` hands keras-hub's `speculative_sampler` module for one call.

keras-hub's `SpeculativeSampler.__call__` reaches Keras through its module's two globals, `ops`
and `random`. For one call of a group of requests the adapter swaps them (`fed`, restored after):

- `_FedOps`: every op is Keras's (the module's own `ops`), but `min`, which the module calls once
  per cycle, on `num_accepted` (`min_accepted = ops.min(num_accepted)`), also records its argument:
  each row's accepted count, which keras-hub computes per row and then replaces by the batch's
  smallest when it writes the bonus;
- `_FedRandom`: Keras's `random` (its `SeedGenerator` is still built), but `uniform(shape, seed,
  dtype)` returns the requests' own float32 uniforms, keyed per row by the request's seed (`keys`,
  `per_request.request_seeds`), the position in the request (`index + i` for the `[batch, k]`
  acceptance uniforms, drawn before `min`; `index + min_accepted` for the `[batch, V]` Gumbel noise
  of the bonus, drawn after it) and the coin or token: Philox-4x32-10 (`contract.philox.randint`,
  key = the request's seed, counter = `position * 2**32 + stream * 2**31 + token`), mapped as torch's
  CPU `torch.rand` maps its 32-bit draws to float32 (the low 24 bits times `2**-24`), so `r` and
  `u` take keras's law (`keras.random.uniform` on the torch backend is `torch.rand`). A request
  draws the same numbers in any batch, chunk or call, so the seed generator's state is not used.
"""

from __future__ import annotations

import contextlib
import threading
import types

import numpy as np
import torch

from ..contract import philox

__all__ = ["Cycle", "fed", "keyed_uniforms"]

_LOW24 = np.int32(0xFFFFFF)
_STEP = np.float32(2.0**-24)
_GUMBEL = 2**31  # the stream bit of the bonus noise (0: the acceptance uniforms)
_PATCH_LOCK = threading.Lock()


def keyed_uniforms(keys: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
    """float32 `[B, M]` in `[0, 1)` on torch's 2**-24 grid: row `b`, column `j` keyed by `keys[b]` and the
    Philox counter `offsets[j]` (int64 `[M]`; `position * 2**32 + stream * 2**31 + token`, module docstring)."""
    w = philox.randint(np.asarray(keys, np.int64)[:, None], np.asarray(offsets, np.int64)[None, :])
    np.bitwise_and(w, _LOW24, out=w)
    return torch.from_numpy(np.multiply(w, _STEP, dtype=np.float32))


class Cycle:
    """What one call of keras-hub's sampler sees and draws, cycle by cycle (module docstring)."""

    def __init__(self, keys: np.ndarray):
        self.keys = np.asarray(keys, np.int64)
        self.cycles = 0
        self.index = None  # the current cycle's index (from verify_next)
        self.accepted = None  # int64 [B]: the current cycle's per-row accepted counts, once `min` ran
        self.min = None

    def start(self, index: int) -> None:
        """A cycle's verification starts at `index` (called by the adapter's `verify_next`)."""
        self.cycles += 1
        self.index, self.accepted, self.min = int(index), None, None

    def saw_min(self, x, out) -> None:
        if self.index is None or self.accepted is not None:
            raise RuntimeError("keras-hub's sampler called ops.min outside a cycle's one min(num_accepted): the "
                               "calling convention changed")
        self.accepted = torch.as_tensor(x).detach().cpu().numpy().astype(np.int64).reshape(-1)
        self.min = int(torch.as_tensor(out).reshape(()))
        if self.accepted.shape != self.keys.shape or self.min != int(self.accepted.min()):
            raise RuntimeError(f"ops.min of {self.accepted.shape} for a batch of {self.keys.shape[0]} rows: the calling "
                               f"convention changed")

    def uniform(self, shape, dtype) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or shape[0] != self.keys.size or str(dtype) != "float32" or self.index is None:
            raise RuntimeError(f"random.uniform({shape}, dtype={dtype}) in cycle {self.cycles}: the keras-hub adapter "
                               f"hands out float32 [batch, k] and [batch, V] draws: the calling convention changed")
        if self.accepted is None:  # the acceptance uniforms r of positions index .. index + k - 1
            return keyed_uniforms(self.keys, (self.index + np.arange(shape[1], dtype=np.int64)) << 32)
        bonus = self.index + self.min  # the bonus position index + min_accepted, one uniform per token
        return keyed_uniforms(self.keys, (bonus << 32) + _GUMBEL + np.arange(shape[1], dtype=np.int64))


class _FedOps(types.ModuleType):
    """The module's `ops`, with `min` recording its argument in the call's `Cycle`."""

    def __init__(self, ops, cycle: Cycle):
        super().__init__("ops")
        self._ops, self._cycle = ops, cycle

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def min(self, x, *args, **kwargs):
        out = self._ops.min(x, *args, **kwargs)
        self._cycle.saw_min(x, out)
        return out


class _FedRandom(types.ModuleType):
    """The module's `random`, with `uniform` handing out the requests' keyed uniforms."""

    def __init__(self, random, cycle: Cycle):
        super().__init__("random")
        self._random, self._cycle = random, cycle

    def __getattr__(self, name):
        return getattr(self._random, name)

    def uniform(self, shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
        if (minval, maxval) != (0.0, 1.0):
            raise RuntimeError(f"random.uniform over [{minval}, {maxval}): the calling convention changed")
        return self._cycle.uniform(shape, dtype)


@contextlib.contextmanager
def fed(module, cycle: Cycle):
    """`module.ops` and `module.random` swapped for the call's (module docstring), restored on exit."""
    for name in ("ops", "random"):
        if not hasattr(module, name):
            raise TypeError(f"{getattr(module, '__name__', module)} has no global {name!r}: the calling convention "
                            f"changed")
    with _PATCH_LOCK:
        saved = module.ops, module.random
        module.ops, module.random = _FedOps(saved[0], cycle), _FedRandom(saved[1], cycle)
        try:
            yield cycle
        finally:
            module.ops, module.random = saved
