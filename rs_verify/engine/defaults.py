"""Names and defaults shared by the engine and both front ends, defined once.

This module imports nothing: the pytest plugin, which every pytest session of an environment
with rs-verify installed loads, reads them without importing the engine's heavy modules.
"""

PROFILE_NAMES = ("dev", "ci", "gpu", "nightly")  # the Hypothesis profiles of engine/profiles.py
ISOLATION_LEVELS = ("property", "call", "off")  # engine/isolation.py; the first is the default
DEFAULT_TIMEOUT = 120.0  # seconds a sampler call may take in a child process
DEFAULT_BUNDLE_DIR = ".rs-verify/bundles"  # where failure bundles are written
BASELINE_MODES = ("exact", "certified")  # engine/baseline.py; the first is the default
DEFAULT_MAX_SLOWDOWN = 1.05  # the regression gate's speed ratio
DEFAULT_TIMING_TABLE = ".rs-verify/timing.md"  # the speed comparison's Markdown table (CI uploads it)
