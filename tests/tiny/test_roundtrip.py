"""Tiny IR dumps: load(dump(g)) is the same graph, dumps are byte-identical, and a dumped stage can be
compiled from (tests start mid-pipeline)."""
import json
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko.pipeline import dump
from kumiko.tiny import evaluate, load, to_json

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_tiny_dump_round_trips(path):
    g = kumiko.load(path)
    d = to_json(g.tiny)
    again = load(json.loads(json.dumps(d)))
    assert to_json(again) == d


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_dumps_are_deterministic(path):
    a = dump(kumiko.load(path), ["frontend", "tiny"], None)
    b = dump(kumiko.load(path), ["frontend", "tiny"], None)
    assert a == b


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_frontend_json_round_trips(path):
    g = kumiko.load(path)
    again = kumiko.Graph.from_json(json.loads(json.dumps(g.to_json())))
    assert again.to_json() == g.to_json()
    assert to_json(again.tiny) == to_json(g.tiny)


def test_resume_from_dumped_tiny(tmp_path):
    """A Tiny IR dump is a program: compile it and get the frontend graph's results."""
    g = kumiko.load(EXAMPLES[0])
    dump(g, ["tiny"], tmp_path)
    (f,) = tmp_path.glob("*.tiny.json")
    resumed = kumiko.load(f)
    exe_a, exe_b = kumiko.compile(g), kumiko.compile(resumed)
    ins = exe_a.random_inputs(seed=5)
    for k, v in exe_a(**ins).items():
        np.testing.assert_array_equal(v, exe_b(**ins)[k])


def test_seed_002_style_bare_uops():
    """The seed's hand-written form (no dtype/shape, reduce axes by size name) loads and runs."""
    g = load({"uops": [
        {"id": "n0", "uop": "INPUT", "arg": {"tensor_id": "A", "dtype": "fp32", "shape": ["M", "K"]}},
        {"id": "n1", "uop": "INPUT", "arg": {"tensor_id": "B", "dtype": "fp32", "shape": ["K", "N"]}},
        {"id": "n2", "uop": "RESHAPE", "src": ["n0"], "arg": {"result_shape": ["M", 1, "K"]}},
        {"id": "n3", "uop": "PERMUTE", "src": ["n1"], "arg": {"perm": [1, 0]}},
        {"id": "n4", "uop": "RESHAPE", "src": ["n3"], "arg": {"result_shape": [1, "N", "K"]}},
        {"id": "n5", "uop": "EXPAND", "src": ["n2"], "arg": {"result_shape": ["M", "N", "K"],
                                                           "broadcast_dimensions": [0, 2]}},
        {"id": "n6", "uop": "EXPAND", "src": ["n4"], "arg": {"result_shape": ["M", "N", "K"],
                                                           "broadcast_dimensions": [1, 2]}},
        {"id": "n7", "uop": "MUL", "src": ["n5", "n6"]},
        {"id": "n8", "uop": "REDUCE", "src": ["n7"], "arg": {"op": "SUM", "axes": ["K"], "dtype": "fp32"}},
    ]})
    assert g.nodes["n8"].arg["axes"] == (2,)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7), dtype=np.float32), rng.standard_normal((7, 3), dtype=np.float32)
    (out,) = evaluate(g, {"A": a, "B": b}).values()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_gemm_lowering_follows_tinygrad_order():
    """Seed 000/002: X reshaped to [M,1,K]; W reshaped to [1,K,N] then permuted to [1,N,K]; both expanded;
    MUL; REDUCE(SUM) over the last axis in fp32 - no CONTRACT node anywhere."""
    g = kumiko.load(EXAMPLES[[p.stem for p in EXAMPLES].index("gemm_bias_relu")]).tiny
    uops = [n.uop for n in g.nodes.values()]
    assert "CONTRACT" not in uops
    red = next(n for n in g.nodes.values() if n.uop == "REDUCE")
    mul = g.nodes[red.src[0]]
    assert mul.uop == "MUL" and red.arg["op"] == "SUM" and red.arg["axes"] == (2,) and red.arg["dtype"] == "fp32"
    lhs, rhs = (g.nodes[s] for s in mul.src)
    assert lhs.uop == rhs.uop == "EXPAND"
    x = g.nodes[lhs.src[0]]
    assert x.uop == "RESHAPE" and [str(d) for d in x.shape] == ["M", "1", "K"]
    w = g.nodes[rhs.src[0]]
    assert w.uop == "PERMUTE" and w.arg["perm"] == (0, 2, 1)
    w0 = g.nodes[w.src[0]]
    assert w0.uop == "RESHAPE" and [str(d) for d in w0.shape] == ["1", "K", "N"]
