"""The one replay path: re-run a property's check on one input, from a bundle or from code.

`prepare()` builds the context exactly as the run that failed had it (its sampler, its
reference only when the property needs one, its profile and device, each overridable);
`replay()` runs the check. The CLI's `rs-verify replay`, the reproducer snippets in failure
messages and bundles all come through here, so one failing input always replays under one
context. The snippets are short: a bundle's loads the batch from the bundle file.

`isolate` (`rs_verify.engine.isolation.LEVELS`) runs the sampler in a child process, so that
replaying a crash or a hang raises `SamplerCrash` / `SamplerTimeout` instead of ending the
replaying process; the CLI's replay isolates by default, the Python helpers do not.
"""

from __future__ import annotations

import numpy as np

from ..harness.context import Context
from ..properties.registry import PROPERTIES, Property
from ..contract.batch import ARRAY_FIELDS, SCALAR_FIELDS, SpecBatch
from . import bundle as bundles
from . import isolation
from .baseline import open_baseline
from .context import make_context, skip_reason
from .records import CRASH, TIMEOUT, Failure
from ..harness.handle import with_deviations
from ..harness.samplers import load_sampler

DEFAULT_REFERENCE = "reference"


class ReplayError(ValueError):
    """The input cannot be replayed here (unknown property, property does not apply, bad sampler)."""


def prepare(prop_name: str, sampler_spec: str, *, reference_spec: str | None = DEFAULT_REFERENCE,
            profile: str | None = None, device: str | None = None, baseline: str | None = None,
            baseline_mode: str = "exact", isolate: str = "off",
            timeout: float = isolation.DEFAULT_TIMEOUT, deviations=(),
            baseline_catalogue: str | None = None) -> tuple[Property, Context]:
    """The property and the context to replay it in; `ReplayError` when that is not possible.
    `deviations`: names the run added to the sampler's declared deviations (SPEC 11).

    `baseline` (a baseline spec, `rs_verify.engine.baseline`) is opened for the regression gate's
    properties only; it stays open until the process exits (`baseline_catalogue`: the releases.toml
    a `release:` baseline's entry is read from)."""
    prop = PROPERTIES.get(prop_name)
    if prop is None:
        raise ReplayError(f"property {prop_name!r} is not registered in this rs-verify "
                          f"({len(PROPERTIES)} properties; see `rs-verify list`)")
    try:
        sampler = with_deviations(isolation.load(sampler_spec, isolate, timeout=timeout, device_name=device),
                                  list(deviations or ()))
        # a baseline property certifies differences against the reference in certified mode, and also a
        # declared convention change (stream family, block seed, deviations) in either mode
        certifies = "reference" in prop.needs or "baseline" in prop.needs
        wants_ref = certifies and reference_spec not in (None, "", "none")
        reference = load_sampler(reference_spec) if wants_ref else None
    except (ValueError, isolation.SamplerDied) as exc:
        raise ReplayError(str(exc)) from exc
    ctx = make_context(sampler, reference, profile=profile or "dev", device=device)
    if baseline and "baseline" in prop.needs:
        try:
            ctx.baseline = open_baseline(baseline, sampler_spec=sampler_spec, mode=baseline_mode, device=device,
                                         catalogue=baseline_catalogue)
        except ValueError as exc:
            raise ReplayError(str(exc)) from exc
    reason = skip_reason(prop, ctx)
    if reason:
        raise ReplayError(f"property {prop.name!r} does not apply here: {reason}")
    return prop, ctx


def prepare_bundle(b: bundles.Bundle, *, sampler: str | None = None, reference: str | None = None,
                   profile: str | None = None, device: str | None = None, isolate: str = "off",
                   timeout: float | None = None) -> tuple[Property, Context]:
    """`prepare()` with the bundle's recorded sampler, reference, profile, device and timeout unless overridden."""
    recorded = b.options.get("device")
    return prepare(b.property, sampler or b.sampler,
                   reference_spec=reference if reference is not None else (b.reference or DEFAULT_REFERENCE),
                   profile=profile or b.options.get("profile"),
                   device=device or (recorded if recorded in ("cpu", "cuda") else None),
                   baseline=b.options.get("baseline"), baseline_mode=b.options.get("baseline_mode", "exact"),
                   isolate=isolate, timeout=timeout or b.options.get("timeout") or isolation.DEFAULT_TIMEOUT,
                   deviations=b.options.get("deviations", ()),
                   baseline_catalogue=b.options.get("baseline_catalogue"))


def check(prop: Property, ctx: Context, drawn) -> None:
    """Run the property's check once on `drawn` (an isolated sampler in a child of its own, closed after)."""
    outer = ctx.sampler
    try:
        with isolation.for_property(outer.obj) as obj:
            ctx.sampler = outer.with_object(obj)
            prop.check(ctx, drawn)
    finally:
        ctx.sampler = outer


def replay(prop_name: str, sampler_spec: str, drawn, **context) -> Context:
    """Re-run one property check on one input; raises the failure again if it still fails.

    Keyword arguments as for `prepare()`. Returns the context (its `stats` hold, e.g., the
    fits of a distribution campaign).
    """
    prop, ctx = prepare(prop_name, sampler_spec, **context)
    check(prop, ctx, drawn)
    return ctx


def replay_bundle(path, **overrides) -> Context:
    """Re-run the failure stored in the bundle at `path` (overrides as for `prepare_bundle`)."""
    b = bundles.load(path)
    prop, ctx = prepare_bundle(b, **overrides)
    check(prop, ctx, b.drawn)
    return ctx


# -- reproducer snippets -------------------------------------------------------------


def bundle_snippet(path, kind: str | None = None) -> str:
    """A short script that replays a bundle (the batch is read from the file)."""
    if kind in (CRASH, TIMEOUT):  # in a child process: the crash or hang must not take this one down
        return ("from rs_verify.engine.replay import replay_bundle\n"
                f"replay_bundle({str(path)!r}, isolate='property')  # raises SamplerCrash / SamplerTimeout again\n")
    return ("from rs_verify.engine.replay import replay_bundle\n"
            f"replay_bundle({str(path)!r})  # raises the failure again while it reproduces\n")


def _array_code(a) -> str:
    if a is None:
        return "None"
    a = np.asarray(a)
    return f"np.array({a.tolist()!r}, dtype=np.{a.dtype.name}).reshape({a.shape!r})"


def batch_to_code(batch: SpecBatch) -> str:
    """Python source that rebuilds `batch` exactly (float32 values round-trip through repr)."""
    args = [f"    {name}={_array_code(getattr(batch, name))}," for name in ARRAY_FIELDS]
    args += [f"    {name}={getattr(batch, name)!r}," for name in SCALAR_FIELDS]
    return "SpecBatch(\n" + "\n".join(args) + "\n)"


def code_snippet(failure: Failure) -> str:
    """A self-contained script that re-runs the failing property on its input (no bundle needed)."""
    batch = failure.failing_batch()
    if batch is None:  # a fixed campaign (re-runs from its seed) or a draw without a batch
        return ("from rs_verify.engine.replay import replay\n"
                f"replay({failure.property!r}, {failure.sampler!r}, {failure.drawn!r})\n")
    drawn = failure.drawn
    if isinstance(drawn, tuple) and len(drawn) > 1 and drawn[0] is batch:
        rest = "".join(f", {x!r}" for x in drawn[1:])
        drawn_code = f"drawn = (batch{rest})\n"
    elif drawn is batch or drawn is None:
        drawn_code = "drawn = batch\n"
    else:
        drawn_code = f"drawn = {drawn!r}\n"
    return ("import numpy as np\n"
            "from numpy import inf, nan\n"
            "from rs_verify import SpecBatch\n"
            "from rs_verify.engine.replay import replay\n"
            f"batch = {batch_to_code(batch)}\n"
            f"{drawn_code}"
            f"replay({failure.property!r}, {failure.sampler!r}, drawn)\n")
