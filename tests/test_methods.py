"""Verification methods (SPEC sections 4 and 4b): one record each, checked when built, and the one
place the record, the capabilities, a property's needs, the summaries and the narrowing read."""

import dataclasses

import numpy as np
import pytest

from examples.torch_sampler import TorchSampler
from rs_verify.contract import methods
from rs_verify.contract.batch import EXERCISED, VERIFICATION_METHODS
from rs_verify.contract.methods import BLOCK, METHODS, TOKEN, UnknownMethod, VerificationMethod
from rs_verify.engine.context import make_context
from rs_verify.harness.context import capabilities
from rs_verify.harness.record import EXERCISED_NAMES, SamplerRecord
from rs_verify.properties.assertions import as_declared
from rs_verify.properties.equivalence import with_block_and_params
from rs_verify.properties.memory import large_batch
from rs_verify.properties.registry import NEEDS, PROPERTIES
from rs_verify.reference import ReferenceSampler


def test_the_registry_holds_the_specs_methods():
    assert list(METHODS) == ["token", "block", "tree"] == list(VERIFICATION_METHODS)
    assert methods.BASELINE is TOKEN and TOKEN.baseline and TOKEN.needs == ()
    assert methods.OFFERED == (BLOCK, methods.TREE) and BLOCK.section == "4b" and BLOCK.needs == ("block_verification",)
    assert methods.TREE.section == "4c" and methods.TREE.needs == ("tree_verification",)
    assert methods.lookup("block") is BLOCK and large_batch(r=1, k=1, v=8).method is TOKEN
    assert EXERCISED[: len(methods.OFFERED)] == ("block", "tree")


@pytest.mark.parametrize("name", ["blok", "Block", "", None, ["block"]])
def test_an_unknown_method_is_a_clear_error(name):
    with pytest.raises(UnknownMethod, match=r"unknown verification method .*\['token', 'block', 'tree'\]"):
        methods.lookup(name)
    with pytest.raises(UnknownMethod, match="unknown verification method"):
        large_batch(r=1, k=1, v=8).replace(verification=name).method


@pytest.mark.parametrize("kw, match", [
    (dict(name="Block"), "lowercase identifier"),
    (dict(name="tree verification"), "lowercase identifier"),
    (dict(section="4.2"), "SPEC section"),
    (dict(section=4), "SPEC section"),
    (dict(label=""), "non-empty phrase"),
    (dict(label=" tree verification"), "non-empty phrase"),
    (dict(capability="Tree-Verification"), "capability"),
])
def test_a_malformed_method_is_refused_when_built(kw, match):
    fields = dict(name="tree", section="4c", label="tree verification", capability="tree_verification") | kw
    with pytest.raises(ValueError, match=match):
        VerificationMethod(**fields)


def test_a_malformed_registry_is_refused_when_built():
    tree = VerificationMethod("tree", section="4c", label="tree verification", capability="tree_verification")
    assert list(methods._registry(TOKEN, BLOCK, tree)) == ["token", "block", "tree"]
    with pytest.raises(ValueError, match="registered twice"):
        methods._registry(TOKEN, BLOCK, BLOCK)
    with pytest.raises(ValueError, match="the first, needs no capability"):
        methods._registry(BLOCK, TOKEN)
    with pytest.raises(ValueError, match="the first, needs no capability"):
        methods._registry(TOKEN, VerificationMethod("plain", section="4", label="plain verification"))
    with pytest.raises(ValueError, match="share a capability"):
        methods._registry(TOKEN, BLOCK, VerificationMethod("tree", "4c", "tree verification", "block_verification"))
    with pytest.raises(TypeError, match="not a VerificationMethod"):
        methods._registry(TOKEN, "block")


def test_what_the_summaries_print_comes_from_the_record():
    """The exercised tally, what a declaration leaves unexercised and why a property is skipped
    all print the record's label and section."""
    assert EXERCISED_NAMES["block"] == BLOCK.titled == "block verification (SPEC section 4b)"
    assert NEEDS[BLOCK.capability] == BLOCK.not_declared and BLOCK.label in BLOCK.not_declared
    token_only, both = SamplerRecord(name="t"), SamplerRecord(name="b", verification_methods={"token", "block"})
    assert any(line.startswith(f"{BLOCK.label}, SPEC section {BLOCK.section} ") for line in token_only.not_exercised())
    assert not any(BLOCK.label in line for line in both.not_exercised())
    assert both.exercised([{"block": 3}]) == [f"{BLOCK.titled}: 3 batches, in 1 property",
                                              *(line for line in both.exercised([]) if BLOCK.titled not in line)]
    assert token_only.exercised([{"block": 3}]) == []


def test_a_declared_method_is_a_capability_and_gates_its_properties():
    needing = [p for p in PROPERTIES.values() if BLOCK.capability in p.needs]
    assert needing, "no property runs on block-verified batches"
    assert BLOCK.capability in capabilities(make_context(ReferenceSampler(), profile="ci"))
    assert BLOCK.capability not in capabilities(make_context(TorchSampler(), profile="ci"))


@pytest.mark.parametrize("declared", [{"token"}, {"token", "block"}])
def test_fixed_and_drawn_batches_are_narrowed_alike(declared):
    """`as_declared` (fixed batches) keeps exactly the methods and parameters the strategies would
    draw (`strategy_kwargs`), and returns the batch itself when nothing is to change."""
    record = SamplerRecord(name="n", verification_methods=declared, sampling_params={"top_k"},
                           supports_logprobs=False, draft_modes={"one_hot"})
    kw = record.strategy_kwargs()
    assert kw["verifications"] == tuple(m for m in METHODS if m in declared)
    rich = with_block_and_params(large_batch(r=4, k=2, v=16))
    fitted = record.fit(rich)
    assert fitted.verification in kw["verifications"] and fitted.verification == ("block" if "block" in declared
                                                                                    else "token")
    assert set(fitted.sampling_params_on()) <= set(kw["sampling_params"]) and np.array_equal(fitted.top_k, rich.top_k)
    assert fitted.top_p is None and fitted.min_p is None and rich.top_p is not None
    assert fitted.num_logprobs is None and fitted.draft_logits is None
    assert record.fit(fitted) is fitted

    class Declaring(TorchSampler):
        verification_methods = declared
        sampling_params = {"top_k"}
        supports_logprobs = False
        draft_modes = {"one_hot"}

    declared_batch = as_declared(rich, Declaring())
    for f in dataclasses.fields(fitted):
        a, b = getattr(declared_batch, f.name), getattr(fitted, f.name)
        assert (a is None and b is None) or np.array_equal(a, b), f.name
