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
    """A (batch, field) pair: a batch with one SPEC section 9 defect, its class drawn uniformly."""
    from strategies import INVALID_CLASSES, invalid_batches

    return st.sampled_from(INVALID_CLASSES).flatmap(lambda c: invalid_batches(classes=[c]))


def invalid_of_every_class(ctx):
    """One (batch, field) pair of every SPEC section 9 defect class, so each example covers them all."""
    from strategies import INVALID_CLASSES, invalid_batches

    return st.tuples(*(invalid_batches(classes=[c]) for c in INVALID_CLASSES))


def certifiable_batches(ctx):
    """Valid batches of every pattern, extreme logits included: SPEC section 8 takes the
    tolerance from the tokens a decision compares, so extreme rows are certified too."""
    from strategies import spec_batches

    return spec_batches(**ctx.batch_kwargs)
