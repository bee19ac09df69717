"""Root conftest: device choice and Hypothesis profiles (see rs_verify.engine.profiles)."""

import os

# The Triton interpreter must be chosen before triton is imported anywhere.
if os.environ.get("TRITON_INTERPRET") is None:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:  # pragma: no cover - torch is a dependency
        os.environ["TRITON_INTERPRET"] = "1"

from rs_verify.engine import profiles  # noqa: E402  (after the device choice)

profiles.load()
