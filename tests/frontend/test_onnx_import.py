"""``kumiko.from_onnx``: whole models against onnxruntime, and the importer's own rules (params,
folding, static inputs, int64 narrowing, opset conversion, diagnostics).

The op-by-op semantics are covered by onnx's node tests (test_onnx_conformance.py); this module
checks what those cannot: models made of several ops with initializers, symbolic batch sizes, and
that whatever the importer cannot express fails loudly, naming the ONNX node.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

RNG = np.random.default_rng(7)


def model(nodes, inputs, outputs, inits=(), opset=17, name="m"):
    """A checked ModelProto (IR version 10, which onnxruntime reads)."""
    g = h.make_graph(nodes, name, [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def init(name, shape, scale=0.3, dtype=np.float32):
    return nh.from_array((RNG.standard_normal(shape) * scale).astype(dtype), name)


def onnxruntime_run(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ------------------------------------------------------------------------------------------------
# whole models


def cnn():
    """conv(pad 1, bias) -> relu -> maxpool -> grouped conv (stride 2, SAME_UPPER) -> relu -> flatten
    -> gemm (transB) -> softmax, batch size symbolic."""
    inits = [init("w1", [8, 3, 3, 3]), init("b1", [8]), init("w2", [16, 4, 3, 3]), init("b2", [16]),
             init("fc_w", [10, 16 * 4 * 4], 0.1), init("fc_b", [10])]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        h.make_node("Conv", ["p1", "w2", "b2"], ["c2"], strides=[2, 2], auto_pad="SAME_UPPER", group=2, name="conv2"),
        h.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        h.make_node("Flatten", ["r2"], ["f"], axis=1, name="flatten"),
        h.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
        h.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    return model(nodes, [("x", TP.FLOAT, ["N", 3, 16, 16])], [("probs", TP.FLOAT, ["N", 10])], inits, name="cnn")


def transformer_block(d=32, heads=4, ff=64):
    """pre-norm block: layernorm -> q/k/v -> causal Attention (opset 23, 3-D) -> proj -> residual ->
    layernorm -> matmul -> gelu -> matmul -> residual."""
    inits = [init("g1", [d], 1.0), init("be1", [d]), init("wq", [d, d]), init("wk", [d, d]), init("wv", [d, d]),
             init("wo", [d, d]), init("g2", [d], 1.0), init("be2", [d]), init("w1", [d, ff]), init("c1", [ff]),
             init("w2", [ff, d]), init("c2", [d])]
    nodes = [
        h.make_node("LayerNormalization", ["x", "g1", "be1"], ["ln1"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["ln1", "wq"], ["q"]), h.make_node("MatMul", ["ln1", "wk"], ["k"]),
        h.make_node("MatMul", ["ln1", "wv"], ["v"]),
        h.make_node("Attention", ["q", "k", "v"], ["att"], q_num_heads=heads, kv_num_heads=heads, is_causal=1),
        h.make_node("MatMul", ["att", "wo"], ["proj"]), h.make_node("Add", ["x", "proj"], ["r1"]),
        h.make_node("LayerNormalization", ["r1", "g2", "be2"], ["ln2"], axis=-1),
        h.make_node("MatMul", ["ln2", "w1"], ["h1"]), h.make_node("Add", ["h1", "c1"], ["h1b"]),
        h.make_node("Gelu", ["h1b"], ["act"]),
        h.make_node("MatMul", ["act", "w2"], ["h2"]), h.make_node("Add", ["h2", "c2"], ["h2b"]),
        h.make_node("Add", ["r1", "h2b"], ["y"]),
    ]
    return model(nodes, [("x", TP.FLOAT, [2, 8, d])], [("y", TP.FLOAT, [2, 8, d])], inits, opset=23, name="block")


@pytest.mark.parametrize("batch", [2, 3])
def test_cnn_matches_onnxruntime(batch):
    m = cnn()
    g = kumiko.from_onnx(m)
    x = RNG.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    want = onnxruntime_run(m, {"x": x})[0]
    got = kumiko.compile(g)(x=x)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert {n.op for n in g.nodes} >= {"Conv2D", "MaxPool", "MatMul", "Softmax"}


def test_transformer_block_matches_onnxruntime():
    m = transformer_block()
    g = kumiko.from_onnx(m)
    x = RNG.standard_normal((2, 8, 32)).astype(np.float32)
    want = onnxruntime_run(m, {"x": x})[0]
    got = kumiko.compile(g)(x=x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert {n.op for n in g.nodes} >= {"LayerNorm", "Attention", "MatMul"}
    assert any(n.fn == "gelu" for n in g.nodes)


def test_models_match_the_reference_evaluator_too():
    """The same models against onnx's ReferenceEvaluator, so CI without onnxruntime checks them."""
    from onnx.reference import ReferenceEvaluator
    for m, shape, out in ((cnn(), (2, 3, 16, 16), "probs"), (transformer_block(), (2, 8, 32), "y")):
        x = RNG.standard_normal(shape).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        np.testing.assert_allclose(kumiko.compile(kumiko.from_onnx(m))(x=x)[out], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# params, folding, static inputs


def test_initializers_are_const_pool_params():
    g = kumiko.from_onnx(cnn())
    sig = {i.tensor: i for i in g.inputs}
    assert sig["x"].role == "data" and sig["x"].storage is None
    for name in ("w1", "b1", "w2", "b2", "fc_w", "fc_b"):
        assert sig[name].role == "param" and sig[name].storage == "const_pool"
        assert g.params[name].dtype == np.float32 and g.params[name].shape == g.tensors[name].shape
    assert [i.tensor for i in g.inputs][0] == "x"
    exe = kumiko.compile(g)
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    zero_fc = np.zeros_like(g.params["fc_w"])
    out = exe(x=x, fc_w=zero_fc, fc_b=np.zeros(10, np.float32))["probs"]    # a passed param wins
    np.testing.assert_allclose(out, np.full((1, 10), 0.1, np.float32), rtol=1e-6)


def test_initializers_become_params_without_a_copy(monkeypatch):
    """An initializer already C-ordered in its dtype is the param itself (BERT-base's 440 MB of weights had
    been copied once more on import); the values are the initializers'."""
    import kumiko.frontend.onnx_import as oi
    made = {}

    def spy(t, where):
        made[t.name] = a = oi_tensor_array(t, where)
        return a
    oi_tensor_array = oi.tensor_array
    monkeypatch.setattr(oi, "tensor_array", spy)
    m = cnn()
    g = kumiko.from_onnx(m)
    for name in ("w1", "fc_w", "fc_b"):
        assert np.shares_memory(g.params[name], made[name]), name
        want = nh.to_array(next(t for t in m.graph.initializer if t.name == name))
        assert np.array_equal(g.params[name], want)


def test_shape_subgraph_is_folded():
    """Reshape(x, Concat(Shape(x)[0:1], [-1])), the exporters' flatten, leaves only a Reshape."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Constant", [], ["zero"], value=nh.from_array(np.array([0], np.int64))),
        h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        h.make_node("Constant", [], ["m1"], value_ints=[-1]),
        h.make_node("Concat", ["n", "m1"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    m = model(nodes, [("x", TP.FLOAT, [2, 3, 4])], [("y", TP.FLOAT, [2, 12])])
    g = kumiko.from_onnx(m)
    assert [n.op for n in g.nodes] == ["Reshape"] and [i.tensor for i in g.inputs] == ["x"]
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(kumiko.compile(g)(x=x)["y"], x.reshape(2, 12))


def test_runtime_shape_input_needs_static_inputs():
    nodes = [h.make_node("Reshape", ["x", "shape"], ["y"], name="the_reshape")]
    m = model(nodes, [("x", TP.FLOAT, [2, 6]), ("shape", TP.INT64, [2])], [("y", TP.FLOAT, [3, 4])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    # E1011 (shapes): the output shape would depend on tensor data
    assert e.value.code == "E1011" and "'the_reshape' (Reshape)" in e.value.at and "shape" in e.value.why
    g = kumiko.from_onnx(m, static_inputs={"shape": np.array([3, 4], np.int64)})
    assert [i.tensor for i in g.inputs] == ["x"]      # folded away: nothing reads it at run time
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(kumiko.compile(g)(x=x)["y"], x.reshape(3, 4))


def test_int64_becomes_i32():
    idx = nh.from_array(np.array([[2, 0], [1, -1]], np.int64), "idx")
    nodes = [h.make_node("Gather", ["table", "idx"], ["g"], axis=0), h.make_node("Gather", ["table", "j"], ["g2"])]
    m = model(nodes, [("table", TP.FLOAT, [4, 3]), ("j", TP.INT64, [2])],
              [("g", TP.FLOAT, [2, 2, 3]), ("g2", TP.FLOAT, [2, 3])], [idx])
    g = kumiko.from_onnx(m)
    assert g.params["idx"].dtype == np.int32 and g.tensors["j"].dtype is kumiko.dtypes.i32
    t = RNG.standard_normal((4, 3)).astype(np.float32)
    out = kumiko.compile(g)(table=t, j=np.array([3, 1], np.int32))
    np.testing.assert_array_equal(out["g"], t[[[2, 0], [1, 3]]])
    np.testing.assert_array_equal(out["g2"], t[[3, 1]])
    out64 = kumiko.compile(g)(table=t, j=np.array([3, 1], np.int64))     # int64 arrays that fit are narrowed
    np.testing.assert_array_equal(out64["g2"], t[[3, 1]])


def test_int64_constant_out_of_i32_range_is_rejected():
    big = nh.from_array(np.array([2**40, 1], np.int64), "big")
    m = model([h.make_node("Add", ["x", "big"], ["y"], name="add_big")], [("x", TP.INT64, [2])],
              [("y", TP.INT64, [2])], [big])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1012" and "add_big" in e.value.at and "i32" in e.value.why


def test_outputs_that_alias_inputs_or_constants():
    nodes = [h.make_node("Identity", ["x"], ["same"]),
             h.make_node("Constant", [], ["c"], value=nh.from_array(np.array([1.5, 2.5], np.float32))),
             h.make_node("Shape", ["x"], ["s"])]
    m = model(nodes, [("x", TP.FLOAT, [2, 3])], [("same", TP.FLOAT, [2, 3]), ("c", TP.FLOAT, [2]),
                                                  ("s", TP.INT64, [2])])
    out = kumiko.compile(kumiko.from_onnx(m))(x=np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(out["same"], np.ones((2, 3)))
    np.testing.assert_array_equal(out["c"], [1.5, 2.5])
    np.testing.assert_array_equal(out["s"], [2, 3])


def test_leaky_relu_with_alpha_above_one():
    m = model([h.make_node("LeakyRelu", ["x"], ["y"], alpha=3.0)], [("x", TP.FLOAT, [5])], [("y", TP.FLOAT, [5])])
    x = np.array([-2, -0.5, 0, 0.5, 2], np.float32)
    np.testing.assert_allclose(kumiko.compile(kumiko.from_onnx(m))(x=x)["y"], np.where(x < 0, 3 * x, x))


def test_old_opset_is_converted():
    """opset 11: Unsqueeze and ReduceSum take axes as attributes; the version converter moves them."""
    nodes = [h.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), h.make_node("ReduceSum", ["u"], ["s"], axes=[2],
                                                                         keepdims=0)]
    m = model(nodes, [("x", TP.FLOAT, [3, 4])], [("s", TP.FLOAT, [1, 3])], opset=11)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(kumiko.compile(kumiko.from_onnx(m))(x=x)["s"], x.sum(1)[None], rtol=1e-6)


def test_import_from_a_path(tmp_path):
    m = model([h.make_node("Sigmoid", ["x"], ["y"])], [("x", TP.FLOAT, [4])], [("y", TP.FLOAT, [4])])
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    for src in (p, str(p)):
        x = np.linspace(-3, 3, 4).astype(np.float32)
        np.testing.assert_allclose(kumiko.compile(kumiko.from_onnx(src))(x=x)["y"], 1 / (1 + np.exp(-x)), rtol=1e-6)
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(tmp_path / "missing.onnx")
    assert e.value.code == "E1502"


# ------------------------------------------------------------------------------------------------
# diagnostics: the node, the op and what is missing; no Graph


def test_unknown_op_names_node_and_op():
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Hardmax", ["r"], ["y"], name="hm")]
    m = model(nodes, [("x", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, [2, 3])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1006" and e.value.at == "onnx node 'hm' (Hardmax)" and "Hardmax" in e.value.why


def test_unsupported_dtype():
    m = model([h.make_node("Relu", ["x"], ["y"])], [("x", TP.INT8, [2])], [("y", TP.INT8, [2])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1012" and "'x'" in e.value.at and "INT8" in e.value.why
    cast = model([h.make_node("Cast", ["x"], ["y"], to=TP.UINT8, name="to_u8")], [("x", TP.FLOAT, [2])],
                 [("y", TP.UINT8, [2])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(cast)
    assert e.value.code == "E1012" and "to_u8" in e.value.at and "UINT8" in e.value.why


@pytest.mark.parametrize("node,outs,what", [
    (h.make_node("Pad", ["x", "pads"], ["y"], mode="reflect", name="n"), [("y", TP.FLOAT, [1, 2, 12])], "reflect"),
    (h.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2], storage_order=1, name="n"),
     [("y", TP.FLOAT, [1, 2, 3]), ("idx", TP.INT64, [1, 2, 3])], "storage_order=1"),
    (h.make_node("Div", ["i", "i"], ["y"], name="n"), [("y", TP.INT32, [3])], "integer division"),
], ids=["pad-reflect", "maxpool-indices-1d-column-major", "int-div"])
def test_unsupported_attribute_or_feature(node, outs, what):
    pads = nh.from_array(np.array([0, 0, 4, 0, 0, 4], np.int64), "pads")     # reflect needs pads < the axis
    m = model([node], [("x", TP.FLOAT, [1, 2, 4]), ("i", TP.INT32, [3])], outs, [pads])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.at == f"onnx node 'n' ({node.op_type})" and what in e.value.why


def test_pooling_kernel_of_the_wrong_rank_is_rejected():
    m = model([h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], name="p3")],
              [("x", TP.FLOAT, [1, 1, 4, 4, 4])], [("y", TP.FLOAT, [1, 1, 3, 3, 3])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == "E1010" and "3 sizes" in e.value.why and "p3" in e.value.at


def test_unknown_attribute_is_not_ignored():
    """An attribute the importer does not know could change the meaning; it is refused, not dropped."""
    node = h.make_node("Softmax", ["x"], ["y"], axis=1, name="sm")
    node.attribute.append(h.make_attribute("temperature", 2.0))     # not ONNX: the checker would refuse it
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    assert e.value.code == "E1010" and e.value.at == "onnx node 'sm' (Softmax)" and "temperature" in e.value.why
