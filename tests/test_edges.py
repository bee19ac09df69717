"""Edge campaigns (SPEC sections 2 and 3): Philox edge values and tiny temperatures."""

import numpy as np

from rs_verify.contract import philox
from rs_verify.properties import edges


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
