"""The MMA skeleton's table gather (``GatherTable``): an operand gathered by rows - an implicit GEMM's im2col, a
transposed read - goes through per-warp K tables in 32-bit arithmetic when its sizes allow (``fits``), else
through the 64-bit element gather. Checked on the emulator against the Tiny IR evaluator: paddings, strides,
dilations, odd channel counts and image sizes, batches of 1 and 3, fp16 and bf16, every emulator
configuration, symbolic sizes bound at run time; the fallback is run by forcing ``fits`` false in the IR."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kumiko.frontend.tensor import Tensor
from kumiko.kernel.gpu_ir import MmaKernel
from kumiko.pipeline import compile_cuda
from kumiko.render.cuda import render_cuda
from kumiko.runtime.emu_program import CompiledCuda
from tests.gpu.conftest import needs_gxx, run_and_compare

TABLE = "through per-warp K tables"


def _conv(dtype: str, c: int, co: int, k: int, stride: int, padding: int, dilation: int):
    x = Tensor.input("X", ("N", c, "H", "W"), dtype=dtype)
    w = Tensor.input("Wt", (co, c, k, k), dtype=dtype)
    return x.conv2d(w, stride=stride, padding=padding, dilation=dilation).graph("y", name="conv")


def _transposed_a(dtype: str):
    """``y = A^T @ B`` with A stored (K, M): the A operand's K index is its leading one (no cp.async for the
    MMA's A side), a table form without guards."""
    a = Tensor.input("A", ("K", "M"), dtype=dtype)
    b = Tensor.input("B", ("K", 40), dtype=dtype)
    return a.transpose(1, 0).matmul(b).graph("y", name="at_b")


#: name -> (graph, [sizes...]): every run binds the symbolic sizes anew (one build each)
CASES = {
    "fp16_c3_k3_s1_p1": (lambda: _conv("fp16", 3, 16, 3, 1, 1, 1),
                         [{"N": 1, "H": 7, "W": 7}, {"N": 3, "H": 9, "W": 13}]),
    "bf16_c5_k3_s2_p1": (lambda: _conv("bf16", 5, 24, 3, 2, 1, 1),
                         [{"N": 1, "H": 13, "W": 13}, {"N": 3, "H": 9, "W": 7}]),
    "fp16_c8_k3_s1_p2_d2": (lambda: _conv("fp16", 8, 16, 3, 1, 2, 2),
                            [{"N": 3, "H": 9, "W": 9}, {"N": 1, "H": 13, "W": 7}]),
    "bf16_c4_k5_s2_p0": (lambda: _conv("bf16", 4, 8, 5, 2, 0, 1),
                         [{"N": 3, "H": 13, "W": 9}]),
    "fp16_transposed_a": (lambda: _transposed_a("fp16"), [{"K": 72, "M": 150}, {"K": 19, "M": 33}]),
}
CONFIGS = ("deferred", "eager", "reversed", "random")


@pytest.fixture(scope="module")
def built(gpu_cache):
    """name -> (graph, CompiledCuda) compiled once."""
    out = {}
    for name, (make, _) in CASES.items():
        g = make()
        out[name] = (g, compile_cuda(g.tiny))
    return out


def _mma(c: CompiledCuda) -> MmaKernel:
    return next(k for k in c.kernels if isinstance(k, MmaKernel))


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_table_gather_matches_the_evaluator(built, name):
    g, c = built[name]
    assert TABLE in c.source and _mma(c).table_run(_mma(c).loads[0]) is not None
    for i, sizes in enumerate(CASES[name][1]):
        for emu in CONFIGS:
            errs = run_and_compare(c, g, emu, 11 + i, sizes)
            assert max(errs.values()) < 1e-2, (name, sizes, emu, errs)


def _without_fit(c: CompiledCuda) -> CompiledCuda:
    """The same program with every table gather's int32 check false: the 64-bit gather runs instead."""
    def f(k):
        if not isinstance(k, MmaKernel):
            return k
        loads = tuple(replace(ld, table=replace(ld.table, fits="false")) if ld.table else ld for ld in k.loads)
        return replace(k, loads=loads)
    ks = [f(k) for k in c.kernels]
    return CompiledCuda(c.program, c.plans, ks, render_cuda(ks), c.launches, c.arch)


@needs_gxx
def test_the_64_bit_fallback_matches_the_evaluator(built):
    g, c = built["bf16_c5_k3_s2_p1"]
    slow = _without_fit(c)
    assert slow.source != c.source and "const bool kk_fit_x = false;" in slow.source
    for emu in ("deferred", "reversed"):
        errs = run_and_compare(slow, g, emu, 5, {"N": 3, "H": 9, "W": 7})
        assert max(errs.values()) < 1e-2, (emu, errs)


def _fits(c: CompiledCuda, sizes: dict) -> bool:
    """The kernel's ``kk_fit_x`` (C text of 64-bit arithmetic over the size symbols) evaluated at ``sizes``."""
    text = re.search(r"const bool kk_fit_x = (.*?);  //", c.source).group(1)
    for s, v in sizes.items():
        text = re.sub(rf"\bs_{s}\b", str(v), text)
    text = re.sub(r"(\d+)LL", r"\1", text).replace("&&", " and ")
    assert "s_" not in text, text
    return bool(eval(text, {}))


def test_the_int32_decision_follows_the_sizes(built):
    """The 32-bit path needs the K parts of the offset and every guard's row and K parts within 2^30 (the
    row's offset is a 64-bit pointer): ResNet-sized convolutions take it at any batch, an image whose channel
    planes pass 2^30 elements or a row index past 2^30 does not."""
    _, c = built["fp16_c3_k3_s1_p1"]
    assert _fits(c, {"N": 32, "H": 56, "W": 56})
    assert _fits(c, {"N": 2 ** 20, "H": 224, "W": 224})
    assert not _fits(c, {"N": 1, "H": 2 ** 15, "W": 2 ** 15})
    assert not _fits(c, {"N": 1, "H": 2 ** 30, "W": 1})
    _, t = built["fp16_transposed_a"]
    assert _fits(t, {"K": 4096, "M": 4096}) and not _fits(t, {"K": 2 ** 16, "M": 2 ** 15})


def test_cp_async_operands_take_no_table():
    """A plain row-major GEMM copies both operands: no table, no int32 check, no extra shared memory."""
    a = Tensor.input("A", ("M", "K"), dtype="fp16")
    b = Tensor.input("B", ("K", "N"), dtype="fp16")
    c = compile_cuda(a.matmul(b).graph("y", name="ab").tiny)
    k = _mma(c)
    assert all(ld.table is None for ld in k.loads) and TABLE not in c.source and "kk_fit_" not in c.source
    assert k.smem_bytes == sum(r.nbytes for r in k.rings)
