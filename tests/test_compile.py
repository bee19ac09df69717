"""The CUDA compile gate (`rs-verify compile`, rs_verify.triton_sampler.aot): no GPU needed.

Triton's wheel ships ptxas, so every kernel specialization the built-in sampler launches compiles
here, also on a CPU-only runner. Under the test suite's TRITON_INTERPRET=1 the compile runs in a
child process without the interpreter.

The default run compiles one specialization per kernel for sm_80, the one most likely to fail
the gate (`WORST_CASE`: 8 compiles, in one child process); the long run
(`RS_VERIFY_FULL=1`) compiles every specialization of all three dtypes for sm_80 and checks that
each pick still holds its kernel's most registers, runs `rs-verify compile` for sm_80, sm_90 and
sm_100 (756, 252 per arch with the three stream families and the explicit family's two resamples;
186 per arch with two families; 414 with triton-philox alone took about 440 s of CPU cold; the
sm_80 grid of 252, 189 s of wall on a 2-core machine with a partly warm cache) and
the mixed widths (one scalar int64 among int32 ones: 159 more for sm_90 with the three families,
32 s with a partly warm cache; 42 with two, 74 s cold). Compile errors do
not depend on the arch (the frontend rejects the code, as with the int64 loop carry below);
register counts differ a little between archs (triton-philox's verify_kernel: 162 at sm_80, 137
at sm_100), so sm_80, the highest, is the one to gate on.
The compile tests are marked `slow`: deselect them with `-m "not slow"`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rs_verify.triton_sampler import aot

# The loop-carried index vector of `_row_stats` as it was before the int64 fix (issue 12).
FIXED_LINE = "    i_vec = tl.full([BLOCK_R, BLOCK_V], 0, (offs + n).dtype)  # the width of idx: int32, or int64 for an int64 n\n"
INT32_ONLY_LINE = "    i_vec = tl.full([BLOCK_R, BLOCK_V], 0, tl.int32)\n"
ONE_SPECIALIZATION = dict(kernels=["row_stats_kernel"], dtypes=("float32",), draft_modes=("one_hot",),
                          vocab_classes=("16n",))


# The default run's one specialization per kernel: (logits dtype, draft mode, vocabulary class,
# stream family), with int64 scalars. Picked as the specialization most likely to fail the gate, a spill being the
# likelier failure: the most registers per thread at sm_80 over every specialization of all three
# dtypes (`python -m rs_verify.triton_sampler.aot --arch 80`, triton 3.9.0's ptxas, 2026-12-02;
# registers in the comments, runners-up in parentheses). int64 scalars widen every index and
# offset (+12 to +54 registers over int32, and the width the loop-carry error below needed); model
# drafts add the draft row's loads and statistics (`HAS_DRAFT`); a vocabulary that is a multiple of
# 16 carries the divisibility hints, except for log_softmax, whose unhinted V = 33 takes 16 more.
# Where dtypes tie, float32; float16 never exceeds bfloat16. The stream family (SPEC 3, the
# constexpr STREAM of verify_kernel, resample_kernel and block_tau_kernel) specializes those three:
# murmur3's hash takes verify_kernel to 168 at V = 33 (155 at V = 160; explicit 40: it leaves every
# draw to resample_kernel) and resample_kernel to 168 (the explicit family's loaded Gumbel noise
# 167, Philox 166; the explicit inverse CDF, the constexpr RESAMPLE, 96; murmur3's noise is drawn
# after the residual's logs, which keeps every murmur3 specialization off 128 registers, where
# ptxas spilled at sm_90), block_tau_kernel stays at 56 with the explicit uniforms; the other
# kernels do not take it. The long run checks the picks against the whole grid, and compiles it all:
# ptxas may also hold a kernel at 64 registers and spill a few bytes (the inverse CDF's int32
# specialization did, at 64 registers, until its fallback token moved to its first pass).
# murmur3-fp64's float64 noise and scores (two hashes, a float64 log of a log) take verify_kernel to
# 197 at V = 33 (181 at V = 160) and resample_kernel to 199 (both vocabulary classes), without spills
# at sm_80 and sm_90 (128 specializations of the float32 and bfloat16 model and one-hot drafts of
# murmur3 and murmur3-fp64, int32 and int64 scalars, 2026-12-03, 939 s on a busy 2-core machine):
# they are the picks of those two kernels. Since the resample rule is written once (residual.py's
# `_resample_step` and `_resample_token`, 2026-12-05, triton 3.9.0's ptxas, all 312 sm_80
# specializations): verify_kernel's most is 168, murmur3-fp64 with one-hot drafts at V = 160 (its
# model drafts 166; murmur3 154, Philox 162), resample_kernel's 199 as before (murmur3 and Philox
# 168, explicit 164, the inverse CDF 96; int32 scalars: murmur3-fp64 155, Philox 135), and no
# specialization spills (before, three int32 model-draft specializations of resample_kernel
# spilled 8 bytes at sm_80).
PHILOX, FP64, EXPLICIT = "triton-philox", "murmur3-fp64", "explicit"
WORST_CASE = {
    "row_stats_kernel": ("float32", "model", "16n", PHILOX),  # 79 (bfloat16 and float16 79; one-hot drafts 72)
    "mask_stats_kernel": ("float32", "model", "16n", PHILOX),  # 68 (bfloat16 64)
    "block_tau_kernel": ("float32", "model", "16n", PHILOX),  # 56 (every dtype; one-hot drafts 32)
    "verify_kernel": ("float32", "one_hot", "16n", FP64),  # 168 (model drafts 166; murmur3 154; Philox 162)
    "resample_kernel": ("float32", "model", "16n", FP64),  # 199 (murmur3 168; explicit Gumbel-max 164, Philox 168,
    # the explicit inverse CDF 96; int32 scalars 135 Philox, 96 murmur3)
    "log_softmax_kernel": ("bfloat16", "model", "other", PHILOX),  # 63, raw and processed (float32 62; V = 160: 48)
    # tree verification (SPEC 4c) reads the explicit noise only; the draft kind, the coin layout and the
    # vocabulary sizes are runtime values, so the logits dtype, RESAMPLE and the width are its axes (12
    # specializations per arch): 162 (float16 162; float32 159; Gumbel-max 156 to 159; int32 scalars 140-142)
    "tree_kernel": ("bfloat16", "model", "16n", EXPLICIT, "inverse_cdf"),
}


def compile_worst_case(kernel, arch=80):
    dtype, drafts, vocab, streams, *resample = WORST_CASE[kernel]
    return aot.compile_all([arch], kernels=[kernel], widths=["int64"], dtypes=(dtype,), draft_modes=(drafts,),
                           vocab_classes=(vocab,), streams=(streams,), resamples=tuple(resample) or ("gumbel",))


def failures(results):
    return [(r.kernel, r.width, r.label, r.error or f"{r.local} bytes spilled") for r in aot.gate_failures(results)]


# Every kernel's pick in one child process with the interpreter off: a child per kernel took about 5.5 s
# each on an idle core, nearly all of it the child's start (importing torch and Triton, the backend's first
# compile), 40 s for the eight; one child for the eight, 8 s (warm Triton cache).
_CHILD = """
import dataclasses, json
import test_compile
for kernel in test_compile.WORST_CASE:
    for r in test_compile.compile_worst_case(kernel):
        print(test_compile.aot.RESULT_PREFIX + json.dumps(dataclasses.asdict(r)), flush=True)
"""


def compile_worst_cases() -> dict[str, list]:
    """`compile_worst_case` of every kernel in one process: {kernel: its results}."""
    if aot.compilable_here():
        return {kernel: compile_worst_case(kernel) for kernel in WORST_CASE}
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith(aot.RESULT_PREFIX):
            res = aot.CompileResult(**json.loads(line[len(aot.RESULT_PREFIX):]))
            out.setdefault(res.kernel, []).append(res)
    return out


@pytest.mark.slow
def test_worst_case_specializations_compile_for_sm_80():
    results = compile_worst_cases()
    assert sorted(results) == sorted(aot.KERNELS), sorted(results)
    for kernel, got in results.items():
        # One specialization; log_softmax two: its logprobs mode is a runtime flag (raw) or a constant (processed).
        assert [r.kernel for r in got] == [kernel] * (2 if kernel == "log_softmax_kernel" else 1), got
    every = [r for got in results.values() for r in got]
    assert all(r.registers for r in every) and not failures(every), failures(every)


@pytest.mark.slow
@pytest.mark.long
def test_every_specialization_compiles_for_sm_80_and_the_worst_cases_hold_the_most_registers():
    results = aot.compile_all([80])
    assert {r.kernel for r in results} == set(aot.KERNELS) and not failures(results), failures(results)
    for kernel in aot.KERNELS:
        most = max(r.registers for r in results if r.kernel == kernel)
        assert max(r.registers for r in compile_worst_case(kernel)) == most, (kernel, most)


@pytest.mark.slow
@pytest.mark.long
def test_compile_cli_all_archs(capsys):
    from rs_verify.frontends.cli import main

    code = main(["compile", "--arch", "80", "90", "100"])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("sm_80", "sm_90", "sm_100", *aot.KERNELS):
        assert name in out
    assert "0 failed" in out


def test_gate_catches_a_width_dependent_loop_carry(tmp_path):
    """The kernel text before the fix compiles for int32 scalars and fails for int64 ones (the
    interpreter runs both): the gate must report that error, and pass the fixed kernels."""
    from rs_verify.triton_sampler import kernels

    source = open(kernels.__file__).read()
    assert source.count(FIXED_LINE) == 1
    broken = tmp_path / "kernels.py"
    broken.write_text(source.replace(FIXED_LINE, INT32_ONLY_LINE))

    before = {r.width: r for r in aot.compile_all([90], kernels_file=broken, **ONE_SPECIALIZATION)}
    assert before["int32"].ok, before["int32"].error
    assert not before["int64"].ok and "Loop-carried variable i_vec" in before["int64"].error
    assert aot.gate_failures(before.values()) == [before["int64"]]

    after = aot.compile_all([90], **ONE_SPECIALIZATION)
    assert [r.width for r in after] == ["int32", "int64"] and not aot.gate_failures(after)
    assert all(r.registers and r.local == 0 for r in after), after


# The long run's input: the launches it compiles cover every axis (14,013 launches recorded and
# specialized twice, 25 s of CPU here; 40 s on a loaded 2-core machine). The default run keeps the
# worst-case specialization of each kernel (below).
@pytest.mark.long
def test_launches_cover_every_specialization_axis():
    """The recorded launches reach every dtype, draft mode, logprobs mode, integer width and, in the
    kernels that read or draw noise, stream family (and the explicit family's two resamples)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    module = aot.kernels_for_compile()
    backend = make_backend(GPUTarget("cuda", 90, 32))
    seen, streams, resamples = {}, {}, {}
    for launch in aot.launches():
        fn = getattr(module, launch.kernel)
        for width in aot.WIDTHS:
            signature, constexprs, _, options = aot.specialization(fn, launch, backend, width)
            named = {fn.arg_names[path[0]]: value for path, value in constexprs.items()}
            streams.setdefault(launch.kernel, set()).add(named.get("STREAM"))
            resamples.setdefault(launch.kernel, set()).add((named.get("STREAM"), named.get("RESAMPLE")))
            ints = {t for name, t in signature.items() if t in ("i32", "i64") and name not in aot.FLAGS}
            seen.setdefault(launch.kernel, set()).add(
                (signature["target_ptr"], named.get("HAS_DRAFT"), named.get("PROCESSED", signature.get("PROCESSED")),
                 frozenset(ints)))
            assert options.num_warps == 4 and options.enable_fp_fusion is False
    dtypes = {"*fp32", "*bf16", "*fp16"}
    for kernel in ("row_stats_kernel", "verify_kernel"):
        assert {(d, h) for d, h, _, _ in seen[kernel]} == {(d, h) for d in dtypes for h in (True, False)}
    assert {p for _, _, p, _ in seen["log_softmax_kernel"]} == {1, "i32"}  # processed (1) and raw (0)
    for kernel, specs in seen.items():
        assert {ints for *_, ints in specs} == {frozenset({"i32"}), frozenset({"i64"})}, kernel
    # block_tau_kernel reads only the acceptance uniforms: 3b's are 3a's (one specialization for both),
    # keyed by the plain or the step-mixed block seed (SPEC 3b: "philox_step")
    noise = {"philox", "murmur3", "murmur3_fp64", "explicit"}
    families = {"verify_kernel": noise, "resample_kernel": noise, "block_tau_kernel": {"philox", "philox_step", "explicit"}}
    assert streams == {k: families.get(k, {None}) for k in aot.KERNELS}
    assert resamples["resample_kernel"] == {("philox", "gumbel"), ("murmur3", "gumbel"), ("murmur3_fp64", "gumbel"),
                                            ("explicit", "gumbel"), ("explicit", "inverse_cdf")}


def test_parameters_and_block_verification_add_no_specializations():
    """SPEC 2's masks and SPEC 4b's block verification are runtime flags (MASKED, BLOCK) and
    kernels of their own: the specializations of the token-wise kernels stay what they were, and
    the two new kernels do not specialize the vocabulary sizes (6 specializations per arch each)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from rs_verify.triton_sampler import launches as recorded

    module = aot.kernels_for_compile()
    backend = make_backend(GPUTarget("cuda", 90, 32))
    sink = {False: {}, True: {}}
    for features in (False, True):
        for dtype in ("float32", "bfloat16", "float16"):
            for drafts, vocab in (("model", (160, 33)), ("model", (33, 33)), ("one_hot", (160, 160)), ("one_hot", (1, 1))):
                for mode in (None, "processed"):
                    out = []
                    recorded._record(out, "", dtype, drafts, *vocab, 1024, mode, features)
                    for launch in out:
                        fn = getattr(module, launch.kernel)
                        for width in aot.WIDTHS:
                            sig, cx, attrs, _ = aot.specialization(fn, launch, backend, width)
                            sink[features].setdefault(launch.kernel, set()).add((repr(sig), repr(cx), repr(attrs)))
    for kernel in ("row_stats_kernel", "verify_kernel", "log_softmax_kernel"):
        assert sink[True][kernel] == sink[False][kernel], kernel
    assert set(sink[False]) == {"row_stats_kernel", "verify_kernel", "log_softmax_kernel"}
    assert len(sink[True]["mask_stats_kernel"]) == 6 and len(sink[True]["block_tau_kernel"]) == 12


def test_tree_verification_adds_only_its_own_kernel():
    """SPEC 4c's tree batches launch the token-wise statistics kernels with the specializations they had
    (the node draft rows' statistics as a one-hot target's) and `tree_kernel`, which specializes on the
    logits dtype and RESAMPLE only: 3 x 2 x 2 widths = 12 per arch, whatever the drafts and vocabularies."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from rs_verify.triton_sampler import launches as recorded

    module = aot.kernels_for_compile()
    backend = make_backend(GPUTarget("cuda", 90, 32))
    sink = {False: {}, True: {}}
    for dtype in ("float32", "bfloat16", "float16"):
        for drafts, vocab in (("model", (160, 33)), ("model", (33, 33)), ("one_hot", (160, 160)), ("one_hot", (1, 1))):
            for resample in ("gumbel", "inverse_cdf"):
                for tree in (False, True):
                    out = []
                    if tree:
                        for features in (False, True):
                            recorded._record_tree(out, "", dtype, drafts, *vocab, 1024, features, resample)
                    else:  # the token-wise launches of these shapes, and those of the one-hot draft rows
                        for v in dict.fromkeys(vocab):
                            recorded._record(out, "", dtype, "one_hot", v, v, 1024, None, True, "explicit", resample)
                        recorded._record(out, "", dtype, drafts, *vocab, 1024, None, True, "explicit", resample)
                    for launch in out:
                        fn = getattr(module, launch.kernel)
                        for width in aot.WIDTHS:
                            sig, cx, attrs, _ = aot.specialization(fn, launch, backend, width)
                            sink[tree].setdefault(launch.kernel, set()).add((repr(sig), repr(cx), repr(attrs)))
    for kernel in ("row_stats_kernel", "mask_stats_kernel"):
        assert sink[True][kernel] <= sink[False][kernel], kernel
    assert set(sink[True]) == {"row_stats_kernel", "mask_stats_kernel", "tree_kernel"}
    assert len(sink[True]["tree_kernel"]) == 12


def test_error_text_names_the_innermost_reason():
    try:
        try:
            raise ValueError("at 9:8:\n        i_vec = tl.where(gt, idx, i_vec)\n        ^\nLoop-carried variable i_vec")
        except ValueError as inner:
            raise RuntimeError("at 3:4:\n    m = _row_stats(row)\n    ^") from inner
    except RuntimeError as outer:
        text = aot._error_text(outer)
    assert text.startswith("Loop-carried variable i_vec [at `i_vec = tl.where(gt, idx, i_vec)`"), text
    assert aot._error_text(OSError("ptxas died")) == "OSError: ptxas died"


@pytest.mark.slow
@pytest.mark.long  # 74 s of CPU with an empty Triton cache (2-core CPU machine)
def test_mixed_widths_compile():
    """Each size / offset scalar alone >= 2**31 (int64 among int32 ones), on sm_90: 159 compiles."""
    widths = aot.mixed_widths()
    assert {"int64:Vp", "int64:V", "int64:row_off", "int64:req_off"} <= set(widths)
    results = aot.compile_all([90], widths=widths, dtypes=("float32",), vocab_classes=("16n",))
    assert not failures(results), failures(results)
    assert {r.width for r in results} == set(widths)


@pytest.mark.slow
def test_gate_catches_register_spills():
    """A 16384-token vocabulary block needs more than 255 registers per thread: the compile
    succeeds but spills (about 1.6 KB of stack per thread on sm_90), which fails the gate."""
    results = aot.compile_all([90], widths=["int32"], block_sizes=(16384,), **ONE_SPECIALIZATION)
    assert [r.ok for r in results] == [True] and results[0].registers == 255 and results[0].local > 0
    assert aot.gate_failures(results) == results
