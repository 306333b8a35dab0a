"""The graph DSL (seed 004): parsing, subgraphs and inlining, the op vocabulary, the examples.

Each example's ``.kumiko`` file must give the same program as its ``.json`` (the same signature,
symbols and Tiny IR) and run. Malformed programs are in ``test_dsl_errors.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kumiko import compiler
from kumiko.cli import main as cli
from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl import parse_ast, parse_program
from kumiko.frontend.dsl_elab import MAX_DEPTH
from kumiko.frontend.dsl_vocab import vocabulary
from kumiko.frontend.lower import OPS
from kumiko.frontend.tensor import Tensor
from kumiko.tiny.ir import to_json as tiny_json

EXAMPLES = Path(__file__).parents[2] / "examples"
KUMIKO_FILES = sorted(EXAMPLES.glob("*.kumiko"))
JSON_FILES = sorted(EXAMPLES.glob("*.json"))


def tiny(g) -> dict:
    d = tiny_json(g.tiny)
    d.pop("name")
    return d


def run(g, **inputs) -> dict:
    return compiler.compile(g)(**inputs)


# ------------------------------------------------------------------------------------------------
# the examples


def test_every_json_example_has_a_dsl_twin():
    assert JSON_FILES, "no examples found"
    missing = [p.name for p in JSON_FILES if not p.with_suffix(".kumiko").exists()]
    assert not missing, f"examples without a .kumiko file: {missing}"


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: p.stem)
def test_dsl_example_is_the_json_example(path):
    want = compiler.load(path)
    got = compiler.load(path.with_suffix(".kumiko"))
    assert got.name == want.name                       # the file's stem names the graph
    assert got.inputs == want.inputs and got.outputs == want.outputs
    assert dict(got.symbols) == dict(want.symbols)
    assert got.output_types == want.output_types
    assert tiny(got) == tiny(want)


@pytest.mark.parametrize("path", KUMIKO_FILES, ids=lambda p: p.stem)
def test_dsl_example_runs_from_the_cli(path, capsys):
    assert cli(["run", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    g = compiler.load(path)
    assert set(d["outputs"]) == set(g.outputs)
    assert cli(["check", str(path)]) == 0


def test_gemm_example_computes_the_right_thing():
    g = compiler.load(EXAMPLES / "gemm_bias_relu.kumiko")
    rng = np.random.default_rng(0)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((5, 3), (3, 4), (4,)))
    np.testing.assert_allclose(run(g, A=a, B=b, bias=bias)["C2"], np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)


def test_subgraph_example_matches_numpy():
    g = compiler.load(EXAMPLES / "mlp_subgraphs.kumiko")
    rng = np.random.default_rng(1)
    shapes = {"x": (3, 4), "w1": (4, 6), "b1": (6,), "w2": (6, 4), "b2": (4,)}
    ins = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    from math import erf
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))
    h = gelu(ins["x"] @ ins["w1"] + ins["b1"])
    r = gelu(h @ ins["w2"] + ins["b2"]) + ins["x"]
    out = run(g, **ins)
    np.testing.assert_allclose(out["mu"], r.mean(1, keepdims=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["y"], r - r.mean(1, keepdims=True), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# the language


SEED_EXAMPLE = """
// seed 004's subgraph example, both parts in one file
graph<B=1, N=1> relu(x: f32[B, N]) -> (y: f32[B, N]) {
    zero = 0.0
    result = max(x, zero)
    return result
}

graph<N=1> multi_output(x: f32[N]) -> (a: f32[N], b: f32[N]) {
    r1 = x + 1.0
    r2 = x * 2.0
    return r1, r2
}

graph<B=1, D=1> main(input: f32[B, D], v: f32[10]) -> (output: f32[B, D], out1: f32[10], out2: f32[10]) {
    result = relu(input)
    (a, b) = multi_output(v)
    return result, a, b
}
"""


def test_seed_subgraph_example_inlines_to_one_flat_graph():
    g = parse_program(SEED_EXAMPLE)
    assert g.name == "main" and g.outputs == ("output", "out1", "out2")
    assert [(n.op, n.fn) for n in g.nodes] == [("Elementwise", "max"), ("Elementwise", "add"), ("Elementwise", "mul")]
    assert g.nodes[0].inputs == ("input", 0.0)       # the literal binding flows in as an immediate
    assert dict(g.symbols) == {"B": 1, "D": 1}
    x, v = np.array([[-1.0, 2.0]], np.float32), np.arange(10, dtype=np.float32)
    out = run(g, input=x, v=v)
    np.testing.assert_array_equal(out["output"], np.maximum(x, 0))
    np.testing.assert_array_equal(out["out1"], v + 1)
    np.testing.assert_array_equal(out["out2"], v * 2)


def test_same_graph_as_the_tensor_api():
    text = """
    graph<M=8, K=4, N=3> main(x: f32[M, K], w: param f32[K, N], b: f32[N]) -> (y: f32[M, N]) {
        y = sigmoid(x @ w + b)
        return y
    }"""
    x = Tensor.input("x", ("M", "K"))
    w = Tensor.input("w", ("K", "N"), role="param")
    b = Tensor.input("b", ("N",))
    want = (x @ w + b).sigmoid().graph("y", symbols={"M": 8, "K": 4, "N": 3})
    assert tiny(parse_program(text)) == tiny(want)


def test_operators_precedence_and_literals():
    g = parse_program("""
    graph<N=4> main(x: f32[N], y: f32[N]) -> (z: f32[N], c: bool[N]) {
        z = -x + 2 * y ** 2.0 / (1.0 - -0.5) - 1e-3   // unary minus, ** over *, literal folding
        c = x < y
        return z, c
    }""")
    x = np.array([1, -2, 3, 0.5], np.float32)
    y = np.array([0.5, 1, -1, 2], np.float32)
    out = run(g, x=x, y=y)
    np.testing.assert_allclose(out["z"], -x + 2 * y ** 2 / 1.5 - 1e-3, rtol=1e-6)
    np.testing.assert_array_equal(out["c"], x < y)
    mul = next(n for n in g.nodes if n.fn == "div")
    assert mul.inputs[1] == 1.5                      # (1.0 - -0.5) folded


def test_statements_semicolons_comments_and_multiline_calls():
    g = parse_program("""graph<N=2> main(x: f32[N, N]) -> (y: f32[N, N]) { a = relu(x); b = a * 2.0
        // a comment line
        y = where(b > 1.0,   // a call split over lines
                  b,
                  0.0)
        return y }""")
    x = np.array([[0.2, 1.0], [-1.0, 3.0]], np.float32)
    np.testing.assert_array_equal(run(g, x=x)["y"], np.where(2 * np.maximum(x, 0) > 1, 2 * np.maximum(x, 0), 0))


def test_dtypes_casts_and_attributes():
    g = parse_program("""
    graph<M=2> main(x: f16[M, 6], i: i32[M, 6], m: bool[M, 6], h: bf16[6]) -> (
        s: f32[M, 1], r: f32[M, 2, 3], t: f16[6, M], k: i32[M, 6], hb: f32[6]) {
        xf = cast(x, to=f32)
        s = sum(xf, axes=[1], keepdim=true)
        r = reshape(xf, shape=[M, 2, 6 / 2])
        t = permute(x, perm=[1, 0])
        k = where(m, i, 0)
        hb = Cast(h, to=f32)                // the exact op name spells the Cast op itself
        return s, r, t, k, hb
    }""")
    assert g.input_types["x"].dtype.name == "fp16" and g.input_types["h"].dtype.name == "bf16"
    r = next(n for n in g.nodes if n.op == "Reshape")
    assert r.attrs["shape"] == ("M", 2, 3)          # sizes are stored as in the JSON form (6 / 2 folded)
    assert next(n for n in g.nodes if n.outputs == ("hb",)).op == "Cast"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6)).astype(np.float16)
    i = rng.integers(-5, 5, (2, 6)).astype(np.int32)
    m = rng.random((2, 6)) > 0.5
    h = np.ones(6, dtype=g.input_types["h"].dtype.np)
    out = run(g, x=x, i=i, m=m, h=h)
    np.testing.assert_allclose(out["s"], x.astype(np.float32).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(out["t"], x.T)
    np.testing.assert_array_equal(out["k"], np.where(m, i, 0))


def test_signature_qualifiers():
    g = parse_program("""
    graph main(x: f32[4], w: param const_pool f32[4], s: state mutable arena f32[4], e: param external f32[4])
        -> (y: f32[4]) {
        y = x * w + s + e
        return y
    }""")
    sig = {i.tensor: (i.role, i.mutability, i.storage) for i in g.inputs}
    assert sig == {"x": ("data", "immutable", None), "w": ("param", "immutable", "const_pool"),
                   "s": ("state", "mutable", "arena"), "e": ("param", "immutable", "external")}


def test_backticked_names_and_outputs_that_are_inputs():
    g = parse_program("""
    graph main(`input.1`: f32[3], `graph`: f32[3]) -> (`out:0`: f32[3], `graph`: f32[3]) {
        `out:0` = `input.1` + `graph`
        return `out:0`, `graph`
    }""")
    assert [i.tensor for i in g.inputs] == ["input.1", "graph"]
    assert g.outputs == ("out:0", "graph")


def test_symbolic_sizes_are_inferred_through_subgraph_calls():
    g = parse_program("""
    graph<R=1, C=1> rowsum(x: f32[R, C]) -> (s: f32[R]) {
        s = sum(x, axes=[1])
        return s
    }
    graph<H=1> evens(x: f32[H, 2]) -> (y: f32[floor((H + 1)/2), 2]) {
        y = slice(x, starts=[0], ends=[H], axes=[0], steps=[2])     // H is the caller's size here
        return y
    }
    graph<M=6> main(x: f32[M, 2]) -> (s: f32[M], p: f32[floor((M + 1)/2), 2]) {
        s = rowsum(x)
        p = evens(x)
        return s, p
    }""")
    assert str(g.output_types["p"].shape[0]) == "floor((M + 1)/2)"
    assert next(n for n in g.nodes if n.op == "Slice").attrs["ends"] == ("M",)
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    out = run(g, x=x)
    np.testing.assert_array_equal(out["s"], x.sum(1))
    np.testing.assert_array_equal(out["p"], x[::2])


def test_subgraph_default_sizes_fill_what_arguments_do_not_fix():
    g = parse_program("""
    graph<N=1, K=3> tile(x: f32[N]) -> (y: f32[K, N]) {
        y = expand(x, shape=[K, N])
        return y
    }
    graph<N=4> main(x: f32[N]) -> (y: f32[3, N]) {
        y = tile(x)
        return y
    }""")
    assert g.output_types["y"].shape[0] == 3


def test_subgraphs_may_nest_up_to_the_limit():
    levels = [f"graph<N=1> g{k}(x: f32[N]) -> (y: f32[N]) {{ y = g{k + 1}(x) + 1.0; return y }}"
              for k in range(MAX_DEPTH - 1)]
    levels.append(f"graph<N=1> g{MAX_DEPTH - 1}(x: f32[N]) -> (y: f32[N]) {{ y = x * 1.0; return y }}")
    text = "\n".join(levels) + "\ngraph main(x: f32[2]) -> (y: f32[2]) { y = g0(x); return y }"
    g = parse_program(text)                         # main -> g0 -> ... -> g9: 10 nested calls
    np.testing.assert_array_equal(run(g, x=np.zeros(2, np.float32))["y"], np.full(2, MAX_DEPTH - 1.0))
    deeper = text.replace("y = x * 1.0", "y = g0(x)")
    with pytest.raises(KumikoError, match="nest deeper than 10"):
        parse_program(deeper)


def test_a_subgraph_returning_one_value_twice_and_an_argument():
    g = parse_program("""
    graph<N=1> dup(x: f32[N]) -> (a: f32[N], b: f32[N], c: f32[N]) {
        r = relu(x)
        return r, r, x
    }
    graph<N=2> main(x: f32[N]) -> (y: f32[N]) {
        (p, q, s) = dup(x)
        y = p + q + s
        return y
    }""")
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run(g, x=x)["y"], 2 * np.maximum(x, 0) + x)


def test_unused_subgraphs_are_still_checked():
    with pytest.raises(KumikoError) as e:
        parse_program("""
        graph<N=1> unused(x: f32[N]) -> (y: f32[N]) { y = relu(x, x); return y }
        graph main(x: f32[2]) -> (y: f32[2]) { y = relu(x); return y }""")
    assert e.value.code == "E1601" and ":2:" in e.value.at


def test_naming_is_deterministic_and_readable():
    text = """
    graph<N=1> act(x: f32[N]) -> (y: f32[N]) { t = x * 2.0; y = relu(t); return y }
    graph<N=4> main(x: f32[N]) -> (out: f32[N]) {
        h = act(x) + act(x)
        out = h
        return out
    }"""
    g1, g2 = parse_program(text), parse_program(text)
    assert json.dumps(g1.to_json()) == json.dumps(g2.to_json())
    names = [o for n in g1.nodes for o in n.outputs]
    assert names == ["act_t", "act_y", "act_t_1", "act_y_1", "out"]
    assert [n.name for n in g1.nodes] == names       # an op is named after its first output


def test_vocabulary_is_derived_from_the_lowering_tables():
    vocab = vocabulary()
    ops = {b.op for cands in vocab.values() for b in cands}
    assert set(OPS) <= ops                            # every op of the frontend is callable
    for op in OPS:
        assert op in vocab                            # ... at least by its exact name
    assert {b.op for b in vocab["max"]} == {"Elementwise", "Reduce"}
    assert vocab["conv2d"][0].op == "Conv2D" and vocab["matmul"][0].op == "MatMul"
    assert vocab["layer_norm"][0].op == "LayerNorm" and vocab["cumsum"][0].op == "CumSum"


def test_parse_ast_keeps_positions():
    prog = parse_ast("graph main(x: f32[2]) -> (y: f32[2]) {\n  y = relu(x)\n  return y\n}", "m.kumiko")
    (g,) = prog.graphs
    assert g.name == "main" and g.pos.line == 1
    assert g.body[0].value.pos.line == 2 and g.body[0].value.pos.col == 7


def test_load_names_the_graph_after_the_file(tmp_path):
    p = tmp_path / "my_model.kumiko"
    p.write_text("graph main(x: f32[2]) -> (y: f32[2]) { y = exp(x); return y }\n")
    assert compiler.load(p).name == "my_model"
    assert parse_program(p.read_text()).name == "main"
    assert parse_program(p.read_text(), name="other").name == "other"
