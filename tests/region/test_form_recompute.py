"""Region formation never recomputes a convolution or materialises its product: an AlexNet-style stack (a
strided conv, ReLU, LRN, max pool, then two grouped convs) once ran as 8-D products in memory (the grouped
conv's split channel index, ``(floor(c/C), c mod C)``, was not seen to be injective) and with the first
conv computed five times inside LRN's channel window (shifted reads under pad guards): 147 s a call for
onnx's light AlexNet, 0.05 s now. And a kernel runs one contraction over all of its output: Inception's
Concat (pad-and-add of its branches) once held a branch conv under a pad guard, and a Concat feeding a
global average pool held all four branch convs, each as scalar loops (Inception v2 178 -> 30 ms); and
SqueezeNet's head (1x1 conv -> ReLU -> global average pool -> softmax over channels) was one loops kernel with
the conv inside the pool inside the softmax's row form (26 ms of a 33 ms call)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import bound, rel_l2
from kumiko.region import form_regions
from kumiko.region.index import injective
from kumiko.region.ssa import Read, Reduce, Select
from kumiko.symbolic import Expr

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from tests.frontend.test_onnx_import import model, onnxruntime_run  # noqa: E402


def _alexnet_like(c=8, hw=23, seed=0):
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return nh.from_array((rng.standard_normal(shape) / math.sqrt(np.prod(shape[1:]))).astype(np.float32), name)
    inits = [w("w1", [c, 3, 5, 5]), w("w2", [c, c // 2, 3, 3]), w("w3", [c, c // 2, 3, 3])]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[2, 2, 2, 2]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("LRN", ["r1"], ["n1"], size=5, alpha=1e-2, beta=0.75, bias=1.0),
             h.make_node("MaxPool", ["n1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2]),
             h.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1], group=2),
             h.make_node("Relu", ["c3"], ["y"])]
    out = ((hw + 4 - 5) // 2 + 1 - 3) // 2 + 1
    return model(nodes, [("x", TP.FLOAT, [1, 3, hw, hw])], [("y", TP.FLOAT, [1, c, out, out])], inits, opset=13,
                 name="alexnet_like")


def _nodes(e):
    yield e
    for k in ("x", "y", "then", "other", "body", "operand", "by", "cond"):
        if hasattr(e, k):
            yield from _nodes(getattr(e, k))


def test_each_conv_is_computed_once_and_no_product_is_materialised():
    m = _alexnet_like()
    g = kumiko.from_onnx(m)
    p = form_regions(g.tiny)
    convs = []
    for r in p.regions:
        assert all(len(o.memref.shape) <= 4 for o in r.outputs), (r.name, [o.memref.shape for o in r.outputs])
        for let in r.lets:
            for e in _nodes(let.expr):
                if isinstance(e, Reduce) and e.op == "sum":
                    reads = {x.tensor for x in _nodes(e.body) if isinstance(x, Read)}
                    convs += sorted(reads & {"w1", "w2", "w3"})
    assert sorted(convs) == ["w1", "w2", "w3"]     # one reduction per conv: none recomputed
    x = np.random.default_rng(1).standard_normal((1, 3, 23, 23)).astype(np.float32)
    (want,) = onnxruntime_run(m, {"x": x})
    got = kumiko.compile(g, "cpu")(x=x)["y"]
    assert rel_l2(got, want) <= bound(got.dtype)


def test_a_split_axis_is_injective():
    i, j = Expr.sym("i"), Expr.sym("j")
    sizes = {"i": 256, "j": 12}
    assert injective((0, i // 128, i % 128, j), sizes)
    assert injective((i // 128 + 1, i % 128, j), sizes)      # a shifted quotient is still one-to-one
    assert not injective((i // 128, j), sizes)               # the remainder dropped: many-to-one
    assert not injective((i // 128, i % 64, j), sizes)       # quotient and remainder of different splits


def _inception_like(c=8, hw=9, seed=2):
    """Two branches (1x1 conv; 1x1 conv -> 3x3 conv), each + bias + ReLU, concatenated; the concat also
    feeds a global average pool (both outputs)."""
    rng = np.random.default_rng(seed)

    def w(name, shape):
        return nh.from_array((rng.standard_normal(shape) / math.sqrt(np.prod(shape[1:]))).astype(np.float32), name)
    inits = [w("wa", [c, c, 1, 1]), w("wb1", [c // 2, c, 1, 1]), w("wb2", [c, c // 2, 3, 3]),
             w("ba", [c]), w("bb1", [c // 2]), w("bb2", [c])]
    nodes = [h.make_node("Conv", ["x", "wa", "ba"], ["a1"]), h.make_node("Relu", ["a1"], ["a"]),
             h.make_node("Conv", ["x", "wb1", "bb1"], ["b1"]), h.make_node("Relu", ["b1"], ["b2"]),
             h.make_node("Conv", ["b2", "wb2", "bb2"], ["b3"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["b3"], ["b"]),
             h.make_node("Concat", ["a", "b"], ["y"], axis=1),
             h.make_node("GlobalAveragePool", ["y"], ["gap"])]
    return model(nodes, [("x", TP.FLOAT, [1, c, hw, hw])],
                 [("y", TP.FLOAT, [1, 2 * c, hw, hw]), ("gap", TP.FLOAT, [1, 2 * c, 1, 1])], inits, opset=13,
                 name="inception_like")


def _contractions(e, guarded=False):
    """(reduce, under a pad guard) for each sum of products reading a weight ``w*``."""
    if isinstance(e, Reduce) and e.op == "sum" and any(isinstance(x, Read) and x.tensor.startswith("w")
                                                       for x in _nodes(e.body)):
        yield e, guarded
    for k in ("x", "y", "then", "other", "body", "operand", "by", "cond"):
        if hasattr(e, k):
            yield from _contractions(getattr(e, k), guarded or (isinstance(e, Select) and k in ("then", "other")))


def test_a_kernel_runs_one_unguarded_contraction():
    m = _inception_like()
    g = kumiko.from_onnx(m)
    p = form_regions(g.tiny)
    found = 0
    for r in p.regions:
        cs = [c for let in r.lets for c in _contractions(let.expr)]
        assert len(cs) <= 1, (r.name, len(cs))
        assert not any(guarded for _, guarded in cs), r.name
        found += len(cs)
    assert found == 3
    exe = kumiko.compile(g, "cpu")
    assert sorted(p.algo for p in exe.compilation.plan.values()).count("packed") == 3
    x = np.random.default_rng(3).standard_normal((1, 8, 9, 9)).astype(np.float32)
    want = onnxruntime_run(m, {"x": x})
    got = exe(x=x)
    for name, ref in zip(("y", "gap"), want):
        assert rel_l2(got[name], ref) <= bound(got[name].dtype)


def test_a_conv_under_a_pool_under_a_channel_softmax_is_its_own_kernel():
    """SqueezeNet's head: the conv takes the packed plan instead of scalar loops inside the softmax's kernel."""
    rng = np.random.default_rng(4)
    inits = [nh.from_array((rng.standard_normal((10, 8, 1, 1)) / 3).astype(np.float32), "w1"),
             nh.from_array(rng.standard_normal(10).astype(np.float32), "b1")]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c"]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Softmax", ["p"], ["y"], axis=1)]
    m = model(nodes, [("x", TP.FLOAT, [1, 8, 7, 7])], [("y", TP.FLOAT, [1, 10, 1, 1])], inits, opset=13,
              name="squeezenet_head")
    g = kumiko.from_onnx(m)
    for r in form_regions(g.tiny).regions:
        cs = [c for let in r.lets for c in _contractions(let.expr)]
        rows = any(isinstance(e, Reduce) and e.op == "max" for let in r.lets for e in _nodes(let.expr))
        assert not (cs and rows), r.name        # the conv is not in the softmax's kernel
    exe = kumiko.compile(g, "cpu")
    assert [p.algo for p in exe.compilation.plan.values()].count("packed") == 1
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    (want,) = onnxruntime_run(m, {"x": x})
    got = exe(x=x)["y"]
    assert rel_l2(got, want) <= bound(got.dtype)
