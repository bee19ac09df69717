"""Running properties: applicability, the Hypothesis wrapper, results and replay.

The tests, the CLI and the pytest plugin all run properties through this module, so a
property is written once (in `rs_verify.properties`) and wrapped thinly everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis.control import current_build_context

from . import profiles
from ..properties import PROPERTIES, Context, Property, PropertyFailure
from ..properties.base import NEEDS, sampler_name, supports_chunking, uses_spec_streams
from .replay import replay_snippet


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def capabilities(ctx: Context) -> set[str]:
    caps = {"triton"}
    s = ctx.sampler
    if supports_chunking(s):
        caps.add("chunking")
    if uses_spec_streams(s):
        caps.add("spec_streams")
    if ctx.reference is not None:
        caps.add("reference")
    if getattr(s, "memory_stats", False):
        caps.add("memory_stats")
    if callable(getattr(s, "unvalidated", None)):
        caps.add("unvalidated")
    if ctx.device == "cuda" or cuda_available():
        caps.add("cuda")
    if not getattr(s, "interpreted", False):
        caps.add("fast")
    return caps


def skip_reason(prop: Property, ctx: Context) -> str | None:
    """Why `prop` does not apply to this context, or None when it does."""
    missing = sorted(prop.needs - capabilities(ctx))
    return "; ".join(NEEDS[m] for m in missing) if missing else None


def make_context(sampler, reference=None, *, profile: str | None = None, device: str | None = None) -> Context:
    name = profile or profiles.active()
    return Context(
        sampler=sampler,
        reference=reference,
        profile=name,
        batch_kwargs=dict(profiles.BATCH_KWARGS.get(name, profiles.BATCH_KWARGS["dev"])),
        device=device or ("cuda" if cuda_available() else "cpu"),
    )


def _remember(exc: BaseException, drawn) -> None:
    """Keep the drawn input on the exception: Hypothesis re-raises the shrunk failure, so the
    exception that reaches `check()` carries the minimal input (for failure bundles)."""
    try:
        exc.rs_drawn = drawn
    except AttributeError:  # pragma: no cover - exceptions with __slots__
        pass


def _annotate(exc: BaseException, prop: Property, ctx: Context, drawn) -> None:
    batch = getattr(exc, "batch", None)
    if batch is None:
        return
    spec = getattr(ctx.sampler, "spec", None) or sampler_name(ctx.sampler)
    exc.add_note(f"property: {prop.name} ({prop.doc})\nsampler: {spec}\nbatch: {batch.summary()}")
    exc.add_note("reproduce with:\n" + replay_snippet(prop.name, spec, drawn, batch))


def hypothesis_test(prop: Property, ctx: Context, base: settings | None = None):
    """A zero-argument callable that runs `prop` under Hypothesis with the current profile."""
    base = base or (settings.get_profile(ctx.profile) if ctx.profile in profiles.PROFILE_NAMES else settings())
    if prop.strategy is None:
        def fixed():
            ctx.count("examples")
            try:
                prop.check(ctx, None)
            except PropertyFailure as exc:
                _remember(exc, None)
                _annotate(exc, prop, ctx, None)
                raise
            except Exception as exc:
                _remember(exc, None)
                raise
        return fixed

    examples = max(1, round(base.max_examples * prop.examples_scale))
    budget = profiles.SHRINK_SECONDS.get(ctx.profile, profiles.SHRINK_SECONDS["dev"])
    first_failure: list[float] = []

    @settings(base, max_examples=examples)
    @given(prop.strategy(ctx))
    def test(drawn):
        # Shrinking through the Triton interpreter can take many minutes: once the shrink
        # budget is spent, further shrink candidates pass without running the sampler, so
        # Hypothesis stops and reports the smallest failure found so far (its final replay,
        # `is_final`, always runs the real check).
        if first_failure and time.monotonic() - first_failure[0] > budget and not current_build_context().is_final:
            return
        ctx.count("examples")
        try:
            prop.check(ctx, drawn)
        except PropertyFailure as exc:
            first_failure[:1] = first_failure[:1] or [time.monotonic()]
            _remember(exc, drawn)
            _annotate(exc, prop, ctx, drawn)
            raise
        except Exception as exc:
            first_failure[:1] = first_failure[:1] or [time.monotonic()]
            _remember(exc, drawn)
            raise

    # Give every (property, sampler) pair its own key in the example database.
    test.hypothesis.inner_test._hypothesis_internal_add_digest = f"{prop.name}:{sampler_name(ctx.sampler)}".encode()
    return test


@dataclass
class Result:
    name: str
    status: str  # "passed", "failed", "skipped", "error"
    seconds: float = 0.0
    examples: int = 0
    excused: int = 0
    message: str = ""
    failure: BaseException | None = field(default=None, repr=False)
    stats: dict = field(default_factory=dict, repr=False)  # ctx.stats after the run (e.g. "fits")
    bundles: list = field(default_factory=list)  # failure bundles written (paths)


def check(prop: Property, ctx: Context, base: settings | None = None, *, bundle_dir=None,
          sampler_spec: str | None = None, reference_spec: str | None = None, options: dict | None = None) -> None:
    """Run `prop` under Hypothesis and raise its (shrunk) failure.

    With `bundle_dir`, every failure first writes a failure bundle there (`rs_verify.engine.bundle`),
    records the paths on the exception (`exc.rs_bundles`) and adds a replay command as a note.
    """
    try:
        hypothesis_test(prop, ctx, base)()
    except Exception as exc:
        if bundle_dir is not None:
            from . import bundle

            bundle.write_failure(exc, prop, ctx, bundle_dir, sampler_spec=sampler_spec,
                                 reference_spec=reference_spec, options=options)
        raise


def run(prop: Property, ctx: Context, base: settings | None = None, *, bundle_dir=None,
        sampler_spec: str | None = None, reference_spec: str | None = None, options: dict | None = None) -> Result:
    """Run one property; never raises for a property failure (the CLI's entry point)."""
    reason = skip_reason(prop, ctx)
    if reason:
        return Result(prop.name, "skipped", message=reason)
    ctx.stats.clear()
    start = time.perf_counter()
    try:
        check(prop, ctx, base, bundle_dir=bundle_dir, sampler_spec=sampler_spec,
              reference_spec=reference_spec, options=options)
        status, msg, failure = "passed", "", None
    except (AssertionError, Exception) as exc:  # noqa: BLE001 - reported, not swallowed
        status = "failed" if isinstance(exc, AssertionError) else "error"
        msg, failure = f"{type(exc).__name__}: {exc}", exc
    return Result(prop.name, status, time.perf_counter() - start, ctx.stats.get("examples", 0),
                  ctx.stats.get("excused", 0), msg, failure, dict(ctx.stats),
                  list(getattr(failure, "rs_bundles", []) or []))


def replay(prop_name: str, sampler_spec: str, drawn, reference_spec: str = "reference") -> None:
    """Re-run one property check on one input (raises the failure again if it still fails)."""
    from .samplers import load_sampler

    prop = PROPERTIES[prop_name]
    ctx = make_context(load_sampler(sampler_spec), load_sampler(reference_spec))
    prop.check(ctx, drawn)
    print(f"{prop_name}: passed on this input")


def pytest_run(name: str, sampler, reference=None) -> None:
    """Run property `name` inside a pytest test: skip with the reason when it does not apply."""
    import pytest

    prop = PROPERTIES[name]
    ctx = make_context(sampler, reference)
    reason = skip_reason(prop, ctx)
    if reason:
        pytest.skip(reason)
    hypothesis_test(prop, ctx)()
