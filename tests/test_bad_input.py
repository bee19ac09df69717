"""Bad input (SPEC section 9)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rs_verify.contract.validation import validate
from rs_verify.strategies import invalid_batches
from rs_verify.strategies.bad_noise import BAD_VALUES as NOISE_BAD_VALUES
from rs_verify.strategies.bad_params import BAD_VALUES

FAST = settings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _bad_states(batch, field) -> np.ndarray:
    """SPEC 9, read independently of the validator: the referenced states whose value is bad."""
    states = np.asarray(batch.idx_mapping, np.int64)
    v = np.asarray(getattr(batch, field))[states].astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = {"top_k": v < 0, "top_p": ~np.isfinite(v) | (v <= 0) | (v > 1), "min_p": np.isnan(v) | (v < 0) | (v > 1)}
    return states[bad[field]]


@pytest.mark.parametrize("defect", sorted(BAD_VALUES))
def test_bad_parameter_values_name_the_field_and_state(defect):
    """Each bad-value class breaks one referenced state, and the contract names that field and that
    state (the first offending index of the per-state array)."""

    @FAST
    @given(invalid_batches(classes=[defect]))
    def check(pair):
        field = pair.expected_field
        states = _bad_states(pair.batch, field)
        assert states.size == 1, (defect, states)
        with pytest.raises(ValueError, match=rf"^{field}\[{states[0]}\]: "):
            validate(pair.batch)

    check()


@pytest.mark.parametrize("defect", [f"{kind}:{name}" for name in ("top_k", "top_p", "min_p", "accept_uniforms",
                                                                   "resample_gumbel", "resample_uniforms")
                                     for kind in ("dtype", "shape")] + ["unknown_verification"])
def test_whole_field_defects_name_the_field(defect):
    """Wrong dtypes or shapes of the parameters, and an unknown verification method, are reported
    for the whole field (no index), before anything else is read."""

    @FAST
    @given(invalid_batches(classes=[defect]))
    def check(pair):
        with pytest.raises(ValueError, match=rf"^{pair.expected_field}: "):
            validate(pair.batch)

    check()


@pytest.mark.parametrize("defect", sorted(NOISE_BAD_VALUES))
def test_bad_noise_values_name_the_field_and_entry(defect):
    """Each bad explicit-noise class breaks one entry (SPEC 9: uniforms outside (0, 1) or not finite,
    Gumbel noise not finite), and the contract names that field and that entry."""

    @FAST
    @given(invalid_batches(classes=[defect]))
    def check(pair):
        field = pair.expected_field
        a = np.asarray(getattr(pair.batch, field))
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(a) if field == "resample_gumbel" else ~((a > 0) & (a < 1))
        cells = np.argwhere(bad)
        assert len(cells) == 1, (defect, cells)
        index = int(cells[0][0]) if a.ndim == 1 else tuple(int(i) for i in cells[0])
        with pytest.raises(ValueError, match=rf"^{field}\[{re.escape(str(index))}\]: "):
            validate(pair.batch)

    check()
