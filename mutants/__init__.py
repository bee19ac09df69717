"""Planted bugs ("mutants") that prove the property library's power.

`mutants.catalogue.MUTANTS` lists small, realistic changes to the production Triton
sampler (and a few to the NumPy reference), each tied to a failure mode of DESIGN.md.
They are applied in memory with `mutants.mutation.load_patched`: the files on disk
are never edited. `python -m mutants` runs the property library against every mutant
and prints the kill matrix (see `mutants.campaign`).

Not part of the shipped sampler (not in the wheel): a test-and-benchmark asset.
"""
