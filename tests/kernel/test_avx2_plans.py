"""The CPU backend as an AVX2 machine (Zen 1-3, Haswell-class Xeons) sees it, run on whatever machine the tests
run on: plans for 8-float vectors (6 x 16 micro-tiles, other orientations and staging choices than AVX-512's
12 x 32) and kernels built with ``-mno-avx512f``, checked against onnxruntime.

Plans differ by ISA, so a path only AVX2 plans take goes untested on an AVX-512 host: a Llama layer's
attention row pipe once took the A-side stage for its P operand (held in the pipe's panels, not a buffer)
and failed to compile (KeyError) on a Zen 3 only."""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.backend import cpu as cpu_backend
from kumiko.runtime import cpu as cpu_runtime
from kumiko.runtime.host import cpu_features
from tests.frontend.test_onnx_networks import bert, bert_feeds, check, float_input, llama, mbconv, needs_gxx, resnet


@pytest.fixture
def avx2(monkeypatch):
    """Plans chosen for an AVX2 machine and kernels built without AVX-512 (no program cache: the source is
    made again)."""
    feats = dict(cpu_features())
    if not feats.get("avx2") or not feats.get("fma"):
        pytest.skip("this machine has no AVX2 and FMA")
    feats.update(avx512f=False, avx512bw=False, avx512vl=False, avx512_bf16=False, vector_width_f32=8)
    monkeypatch.setattr(cpu_backend, "cpu_features", lambda: feats)
    monkeypatch.setattr(cpu_runtime, "DEFAULT_FLAGS", tuple(cpu_runtime.DEFAULT_FLAGS) + ("-mno-avx512f",))
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")


@needs_gxx
def test_plans_are_avx2_plans(avx2):
    """The fixture's plans are AVX2 plans (the other tests check their numbers)."""
    exe = kumiko.compile(kumiko.from_onnx(resnet(1, 8, 6)), "cpu")
    assert {p.arch for p in exe.compilation.plan.values()} == {"cpu-avx2"}


@needs_gxx
@pytest.mark.parametrize("size", [(2, 8, 32, 4, 2), (1, 6, 48, 6, 3)], ids=str)
def test_llama(avx2, size):
    b, s, d, heads, kv = size
    check(llama(b, s, d, heads, kv, ff=3 * d // 2), {"x": float_input(np.random.default_rng(400 + s), (b, s, d),
                                                                       "fp32")}, "cpu")


@needs_gxx
def test_bert(avx2):
    check(bert(2, 8, 32, 4, ff=64), bert_feeds(2, 8, 50, 308, d=32), "cpu")


@needs_gxx
@pytest.mark.parametrize("size", [(1, 16, 12), (1, 16, 28)], ids=str)
def test_resnet(avx2, size):
    n, c, hw = size
    check(resnet(n, c, hw), {"x": float_input(np.random.default_rng(100 + hw), (n, c, hw, hw), "fp32")}, "cpu")


@needs_gxx
@pytest.mark.parametrize("size", [(1, 12, 7), (1, 16, 28)], ids=str)
def test_mbconv(avx2, size):
    n, c, hw = size
    check(mbconv(n, c, hw, act="hardswish"), {"x": float_input(np.random.default_rng(200 + hw), (n, c, hw, hw),
                                                                "fp32")}, "cpu")


@needs_gxx
@pytest.mark.parametrize("n,c,co,hw,k,pad,bound", [
    (1, 16, 32, 28, 3, 1, True),      # 14 x 14 output: A panels of 6 pixels, some wrapping a row, pad 1 edges
    (2, 8, 16, 15, 3, 2, False),      # batch 2, odd size, pad 2 (two masked rows and columns), weights as inputs
    (1, 24, 40, 13, 1, 0, True),      # 1x1 stride 2: every row valid
])
def test_stride_two_pixels_on_the_a_side_are_deinterleaved(avx2, monkeypatch, n, c, co, hw, k, pad, bound):
    """A stride-2 conv's pixels packed into A panels (``kernel/pack.py``): a chunk of rows that is one run of
    stride 2 is copied by two loads and a shuffle (``kk_pack_s2``), with the rows' mask spread over the run's
    floats where padding leaves some rows out (``kk_pack_s2m``); the rest a float at a time or by a gather.
    The ResNet-50 layer 256 -> 256 from 28x28 ran 0.84x as long with them as with the gather."""
    import ctypes
    monkeypatch.setattr(cpu_runtime, "DEFAULT_FLAGS", tuple(cpu_runtime.DEFAULT_FLAGS) + ("-DKUMIKO_TRACE_STAGE",))
    rng = np.random.default_rng(c + co)
    wv = (rng.standard_normal((co, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    x = Tensor.input("x", (n, c, hw, hw))
    w = Tensor(wv, name="w", role="param") if bound else Tensor.input("w", (co, c, k, k))
    g = x.conv2d(w, Tensor.input("b", (co,)), stride=2, padding=pad).relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    (plan,) = exe._run.plans.values()
    assert plan.lanes == "n"          # the channels in the lanes, the pixels on the A side
    full, part = (ctypes.c_longlong.in_dll(exe._run.module.lib, s) for s in ("kk_pack_s2", "kk_pack_s2m"))
    full.value = part.value = 0
    for seed in (0, 1):
        ins = exe.random_inputs(seed)
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    assert full.value > 0
    assert (part.value > 0) == (pad > 0)


@needs_gxx
def test_a_padded_stage_is_read_in_k_blocks_of_128_rows_on_16_lanes(avx2):
    """A 3x3 conv's B panel read from its padded stage: 16 floats a K row at any offset span two cache lines,
    so its K blocks are at most 128 rows (``contract.emit``; 64 -> 64 at 56x56 and 128 -> 128 at 28x28 ran
    0.955-0.966 of the time against 256 on a Zen 3); a 1x1 conv's panels read in place from their source
    keep blocks of 256 (MobileNetV2 ran 1.017x with 128). Both against the evaluator."""
    from kumiko.plan.packed import IN_PLACE_PANEL_BYTES
    rng = np.random.default_rng(11)
    for k, c, hw, rows in ((3, 64, 56, IN_PLACE_PANEL_BYTES // 128), (1, 576, 14, IN_PLACE_PANEL_BYTES // 64)):
        x = Tensor.input("x", (1, c, hw, hw))
        w = Tensor((rng.standard_normal((64, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), name="w",
                   role="param")
        g = x.conv2d(w, padding=k // 2).relu().graph("y")
        exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
        (plan,) = exe._run.plans.values()
        assert plan.register_block.nr == 16
        src = exe._run.source
        assert ("kk_micro_stage_" in src) == (k == 3)
        assert f"kk_kl1n = kk_K > {rows} ? (kk_K + {rows - 1}) / {rows} : 1;" in src
        ins = exe.random_inputs(0)
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
