"""Root conftest: the suite's backend choice (before triton is imported) and the Hypothesis profile.

The project's own tests run on what this machine offers: CUDA when usable, else the Triton
interpreter; `RS_VERIFY_DEVICE=cpu|cuda` forces one (`rs_verify.harness.device`).
"""

import os

from rs_verify.engine import profiles
from rs_verify.harness import device

device.resolve(os.environ.get("RS_VERIFY_DEVICE") or None)
profiles.load()
