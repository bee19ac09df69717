"""Moved to `rs_verify.harness.device` (the one backend choice). This alias keeps a sampler written
against the old name, or a baseline revision from before the move (`git:<rev>`), loading."""

from ..harness.device import *  # noqa: F401,F403
from ..harness.device import cuda_status, interpreted, resolve  # noqa: F401  (the names samplers use)
