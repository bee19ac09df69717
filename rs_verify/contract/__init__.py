"""The contract in code (SPEC.md): the batch and output types, validation, the chunk planner,
the processed probabilities of section 2, the random-stream families of section 3 (`streams`:
one `StreamFamily` record each, a module per family such as `triton_philox`) and the verification
methods of section 4 (`methods`: one record each) and the declared deviations of section 11
(`deviations`: one `Deviation` record each, the shipped ones in `known_deviations`).

Imports NumPy only, and nothing else of the project.
"""

# The shipped stream families: importing each module registers its record (`streams.register`),
# and `streams` imports none of them, so the registry is whole before any lookup and no lookup
# imports (a git baseline's child that swaps the contract's modules keeps this tree's registry).
# A new family is one more module here.
from . import triton_philox, murmur3, murmur3_fp64, explicit  # noqa: F401,E402  (in registration order)
from . import known_deviations  # noqa: F401,E402  (registers the shipped deviations, SPEC section 11)
