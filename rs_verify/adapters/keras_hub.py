"""keras-hub's `SpeculativeSampler` (0.32.0) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.keras_hub:KerasHubSampler

`KerasHubSampler` drives `keras_hub.src.samplers.speculative_sampler.SpeculativeSampler` (`MODULE`,
imported when the sampler is built, on Keras's torch backend; no keras-hub code lives in this
repository). keras-hub fuses drafting and verification in one generation loop:

    SpeculativeSampler(num_speculative_tokens=k, base_sampler=..., seed=..., temperature=T)(
        next, prompt,                 # int [batch, max_length]: the sequences, generated in place
        index=i, mask=mask,           # bool [batch, max_length]: True at prompt positions
        draft_next=draft_next,        # (prompt, cache, index) -> (logits [batch, V], hidden, cache)
        verify_next=verify_next)      # (prompt, cache, index, k) -> (logits [batch, k + 1, V], cache)

Each cycle drafts `k` tokens (`argmax` of `softmax(logits / base_sampler.temperature)`, a masked
position keeps its prompt token), verifies them with `r * q(d) < p(d)`, `p = softmax(z / T)` of
the target's logits, `r` a float32 `keras.random.uniform`, counts each row's accepted prefix
(`num_accepted`), and writes every row's bonus at the batch's smallest count `m = ops.min(
num_accepted)`, drawn by Gumbel-max from `max(p - q, 0) / (sum + 1e-7)` at `m` (from `p` when
`m = k`). A row that accepted more than `m` gets a residual sample over a draft it accepted: SPEC 4
has no such batch semantics. Its draws are keras's (`streams = "own"`, every property but
certification).

What the adapter does in keras-hub's place (docs/engines.md):
- One call per group of requests that share what keras-hub takes per sampler and call: greedy or
  not, the temperature (keras-hub's and the base sampler's, as `__init__` sets it) and the number
  of drafts `n` (chunked at `CHUNK_ELEMENTS` logits). Each row is one cycle of keras-hub's loop:
  `prompt = [last verified token, drafts..., 0]`, `index = 1`, `max_length = n + 2`, the drafts'
  positions masked so that keras-hub's own masked path proposes the batch's drafts; a draft model
  stub returns each row's draft logits at the position asked (`log` of a point mass for one-hot
  drafts: `q` is then that point mass); `verify_next` the rows' `n + 1` target rows over `[0, V')`.
  A cycle that accepts every draft of every row ends the loop; otherwise the next cycle's first
  `draft_next` call receives the generated sequences and ends the call.
- The module's `ops.min(num_accepted)` is recorded (`keras_hub_hooks`): a row whose count is the
  minimum `m` got keras-hub's own bonus at its first rejection (or after its last draft) and is
  done: its drafts up to `m`, then the token written at `index + m`. The rows that accepted more
  are called again, grouped by their count, so that each row's bonus comes from a call in which
  its count is the minimum. The calls draw the same uniforms for a row (below), so a row accepts
  the same drafts in every call (each call finishes at least one row).
- The module's `random.uniform` hands out the rows' own uniforms (`keras_hub_hooks`), keyed by the
  request's seed (`per_request.request_seeds` of its state seed and first position), the position
  and the coin or token: a request's output is the same in any batch and any call.
- A request with no draft (`k = 0` stacks no draft) is sampled from `softmax(z)` by the adapter
  with torch's CPU generator seeded per request (`argmax z` when greedy); greedy requests with
  drafts go through a `SpeculativeSampler` without `base_sampler` (keras-hub's greedy acceptance,
  `T = 1`, whose bonus is the argmax at `m`: the same regrouping applies).
"""

from __future__ import annotations

import inspect
import os
import sys
import types

import numpy as np
import torch

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate
from . import explicit_inputs, hollow
from .keras_hub_hooks import Cycle, fed
from .per_request import one_thread, request_seeds, sample_p, seeded_cpu

MODULE = "keras_hub.src.samplers.speculative_sampler"
CLASS = "SpeculativeSampler"
HOLLOW = ("keras_hub",)  # keras_hub/__init__.py imports every model and tokenizer; keras_hub/src's are empty
# The module's calls the adapter's hooks rely on (keras_hub_hooks): one min per cycle, two draws.
HOOKED_CALLS = {"ops.min(": 1, "random.uniform(": 2}
CHUNK_ELEMENTS = 1 << 23  # target logits per call: keras-hub holds a few float32 tensors of this size


class _CycleEnd(Exception):
    """Raised by the draft stub when the second cycle starts: carries the generated sequences."""

    def __init__(self, prompt):
        super().__init__("the first cycle ended")
        self.prompt = prompt


def load_keras_hub():
    """keras-hub's `SpeculativeSampler` class, on Keras's torch backend."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras  # lazy: after KERAS_BACKEND is set, and only when the library is loaded
    except ImportError as exc:
        raise ImportError(f"rs_verify.adapters.keras_hub needs keras (keras-hub 0.32.0 installs it): {exc}") from exc
    if keras.config.backend() != "torch":
        raise ImportError(f"rs_verify.adapters.keras_hub runs keras-hub on Keras's torch backend; Keras was loaded "
                          f"with {keras.config.backend()!r} (set KERAS_BACKEND=torch)")
    module = hollow.import_file(MODULE, HOLLOW, "rs_verify.adapters.keras_hub", "keras-hub (0.32.0)")
    cls = getattr(module, CLASS, None)
    if cls is None:
        raise TypeError(f"{MODULE} has no {CLASS}: the calling convention changed")
    source = inspect.getsource(module)
    for call, times in HOOKED_CALLS.items():
        if source.count(call) != times:
            raise TypeError(f"{MODULE} calls {call}...) {source.count(call)} times, not {times}: the calling "
                            f"convention changed")
    return cls


class KerasHubSampler:
    """keras-hub's `SpeculativeSampler` as a sampler (see the module docstring).

    - sampler_class: the class to drive (default: keras-hub's, imported when built); its module's
      `ops` and `random` globals are swapped during each call (`keras_hub_hooks.fed`).
    - validate: run `rs_verify.validate` before any work (`unvalidated()` turns it off).
    """

    name = "keras-hub"
    streams = "own"  # keras-hub's Gumbel-max bonus and acceptance rule, on uniforms keyed per request
    supports_chunking = False
    supports_logprobs = False
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # top-k / top-p belong to keras-hub's other samplers, not this one
    interpreted = False  # one call per group of requests (module docstring): a campaign takes seconds
    deviations = frozenset()

    def __init__(self, *, sampler_class=None, validate: bool = True):
        self.cls = load_keras_hub() if sampler_class is None else sampler_class
        self.module = sys.modules[self.cls.__module__]
        self.validate = bool(validate)
        self._samplers: dict = {}

    def unvalidated(self) -> "KerasHubSampler":
        return type(self)(sampler_class=self.cls, validate=False)

    def __repr__(self) -> str:
        return f"KerasHubSampler({getattr(self.cls, '__module__', '?')}.{CLASS}, validate={self.validate})"

    def sampler(self, n: int, greedy: bool):
        """keras-hub's sampler of `n` drafts (built once per count and mode; its temperature set per call)."""
        key = (n, greedy)
        if key not in self._samplers:
            base = None if greedy else types.SimpleNamespace(temperature=1.0)  # read for its temperature only
            self._samplers[key] = self.cls(num_speculative_tokens=n, base_sampler=base, seed=0)
        return self._samplers[key]

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate if self.validate else check_layout)(batch)
        if batch.sampling_params_on():
            raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                             f"(SpeculativeSampler takes none; sampling_params is empty)")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (keras-hub "
                             f"verifies token by token)")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, "cpu")
        states = np.asarray(batch.idx_mapping, np.int64)
        keys = request_seeds(np.asarray(batch.seeds, np.int64)[states], np.asarray(batch.pos, np.int64)[prep.rows])
        temps = np.where(prep.greedy, np.float32(1), np.asarray(batch.temperature, np.float32)[states])
        ids = torch.from_numpy(np.asarray(batch.draft_token_ids, np.int64).copy())
        target = torch.from_numpy(np.array(np.asarray(batch.target_logits)[:, : prep.vocab], np.float32))
        tokens: list = [None] * batch.num_reqs
        with one_thread(), torch.inference_mode():
            draft = self.draft_rows(batch, prep, ids)
            with seeded_cpu() as seed_cpu:
                for r in np.flatnonzero(prep.drafts == 0):  # no draft: the adapter's argmax z or draw from p
                    if prep.greedy[r]:
                        tokens[r] = explicit_inputs.greedy_tokens(batch, prep, r)
                    else:
                        seed_cpu(int(keys[r]))
                        tokens[r] = [sample_p(prep.p[prep.rows[r]])]
            live = np.flatnonzero(prep.drafts > 0)
            groups: dict = {}
            for r in live:
                groups.setdefault((bool(prep.greedy[r]), float(temps[r]), int(prep.drafts[r])), []).append(r)
            for (greedy, t, n), reqs in groups.items():
                reqs = np.asarray(reqs, np.int64)
                step = max(1, CHUNK_ELEMENTS // ((n + 1) * prep.vocab))
                for lo in range(0, reqs.size, step):
                    chunk = reqs[lo : lo + step]
                    at = torch.from_numpy(prep.rows[chunk][:, None] + np.arange(n + 1))  # [B, n + 1] global rows
                    out = self.verify(self.sampler(n, greedy), keys[chunk], t, ids[at], draft[torch.from_numpy(chunk), :n],
                                      target[at])
                    for r, toks in zip(chunk, out):
                        tokens[r] = toks
        return explicit_inputs.output(batch, tokens)

    @staticmethod
    def draft_rows(batch: SpecBatch, prep, ids: torch.Tensor) -> torch.Tensor:
        """float32 `[R, K, V']`: what the draft model stub returns, the raw draft logits of each request
        (`log` of the point mass at the draft for one-hot drafts; `-inf` rows past its drafts)."""
        k = batch.num_speculative_steps
        if batch.draft_logits is not None:
            states = np.asarray(batch.idx_mapping, np.int64)
            return torch.from_numpy(np.array(np.asarray(batch.draft_logits)[states, :k, : prep.vocab], np.float32))
        out = torch.full((batch.num_reqs, k, prep.vocab), float("-inf"))
        live = np.arange(k)[None, :] < prep.drafts[:, None]
        r, i = np.nonzero(live)
        out[torch.from_numpy(r), torch.from_numpy(i), ids[torch.from_numpy(prep.rows[r] + 1 + i)]] = 0.0
        return out

    def verify(self, sampler, keys: np.ndarray, t: float, ids: torch.Tensor, draft: torch.Tensor,
               target: torch.Tensor) -> list[list[int]]:
        """Each row's emitted tokens (`ids` `[B, n + 1]`, `draft` `[B, n, V']`, `target` `[B, n + 1, V']`):
        keras-hub's cycle on the rows, again on the rows that accepted more than the minimum, grouped
        by their count, until every row's bonus came from a call where its count is the minimum."""
        out: list = [None] * ids.shape[0]
        pending = [np.arange(ids.shape[0])]
        while pending:
            rows = pending.pop()
            sequences, accepted, m = self.cycle(sampler, keys[rows], t, ids[rows], draft[rows], target[rows])
            done = accepted == m
            for j in np.flatnonzero(done):
                out[rows[j]] = sequences[j, 1 : m + 2].tolist()
            more = accepted[~done]
            pending.extend(rows[~done][more == a] for a in np.unique(more))
        return out

    def cycle(self, sampler, keys: np.ndarray, t: float, ids: torch.Tensor, draft: torch.Tensor,
              target: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, int]:
        """One cycle of keras-hub's loop on the rows (module docstring): the sequences it generated
        (`[B, n + 2]`), each row's accepted count and their minimum, where keras-hub wrote the bonus."""
        b, n = ids.shape[0], ids.shape[1] - 1
        sampler.temperature = t
        if sampler.base_sampler is not None:
            sampler.base_sampler.temperature = t  # as SpeculativeSampler.__init__ sets it
        prompt = torch.cat([ids, ids.new_zeros(b, 1)], dim=1)  # slot 0, the drafts, the bonus
        mask = torch.ones_like(prompt, dtype=torch.bool)
        mask[:, -1] = False
        cycle = Cycle(keys)

        def draft_next(prompt, cache, index):
            if cycle.accepted is not None:  # the second cycle's first draft: the first cycle's sequences are done
                raise _CycleEnd(prompt)
            i = int(index)
            if not 1 <= i <= n:
                raise RuntimeError(f"SpeculativeSampler drafted at index {i} in its first cycle from index 1 with "
                                   f"k = {n}: the calling convention changed")
            return draft[:, i - 1], None, cache

        def verify_next(prompt, cache, index, k):
            if int(index) != 1 or int(k) != n or cycle.cycles:
                raise RuntimeError(f"SpeculativeSampler verified from index {int(index)} with k = {int(k)}: the "
                                   f"adapter hands it index 1 and k = {n}, once: the calling convention changed")
            cycle.start(1)
            return target, cache

        def target_next(prompt, cache, index):
            raise RuntimeError("SpeculativeSampler called `next`: the adapter verifies through verify_next")

        with fed(self.module, cycle):
            try:
                out = sampler(target_next, prompt, index=1, mask=mask, draft_next=draft_next, verify_next=verify_next)
            except _CycleEnd as stop:
                out = stop.prompt
        if cycle.accepted is None:
            raise RuntimeError("SpeculativeSampler ended without ops.min(num_accepted): the calling convention changed")
        sequences = torch.as_tensor(out).reshape(b, n + 2)
        if not 0 <= cycle.min <= n or int(cycle.accepted.max()) > n:
            raise RuntimeError(f"SpeculativeSampler accepted {cycle.accepted.max()} of {n} drafts")
        return sequences, cycle.accepted, cycle.min
