"""SM90 in the emulator: TMA (swizzle modes, out-of-bounds fill), mbarrier phases, wgmma (descriptors, fragment
layouts, poisoned accumulators), setmaxnreg; the hand-assembled GPU IR GEMM (tests/emu/sm90_program.py) against
numpy at sizes that are not tile multiples, fp16 and bf16, in the emulator's configurations; the faults its
injected bugs cause; and its nvcc build for sm_90a.
"""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir_sm90 import (
    BarDecl,
    BarRef,
    BulkCommit,
    BulkWait,
    Elect,
    FenceMbarInit,
    IExpr,
    MbarArriveTx,
    MbarInit,
    MbarWait,
    Sm90Kernel,
    SmemBuf,
    SmemRef,
    TensorMapDesc,
    TmaLoad,
    TmaStore,
)
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from kumiko.kernel.tensormap import TiledEncoding
from kumiko.render.cuda import render_cuda
from kumiko.runtime.emu import CONFIGS, build
from kumiko.runtime.ptxas import nvcc_compile, nvcc_path
from kumiko.runtime.tensormap import TensorMapArg, emu_encode

from .conftest import kernel_source, needs_gxx, rel_l2
from .sm90_program import gemm_kernel, inject, inputs, launch, roles_kernel, ws_gemm_kernel

GEMMS = [(64, "fp16", "K"), (128, "fp16", "K"), (256, "fp16", "K"), (64, "bf16", "K"), (128, "bf16", "K"),
         (64, "fp16", "MN"), (128, "bf16", "MN")]
BUGS = ["no_wgmma_wait", "expect_tx", "desc_swizzle", "no_proxy_fence", "parity", "no_wgmma_fence"]
WS_GEMMS = [(64, "fp16"), (128, "bf16")]
WS_BUGS = ["early_release", "no_empty_wait"]
SWIZZLES = ["none", "32B", "64B", "128B"]
ROWS = 16


def _named(k: Sm90Kernel, suffix: str) -> Sm90Kernel:
    return dataclasses.replace(k, name=f"{k.name}_{suffix}")


def tma_roundtrip_kernel(swizzle: str, oob: str) -> Sm90Kernel:
    """One thread: TMA-load a box (inner dimension the swizzle span, ROWS rows) of a 40 x 50 fp16 array at the
    launch's coordinates, wait, TMA-store the shared-memory image unswizzled to a ROWS x inner output."""
    inner = {"none": 64, "32B": 16, "64B": 32, "128B": 64}[swizzle]
    c = IExpr.const
    maps = (TensorMapDesc("tin", "x", "fp16", (c(56), c(40)), (c(112),), (inner, ROWS), swizzle, oob),
            TensorMapDesc("tout", "y", "fp16", (c(inner), c(ROWS)), (c(2 * inner),), (inner, ROWS)))
    bar = BarRef("kk_bar")
    body = (Elect((MbarInit(bar, 1), FenceMbarInit(),
                   MbarArriveTx(bar, inner * ROWS * 2),
                   TmaLoad("tin", SmemRef("sx"), bar, (IExpr.var("kk_x"), IExpr.var("kk_y"))),
                   MbarWait(bar, IExpr.const(0)),
                   TmaStore("tout", SmemRef("sx"), (c(0), c(0))), BulkCommit(), BulkWait(0))),)
    return Sm90Kernel(f"tma_{swizzle}_{oob}", 128, maps, ("kk_x", "kk_y"), (SmemBuf("sx", "uint16_t", 4096),),
                      (BarDecl("kk_bar"),), (), body, verify_sizes=(("kk_x", (0,)),))


def tma_nd_kernel(shape: tuple, box: tuple) -> Sm90Kernel:
    """The same round trip for a rank-len(shape) fp16 array (numpy order) and box (innermost first), no swizzle:
    the box lands in shared memory row-major and goes out unchanged to an array of the box's shape."""
    c, r = IExpr.const, len(shape)
    dims = tuple(reversed(shape))
    strides, acc = [], 2
    for d in dims[:-1]:
        acc *= d
        strides.append(c(acc))
    out_strides, acc = [], 2
    for d in box[:-1]:
        acc *= d
        out_strides.append(c(acc))
    maps = (TensorMapDesc("tin", "x", "fp16", tuple(c(d) for d in dims), tuple(strides), box),
            TensorMapDesc("tout", "y", "fp16", tuple(c(d) for d in box), tuple(out_strides), box))
    bar = BarRef("kk_bar")
    nbytes = 2 * int(np.prod(box))
    body = (Elect((MbarInit(bar, 1), FenceMbarInit(), MbarArriveTx(bar, nbytes),
                   TmaLoad("tin", SmemRef("sx"), bar, tuple(IExpr.var(f"kk_c{i}") for i in range(r))),
                   MbarWait(bar, IExpr.const(0)),
                   TmaStore("tout", SmemRef("sx"), (c(0),) * r), BulkCommit(), BulkWait(0))),)
    return Sm90Kernel(f"tma_{r}d", 128, maps, tuple(f"kk_c{i}" for i in range(r)), (SmemBuf("sx", "uint16_t", 4096),),
                      (BarDecl("kk_bar"),), (), body, verify_sizes=(("kk_c0", (0,)),))


TMA_ND = {3: ((6, 7, 24), (8, 4, 5)), 5: ((3, 4, 5, 6, 16), (16, 2, 3, 2, 2))}


def swizzled_image(x: np.ndarray, x0: int, y0: int, inner: int, swizzle: str, oob: str) -> np.ndarray:
    """numpy's model of the box in shared memory: row-major box bytes, then the 16-byte chunk index XOR the
    address bits above the 128-byte line (CUDA programming guide, TMA swizzle; cute Swizzle<B,4,3>)."""
    fill = 0x7FFF if oob == "nan" else 0
    box = np.full((ROWS, inner), fill, np.uint16)
    for r in range(ROWS):
        for c in range(inner):
            y, xx = y0 + r, x0 + c
            if 0 <= y < x.shape[0] and 0 <= xx < x.shape[1]:
                box[r, c] = x[y, xx]
    src = box.reshape(-1).view(np.uint8)
    mask = {"none": 0, "32B": 1, "64B": 3, "128B": 7}[swizzle]
    out = np.empty_like(src)
    for o in range(0, src.size, 16):
        out[o ^ (((o >> 7) & mask) << 4):][:16] = src[o:o + 16]
    return out.view(np.uint16).reshape(ROWS, inner)


@pytest.fixture(scope="module")
def sm90_modules(emu_cache):
    if shutil.which("g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    gemms = [gemm_kernel(n, dt, b_major=bm) for n, dt, bm in GEMMS]
    bugs = [_named(inject(gemm_kernel(64), b), b) for b in BUGS] + [roles_kernel(232), roles_kernel(240)]
    bugs += [_named(inject(ws_gemm_kernel(64), b), b) for b in WS_BUGS]
    gemms += [ws_gemm_kernel(n, dt) for n, dt in WS_GEMMS]
    tmas = [tma_roundtrip_kernel(s, o) for s in SWIZZLES for o in ("zero", "nan")]
    tmas += [tma_nd_kernel(*TMA_ND[r]) for r in TMA_ND]
    cfg = CONFIGS["deferred+round_robin"]
    return {"gemm": (build(render_cuda(gemms), cfg, name="sm90_gemm"), {k.name: k for k in gemms}),
            "bugs": (build(render_cuda(bugs), cfg, name="sm90_bugs"), {k.name: k for k in bugs}),
            "tma": (build(render_cuda(tmas), cfg, name="sm90_tma"), {k.name: k for k in tmas}),
            "rs": (build(kernel_source("wgmma_rs.cu"), cfg, name="wgmma_rs"), {})}


def _gemm(mod, k, m, n_total, kk, dtype, seed=0):
    a, bt, ref = inputs(m, n_total, kk, dtype, seed)
    c = np.zeros((m, n_total), np.float32)
    launch(mod, k, m, n_total, kk, a, bt, c)
    return c, ref


@needs_gxx
@pytest.mark.parametrize("n,dtype,b_major", GEMMS)
@pytest.mark.parametrize("config", ["deferred+round_robin", "eager+run_ahead", "eager+reversed", "deferred+random1"])
def test_tma_wgmma_gemm_matches_numpy(sm90_modules, n, dtype, b_major, config):
    if n == 256 and config != "deferred+round_robin":
        pytest.skip("n256 runs in one configuration (the slowest kernel)")
    mod, ks = sm90_modules["gemm"]
    k = ks[f"sm90_gemm_n{n}_{dtype}" + ("_bmn" if b_major == "MN" else "")]
    verify_sm90(k)
    # M, N, K not tile multiples (TMA zero-fills the loads past them and clips the store); K = 40: one partial tile.
    # (B as K x N needs N a multiple of 8: TMA's row strides are multiples of 16 bytes.)
    for m, n_total, kk in ((100, n + 8, 200), (37, n - (8 if b_major == "MN" else 4), 40)):
        c, ref = _gemm(mod.with_config(CONFIGS[config]), k, m, n_total, kk, dtype)
        assert rel_l2(c, ref) < 1e-6, (m, n_total, kk)


@needs_gxx
@pytest.mark.parametrize("n,dtype", WS_GEMMS)
@pytest.mark.parametrize("config", ["deferred+round_robin", "eager+run_ahead", "eager+reversed", "deferred+random1"])
def test_warp_specialised_gemm_matches_numpy(sm90_modules, n, dtype, config):
    """A producer warpgroup (setmaxnreg.dec) and two consumer warpgroups (setmaxnreg.inc) over the ring."""
    mod, ks = sm90_modules["gemm"]
    k = ks[f"sm90_ws_gemm_n{n}_{dtype}"]
    verify_sm90(k)
    for m, n_total, kk in ((200, n + 8, 200), (37, n - 4, 40)):
        c, ref = _gemm(mod.with_config(CONFIGS[config]), k, m, n_total, kk, dtype)
        assert rel_l2(c, ref) < 1e-6, (m, n_total, kk)


@needs_gxx
def test_ring_bugs_in_the_warp_specialised_gemm(sm90_modules):
    """Where the producer is another warpgroup, the ring bugs the one-warpgroup program hides show: a consumer
    releasing its stage before wgmma.wait_group lets the producer refill it before the product is computed (seen
    when the producer runs ahead and its copies land at issue), a producer not waiting for the release arrives
    on a full barrier whose phase has not completed."""
    mod, ks = sm90_modules["bugs"]
    k = ks["sm90_ws_gemm_n64_fp16_early_release"]
    c, ref = _gemm(mod.with_config(CONFIGS["eager+run_ahead"]), k, 200, 72, 200, "fp16")
    assert rel_l2(c, ref) > 0.1
    with pytest.raises(KumikoError) as e:
        _gemm(mod, ks["sm90_ws_gemm_n64_fp16_no_empty_wait"], 200, 72, 200, "fp16")
    assert e.value.details["fault"] == "mbarrier" and "more arrivals than its count 1" in e.value.why
    with pytest.raises(KumikoError) as e:
        _gemm(mod.with_config(CONFIGS["eager+run_ahead"]), ks["sm90_ws_gemm_n64_fp16_no_empty_wait"], 200, 72, 200,
              "fp16")
    assert e.value.details["fault"] == "deadlock" and "mbarrier at" in e.value.why


@needs_gxx
def test_injected_bugs_fault_or_give_wrong_data(sm90_modules):
    mod, ks = sm90_modules["bugs"]
    k = ks["sm90_gemm_n64_fp16_desc_swizzle"]
    c, ref = _gemm(mod, k, 100, 72, 200, "fp16")  # a descriptor whose swizzle disagrees with the map: wrong data
    assert rel_l2(c, ref) > 0.5
    faults = {"no_wgmma_wait": ("poisoned_read", "before wgmma.wait_group retired"),
              "expect_tx": ("deadlock", "waited for with parity 0 in phase 0, 0 of 1 arrivals missing, 8192 "
                            "transaction bytes outstanding (expect_tx announced 24576, TMA delivered 16384)"),
              "no_proxy_fence": ("async_proxy_fence", "after the last fence.proxy.async"),
              "parity": ("poisoned_read", "a TMA load no mbarrier wait ordered"),
              "no_wgmma_fence": ("wgmma_fence", "no wgmma.fence")}
    for bug, (fault, text) in faults.items():
        for config in ("deferred+round_robin", "eager+reversed"):
            if bug == "parity" and config.startswith("eager"):
                continue  # the copy landed at issue: the early read sees the data
            with pytest.raises(KumikoError) as e:
                _gemm(mod.with_config(CONFIGS[config]), ks[f"sm90_gemm_n64_fp16_{bug}"], 100, 72, 200, "fp16")
            assert e.value.code == "E1702" and e.value.details["fault"] == fault, (bug, e.value)
            assert text in e.value.why, (bug, e.value.why)


@needs_gxx
def test_setmaxnreg_budget(sm90_modules):
    mod, _ = sm90_modules["bugs"]
    mod.launch("sm90_roles_232", grid=1, block=384, smem=0, args=[])
    with pytest.raises(KumikoError) as e:
        mod.launch("sm90_roles_240", grid=1, block=384, smem=0, args=[])
    assert e.value.details["fault"] == "deadlock" and "setmaxnreg.inc waits for registers" in e.value.why


@needs_gxx
@pytest.mark.parametrize("swizzle", SWIZZLES)
@pytest.mark.parametrize("oob", ["zero", "nan"])
def test_tma_swizzle_and_out_of_bounds_fill(sm90_modules, swizzle, oob):
    mod, ks = sm90_modules["tma"]
    k = ks[f"tma_{swizzle}_{oob}"]
    verify_sm90(k)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 0x7C00, (40, 56), dtype=np.uint16)  # finite halves, never the 0xFFFF poison
    inner = k.maps[0].box[0]
    for x0, y0 in ((0, 0), (8, 3), (-8, -5), (56 - inner + 8, 30)):  # inside, offset, and past each edge
        y = np.zeros((ROWS, inner), np.uint16)
        sizes = {}
        args = [TensorMapArg(k.maps[0].encoding(sizes), x), TensorMapArg(k.maps[1].encoding(sizes), y), x0, y0]
        mod.launch(k.name, grid=1, block=128, smem=4096, args=args)
        np.testing.assert_array_equal(y, swizzled_image(x, x0, y0, inner, swizzle, oob), err_msg=f"{x0},{y0}")


@needs_gxx
@pytest.mark.parametrize("rank", sorted(TMA_ND))
def test_tma_3d_and_5d_boxes(sm90_modules, rank):
    mod, ks = sm90_modules["tma"]
    k = ks[f"tma_{rank}d"]
    shape, box = TMA_ND[rank]
    rng = np.random.default_rng(rank)
    x = rng.integers(1, 0x7C00, shape, dtype=np.uint16)
    for start in ((0,) * rank, tuple(d - b // 2 for d, b in zip(reversed(shape), box)), (-1,) * rank):
        y = np.zeros(tuple(reversed(box)), np.uint16)
        args = [TensorMapArg(k.maps[0].encoding({}), x), TensorMapArg(k.maps[1].encoding({}), y), *start]
        mod.launch(k.name, grid=1, block=128, smem=4096, args=args)
        want = np.zeros_like(y)
        for idx in np.ndindex(*y.shape):  # numpy order: outermost first; start is innermost first
            g = tuple(s + i for s, i in zip(reversed(start), idx))
            if all(0 <= gi < n for gi, n in zip(g, shape)):
                want[idx] = x[g]
        np.testing.assert_array_equal(y, want, err_msg=str(start))


@needs_gxx
@pytest.mark.parametrize("kernel,n,trans", [("wgmma_rs_k64", 64, 0), ("wgmma_rs_mn64", 64, 1), ("wgmma_rs_k24", 24, 0)])
def test_wgmma_a_from_registers(sm90_modules, kernel, n, trans):
    mod, _ = sm90_modules["rs"]
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((16, n)).astype(np.float16)
    d = np.zeros((64, n), np.float32)
    bb = b if trans else np.ascontiguousarray(b.T)
    mod.launch(kernel, grid=1, block=128, smem=0, args=[a.view(np.uint16), bb.view(np.uint16), d])
    assert rel_l2(d, a.astype(np.float64) @ b.astype(np.float64)) < 1e-6


def test_tensor_map_checks():
    with pytest.raises(KumikoError) as e:
        TiledEncoding.for_array((40, 56), "fp16", (64, 16), "64B")  # 128-byte box rows, 64-byte swizzle span
    assert e.value.code == "E1703" and "swizzle span" in e.value.why
    with pytest.raises(KumikoError) as e:
        TiledEncoding.for_array((40, 50), "fp16", (32, 8))  # 100-byte rows: TMA strides are multiples of 16
    assert "globalStrides[0] = 100" in e.value.why
    enc = TiledEncoding.for_array((40, 56), "fp16", (64, 16), "128B")
    assert (enc.data_type, enc.rank, enc.global_dim, enc.global_strides, enc.swizzle) == (6, 2, (56, 40), (112,), 3)


@needs_gxx
def test_emulator_refuses_what_it_does_not_emulate(sm90_modules):
    mod, _ = sm90_modules["tma"]
    lib = mod._load()
    bad = dataclasses.replace(TiledEncoding.for_array((40, 56), "fp16", (64, 16)), swizzle=4)  # 128B_ATOM_32B
    with pytest.raises(KumikoError) as e:
        emu_encode(lib, bad, 4096)
    assert e.value.code == "E1703" and "not emulated" in e.value.why
    assert len(emu_encode(lib, TiledEncoding.for_array((40, 56), "fp16", (64, 16)), 4096)) == 128


needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")


@pytest.mark.nvcc
@needs_nvcc
def test_sm90_program_builds_for_sm90a():
    kernels = [gemm_kernel(n, dt, b_major=bm) for n, dt, bm in GEMMS] + [ws_gemm_kernel(n, dt) for n, dt in WS_GEMMS]
    res = nvcc_compile(render_cuda(kernels), "sm_90a", name="sm90_gemm")
    for k in kernels:
        r = res.resources[k.name]
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
    for instr in ("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "wgmma.mma_async.sync.aligned.m64n256k16",
                  "m64n128k16.f32.bf16.bf16", "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                  "wgmma.wait_group.sync.aligned", "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier",
                  "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group", "cp.async.bulk.wait_group",
                  "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                  "mbarrier.init.shared::cta.b64", "fence.proxy.async.shared::cta",
                  "setmaxnreg.inc.sync.aligned.u32 232", "setmaxnreg.dec.sync.aligned.u32 40"):
        assert instr in res.ptx, instr
    res = nvcc_compile(kernel_source("wgmma_rs.cu"), "sm_90a", name="wgmma_rs")
    assert "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16" in res.ptx
    assert all(r.spill_stores == 0 for r in res.resources.values())
