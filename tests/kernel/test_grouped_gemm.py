"""Grouped convolutions as group-batched GEMMs on the cpu target (``kumiko.region.groups``): the output channel
``co`` that the input is read by in whole groups (``floor(co / G)``) is split into a group axis (batch) and a
channel within the group (N), so the region is a contraction and runs the packed micro-kernel. Each case
against the reference evaluator (outputs poisoned before the run) at odd sizes, batch 1 and N, with weights
as inputs and bound (pre-packed); groups too small for the split (``MIN_GROUP_N``, ``MIN_GROUP_K``) stay
loop nests."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.pipeline import stage_json
from kumiko.region.groups import MIN_GROUP_K, MIN_GROUP_N


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def grouped(n, c, co, hw, k, g, *, stride=1, dil=1, residual=False, bound=False, seed=0):
    rng = np.random.default_rng(seed)
    h, w = hw
    wt_a = (rng.standard_normal((co, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
    b_a = rng.standard_normal(co).astype(np.float32)
    x = Tensor.input("x", (n, c, h, w))
    if bound:
        wt, b = Tensor(wt_a, name="w", role="param"), Tensor(b_a, name="b", role="param")
        ins = {}
    else:
        wt, b = Tensor.input("w", wt_a.shape), Tensor.input("b", (co,))
        ins = {"w": wt_a, "b": b_a}
    pad = dil * (k // 2)
    y = x.conv2d(wt, b, stride=stride, padding=pad, dilation=dil, groups=g).relu()
    ins["x"] = rng.standard_normal((n, c, h, w)).astype(np.float32) + np.float32(0.1)
    if residual:
        oh, ow = ((s + 2 * pad - dil * (k - 1) - 1) // stride + 1 for s in (h, w))
        y = y + Tensor.input("r", (n, co, oh, ow))
        ins["r"] = rng.standard_normal((n, co, oh, ow)).astype(np.float32)
    return y.graph("y"), ins


def region_iters(g) -> list:
    (r,) = stage_json(g, "region", target="cpu")["regions"]
    return [a["name"] for a in r["iters"]]


def algo(g) -> dict:
    (p,) = stage_json(g, "plan", target="cpu").values()
    return p["algo_choice"]


CASES = [  # n, c, co, (h, w), k, groups, stride, dilation, residual
    (1, 24, 36, (13, 11), 3, 4, 1, 1, False),      # 6 -> 9 a group
    (3, 16, 40, (15, 17), 3, 4, 2, 1, True),       # strided, a residual in the epilogue
    (2, 18, 18, (21, 19), 3, 3, 1, 2, False),      # dilated, 6 -> 6
    (2, 64, 48, (9, 23), 1, 2, 1, 1, False),       # 1x1, 32 -> 24 a group
    (1, 64, 64, (56, 56), 3, 8, 1, 1, False),      # the bench's size: M blocks and tails of a network's
]


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("n,c,co,hw,k,g,stride,dil,residual", CASES)
def test_grouped_conv_is_a_group_batched_gemm(n, c, co, hw, k, g, stride, dil, residual, bound):
    graph, ins = grouped(n, c, co, hw, k, g, stride=stride, dil=dil, residual=residual, bound=bound)
    assert [a for a in region_iters(graph) if a.endswith(("_g", "_c"))] == ["i1_g", "i1_c"]
    assert algo(graph) == {"contraction": "packed"}
    exe, ref = kumiko.compile(graph, "cpu"), kumiko.compile(graph, "eval")
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert out.shape == want.shape == (n, co) + want.shape[2:]
    assert rel(out, want) < 1e-5, rel(out, want)


@pytest.mark.parametrize("c,co,k,g", [
    (16, 16, 3, 8),     # 2 output channels a group: N below MIN_GROUP_N
    (32, 128, 3, 32),   # a depthwise conv with 4 outputs per channel: K = 9 below MIN_GROUP_K
    (64, 64, 1, 16),    # a 1x1 with groups of 4: K = 4
])
def test_small_groups_stay_loop_nests(c, co, k, g):
    assert co // g < MIN_GROUP_N or c // g * k * k < MIN_GROUP_K
    graph, ins = grouped(2, c, co, (11, 13), k, g, seed=1)
    assert region_iters(graph) == ["i0", "i1", "i2", "i3"]
    assert algo(graph) == {"region": "loops"}
    out, want = kumiko.compile(graph, "cpu")(**ins)["y"], kumiko.compile(graph, "eval")(**ins)["y"]
    assert rel(out, want) < 1e-5


def test_symbolic_sizes_keep_the_split():
    """The group axis is the channel's (constant); the pixels may be symbolic: one build serves every size."""
    x = Tensor.input("x", ("N", 32, "H", "H"))
    wt = Tensor.input("w", (48, 8, 3, 3))
    graph = x.conv2d(wt, padding=1, groups=4).graph("y", symbols={"N": 2, "H": 9})
    assert "i1_g" in region_iters(graph)
    exe, ref = kumiko.compile(graph, "cpu"), kumiko.compile(graph, "eval")
    rng = np.random.default_rng(2)
    for n, h in ((2, 9), (1, 20)):
        ins = {"x": rng.standard_normal((n, 32, h, h)).astype(np.float32),
               "w": rng.standard_normal((48, 8, 3, 3)).astype(np.float32)}
        assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5
