"""Edge campaigns (SPEC sections 2 and 3): Philox edge values and tiny temperatures."""

import numpy as np
import pytest

from rs_verify.contract import murmur3, philox
from rs_verify.contract.streams import StreamFamily
from rs_verify.engine.runner import make_context
from rs_verify.properties import PROPERTIES, PropertyFailure, edges
from rs_verify.reference import ReferenceSampler


def test_edge_values_are_edges():
    """The scanned stream values: a zero uniform, and a Gumbel uniform for which 1 - v == 1 in float32."""
    assert philox.rand(np.int64(edges.U_ZERO[0]), np.int64(edges.U_ZERO[1])) == 0.0
    g = philox.randint(np.int64(edges.TINY_V[0]), np.int64(edges.TINY_V[1]))
    v = philox.rand(g, np.int32(edges.TINY_V[2]))
    assert 0 < v < 2.0**-25 and np.float32(1) - v == np.float32(1)


def test_edge_batches_take_the_edge(reference):
    """Without the clamp / with log(1 - v) the reference would decide otherwise: the campaign is not vacuous."""
    for mode in ("one_hot", "model"):
        out = reference(edges.edge_batch(mode))
        assert out.request(0)[0] != 1  # the draft p(d) ~ 1e-14 is rejected at u = TINY (accepted at u = 0)
        assert out.request(1) != [edges.TINY_V[2]]  # logit -40 loses with G ~ 18 (wins with G = +inf)
    batch = edges.tiny_temperature_batch()
    temps = np.asarray(batch.temperature)[np.asarray(batch.idx_mapping)]
    assert temps.max() <= 1e-5 and temps.min() > 0


# -- murmur3 (SPEC 3b): u = 1.0 keeps the finite noise -log(24 log 2) -----------------------------


def _unfloored_noise(seeds, pos, vocab, out=None):
    """SPEC 3b's noise written `-log(-log(1 - u))`, without the 2**-24 floor: `G = -inf` at u = 1.0."""
    h = murmur3.hash_words(*murmur3.key_words(np.asarray(seeds).reshape(-1, 1), np.asarray(pos).reshape(-1, 1),
                                              np.arange(vocab)[None, :]))
    with np.errstate(divide="ignore"):
        g = -np.log(-np.log1p(-murmur3.uniform_from_hash(h).astype(np.float64)))
    if out is not None:
        out[...] = g
        return out
    return g


UNFLOORED = StreamFamily(name="murmur3-unfloored", section="3d", acceptance=murmur3.MURMUR3.acceptance,
                         noise=_unfloored_noise)


class Unfloored:
    """Declares murmur3 and draws it, except that u = 1.0 gets G = -inf (no floor on 1 - u)."""

    name, streams = "murmur3 without the floor", "murmur3"

    def __call__(self, batch, *, max_chunk_logits=None):
        return ReferenceSampler(streams=UNFLOORED)(batch)


def test_murmur3_top_noise_request_takes_the_edge(reference):
    """The murmur3 edge batch has a third request whose bonus token sits at u = 1.0: the reference emits it
    (its floored G wins by the logit gap), the sampler of the family passes the campaign, and one without the
    floor (G = -inf there) fails it on that request."""
    m3 = murmur3.MURMUR3
    top = m3.edges.top_noise
    for mode in ("one_hot", "model"):
        batch = edges.edge_batch(mode, m3.edges)
        assert batch.num_reqs == 3 and ReferenceSampler(streams=m3)(batch).request(2) == [top[2]]
        assert ReferenceSampler(streams=UNFLOORED)(batch).request(2) != [top[2]]
    assert edges.edge_batch("model").num_reqs == 2  # triton-philox's batch is unchanged: its uniforms stay below 1
    prop = PROPERTIES["stream_edges"]
    prop.check(make_context(ReferenceSampler(streams="murmur3"), reference), None)
    with pytest.raises(PropertyFailure, match=r"request 2, step 0: argmax diverges: reference token 3"):
        prop.check(make_context(Unfloored(), reference), None)
