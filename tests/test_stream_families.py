"""SPEC section 3: stream families as records (`rs_verify.contract.streams`), their registry, and a
sampler's declaration of one (SPEC section 10), shipped or its own (section 3d)."""

import numpy as np
import pytest

from examples.torch_sampler import TorchSampler
from rs_verify.contract import streams
from rs_verify.contract.streams import StreamEdges, StreamFamily, family
from rs_verify.contract.triton_philox import TRITON_PHILOX, acceptance_uniforms, gumbel_noise
from rs_verify.engine.context import make_context
from rs_verify.engine.runner import pytest_run
from rs_verify.harness.context import capabilities
from rs_verify.harness.record import DeclarationError, SamplerRecord, record_of
from rs_verify.reference import ReferenceSampler


def _shifted_noise(seeds, pos, vocab, out=None):
    return gumbel_noise(seeds, pos + 1, vocab, out=out)


# A family the suite does not ship (SPEC 3d): triton-philox's functions under another name.
USER_FAMILY = StreamFamily(name="philox-copy", section="3d", acceptance=acceptance_uniforms, noise=gumbel_noise,
                           floor=TRITON_PHILOX.floor, edges=TRITON_PHILOX.edges)
# The same with the noise one position off: a sampler drawing triton-philox noise does not use it.
OFF_BY_ONE = StreamFamily(name="philox-off-by-one", section="3d", acceptance=acceptance_uniforms,
                          noise=_shifted_noise)


def _declaring(family_decl):
    sampler = TorchSampler()
    sampler.streams = family_decl
    return sampler


def test_registry_resolves_names_and_aliases():
    assert family("triton-philox") is TRITON_PHILOX
    assert family("spec") is TRITON_PHILOX  # the former name
    assert family(TRITON_PHILOX) is TRITON_PHILOX
    assert family("rs_verify.contract.triton_philox:TRITON_PHILOX") is TRITON_PHILOX
    assert "triton-philox" in [f.name for f in streams.shipped()]
    assert TRITON_PHILOX.triton == "philox" and TRITON_PHILOX.section == "3a"


def test_unknown_family_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown stream family 'mersenne'.*triton-philox"):
        family("mersenne")
    with pytest.raises(DeclarationError, match="streams 'mersenne'.*unknown stream family"):
        SamplerRecord(name="x", streams="mersenne")
    with pytest.raises(DeclarationError, match="must be a stream family's name"):
        SamplerRecord(name="x", streams=3)


@pytest.mark.parametrize("change, match", [
    ({"section": "4"}, "section"),
    ({"name": "own"}, "name"),
    ({"aliases": ("spec",), "name": "spec"}, "aliases"),
    ({"keyed_by": "batch"}, "keyed_by"),
    ({"acceptance": lambda s, p: acceptance_uniforms(s, p).astype(np.float64)}, "float32 uniforms"),
    ({"noise": lambda s, p, v, out=None: np.zeros((len(s), v), np.float32)}, "float64"),
    ({"edges": StreamEdges(zero_uniform=(2026, 1), tiny_noise=(2026, 1671644, 3))}, "zero_uniform"),
    ({"edges": StreamEdges(zero_uniform=(2026, 3554443533), tiny_noise=(2026, 1671644, 4))}, "tiny_noise"),
    ({"triton_check": "no_colon"}, "triton_check"),
])
def test_malformed_family_is_refused_when_built(change, match):
    kw = dict(name="broken", section="3d", acceptance=acceptance_uniforms, noise=gumbel_noise,
              floor=TRITON_PHILOX.floor)
    with pytest.raises(ValueError, match=match):
        StreamFamily(**{**kw, **change})


def test_register_refuses_a_taken_name():
    clash = StreamFamily(name="triton-philox", section="3a", acceptance=acceptance_uniforms, noise=gumbel_noise)
    with pytest.raises(ValueError, match="taken"):
        streams.register(clash)


def test_spec_is_read_as_triton_philox():
    """The former name still declares the family (SPEC section 10), in process and across processes."""
    rec = record_of(_declaring("spec"))
    assert rec.streams == "triton-philox" and rec.family is TRITON_PHILOX
    assert SamplerRecord.from_dict({"name": "old", "streams": "spec"}).family is TRITON_PHILOX
    assert record_of(_declaring("own")).family is None


def test_user_family_record_travels_by_its_path():
    rec = record_of(_declaring(USER_FAMILY))
    assert rec.streams is USER_FAMILY and rec.family is USER_FAMILY
    sent = rec.to_dict()
    assert sent["streams"].endswith(":USER_FAMILY")
    assert SamplerRecord.from_dict(sent).family is USER_FAMILY
    local = StreamFamily(name="local", section="3d", acceptance=acceptance_uniforms, noise=gumbel_noise)
    with pytest.raises(DeclarationError, match="cannot cross a process boundary"):
        record_of(_declaring(local)).to_dict()


def test_reference_draws_the_declared_family():
    ctx = make_context(_declaring(USER_FAMILY), ReferenceSampler())
    assert "certifiable_streams" in capabilities(ctx) and ctx.oracle.family is USER_FAMILY
    own = make_context(_declaring("own"), ReferenceSampler())
    assert "certifiable_streams" not in capabilities(own) and own.oracle is None


def test_user_family_is_certified_like_a_shipped_one():
    """A sampler declaring a family the suite does not ship is certified against it (SPEC 3d)."""
    pytest_run("certified_equivalence", _declaring(USER_FAMILY), ReferenceSampler())


def test_declared_family_is_the_one_certified():
    """Not a test that cannot fail: the same sampler declaring a family whose noise it does not draw fails."""
    with pytest.raises(AssertionError, match="differ from the reference"):
        pytest_run("certified_equivalence", _declaring(OFF_BY_ONE), ReferenceSampler())


def test_triton_helpers_of_each_shipped_family():
    """`StreamFamily.triton` names a noise the Triton sampler's kernels draw (their constexpr STREAM,
    listed in triton_sampler/streams.py): a shipped family that has one is a family the sampler offers."""
    from rs_verify.triton_sampler import TritonSampler, streams as kernels_streams

    offered = [fam for fam in streams.shipped() if fam.triton is not None]
    assert {fam.triton for fam in offered} == set(kernels_streams.KERNEL_STREAMS)
    for fam in offered:
        assert kernels_streams.stream_family(fam.name) is fam
        assert TritonSampler(streams=fam.name).streams == fam.name
