"""A window reduction after a contraction whose windows do not divide the MMA tile (a ResNet's 7x7 global average
pool: 49 rows a window) runs on the MMA skeleton with its M tiles a whole number of windows apart
(``MmaKernel.m_step``), not on the SIMT kernel; checked on the emulator against the Tiny IR evaluator, with the
verifier refusing tiles whose rows are not whole windows."""
from __future__ import annotations

from dataclasses import replace

import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import MmaKernel
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.pipeline import compile_cuda
from tests.gpu.conftest import needs_gxx, run_and_compare

pytestmark = needs_gxx


def _conv_pool(n: int, c: int, hw: int, co: int, pool, residual: bool = False):
    x = Tensor.input("X", (n, c, hw, hw), dtype="fp16")
    w = Tensor.input("Wt", (co, c, 1, 1), dtype="fp16")
    b = Tensor.input("b", (co,), dtype="fp16")
    y = x.conv2d(w, b)
    if residual:
        y = y + Tensor.input("R", (n, co, hw, hw), dtype="fp16")
    y = y.relu()
    y = y.mean((2, 3), keepdim=True) if pool == "gap" else y.max_pool2d(pool, pool)
    return y.graph("y", name="conv_pool")


#: (batch, channels, image, out channels, pool): the tile's rows and BM
CASES = {
    "gap7_resnet_tail": ((1, 64, 7, 128, "gap", True), 49, 64),
    "gap7_batch3": ((3, 32, 7, 72, "gap"), 49, 64),
    "max3x3_batch2": ((2, 16, 9, 40, 3), 63, 64),
    "gap12_256_rows": ((1, 24, 12, 64, "gap"), 144, 256),
}


@pytest.mark.parametrize("name", list(CASES))
def test_window_tiles_match_the_evaluator(gpu_cache, name):
    args, rows, bm = CASES[name]
    g = _conv_pool(*args)
    c = compile_cuda(g.tiny)
    (k,) = c.kernels
    assert isinstance(k, MmaKernel) and k.epilogue.mode == "smem_window"
    assert (k.m_rows, k.tile[0]) == (rows, bm)
    assert c.launches[0].grid[1][1] == rows                 # grid.y counts tiles of whole windows
    for emu in ("deferred", "reversed", "random"):
        errs = run_and_compare(c, g, emu, 4)
        assert all(e < 2e-3 for e in errs.values()), (emu, errs)


def test_tiles_that_split_a_window_are_refused():
    g = _conv_pool(*CASES["gap7_batch3"][0])
    (k,) = compile_cuda(g.tiny).kernels
    for bad in (replace(k, m_step=50), replace(k, m_step=0), replace(k, m_step=98)):
        with pytest.raises(KumikoError) as e:
            verify_mma(bad)
        assert e.value.details["hazard"] == "shape"
    plain = compile_cuda(kumiko.Tensor.input("A", (40, 64), dtype="fp16").matmul(
        kumiko.Tensor.input("B", (64, 24), dtype="fp16")).graph("y").tiny).kernels[0]
    with pytest.raises(KumikoError):
        verify_mma(replace(plain, m_step=32))
