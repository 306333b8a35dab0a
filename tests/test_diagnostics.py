"""Every diagnostic code the frontend, Tiny IR and runtime-input layers can raise, triggered on purpose.

Each case checks the code, its kind (from ``diagnostics.CODES``) and that ``at``, ``why`` and
``suggestion`` say something. Codes are triggered through frontend JSON graphs and, where the code
applies to Tiny IR, through Tiny IR JSON dumps (``kumiko.tiny.load``). The command line turns every
diagnostic - a malformed JSON file included - into a readable message and exit status 2.
"""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.cli import main
from kumiko.compiler import load_json
from kumiko.diagnostics import CODES, KumikoError
from kumiko.frontend.graph import Graph
from kumiko.tiny import load as load_tiny
from kumiko.tiny import to_json

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.json"))

#: the codes this layer owns (frontend, Tiny IR, runtime inputs)
LAYER_CODES = [f"E10{k:02d}" for k in range(1, 17)]


def check_diag(err: KumikoError, code: str) -> None:
    assert err.code == code, f"expected {code}, got {err.code}: {err}"
    assert err.kind == CODES[code][0]
    assert isinstance(err.at, str) and err.at.strip()
    assert isinstance(err.why, str) and err.why.strip()
    assert isinstance(err.suggestion, str) and err.suggestion.strip()
    text = str(err)
    assert code in text and err.kind in text and err.why in text
    d = err.to_dict()
    assert (d["code"], d["kind"], d["at"], d["why"], d["suggestion"]) == (code, err.kind, err.at, err.why,
                                                                         err.suggestion)
    json.dumps(d)   # always JSON-serialisable
    json.loads(err.to_json())


def expect(code: str, fn) -> KumikoError:
    with pytest.raises(KumikoError) as e:
        fn()
    check_diag(e.value, code)
    return e.value


# ------------------------------------------------------------------------------------------------
# frontend JSON graphs


def fgraph(inputs: dict, nodes: list, outputs: list, **extra) -> dict:
    """inputs: name -> (dtype, shape)."""
    d = {"kumiko": "frontend", "version": 1, "name": "diag",
         "signature": {"inputs": [{"tensor": n} for n in inputs], "outputs": [{"tensor": o} for o in outputs]},
         "tensors": {n: {"dtype": dt, "shape": list(s)} for n, (dt, s) in inputs.items()},
         "graph": nodes}
    d.update(extra)
    return d


def node(op, ins, outs, fn=None, name=None, **attrs):
    n = {"op": op, "name": name or f"{op.lower()}_{'_'.join(outs)}", "inputs": ins, "outputs": outs}
    if fn is not None:
        n["fn"] = fn
    if attrs:
        n["attrs"] = attrs
    return n


X23 = {"x": ("fp32", [2, 3])}


def one(op, ins=("x",), inputs=None, fn=None, **attrs) -> dict:
    return fgraph(inputs or X23, [node(op, list(ins), ["y"], fn=fn, **attrs)], ["y"])


def _cycle() -> dict:
    return fgraph(X23, [node("Elementwise", ["x", "b"], ["a"], fn="add"),
                        node("Elementwise", ["a"], ["b"], fn="neg")], ["b"])


def _self_loop() -> dict:
    return fgraph(X23, [node("Elementwise", ["x", "a"], ["a"], fn="add")], ["a"])


FRONTEND_CASES = {
    "E1001": [
        one("Elementwise", ["x", "z"], {**X23, "z": ("fp32", [4, 3])}, fn="add"),
        one("Expand", shape=[2, 4]),
        one("Expand", shape=[3]),
        one("Elementwise", ["c", "x", "z"], {**X23, "c": ("bool", [2, 3]), "z": ("fp32", [5])}, fn="where"),
        fgraph({"q": ("fp32", [4, 8]), "k": ("fp32", [5, 8]), "v": ("fp32", [5, 8]), "m": ("bool", [3, 5])},
               [node("Attention", ["q", "k", "v", "m"], ["o"])], ["o"]),
    ],
    "E1002": [
        one("Reshape", shape=[4, 2]),
        one("Reshape", shape=[-1, 4]),
        fgraph({"x": ("fp32", ["M", 3])}, [node("Reshape", ["x"], ["y"], shape=["M", 2])], ["y"]),
    ],
    "E1003": [
        one("Permute", perm=[0, 0]),
        one("Permute", perm=[1]),
        one("Transpose", perm=[0, 2]),
    ],
    "E1005": [
        one("Elementwise", ["x", "h"], {**X23, "h": ("fp16", [2, 3])}, fn="add"),
        one("Elementwise", ["x", "i"], {**X23, "i": ("i32", [2, 3])}, fn="lt"),
        one("Elementwise", ["x", "x", "x"], fn="where"),   # a float condition is not a bool
        one("MatMul", ["x", "w"], {**X23, "w": ("bf16", [3, 2])}),
        one("Concat", ["x", "i"], {**X23, "i": ("i32", [2, 3])}, axis=0),
        one("Elementwise", ["i", 2.5], {"i": ("i32", [2, 3])}, fn="lt"),       # 2.5 -> 2 would change the answer
        one("Elementwise", ["i", 0.5], {"i": ("i32", [2, 3])}, fn="mul"),
        one("Elementwise", ["c", "i", 1.5], {"c": ("bool", [2, 3]), "i": ("i32", [2, 3])}, fn="where"),
        one("Elementwise", inputs={"i": ("i32", [2, 3])}, ins=["i"], fn="clip", min=0.5),
    ],
    "E1006": [
        one("Frobnicate"),
        one("Elementwise", fn="bogus"),
        one("Reduce", fn="prod"),
    ],
    "E1007": [
        one("Elementwise", ["nope"], fn="neg"),
        one("Elementwise", ["x", "ghost"], fn="add"),
    ],
    "E1008": [_cycle(), _self_loop()],
    "E1009": [
        [1, 2, 3],
        {"signature": {"inputs": [], "outputs": []}, "tensors": {}},                  # no 'graph'
        {**one("Elementwise", fn="neg"), "graph": {"op": "x"}},                        # graph not a list
        {**one("Elementwise", fn="neg"), "signature": {"inputs": [{"role": "data"}], "outputs": ["y"]}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": ["x"], "outputs": [5]}},
        fgraph(X23, [{"name": "n", "inputs": ["x"], "outputs": ["y"]}], ["y"]),        # op without 'op'
        fgraph(X23, [{"op": "Elementwise", "fn": "neg", "inputs": ["x"], "outputs": []}], ["y"]),
        fgraph(X23, [{"op": "Elementwise", "fn": "neg", "inputs": "x", "outputs": ["y"]}], ["y"]),
        fgraph(X23, [{"op": "Elementwise", "fn": "neg", "inputs": ["x"], "outputs": ["y"], "attrs": [1]}], ["y"]),
        fgraph(X23, [{"op": "Elementwise", "fn": ["neg"], "inputs": ["x"], "outputs": ["y"]}], ["y"]),
        {**one("Elementwise", fn="neg"), "tensors": {"x": {"dtype": "fp32"}}},         # no shape
        {**one("Elementwise", fn="neg"), "tensors": {"x": {"dtype": "fp32", "shape": ["M+"]}}},
        {**one("Elementwise", fn="neg"), "tensors": {"x": {"dtype": "fp32", "shape": [-2, 3]}}},
        {**one("Elementwise", fn="neg"), "symbols": {"M": "big"}},
        one("Elementwise", fn="add"),                                                  # arity
        one("Elementwise", [1.0], fn="neg"),                                           # no tensor operand
        one("MatMul", ["x"]),
        fgraph(X23, [node("Elementwise", ["x"], ["y", "z"], fn="neg")], ["y"]),       # one result, two names
        one("Elementwise", ["x", {"const": [1]}], fn="add"),
    ],
    "E1010": [
        one("Softmax", axis=2),
        one("Reduce", fn="sum", axes=[5]),
        one("Reshape", shape=[-1, -1]),
        one("Pad", pads=[[1, 1]]),
        one("Slice", starts=[0], ends=[2], steps=[0]),
        one("Slice", starts=[0, 1], ends=[2]),
        one("Shrink", bounds=[[0, 1]]),
        one("Flip", axes=[3]),
        one("Gather", ["x", "i"], {**X23, "i": ("i32", [2, 3])}, mode="scatter"),
        one("MaxPool", inputs={"x": ("fp32", [1, 4, 4])}),                             # no kernel
        one("MaxPool", inputs={"x": ("fp32", [1, 4, 4])}, kernel=[2, 2, 2]),
        one("AvgPool", inputs={"x": ("fp32", [1, 4, 4])}, kernel=2, padding=-1),
        fgraph({"x": ("fp32", [1, 1, 4, 4]), "w": ("fp32", [1, 1, 2, 2])},
               [node("Conv2D", ["x", "w"], ["y"], stride=[1, 1, 1])], ["y"]),
        fgraph({"x": ("fp32", [1, 1, 4, 4]), "w": ("fp32", [1, 1, 2, 2])},
               [node("Conv2D", ["x", "w"], ["y"], groups="two")], ["y"]),
        one("MatMul", ["v", "w"], {"v": ("fp32", [3]), "w": ("fp32", [3, 2])}, trans_a=True),
        one("Reshape", shape="2x3"),
        one("Elementwise", fn="leaky_relu", alpha="big"),
        fgraph({"q": ("fp32", [4, "D"]), "k": ("fp32", [5, "D"]), "v": ("fp32", [5, 8])},
               [node("Attention", ["q", "k", "v"], ["o"])], ["o"]),                   # symbolic head, no scale
    ],
    "E1011": [
        one("MatMul", ["x", "w"], {**X23, "w": ("fp32", [4, 2])}),
        one("MatMul", ["s", "x"], {**X23, "s": ("fp32", [])}),
        fgraph(X23, [node("Elementwise", ["x"], ["y"], fn="neg")], ["y"], tensors={
            "x": {"dtype": "fp32", "shape": [2, 3]}, "y": {"dtype": "fp32", "shape": [3, 2]}}),
        fgraph(X23, [node("Elementwise", ["x"], ["y"], fn="neg")], ["y"], tensors={
            "x": {"dtype": "fp32", "shape": [2, 3]}, "y": {"dtype": "fp16", "shape": [2, 3]}}),
        fgraph({"x": ("fp32", [1, 4, 5, 5]), "w": ("fp32", [2, 3, 3, 3])},
               [node("Conv2D", ["x", "w"], ["y"])], ["y"]),                             # channels
        fgraph({"x": ("fp32", [1, 4, 5, 5]), "w": ("fp32", [3, 2, 3, 3])},
               [node("Conv2D", ["x", "w"], ["y"], groups=2)], ["y"]),                   # Cout % groups
        fgraph({"x": ("fp32", [1, 1, 2, 2]), "w": ("fp32", [1, 1, 3, 3])},
               [node("Conv2D", ["x", "w"], ["y"])], ["y"]),                             # kernel too big
        fgraph({"x": ("fp32", [1, 2, 5, 5]), "w": ("fp32", [3, 2, 3, 3]), "b": ("fp32", [2])},
               [node("Conv2D", ["x", "w", "b"], ["y"])], ["y"]),                        # bias shape
        one("Concat", ["x", "z"], {**X23, "z": ("fp32", [3, 3])}, axis=1),
        one("LayerNorm", ["x", "w"], {**X23, "w": ("fp32", [2])}),
        one("Gather", ["x", "i"], {**X23, "i": ("i32", [4, 4])}, axis=1),
        fgraph({"q": ("fp32", [4, 8]), "k": ("fp32", [5, 8]), "v": ("fp32", [6, 8])},
               [node("Attention", ["q", "k", "v"], ["o"])], ["o"]),
        one("MaxPool", inputs={"x": ("fp32", [4, 4])}, kernel=2),
        one("CumSum", inputs={"s": ("fp32", [])}, ins=["s"]),
    ],
    "E1012": [
        {**one("Elementwise", fn="neg"), "tensors": {"x": {"dtype": "fp8", "shape": [2, 3]}}},
        {**one("Elementwise", fn="neg"), "tensors": {"x": {"dtype": "int64", "shape": [2, 3]}}},
        one("Cast", to="int8"),
        one("Elementwise", inputs={"x": ("i32", [2, 3])}, fn="exp"),
        one("Elementwise", inputs={"x": ("bool", [2, 3])}, fn="neg"),
        one("Elementwise", ["x", "x"], {"x": ("i32", [2, 3])}, fn="div"),
        one("Reduce", inputs={"x": ("bool", [2, 3])}, fn="sum"),
        one("Reduce", inputs={"x": ("i32", [2, 3])}, fn="mean"),
        one("Softmax", inputs={"x": ("i32", [2, 3])}),
        one("Gather", ["x", "i"], {**X23, "i": ("fp32", [2, 3])}, axis=1),
        one("MatMul", ["b", "b"], {"b": ("bool", [3, 3])}),
        one("MatMul", ["x", "w"], {**X23, "w": ("fp32", [3, 2])}, acc_dtype="fp8"),
    ],
    "E1013": [
        fgraph(X23, [node("Elementwise", ["x"], ["y"], fn="neg")], ["y"], tensors={}),
        {**one("Elementwise", fn="neg"), "signature": {"inputs": [{"tensor": "x", "role": "weights"}],
                                                       "outputs": ["y"]}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": [{"tensor": "x", "mutability": "frozen"}],
                                                       "outputs": ["y"]}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": ["x", "x"], "outputs": ["y"]}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": ["x"], "outputs": ["zz"]}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": ["x"], "outputs": []}},
        {**one("Elementwise", fn="neg"), "signature": {"inputs": ["x"], "outputs": ["y", "y"]}},
    ],
    "E1016": [
        fgraph(X23, [node("Elementwise", ["x"], ["y"], fn="neg", name="same"),
                     node("Elementwise", ["y"], ["z"], fn="neg", name="same")], ["z"]),
        fgraph(X23, [node("Elementwise", ["x"], ["y"], fn="neg", name="a"),
                     node("Elementwise", ["x"], ["y"], fn="relu", name="b")], ["y"]),   # a tensor defined twice
        fgraph(X23, [node("Elementwise", ["x"], ["x"], fn="neg")], ["x"]),                 # redefines an input
    ],
}


@pytest.mark.parametrize("code,k,graph", [(c, k, g) for c, gs in FRONTEND_CASES.items() for k, g in enumerate(gs)],
                         ids=[f"{c}-{k}" for c, gs in FRONTEND_CASES.items() for k in range(len(gs))])
def test_frontend_json_diagnostics(code, k, graph):
    d = json.loads(json.dumps(graph))
    expect(code, lambda: Graph.from_json(d))
    expect(code, lambda: load_json(json.loads(json.dumps(graph))))


def test_op_diagnostics_name_the_op():
    err = expect("E1011", lambda: Graph.from_json(one("MatMul", ["x", "w"], {**X23, "w": ("fp32", [4, 2])})))
    assert "matmul_y" in err.at and "MatMul" in err.at
    err = expect("E1001", lambda: Graph.from_json(one("Elementwise", ["x", "z"], {**X23, "z": ("fp32", [4, 3])},
                                                      fn="add")))
    assert "add" in err.at
    err = expect("E1008", lambda: Graph.from_json(_cycle()))
    assert "'a'" in err.why or "'b'" in err.why


def test_tensor_api_raises_at_the_faulty_line():
    a, b = Tensor.input("a", (2, 3)), Tensor.input("b", (4, 3))
    expect("E1001", lambda: a + b)
    expect("E1011", lambda: a @ b)
    expect("E1002", lambda: a.reshape(5))
    expect("E1003", lambda: a.permute(0, 0))
    expect("E1005", lambda: a + Tensor.input("h", (2, 3), "fp16"))
    expect("E1012", lambda: Tensor.input("i", (2,), "i32").exp())


# ------------------------------------------------------------------------------------------------
# Tiny IR JSON dumps


def inp(nid, name, shape, dtype="fp32"):
    return {"id": nid, "uop": "INPUT", "arg": {"tensor_id": name, "dtype": dtype, "shape": shape}}


def u(nid, uop, src=(), **arg):
    d = {"id": nid, "uop": uop, "src": list(src)}
    if arg:
        d["arg"] = arg
    return d


def tiny(*uops, **extra):
    return {"uops": list(uops), **extra}


A, B = inp("a", "A", [2, 3]), inp("b", "B", [3, 2])
A16, AI, AB = inp("h", "H", [2, 3], "fp16"), inp("i", "I", [2, 3], "i32"), inp("c", "C", [2, 3], "bool")

TINY_CASES = {
    "E1001": [
        tiny(A, B, u("n", "ADD", ["a", "b"])),
        tiny(A, u("n", "EXPAND", ["a"], result_shape=[4, 3])),
        tiny(A, u("n", "EXPAND", ["a"], result_shape=[1, 2, 3])),   # EXPAND keeps the rank
    ],
    "E1002": [tiny(A, u("n", "RESHAPE", ["a"], result_shape=[4]))],
    "E1003": [tiny(A, u("n", "PERMUTE", ["a"], perm=[0, 0])), tiny(A, u("n", "PERMUTE", ["a"], perm=[1, 0, 2]))],
    "E1004": [tiny(A, u("n", "REDUCE", ["a"], op="SUM", axes=[1])),
              tiny(A, u("n", "REDUCE", ["a"], op="MAX", axes=[0], dtype=""))],
    "E1005": [tiny(A, A16, u("n", "ADD", ["a", "h"])), tiny(A, u("n", "WHERE", ["a", "a", "a"])),
              tiny(A, AI, u("n", "CMPLT", ["a", "i"]))],
    "E1006": [tiny(A, u("n", "FROB", ["a"])), tiny(A, u("n", "CONTRACT", ["a", "a"]))],
    "E1007": [tiny(A, u("n", "NEG", ["zz"])), tiny(A, u("n", "NEG", ["a"]), outputs=[{"tensor": "y", "node": "q"}])],
    "E1008": [tiny(A, u("p", "ADD", ["a", "q"]), u("q", "NEG", ["p"])), tiny(A, u("p", "ADD", ["a", "p"]))],
    "E1009": [
        {"nodes": []},
        {"uops": {"id": "a"}},
        tiny({"uop": "NEG", "src": ["a"]}),
        tiny(A, u("n", "ADD", ["a"])),                  # arity
        tiny(A, u("n", "RESHAPE", [1.0], result_shape=[6])),
        tiny(A, u("n", "ADD", ["a", [1, 2]])),          # an immediate must be a scalar
        tiny(A, u("n", "NEG", ["a"]), outputs=[{"tensor": 5, "node": "n"}]),
    ],
    "E1010": [
        tiny(A, u("n", "REDUCE", ["a"], op="PROD", axes=[0], dtype="fp32")),
        tiny(A, u("n", "REDUCE", ["a"], op="SUM", axes=[2], dtype="fp32")),
        tiny(A, u("n", "PAD", ["a"], pad=[[0, 0], [-1, 0]], value=0)),
        tiny(A, u("n", "PAD", ["a"], pad=[[0, 0]], value=0)),
        tiny(A, u("n", "PAD", ["a"], pad=[[0, 0], [1, 0]], value="x")),
        tiny(A, u("n", "SHRINK", ["a"], lo=[0, 0], hi=[2, 3], step=[1, 0])),
        tiny(A, u("n", "SHRINK", ["a"], lo=[0, 2], hi=[2, 1])),
        tiny(A, u("n", "SHRINK", ["a"], lo=[0, 0], hi=[2, 4])),
        tiny(A, u("n", "FLIP", ["a"], axes=[1, 1])),
        tiny(A, u("n", "VIEW", ["a"], result_shape=[2, 3], index_map=["i0*i1", "i1"])),
        tiny(A, u("n", "VIEW", ["a"], result_shape=[2, 3], index_map=["i0"])),
        tiny(A, u("n", "VIEW", ["a"], result_shape=[2, 3], index_map=["i0", "i5"])),
        tiny(A, u("n", "RESHAPE", ["a"], result_shape=[-2, -3])),
        tiny(A, u("n", "RESHAPE", ["a"], shape=[6])),   # wrong arg name
        tiny(A, u("n", "GATHER", ["a", "a"], axis=5)),
        tiny(u("k", "CONST", dtype="fp32")),
    ],
    "E1011": [
        tiny(A, {**u("n", "NEG", ["a"]), "shape": [3, 2]}),
        tiny(A, {**u("n", "NEG", ["a"]), "dtype": "fp16"}),
        tiny(A, inp("j", "J", [2, 4], "i32"), u("n", "GATHER", ["a", "j"], axis=0)),
    ],
    "E1012": [
        tiny(inp("a", "A", [2], "int8")),
        tiny(inp("a", "A", [2], "i64")),
        tiny(AI, u("n", "EXP2", ["i"])),
        tiny(AB, u("n", "NEG", ["c"])),
        tiny(AI, u("n", "FDIV", ["i", "i"])),
        tiny(A, u("n", "CAST", ["a"], to="fp8")),
        tiny(A, u("n", "REDUCE", ["a"], op="SUM", axes=[0], dtype="fp7")),
        tiny(A, u("n", "GATHER", ["a", "a"], axis=0)),
    ],
    "E1016": [tiny(A, u("a", "NEG", ["a"])), tiny(A, u("n", "NEG", ["a"]), u("n", "RELU", ["a"]))],
}


@pytest.mark.parametrize("code,k,graph", [(c, k, g) for c, gs in TINY_CASES.items() for k, g in enumerate(gs)],
                         ids=[f"{c}-{k}" for c, gs in TINY_CASES.items() for k in range(len(gs))])
def test_tiny_json_diagnostics(code, k, graph):
    expect(code, lambda: load_tiny(json.loads(json.dumps(graph))))
    if isinstance(graph, dict) and "uops" in graph:
        expect(code, lambda: load_json(json.loads(json.dumps(graph))))   # kumiko.load's dispatch


def test_valid_tiny_dump_loads_and_runs():
    g = tiny(A, B, u("p", "RESHAPE", ["a"], result_shape=[2, 3, 1]), u("q", "PERMUTE", ["b"], perm=[1, 0]),
             u("r", "RESHAPE", ["q"], result_shape=[1, 2, 3]), u("pe", "EXPAND", ["p"], result_shape=[2, 3, 2]),
             u("re", "PERMUTE", ["r"], perm=[0, 2, 1]), u("ree", "EXPAND", ["re"], result_shape=[2, 3, 2]),
             u("m", "MUL", ["pe", "ree"]), u("s", "REDUCE", ["m"], op="SUM", axes=[1], dtype="fp32"))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    out = kumiko.compile(load_tiny(g))(A=a, B=b)
    np.testing.assert_allclose(out["s"], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# runtime inputs: E1014 and E1015, through a frontend graph and through a Tiny IR dump


def _runtime_programs():
    g = Graph.from_json(fgraph({"x": ("fp32", ["M", 3]), "y": ("fp32", ["2*N"])},
                               [node("Reduce", ["x"], ["s"], fn="sum"), node("Elementwise", ["y"], ["t"], fn="neg")],
                               ["s", "t"]))
    t = load_tiny(tiny(inp("x", "x", ["M", 3]), inp("y", "y", ["2*N"]),
                       u("s", "REDUCE", ["x"], op="SUM", axes=[0, 1], dtype="fp32"), u("t", "NEG", ["y"])))
    return [g, t, load_tiny(json.loads(json.dumps(to_json(g.tiny))))]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["frontend", "tiny", "tiny-dump-of-frontend"])
def test_runtime_input_diagnostics(which):
    exe = kumiko.compile(_runtime_programs()[which])
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    err = expect("E1014", lambda: exe(x=x, y=y))              # N appears only as 2*N: nothing binds it
    assert "N" in err.why
    expect("E1014", lambda: exe.random_inputs(0, {"M": 2}))
    ins = exe.random_inputs(0, {"M": 2, "N": 3})
    assert ins["x"].shape == (2, 3) and ins["y"].shape == (6,)
    expect("E1015", lambda: exe(x=x.astype(np.float64), y=y))
    expect("E1015", lambda: exe(x=x[:, :2], y=y))             # concrete dim 3
    expect("E1015", lambda: exe(x=x[None], y=y))              # rank
    expect("E1015", lambda: exe(x=x))                         # missing
    expect("E1015", lambda: exe(x=x, y=y, z=y))               # unexpected


def test_unbound_symbol_created_inside_the_graph_is_e1014():
    """An Expand to a size no input's shape fixes is a symbol without a value at run time."""
    g = Graph.from_json(fgraph({"x": ("fp32", [1, 3])}, [node("Expand", ["x"], ["y"], shape=["R", 3])], ["y"]))
    err = expect("E1014", lambda: kumiko.compile(g)(x=np.ones((1, 3), np.float32)))
    assert "R" in err.why


# ------------------------------------------------------------------------------------------------
# no traceback for any malformed graph: random structural damage to valid files


REPLACEMENTS = [None, 1, -1, 0, 2.5, "x", "M", [], {}, [1], ["x"], {"a": 1}, True, [[1, 2]], {"const": "inf"},
                {"const": [1]}, "fp64", [-1], [0.5, 2]]


def _paths(d, pre=()):
    yield pre
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _paths(v, pre + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _paths(v, pre + (i,))


def _damage(d, rnd: random.Random):
    d = copy.deepcopy(d)
    for _ in range(rnd.randint(1, 2)):
        p = rnd.choice(list(_paths(d)))
        if not p:
            return copy.deepcopy(rnd.choice(REPLACEMENTS))
        parent = d
        for k in p[:-1]:
            parent = parent[k]
        if isinstance(p[-1], str) and rnd.random() < 0.2:
            del parent[p[-1]]
        else:
            parent[p[-1]] = copy.deepcopy(rnd.choice(REPLACEMENTS))
    return d


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_damaged_graphs_give_diagnostics_not_tracebacks(path):
    rnd = random.Random(path.stem)
    base = json.loads(path.read_text())
    bases = [base, to_json(Graph.from_json(base).tiny)]
    sizes = {s: 2 for s in ("B", "H", "S", "M", "N", "K", "D", "C", "W", "Co", "x")}
    for k in range(250):
        d = _damage(bases[k % 2], rnd)
        try:
            exe = kumiko.compile(load_json(d))
            ins = exe.random_inputs(0, sizes)
            if sum(v.size for v in ins.values()) < 1e6:
                exe(**ins)
        except KumikoError as e:
            check_diag(e, e.code)


# ------------------------------------------------------------------------------------------------
# the command line


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return str(p)


MALFORMED_FILES = {
    "trailing_comma.json": '{"signature": {"inputs": [], "outputs": []},,}',
    "truncated.json": '{"signature": {"inputs": ["x"]',
    "empty.json": "",
    "not_json.json": "graph: x -> y\n",
    "binary.json": b"\xff\xfe\x00\x01garbage\x80",
    "array.json": "[1, 2, 3]",
    "no_graph.json": '{"signature": {"inputs": [], "outputs": []}, "tensors": {}}',
    "bad_uops.json": '{"uops": [{"id": "a"}]}',
}


@pytest.mark.parametrize("name", sorted(MALFORMED_FILES))
@pytest.mark.parametrize("cmd", ["run", "check", "dump"])
def test_cli_malformed_file_is_a_readable_diagnostic(tmp_path, capsys, name, cmd):
    path = _write(tmp_path, name, MALFORMED_FILES[name])
    assert main([cmd, path]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    assert "E1009" in out.err and "MalformedGraph" in out.err and "suggestion:" in out.err
    if name in ("trailing_comma.json", "truncated.json", "not_json.json", "empty.json"):
        assert "invalid JSON" in out.err and ":1:" in out.err   # file:line:column of the fault


@pytest.mark.parametrize("pos", ["before", "after"])
def test_cli_json_diagnostics(tmp_path, capsys, pos):
    path = _write(tmp_path, "bad.json", '{"a": [1, 2,, 3]}')
    argv = ["--json", "check", path] if pos == "before" else ["check", path, "--json"]
    assert main(argv) == 2
    d = json.loads(capsys.readouterr().out)
    assert isinstance(d["diagnostics"], list) and len(d["diagnostics"]) == 1
    diag = d["diagnostics"][0]
    assert diag["code"] == "E1009" and diag["kind"] == "MalformedGraph"
    assert diag["at"] and diag["why"] and diag["suggestion"]


@pytest.mark.parametrize("code,k", [("E1001", 0), ("E1005", 0), ("E1008", 0), ("E1013", 0), ("E1016", 0)])
def test_cli_graph_errors(tmp_path, capsys, code, k):
    path = _write(tmp_path, "g.json", json.dumps(FRONTEND_CASES[code][k]))
    for argv in (["check", path], ["run", path]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert code in err and CODES[code][0] in err and "Traceback" not in err
    assert main(["--json", "run", path]) == 2
    assert json.loads(capsys.readouterr().out)["diagnostics"][0]["code"] == code


def test_cli_tiny_dump_errors(tmp_path, capsys):
    path = _write(tmp_path, "t.json", json.dumps(TINY_CASES["E1004"][0]))
    assert main(["check", path]) == 2
    assert "E1004" in capsys.readouterr().err
    path = _write(tmp_path, "t2.json", json.dumps(TINY_CASES["E1003"][0]))
    assert main(["check", path, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["diagnostics"][0]["kind"] == "InvalidPermutation"


def test_cli_runtime_input_errors(tmp_path, capsys):
    gemm = str(Path(__file__).parents[1] / "examples" / "gemm_bias_relu.json")
    ins = tmp_path / "in.npz"
    np.savez(ins, A=np.ones((2, 3), np.float32), B=np.ones((4, 2), np.float32), bias=np.ones(2, np.float32))
    assert main(["run", gemm, "--inputs", str(ins)]) == 2
    assert "E1015" in capsys.readouterr().err
    np.savez(ins, A=np.ones((2, 3), np.float64), B=np.ones((3, 2), np.float32), bias=np.ones(2, np.float32))
    assert main(["run", gemm, "--inputs", str(ins)]) == 2
    assert "E1015" in capsys.readouterr().err
    sym = _write(tmp_path, "sym.json", json.dumps(fgraph({"x": ("fp32", ["M"])},
                                                          [node("Elementwise", ["x"], ["y"], fn="neg")], ["y"])))
    assert main(["run", sym]) == 2                       # no default for M, no --shapes
    assert "E1014" in capsys.readouterr().err
    assert main(["run", sym, "--shapes", "M=3"]) == 0
    capsys.readouterr()
    assert main(["run", sym, "--shapes", "M=three"]) == 2
    assert "E1010" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.json")]) == 2
    assert "E1502" in capsys.readouterr().err


def test_every_layer_code_is_exercised():
    """The tables above (plus the runtime tests) trigger every frontend/Tiny/runtime-input code."""
    covered = set(FRONTEND_CASES) | set(TINY_CASES) | {"E1014", "E1015"}
    assert covered == set(LAYER_CODES)
    assert all(c in CODES for c in LAYER_CODES)
