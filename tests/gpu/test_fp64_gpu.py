"""fp64 on the ``cuda`` target on a real GPU: the SIMT kernels of tests/kernel/test_fp64.py's CUDA cases
(softmax over rows past 4096, a long row sum, a GEMM, a convolution) against numpy float64 within the fp64
bound. Marked ``gpu`` and skipped, with the reason, where there is no device or no nvcc."""
from __future__ import annotations

import pytest

import kumiko
from kumiko.accuracy import bound, rel_l2
from kumiko.runtime.cuda_driver import device_available
from kumiko.runtime.ptxas import nvcc_path
from tests.kernel.test_fp64 import _cuda_cases

HAVE_GPU, GPU_REASON = device_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason=f"no GPU for the cuda target ({GPU_REASON})"),
    pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (the cuda target builds its kernels with it)"),
]


def test_fp64_on_the_device():
    for g, ins, want in _cuda_cases():
        got = kumiko.compile(g, target="cuda")(**ins)["y"]
        assert got.dtype == want.dtype and rel_l2(got, want) <= bound("fp64")
