"""HF transformers' speculative sampling (assisted generation, 5.25.0) under the SPEC section 10 protocol.

    pytest -p rs_verify --rs-sampler=rs_verify.adapters.hf_transformers:TransformersSampler

`TransformersSampler` wraps `_speculative_sampling` of an installed transformers' `MODULE`
(imported when the sampler is built; no transformers code lives in this repository). Its calling
convention, read from `transformers/generation/utils.py` and passed by parameter name:

    _speculative_sampling(
        candidate_input_ids,  # int64 [1, L + n]: the sequence with its n candidate (draft) tokens last
        candidate_logits,     # float32 [1, n, V]: the assistant's processed logits of each candidate
        candidate_length,     # int: n
        new_logits,           # float32 [1, n + 1, V]: the target's processed logits (last: the bonus row)
        assistant_ensemble_weight=None,  # DIVERSE's relaxed verification (lossy by design): left None
    ) -> (valid_tokens int64 [1, m + 1], n_matches)

It takes `softmax` of both itself, accepts candidate `i` iff `r_i < p_i / q_i` with
`r_i = torch.rand_like` and samples the next token with `torch.multinomial` from
`max(p - q, 0)` normalised (from `p` after the last candidate): both from torch's global
generator, which cannot be fed. The sampler declares `streams = "own"`: every property but
certification (SPEC 10), the distribution campaigns included (it is not interpreted).

What the adapter does in transformers' place (docs/engines.md):
- One sequence per call, as `_assisted_decoding` verifies: the adapter calls once per stochastic
  request with `new_logits = z = fp32(x) / T` (SPEC 2; transformers' `TemperatureLogitsWarper`)
  over `[0, V')` and `candidate_logits = d / T` (the assistant's processed scores), the request's
  drafts up to its first padded one (SPEC 3c) as the last `n` ids of `candidate_input_ids`.
- Before each call it seeds torch's global CPU generator from the request's state seed and the
  position of its first row (`per_request.request_seed`; the caller's generator state is restored
  after the batch): the same request gets the same draws in any batch, chunk or order, as a
  user's `set_seed` makes one `generate` call reproducible. The loop runs on one torch thread
  with each call's tensors views of the batch's, prepared once (`rs_verify.adapters.per_request`:
  a distribution campaign at `ci` is 200,000 calls).
- Greedy requests: transformers compares `new_logits.argmax` with the candidates in
  `_assisted_decoding` itself (no function to call): the adapter does it
  (`explicit_inputs.greedy_tokens`), so greedy decisions gate the adapter.
- A request with no draft (`candidate_length = 0` has no meaning to `_speculative_sampling`:
  `candidate_input_ids[:, -0:]` is the whole sequence) is sampled as transformers' plain
  sampling step does (`softmax(z)`), drawn by the adapter (`per_request.sample_p`).
- One-hot drafts (prompt lookup) are verified inline in `_assisted_decoding` (sample `p`, keep the
  candidates that match), not by `_speculative_sampling`: `draft_modes = {"model"}`.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from ..contract.batch import SamplerOutput, SpecBatch
from ..contract.chunking import empty_output
from ..contract.validation import check_layout, validate
from . import explicit_inputs
from .per_request import one_thread, request_seed, sample_p, seeded_cpu
from .signatures import check_parameters

MODULE = "transformers.generation.utils"
FUNCTION = "_speculative_sampling"
PARAMETERS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")
OPTIONAL = {"assistant_ensemble_weight": None}  # 5.25.0: DIVERSE's ensemble verification, lossy: off


def load_transformers():
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        raise ImportError(f"rs_verify.adapters.hf_transformers needs transformers' {MODULE}, which could not be "
                          f"imported: {exc}. Install transformers (5.25.0), or pass speculative_sampling= a function "
                          f"with the same calling convention.") from exc
    if not callable(getattr(module, FUNCTION, None)):
        raise TypeError(f"{MODULE} has no {FUNCTION}: the calling convention changed")
    return getattr(module, FUNCTION)


def check_convention(fn) -> dict:
    """The optional parameters to pass (those of `OPTIONAL` `fn` takes); a TypeError naming a parameter
    the adapter passes that `fn` lacks, or one it requires that the adapter does not know."""
    params = check_parameters(fn, PARAMETERS, "transformers", name=FUNCTION)
    return {k: v for k, v in OPTIONAL.items() if k in params}


class TransformersSampler:
    """transformers' `_speculative_sampling` as a sampler (see the module docstring).

    - speculative_sampling: the function to wrap (default: imported from transformers when built).
    - validate: run `rs_verify.validate` before any work (`unvalidated()` turns it off).
    """

    name = "transformers"
    streams = "own"  # torch's global generator (torch.rand_like, torch.multinomial)
    supports_chunking = False
    supports_logprobs = False  # transformers computes scores outside the verification
    verification_methods = frozenset({"token"})
    draft_modes = frozenset({"model"})  # one-hot candidates are verified inline in _assisted_decoding
    logits_dtypes = frozenset({"float32", "bfloat16", "float16"})
    memory_stats = False
    sampling_params = frozenset()  # logits processors (top-k, top-p) run before the verification
    interpreted = False  # torch on CPU: the distribution campaigns run
    deviations = frozenset()

    def __init__(self, *, speculative_sampling=None, validate: bool = True):
        self.fn = load_transformers() if speculative_sampling is None else speculative_sampling
        self.optional = check_convention(self.fn)
        self.validate = bool(validate)

    def unvalidated(self) -> "TransformersSampler":
        return type(self)(speculative_sampling=self.fn, validate=False)

    def __repr__(self) -> str:
        return f"TransformersSampler({getattr(self.fn, '__module__', '?')}.{FUNCTION}, validate={self.validate})"

    def __call__(self, batch: SpecBatch, *, max_chunk_logits: int | None = None) -> SamplerOutput:
        (validate if self.validate else check_layout)(batch)
        if batch.sampling_params_on():
            raise ValueError(f"{', '.join(batch.sampling_params_on())}: this adapter applies no sampling parameters "
                             f"(transformers' logits processors apply them first; sampling_params is empty)")
        if batch.verification not in self.verification_methods:
            raise ValueError(f"verification: {batch.verification!r} is not declared by this sampler (transformers "
                             f"verifies token by token)")
        if batch.draft_logits is None:
            raise ValueError("draft_logits: this sampler verifies model drafts only (draft_modes = {'model'}: "
                             "transformers verifies one-hot candidates inline, not in _speculative_sampling)")
        if batch.num_reqs == 0:
            return empty_output(batch)
        prep = explicit_inputs.prepare(batch, "cpu")
        states = np.asarray(batch.idx_mapping, np.int64)
        seeds, pos = np.asarray(batch.seeds, np.int64)[states], np.asarray(batch.pos, np.int64)[prep.rows]
        with one_thread(), seeded_cpu() as seed, torch.inference_mode():
            a = self.prepared(batch, prep)
            tokens = []
            for r in range(batch.num_reqs):
                if prep.greedy[r]:
                    tokens.append(explicit_inputs.greedy_tokens(batch, prep, r))
                    continue
                seed(request_seed(int(seeds[r]), int(pos[r])))
                tokens.append(self.verify(a, prep, r))
        return explicit_inputs.output(batch, tokens)

    def prepared(self, batch: SpecBatch, prep) -> dict:
        """What every call's arguments are views of: the draft ids and the assistant's processed
        logits `d / T` of every request (`[R, K, V']`; greedy requests' are unused)."""
        states = np.asarray(batch.idx_mapping, np.int64)
        t = np.asarray(batch.temperature, np.float32)[states]
        t = torch.from_numpy(np.where(t == 0, np.float32(1), t))
        k = batch.num_speculative_steps
        d = torch.from_numpy(np.array(np.asarray(batch.draft_logits)[states, :k, : prep.vocab], np.float32))
        return dict(ids=torch.from_numpy(np.asarray(batch.draft_token_ids, np.int64).copy()),
                    candidates=d / t[:, None, None])

    def arguments(self, a: dict, prep, r: int) -> dict:
        """The keyword arguments of one call: request `r`'s drafts (n >= 1) and processed logits."""
        lo, n = int(prep.rows[r]), int(prep.drafts[r])
        return dict(candidate_input_ids=a["ids"][None, lo : lo + n + 1],  # slot 0: the last verified token
                    candidate_logits=a["candidates"][r : r + 1, :n], candidate_length=n,
                    new_logits=prep.z[None, lo : lo + n + 1], **self.optional)

    def verify(self, a: dict, prep, r: int) -> list[int]:
        n = int(prep.drafts[r])
        if n == 0:  # transformers' plain sampling step
            return [sample_p(prep.p[int(prep.rows[r])])]
        valid, n_matches = self.fn(**self.arguments(a, prep, r))
        toks = valid.reshape(-1).tolist()
        if not 0 <= int(n_matches) <= n or len(toks) != int(n_matches) + 1:
            raise RuntimeError(f"request {r}: {FUNCTION} returned {toks} with n_matches {int(n_matches)} for {n} drafts")
        return toks
