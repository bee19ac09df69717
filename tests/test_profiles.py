"""The Hypothesis profile in force is the one asked for."""

import os

from hypothesis import settings

from rs_verify.engine import profiles


def test_active_profile_is_the_requested_one(request):
    want = (request.config.getoption("--hypothesis-profile", None) or os.environ.get("HYPOTHESIS_PROFILE")
            or ("ci" if os.environ.get("CI") else "dev"))
    assert profiles.active() == want
    assert settings.get_current_profile_name() == want


def test_ci_profile_is_deterministic():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.deadline is None and ci.database is None
    for name in profiles.PROFILE_NAMES:
        assert settings.get_profile(name).deadline is None
