"""Region formation never recomputes a convolution or materialises its product: an AlexNet-style stack (a
strided conv, ReLU, LRN, max pool, then two grouped convs) once ran as 8-D products in memory (the grouped
conv's split channel index, ``(floor(c/C), c mod C)``, was not seen to be injective) and with the first
conv computed five times inside LRN's channel window (shifted reads under pad guards): 147 s a call for
onnx's light AlexNet, 0.05 s now."""
from __future__ import annotations

import math

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import bound, rel_l2
from kumiko.region import form_regions
from kumiko.region.index import injective
from kumiko.region.ssa import Read, Reduce
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
