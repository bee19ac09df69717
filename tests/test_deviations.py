"""Declared deviations (SPEC section 11): the records, the reference applying a declared rule at its
edge, the output rules following it, the declaration crossing processes and the command line, and
the gate on carriers written apart from the reference's deviation code (`examples/deviations.py`):
a declared deviation passes, a declared one with another defect fails, a declaration the sampler
does not live up to fails where the edge is reached, and every shipped deviation is reached at ci."""

import re
from pathlib import Path

import numpy as np
import pytest

from rs_verify import SamplerOutput, SpecBatch
from rs_verify.contract import deviations as dv
from rs_verify.contract import known_deviations as known
from rs_verify.contract.block import block_quantities
from rs_verify.harness.failure import PropertyFailure
from rs_verify.harness.handle import with_deviations
from rs_verify.harness.record import DeclarationError, SamplerRecord, record_of
from rs_verify.properties.decisions import compare_decisions
from rs_verify.properties.output_rules import check_output_invariants, undeclared_hint
from rs_verify.reference import ReferenceSampler

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
NEG = np.float32(-np.inf)


def _last_positive(logp):
    """An unshipped rule (SPEC 11 via 3d): an empty residual emits the last token with p > 0."""
    out = np.full(logp.shape, -np.inf)
    last = logp.shape[1] - 1 - np.argmax(logp[:, ::-1] > -np.inf, axis=1)
    out[np.arange(logp.shape[0]), last] = 0.0
    return out


# A module-level record that no registry holds: declared by its object or by its module:attribute path.
LAST_POSITIVE = dv.Deviation(name="empty_residual_last_positive", section="4",
                             replaces="a residual with no positive mass falls back to p",
                             rules={"empty_residual": _last_positive})


def test_records_are_checked_when_built():
    ok = dict(name="x", section="4", replaces="the clause", rules={"empty_residual": _last_positive})
    for bad, match in ((dict(name="a:b"), "name"), (dict(section="3a"), "section"), (dict(replaces=" "), "replaces"),
                       (dict(rules={"nowhere": _last_positive}), "edges"), (dict(rules={}), "edges"),
                       (dict(rules={"empty_residual": lambda lp: lp.astype(np.float32)}), "empty_residual"),
                       (dict(rules={"block_prefix": lambda a, b, c: np.full(a.shape, np.nan)}), "block_prefix")):
        with pytest.raises(ValueError, match=match):
            dv.Deviation(**{**ok, **bad})


def test_lookup_by_name_path_and_record():
    assert [d.name for d in dv.shipped()] == ["empty_residual_token0", "inverse_cdf_last_token",
                                               "block_nan_prefix_resets", "tree_bonus_unprocessed",
                                               "tree_duplicate_siblings"]
    assert dv.deviation("empty_residual_token0").edges == ("empty_residual",)
    assert dv.deviation(LAST_POSITIVE) is LAST_POSITIVE and not dv.registered(LAST_POSITIVE)
    path = dv.deviation_path(LAST_POSITIVE)
    assert path is not None and dv.deviation(path) is LAST_POSITIVE
    with pytest.raises(KeyError, match="the shipped deviations are"):
        dv.deviation("token_zero")
    with pytest.raises(ValueError, match="both rule the edge 'empty_residual'"):
        dv.applied(["empty_residual_token0", LAST_POSITIVE])
    with pytest.raises(ValueError, match="is taken"):
        dv.register(dv.Deviation(name="empty_residual_token0", section="4", replaces="c",
                                 rules={"empty_residual": _last_positive}))


def test_the_record_reads_round_trips_and_refuses_declarations():
    class Declares:
        name = "declares"
        streams = "triton-philox"
        deviations = {"empty_residual_token0", LAST_POSITIVE}

    with pytest.raises(DeclarationError, match="both rule the edge"):
        record_of(Declares())
    Declares.deviations = {"block_nan_prefix_resets", LAST_POSITIVE}
    rec = record_of(Declares())
    assert rec.applied.names == ("block_nan_prefix_resets", "empty_residual_last_positive")
    sent = rec.to_dict()["deviations"]
    assert sent == sorted(["block_nan_prefix_resets", dv.deviation_path(LAST_POSITIVE)])
    assert SamplerRecord.from_dict(rec.to_dict()) == rec
    for bad in ("empty_residual_token0", {"no_such_deviation"}, 3):
        with pytest.raises(DeclarationError, match="deviations"):
            SamplerRecord(name="x", deviations=bad)
    handle = with_deviations(ReferenceSampler(), ["inverse_cdf_last_token"])
    assert handle.record.deviations == {"inverse_cdf_last_token"} and with_deviations(handle, []) is handle


def _empty_residual_batch(d: int = 1) -> SpecBatch:
    """One request, one model draft `d` with p(d) = q(d) = 0: p and q are the same point mass on token
    2, so the draft is rejected and the residual max(p - q, 0) is empty (SPEC 4 falls back to p)."""
    z = np.array([[NEG, NEG, 0.0, NEG], [0.0, 0.0, 0.0, 0.0]], np.float32)
    return SpecBatch(target_logits=z, draft_logits=z[None, :1].copy(), draft_token_ids=np.array([0, d], np.int64),
                     cu_num_logits=np.array([0, 2], np.int32), pos=np.array([5, 6], np.int64),
                     idx_mapping=np.array([0], np.int32), temperature=np.ones(1, np.float32),
                     seeds=np.array([7], np.int64), num_speculative_steps=1)


def test_the_reference_applies_a_declared_empty_residual_rule_and_traces_it():
    batch = _empty_residual_batch()
    plain, _ = ReferenceSampler().verify_with_trace(batch)
    assert plain.request(0) == [2]  # SPEC 4: the fallback to p
    for declared, token in (("empty_residual_token0", 0), (LAST_POSITIVE, 2), ("inverse_cdf_last_token", 3)):
        ref = ReferenceSampler().with_streams("triton-philox", deviations=[declared])
        out, traces = ref.verify_with_trace(batch)
        assert out.request(0) == [token]
        (res,) = [d for d in traces[0].decisions if d.kind == "residual"]
        assert (res.accepted, res.margin, res.deviation) == (False, 0.0, dv.deviation(declared).name)
        # a float64-empty residual has no rounding that keeps it: a sampler that samples p diverges unexcused
        assert np.isinf(res.gaps).all()


def test_the_output_rules_follow_the_declared_rule_only():
    batch = _empty_residual_batch()
    token0 = SamplerOutput(sampled=np.array([[0, -1]]), num_sampled=np.array([1], np.int32))
    with pytest.raises(PropertyFailure, match="token 0 with p = 0"):
        check_output_invariants(batch, token0)
    assert "looks like `empty_residual_token0`" in undeclared_hint(batch, token0)
    check_output_invariants(batch, token0, ["empty_residual_token0"])
    token3 = SamplerOutput(sampled=np.array([[3, -1]]), num_sampled=np.array([1], np.int32))
    with pytest.raises(PropertyFailure, match="token 3 with p = 0"):
        check_output_invariants(batch, token3, ["empty_residual_token0"])
    check_output_invariants(batch, token3, ["inverse_cdf_last_token"])


def test_block_prefix_rule_resets_a_nan_ratio():
    p = np.array([[[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]])  # p(d_0) = 0 ...
    q = np.array([[[0.0, 1.0], [0.5, 0.5]]])  # ... and q(d_0) = 0: log P_0 = -inf - -inf
    spec = block_quantities(p, q, np.array([[0, 0]]), np.array([2]))
    dev = dv.deviation("block_nan_prefix_resets").rule("block_prefix")
    reset = block_quantities(p, q, np.array([[0, 0]]), np.array([2]), nan_rule=dev)
    assert spec.log_prefix[0].tolist() == [-np.inf, -np.inf]
    assert reset.log_prefix[0].tolist() == [0.0, 0.0]  # min(NaN, 0) = 0, then p(d_1) / q(d_1) = 1


def test_inverse_cdf_top_is_decided_on_float32_prefix_sums():
    with np.errstate(divide="ignore"):
        logr = np.log(np.r_[np.full(9, 1 / 9), 0.0])[None]
    assert dv.inverse_cdf_unfound32(logr, np.array([1 - 2.0**-40])).all()
    assert not dv.inverse_cdf_unfound32(logr, np.array([0.5])).any()
    z = np.r_[np.zeros(9), -np.inf].astype(np.float32)[None]
    batch = SpecBatch(target_logits=z, draft_logits=None, draft_token_ids=np.array([0]),
                      cu_num_logits=np.array([0, 1], np.int32), pos=np.array([3]), idx_mapping=np.array([0], np.int32),
                      temperature=np.ones(1, np.float32), seeds=np.array([1]), num_speculative_steps=0,
                      resample_uniforms=np.array([1 - 2.0**-40]))
    ref = ReferenceSampler(streams="explicit", resample="inverse_cdf")
    assert ref(batch).request(0) == [8]
    out, traces = ref.with_streams("explicit", "inverse_cdf", deviations=["inverse_cdf_last_token"]).verify_with_trace(batch)
    (arg,) = traces[0].decisions
    assert out.request(0) == [9] and arg.deviation == "inverse_cdf_last_token" and arg.margin == 2.0**-40
    assert arg.gaps[8] == 2.0**-40  # the float64 token, at 1 - U from the top: excused within SPEC 8


# -- the gate on the carriers of examples/deviations.py, through the plugin at ci -----------------

@pytest.fixture
def gate(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return pytester


def _run(gate, sampler: str, *extra):
    result = gate.runpytest_subprocess("-p", "rs_verify", f"--rs-sampler=examples.deviations:{sampler}",
                                       "--rs-profile", "ci", "-k", "certified or invariants", "-p", "no:cacheprovider",
                                       *extra)
    return result, result.stdout.str()


def _decided(text: str, name: str) -> int:
    found = re.search(rf"deviation {name} \(SPEC section 11[^)]*\): (\d+) decisions decided", text)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("sampler, names", [
    ("vllm_033", ["empty_residual_token0", "block_nan_prefix_resets"]),
    ("sglang_declared", ["inverse_cdf_last_token"]),
])
def test_a_declared_deviation_passes_and_is_reached(gate, sampler, names):
    result, text = _run(gate, sampler)
    result.assert_outcomes(passed=2)
    for name in names:
        assert _decided(text, name) > 0, text


def test_naming_deviations_on_the_command_line_declares_them(gate):
    result, text = _run(gate, "vllm_033_undeclared", "--rs-deviations=empty_residual_token0,block_nan_prefix_resets")
    result.assert_outcomes(passed=2)
    assert _decided(text, "block_nan_prefix_resets") > 0


@pytest.mark.long  # the same sampler undeclared; the default run has the hint on SGLang's carrier (below)
def test_the_same_sampler_undeclared_fails_with_the_hint(gate):
    result, text = _run(gate, "vllm_033_undeclared")
    result.assert_outcomes(failed=2)
    assert "looks like `empty_residual_token0`" in text


# The default run keeps one case of each kind (a declared deviation and another defect; a deviation
# declared that the sampler does not have); the long run has all four.
@pytest.mark.parametrize("sampler, fails", [
    ("sglang_declared_cdf_over_p", "certified_equivalence"),  # declared, and another defect
    ("spec_declaring_token0", "certified_equivalence"),  # declares a deviation it does not have
    pytest.param("spec_declaring_nan_resets", "certified_equivalence", marks=pytest.mark.long),
    pytest.param("explicit_declaring_last_token", "certified_equivalence", marks=pytest.mark.long),
])
def test_a_declaration_excuses_nothing_else(gate, sampler, fails):
    result, text = _run(gate, sampler)
    assert f"FAILED rs-verify::{fails}" in text, text


def test_a_certification_failure_names_the_undeclared_deviation_it_resembles(gate):
    result, text = _run(gate, "sglang_undeclared")
    assert "FAILED rs-verify::certified_equivalence" in text
    assert "looks like `inverse_cdf_last_token`" in text


def _underflowing_residual() -> SpecBatch:
    """One request drafting token 2 at T = 1: p = (1, e**-1000, e**-2000) and q = (1, e**-1002, e**-1000)
    (unnormalised), so max(p - q, 0) after rejecting the draft holds mass only at token 1, below float64's
    range."""
    z = np.array([[0.0, -1000.0, -2000.0], [0.0, 0.0, 0.0]], np.float32)
    zq = np.array([[[0.0, -1002.0, -1000.0]]], np.float32)
    return SpecBatch(target_logits=z, draft_logits=zq, draft_token_ids=np.array([0, 2], np.int64),
                     cu_num_logits=np.array([0, 2], np.int32), pos=np.array([5, 6], np.int64),
                     idx_mapping=np.array([0], np.int32), temperature=np.ones(1, np.float32),
                     seeds=np.array([7], np.int64), num_speculative_steps=1)


def test_a_residual_whose_mass_underflows_float64_is_not_certified_empty():
    """The positive mass of max(p - q, 0) lies at token 1 alone, with p = e**-1000 > q = e**-1002: below
    float64's range, so the float64 mass is 0, yet the residual is not empty (a sampler that keeps it in
    log space, as vLLM MRV2 does, samples token 1). With `empty_residual_token0` declared the reference
    emits token 0 (empty in float32); that decision is certified with the residual's mass, 0 <= eps
    (SPEC 8): token 1 is excused as the other branch, token 2 (q > p there) is not."""
    batch = _underflowing_residual()
    ref = ReferenceSampler().with_streams("triton-philox", deviations=["empty_residual_token0"])
    out, traces = ref.verify_with_trace(batch)
    assert out.request(0) == [0]
    (res,) = [d for d in traces[0].decisions if d.kind == "residual"]
    assert (res.accepted, res.margin, res.deviation) == (False, 0.0, "empty_residual_token0")
    assert res.gaps[1] == 0 and res.gaps[2] == pytest.approx(1000.0)
    for token, excused in ((1, True), (2, False)):
        prod = SamplerOutput(sampled=np.array([[token, -1]]), num_sampled=np.array([1], np.int32))
        (div,) = compare_decisions(batch, prod, traces).divergences
        assert div.excused == excused and div.kind == ("residual" if excused else "argmax")


def test_the_view_of_an_empty_residual_is_the_samplers():
    """SPEC 11: emptiness is decided in float32 "as the sampler sees it". Draft 2 is rejected and the
    residual's only positive mass lies at token 1 below float32's (and float64's) range:
    `p = e**-1000 > q = e**-1002`. In the probability view (vLLM V1, LMDeploy) that residual is empty
    and `empty_residual_token0` emits token 0; in the log view (vLLM MRV2: `EMPTY_RESIDUAL_TOKEN0_LOG`)
    it is not, and the reference samples it: token 1, certified and within the output rules."""
    batch = _underflowing_residual()
    log_view = known.EMPTY_RESIDUAL_TOKEN0_LOG
    assert (log_view.name, log_view.empty_view, known.EMPTY_RESIDUAL_TOKEN0.empty_view) == (
        "empty_residual_token0", "log", "probabilities")
    for record, token, used in ((known.EMPTY_RESIDUAL_TOKEN0, 0, False), (log_view, 1, True)):
        ref = ReferenceSampler().with_streams("triton-philox", deviations=[record])
        out, traces = ref.verify_with_trace(batch)
        (res,) = [d for d in traces[0].decisions if d.kind == "residual"]
        assert (out.request(0), res.accepted) == ([token], used), record.empty_view
        assert res.deviation == ("" if used else "empty_residual_token0")
        prod = SamplerOutput(sampled=np.array([[token, -1]]), num_sampled=np.array([1], np.int32))
        assert not compare_decisions(batch, prod, traces).divergences
        check_output_invariants(batch, prod, [record])


def test_the_log_view_is_the_kernels_float32_ratio():
    """`residual_empty_log32` against `residual_empty32` on rows whose residual mass lies below float32's
    range (`p = e**-1000`): empty in probabilities, not in log space (model drafts, with and without a
    block scale `log P`, and one-hot drafts); a residual that float32 cannot tell from `q` (`log q - log p`
    below float32's spacing near 1: `exp` rounds to 1) and one with `p = q = 0` (NaN) are empty in both."""
    logp = np.array([[0.0, -1000.0, -np.inf], [-1e-9, -np.inf, -5.0], [-np.inf, 0.0, -np.inf]])
    logq = np.array([[0.0, -1002.0, -1000.0], [0.0, -np.inf, -5.0], [-np.inf, 0.0, -np.inf]])
    p, q = np.exp(logp), np.exp(logq)
    assert dv.residual_empty32(p, q).tolist() == [True, True, True]
    assert dv.residual_empty_log32(logp, logq).tolist() == [False, True, True]
    # Block: P = e**-1 shifts log p below log q at token 1 of row 0; row 1's P = e**1 (none) stays empty.
    assert dv.residual_empty_log32(logp, logq, log_scale=np.array([-3.0, 0.0, 0.0])).tolist() == [True, True, True]
    draft = np.array([0, 0, 1])  # one-hot: p without the rejected draft
    assert dv.residual_empty32(p, None, draft).tolist() == [True, False, True]
    assert dv.residual_empty_log32(logp, None, draft).tolist() == [False, False, True]


def test_a_variant_in_another_view_keeps_its_name_and_travels_by_path():
    """The log-view record is `empty_residual_token0` (SPEC 11's name), unregistered: it crosses a process
    boundary by its module:attribute path; named beside the shipped record it wins (the sampler's own view)."""
    log_view, shipped = known.EMPTY_RESIDUAL_TOKEN0_LOG, known.EMPTY_RESIDUAL_TOKEN0
    assert not dv.registered(log_view) and dv.deviation("empty_residual_token0") is shipped
    path = dv.deviation_path(log_view)
    assert path == "rs_verify.contract.known_deviations:EMPTY_RESIDUAL_TOKEN0_LOG" and dv.deviation(path) is log_view
    for declared in ([log_view, "empty_residual_token0"], ["empty_residual_token0", path]):
        assert dv.applied(declared).records == (log_view,)
    with pytest.raises(ValueError, match="empty_view"):
        shipped.viewed("logits")
    with pytest.raises(ValueError, match="two records named"):
        dv.applied([log_view, dv.Deviation(name="empty_residual_token0", section="4", replaces="c",
                                           rules={"empty_residual": _last_positive}, empty_view="log")])
