"""Every registered property against every sampler the tests gate, generated from the registry.

One test per (property, gated sampler), run through the project's runner like the CLI and the
plugin run it: a property a sampler's declarations exclude skips with the runner's reason; a
self-check of the suite runs once, against no sampler. The per-family test files hold the unit
tests (the planted bugs, the messages, the helpers), not these runs.

The budget of the default run: the reference (NumPy) takes the profile's whole budget; a sampler
that runs slowly here (the Triton sampler under the interpreter, the torch example on CPU) takes a
share of its examples (tests/conftest.py), and its slow campaigns run in the long run only
(RS_VERIFY_FULL=1, where every sampler takes the whole budget). The Triton sampler drawing the
murmur3 family (SPEC 3b), and the ones reading the explicit family's noise (SPEC 3c: Gumbel-max
and inverse CDF; trees, SPEC 4c, with one coin per child or per node), run, in the default run, the properties that concern a stream family
(`FAMILY_PROPERTIES`), the rest in the long run: their kernels are the default family's but for the
noise (and the explicit family's resample).
"""

import pytest

from conftest import LONG_RUN, SHARE, budget
from examples.bounded_sampler import BoundedSampler
from examples.torch_sampler import TorchSampler
from examples.tree_sampler import TreeSampler, per_node
from rs_verify.engine.runner import pytest_run
from rs_verify.harness import device
from rs_verify.properties import PROPERTIES
from rs_verify.properties.registry import register
from rs_verify.reference import ReferenceSampler
from rs_verify.triton_sampler import TritonSampler

# A run that counts stochastic decisions compares at least this many at the profile's whole budget,
# and SHARE of it where a sampler runs at a share of the examples (12). The counts of the default
# run's drawn batches move with any change of the project's source (Hypothesis draws literals from
# it): at an eighth, 40 to 93 were seen, so a floor of 100 there failed by the draw, not the sampler.
MIN_DECISIONS = 100


# The gated samplers: how a test gets one, and whether it runs at a share in the default run.
GATED = {
    "reference": (lambda request: request.getfixturevalue("reference"), lambda: False),
    "triton": (lambda request: request.getfixturevalue("triton_sampler"), device.interpreted),
    "triton-murmur3": (lambda request: request.getfixturevalue("triton_murmur3_sampler"), device.interpreted),
    "triton-explicit": (lambda request: request.getfixturevalue("triton_explicit_sampler"), device.interpreted),
    "triton-explicit-icdf": (lambda request: request.getfixturevalue("triton_explicit_icdf_sampler"),
                             device.interpreted),
    # the explicit family's tree verification with one coin per parent node (SPEC 4c; the two above take
    # one coin per child): one drawn batch in two is a one-hot tree
    "triton-explicit-per-node": (lambda request: request.getfixturevalue("triton_explicit_per_node_sampler"),
                                 device.interpreted),
    "torch": (lambda request: TorchSampler(), lambda: True),
    # declares logit_bound = 1000 and refuses any finite processed logit beyond it (SPEC 10): every
    # property passes on it, so no strategy or fixed campaign sends one (the reference's cost, at a share)
    "bounded": (lambda request: BoundedSampler(), lambda: True),
    # Tree verification (SPEC 4c, explicit family): the reference and the float32 example, one coin per
    # child and per node; half their drawn batches are trees.
    "reference-tree": (lambda request: ReferenceSampler(streams="explicit"), lambda: False),
    "tree": (lambda request: TreeSampler(), lambda: True),
    "tree-per-node": (lambda request: per_node(), lambda: True),
}
# What a stream family changes (SPEC 3, 8): certification against the reference drawing that family
# (Context.oracle), the stream's edge points, and the bit-for-bit equalities its noise must keep.
FAMILY_PROPERTIES = frozenset({"certified_equivalence", "stream_edges", "chunked_equals_full", "output_invariants",
                               "determinism"})
# gated samplers that run only FAMILY_PROPERTIES in the default run (the explicit ones: half their
# drawn batches are trees, SPEC 4c)
FAMILY_ONLY = {"triton-murmur3", "triton-explicit", "triton-explicit-icdf", "triton-explicit-per-node"}
# What tree verification changes (SPEC 4c): the tree samplers run these in the default run, the rest in the long run.
TREE_PROPERTIES = frozenset({"certified_equivalence", "output_invariants", "greedy_chain", "batch_invariance",
                             "chunked_equals_full"})
TREE_ONLY = {"reference-tree", "tree", "tree-per-node"}
# The Triton sampler's one coin per node (SPEC 4c) changes its acceptance rule only: its default run
# certifies it; chunking and the invariants of tree batches run on the two per-child samplers above.
PER_NODE_ONLY = {"triton-explicit-per-node": frozenset({"certified_equivalence"})}


@pytest.fixture(scope="module")
def triton_murmur3_sampler():
    # the blocks of conftest's triton_sampler
    return TritonSampler(block_v=256, streams="murmur3") if device.interpreted() else TritonSampler(streams="murmur3")


@pytest.fixture(scope="module")
def triton_explicit_sampler():
    # the batch's noise fields (SPEC 3c), resampled by Gumbel-max
    return TritonSampler(block_v=256 if device.interpreted() else None, streams="explicit")


@pytest.fixture(scope="module")
def triton_explicit_icdf_sampler():
    # the batch's noise fields, resampled by inverse CDF (SPEC 4)
    return TritonSampler(block_v=256 if device.interpreted() else None, streams="explicit", resample="inverse_cdf")


@pytest.fixture(scope="module")
def triton_explicit_per_node_sampler():
    # the batch's noise fields, trees with one coin per parent node (SPEC 4c)
    return TritonSampler(block_v=256 if device.interpreted() else None, streams="explicit", tree_uniforms="per_node")


def _shared(gated: str) -> bool:
    return not LONG_RUN and GATED[gated][1]()


def _cases():
    for name, prop in PROPERTIES.items():
        if prop.self_check:
            yield pytest.param(name, None, id=name)
            continue
        for gated in GATED:
            long = prop.slow and _shared(gated) or (gated in FAMILY_ONLY and name not in FAMILY_PROPERTIES
                                                    and not LONG_RUN) or (
                gated in TREE_ONLY and name not in TREE_PROPERTIES and not LONG_RUN) or (
                name not in PER_NODE_ONLY.get(gated, {name}) and not LONG_RUN)
            yield pytest.param(name, gated, id=f"{name}-{gated}", marks=[pytest.mark.long] if long else [])


@pytest.mark.parametrize("name, gated", list(_cases()))
def test_property(name, gated, request):
    sampler = GATED[gated][0](request) if gated else None
    reference = request.getfixturevalue("reference") if gated else None
    outcome = pytest_run(name, sampler, reference, base=budget(gated is not None and _shared(gated)))
    decisions = outcome.stats.get("stochastic_decisions")
    if decisions is not None:
        # SPEC 8 over the whole run: a real count compared, and the excused near-ties within its cap.
        floor = MIN_DECISIONS * (SHARE if _shared(gated) else 1)
        assert decisions >= floor, f"{name}: only {decisions} stochastic decisions compared (floor {floor:g})"
        assert outcome.excused <= max(2, 0.01 * decisions), f"{outcome.excused} excused of {decisions}"


def _check(ctx, drawn):
    """A property for the refusals below (never registered)."""


REFUSED = [
    (dict(name="planner"), "registered twice"),
    (dict(name="not a name"), "identifier"),
    (dict(why_kept=""), "why_kept"),
    (dict(why_kept=None), "why_kept"),
    (dict(needs=("fast", "warp_drive")), r"unknown needs \['warp_drive'\]"),
    (dict(needs="fast"), "not the string"),
    (dict(cost="cheap"), "cost must be a number"),
    (dict(cost=True), "cost must be a number"),
    (dict(strategy=lambda ctx: None, examples_scale=0), "examples_scale must be a positive number"),
    (dict(examples_scale=2.0), "a fixed campaign"),
    (dict(strategy="spec_batches"), "strategy must be a function"),
    (dict(slow="yes"), "slow must be True or False"),
    (dict(self_check=True, needs=("reference",)), "a self-check never calls the sampler"),
    (dict(family=""), "family"),
]


@pytest.mark.parametrize("change, says", REFUSED, ids=[says for _, says in REFUSED])
def test_register_refuses_an_incomplete_or_wrong_record(change, says):
    """`register` checks its arguments when called, and registers nothing it refuses."""
    args = dict(name="toy_property", family="toy", cost=10, why_kept="a test of the registry") | change
    before = dict(PROPERTIES)
    with pytest.raises((TypeError, ValueError), match=says):
        register(args.pop("name"), args.pop("family"), **args)(_check)
    assert PROPERTIES == before


def test_family_properties_are_registered():
    """A renamed property would leave the murmur3 sampler's default run without it."""
    assert FAMILY_PROPERTIES <= set(PROPERTIES) and TREE_PROPERTIES <= set(PROPERTIES)
