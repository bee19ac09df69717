"""What the adapters of libraries that verify one sequence per call share (SPEC 10, `own` family).

transformers' `_speculative_sampling` and SGLang DSpark's torch version verify one request per
call and draw from a generator the adapter cannot feed. Their adapters call once per request (a
distribution campaign at `ci` is 200,000 calls), so what each call costs besides the library's own
work decides whether the campaigns finish (keras-hub's adapter calls once per group of requests and
uses the seeds and the draw of a request with no draft):

- `request_seed` (`request_seeds` for arrays): the generator's seed of a request, from its state
  seed and the position of its first row: the same request draws the same numbers in any batch,
  chunk or order;
- `seeded_cpu`: torch's global CPU generator, seeded per request through `seed(...)`, restored to
  the caller's state afterwards. `torch.manual_seed` seeds every device's generator and, before
  CUDA is initialised, queues a call with its formatted stack for each (about 0.3 ms a call, and
  a queue that grows with every call): the CPU generator alone is what these libraries draw from
  on a CPU tensor;
- `sample_p`: the adapter's own draw of a request with no draft (the libraries' plain sampling
  step, which their verification functions do not take): the inverse CDF of `p` with one uniform,
  never a token of probability 0 and always in `[0, V')`, also for a `p` that bad input without
  validation made NaN (`torch.multinomial` raises there: an exception of the adapter, not of the
  library under test);
- `one_thread`: torch's intra-op threads set to one during the loop. Tensors of a few hundred
  elements gain nothing from a thread pool, and on a loaded 2-core machine waking it cost 0.7 ms
  per `softmax` of a `[1, 3, 16]` tensor instead of 8 us (measured with `torch.get_num_threads()`
  = 2 against 1).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: spreads the state seed before the position is added


def request_seed(seed: int, pos: int) -> int:
    """The generator's seed for a request of state seed `seed` whose first row is at `pos`."""
    return ((seed % 2**64) * _MIX + pos % 2**64) % 2**63


def request_seeds(seeds, pos) -> np.ndarray:
    """`request_seed` of arrays of state seeds and first positions (int64 `[n]`)."""
    with np.errstate(over="ignore"):
        mixed = np.asarray(seeds, np.int64).astype(np.uint64) * np.uint64(_MIX) + np.asarray(pos, np.int64).astype(np.uint64)
    return (mixed & np.uint64(2**63 - 1)).astype(np.int64)


@contextlib.contextmanager
def one_thread():
    """torch's intra-op thread count set to 1 inside, restored after (module docstring)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@contextlib.contextmanager
def seeded_cpu():
    """Yields `seed(n)`, which seeds torch's global CPU generator; its state is restored on exit."""
    gen = torch.default_generator
    saved = gen.get_state()
    try:
        yield gen.manual_seed
    finally:
        gen.set_state(saved)


def sample_p(p: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """A token drawn from the 1-D law `p` by its inverse CDF (module docstring)."""
    c = torch.cumsum(p.to(torch.float64), 0)
    u = torch.rand((), dtype=torch.float64, generator=generator) * c[-1]
    return min(int(torch.searchsorted(c, u, right=True)), p.numel() - 1)
