"""Hypothesis profiles shared by the tests, the pytest plugin and the CLI.

- ``dev``: the default on a workstation; quick, random, with the local example database.
- ``ci``: deterministic (``derandomize``), no deadline, no database; what ``.ci/run`` uses.
  Registered under Hypothesis's own name ``ci`` so that ``CI=true`` selects it too.
- ``gpu``: for GPU CI runners; deterministic, more examples, larger batches.
- ``nightly``: long campaigns; random, many examples.

Select one with ``HYPOTHESIS_PROFILE=<name>``, pytest's ``--hypothesis-profile`` or
``--rs-profile``, or ``rs-verify check --profile``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from .defaults import PROFILE_NAMES

# Sampler calls run through the Triton interpreter can take a second: never a deadline,
# and the generated batches are large enough that these health checks would misfire.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

# One failure per property: the gate reports the first bug it finds, shrunk, with its batch.
_COMMON = dict(deadline=None, suppress_health_check=_SLOW_OK, report_multiple_bugs=False)

settings.register_profile("dev", max_examples=20, **_COMMON)
settings.register_profile("ci", max_examples=40, derandomize=True, database=None, print_blob=True, **_COMMON)
settings.register_profile("gpu", max_examples=200, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("nightly", max_examples=2000, print_blob=True, **_COMMON)

# Batch sizes per profile (R = 0 is pinned by unit tests; drawing it here would spend
# examples on empty batches): the interpreter costs a few ms per Triton program instance,
# so CPU profiles keep grids small; the GPU profile draws Qwen-scale vocabularies too.
BATCH_KWARGS = {
    "dev": dict(min_reqs=1, max_reqs=6, max_spec_steps=4, max_vocab=300),
    "ci": dict(min_reqs=1, max_reqs=6, max_spec_steps=4, max_vocab=300),
    "gpu": dict(min_reqs=1, max_reqs=16, max_spec_steps=8, max_vocab=152064),
    "nightly": dict(max_reqs=8, max_spec_steps=8, max_vocab=1025),
}


# Wall-clock budget for shrinking one failure, after which the smallest failing example found
# so far is reported (see rs_verify.engine.runner.hypothesis_test). `RS_VERIFY_SHRINK_SECONDS`
# overrides it for every profile (a CI job that only needs the verdict, say).
SHRINK_SECONDS = {"dev": 60, "ci": 180, "gpu": 300, "nightly": 600}
SHRINK_ENV = "RS_VERIFY_SHRINK_SECONDS"
# Derandomized profiles bound shrinking by a count of shrink candidates instead (the time budget
# above is then only a safety net): the same failure then shrinks to the same example, and lands
# in the same bundle file, on every rerun and on every machine. About 0.3-1 s per candidate under
# the Triton interpreter at ci sizes.
SHRINK_CALLS = {"ci": 60, "gpu": 200}


def shrink_calls(name: str) -> int | None:
    """How many shrink candidates a derandomized profile tries after the first failure (None: no count)."""
    return None if os.environ.get(SHRINK_ENV) else SHRINK_CALLS.get(name)


def batch_kwargs(name: str) -> dict:
    """The strategies' batch-size knobs for profile `name` (a copy; unknown names get dev's)."""
    return dict(BATCH_KWARGS.get(name, BATCH_KWARGS["dev"]))


def shrink_seconds(name: str) -> float:
    override = os.environ.get(SHRINK_ENV)
    if override:
        try:
            return float(override)
        except ValueError:
            raise ValueError(f"{SHRINK_ENV}={override!r} is not a number of seconds") from None
    return SHRINK_SECONDS.get(name, SHRINK_SECONDS["dev"])


def default_profile_name() -> str:
    """``HYPOTHESIS_PROFILE`` if set, else ``ci`` under CI, else ``dev``."""
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name:
        return name
    return "ci" if os.environ.get("CI") else "dev"


def load(name: str | None = None) -> str:
    """Load profile `name` (default: `default_profile_name()`), return its name."""
    name = name or default_profile_name()
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; expected one of {PROFILE_NAMES}")
    settings.load_profile(name)
    return name


def active() -> str:
    """The name of the Hypothesis profile in force."""
    return settings.get_current_profile_name()
