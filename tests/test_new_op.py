"""Adding an op is one entry in the op table (``kumiko.ops``) plus its frontend spelling: a softsign
(``x / (1 + |x|)``) registered here, for the duration of a test only, runs on every target - the evaluator,
the CPU (vector loops and their scalar tails), and the CUDA emulator in fp32 and fp16 - against numpy."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import kumiko
from kumiko import Tensor, ops
from kumiko.accuracy import bound, rel_l2
from kumiko.diagnostics import KumikoError
from kumiko.frontend import lower
from kumiko.kernel import cexpr
from kumiko.pipeline import compile_cuda, compile_program
from kumiko.render import cuda
from kumiko.runtime.flops import count_flops

#: the one table entry: numpy meaning, C spelling (a helper per compute type, written into both preludes),
#: the spelling on vector lanes; FLOPs, algebra and the rest keep their defaults
SOFTSIGN = ops.Op(
    "SOFTSIGN", "softsign", "unary", lambda x: x / (1 + np.abs(x)),
    c={"": "kk_softsign_{ct}({x})"}, cv="kv_map(kk_softsign_float, {x})",
    helpers={"typed": "{q} {ct} kk_softsign_{ct}({ct} x) {{ return x / (({ct})1 + (x < 0 ? -x : x)); }}"},
    helper_cts=("float", "double"))


def _reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    s = x * 2.0 / (1.0 + np.abs(x * 2.0))
    return s + (x / (1.0 + np.abs(x))).sum(axis=1, keepdims=True)


@pytest.fixture
def softsign(monkeypatch):
    # the frontend spelling: Elementwise fn "softsign" builds the uop (in fp32 for 16-bit floats)
    monkeypatch.setitem(lower.UNARY_FNS, "softsign", (lambda c, x: c.b.add("SOFTSIGN", [x]), True))
    with ops.registered(SOFTSIGN):
        yield
    assert "SOFTSIGN" not in ops.ELEMENTWISE and "softsign" not in ops.BY_FN


def _graph(dtype: str):
    x = Tensor.input("x", (3, 37), dtype)
    return ((x * 2)._ew("softsign") + x._ew("softsign").sum(axis=1, keepdim=True)).graph("y")


@pytest.mark.parametrize("target, dtype", [("eval", "fp32"), ("cpu", "fp32"), ("cpu", "fp16"),
                                           ("cuda-emu", "fp32"), ("cuda-emu", "fp16")])
def test_a_registered_unary_op_runs_on_every_target(softsign, target, dtype):
    if target == "cuda-emu" and shutil.which("g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    g = _graph(dtype)
    xv = np.random.default_rng(7).standard_normal((3, 37)).astype(np.float32) * 3
    xv = xv.astype(np.float16) if dtype == "fp16" else xv
    got = kumiko.compile(g, target)(x=xv)["y"]
    assert got.dtype == xv.dtype
    assert rel_l2(got, _reference(xv)) <= bound(dtype)
    if target != "eval":
        assert rel_l2(got, kumiko.compile(g, "eval")(x=xv)["y"]) <= bound(dtype)


def test_the_table_entry_is_what_every_stage_reads(softsign):
    assert cexpr.unary("softsign", "v", "float") == "kk_softsign_float(v)"
    assert cexpr.vunary("softsign", "v") == "kv_map(kk_softsign_float, v)"
    assert "static inline double kk_softsign_double(double x)" in cexpr.PRELUDE
    assert "__device__ __forceinline__ float kk_softsign_float(float x)" in cuda.prelude()
    g = _graph("fp32")
    src = compile_program(g.tiny, "cpu").source.source  # vector lanes and the scalar tail (37: no multiple of a width)
    assert "kv_map(kk_softsign_float, " in src and "kk_softsign_float(" in src.replace("kv_map(kk_softsign_float", "")
    if shutil.which("g++") is not None:
        assert "kk_softsign_float(" in compile_cuda(g.tiny).source.split("__global__", 1)[1]
    # 2 softsigns, the MUL, the ADD (3*37 each) and the SUM (3*37 inputs): one FLOP per element each
    assert count_flops(g.tiny) == 5 * 3 * 37


def test_an_unregistered_op_is_not_tiny_ir(softsign):
    ops.unregister("SOFTSIGN")
    try:
        with pytest.raises(KumikoError) as e:
            _graph("fp32")                            # the frontend spelling is still there, the uop is not
        assert e.value.code == "E1006"
        assert "softsign" not in cexpr.PRELUDE
    finally:
        ops.register(SOFTSIGN)


@pytest.mark.parametrize("bad, code", [
    (dict(kind="cast"), "E1010"),                      # only unary, binary and compare ops
    (dict(c={"float": "f({x})"}), "E1010"),            # no spelling for the other compute types
    (dict(fn="exp2"), "E1016"),                        # the region name of another op
])
def test_register_refuses_an_entry_the_stages_cannot_use(bad, code):
    with pytest.raises(KumikoError) as e:
        ops.register(dataclasses.replace(SOFTSIGN, **bad))
    assert e.value.code == code and "SOFTSIGN" not in ops.ELEMENTWISE
