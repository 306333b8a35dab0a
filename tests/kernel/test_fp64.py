"""fp64 graphs computed in float64 (issue 22) on ``eval`` and ``cpu``: elementwise chains, long-row
reductions, softmax, a GEMM and a convolution against numpy float64 on random inputs, at sizes that cross
the CPU vector width and leave tails. fp64 has no vector lanes in the CPU nest (``kv_t`` is float), so an
fp64 loop stays scalar - also next to fp32 lanes in one graph - and GEMM/conv take the loops path."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import bound, rel_l2

RNG = np.random.default_rng(6422)
TARGETS = ["eval", "cpu"]
#: a row past 4096 elements and sizes either side of the vector width (tails)
ROWS = [(3, 4099), (5, 7), (2, 17)]


def rnd(*shape):
    x = RNG.standard_normal(shape)
    return np.where(np.abs(x) < 1e-3, 0.5, x)           # random, never zero


def run(g, target, **ins):
    return kumiko.compile(g, target=target)(**ins)


def close(got, want):
    assert got.dtype == np.float64, got.dtype
    err = rel_l2(got, want)
    assert err <= bound("fp64"), err


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", ROWS)
def test_elementwise_and_row_sum(target, shape):
    x = Tensor.input("x", shape, "fp64")
    y = x.exp() * 2.5 + x.tanh() - (x * x).sqrt() / 3
    xs = rnd(*shape)
    want_y = np.exp(xs) * 2.5 + np.tanh(xs) - np.sqrt(xs * xs) / 3
    out = run((y + 0).sum(1).graph("s"), target, x=xs)["s"]
    close(out, want_y.sum(1))
    out = run(y.graph("y"), target, x=xs)["y"]
    close(out, want_y)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", ROWS)
def test_max_mean_and_softmax(target, shape):
    x = Tensor.input("x", shape, "fp64")
    xs = rnd(*shape) * 30
    e = np.exp(xs - xs.max(1, keepdims=True))
    close(run(x.softmax(1).graph("y"), target, x=xs)["y"], e / e.sum(1, keepdims=True))
    close(run(x.max(1).graph("y"), target, x=xs)["y"], xs.max(1))
    close(run(x.mean(1).graph("y"), target, x=xs)["y"], xs.mean(1))


def test_long_sum_keeps_float64_precision():
    # values near 1e8 with fractional parts: fp32 would lose the fractions entirely
    x = Tensor.input("x", (2, 5000), "fp64")
    xs = 1e8 + rnd(2, 5000)
    for target in TARGETS:
        got = run(x.sum(1).graph("y"), target, x=xs)["y"]
        np.testing.assert_allclose(got, xs.sum(1), rtol=1e-13)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mkn", [(67, 131, 45), (9, 17, 33)])
def test_gemm(target, mkn):
    m, k, n = mkn
    a, b, c = Tensor.input("a", (m, k), "fp64"), Tensor.input("b", (k, n), "fp64"), Tensor.input("c", (n,), "fp64")
    A, B, Cb = rnd(m, k), rnd(k, n), rnd(n)
    close(run((a @ b + c).relu().graph("y"), target, a=A, b=B, c=Cb)["y"], np.maximum(A @ B + Cb, 0))


def _conv_ref(x, w, bias, pad):
    n, ci, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out + bias[None, :, None, None]


@pytest.mark.parametrize("target", TARGETS)
def test_conv(target):
    x, w, b = Tensor.input("x", (2, 3, 11, 13), "fp64"), Tensor.input("w", (5, 3, 3, 3), "fp64"), \
        Tensor.input("b", (5,), "fp64")
    X, W, B = rnd(2, 3, 11, 13), rnd(5, 3, 3, 3), rnd(5)
    close(run(x.conv2d(w, b, padding=1).graph("y"), target, x=X, w=W, b=B)["y"], _conv_ref(X, W, B, 1))


@pytest.mark.parametrize("n", [7, 9, 1023, 4100])
def test_fp32_lanes_beside_fp64_scalar_code(n):
    # one graph: an fp32 part the CPU nest vectorises, cast up, an fp64 part that stays scalar, and back
    x = Tensor.input("x", (3, n), "fp32")
    h = (x.exp() * 0.5).cast("fp64")
    y = (h * h + 1e-9).sum(1)
    z = (h / y.reshape((3, 1))).cast("fp32")
    xs = rnd(3, n).astype(np.float32)
    exe, ref = kumiko.compile(y.graph("y"), "cpu"), kumiko.compile(y.graph("y"), "eval")
    got, want = exe(x=xs)["y"], ref(x=xs)["y"]
    assert got.dtype == np.float64
    # fp32 exp may differ by an ulp between the lanes and numpy: the fp32 bound applies
    assert rel_l2(got, want) <= bound("fp32")
    gz = kumiko.compile(z.graph("z"), "cpu")(x=xs)["z"]
    wz = kumiko.compile(z.graph("z"), "eval")(x=xs)["z"]
    assert gz.dtype == np.float32 and rel_l2(gz, wz) <= bound("fp32")


def test_fp64_cpu_kernels_have_no_float_lanes():
    x = Tensor.input("x", (4, 1025), "fp64")
    exe = kumiko.compile((x.exp() * 3).sum(1).graph("y"), "cpu")
    assert "kv_t" not in exe._run.source and "double" in exe._run.source


# the CUDA targets: fp64 runs on the SIMT skeleton (one thread per row, double arithmetic; warp-shuffle
# reductions and the MMA skeleton are float/fp16-only and not chosen for it)
def _cuda_cases():
    x = Tensor.input("x", (3, 4099), "fp64")
    a, b = Tensor.input("a", (33, 47), "fp64"), Tensor.input("b", (47, 21), "fp64")
    c, w = Tensor.input("c", (1, 2, 9, 10), "fp64"), Tensor.input("w", (3, 2, 3, 3), "fp64")
    X, A, B, Cc, W = rnd(3, 4099), rnd(33, 47), rnd(47, 21), rnd(1, 2, 9, 10), rnd(3, 2, 3, 3)
    e = np.exp(X - X.max(1, keepdims=True))
    return [(x.softmax(1).graph("y"), {"x": X}, e / e.sum(1, keepdims=True)),
            ((x * x + 1).sum(1).graph("y"), {"x": X}, (X * X + 1).sum(1)),
            ((a @ b).graph("y"), {"a": A, "b": B}, A @ B),
            (c.conv2d(w, padding=1).graph("y"), {"c": Cc, "w": W}, _conv_ref(Cc, W, np.zeros(3), 1))]


def test_cuda_emu_computes_fp64():
    pytest.importorskip("kumiko.runtime.emu")
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    for g, ins, want in _cuda_cases():
        close(run(g, "cuda-emu", **ins)["y"], want)


@pytest.mark.nvcc
def test_cuda_fp64_kernels_build_with_nvcc():
    from kumiko.runtime.ptxas import nvcc_path
    if nvcc_path() is None:
        pytest.skip("nvcc is not on PATH")
    for g, _, _ in _cuda_cases():
        exe = kumiko.compile(g, target="cuda", gpu_arch="sm_90a")     # builds the cubin, no device needed
        assert "double" in exe.compilation.source and "shfl_xor_f32" not in exe.compilation.source


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_mean_and_layernorm(target):
    # a symbolic row length: the element count is a REDUCE of ones, in float64 like the sum it divides
    x = Tensor.input("x", ("M", "K"), "fp64")
    exe = kumiko.compile((x.layernorm(axis=1) + x.mean(1, keepdim=True)).graph("y"), target)
    for shape in ((3, 4099), (2, 9)):
        xs = rnd(*shape) * 5 + 3
        mu, var = xs.mean(1, keepdims=True), xs.var(1, keepdims=True)
        close(exe(x=xs)["y"], (xs - mu) / np.sqrt(var + 1e-5) + mu)
