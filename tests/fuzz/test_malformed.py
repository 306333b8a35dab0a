"""Hostile-input fuzzing: mutated graph JSON, DSL programs and ONNX models.

Every mutated file must end in one of two ways: a diagnostic (``KumikoError``; the CLI exits with 2),
or a program that runs and matches the evaluator on fresh random inputs. Any other exception is a bug
(a traceback where a user should have read a diagnostic), and so is a temporary file left behind in
the cache. Under CI the draws are derandomized (tests/conftest.py).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kumiko
from kumiko.accuracy import compare
from kumiko.diagnostics import KumikoError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JSON_FILES = sorted(EXAMPLES.glob("*.json"))
DSL_FILES = sorted(EXAMPLES.glob("*.kumiko"))
#: examples per test; ``KUMIKO_FUZZ_EXAMPLES=2000 pytest tests/fuzz`` hunts longer than CI does
FUZZ = settings(max_examples=int(os.environ.get("KUMIKO_FUZZ_EXAMPLES", "80")), deadline=None,
                suppress_health_check=list(HealthCheck))
#: hostile values a mutation puts anywhere in a graph file
HOSTILE: list[Any] = [None, -1, 0, 1, 3, -5, 2 ** 31, 2 ** 70, 10 ** 12, 1e9, 1.5, float("nan"), "", "abc", "M",
                      "../../escaped", "fp64", "uint8", [], [0], [1, -1], [0, 0], {}, {"a": 1}, True]
#: the largest program the fuzz runs (elements of all its inputs): bigger ones are only checked
RUN_LIMIT = 1 << 20


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("KUMIKO_CACHE", str(cache))
    yield
    left = [p for p in cache.rglob("*") if p.name.endswith((".tmp", ".part")) or ".tmp" in p.suffixes]
    assert not left, f"half-written files left in the cache: {left}"


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indices), the root included."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, path + (i,))
    return out


def _mutate(doc: Any, data) -> Any:
    """One structural mutation of a JSON document: replace, delete, duplicate or swap at a drawn path."""
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths), label="path")
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    how = data.draw(st.sampled_from(["replace", "replace", "delete", "duplicate", "swap"]), label="how")
    if how == "replace":
        parent[key] = copy.deepcopy(data.draw(st.sampled_from(HOSTILE), label="value"))
    elif how == "delete":
        del parent[key]
    elif how == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif how == "swap" and isinstance(parent, list) and len(parent) > 1:
        j = data.draw(st.integers(0, len(parent) - 1), label="with")
        parent[key], parent[j] = parent[j], parent[key]
    return doc


def _small_enough(exe) -> bool:
    try:
        ins = exe.random_inputs(0)
    except KumikoError:
        return False
    return sum(a.size for a in ins.values()) <= RUN_LIMIT


def _run_or_diagnose(program) -> None:
    """Compile for cpu and compare with the evaluator; a KumikoError anywhere is an accepted ending
    except a result mismatch."""
    try:
        ref = kumiko.compile(program, "eval")
        if not _small_enough(ref):
            return
        ins = ref.random_inputs(1)
        want = ref(**ins)
        got = kumiko.compile(program, "cpu")(**ins)
    except KumikoError as e:
        assert e.code != "E1705", e.render()
        return
    bad = [c for c in compare(got, want) if not c.ok]
    assert not bad, f"cpu differs from the evaluator: {[c.to_json() for c in bad]}"


@FUZZ
@given(data=st.data())
def test_mutated_graph_json_is_a_diagnostic_or_a_right_answer(data, tmp_path):
    src = data.draw(st.sampled_from(JSON_FILES), label="file")
    doc = json.loads(src.read_text())
    for _ in range(data.draw(st.integers(1, 3), label="n")):
        doc = _mutate(doc, data)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    try:
        program = kumiko.load(path)
    except KumikoError:
        return
    _run_or_diagnose(program)


@FUZZ
@given(data=st.data(), cut=st.floats(0, 1))
def test_truncated_or_garbled_files_are_diagnostics(data, cut, tmp_path):
    src = data.draw(st.sampled_from(JSON_FILES + DSL_FILES), label="file")
    text = src.read_text()
    k = int(cut * len(text))
    how = data.draw(st.sampled_from(["truncate", "delete", "insert", "replace"]), label="how")
    junk = data.draw(st.sampled_from(["(", ")", "{", "}", "[", "]", ",", "-", "**", "0", "9" * 40, "\x00", "é",
                                      "//", "\"", "=", "->", "<", ">", "\n"]), label="junk")
    if how == "truncate":
        text = text[:k]
    elif how == "delete":
        text = text[:k] + text[k + data.draw(st.integers(1, 20), label="len"):]
    elif how == "insert":
        text = text[:k] + junk + text[k:]
    else:
        text = text[:k] + junk + text[k + len(junk):]
    path = tmp_path / src.name
    path.write_text(text)
    try:
        program = kumiko.load(path)
    except KumikoError:
        return
    _run_or_diagnose(program)


def _onnx_model(data):
    """A small valid ONNX model (conv, pooling, gemm or elementwise chain) built with onnx.helper."""
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    kind = data.draw(st.sampled_from(["conv", "gemm", "chain"]), label="kind")
    rng = np.random.default_rng(0)

    def init(name, shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    if kind == "conv":
        nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3]),
                 h.make_node("Relu", ["c"], ["r"]),
                 h.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
        x_shape, inits = [1, 3, 8, 8], [init("w", (4, 3, 3, 3))]
    elif kind == "gemm":
        nodes = [h.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1, alpha=1.0),
                 h.make_node("Softmax", ["g"], ["y"], axis=-1)]
        x_shape, inits = [4, 6], [init("w", (5, 6)), init("b", (5,))]
    else:
        nodes = [h.make_node("Mul", ["x", "s"], ["m"]), h.make_node("ReduceMean", ["m"], ["r"], axes=[1],
                                                                      keepdims=1),
                 h.make_node("Sub", ["m", "r"], ["y"])]
        x_shape, inits = [3, 7], [init("s", (7,))]
    g = h.make_graph(nodes, "fuzz", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return onnx, h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@FUZZ
@given(data=st.data())
def test_mutated_onnx_models_are_a_diagnostic_or_a_right_answer(data, tmp_path):
    onnx, m = _onnx_model(data)
    how = data.draw(st.sampled_from(["attr", "attr", "dims", "opset", "op_type", "drop_input", "bytes"]),
                    label="how")
    if how == "attr":
        node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
        if node.attribute:
            a = data.draw(st.sampled_from(list(node.attribute)), label="attribute")
            if a.ints:
                a.ints[data.draw(st.integers(0, len(a.ints) - 1), label="at")] = \
                    data.draw(st.sampled_from([0, -1, -3, 2 ** 40, 9]), label="int")
            elif a.type == onnx.AttributeProto.INT:
                a.i = data.draw(st.sampled_from([0, -1, -7, 2 ** 40, 5]), label="i")
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = data.draw(st.sampled_from([float("nan"), -1.0, 1e30, 0.0]), label="f")
    elif how == "dims" and m.graph.initializer:
        t = data.draw(st.sampled_from(list(m.graph.initializer)), label="init")
        t.dims[data.draw(st.integers(0, len(t.dims) - 1), label="dim")] = \
            data.draw(st.sampled_from([0, -2, 1, 99]), label="size")
    elif how == "opset":
        m.opset_import[0].version = data.draw(st.sampled_from([1, 3, 6, 99, 10 ** 6]), label="version")
    elif how == "op_type":
        node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
        node.op_type = data.draw(st.sampled_from(["Relu", "Add", "Conv", "NoSuchOp", "Gemm", "Flatten"]),
                                 label="op")
    elif how == "drop_input":
        node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
        del node.input[data.draw(st.integers(0, len(node.input) - 1), label="input")]
    raw = m.SerializeToString()
    if how == "bytes":
        k = data.draw(st.integers(0, len(raw) - 1), label="byte")
        raw = raw[:k] + bytes([raw[k] ^ 0x5A]) + raw[k + 1:] if data.draw(st.booleans(), label="flip") else raw[:k]
    path = tmp_path / "m.onnx"
    path.write_bytes(raw)
    try:
        program = kumiko.from_onnx(str(path))
    except KumikoError:
        return
    _run_or_diagnose(program)


def test_the_fuzz_reaches_both_endings(tmp_path):
    """The suite can fail: an unmutated example runs and matches, a broken one is a diagnostic."""
    _run_or_diagnose(kumiko.load(EXAMPLES / "gemm_bias_relu.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "graph": [')
    with pytest.raises(KumikoError):
        kumiko.load(bad)
