"""Failure bundles: round trip, the shrunk input, and rejection of anything that is not a bundle."""

import json
import zipfile

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st

from rs_verify import SpecBatch
from rs_verify.engine import bundle, replay, runner
from rs_verify.engine.records import Failure
from rs_verify.properties import Property, PropertyFailure


def _batch(num_reqs: int, *, vocab: int = 5, model: bool = True, logprobs=None) -> SpecBatch:
    rng = np.random.default_rng(num_reqs)
    n = 2 * num_reqs
    x = rng.normal(size=(n, vocab)).astype(np.float32)
    x[0, -1] = -np.inf
    return SpecBatch(
        target_logits=x,
        draft_logits=rng.normal(size=(num_reqs + 1, 1, vocab)).astype(np.float32) if model else None,
        draft_token_ids=np.tile(np.array([0, 1], np.int64), num_reqs),
        cu_num_logits=(2 * np.arange(num_reqs + 1)).astype(np.int32),
        pos=np.arange(n, dtype=np.int64) + 2**40,
        idx_mapping=np.arange(num_reqs, dtype=np.int32)[::-1].copy(),
        temperature=np.linspace(0, 2, num_reqs + 1).astype(np.float32),
        seeds=np.array([-(2**63), *range(num_reqs)], np.int64),
        num_speculative_steps=1,
        logits_dtype="float32",
        num_logprobs=logprobs,
        logprobs_mode="processed",
    )


def _same_batch(a: SpecBatch, b: SpecBatch) -> None:
    for name in ("target_logits", "draft_logits", "draft_token_ids", "cu_num_logits", "pos", "idx_mapping",
                 "temperature", "seeds"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), name  # bit for bit (NaN, -inf, -0.0)
    for name in ("num_speculative_steps", "logits_dtype", "num_logprobs", "logprobs_mode"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("model", [True, False], ids=["model-drafts", "one-hot"])
def test_round_trip(tmp_path, model):
    b = _batch(3, model=model, logprobs=2 if model else None)
    drawn = (b, 7, "permute", np.array([3, 1, 2], np.int32), None, 2**63 - 1, float("nan"))
    failure = Failure("chunked_equals_full", "pkg.mod:factory", "property", "PropertyFailure: boom", batch=b,
                      drawn=drawn)
    path = bundle.save(tmp_path, failure, reference_spec="reference", options={"profile": "ci", "device": "cpu"})
    # A plain npz, readable without pickles, plus a JSON sidecar with the same metadata.
    with np.load(path, allow_pickle=False) as raw:
        meta = json.loads(str(raw[bundle.META_KEY][()]))
    side = json.loads(path.with_suffix(".json").read_text())
    assert meta["property"] == side["property"] == "chunked_equals_full"
    assert side["replay"] == f"rs-verify replay {path}"
    assert set(meta["versions"]) >= {"python", "numpy", "torch", "triton", "hypothesis", "rs_verify"}

    got = bundle.load(path)
    assert (got.property, got.sampler, got.reference) == ("chunked_equals_full", "pkg.mod:factory", "reference")
    assert got.options == {"profile": "ci", "device": "cpu"} and got.message == "PropertyFailure: boom"
    _same_batch(got.batch, b)
    assert isinstance(got.drawn, tuple) and len(got.drawn) == 7
    _same_batch(got.drawn[0], b)
    assert got.drawn[1:3] == (7, "permute")
    assert got.drawn[3].dtype == np.int32 and got.drawn[3].tolist() == [3, 1, 2]
    assert got.drawn[4] is None and got.drawn[5] == 2**63 - 1 and np.isnan(got.drawn[6])
    assert meta["batch"]["$batch"] == meta["drawn"]["$tuple"][0]["$batch"]
    # The same failure written twice lands in the same file.
    again = bundle.save(tmp_path, failure, reference_spec="reference", options={"profile": "ci", "device": "cpu"})
    assert again == path


def _toy_property():
    """Fails when the batch has >= 2 requests and the cap is >= 3: the shrunk input is (2 requests, 3)."""

    def check(ctx, drawn):
        batch, cap = drawn
        ctx.count("calls")
        if batch.num_reqs >= 2 and cap >= 3:
            raise PropertyFailure(f"R={batch.num_reqs}, cap={cap}", batch=batch)

    strategy = st.tuples(st.integers(1, 9).map(_batch), st.integers(1, 1000))
    return Property("toy_chunking", "equivalence", "toy", check, strategy=lambda ctx: strategy)


def test_failure_bundle_holds_the_shrunk_input(tmp_path):
    prop = _toy_property()
    ctx = runner.make_context(sampler=lambda b, **kw: None, profile="ci", device="cpu")
    base = settings(max_examples=200, database=None, derandomize=True)
    res = runner.run(prop, ctx, base, bundle_dir=tmp_path, sampler_spec="pkg.mod:sampler",
                     options={"note": "test"})
    assert res.status == "failed" and len(res.bundles) == 1
    assert ctx.stats["calls"] > 1  # several inputs were tried: the bundle is the last, minimal one
    b = bundle.load(res.bundles[0])
    assert b.batch.num_reqs == 2 and b.drawn[1] == 3  # the minimal failing input, not the first one found
    _same_batch(b.drawn[0], _batch(2))
    assert b.options["profile"] == "ci" and b.options["note"] == "test"
    assert "replay with: rs-verify replay" in res.failure.text()
    assert "replay_bundle(" in res.failure.text()  # a short reproducer that loads the batch from the bundle


def test_replay_reruns_the_check(tmp_path, monkeypatch):
    """replay.replay_bundle re-runs the stored property on the stored input against the stored sampler."""
    from rs_verify.properties import PROPERTIES

    path = bundle.save(tmp_path, Failure("planner", "reference", "property", "", drawn=(np.array([0, 3, 4, 9], np.int32), 4)),
                       options={"profile": "ci", "device": "cpu"})
    replay.replay_bundle(path)  # the real planner is right: passes
    seen = []
    real = PROPERTIES["planner"]
    monkeypatch.setitem(PROPERTIES, "planner", Property("planner", "planner", "", lambda ctx, d: seen.append(d),
                                                        strategy=real.strategy))
    replay.replay_bundle(path)
    assert seen[0][0].tolist() == [0, 3, 4, 9] and seen[0][1] == 4


def _corrupt(tmp_path, name, members: dict):
    path = tmp_path / name
    np.savez(path, **members)
    return path


@pytest.mark.parametrize("case", ["missing", "text", "npy", "truncated", "no-meta", "foreign", "version",
                                  "bad-json", "missing-key", "missing-array", "pickled"])
def test_corrupt_or_foreign_bundle_is_rejected(tmp_path, case):
    good = bundle.save(tmp_path, Failure("determinism", "reference", "property", "", drawn=_batch(2), batch=_batch(2)),
                       options={"profile": "ci"})
    with np.load(good, allow_pickle=False) as raw:
        members = {k: raw[k] for k in raw.files}
    meta = json.loads(str(members[bundle.META_KEY][()]))

    def with_meta(**changes):
        m = dict(meta, **changes)
        return dict(members, **{bundle.META_KEY: np.array(json.dumps(m))})

    if case == "missing":
        path = tmp_path / "nope.npz"
    elif case == "text":
        path = tmp_path / "text.npz"
        path.write_text("not a bundle")
    elif case == "npy":
        path = tmp_path / "array.npz"
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    elif case == "truncated":
        path = tmp_path / "cut.npz"
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif case == "no-meta":
        path = _corrupt(tmp_path, "nometa.npz", {"x": np.zeros(3)})
    elif case == "foreign":
        path = _corrupt(tmp_path, "foreign.npz", with_meta(format="someone-else"))
    elif case == "version":
        path = _corrupt(tmp_path, "v99.npz", with_meta(version=99))
    elif case == "bad-json":
        path = _corrupt(tmp_path, "badjson.npz", dict(members, **{bundle.META_KEY: np.array("{not json")}))
    elif case == "missing-key":
        m = {k: v for k, v in meta.items() if k != "sampler"}
        path = _corrupt(tmp_path, "nokey.npz", dict(members, **{bundle.META_KEY: np.array(json.dumps(m))}))
    elif case == "missing-array":
        path = _corrupt(tmp_path, "noarr.npz", {k: v for k, v in members.items() if not k.endswith(".pos")})
    else:  # an object array: np.load(allow_pickle=False) refuses it, and so does load()
        path = tmp_path / "pickled.npz"
        with zipfile.ZipFile(path, "w") as z:
            for k, v in members.items():
                with z.open(f"{k}.npy", "w") as f:
                    np.save(f, v)
            with z.open("evil.npy", "w") as f:
                np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(bundle.BundleError) as info:
        bundle.load(path)
    assert isinstance(info.value, ValueError) and str(path) in str(info.value)


def test_derandomized_failure_lands_in_the_same_bundle_on_every_rerun(tmp_path):
    """The ci profile bounds shrinking by a count of candidates, not by wall time: a rerun shrinks
    to the same example and writes the same bundle file (its name is a hash of the content)."""
    prop = _toy_property()
    paths = []
    for _ in range(2):
        ctx = runner.make_context(sampler=lambda b, **kw: None, profile="ci", device="cpu")
        res = runner.run(prop, ctx, settings(settings.get_profile("ci"), max_examples=100), bundle_dir=tmp_path,
                         sampler_spec="pkg.mod:sampler")
        paths += res.bundles
    assert len(paths) == 2 and paths[0] == paths[1]


def test_a_large_batch_is_summarised_briefly_and_bundled_whole(tmp_path):
    """A 200,000-request campaign batch: its summary and a failure message built from it stay short
    (a timeout of such a campaign once printed 3.4 MB), while the bundle keeps every request."""
    from rs_verify.engine.isolation import SamplerTimeout

    big = _batch(200_000, vocab=3, model=False)
    summary = big.summary()
    assert len(summary) < 1024 and "R=200000" in summary and "(200000 in all)" in summary, summary

    def times_out(ctx, _drawn):
        raise SamplerTimeout(f"the sampler did not return within 10 s (verifying a batch ({big.summary()}))",
                             batch=big)

    def fails(ctx, _drawn):
        raise PropertyFailure(f"outputs differ at sampled[3]: 1 vs 2 ({big.summary()})", batch=big)

    ctx = runner.make_context(sampler=None, profile="ci", device="cpu")
    for check in (times_out, fails):
        out = runner.run(Property(check.__name__, "toy", "toy", check), ctx, bundle_dir=tmp_path)
        text = out.failure.text()
        assert len(out.failure.message) < 1024 and len(text) < 4096, (len(text), text[:2000])
    (path,) = tmp_path.glob("fails-*.npz")  # the timeout of a fixed campaign replays from its seed
    _same_batch(bundle.load(path).batch, big)


def _noisy(b: SpecBatch) -> SpecBatch:
    """`b` carrying SPEC 3c's explicit noise, edge values included (2**-53, 1 - 2**-53, -0.0)."""
    r, v = b.num_reqs, b.effective_vocab_size
    u = np.linspace(2.0**-53, 1 - 2.0**-53, b.num_logits)
    g = np.random.default_rng(1).gumbel(size=(r, v))
    g[0, 0] = -0.0
    return b.replace(accept_uniforms=u, resample_gumbel=g, resample_uniforms=u[:r][::-1].copy())


def _same_noise(a: SpecBatch, b: SpecBatch) -> None:
    assert a.noise_carried() == b.noise_carried()
    for name in a.noise_carried():
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


def test_explicit_noise_round_trips_bit_for_bit(tmp_path):
    """A batch's explicit noise is bundled bit for bit, summarised, and rebuilt exactly by the
    reproducer code of a failure message."""
    b = _noisy(_batch(3))
    failure = Failure("determinism", "reference", "property", "boom", batch=b, drawn=b)
    got = bundle.load(bundle.save(tmp_path, failure, options={"profile": "ci"}))
    _same_batch(got.batch, b)
    _same_noise(got.batch, b)
    _same_noise(got.drawn, b)
    assert "explicit noise accept_uniforms/resample_gumbel/resample_uniforms" in got.meta["batch_summary"]
    assert "explicit noise" not in _batch(3).summary()
    scope = {}
    exec("import numpy as np\nfrom numpy import inf, nan\nfrom rs_verify import SpecBatch\n"
         f"batch = {replay.batch_to_code(b)}", scope)
    _same_noise(scope["batch"], b)


def test_a_bundle_written_before_the_noise_and_tree_fields_loads(tmp_path):
    """A bundle from before SPEC 3c and 4c (its batch has no noise or tree fields at all) loads with
    them at their defaults."""
    b = _batch(2)
    path = bundle.save(tmp_path, Failure("determinism", "reference", "property", "", batch=b, drawn=b),
                       options={"profile": "ci"})
    with np.load(path, allow_pickle=False) as raw:
        members = {k: raw[k] for k in raw.files}
    meta = json.loads(str(members[bundle.META_KEY][()]))
    for name in ("accept_uniforms", "resample_gumbel", "resample_uniforms", "tree_parent", "node_draft_logits"):
        assert meta["batch"].pop(name) is None and meta["drawn"].pop(name) is None
    meta["batch"].pop("tree_drafts"), meta["drawn"].pop("tree_drafts")
    old = _corrupt(tmp_path, "old.npz", dict(members, **{bundle.META_KEY: np.array(json.dumps(meta))}))
    got = bundle.load(old)
    _same_batch(got.batch, b)
    assert got.batch.noise_carried() == () and got.drawn.accept_uniforms is None
    assert got.batch.tree_parent is None and got.batch.tree_drafts == b.tree_drafts
