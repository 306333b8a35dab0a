"""A network's head on the packed path against the Tiny IR evaluator: the last 1x1 conv (bias, residual add,
ReLU or ReLU6) with the global average pool fused into its window epilogue over 64 pixels or more (apart
below that, R-pool: ResNet-50's and MobileNetV2's 7 x 7 last blocks), at odd channel counts and pixel grids,
batch 1 and 3, the weights bound (pre-packed once, as without the pool) or a plain input; a local average pool
(windows that are not a whole group) and a global max pool (no vector reduction across a window: NaN must
survive); then the classifier (the skinny path) at 1 and 3 rows. The runtime poisons every output (NaN)
before each call, so an element the epilogue skips fails the comparison."""
import re
from dataclasses import replace

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import rel_l2
from kumiko.region.form import GLOBAL_POOL_POINTS
from tests.kernel.test_skinny import two_calls_match


def _check(g, blocks=None, seed=0):
    """Compile for cpu (cache blocks ``blocks`` (MC, NC, KC) on every packed region, rounded to the register
    block), compare two calls on fresh random inputs with the evaluator; return the Executable."""
    exe = kumiko.compile(g, "cpu")
    if blocks is not None:
        def fit(p):
            (mr, nr), (mc, nc, kc) = p.register_block, blocks
            return replace(p, cache_block=(max(mr, mc // mr * mr), max(nr, nc // nr * nr), kc))
        exe = kumiko.compile(g, "cpu", plans={k: fit(p) if p.algo == "packed" else p
                                              for k, p in exe._run.plans.items()})
    return two_calls_match(exe, g, seed)


def _head(n, ci, co, hw, bound, act="relu", residual=True, pool="mean", seed=0):
    """act(conv1x1(x, w) + b (+ r)) over n images of hw pixels (a fixed grid: a window reduction is fused
    only over windows of known size), pooled over the whole pixel grid (``mean``, ``max``) or 2x2 (``avg2``)."""
    rng = np.random.default_rng(seed)
    w = (Tensor(rng.standard_normal((co, ci, 1, 1)).astype(np.float32) * 0.2, name="w", role="param") if bound
         else Tensor.input("w", (co, ci, 1, 1)))
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", (n, ci, *hw))
    y = x.conv2d(w, b)
    if residual:
        y = y + Tensor.input("r", (n, co, *hw))
    y = y.relu() if act == "relu" else y.clip(0.0, 6.0)
    if pool == "avg2":
        return y.avg_pool2d(2, 2).graph("y")
    p = y.mean((2, 3), keepdim=True) if pool == "mean" else y.max((2, 3), keepdim=True)
    return p.reshape((n, co)).graph("y")      # flattened for the classifier, as the networks do


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("ci,co,hw", [(37, 70, (8, 8)), (64, 131, (9, 11)), (37, 70, (7, 7)), (19, 13, (1, 1))])
@pytest.mark.parametrize("bound", [True, False], ids=["bound", "input"])
def test_conv_residual_relu_global_avg_pool(n, ci, co, hw, bound):
    """Pooled over 64 pixels or more (or one), the pool is fused into the conv's window epilogue; over fewer
    (7 x 7: 49 of 64 lanes) the conv and the pool run apart (R-pool), the conv's epilogue on its accumulators."""
    exe = _check(_head(n, ci, co, hw, bound))
    src = exe._run.source
    if 1 < hw[0] * hw[1] < GLOBAL_POOL_POINTS:
        assert "kk_G" not in src and sorted(p.algo for p in exe._run.plans.values()) == ["loops", "packed"]
        assert any("R-pool" in note for r in exe._run.program.regions for note in r.notes)
        return
    assert "kk_G" in src                      # the pool is fused: one window group per channel and image
    packs = sum(len(st.packs) for st in exe._run.runner.steps)
    assert (packs > 0) == bound               # the bound weights are packed once, as without the pool
    if hw != (1, 1):                          # the pixels as one flat window, summed as one vector reduction
        assert re.search(r"#pragma omp simd reduction\(\+:kk_acc\)\s+for \(long long \w+ = 0; \w+ < "
                         f"{hw[0] * hw[1]};", src)


@pytest.mark.parametrize("blocks", [None, (12, 32, 8), (6, 16, 8)])
def test_global_pool_epilogue_with_several_row_and_k_blocks(blocks):
    """Small cache blocks: each thread's rows in several M blocks (the window epilogue runs after each one's
    last K block, on its rows only), and N blocks of whole groups (one image per block)."""
    _check(_head(3, 40, 77, (8, 8), True, act="relu6", residual=False), blocks)
    _check(_head(2, 40, 77, (8, 9), False), blocks)


_THREADS_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_pooled_head import _check, _head
for n in (1, 3):
    for co in (13, 200):
        _check(_head(n, 48, co, (8, 8), True))
print("OK")
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_global_pool_epilogue_with_thread_counts(threads):
    """1 thread, and 3: rows split unevenly (13 or 200 channels of one image), or whole images (3)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    script = _THREADS_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_mobilenet_head_relu6_global_avg_pool():
    _check(_head(1, 32, 160, (7, 7), True, act="relu6", residual=False))      # apart (R-pool)
    _check(_head(1, 32, 160, (14, 14), True, act="relu6", residual=False))    # fused


def test_local_avg_pool_keeps_the_windows_of_a_group_side_by_side():
    """2x2 windows inside a group (the pooled pixels are another axis of it): the vector loop runs over the
    pooled pixels, each window summed in order."""
    exe = _check(_head(2, 21, 35, (6, 10), True, pool="avg2"))
    src = exe._run.source
    assert "reduction(+:kk_acc)" not in src
    assert re.search(r"#pragma omp simd\s+for \(long long kk_e = ", src)


def test_global_max_pool_keeps_nan():
    """A max over the window is not a vector reduction (its combiner would drop a NaN): the NaN of one
    pixel reaches its channel's pooled value."""
    g = _head(2, 8, 20, (7, 7), True, pool="max")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert "reduction(" not in exe._run.source
    ins = {k: v for k, v in exe.random_inputs(0).items() if k not in exe.params}
    ins["r"][1, 3, 6, 6] = np.nan
    ins["r"][0, 19, 0, 0] = np.nan
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert np.isnan(want).sum() == 2
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    ok = ~np.isnan(want)
    assert rel_l2(out[ok], want[ok]) < 1e-5


@pytest.mark.parametrize("n", [1, 3])
def test_pooled_head_then_classifier(n):
    """The whole head: the pooled conv (packed, window epilogue) flattened into the classifier, a bound
    [classes, channels] weight used transposed (a Gemm with transB) plus bias: the skinny path at 1 and 3
    rows, its weight panels pre-packed once."""
    rng = np.random.default_rng(3)
    co, classes = 96, 201
    fw = Tensor(rng.standard_normal((classes, co)).astype(np.float32) * 0.1, name="fw", role="param")
    fb = Tensor(rng.standard_normal(classes).astype(np.float32), name="fb", role="param")
    x, r = Tensor.input("x", (n, 40, 8, 8)), Tensor.input("r", (n, co, 8, 8))
    w = Tensor(rng.standard_normal((co, 40, 1, 1)).astype(np.float32) * 0.2, name="w", role="param")
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    pooled = (x.conv2d(w, b) + r).relu().mean((2, 3), keepdim=True).reshape((n, co))
    g = (pooled @ fw.T + fb).graph("logits")
    exe = _check(g)
    assert sorted(p.algo for p in exe._run.plans.values()) == ["packed", "skinny"]
    assert "kk_G" in exe._run.source and "skinny contraction" in exe._run.source
    assert exe._run.runner.pack_calls == sum(len(st.packs) for st in exe._run.runner.steps) == 2
