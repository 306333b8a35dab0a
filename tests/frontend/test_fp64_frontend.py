"""fp64 through every front door (issue 22): the DSL's ``f64``, a JSON graph's ``fp64``, the Tensor API,
the decompiler's round trip, the CLI's ``--dtype fp64`` and ``--check`` (judged by the fp64 bound)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import kumiko
from kumiko import Tensor, dtypes
from kumiko.cli import main as cli
from kumiko.frontend.decompile import decompile
from kumiko.frontend.dsl import parse_program
from kumiko.frontend.graph import Graph

RNG = np.random.default_rng(64)
EXAMPLES = Path(__file__).parents[2] / "examples"
DSL = """graph<M=5, K=4099> main(X: f64[M, K], S: f32[M]) -> (Y: f64[M], Z: f32[M]) {
    E = exp(X)
    Y = sum(E, axes=[-1])
    Z = cast(Y, to=f32) + S
    return Y, Z
}
"""


def test_the_dsl_and_json_take_fp64_and_compute_in_float64():
    g = parse_program(DSL)
    assert g.tensors["X"].dtype is dtypes.fp64 and g.tensors["Y"].dtype is dtypes.fp64
    g2 = Graph.from_json(json.loads(json.dumps(g.to_json())))
    g3 = parse_program(decompile(g))
    x, s = RNG.standard_normal((5, 4099)), RNG.standard_normal(5).astype(np.float32)
    want = np.exp(x).sum(1)
    for graph in (g, g2, g3):
        for target in ("eval", "cpu"):
            out = kumiko.compile(graph, target)(X=x, S=s)
            assert out["Y"].dtype == np.float64 and out["Z"].dtype == np.float32
            np.testing.assert_allclose(out["Y"], want, rtol=1e-12)
            np.testing.assert_allclose(out["Z"], want.astype(np.float32) + s, rtol=1e-6)


def test_tensor_api_fp64_data_and_casts():
    w = Tensor(RNG.standard_normal((7, 3)), dtype="fp64", name="w", role="param")
    x = Tensor.input("x", (2, 7), dtypes.fp64)
    assert (x @ w).dtype is dtypes.fp64 and x.cast("fp32").dtype is dtypes.fp32
    assert Tensor(np.ones(3)).dtype is dtypes.fp32          # numpy's float64 default still narrows (tinygrad's)
    xs = RNG.standard_normal((2, 7))
    g = (x @ w).graph("y")
    assert g.params["w"].dtype == np.float64
    got = kumiko.compile(g, "cpu")(x=xs)["y"]
    np.testing.assert_allclose(got, xs @ g.params["w"], rtol=1e-12)
    v = Tensor(xs, dtype="fp64")
    np.testing.assert_allclose((v.exp() * 3).numpy(), np.exp(xs) * 3, rtol=1e-15)


def test_cli_runs_an_example_as_fp64_and_checks_it(capsys):
    path = EXAMPLES / "gemm_bias_relu.json"
    assert cli(["run", str(path), "--dtype", "fp64", "--target", "cpu", "--check", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    checks = d.get("check") or d.get("checks") or {}
    text = json.dumps(checks)
    assert "fp64" in text and "1e-12" in text
