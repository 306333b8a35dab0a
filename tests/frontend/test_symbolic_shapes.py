"""Graphs with symbolic sizes, run at several bindings (size-1 dims included) against plain numpy.

A symbolic graph is compiled once; each call binds the symbols from the inputs' shapes. Conv and pool
output sizes are floor expressions of the symbols. Wrong inputs are diagnostics: E1015 for a shape or
dtype mismatch, E1014 for a size symbol nothing binds.
"""
from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.symbolic import Expr, dim_eval


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def make_graph(inputs: dict, nodes: list, outputs: list, symbols: dict | None = None) -> Graph:
    """inputs: name -> (dtype, shape); nodes: frontend op dicts."""
    d = {"kumiko": "frontend", "version": 1, "name": "sym",
         "signature": {"inputs": [{"tensor": n} for n in inputs], "outputs": [{"tensor": o} for o in outputs]},
         "tensors": {n: {"dtype": dt, "shape": list(s)} for n, (dt, s) in inputs.items()},
         "graph": nodes}
    if symbols:
        d["symbols"] = symbols
    return Graph.from_json(json.loads(json.dumps(d)))


def assert_rel(got, want, tol=1e-5):
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.float32
    err = np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err < tol, err


def conv_ref(x, w, stride, pad, dil):
    """Naive conv, symmetric int padding, groups=1."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n_, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out = np.zeros((n_, co, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    patch = xp[:, :, oy * stride + ky * dil, ox * stride + kx * dil]   # [N, C]
                    out[:, :, oy, ox] += patch @ w[:, :, ky, kx].T
    return out


# ------------------------------------------------------------------------------------------------


GEMM_NODES = [
    {"op": "MatMul", "name": "mm", "inputs": ["A", "B"], "outputs": ["C0"]},
    {"op": "Elementwise", "fn": "add", "name": "bias", "inputs": ["C0", "bias"], "outputs": ["C1"]},
    {"op": "Elementwise", "fn": "relu", "name": "relu", "inputs": ["C1"], "outputs": ["C2"]},
]


def gemm_graph() -> Graph:
    return make_graph({"A": ("fp32", ["M", "K"]), "B": ("fp32", ["K", "N"]), "bias": ("fp32", ["N"])},
                      GEMM_NODES, ["C2"], {"M": 4, "N": 3, "K": 5})


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 2), (7, 1, 4), (1, 6, 1), (2, 3, 9)])
def test_symbolic_gemm_at_several_bindings(m, k, n):
    g = gemm_graph()
    assert g.tensors["C2"].shape == (Expr.sym("M"), Expr.sym("N"))
    exe = kumiko.compile(g)
    rng = rng_for("gemm", m, k, n)
    a, b, bias = randn(rng, m, k), randn(rng, k, n), randn(rng, n)
    got = exe(A=a, B=b, bias=bias)["C2"]
    assert_rel(got, np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0))


def test_one_executable_serves_many_bindings():
    exe = kumiko.compile(gemm_graph())
    for m, k, n in [(2, 2, 2), (5, 1, 3), (1, 1, 1), (2, 2, 2)]:
        rng = rng_for("reuse", m, k, n)
        a, b, bias = randn(rng, m, k), randn(rng, k, n), randn(rng, n)
        assert_rel(exe(A=a, B=b, bias=bias)["C2"], np.maximum(a.astype(np.float64) @ b + bias.astype(np.float64), 0))


def test_random_inputs_use_defaults_and_overrides():
    exe = kumiko.compile(gemm_graph())
    ins = exe.random_inputs(1)
    assert ins["A"].shape == (4, 5) and ins["B"].shape == (5, 3) and ins["bias"].shape == (3,)
    ins = exe.random_inputs(1, {"M": 1, "K": 2})
    assert ins["A"].shape == (1, 2) and ins["B"].shape == (2, 3)
    assert all(np.all(v != 0) for v in ins.values())
    out = exe(**ins)["C2"]
    assert_rel(out, np.maximum(ins["A"].astype(np.float64) @ ins["B"] + ins["bias"], 0))


# conv: the output size is a floor expression of H and W


@pytest.mark.parametrize("stride,pad,dil", [(2, 1, 1), (3, 2, 2), (1, 0, 1), (2, 0, 1)])
def test_symbolic_conv_floor_output(stride, pad, dil):
    g = make_graph({"X": ("fp32", ["N", 3, "H", "W"]), "Wt": ("fp32", [4, 3, 3, 3])},
                   [{"op": "Conv2D", "name": "conv", "inputs": ["X", "Wt"], "outputs": ["Y"],
                     "attrs": {"stride": stride, "padding": pad, "dilation": dil}}], ["Y"])
    oy = g.tensors["Y"].shape[2]
    assert isinstance(oy, Expr) and oy.symbols() == {"H"}
    if stride > 1:
        assert "floor" in str(oy)
    exe = kumiko.compile(g)
    span = dil * 2 + 1
    for n, h, w in [(1, span, span), (2, span + 1, span + 4), (1, span + 2, span + 3), (1, 11, span)]:
        want_h = (h + 2 * pad - span) // stride + 1
        assert dim_eval(oy, {"H": h}) == want_h
        rng = rng_for("conv", stride, pad, dil, n, h, w)
        x, wt = randn(rng, n, 3, h, w), randn(rng, 4, 3, 3, 3)
        got = exe(X=x, Wt=wt)["Y"]
        assert got.shape[2] == want_h
        assert_rel(got, conv_ref(x, wt, stride, pad, dil))


@pytest.mark.parametrize("h,w", [(1, 1), (4, 5), (7, 6)])
def test_symbolic_pools(h, w):
    nodes = [{"op": "MaxPool", "name": "mp", "inputs": ["X"], "outputs": ["P"],
              "attrs": {"kernel": 2, "stride": 1, "padding": [1, 0]}},
             {"op": "AvgPool", "name": "ap", "inputs": ["X"], "outputs": ["Q"],
              "attrs": {"kernel": [2, 1], "stride": [2, 1], "padding": [1, 0], "count_include_pad": False}}]
    g = make_graph({"X": ("fp32", ["C", "H", "W"])}, nodes, ["P", "Q"])
    x = randn(rng_for("pool", h, w), 2, h, w)
    out = kumiko.compile(g)(X=x)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (0, 0)), constant_values=-np.inf)
    want_p = np.stack([[[xp[c, i:i + 2, j:j + 2].max() for j in range(w - 1)] for i in range(h + 1)]
                       for c in range(2)]).reshape(2, h + 1, w - 1)
    if w > 1:
        assert_rel(out["P"], want_p)
    xz = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (0, 0)))
    valid = np.pad(np.ones((h, w)), ((1, 1), (0, 0)))
    oh = (h + 2 - 2) // 2 + 1
    want_q = np.stack([[[xz[c, 2 * i:2 * i + 2, j].sum() / valid[2 * i:2 * i + 2, j].sum() for j in range(w)]
                        for i in range(oh)] for c in range(2)]).reshape(2, oh, w)
    assert_rel(out["Q"], want_q)


# normalisations and reductions whose element count is symbolic


@pytest.mark.parametrize("b,s", [(1, 1), (2, 5), (3, 1), (1, 8)])
def test_symbolic_softmax_layernorm_mean(b, s):
    nodes = [
        {"op": "Softmax", "name": "sm", "inputs": ["X"], "outputs": ["P"], "attrs": {"axis": 1}},
        {"op": "LayerNorm", "name": "ln", "inputs": ["X"], "outputs": ["L"], "attrs": {"axis": -2}},
        {"op": "Reduce", "name": "mean", "inputs": ["X"], "outputs": ["R"],
         "attrs": {"fn": "mean", "axes": [0, 1], "keepdim": True}},
        {"op": "Reduce", "name": "max", "inputs": ["X"], "outputs": ["Mx"], "attrs": {"fn": "max", "axes": [1]}},
    ]
    g = make_graph({"X": ("fp32", ["B", "S", 4])}, nodes, ["P", "L", "R", "Mx"])
    x = randn(rng_for("norm", b, s), b, s, 4) * 2
    out = kumiko.compile(g)(X=x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    assert_rel(out["P"], e / e.sum(axis=1, keepdims=True))
    mu = x64.mean(axis=(1, 2), keepdims=True)
    var = ((x64 - mu) ** 2).mean(axis=(1, 2), keepdims=True)
    assert_rel(out["L"], (x64 - mu) / np.sqrt(var + 1e-5), 1e-4 if s == 1 else 1e-5)
    assert_rel(out["R"], x64.mean(axis=(0, 1), keepdims=True))
    assert_rel(out["Mx"], x64.max(axis=1))


@pytest.mark.parametrize("b,s", [(1, 1), (2, 3), (4, 1)])
def test_symbolic_movement(b, s):
    nodes = [
        {"op": "Reshape", "name": "flat", "inputs": ["X"], "outputs": ["F"], "attrs": {"shape": [-1, 4]}},
        {"op": "Reshape", "name": "rows", "inputs": ["X"], "outputs": ["G"], "attrs": {"shape": ["B", -1]}},
        {"op": "Permute", "name": "perm", "inputs": ["X"], "outputs": ["T"], "attrs": {"perm": [2, 0, 1]}},
        {"op": "Pad", "name": "pad", "inputs": ["X"], "outputs": ["Pd"],
         "attrs": {"pads": [[0, 1], [2, 0], [1, -1]], "value": 0.5}},
        {"op": "Slice", "name": "slice", "inputs": ["Pd"], "outputs": ["Sl"],
         "attrs": {"starts": [1, 0], "ends": [-1, 3], "axes": [1, 2], "steps": [2, 2]}},
        {"op": "Concat", "name": "cat", "inputs": ["X", "Y"], "outputs": ["Ct"], "attrs": {"axis": 1}},
        {"op": "CumSum", "name": "cs", "inputs": ["Ct"], "outputs": ["Cs"], "attrs": {"axis": 1, "exclusive": True}},
        {"op": "Flip", "name": "flip", "inputs": ["X"], "outputs": ["Fl"], "attrs": {"axes": [1]}},
        {"op": "Expand", "name": "exp", "inputs": ["Z"], "outputs": ["E"], "attrs": {"shape": ["B", "S", 4]}},
    ]
    g = make_graph({"X": ("fp32", ["B", "S", 4]), "Y": ("fp32", ["B", "T", 4]), "Z": ("fp32", [1, 4])},
                   nodes, ["F", "G", "T", "Sl", "Cs", "Fl", "E"])
    assert str(g.tensors["Ct"].shape[1]) in ("S + T", "T + S")
    rng = rng_for("move", b, s)
    x, y, z = randn(rng, b, s, 4), randn(rng, b, 2, 4), randn(rng, 1, 4)
    out = kumiko.compile(g)(X=x, Y=y, Z=z)
    np.testing.assert_array_equal(out["F"], x.reshape(-1, 4))
    np.testing.assert_array_equal(out["G"], x.reshape(b, -1))
    np.testing.assert_array_equal(out["T"], np.transpose(x, (2, 0, 1)))
    pd = np.pad(x, ((0, 1), (2, 0), (1, 0)), constant_values=np.float32(0.5))[:, :, :4]
    np.testing.assert_array_equal(out["Sl"], pd[:, 1:-1:2, 0:3:2])
    ct = np.concatenate([x, y], axis=1).astype(np.float64)
    assert_rel(out["Cs"], np.cumsum(ct, axis=1) - ct)
    np.testing.assert_array_equal(out["Fl"], x[:, ::-1])
    np.testing.assert_array_equal(out["E"], np.broadcast_to(z, (b, s, 4)))


@pytest.mark.parametrize("s", [1, 2, 6])
def test_symbolic_causal_attention_and_gather(s):
    nodes = [{"op": "Attention", "name": "attn", "inputs": ["Q", "K", "V"], "outputs": ["O"],
              "attrs": {"causal": True}},
             {"op": "Gather", "name": "take", "inputs": ["V", "I"], "outputs": ["G"],
              "attrs": {"axis": 0, "mode": "take"}}]
    g = make_graph({"Q": ("fp32", ["S", 8]), "K": ("fp32", ["S", 8]), "V": ("fp32", ["S", 8]),
                    "I": ("i32", ["L"])}, nodes, ["O", "G"])
    rng = rng_for("attn", s)
    q, k, v = randn(rng, s, 8), randn(rng, s, 8), randn(rng, s, 8)
    idx = rng.integers(0, s, size=(5,)).astype(np.int32)
    out = kumiko.compile(g)(Q=q, K=k, V=v, I=idx)
    sc = q.astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(8)
    sc = np.where(np.tril(np.ones((s, s), dtype=bool)), sc, -np.inf)
    p = np.exp(sc - sc.max(axis=1, keepdims=True))
    assert_rel(out["O"], (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64))
    np.testing.assert_array_equal(out["G"], v[idx])


@pytest.mark.parametrize("m", [1, 3, 8])
def test_tensor_api_symbolic(m):
    x = Tensor.input("x", ("M", 6))
    w = Tensor.input("w", (6, 2))
    y = (x @ w).softmax(0).sum(1, keepdim=True)
    z = x.reshape(-1).cumsum()
    g = y.graph("y", outputs={"z": z}, symbols={"M": 2})
    assert g.symbol_names() == ["M"]
    rng = rng_for("tensor", m)
    xv, wv = randn(rng, m, 6), randn(rng, 6, 2)
    out = kumiko.compile(g)(x=xv, w=wv)
    s = xv.astype(np.float64) @ wv
    e = np.exp(s - s.max(axis=0))
    assert_rel(out["y"], (e / e.sum(axis=0)).sum(axis=1, keepdims=True))
    assert_rel(out["z"], np.cumsum(xv.astype(np.float64).reshape(-1)))


@pytest.mark.parametrize("m", [1, 2, 5])
def test_symbolic_indexing(m):
    x = Tensor.input("x", ("M", 3))
    outs = {"last": x[-1], "second_last": x[-2] if m >= 2 else x[0], "tail": x[1:], "head": x[:-1],
            "even": x[::2], "first": x[0]}
    g = outs["last"].graph("last", outputs={k: v for k, v in outs.items() if k != "last"})
    xv = randn(rng_for("index", m), m, 3)
    out = kumiko.compile(g)(x=xv)
    want = {"last": xv[-1], "second_last": xv[-2] if m >= 2 else xv[0], "tail": xv[1:], "head": xv[:-1],
            "even": xv[::2], "first": xv[0]}
    for k, w in want.items():
        np.testing.assert_array_equal(out[k], w, err_msg=k)


def test_symbolic_slice_ends():
    """INT_MAX ends mean "to the end"; a concrete end the bound size does not reach is E1015, not a silent clamp."""
    g = make_graph({"x": ("fp32", ["M", 2])},
                   [{"op": "Slice", "name": "s", "inputs": ["x"], "outputs": ["y"],
                     "attrs": {"starts": [1], "ends": [2 ** 31 - 1], "axes": [0]}},
                    {"op": "Slice", "name": "t", "inputs": ["x"], "outputs": ["z"],
                     "attrs": {"starts": [0], "ends": [3], "axes": [0]}}], ["y", "z"])
    assert g.tensors["y"].shape[0] == Expr.sym("M") - 1
    exe = kumiko.compile(g)
    xv = randn(rng_for("ends"), 5, 2)
    out = exe(x=xv)
    np.testing.assert_array_equal(out["y"], xv[1:])
    np.testing.assert_array_equal(out["z"], xv[:3])
    err = _expect("E1015", lambda: exe(x=xv[:2]))
    assert "M" in err.why


def test_derived_symbolic_input_dims():
    """A dim like ``2*M`` is checked against the binding other inputs give (it binds nothing itself)."""
    g = make_graph({"x": ("fp32", ["M"]), "y": ("fp32", ["2*M"])},
                   [{"op": "Reshape", "name": "r", "inputs": ["y"], "outputs": ["y2"], "attrs": {"shape": [2, "M"]}},
                    {"op": "Elementwise", "fn": "mul", "name": "m", "inputs": ["y2", "x"], "outputs": ["o"]}], ["o"])
    rng = rng_for("derived")
    x, y = randn(rng, 3), randn(rng, 6)
    np.testing.assert_array_equal(kumiko.compile(g)(x=x, y=y)["o"], y.reshape(2, 3) * x)
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g)(x=x, y=randn(rng, 7))
    assert e.value.code == "E1015"


# ------------------------------------------------------------------------------------------------
# input diagnostics


def _expect(code, fn):
    with pytest.raises(KumikoError) as e:
        fn()
    assert e.value.code == code, e.value
    assert e.value.at and e.value.why and e.value.suggestion
    return e.value


def test_input_mismatch_is_e1015():
    exe = kumiko.compile(gemm_graph())
    rng = rng_for("e1015")
    a, b, bias = randn(rng, 3, 4), randn(rng, 4, 2), randn(rng, 2)
    exe(A=a, B=b, bias=bias)   # fine
    cases = {
        "dtype fp64": dict(A=a.astype(np.float64), B=b, bias=bias),
        "dtype i32": dict(A=a, B=b.astype(np.int32), bias=bias),
        "dtype fp16": dict(A=a, B=b, bias=bias.astype(np.float16)),
        "rank": dict(A=a, B=b, bias=bias[None]),
        "inconsistent K": dict(A=a, B=randn(rng, 5, 2), bias=bias),
        "inconsistent N": dict(A=a, B=b, bias=randn(rng, 3)),
        "missing": dict(A=a, B=b),
        "extra": dict(A=a, B=b, bias=bias, C=bias),
    }
    for what, ins in cases.items():
        err = _expect("E1015", lambda ins=ins: exe(**ins))
        assert err.kind == "InputMismatch", what


def test_concrete_dim_mismatch_is_e1015():
    g = make_graph({"X": ("fp32", ["N", 3]), "W": ("fp32", [3, 2])},
                   [{"op": "MatMul", "name": "mm", "inputs": ["X", "W"], "outputs": ["Y"]}], ["Y"])
    rng = rng_for("concrete")
    _expect("E1015", lambda: kumiko.compile(g)(X=randn(rng, 2, 4), W=randn(rng, 3, 2)))
    _expect("E1015", lambda: kumiko.compile(g)(X=randn(rng, 2, 3), W=randn(rng, 2, 3)))


def test_missing_symbol_is_e1014():
    g = make_graph({"y": ("fp32", ["2*M"])},
                   [{"op": "Elementwise", "fn": "neg", "name": "n", "inputs": ["y"], "outputs": ["o"]}], ["o"])
    err = _expect("E1014", lambda: kumiko.compile(g)(y=randn(rng_for("e1014"), 6)))
    assert "M" in err.why and err.kind == "UnboundSymbol"
    # random inputs for a graph without defaults for its symbols
    err = _expect("E1014", lambda: kumiko.compile(g).random_inputs(0))
    assert "M" in err.why
    ins = kumiko.compile(g).random_inputs(0, {"M": 2})
    assert ins["y"].shape == (4,)
    err = _expect("E1014", lambda: kumiko.compile(make_graph(
        {"A": ("fp32", ["M", "K"])}, [{"op": "Reduce", "name": "r", "inputs": ["A"], "outputs": ["o"],
                                       "attrs": {"fn": "sum"}}], ["o"], {"M": 2})).random_inputs(0))
    assert "K" in err.why
