"""The contract in code (SPEC.md): the batch and output types, validation, the chunk planner,
the processed probabilities of section 2, the random-stream families of section 3 (`streams`:
one `StreamFamily` record each, a module per family such as `triton_philox`) and the verification
methods of section 4 (`methods`: one record each).

Imports NumPy only, and nothing else of the project.
"""
