"""The Hypothesis inputs of the properties, sized by the context's profile.

Which strategy a property draws from (the property modules register these functions):

- `decision_rich`: `strategies.decision_batches`, batches rich in stochastic acceptance
  decisions (drafts drawn from q close to p, padded drafts with model logits, empty
  residuals, ties, vocabularies straddling block sizes): certification
  (`certifiable_batches`), output invariants, the greedy argmax chain, determinism, batch
  invariance and, with `strategies.chunk_caps` (caps at request boundaries and below the
  largest request), chunking and the buffer cap (`batch_and_cap`): most requests verify
  drafts, so a request longer than the cap is there to be cut in every example; the
  regression gate's comparison with a baseline.

The broad `strategies.spec_batches` (greedy-only and K = 0 batches, requests of one row) is
where the bad-input classes start (strategies/invalid.py) and stays public for users' own
tests; no property draws valid batches from it: many of its draws have only one-row
requests or V = 1, where chunk cuts, cross-block reductions and acceptance decisions have
nothing to show, and at the ci budget of 40 examples that cost kills. Decision-rich
batches cost about 1.4x more per example under the Triton interpreter (more rows and
requests verify drafts).
"""

from __future__ import annotations

from hypothesis import strategies as st

from rs_verify.contract import streams as stream_families
from rs_verify.strategies import DEFAULT_BLOCK_SIZES, chunk_caps, decision_batches, invalid_batches
from rs_verify.strategies.invalid import classes_for


def block_sizes(ctx) -> tuple[int, ...]:
    """Vocabulary block sizes the drawn vocabularies straddle. A sampler that declares an int
    `block_v` below the profile's largest vocabulary (the built-in Triton sampler does) gets
    vocabularies around its own block: a few tiles each, so multi-block reductions and partial
    tail tiles run at little cost under the interpreter. Otherwise the defaults (16 to 128, 1024)."""
    own = ctx.record.block_v if ctx.record is not None else None
    max_vocab = ctx.batch_kwargs.get("max_vocab", 1025)
    if isinstance(own, int) and not isinstance(own, bool) and 1 <= own < max_vocab:
        return (own,)
    return DEFAULT_BLOCK_SIZES


def decision_rich(ctx):
    """Valid batches rich in stochastic decisions (strategies.decision_batches with the profile's knobs)."""
    return decision_batches(**ctx.batch_kwargs, block_sizes=block_sizes(ctx))


def batch_and_cap(ctx):
    """A batch and a chunk cap at or around its request boundaries, or below its largest request."""
    return decision_rich(ctx).flatmap(lambda b: st.tuples(st.just(b), chunk_caps(b)))


def _classes(ctx) -> tuple[str, ...]:
    """The SPEC section 9 defect classes the sampler may be sent: none with a sampling parameter it
    does not declare (SPEC section 10), none of the explicit noise unless its family reads it."""
    if ctx.record is None:
        return classes_for((), noise=False)
    return classes_for(ctx.record.sampling_params, noise=_reads_noise(ctx.record.streams))


def _reads_noise(streams) -> bool:
    """Whether a declared stream family takes its random numbers from the batch (SPEC 3c)."""
    if streams == stream_families.OWN:
        return False
    return stream_families.family(streams).keyed_by == "batch"


#: Defect classes per example of `invalid`: a class that only a few of the 40-odd classes reach (a
#: NaN target row, a row with no finite logit: 2 of 44) is missed by 40 one-class examples with
#: probability (42/44)**40 = 0.16, by 40 four-class examples (160 draws) with 6e-4.
CLASSES_PER_EXAMPLE = 4


def invalid(ctx):
    """`CLASSES_PER_EXAMPLE` (batch, field) pairs of distinct defect classes (SPEC section 9), drawn
    uniformly: each pair a batch with one defect."""
    classes = _classes(ctx)
    picks = st.lists(st.sampled_from(classes), min_size=min(CLASSES_PER_EXAMPLE, len(classes)),
                     max_size=min(CLASSES_PER_EXAMPLE, len(classes)), unique=True)
    return picks.flatmap(lambda cs: st.tuples(*(invalid_batches(classes=[c]) for c in cs)))


def invalid_of_every_class(ctx):
    """One (batch, field) pair of every SPEC section 9 defect class, so each example covers them all."""
    return st.tuples(*(invalid_batches(classes=[c]) for c in _classes(ctx)))


def certifiable_batches(ctx):
    """Decision-rich batches of every pattern, extreme logits included: SPEC section 8 takes the
    tolerance from the tokens a decision compares, so extreme rows are certified too."""
    return decision_rich(ctx)
