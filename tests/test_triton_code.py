"""rs_verify.harness.triton_code: a sampler runs Triton when its code reaches a kernel, not when a
module it calls into also holds one (a library file with a Triton and a torch version of one
algorithm, as SGLang's DSpark ships them)."""

import importlib.util
import sys

import pytest

pytest.importorskip("triton")

from rs_verify.harness.triton_code import runs_triton  # noqa: E402

LIBRARY = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, o_ptr):
    r = tl.program_id(0)
    tl.store(o_ptr + r, tl.load(x_ptr + r) * 2.0)


def _launch(x, out):
    _double[(x.numel(),)](x, out)


def double_triton(x):
    out = torch.empty_like(x)
    _launch(x, out)
    return out


def double_torch(x):
    return x * 2.0
'''


class Holds:
    """A sampler that calls the function it is given (an adapter wrapping a library function)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, batch, **kw):
        return self.fn(batch)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path = tmp_path_factory.mktemp("lib") / "twoversions.py"
    path.write_text(LIBRARY)
    spec = importlib.util.spec_from_file_location("twoversions", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["twoversions"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["twoversions"]


def test_the_torch_version_beside_a_kernel_runs_no_triton(library):
    assert runs_triton(Holds(library.double_torch)) is False


def test_a_kernel_reached_through_calls_is_found(library):
    assert runs_triton(Holds(library.double_triton)) is True  # double_triton -> _launch -> _double


def test_a_held_module_counts_whole(library):
    class CallsByAttribute:
        def __init__(self):
            self.lib = library

        def __call__(self, batch, **kw):
            return self.lib.double_torch(batch)

    assert runs_triton(CallsByAttribute()) is True


def test_a_method_launching_a_kernel_is_found(library):
    class OwnKernel:
        def __call__(self, batch, **kw):
            return self.launch(batch)

        def launch(self, x):
            library.double_triton(x)

    assert runs_triton(OwnKernel()) is True
