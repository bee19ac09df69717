"""Copy-paste reproducers: a batch as Python code, and the snippet that re-runs a property."""

from __future__ import annotations

import numpy as np

from ..spec.batch import ARRAY_FIELDS, SpecBatch


def _array_code(a) -> str:
    if a is None:
        return "None"
    a = np.asarray(a)
    return f"np.array({a.tolist()!r}, dtype=np.{a.dtype.name}).reshape({a.shape!r})"


def batch_to_code(batch: SpecBatch) -> str:
    """Python source that rebuilds `batch` exactly (float32 values round-trip through repr)."""
    args = [f"    {name}={_array_code(getattr(batch, name))}," for name in ARRAY_FIELDS]
    args += [
        f"    num_speculative_steps={batch.num_speculative_steps!r},",
        f"    logits_dtype={batch.logits_dtype!r},",
        f"    num_logprobs={batch.num_logprobs!r},",
        f"    logprobs_mode={batch.logprobs_mode!r},",
    ]
    return "SpecBatch(\n" + "\n".join(args) + "\n)"


def replay_snippet(prop_name: str, sampler_spec: str, drawn, batch: SpecBatch) -> str:
    """A self-contained script that re-runs property `prop_name` on the failing input."""
    extra = ""
    if isinstance(drawn, tuple) and len(drawn) > 1:
        rest = ", ".join(repr(x) for x in drawn[1:])
        extra = f"drawn = (batch, {rest})\n"
    else:
        extra = "drawn = batch\n"
    return (
        "import numpy as np\n"
        "from numpy import inf, nan\n"
        "from rs_verify import SpecBatch\n"
        "from rs_verify.engine.runner import replay\n"
        f"batch = {batch_to_code(batch)}\n"
        f"{extra}"
        f"replay({prop_name!r}, {sampler_spec!r}, drawn)\n"
    )
