"""ONNX activations, trigonometry and normalisations (kumiko/frontend/onnx_act.py, onnx_norm.py) against
onnxruntime, on the evaluator and the CPU target, with fresh random inputs and unusual attributes;
BatchNormalization folded into the Conv / Gemm / MatMul before it; the refused cases' diagnostics.

onnx's node tests (test_onnx_conformance.py) check each op on its fixed examples; this module checks
attribute values and opsets those do not, models of several ops, and the folding.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from tests.frontend.test_onnx_import import init, model, onnxruntime_run  # noqa: E402

RNG = np.random.default_rng(11)
NORM_OPS = {"LayerNorm", "Reduce"}


def check(m, feeds: dict, targets=("eval", "cpu"), bound: float = 1e-4) -> kumiko.Graph:
    """Import ``m``, run it on each target and compare every output with onnxruntime (relative L2)."""
    g = kumiko.from_onnx(m)
    want = onnxruntime_run(m, feeds)
    for target in targets:
        got = kumiko.compile(g, target)(**feeds)
        for o, w in zip(m.graph.output, want):
            err = rel_l2(got[o.name], w)
            assert err <= bound, f"{target} {o.name}: relative L2 {err:.3g} > {bound}"
    return g


def unary(op: str, shape=(2, 3, 5), opset=18, **attrs):
    return model([h.make_node(op, ["x"], ["y"], **attrs)], [("x", TP.FLOAT, list(shape))],
                 [("y", TP.FLOAT, list(shape))], opset=opset)


def rand(*shape, scale=3.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# activations

@pytest.mark.parametrize("op,attrs", [
    ("Elu", {}), ("Elu", {"alpha": 0.3}),
    ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 0.5}),
    ("Celu", {}), ("Celu", {"alpha": 2.5}),
    ("Softplus", {}), ("Softsign", {}), ("HardSwish", {}),
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.5, "beta": 0.3}),
    ("Mish", {}), ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": -0.5}),
    ("Sin", {}), ("Cos", {}), ("Tan", {}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()) or "default")
def test_activation(op, attrs):
    check(unary(op, **attrs), {"x": rand(2, 3, 5)})


def test_softplus_and_mish_do_not_overflow():
    """softplus(x) = x for large x: relu(x) + log(1 + exp(-|x|)) never forms exp(100)."""
    x = np.array([[-100.0, -20.0, 0.0, 20.0, 100.0]], np.float32)
    for op in ("Softplus", "Mish"):
        check(unary(op, (1, 5)), {"x": x})


def test_trig_over_many_periods():
    x = np.linspace(-200, 200, 4001, dtype=np.float32).reshape(1, -1)
    for op in ("Sin", "Cos"):
        check(unary(op, x.shape), {"x": x})


def test_activation_fp16_runs_in_fp32():
    m = model([h.make_node("Elu", ["x"], ["y"], alpha=0.7)], [("x", TP.FLOAT16, [4, 8])], [("y", TP.FLOAT16, [4, 8])])
    x = rand(4, 8).astype(np.float16)
    check(m, {"x": x}, bound=1e-3)


@pytest.mark.parametrize("slope_shape", [[1], [4, 1, 1], [5], [3, 4, 1, 5]], ids=str)
def test_prelu_slope_broadcasts_one_way(slope_shape):
    m = model([h.make_node("PRelu", ["x", "slope"], ["y"])], [("x", TP.FLOAT, [3, 4, 2, 5])],
              [("y", TP.FLOAT, [3, 4, 2, 5])], [init("slope", slope_shape)])
    check(m, {"x": rand(3, 4, 2, 5)})


def test_prelu_runtime_slope():
    m = model([h.make_node("PRelu", ["x", "slope"], ["y"])], [("x", TP.FLOAT, [3, 4]), ("slope", TP.FLOAT, [4])],
              [("y", TP.FLOAT, [3, 4])])
    check(m, {"x": rand(3, 4), "slope": rand(4)})


def test_prelu_slope_that_would_grow_the_output_is_refused():
    m = model([h.make_node("PRelu", ["x", "slope"], ["y"], name="pr")], [("x", TP.FLOAT, [4])],
              [("y", TP.FLOAT, [3, 4])], [init("slope", [3, 4])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "'pr' (PRelu)" in e.value.at


# ------------------------------------------------------------------------------------------------
# Dropout

def test_dropout_inference_is_identity_with_true_mask():
    ratio = nh.from_array(np.array(0.3, np.float32), "ratio")
    m = model([h.make_node("Dropout", ["x", "ratio"], ["y", "mask"], seed=3)], [("x", TP.FLOAT, [2, 6])],
              [("y", TP.FLOAT, [2, 6]), ("mask", TP.BOOL, [2, 6])], [ratio], opset=13)
    x = rand(2, 6)
    g = check(m, {"x": x})
    out = kumiko.compile(g, "cpu")(x=x)
    np.testing.assert_array_equal(out["y"], x)
    assert out["mask"].dtype == np.bool_ and out["mask"].all() and out["mask"].shape == (2, 6)


def test_dropout_mask_with_a_symbolic_batch():
    m = model([h.make_node("Dropout", ["x"], ["y", "mask"])], [("x", TP.FLOAT, ["N", 3])],
              [("y", TP.FLOAT, ["N", 3]), ("mask", TP.BOOL, ["N", 3])])
    out = kumiko.compile(kumiko.from_onnx(m), "cpu")(x=rand(4, 3))
    assert out["mask"].shape == (4, 3) and out["mask"].all()


def test_dropout_training_with_zero_ratio_is_identity():
    consts = [nh.from_array(np.array(0.0, np.float32), "ratio"), nh.from_array(np.array(True), "train")]
    m = model([h.make_node("Dropout", ["x", "ratio", "train"], ["y"])], [("x", TP.FLOAT, [3, 4])],
              [("y", TP.FLOAT, [3, 4])], consts)
    check(m, {"x": rand(3, 4)})


@pytest.mark.parametrize("ratio", [None, 0.1])
def test_dropout_training_is_refused(ratio):
    consts = [nh.from_array(np.array(True), "train")]
    if ratio is not None:
        consts.append(nh.from_array(np.array(ratio, np.float32), "ratio"))
    m = model([h.make_node("Dropout", ["x", "ratio" if ratio is not None else "", "train"], ["y"], name="dr")],
              [("x", TP.FLOAT, [3, 4])], [("y", TP.FLOAT, [3, 4])], consts)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and "'dr' (Dropout)" in e.value.at and "training" in e.value.why


def test_dropout_runtime_training_mode_is_refused():
    m = model([h.make_node("Dropout", ["x", "", "train"], ["y"], name="dr")],
              [("x", TP.FLOAT, [3, 4]), ("train", TP.BOOL, [])], [("y", TP.FLOAT, [3, 4])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and "training_mode" in e.value.why


# ------------------------------------------------------------------------------------------------
# ReduceLogSumExp

@pytest.mark.parametrize("axes,keepdims,opset", [([1], 1, 18), ([0, 2], 0, 18), ([-1], 1, 13), (None, 0, 18)],
                         ids=["axis1", "axes02-drop", "attr-opset13", "all"])
def test_reduce_log_sum_exp(axes, keepdims, opset):
    x = rand(3, 4, 5, scale=30.0)             # exp(90) overflows fp32: only a max-shifted sum survives
    inits, ins, attrs = [], ["x"], {"keepdims": keepdims}
    if axes is not None and opset >= 18:
        inits, ins = [nh.from_array(np.array(axes, np.int64), "axes")], ["x", "axes"]
    elif axes is not None:
        attrs["axes"] = axes
    want = np.log(np.sum(np.exp(x.astype(np.float64)), axis=None if axes is None else tuple(axes), keepdims=keepdims))
    m = model([h.make_node("ReduceLogSumExp", ins, ["y"], **attrs)], [("x", TP.FLOAT, [3, 4, 5])],
              [("y", TP.FLOAT, list(np.shape(want)))], inits, opset=opset)
    g = kumiko.from_onnx(m)
    for target in ("eval", "cpu"):
        assert rel_l2(kumiko.compile(g, target)(x=x)["y"], want) <= 1e-6


def test_reduce_log_sum_exp_matches_onnxruntime_on_small_values():
    m = model([h.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)], [("x", TP.FLOAT, [3, 4, 5])],
              [("y", TP.FLOAT, [3, 5])], [nh.from_array(np.array([1], np.int64), "axes")], opset=18)
    check(m, {"x": rand(3, 4, 5)})


# ------------------------------------------------------------------------------------------------
# BatchNormalization

def bn_inits(c: int, prefix: str = "") -> list:
    return [init(f"{prefix}scale", [c], 1.0), init(f"{prefix}bias", [c]), init(f"{prefix}mean", [c]),
            nh.from_array((RNG.random(c) + 0.5).astype(np.float32), f"{prefix}var")]


def bn(x: str, y: str, prefix: str = "", **attrs):
    return h.make_node("BatchNormalization", [x, *(f"{prefix}{n}" for n in ("scale", "bias", "mean", "var"))], [y],
                       name=f"{prefix}bn", **attrs)


def ops_of(g: kumiko.Graph) -> list[str]:
    return [n.op for n in g.nodes]


@pytest.mark.parametrize("bias,group,conv1d", [(True, 1, False), (False, 1, False), (True, 2, False),
                                               (False, 1, True)], ids=["bias", "no-bias", "grouped", "conv1d"])
def test_batchnorm_after_conv_is_folded(bias, group, conv1d):
    spatial = [7] if conv1d else [7, 6]
    inits = [init("w", [8, 4 // group] + [3] * len(spatial))] + ([init("b", [8])] if bias else []) + bn_inits(8)
    nodes = [h.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1] * 2 * len(spatial),
                         group=group), bn("c", "y", epsilon=1e-3), h.make_node("Relu", ["y"], ["r"])]
    m = model(nodes, [("x", TP.FLOAT, [2, 4, *spatial])], [("r", TP.FLOAT, [2, 8, *spatial])], inits, opset=15)
    g = check(m, {"x": rand(2, 4, *spatial)})
    assert ops_of(g) == ["Conv1D" if conv1d else "Conv2D", "Elementwise"]   # the Relu
    assert "w" not in g.params and "scale" not in g.params      # the folded weight replaced the original


@pytest.mark.parametrize("trans_b,with_c,alpha,beta", [(1, True, 1.0, 1.0), (0, False, 0.5, 1.0),
                                                       (1, True, 2.0, 0.25)], ids=["transB", "no-C", "alpha-beta"])
def test_batchnorm_after_gemm_is_folded(trans_b, with_c, alpha, beta):
    inits = [init("w", [6, 5] if trans_b else [5, 6])] + ([init("c", [6])] if with_c else []) + bn_inits(6)
    nodes = [h.make_node("Gemm", ["x", "w"] + (["c"] if with_c else []), ["g"], transB=trans_b, alpha=alpha,
                         beta=beta), bn("g", "y")]
    m = model(nodes, [("x", TP.FLOAT, [3, 5])], [("y", TP.FLOAT, [3, 6])], inits)
    g = check(m, {"x": rand(3, 5)})
    assert ops_of(g).count("MatMul") == 1 and not NORM_OPS & set(ops_of(g))
    assert [n.fn for n in g.nodes if n.op == "Elementwise"] in (["add"], ["mul", "add"])   # alpha, bias


def test_batchnorm_after_matmul_is_folded():
    m = model([h.make_node("MatMul", ["x", "w"], ["mm"]), bn("mm", "y")], [("x", TP.FLOAT, [4, 5])],
              [("y", TP.FLOAT, [4, 6])], [init("w", [5, 6])] + bn_inits(6))
    g = check(m, {"x": rand(4, 5)})
    assert ops_of(g) == ["MatMul", "Elementwise"]


def test_batchnorm_is_not_folded_into_a_shared_weight_or_value():
    """The Conv's output also feeds the graph's output, and its weight a second Conv: folding would
    change one of them (or copy the weight), so the affine stays separate and both results are right."""
    inits = [init("w", [4, 4, 3, 3])] + bn_inits(4)
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), bn("c", "y"),
             h.make_node("Conv", ["y", "w"], ["z"], pads=[1, 1, 1, 1])]
    m = model(nodes, [("x", TP.FLOAT, [1, 4, 5, 5])], [("z", TP.FLOAT, [1, 4, 5, 5]), ("c", TP.FLOAT, [1, 4, 5, 5])],
              inits)
    g = check(m, {"x": rand(1, 4, 5, 5)})
    assert ops_of(g).count("Conv2D") == 2 and "w" in g.params


def test_batchnorm_affine_with_constants_and_opset_variants():
    for opset in (9, 14, 15):          # 9 goes through the version converter
        m = model([h.make_node("Relu", ["x"], ["r"]), bn("r", "y", epsilon=0.1)], [("x", TP.FLOAT, [2, 5, 3, 4])],
                  [("y", TP.FLOAT, [2, 5, 3, 4])], bn_inits(5), opset=opset)
        g = check(m, {"x": rand(2, 5, 3, 4)})
        assert [n.fn for n in g.nodes if n.op == "Elementwise"] == ["relu", "mul", "add"]


def test_batchnorm_with_runtime_statistics():
    ins = [("x", TP.FLOAT, [2, 3, 4]), ("scale", TP.FLOAT, [3]), ("bias", TP.FLOAT, [3]), ("mean", TP.FLOAT, [3]),
           ("var", TP.FLOAT, [3])]
    m = model([bn("x", "y", epsilon=1e-2)], ins, [("y", TP.FLOAT, [2, 3, 4])])
    check(m, {"x": rand(2, 3, 4), "scale": rand(3), "bias": rand(3), "mean": rand(3),
              "var": (RNG.random(3) + 0.1).astype(np.float32)})


def test_batchnorm_rank2():
    m = model([bn("x", "y")], [("x", TP.FLOAT, [6, 3])], [("y", TP.FLOAT, [6, 3])], bn_inits(3))
    check(m, {"x": rand(6, 3)})


def test_batchnorm_training_is_refused():
    m = model([bn("x", "y", training_mode=1)], [("x", TP.FLOAT, [2, 3, 4])], [("y", TP.FLOAT, [2, 3, 4])],
              bn_inits(3), opset=15)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and e.value.at == "onnx node 'bn' (BatchNormalization)"
    node = h.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"], name="bn",
                       training_mode=1)
    m = model([node], [("x", TP.FLOAT, [2, 3, 4])], [("y", TP.FLOAT, [2, 3, 4]), ("rm", TP.FLOAT, [3]),
                                                     ("rv", TP.FLOAT, [3])], bn_inits(3), opset=15)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and "training" in e.value.why


# ------------------------------------------------------------------------------------------------
# InstanceNormalization, GroupNormalization, LRN

@pytest.mark.parametrize("shape,eps", [([2, 3, 5, 4], 1e-5), ([2, 4, 7], 0.5)], ids=["2d", "1d-eps"])
def test_instance_normalization(shape, eps):
    c = shape[1]
    m = model([h.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=eps)],
              [("x", TP.FLOAT, shape)], [("y", TP.FLOAT, shape)], [init("s", [c], 1.0), init("b", [c])])
    check(m, {"x": rand(*shape)})


def groupnorm_reference(x, scale, bias, groups, eps, per_group):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1).astype(np.float64)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    if per_group:
        y = y * scale[None, :, None] + bias[None, :, None]
        return y.reshape(x.shape)
    y = y.reshape(x.shape)
    sh = (1, c) + (1,) * (x.ndim - 2)
    return y * scale.reshape(sh) + bias.reshape(sh)


@pytest.mark.parametrize("opset,groups,eps", [(18, 2, 1e-5), (21, 3, 1e-2), (21, 6, 1e-5)],
                         ids=["opset18-per-group", "opset21-per-channel", "opset21-groups-eq-channels"])
def test_group_normalization(opset, groups, eps):
    c = 6
    k = groups if opset < 21 else c
    scale, bias = rand(k, scale=1.0), rand(k, scale=1.0)
    graph = h.make_graph([h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=eps)],
                         "gn", [h.make_tensor_value_info("x", TP.FLOAT, [2, c, 4, 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, c, 4, 3])],
                         [nh.from_array(scale, "s"), nh.from_array(bias, "b")])
    # not through model(): onnx's checker refuses GroupNormalization-18 as deprecated, exporters still write it
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    x = rand(2, c, 4, 3)
    g = kumiko.from_onnx(m)
    want = groupnorm_reference(x, scale, bias, groups, eps, opset < 21)
    for target in ("eval", "cpu"):
        assert rel_l2(kumiko.compile(g, target)(x=x)["y"], want) <= 1e-5
    if opset >= 21:                        # onnxruntime implements opset 21's GroupNormalization
        check(m, {"x": x})


def test_group_normalization_bad_groups():
    m = model([h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4, name="gn")],
              [("x", TP.FLOAT, [2, 6, 3])], [("y", TP.FLOAT, [2, 6, 3])], [init("s", [6]), init("b", [6])], opset=21)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1011" and "'gn' (GroupNormalization)" in e.value.at


@pytest.mark.parametrize("size,attrs", [(3, {}), (5, {"alpha": 1e-2, "beta": 0.5, "bias": 2.0}), (2, {}),
                                        (1, {"beta": 1.0})], ids=["size3", "size5-attrs", "size2-even", "size1"])
def test_lrn(size, attrs):
    m = model([h.make_node("LRN", ["x"], ["y"], size=size, **attrs)], [("x", TP.FLOAT, [2, 7, 4, 3])],
              [("y", TP.FLOAT, [2, 7, 4, 3])])
    x = rand(2, 7, 4, 3)
    if size % 2:
        check(m, {"x": x})
        return
    # onnxruntime takes odd sizes only, and onnx's reference LRN loops over the batch axis, not the channels:
    # the spec's window [c - floor((size-1)/2), c + ceil((size-1)/2)] spelled out
    lo, hi = (size - 1) // 2, size // 2
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (lo, hi), (0, 0), (0, 0)])
    window = sum(sq[:, j:j + x.shape[1]] for j in range(size))
    want = x / (1.0 + 1e-4 / size * window) ** 0.75
    g = kumiko.from_onnx(m)
    for target in ("eval", "cpu"):
        assert rel_l2(kumiko.compile(g, target)(x=x)["y"], want) <= 1e-5


def test_small_cnn_with_every_kind():
    """conv -> BN (folded) -> HardSwish -> conv -> InstanceNorm -> PRelu -> LRN -> Dropout -> GAP -> gemm ->
    BN (folded into the gemm) -> Mish, batch size symbolic."""
    inits = [init("w1", [8, 3, 3, 3]), *bn_inits(8, "a_"), init("w2", [8, 8, 3, 3]), init("b2", [8]),
             init("in_s", [8], 1.0), init("in_b", [8]), init("slope", [8, 1, 1]), init("fc", [8, 5]),
             *bn_inits(5, "f_")]
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), bn("c1", "n1", "a_"),
        h.make_node("HardSwish", ["n1"], ["a1"]),
        h.make_node("Conv", ["a1", "w2", "b2"], ["c2"], strides=[2, 2]),
        h.make_node("InstanceNormalization", ["c2", "in_s", "in_b"], ["n2"]),
        h.make_node("PRelu", ["n2", "slope"], ["a2"]), h.make_node("LRN", ["a2"], ["l2"], size=3),
        h.make_node("Dropout", ["l2"], ["d2"]), h.make_node("GlobalAveragePool", ["d2"], ["p"]),
        h.make_node("Flatten", ["p"], ["f"]), h.make_node("MatMul", ["f", "fc"], ["mm"]), bn("mm", "n3", "f_"),
        h.make_node("Mish", ["n3"], ["y"]),
    ]
    m = model(nodes, [("x", TP.FLOAT, ["N", 3, 9, 9])], [("y", TP.FLOAT, ["N", 5])], inits, opset=18)
    g = check(m, {"x": rand(2, 3, 9, 9, scale=1.0)})
    assert kumiko.compile(g, "cpu")(x=rand(3, 3, 9, 9, scale=1.0))["y"].shape == (3, 5)
    assert sum(n.op == "LayerNorm" for n in g.nodes) == 1          # the InstanceNorm; both BNs are folded
