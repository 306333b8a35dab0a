"""Decompile (seed 004): ``parse_program(decompile(g))`` is the same graph as ``g`` -- the same
signature, symbols, tensor table, ops, attributes and Tiny IR -- for every example, for graphs
made with the Tensor API, for JSON with unusual names, and for imported ONNX models."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kumiko import compiler
from kumiko.diagnostics import KumikoError
from kumiko.frontend.decompile import decompile
from kumiko.frontend.dsl import parse_program
from kumiko.frontend.graph import Graph
from kumiko.frontend.lower import OP_ALIASES, OPS
from kumiko.frontend.tensor import Tensor
from kumiko.tiny.ir import to_json as tiny_json

EXAMPLES = Path(__file__).parents[2] / "examples"


def _norm(g: Graph) -> dict:
    """to_json without what the DSL does not keep: the graph's and the ops' names, alias op spellings."""
    d = g.to_json()
    d.pop("name")
    for n in d["graph"]:
        n.pop("name")
        n["op"] = n["op"] if n["op"] in OPS else OP_ALIASES[n["op"].lower()]
    return d


def _tiny(g: Graph) -> dict:
    d = tiny_json(g.tiny)
    d.pop("name")
    return d


def roundtrip(g: Graph) -> str:
    text = decompile(g)
    back = parse_program(text, filename="decompiled.kumiko")
    assert json.dumps(_norm(back)) == json.dumps(_norm(g)), text
    assert _tiny(back) == _tiny(g), text
    again = decompile(back)
    assert again.split("\n", 1)[1] == text.split("\n", 1)[1]      # a fixpoint (but for the name comment)
    return text


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")) + sorted(EXAMPLES.glob("*.kumiko")),
                         ids=lambda p: p.name)
def test_examples_roundtrip(path):
    text = roundtrip(compiler.load(path))
    assert "graph" in text and " main(" in text


def test_decompiled_text_reads_like_the_dsl():
    text = decompile(compiler.load(EXAMPLES / "gemm_bias_relu.json"))
    assert text == (
        '// decompiled from the kumiko graph "gemm_bias_relu"\n'
        "graph<M=256, N=128, K=64> main(A: f32[M, K], B: f32[K, N], bias: param const_pool f32[N])"
        " -> (C2: f32[M, N]) {\n"
        "    C0 = gemm(A, B, acc_dtype=f32)\n"
        "    C1 = C0 + bias\n"
        "    C2 = relu(C1)\n"
        "    return C2\n"
        "}\n")


def test_tensor_api_graph_with_many_ops_roundtrips():
    x = Tensor.input("x", ("B", 4, 6, 6))
    w = Tensor.input("w", (4, 4, 3, 3), role="param", storage="const_pool")
    v = Tensor.input("v", ("B", 8), dtype="fp16")
    idx = Tensor.input("idx", ("B", 3), dtype="i32")
    y = x.conv2d(w, stride=1, padding=1).leaky_relu(0.2).avg_pool2d(2, padding=1, count_include_pad=False)
    y = y.max_pool2d(2, stride=1).flatten(1).layernorm(eps=1e-6)
    z = (v.float() * 2.5 - 1.0).clip(-3.0, 3.0).gelu("tanh").log_softmax()
    g = z.gather(1, idx)
    c = z.cumsum(1, exclusive=True).flip(1).pad([(0, 0), (1, 2)], value=-1.5)[:, 1:-1]
    m = ((z > 0.5).where(z, -z) ** 2.0).cat(z.exp(), dim=1).transpose(0, 1).T.mean(1, keepdim=True)
    k = (idx * 2 + 1).eq(idx).where(idx, idx.take(Tensor.input("j", (2,), dtype="i32"), axis=1)[:, :1])
    graph = y.graph("y", outputs={"g": g, "c": c, "m": m, "k": k}, symbols={"B": 2})
    roundtrip(graph)


def test_unusual_names_literals_and_sizes_roundtrip():
    d = {
        "name": "odd", "symbols": {"n'": 3},
        "signature": {"inputs": [{"tensor": "input.1"}, {"tensor": "graph"}, {"tensor": "f32"},
                                 {"tensor": "s", "role": "state", "mutability": "mutable", "storage": "arena"}],
                      "outputs": [{"tensor": "onnx::Out_7"}, {"tensor": "true"}, {"tensor": "f32"}]},
        "tensors": {"input.1": {"dtype": "fp32", "shape": ["n'", 4]}, "graph": {"dtype": "fp32", "shape": [4]},
                    "f32": {"dtype": "bf16", "shape": ["M"]}, "s": {"dtype": "fp32", "shape": []}},
        "graph": [
            {"op": "Elementwise", "fn": "pow", "inputs": [-2.0, "graph"], "outputs": ["p"]},
            {"op": "Elementwise", "fn": "add", "inputs": ["input.1", "p"], "outputs": ["a b"]},
            {"op": "Elementwise", "fn": "max", "inputs": ["a b", {"const": "-inf"}], "outputs": ["m"]},
            {"op": "Elementwise", "fn": "where", "inputs": [True, "m", {"const": "nan"}], "outputs": ["w"]},
            {"op": "Reshape", "inputs": ["w"], "outputs": ["r"], "attrs": {"shape": ["2*n'", -1], "note": "2*n'"}},
            {"op": "Elementwise", "fn": "mul", "inputs": ["r", "s"], "outputs": ["onnx::Out_7"]},
            {"op": "Elementwise", "fn": "neg", "inputs": ["onnx::Out_7"], "outputs": ["true"]},
            {"op": "gemm", "inputs": ["r", "r2"], "outputs": ["unused"], "attrs": {"acc_dtype": "fp32"}},
            {"op": "Permute", "inputs": ["r"], "outputs": ["r2"]},
        ],
    }
    g = Graph.from_json(d)
    text = roundtrip(g)
    assert "`input.1`" in text and "`graph`" in text and "`true`" in text and "`n'`" in text
    assert "(-2.0) ** `graph`" in text and "-inf" in text and "nan" in text
    assert 'note="2*n\'"' not in text                  # a size expression is written unquoted
    assert "matmul(r, r2, acc_dtype=f32)" in text      # the alias 'gemm' is written as the op it stands for


def test_names_that_cannot_be_written_are_refused():
    g = Graph.from_json({"signature": {"inputs": ["a`b"], "outputs": ["y"]},
                         "tensors": {"a`b": {"dtype": "fp32", "shape": [2]}},
                         "graph": [{"op": "Elementwise", "fn": "relu", "inputs": ["a`b"], "outputs": ["y"]}]})
    with pytest.raises(KumikoError) as e:
        decompile(g)
    assert e.value.code == "E1010" and "backtick" in e.value.why


# ------------------------------------------------------------------------------------------------
# imported ONNX models

onnx = pytest.importorskip("onnx")


def _model(nodes, inputs, outputs, inits=()):
    from onnx import TensorProto, helper
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _import(model):
    from kumiko.frontend.onnx_import import from_onnx
    return from_onnx(model)


def test_small_onnx_cnn_roundtrips_and_runs():
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv.weight")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "conv.bias")
    fc = numpy_helper.from_array(rng.standard_normal((36, 5)).astype(np.float32), "fc.weight")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "flat_shape")
    nodes = [helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                              pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["/conv/Conv_output_0"], ["/relu/Relu_output_0"]),
             helper.make_node("MaxPool", ["/relu/Relu_output_0"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["pool", "flat_shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "fc.weight"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    g = _import(_model(nodes, [("input", ["batch", 3, 12, 12])], [("probs", ["batch", 5])], [w, b, fc, shape]))
    text = roundtrip(g)
    assert "`/conv/Conv_output_0`" in text
    back = parse_program(text)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    want = compiler.compile(g)(input=x)["probs"]
    got = compiler.compile(back)(input=x, **{k: v for k, v in g.params.items()})["probs"]
    np.testing.assert_array_equal(got, want)


def test_every_importable_onnx_node_test_roundtrips():
    """onnx's own node tests: every model the importer accepts must survive decompile + parse."""
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    done, failed = 0, []
    for t in tests:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = _import(t.model)
        except Exception:      # unsupported by the importer: not this test's business
            continue
        try:
            back = parse_program(decompile(g))
            if _norm(back) != _norm(g) or _tiny(back) != _tiny(g):
                failed.append(f"{t.name}: differs")
        except KumikoError as e:
            failed.append(f"{t.name}: {e.why}")
        done += 1
    assert done >= 100, f"only {done} node tests imported"
    assert not failed, "\n".join(failed[:20])
