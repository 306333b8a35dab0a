"""Window reductions behind padding guards on the CPU loop path (kumiko/kernel/lower_vec.py, index-set
splitting): depthwise convolutions, max and average pools. The loop over the output's contiguous axis is
vectorised: an interior range where every padding guard holds runs plain (unaligned, unmasked) vector
loads, its borders run masked vector iterations, strided windows load by deinterleaving or gathering.

Every run compares the cpu target with the reference evaluator (or a region with the region player) on
random inputs at odd sizes: widths below, at and above the vector width, stride 2 with odd sizes, pads
larger than 1, batch 1 and N, fp32 and 16-bit storage. The header's masked and strided loads are checked
at every vector width this machine can run (16, 8 and 4 lanes)."""
import platform

import numpy as np
import pytest

import kumiko
from kumiko import Tensor, dtypes
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.region.playback import play_region
from kumiko.region.ssa import (
    Axis,
    Binary,
    Const,
    Guard,
    Let,
    MemRef,
    Output,
    Read,
    Reduce,
    Ref,
    Region,
    Select,
    Unary,
    Yield,
)
from kumiko.render.c import render_program
from kumiko.runtime.cpu import DEFAULT_FLAGS, build_c, cpu_features
from kumiko.symbolic import Expr

X86 = platform.machine() in ("x86_64", "AMD64")
#: builds of a generated kernel at other vector widths than the host's: AVX2 (8 lanes), SSE2 (4 lanes)
ISA = {"native": (), "avx2": ("-march=haswell",), "x86-64": ("-march=x86-64",)}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def body(src: str) -> str:
    return src[src.index("int kumiko_"):]


def check(g, ins: dict, tol: float = 1e-5) -> str:
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    out, want = exe(**ins), ref(**ins)
    for k in want:
        assert out[k].dtype == want[k].dtype and out[k].shape == want[k].shape, k
        o, w = np.asarray(out[k], np.float64), np.asarray(want[k], np.float64)
        assert np.array_equal(np.isnan(o), np.isnan(w)), (k, "NaN positions differ")
        assert np.array_equal(o[np.isinf(w)], w[np.isinf(w)]), (k, "infinities differ")
        fin = np.isfinite(w)
        assert rel(o[fin], w[fin]) < tol, (k, rel(o[fin], w[fin]))
    return body(exe._run.source)


def randn(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape, dtype=np.float32) + 0.1).astype(dtype)


def depthwise(n, c, h, w, k, stride, pad, dilation=1, dtype="fp32"):
    x = Tensor.input("x", (n, c, h, w), dtype=dtype)
    wt = Tensor.input("w", (c, 1, k, k), dtype=dtype)
    b = Tensor.input("b", (c,), dtype=dtype)
    y = x.conv2d(wt, b, stride=stride, padding=pad, dilation=dilation, groups=c).clip(0.0, 6.0)
    rng = np.random.default_rng(h * 1000 + w * 10 + k)
    npdt = dtypes.ALL[dtype].np
    return y.graph("y"), {"x": randn(rng, n, c, h, w, dtype=npdt), "w": randn(rng, c, 1, k, k, dtype=npdt),
                          "b": randn(rng, c, dtype=npdt)}


def split(src: str) -> bool:
    """The source holds a split loop: masked border iterations and plain or strided interior loads."""
    return "kv_store_mask(" in src and ("kv_load_mask(" in src or "kv_load_stride_mask(" in src)


# depthwise convolutions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("hw", [(7, 9), (13, 1), (1, 17), (5, 16), (9, 37), (3, 28), (4, 70)])
@pytest.mark.parametrize("k,stride,pad", [(3, 1, 1), (3, 2, 1), (5, 1, 2), (5, 2, 2), (7, 1, 3), (7, 2, 3), (3, 1, 2)])
def test_depthwise_conv_at_odd_sizes(hw, k, stride, pad):
    h, w = hw
    g, ins = depthwise(2 if h == 7 else 1, 3, h, w, k, stride, pad)
    src = check(g, ins)
    w_out = (w + 2 * pad - k) // stride + 1
    if w_out >= 4:
        assert split(src)
        assert "kv_load(" in src or "kv_load_stride(" in src or w_out < 16


def test_depthwise_interior_is_plain_unmasked_loads():
    """Stride 1, pad 1, 3x3 at 112 wide: the interior loop loads without masks, deinterleaves for stride 2."""
    src = check(*depthwise(1, 2, 5, 112, 3, 1, 1))
    interior = [ln for ln in src.splitlines() if "kv_load(b" in ln]
    assert interior and not any("mask" in ln for ln in interior)
    assert "kv_affine_ge(" in src            # the borders' lane guards
    src = check(*depthwise(1, 2, 5, 113, 3, 2, 1))
    assert "kv_load_stride(b" in src and "kv_load_stride_mask(b" in src


@pytest.mark.parametrize("dil", [2, 3])
def test_dilated_depthwise(dil):
    check(*depthwise(1, 3, 11, 29, 3, 1, dil, dilation=dil))


@pytest.mark.parametrize("dt,tol", [("fp16", 3e-3), ("bf16", 2e-2)])
def test_depthwise_and_pools_of_16_bit_storage(dt, tol):
    src = check(*depthwise(2, 3, 9, 21, 3, 1, 1, dtype=dt), tol=tol)
    short = {"fp16": "f16", "bf16": "bf16"}[dt]
    assert f"kv_load_{short}_sm(" in src and "kv_store_mask(" in src
    x = Tensor.input("x", (1, 2, 9, 37), dtype=dt)
    g = x.max_pool2d(3, 2, 1).graph("y", outputs={"a": x.avg_pool2d(3, 2, 1, count_include_pad=False)})
    src = check(g, {"x": randn(np.random.default_rng(1), 1, 2, 9, 37, dtype=dtypes.ALL[dt].np)}, tol=tol)
    assert f"kv_load_{short}_sm(" in src and f"kv_store_{short}_mask(" in src


def test_symbolic_sizes():
    """N, H, W symbolic: the interior bounds are computed at run time; one build runs at every size."""
    x = Tensor.input("x", ("N", 3, "H", "W"))
    w = Tensor.input("w", (3, 1, 3, 3))
    g = x.conv2d(w, stride=2, padding=1, groups=3).graph("y", outputs={"m": x.max_pool2d(3, 1, 1),
                                                                         "d": x.conv2d(w, padding=1, groups=3)})
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    rng = np.random.default_rng(7)
    for n, h, wd in [(2, 9, 37), (1, 13, 5), (1, 5, 70), (1, 4, 3), (1, 2, 2), (3, 3, 33)]:
        ins = {"x": randn(rng, n, 3, h, wd), "w": randn(rng, 3, 1, 3, 3)}
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert out[k].shape == want[k].shape and rel(out[k], want[k]) < 1e-5, (k, n, h, wd)
    assert split(body(exe._run.source))


# pools ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,hw", [(1, (112, 112)), (2, (7, 9)), (1, (13, 1)), (1, (1, 17)), (1, (9, 33)), (1, (6, 48))])
@pytest.mark.parametrize("k,stride,pad", [(3, 2, 1), (3, 1, 1), (5, 2, 2), (2, 2, 1)])
def test_max_pool_with_padding(n, hw, k, stride, pad):
    h, w = hw
    x = Tensor.input("x", (n, 3, h, w))
    a = randn(np.random.default_rng(h + w + k), n, 3, h, w)
    a[0, 1, h // 2, w - 1] = np.nan
    a[0, 2, 0, 0] = -np.inf
    src = check(x.max_pool2d(k, stride, pad).graph("y"), {"x": a})
    if (w + 2 * pad - k) // stride + 1 >= 4:
        assert split(src)


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("hw", [(7, 9), (1, 17), (13, 1), (10, 35)])
@pytest.mark.parametrize("k,stride,pad", [(3, 1, 1), (3, 2, 1), (5, 2, 2)])
def test_avg_pool_with_padding(include, hw, k, stride, pad):
    h, w = hw
    x = Tensor.input("x", (2, 3, h, w))
    g = x.avg_pool2d(k, stride, pad, count_include_pad=include).graph("y")
    check(g, {"x": randn(np.random.default_rng(h * w + k), 2, 3, h, w)})


def test_padded_rows_of_a_vector():
    """A pad along the contiguous axis with a non-zero value, then an elementwise op: split, not scalar."""
    x = Tensor.input("x", ("R", "N"))
    g = x.pad(((0, 0), (2, 3)), value=0.5).exp().graph("y", outputs={"f": x.flip(1).pad(((1, 1), (20, 1)))})
    rng = np.random.default_rng(5)
    for n in (1, 9, 30, 47):
        src = check(g, {"x": randn(rng, 4, n)})
    assert split(src) and "kv_exp2(" in src


# hand-made regions: what the pools and convolutions do not reach --------------------------------------------
def _build_region(region, syms, flags=None):
    k = CpuLowering(region, syms, "k_test").lower()
    src = render_program([k])
    fl = None if flags is None else [f for f in DEFAULT_FLAGS if not (flags and f.startswith("-march"))] + list(flags)
    return build_c(src, flags=fl, name="window_region"), src


def _run_region(region, ins: dict, env: dict, flags=None):
    syms = tuple(sorted(env))
    mod, src = _build_region(region, syms, flags)
    outs = {o.name: np.zeros([int(Expr.lift(d).evaluate(env)) for d in o.memref.shape], o.memref.dtype.np)
            for o in region.outputs}
    arrays = [ins[n] for n, _ in region.inputs] + [outs[o.name] for o in region.outputs]
    assert mod.fn("k_test")(arrays, [env[s] for s in syms]) == 0
    return outs, src


def _dw_region(k: int, stride: int, pad: int, dil: int = 1) -> Region:
    """A depthwise convolution as the lowering sees it: sum_r select(in range, x[.., s*i + d*r - p], 0) * w."""
    N, C, H, W, OH, OW = (Expr.sym(s) for s in ("N", "C", "H", "W", "OH", "OW"))
    n, c, i, j = (Expr.sym(s) for s in ("n", "c", "i", "j"))
    r, q = Expr.sym("r"), Expr.sym("q")
    y, xx = i * stride + r * dil - pad, j * stride + q * dil - pad
    guard = Guard(((y, "ge"), (H - 1 - y, "ge"), (xx, "ge"), (W - 1 - xx, "ge")))
    win = Binary("mul", Select(guard, Read("x", (n, c, y, xx)), Const(0.0)), Read("w", (c, r, q)))
    lets = (Let("s", Reduce("sum", (Axis("r", k), Axis("q", k)), 0.0, dtypes.fp32, win)),
            Let("o", Unary("relu", Binary("add", Ref("s"), Read("b", (c,))))))
    return Region("k_dw", (Axis("n", N), Axis("c", C), Axis("i", OH), Axis("j", OW)),
                  (("x", MemRef((N, C, H, W), dtypes.fp32)), ("w", MemRef((C, k, k), dtypes.fp32)),
                   ("b", MemRef((C,), dtypes.fp32))),
                  (Output("y", MemRef((N, C, OH, OW), dtypes.fp32)),), lets, (Yield("o", "y"),))


@pytest.mark.parametrize("isa", list(ISA))
@pytest.mark.parametrize("k,stride,pad,dil", [(3, 1, 1, 1), (3, 2, 1, 1), (5, 3, 2, 1), (3, 1, 2, 2)])
def test_split_region_at_every_vector_width(isa, k, stride, pad, dil):
    """The generated split loops built for 16, 8 and 4 lanes (AVX-512, AVX2, SSE2): the masked, strided
    and deinterleaving loads of each width agree with the region player."""
    if isa != "native" and not X86:
        pytest.skip("x86-specific ISA variant")
    if isa == "avx2" and not cpu_features()["avx2"]:
        pytest.skip("no AVX2 here")
    region = _dw_region(k, stride, pad, dil)
    rng = np.random.default_rng(k * 10 + stride)
    for h, w in [(6, 5), (9, 37), (3, 19), (4, 8), (2, 64)]:
        oh, ow = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1, (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
        if oh < 1 or ow < 1:
            continue
        env = {"N": 2, "C": 3, "H": h, "W": w, "OH": oh, "OW": ow}
        ins = {"x": randn(rng, 2, 3, h, w), "w": randn(rng, 3, k, k), "b": randn(rng, 3)}
        out, src = _run_region(region, ins, env, flags=ISA[isa])
        want = play_region(region, ins, env)["y"]
        assert rel(out["y"], want) < 1e-5, (h, w)
    assert split(src)


def test_lane_invariant_read_under_a_lane_guard_is_read_only_where_some_lane_takes_it():
    """select(100*r - j - 1 >= 0, x[j] * w[2**30 * (1 - r)], 0) over r < 2: w's address does not depend on the
    vector axis j but is out of range (by 4 GiB) exactly where the guard rejects every lane (r = 0); the
    vector code reads it only when some lane takes the branch, as the scalar code does."""
    j, r, N = Expr.sym("j"), Expr.sym("r"), Expr.sym("N")
    guard = Guard(((r * 100 - j - 1, "ge"),))
    val = Binary("mul", Read("x", (j,)), Read("w", ((1 - r) * (1 << 30),), flat=True))
    lets = (Let("s", Reduce("sum", (Axis("r", 2),), 0.0, dtypes.fp32, Select(guard, val, Const(0.0)))),)
    region = Region("k_inv", (Axis("j", N),), (("x", MemRef((N,), dtypes.fp32)), ("w", MemRef((1,), dtypes.fp32))),
                    (Output("y", MemRef((N,), dtypes.fp32)),), lets, (Yield("s", "y"),))
    a, w = randn(np.random.default_rng(0), 45), np.array([1.5], np.float32)
    out, src = _run_region(region, {"x": a, "w": w}, {"N": 45})
    np.testing.assert_allclose(out["y"], a * 1.5, rtol=1e-6)
    assert "kv_any(" in src


def test_equality_guard_over_the_lanes_that_reads_memory():
    """select(j - 2*r == 0, x[j], 0): an == constraint is never assumed on the interior; it stays a lane
    mask whose rejected lanes load nothing."""
    j, r, N = Expr.sym("j"), Expr.sym("r"), Expr.sym("N")
    guard = Guard(((j - 2 * r, "eq"), (N - 1 - j - 3, "ge")))
    lets = (Let("s", Reduce("sum", (Axis("r", 20),), 0.0, dtypes.fp32,
                            Select(guard, Read("x", (j + 3,)), Const(0.25)))),)
    region = Region("k_eq", (Axis("j", N),), (("x", MemRef((N,), dtypes.fp32)),),
                    (Output("y", MemRef((N,), dtypes.fp32)),), lets, (Yield("s", "y"),))
    for n in (5, 17, 40, 100):
        a = randn(np.random.default_rng(n), n)
        out, src = _run_region(region, {"x": a}, {"N": n})
        np.testing.assert_allclose(out["y"], play_region(region, {"x": a}, {"N": n})["y"], rtol=1e-5)
    assert "kv_affine_eq(" in src and "kv_load_mask(" in src


def test_one_dimensional_split_loop_runs_its_interior_in_parallel():
    """A split loop at the top of the nest: its interior is the parallel loop, its borders are serial."""
    i, N = Expr.sym("i"), Expr.sym("N")
    r = Expr.sym("r")
    guard = Guard(((i + r - 2, "ge"), (N - 1 - (i + r - 2), "ge")))
    lets = (Let("s", Reduce("max", (Axis("r", 5),), float("-inf"), dtypes.fp32,
                            Select(guard, Read("x", (i + r - 2,)), Const(float("-inf"))))),)
    region = Region("k_1d", (Axis("i", N),), (("x", MemRef((N,), dtypes.fp32)),),
                    (Output("y", MemRef((N,), dtypes.fp32)),), lets, (Yield("s", "y"),))
    for n in (4, 16, 33, 1000):
        a = randn(np.random.default_rng(n), n)
        a[n // 2] = np.nan
        out, src = _run_region(region, {"x": a}, {"N": n})
        want = play_region(region, {"x": a}, {"N": n})["y"]
        assert np.array_equal(np.isnan(out["y"]), np.isnan(want)) and rel(out["y"][~np.isnan(want)],
                                                                         want[~np.isnan(want)]) == 0
    assert src.count("#pragma omp parallel for") == 1 and split(src)


# the header's masked and strided loads ------------------------------------------------------------------------
HEADER_TEST = r"""
#include "kumiko_cpu.h"
KUMIKO_KERNEL vw(void** b, const long long* s) { (void)s; ((long long*)b[0])[0] = KUMIKO_VW; return 0; }
/* for each start o in [0, n - 3*VW) and stride 1..3: lanes masked to [lo, hi) of the vector */
KUMIKO_KERNEL masked(void** b, const long long* s) {
    const float* x = b[0]; float* out = b[1]; const uint16_t* h = b[2]; float* hout = b[3];
    const long long n = s[0], lo = s[1], hi = s[2];
    long long k = 0;
    const kvi_t m = kv_affine_ge(-lo, 1) & kv_affine_ge(hi - 1, -1);
    for (long long st = 1; st <= 3; st++)
        for (long long o = 0; o + 3 * KUMIKO_VW <= n; o++, k += 4 * KUMIKO_VW) {
            kv_store(out + k, st == 1 ? kv_load_mask(x + o, m) : kv_load_stride_mask(x + o, st, m));
            kv_store(out + k + KUMIKO_VW, st == 1 ? kv_load(x + o) : kv_load_stride(x + o, st));
            kv_store(out + k + 2 * KUMIKO_VW, kv_zero());
            kv_store_mask(out + k + 2 * KUMIKO_VW, kv_load(x + o) + 1.0f, m);
            kv_store(out + k + 3 * KUMIKO_VW, kv_load_f16_sm(h + o, st, m));
            kv_store(hout + k, kv_load_bf16_sm(h + o, st, m));
        }
    return 0;
}
"""
HEADER_ISA = {"native": (), "x86-64": ("-march=x86-64",), "avx2": ("-march=haswell",)}


@pytest.mark.parametrize("isa", list(HEADER_ISA))
def test_header_masked_and_strided_loads(isa):
    if isa != "native" and not X86:
        pytest.skip("x86-specific ISA variant")
    if isa == "avx2" and not cpu_features()["avx2"]:
        pytest.skip("no AVX2 here")
    extra = HEADER_ISA[isa]
    flags = [f for f in DEFAULT_FLAGS if not (extra and f.startswith("-march"))] + list(extra)
    mod = build_c(HEADER_TEST, flags=flags + ["-Wall", "-Wextra", "-Werror"], name=f"window_hdr_{isa}")
    vwb = np.zeros(1, np.int64)
    assert mod.fn("vw")([vwb], []) == 0
    vw = int(vwb[0])
    n = 3 * vw + 5
    rng = np.random.default_rng(vw)
    x = randn(rng, n)
    h = rng.integers(0, 1 << 16, n).astype(np.uint16)
    h16 = h.view(np.float16).astype(np.float32)
    import ml_dtypes
    hbf = h.view(ml_dtypes.bfloat16).astype(np.float32)
    for lo, hi in [(0, vw), (1, vw - 1), (3, 3), (vw - 1, vw), (0, 1), (-4, 40)]:
        per = 4 * vw * (n - 3 * vw + 1)
        out = np.full(3 * per, 7.0, np.float32)
        hout = np.full(3 * per, 7.0, np.float32)
        assert mod.fn("masked")([x, out, h, hout], [n, lo, hi]) == 0
        lanes = np.arange(vw)
        on = (lanes >= lo) & (lanes < hi)
        k = 0
        for st in (1, 2, 3):
            for o in range(n - 3 * vw + 1):
                idx = o + lanes * st
                np.testing.assert_array_equal(out[k:k + vw], np.where(on, x[np.minimum(idx, n - 1)], 0))
                np.testing.assert_array_equal(out[k + vw:k + 2 * vw], x[idx])
                np.testing.assert_array_equal(out[k + 2 * vw:k + 3 * vw], np.where(on, x[o:o + vw] + 1, 0))
                f16 = np.where(on, h16[np.minimum(idx, n - 1)], 0)
                np.testing.assert_array_equal(np.isnan(out[k + 3 * vw:k + 4 * vw]), np.isnan(f16))
                np.testing.assert_array_equal(np.nan_to_num(out[k + 3 * vw:k + 4 * vw]), np.nan_to_num(f16))
                bf = np.where(on, hbf[np.minimum(idx, n - 1)], 0)
                np.testing.assert_array_equal(np.nan_to_num(hout[k:k + vw]), np.nan_to_num(bf))
                k += 4 * vw
