"""The contract in code (SPEC.md): the batch and output types, validation, the chunk planner,
the processed probabilities of section 2 and the random streams of section 3.

Imports NumPy only, and nothing else of the project.
"""
