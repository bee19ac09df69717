"""The Hypothesis inputs of the properties, sized by the context's profile."""

from __future__ import annotations

from hypothesis import strategies as st


def batches(ctx):
    """Valid ragged batches (strategies.spec_batches with the profile's knobs)."""
    from strategies import spec_batches

    return spec_batches(**ctx.batch_kwargs)


def batch_and_cap(ctx):
    """A batch and a chunk cap biased to its request boundaries."""
    from strategies import chunk_caps

    return batches(ctx).flatmap(lambda b: st.tuples(st.just(b), chunk_caps(b)))


def invalid(ctx):
    """(batch, field) pairs: a batch with one SPEC section 9 defect and the field it must name."""
    from strategies import invalid_batches

    return invalid_batches(**ctx.batch_kwargs)
