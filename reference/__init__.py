"""The NumPy float64 reference sampler, the oracle of rs-verify (SPEC sections 2-6 and 8).

`ReferenceSampler` verifies a `SpecBatch` in float64 with the random numbers of a stream
family (`rs_verify.contract.streams`; by default `triton-philox`, bit for bit Triton's
`tl.rand` / `tl.randint`; certification gives it the sampler's declared family) and can
report every decision with its margin and tolerance scale (`verify_with_trace`).
Imports only NumPy and the batch contract: never torch, triton or the Triton sampler.

Modules, by what they hold:
- `logits`: processed logits and float64 probabilities (SPEC section 2);
- `streams`: acceptance uniforms and Gumbel noise of a batch's rows in a stream family (section 3);
- `masks`: the sampling-parameter masks of a slab and their near-tie decisions (section 2);
- `block`: block verification of a slab's stochastic requests (section 4b);
- `slab`: verification of a slab of whole requests, vectorized (section 4);
- `inverse_cdf`: inverse-CDF resampling of the explicit family and its boundary margins (sections 4, 8);
- `logprobs`: top-k logprobs and ranks (section 6);
- `trace`: decisions with margins and tolerance scales (section 8);
- `sampler`: `ReferenceSampler`, the protocol of section 10.
"""

from .logits import draft_probs, log_softmax64, processed_logits, target_probs
from .masks import MASK_NEAR
from .sampler import ReferenceSampler
from .streams import acceptance_uniforms, gumbel_noise
from .trace import Decision, RequestTrace

__all__ = [
    "Decision",
    "MASK_NEAR",
    "ReferenceSampler",
    "RequestTrace",
    "acceptance_uniforms",
    "draft_probs",
    "gumbel_noise",
    "log_softmax64",
    "processed_logits",
    "target_probs",
]
