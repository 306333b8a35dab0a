"""Dynamic shapes through shape arithmetic: models exported with dynamic axes compute ``B, T, D = x.shape``
as Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains (and Range, ConstantOfShape, Expand,
Div/Mul, Equal/Where over them). With ``dim_param`` sizes those values are symbolic; each model here
must import once, compile once per target and run at several (B, T), matching onnxruntime. What
really depends on tensor data, or on sizes in a way import cannot decide, is a diagnostic (E1011).
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2
from tests.frontend.test_onnx_import import RNG, model, onnxruntime_run

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

TARGETS = ["eval", "cpu"]
F, I64 = TP.FLOAT, TP.INT64
D = 8
SIZES = [(2, 5), (3, 8)]


def ints(name, values):
    return nh.from_array(np.asarray(values, np.int64), name)


def shape_bt():
    """Shape(x) -> b, t as 1-D [1] values (Gather of a scalar index then Unsqueeze, as torch exports)."""
    return [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i0"], ["b0"], axis=0),
        h.make_node("Gather", ["s", "i1"], ["t0"], axis=0),
        h.make_node("Unsqueeze", ["b0", "ax0"], ["b"]),
        h.make_node("Unsqueeze", ["t0", "ax0"], ["t"]),
    ]


SHAPE_INITS = [ints("i0", 0), ints("i1", 1), ints("ax0", [0])]


def run_sizes(m, target, outputs=1, sizes=SIZES):
    """One import and one compile; each (B, T) compared with onnxruntime."""
    exe = kumiko.compile(kumiko.from_onnx(m), target)
    for b, t in sizes:
        x = RNG.standard_normal((b, t, D)).astype(np.float32)
        want = onnxruntime_run(m, {"x": x})
        got = exe(x=x)
        for o, w in zip(m.graph.output[:outputs], want):
            y = got[o.name]
            assert y.shape == w.shape, f"{o.name} at B={b}, T={t}: {y.shape} != {w.shape}"
            assert rel_l2(y.astype(np.float64), w.astype(np.float64)) <= 1e-5, (o.name, b, t)
    return exe


def x_input():
    return [("x", F, ["B", "T", D])]


@pytest.mark.parametrize("target", TARGETS)
def test_split_heads_reshape_from_shape(target):
    """[B, T, D] -> Reshape(Concat(B, T, heads, D/heads)) -> Transpose -> scale -> Transpose -> Reshape(B, T, -1)."""
    nodes = shape_bt() + [
        h.make_node("Concat", ["b", "t", "heads", "hd"], ["split_shape"], axis=0),
        h.make_node("Reshape", ["x", "split_shape"], ["xh"]),
        h.make_node("Transpose", ["xh"], ["q"], perm=[0, 2, 1, 3]),
        h.make_node("Mul", ["q", "two"], ["q2"]),
        h.make_node("Transpose", ["q2"], ["back"], perm=[0, 2, 1, 3]),
        h.make_node("Concat", ["b", "t", "m1"], ["merge_shape"], axis=0),
        h.make_node("Reshape", ["back", "merge_shape"], ["y"]),
    ]
    inits = SHAPE_INITS + [ints("heads", [2]), ints("hd", [D // 2]), ints("m1", [-1]),
                           nh.from_array(np.array(2.0, np.float32), "two")]
    m = model(nodes, x_input(), [("y", F, ["B", "T", D]), ("q", F, ["B", 2, "T", D // 2])], inits)
    run_sizes(m, target, outputs=2)


@pytest.mark.parametrize("target", TARGETS)
def test_position_ids_from_range_over_the_sequence_length(target):
    """Range(0, T) -> Unsqueeze -> Expand to [B, T] -> Gather from a position table -> Add to x."""
    nodes = shape_bt() + [
        h.make_node("Range", ["zero", "t0", "one"], ["pos"]),
        h.make_node("Unsqueeze", ["pos", "ax0"], ["pos1"]),
        h.make_node("Concat", ["b", "t"], ["bt"], axis=0),
        h.make_node("Expand", ["pos1", "bt"], ["ids"]),
        h.make_node("Gather", ["table", "ids"], ["pe"], axis=0),
        h.make_node("Add", ["x", "pe"], ["y"]),
    ]
    inits = SHAPE_INITS + [ints("zero", 0), ints("one", 1),
                           nh.from_array(RNG.standard_normal((16, D)).astype(np.float32), "table")]
    m = model(nodes, x_input(), [("y", F, ["B", "T", D])], inits)
    g = kumiko.from_onnx(m)
    assert "CumSum" in [n.op for n in g.nodes]        # the iota of symbolic length
    run_sizes(m, target)


@pytest.mark.parametrize("target", TARGETS)
def test_causal_mask_from_constant_of_shape(target):
    """scores = x @ x^T; ConstantOfShape([T, T], 1) -> Trilu (lower) -> > 0.5 -> Where(mask, scores, -1e9)
    -> Softmax."""
    nodes = shape_bt() + [
        h.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["x", "xt"], ["scores"]),
        h.make_node("Concat", ["t", "t"], ["tt"], axis=0),
        h.make_node("ConstantOfShape", ["tt"], ["ones"], value=nh.from_array(np.array([1.0], np.float32))),
        h.make_node("Trilu", ["ones"], ["tril"], upper=0),
        h.make_node("Greater", ["tril", "half"], ["mask"]),
        h.make_node("Where", ["mask", "scores", "neg"], ["masked"]),
        h.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    inits = SHAPE_INITS + [nh.from_array(np.array(0.5, np.float32), "half"),
                           nh.from_array(np.array(-1e9, np.float32), "neg")]
    m = model(nodes, x_input(), [("y", F, ["B", "T", "T"])], inits)
    run_sizes(m, target)


@pytest.mark.parametrize("target", TARGETS)
def test_shape_arithmetic_feeds_reshape_slice_and_expand(target):
    """Mul(B, T) -> Reshape [B*T, D] -> Relu -> Reshape [Div(B*T, T), T, D]; Div(T, 2) and Sub(T, 1) as
    Slice ends; Where(Equal(shape, -1), 1, shape) -> Expand (torch's expand(-1) pattern)."""
    nodes = shape_bt() + [
        h.make_node("Mul", ["b", "t"], ["n"]),
        h.make_node("Concat", ["n", "d"], ["flat_shape"], axis=0),
        h.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        h.make_node("Relu", ["flat"], ["r"]),
        h.make_node("Div", ["n", "t"], ["b_again"]),
        h.make_node("Concat", ["b_again", "t", "d"], ["back_shape"], axis=0),
        h.make_node("Reshape", ["r", "back_shape"], ["y"]),
        h.make_node("Div", ["t", "two"], ["half"]),
        h.make_node("Slice", ["x", "zero", "half", "one"], ["first_half"]),
        h.make_node("Sub", ["t", "one"], ["t1"]),
        h.make_node("Slice", ["x", "one", "t", "one"], ["tail"]),
        h.make_node("Slice", ["x", "zero", "t1", "one"], ["head"]),
        h.make_node("Add", ["tail", "head"], ["diff"]),
        h.make_node("Concat", ["b", "t", "d"], ["bcast"], axis=0),
        h.make_node("Equal", ["bcast", "m1"], ["is_m1"]),
        h.make_node("Where", ["is_m1", "one", "bcast"], ["want"]),
        h.make_node("Expand", ["bias", "want"], ["bias_b"]),
        h.make_node("Add", ["x", "bias_b"], ["z"]),
    ]
    inits = SHAPE_INITS + [ints("d", [D]), ints("two", [2]), ints("zero", [0]), ints("one", [1]), ints("m1", [-1]),
                           nh.from_array(RNG.standard_normal((1, 1, D)).astype(np.float32), "bias")]
    outs = [("y", F, ["B", "T", D]), ("first_half", F, ["B", "H", D]), ("diff", F, ["B", "T1", D]),
            ("z", F, ["B", "T", D])]
    m = model(nodes, x_input(), outs, inits)
    g = kumiko.from_onnx(m)
    assert "Gather" not in [n.op for n in g.nodes]     # all shape arithmetic folded at import
    run_sizes(m, target, outputs=4)


@pytest.mark.parametrize("target", TARGETS)
def test_size_used_as_data_is_computed_from_the_bound_sizes(target):
    """Cast(T) to float scaling x (a shape value read as run-time data), and Size(x)."""
    nodes = shape_bt() + [
        h.make_node("Cast", ["t0"], ["tf"], to=F),
        h.make_node("Div", ["x", "tf"], ["y"]),
        h.make_node("Size", ["x"], ["numel"]),
        h.make_node("Cast", ["numel"], ["nf"], to=F),
        h.make_node("Mul", ["y", "nf"], ["z"]),
    ]
    m = model(nodes, x_input(), [("z", F, ["B", "T", D])], SHAPE_INITS)
    run_sizes(m, target)


def test_shape_that_depends_on_tensor_data_is_a_shape_diagnostic():
    nodes = [
        h.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        h.make_node("Cast", ["mx"], ["n"], to=I64),
        h.make_node("Reshape", ["n", "one"], ["n1"]),
        h.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"], name="data_reshape"),
    ]
    m = model(nodes, x_input(), [("y", F, ["B", "T", D])], [ints("one", [1]), ints("m1", [-1])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "'data_reshape' (Reshape)" in e.value.at and "tensor data" in e.value.why


def test_size_comparison_import_cannot_decide_is_named():
    """Equal(T, 1) depends on T: the Reshape that rests on it names the comparison."""
    nodes = shape_bt() + [
        h.make_node("Equal", ["t", "one"], ["t_is_1"], name="cmp"),
        h.make_node("Where", ["t_is_1", "one", "t"], ["tt"]),
        h.make_node("Concat", ["b", "tt", "d"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"], name="r"),
    ]
    m = model(nodes, x_input(), [("y", F, ["B", "T", D])], SHAPE_INITS + [ints("one", [1]), ints("d", [D])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "'r' (Reshape)" in e.value.at and "'cmp' (Equal)" in e.value.why
    assert "depends on the sizes" in e.value.why


def test_fold_only_op_over_symbolic_sizes_is_a_shape_diagnostic():
    """Mod by a symbolic size cannot be evaluated at import (Mod is folded, never run)."""
    nodes = shape_bt() + [h.make_node("Mod", ["b", "t"], ["r"], name="mod"),
                          h.make_node("Concat", ["r", "m1"], ["shape"], axis=0),
                          h.make_node("Reshape", ["x", "shape"], ["y"])]
    m = model(nodes, x_input(), [("y", F, ["B", "T", D])], SHAPE_INITS + [ints("m1", [-1])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "'mod' (Mod)" in e.value.at and "symbolic" in e.value.why
