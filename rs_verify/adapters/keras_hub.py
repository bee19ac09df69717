"""keras-hub's `SpeculativeSampler` (0.32.0) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.keras_hub:KerasHubSampler

`KerasHubSampler` drives `keras_hub.src.samplers.speculative_sampler.SpeculativeSampler` (`MODULE`,
imported when the sampler is built, on Keras's torch backend; no keras-hub code lives in this
repository). keras-hub fuses drafting and verification in one generation loop:

    SpeculativeSampler(num_speculative_tokens=k, base_sampler=..., seed=..., temperature=T)(
        next, prompt,                 # int [batch, max_length]: the sequence, generated in place
        index=i, mask=mask,           # bool [batch, max_length]: True at prompt positions
        draft_next=draft_next,        # (prompt, cache, index) -> (logits [batch, V], hidden, cache)
        verify_next=verify_next)      # (prompt, cache, index, k) -> (logits [batch, k + 1, V], cache)

Each cycle drafts `k` tokens (`argmax` of `softmax(logits / base_sampler.temperature)`, a masked
position keeps its prompt token), verifies them with `r * q(d) < p(d)`, `p = softmax(z / T)` of
the target's logits, `r` a float32 `keras.random.uniform`, and appends a bonus drawn by Gumbel-max
from `max(p - q, 0) / (sum + 1e-7)` (from `p` after the last draft): both draws from its
`SeedGenerator`, which seeds a fresh `torch.Generator` per draw from its state and advances it.
The state is keras's to keep (uint32 `[2]`), not a stream the reference draws: `streams = "own"`,
every property but certification. Too slow for the distribution campaigns (`interpreted = True`,
SPEC 10's "too slow for distribution campaigns"): a call is one cycle of keras-hub's loop, about
150 Keras ops of 30-60 us each on the torch backend, about 9 ms a request on the CI machine, and a
campaign at `ci` is 200,000 requests (the gate's limit is 120 s a call). Batching requests would not
help: keras-hub advances every row of a batch by the batch's smallest accepted count.

What the adapter does in keras-hub's place (docs/engines.md):
- One call per request (the sampler advances every sequence of a batch by the batch's smallest
  accepted count, a batch semantics SPEC 4 does not have), each a single cycle:
  `prompt = [last verified token, drafts..., 0]`, `index = 1`, `max_length = n + 2`, the drafts'
  positions masked, so keras-hub's own masked path proposes the batch's drafts instead of its
  argmax. A draft model stub returns the batch's draft logits row by row (`log` of a point mass
  for one-hot drafts: `q` is then that point mass); `verify_next` returns the request's `n + 1`
  target rows `x` over `[0, V')`; `temperature` (and the base sampler's, as keras-hub's
  `__init__` sets it) is the request's. A cycle that accepts every draft ends the loop; otherwise
  the next cycle's first `draft_next` call receives the generated sequence and ends the call.
  Emitted: the sequence's tokens from `index` up to that cycle's index.
- Before each call the `SeedGenerator`'s state is set to `[request_seed mod 2**32, 0]`
  (`per_request.request_seed` of the request's state seed and first position; uint32 is keras's).
- Greedy requests go through a `SpeculativeSampler` without `base_sampler` (keras-hub's greedy
  acceptance, `T = 1`); a request with no draft (`k = 0` stacks no draft) is sampled from
  `softmax(z)` by the adapter with torch's CPU generator, seeded the same way (`argmax z` when greedy).
"""

from __future__ import annotations

import os
import types

import numpy as np
import torch

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate
from . import explicit_inputs, hollow
from .per_request import one_thread, request_seed, sample_p, seeded_cpu

MODULE = "keras_hub.src.samplers.speculative_sampler"
CLASS = "SpeculativeSampler"
HOLLOW = ("keras_hub",)  # keras_hub/__init__.py imports every model and tokenizer; keras_hub/src's are empty


class _CycleEnd(Exception):
    """Raised by the draft stub when the second cycle starts: carries the generated sequence."""

    def __init__(self, prompt, index):
        super().__init__("the first cycle ended")
        self.prompt, self.index = prompt, index


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
    return cls


class KerasHubSampler:
    """keras-hub's `SpeculativeSampler` as a sampler (see the module docstring).

    - sampler_class: the class to drive (default: keras-hub's, imported when built).
    - validate: run `rs_verify.validate` before any work (`unvalidated()` turns it off).
    """

    name = "keras-hub"
    streams = "own"  # keras's SeedGenerator: a torch.Generator seeded per draw from keras's state
    supports_chunking = False
    supports_logprobs = False
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model", "one_hot"})
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # top-k / top-p belong to keras-hub's other samplers, not this one
    interpreted = True  # too slow for a distribution campaign (module docstring): keras op dispatch, not Triton
    deviations = frozenset()

    def __init__(self, *, sampler_class=None, validate: bool = True):
        self.cls = load_keras_hub() if sampler_class is None else sampler_class
        self.validate = bool(validate)
        self._samplers: dict = {}

    def unvalidated(self) -> "KerasHubSampler":
        return type(self)(sampler_class=self.cls, validate=False)

    def __repr__(self) -> str:
        return f"KerasHubSampler({getattr(self.cls, '__module__', '?')}.{CLASS}, validate={self.validate})"

    def sampler(self, n: int, greedy: bool):
        """keras-hub's sampler of `n` drafts (built once per count and mode; reseeded per call)."""
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
        seeds, pos = np.asarray(batch.seeds, np.int64)[states], np.asarray(batch.pos, np.int64)[prep.rows]
        temps = np.asarray(batch.temperature, np.float32)[states]
        ids = torch.from_numpy(np.asarray(batch.draft_token_ids, np.int64).copy())
        draft = self.draft_rows(batch, prep, ids)
        target = torch.from_numpy(np.array(np.asarray(batch.target_logits)[:, : prep.vocab], np.float32))
        tokens = []
        with one_thread(), seeded_cpu() as seed_cpu, torch.inference_mode():
            for r in range(batch.num_reqs):
                key = request_seed(int(seeds[r]), int(pos[r]))
                lo, n = int(prep.rows[r]), int(prep.drafts[r])
                if n == 0 and prep.greedy[r]:  # no draft: the adapter takes argmax z or samples p (docstring)
                    tokens.append(explicit_inputs.greedy_tokens(batch, prep, r))
                    continue
                if n == 0:
                    seed_cpu(key)
                    tokens.append([sample_p(prep.p[lo])])
                    continue
                t = 1.0 if prep.greedy[r] else float(temps[r])
                tokens.append(self.verify(self.sampler(n, bool(prep.greedy[r])), key, t, ids[lo : lo + n + 1],
                                          draft[r, :n], target[lo : lo + n + 1]))
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

    def verify(self, sampler, key: int, t: float, ids: torch.Tensor, draft: torch.Tensor,
               target: torch.Tensor) -> list[int]:
        """One cycle of keras-hub's loop on one request (module docstring): its emitted tokens."""
        n = ids.numel() - 1
        sampler.temperature = t
        if sampler.base_sampler is not None:
            sampler.base_sampler.temperature = t  # as SpeculativeSampler.__init__ sets it
        sampler.seed_generator.state.assign(np.array([key % 2**32, 0], np.uint32))
        prompt = torch.cat([ids, ids.new_zeros(1)])[None]  # [1, n + 2]: slot 0, the drafts, the bonus
        mask = torch.ones_like(prompt, dtype=torch.bool)
        mask[0, -1] = False
        calls = [0]

        def draft_next(prompt, cache, index):
            i = calls[0]
            calls[0] += 1
            if i == n:  # the second cycle's first draft: the first cycle's sequence is done
                raise _CycleEnd(prompt, int(index))
            return draft[i][None], None, cache

        def verify_next(prompt, cache, index, k):
            if int(index) != 1 or int(k) != n:
                raise RuntimeError(f"SpeculativeSampler verified from index {int(index)} with k = {int(k)}: the "
                                   f"adapter hands it index 1 and k = {n}: the calling convention changed")
            return target[None], cache

        def target_next(prompt, cache, index):
            raise RuntimeError("SpeculativeSampler called `next`: the adapter verifies through verify_next")

        try:
            out, end = sampler(target_next, prompt, index=1, mask=mask, draft_next=draft_next,
                               verify_next=verify_next), n + 2
        except _CycleEnd as stop:
            out, end = stop.prompt, stop.index
        toks = torch.as_tensor(out).reshape(-1)[1:end].tolist()
        if not 1 <= len(toks) <= n + 1:
            raise RuntimeError(f"SpeculativeSampler advanced to index {end} for {n} drafts from index 1")
        return [int(x) for x in toks]
