"""The convolution classes of a CNN on the cpu target, each against the reference evaluator at odd sizes,
batch 1 and N: depthwise (stride 1 and 2, dilated), grouped, strided, 1x1 (a GEMM over the channel axis)
and dilated dense convolutions, with the epilogues networks put after them (bias, ReLU6, a residual add).

And the loop nest's threading: a depthwise convolution's nest is split over the threads when its work
- output points times the window - is enough, not only when its outer rows are many (a 144-channel 56x56
depthwise convolution has 8064 rows of 56 points of 9 taps each: it ran on one thread)."""
import re

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel.lower_cpu import PARALLEL_MIN_POINTS, PARALLEL_MIN_WORK


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def conv(n, c, co, h, w, k, *, stride=1, pad=0, dil=1, groups=1, residual=False, seed=0):
    """Conv (+ bias) + ReLU6 (+ a residual add of the output's shape), with random inputs (never zeros)."""
    rng = np.random.default_rng(seed)
    x = Tensor.input("x", (n, c, h, w))
    wt = Tensor.input("w", (co, c // groups, k, k))
    b = Tensor.input("b", (co,))
    y = x.conv2d(wt, b, stride=stride, padding=pad, dilation=dil, groups=groups).clip(0.0, 6.0)
    oh, ow = ((s + 2 * pad - dil * (k - 1) - 1) // stride + 1 for s in (h, w))
    ins = {"x": rng.standard_normal((n, c, h, w), np.float32) + np.float32(0.1),
           "w": rng.standard_normal((co, c // groups, k, k), np.float32) / np.float32(np.sqrt(c // groups * k * k)),
           "b": rng.standard_normal(co, np.float32)}
    if residual:
        y = y + Tensor.input("r", (n, co, oh, ow))
        ins["r"] = rng.standard_normal((n, co, oh, ow), np.float32)
    return y.graph("y"), ins


def check(g, ins, tol=1e-5) -> str:
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert out.shape == want.shape and out.dtype == want.dtype
    assert rel(out, want) < tol, rel(out, want)
    return exe._run.source


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("hw,stride", [((7, 7), 1), ((14, 13), 2), ((29, 31), 1), ((57, 9), 2)])
def test_depthwise(n, hw, stride):
    check(*conv(n, 19, 19, *hw, 3, stride=stride, pad=1, groups=19))


@pytest.mark.parametrize("k,chains", [(3, 3), (5, 0)])
def test_depthwise_window_rows_accumulate_apart(k, chains, monkeypatch):
    """A 3x3 window's sum inside the vector loop runs as 3 chains of multiply-adds, one per window row (each
    its own accumulator, added at the end); a 5x5 window's 5 rows stay one chain. Against the evaluator. (Points
    one at a time: jammed points unroll their taps too, ``test_interior_jam``.)"""
    monkeypatch.setattr("kumiko.kernel.lower_cpu.JAM", 1)
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")
    src = check(*conv(1, 24, 24, 23, 37, k, pad=k // 2, groups=24))
    rows = set(re.findall(r"const long long (r\d+) = (\d)LL;", src))
    assert len(rows) == chains, sorted(rows)


@pytest.mark.parametrize("n", [1, 2])
def test_depthwise_dilated_and_5x5(n):
    check(*conv(n, 17, 17, 23, 19, 3, pad=2, dil=2, groups=17))
    check(*conv(n, 17, 17, 15, 21, 5, stride=2, pad=2, groups=17))


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("c,co,groups", [(24, 36, 4), (16, 16, 8), (6, 9, 3)])
def test_grouped(n, c, co, groups):
    check(*conv(n, c, co, 13, 11, 3, pad=1, groups=groups))


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("hw", [(7, 7), (14, 14), (5, 11)])
@pytest.mark.parametrize("c,co", [(37, 83), (160, 49)])
def test_pointwise(n, hw, c, co):
    check(*conv(n, c, co, *hw, 1, residual=True))


@pytest.mark.parametrize("n", [1, 2])
def test_strided_and_dilated_dense(n):
    check(*conv(n, 5, 13, 17, 19, 3, stride=2, pad=1))
    check(*conv(n, 7, 11, 15, 13, 3, pad=2, dil=2))
    check(*conv(n, 8, 12, 16, 16, 1, stride=2))


@pytest.mark.parametrize("n,c,co,hw,k", [(1, 64, 48, 56, 3), (2, 32, 64, 58, 3), (1, 96, 64, 56, 1), (1, 3, 32, 97, 3)])
def test_strided_convs_at_network_sizes_with_bound_weights(n, c, co, hw, k):
    """Stride-2 convs whose output rows are 28-49 pixels, weights bound as constants (pre-packed, the pixels in
    the vector lanes): their panels hold 16-pixel chunks that are one stride-2 run (deinterleaved by a permute,
    ``kernel/pack.py``) and chunks that cross a row (copied a float at a time), and the stem-like stage rows
    dealt into phases (``kumiko_phase_row``)."""
    rng = np.random.default_rng(c + co)
    wv = (rng.standard_normal((co, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    x = Tensor.input("x", (n, c, hw, hw))
    y = x.conv2d(Tensor(wv, name="w", role="param"), Tensor(rng.standard_normal(co).astype(np.float32), name="b",
                 role="param"), stride=2, padding=k // 2).relu()
    check(y.graph("y"), {"x": rng.standard_normal((n, c, hw, hw), np.float32)})


def _parallel_conditions(src: str) -> list[str]:
    return re.findall(r"#pragma omp parallel for[^\n]* if\((.*)\)\n", src)


def _holds(cond: str) -> bool:
    """The value of a parallel loop's ``if`` over constant sizes (C integer arithmetic on literals)."""
    expr = re.sub(r"(\d+)LL", r"\1", cond).replace("||", " or ")
    assert re.fullmatch(r"[\d\s()*+\-<>=]+|[\d\s()*+\-<>=]+ or [\d\s()*+\-<>=]+", expr), cond
    return bool(eval(expr))


@pytest.mark.parametrize("c,hw,stride,parallel", [(144, 56, 1, True), (144, 56, 2, True), (960, 7, 1, True),
                                                  (576, 14, 2, True), (16, 17, 1, False), (3, 9, 1, False)])
def test_depthwise_nest_counts_its_rows_points_for_threads(c, hw, stride, parallel):
    """The loop nest's ``if`` counts the output's points through the vector loop over each row, which is
    split into a masked head, a plain interior and a masked tail: 144 x 56 x 56 points are enough for
    threads (the count stopped at the split: 144 x 56 rows were not), 16 x 17 x 17 are not; and it counts
    the points times the window's 9 taps: 576 x 7 x 7 points are too few alone, not with their taps."""
    g, ins = conv(1, c, c, hw, hw, 3, stride=stride, pad=1, groups=c)
    src = check(g, ins)
    conds = _parallel_conditions(src)
    assert len(conds) == 1
    oh = (hw - 1) // stride + 1
    assert f"({oh}LL - (0" in conds[0].split(f"({c}LL - (0))")[1]        # the row's points, after the channels
    assert f"* 9LL >= {PARALLEL_MIN_WORK}LL" in conds[0]
    assert _holds(conds[0]) == parallel == (c * oh * oh >= PARALLEL_MIN_POINTS or c * oh * oh * 9 >= PARALLEL_MIN_WORK)


_SYMBOLIC = r"""
import numpy as np, kumiko
from kumiko import Tensor
x, w, b = Tensor.input("x", ("N", 24, "H", "W")), Tensor.input("w", (40, 24, 1, 1)), Tensor.input("b", (40,))
r = Tensor.input("r", ("N", 40, "H", "W"))
g = (x.conv2d(w, b).clip(0.0, 6.0) + r).graph("y")
exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
for n, h, wd in ((1, 9, 45), (3, 7, 7), (2, 14, 13), (1, 1, 300)):
    ins = exe.random_inputs(n, {"N": n, "H": h, "W": wd})
    a, e = exe(**ins)["y"], ref(**ins)["y"]
    assert np.linalg.norm(a - e) <= 1e-5 * np.linalg.norm(e), (n, h, wd)
print("OK")
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_pointwise_symbolic_sizes_with_threads(threads):
    """A 1x1 conv over symbolic N, H, W whose epilogue runs each output channel's H x W pixels as one span
    (the threads' N ranges start inside it), at batch 1 and N."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _SYMBOLIC], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_pointwise_epilogue_runs_the_pixels_as_one_span():
    """The 1x1 conv's bias + ReLU6 + residual epilogue runs 7x7 = 49 pixels as one run (not 7 runs of 7);
    a read that uses the pixel axes otherwise (a transposed residual) keeps the per-row runs."""
    g, ins = conv(1, 37, 83, 7, 7, 1, residual=True)
    assert "(49LL) - kk_nl" in check(g, ins)
    x, w = Tensor.input("x", (1, 16, 7, 7)), Tensor.input("w", (16, 16, 1, 1))
    r = Tensor.input("r", (1, 16, 7, 7))
    g = (x.conv2d(w) + r.transpose(2, 3)).graph("y")
    rng = np.random.default_rng(1)
    src = check(g, {k: rng.standard_normal(s, np.float32) for k, s in (("x", (1, 16, 7, 7)), ("w", (16, 16, 1, 1)),
                                                                      ("r", (1, 16, 7, 7)))})
    assert "(49LL) - kk_nl" not in src and "7LL - kk_nl" in src


@pytest.mark.parametrize("n", [1, 3])
def test_strided_conv_epilogue_runs_down_the_columns(n):
    """A stride-2 conv puts its pixels on the M side (its rows are not consecutive elements) and its
    channels on N: the epilogue runs over each channel's pixels (contiguous stores), as one span when it
    can (bias + ReLU6 + residual), per pixel row when a read uses the pixel axes otherwise."""
    g, ins = conv(n, 6, 21, 23, 17, 3, stride=2, pad=1, residual=True)
    src = check(g, ins)
    assert "for (long long kk_jj = 0;" in src and "(108LL) - kk_ml" in src      # 12 x 9 output pixels
    x, w = Tensor.input("x", (n, 4, 15, 15)), Tensor.input("w", (8, 4, 3, 3))
    r = Tensor.input("r", (n, 8, 9, 9))
    g = (x.conv2d(w, stride=2, padding=2) + r.transpose(2, 3)).graph("y")
    rng = np.random.default_rng(2)
    src = check(g, {k: rng.standard_normal(s, np.float32) for k, s in (("x", (n, 4, 15, 15)), ("w", (8, 4, 3, 3)),
                                                                      ("r", (n, 8, 9, 9)))})
    assert "for (long long kk_jj = 0;" in src and "9LL - kk_ml" in src
