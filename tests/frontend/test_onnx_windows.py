"""N-D windows against onnxruntime: Conv, MaxPool, AveragePool, the global pools and ConvTranspose in
1-D, 2-D and 3-D (strides, pads, dilations, groups, ceil_mode, count_include_pad, output_padding,
output_shape, auto_pad), on the evaluator and the CPU target, plus one small 3-D case on cuda-emu. The
frontend ops are N-D (``kumiko/frontend/lower_window.py``); how the 2-D ones lower is unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2
from kumiko.compiler import TARGETS as BUILT

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from tests.frontend.test_onnx_import import model, onnxruntime_run  # noqa: E402

RNG = np.random.default_rng(22)
TARGETS = ("eval", "cpu")


def check(m, x: np.ndarray, targets=TARGETS) -> kumiko.Graph:
    want = onnxruntime_run(m, {"x": x})[0]
    g = kumiko.from_onnx(m)
    for target in targets:
        y = kumiko.compile(g, target)(x=x)["y"]
        assert y.shape == want.shape, f"{target}: shape {y.shape} != {want.shape}"
        assert rel_l2(y, want) <= 1e-4, f"{target}: relative L2 {rel_l2(y, want):.3g}"
    return g


def window_model(op: str, xshape, w=None, bias=None, **attrs):
    inits = [nh.from_array(w, "w")] if w is not None else []
    inits += [nh.from_array(bias, "b")] if bias is not None else []
    ins = ["x"] + (["w"] if w is not None else []) + (["b"] if bias is not None else [])
    rank = len(xshape)
    return model([h.make_node(op, ins, ["y"], name="n", **attrs)], [("x", TP.FLOAT, list(xshape))],
                 [("y", TP.FLOAT, [f"d{k}" for k in range(rank)])], inits, opset=19)


def rand(*shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# Conv

CONV = [  # (spatial input, cin, cout, kernel, attrs)
    ([9], 4, 6, [3], dict(strides=[2], pads=[1, 2], dilations=[2])),
    ([7, 6], 4, 6, [3, 2], dict(strides=[2, 1], pads=[1, 0, 1, 1], group=2)),
    ([5, 6, 7], 3, 4, [3, 3, 3], dict(pads=[1, 1, 1, 1, 1, 1])),
    ([6, 7, 5], 4, 6, [2, 3, 2], dict(strides=[2, 1, 2], dilations=[1, 2, 1], pads=[0, 1, 1, 1, 0, 0], group=2)),
    ([5, 6, 4], 4, 4, [3, 3, 1], dict(auto_pad="SAME_UPPER", strides=[2, 2, 1], group=4)),
]


@pytest.mark.parametrize("spatial,cin,cout,kernel,attrs", CONV, ids=["1d", "2d-grouped", "3d", "3d-everything",
                                                                       "3d-same-depthwise"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv(spatial, cin, cout, kernel, attrs, bias):
    g_ = attrs.get("group", 1)
    m = window_model("Conv", [2, cin, *spatial], rand(cout, cin // g_, *kernel, scale=0.3),
                     rand(cout) if bias else None, **attrs)
    g = check(m, rand(2, cin, *spatial))
    assert [n.op for n in g.nodes] == [{1: "Conv1D", 2: "Conv2D", 3: "Conv3D"}[len(spatial)]]


# ------------------------------------------------------------------------------------------------
# pooling

POOL = [  # (op, spatial input, attrs)
    ("MaxPool", [11], dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ("AveragePool", [10], dict(kernel_shape=[4], strides=[3], pads=[2, 1], count_include_pad=1)),
    ("MaxPool", [5, 6, 7], dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2])),
    ("MaxPool", [6, 7, 7], dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0],
                                dilations=[1, 2, 1])),
    ("MaxPool", [5, 5, 6], dict(kernel_shape=[2, 3, 2], strides=[2, 2, 2], ceil_mode=1)),
    ("AveragePool", [5, 6, 7], dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])),
    ("AveragePool", [5, 6, 7], dict(kernel_shape=[3, 2, 3], strides=[2, 2, 2], pads=[1, 0, 1, 1, 1, 1],
                                    count_include_pad=1)),
    ("AveragePool", [6, 5, 7], dict(kernel_shape=[2, 2, 3], strides=[2, 2, 2], ceil_mode=1, pads=[0, 1, 1, 0, 0, 1])),
    ("AveragePool", [4, 6, 6], dict(kernel_shape=[2, 3, 3], auto_pad="SAME_LOWER")),
]


@pytest.mark.parametrize("op,spatial,attrs", POOL, ids=["max1d-ceil", "avg1d-include", "max3d", "max3d-dilated",
                                                        "max3d-ceil", "avg3d-pad", "avg3d-include", "avg3d-ceil",
                                                        "avg3d-same"])
def test_pool(op, spatial, attrs):
    g = check(window_model(op, [2, 3, *spatial], **attrs), rand(2, 3, *spatial))
    assert [n.op for n in g.nodes] == ["MaxPool" if op == "MaxPool" else "AvgPool"]


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("spatial", [[7], [4, 5, 6]], ids=["1d", "3d"])
def test_global_pool(op, spatial):
    check(window_model(op, [2, 3, *spatial]), rand(2, 3, *spatial))


# ------------------------------------------------------------------------------------------------
# ConvTranspose

CONV_T = [  # (spatial input, cin, cout/group, kernel, attrs)
    ([5], 4, 3, [3], dict(strides=[2], pads=[1, 0], output_padding=[1])),
    ([4, 5], 4, 3, [3, 3], dict()),
    ([4, 5], 4, 2, [3, 2], dict(strides=[3, 2], pads=[1, 2, 0, 1], dilations=[1, 2], group=2)),
    ([3, 4], 2, 3, [3, 3], dict(strides=[3, 2], output_shape=[10, 8])),
    ([3, 4], 2, 3, [3, 3], dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ([3, 4], 2, 3, [2, 3], dict(strides=[2, 3], auto_pad="SAME_LOWER")),
    ([3, 4, 3], 4, 2, [3, 2, 3], dict(strides=[2, 1, 2], pads=[1, 0, 0, 0, 1, 2], output_padding=[1, 0, 1],
                                      group=2)),
    ([3, 3, 4], 2, 2, [2, 2, 2], dict(dilations=[2, 1, 2], pads=[3, 0, 0, 0, 1, 0])),
]


@pytest.mark.parametrize("spatial,cin,cout,kernel,attrs", CONV_T, ids=[
    "1d-stride-outpad", "2d-plain", "2d-grouped-dilated", "2d-output-shape", "2d-same-upper", "2d-same-lower",
    "3d-grouped-outpad", "3d-dilated-crop"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv_transpose(spatial, cin, cout, kernel, attrs, bias):
    g_ = attrs.get("group", 1)
    m = window_model("ConvTranspose", [2, cin, *spatial], rand(cin, cout, *kernel, scale=0.3),
                     rand(cout * g_) if bias else None, **attrs)
    g = check(m, rand(2, cin, *spatial))
    assert [n.op for n in g.nodes] == ["ConvTranspose"]


def test_conv_transpose_is_a_contraction():
    """The transposed conv lowers to MUL -> REDUCE(SUM) over a VIEW of the (zero-inserted) input: the form
    the CPU's packed contraction path looks for, no gather."""
    m = window_model("ConvTranspose", [1, 4, 5, 5], rand(4, 3, 3, 3), strides=[2, 2])
    tiny = kumiko.pipeline.to_tiny(kumiko.from_onnx(m))
    uops = [n.uop for n in tiny.nodes.values()]
    assert "GATHER" not in uops and uops.count("REDUCE") == 1 and "MUL" in uops and "FLIP" in uops


def test_conv_transpose_refusals():
    m = window_model("ConvTranspose", [1, 2, 4], rand(2, 3, 3), strides=[2], output_padding=[2])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and "output_padding" in e.value.why and "'n'" in e.value.at
    m = window_model("ConvTranspose", [1, 2, 4], rand(3, 3, 3))
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "Cin" in e.value.why


# ------------------------------------------------------------------------------------------------
# the frontend ops themselves, and cuda-emu


def test_2d_ops_keep_their_names_and_the_json_alias_is_n_d():
    """``conv`` (the alias) takes its rank from the input; Conv2D insists on 4-D."""
    x, w = kumiko.Tensor.input("x", (1, 2, 4, 5, 6)), kumiko.Tensor.input("w", (3, 2, 2, 2, 2))
    y = kumiko.Tensor._record("conv", (x, w), padding=[1, 0, 0, 1, 1, 1])
    assert y.shape == (1, 3, 4, 5, 7)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.Tensor._record("Conv2D", (x, w))
    assert e.value.code == "E1011" and "[N, C, I1, I2]" in e.value.why
    assert kumiko.Tensor.input("a", (1, 2, 6, 6)).max_pool2d(2).shape == (1, 2, 3, 3)
    assert kumiko.Tensor._record("MaxPool3D", (x,), kernel=2).shape == (1, 2, 2, 2, 3)


@pytest.mark.skipif("cuda-emu" not in BUILT, reason="no cuda-emu target")
def test_3d_conv_and_pool_on_cuda_emu():
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2, 2], strides=[2, 2, 2])]
    m = model(nodes, [("x", TP.FLOAT, [1, 2, 4, 4, 6])], [("y", TP.FLOAT, [1, 4, 2, 2, 3])],
              [nh.from_array(rand(4, 2, 3, 3, 3, scale=0.3), "w"), nh.from_array(rand(4), "b")], opset=19)
    check(m, rand(1, 2, 4, 4, 6), targets=("cuda-emu",))


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1], storage_order=1)),
    ((1, 2, 9, 9), dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 2], ceil_mode=1)),
    ((2, 2, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2])),
], ids=["2d-pad-stride", "2d-column-major", "2d-dilated-ceil", "1d", "3d"])
def test_maxpool_indices_match_onnxruntime(shape, attrs):
    node = h.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    out = [None] * len(shape)
    m = model([node], [("x", TP.FLOAT, list(shape))], [("y", TP.FLOAT, out), ("i", TP.INT64, out)], opset=12)
    x = RNG.standard_normal(shape).astype(np.float32)
    x[..., :3] = np.round(x[..., :3])                # ties: the first maximum in scan order wins
    want = onnxruntime_run(m, {"x": x})
    for target in TARGETS:
        got = kumiko.compile(kumiko.from_onnx(m), target)(x=x)
        assert np.array_equal(got["y"], want[0]) and np.array_equal(got["i"], want[1]), target
