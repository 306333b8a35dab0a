"""kumiko.debug.bisect and ``kumiko run --check --bisect``: a correct graph has no wrong node; with the C
generated for one op made wrong, the first wrong node is that op, not its producers or consumers."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kumiko import ops
from kumiko.cli import main
from kumiko.debug import bisect
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph

# x -> scale (mul) -> expo (exp, the op the tests break) -> shift (add) -> total (sum over rows)
CHAIN = {
    "name": "chain", "symbols": {"M": 8, "N": 32},
    "signature": {"inputs": [{"tensor": "x"}], "outputs": [{"tensor": "y"}]},
    "tensors": {"x": {"dtype": "fp32", "shape": ["M", "N"]}},
    "graph": [
        {"op": "Elementwise", "name": "scale", "fn": "mul", "inputs": ["x", 0.5], "outputs": ["a"]},
        {"op": "Elementwise", "name": "expo", "fn": "exp", "inputs": ["a"], "outputs": ["b"]},
        {"op": "Elementwise", "name": "shift", "fn": "add", "inputs": ["b", 1.0], "outputs": ["c"]},
        {"op": "Reduce", "name": "total", "fn": "sum", "inputs": ["c"], "outputs": ["y"], "attrs": {"axes": [-1]}},
    ],
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A build made with a patched code generator must not land in (or come from) the shared cache."""
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def broken_exp():
    """Every kernel's exp2 (what the frontend's exp lowers to) computes twice the right value."""
    exp2 = ops.ELEMENTWISE["EXP2"]
    broken = dataclasses.replace(exp2, c={**exp2.c, "": "(2.0f * exp2f({x}))"}, cv="(kv_exp2({x}) + kv_exp2({x}))")
    with ops.registered(broken):
        yield


def test_correct_graph_has_no_bad_node():
    res = bisect(Graph.from_json(CHAIN))
    assert res.ok and res.first_bad is None and res.error() is None
    assert [r.node for r in res.table] == ["scale", "expo", "shift", "total"]
    assert all(r.rel_l2 <= r.check.bound for r in res.table)
    assert all(r.kernels == ("k_y",) for r in res.table)        # the plain compile fuses the chain into one kernel
    assert "every tensor matches" in res.render()


def test_injected_bug_names_the_op_not_its_producers(broken_exp):
    res = bisect(Graph.from_json(CHAIN), batch=2)
    assert not res.ok and not all(c.ok for c in res.plain)
    bad = res.first_bad
    assert (bad.node, bad.op, bad.tensor) == ("expo", "Elementwise.exp", "b")
    assert res.table[0].node == "scale" and res.table[0].ok        # its producer is right
    assert bad.inputs == (("a", res.table[0].rel_l2),)
    assert res.culprit and res.alone is not None and res.alone > bad.check.bound
    assert bad.kernels == ("k_y",) and any(n.startswith("fuses:") for n in res.notes["k_y"])
    assert res.compiles == 1                   # the batch holding the wrong node ends the search
    err = res.error()
    assert isinstance(err, KumikoError) and err.code == "E1705" and err.at.startswith("node expo")


def test_tiny_ir_program(broken_exp):
    res = bisect(Graph.from_json(CHAIN).tiny)
    assert res.first_bad is not None and res.first_bad.op == "EXP2" and res.culprit


def test_cli_bisect_prints_the_table_and_exits_2(tmp_path, capsys, broken_exp):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(CHAIN))
    assert main(["run", str(path), "--check", "--bisect"]) == 2
    out, err = capsys.readouterr()
    assert "first wrong node: #1 expo (Elementwise.exp) -> b" in out and "culprit: the kernel computing expo" in out
    assert "E1705" in err and "node expo" in err
    assert main(["--json", "run", str(path), "--check", "--bisect"]) == 2
    diag = json.loads(capsys.readouterr().out)["diagnostics"][0]
    assert diag["code"] == "E1705" and [r["node"] for r in diag["table"]][:2] == ["scale", "expo"]


def test_cli_bisect_ok(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(CHAIN))
    assert main(["run", str(path), "--check", "--bisect", "--seed", "3"]) == 0
    assert "every tensor matches the evaluator" in capsys.readouterr().out


def test_given_inputs_are_used():
    x = np.full((2, 4), 3.0, np.float32)
    res = bisect(Graph.from_json(CHAIN), {"x": x})
    assert res.ok and res.sizes == {"M": 2, "N": 4}


def test_mismatch_only_in_the_plain_fusion_is_still_e1705():
    """Exposing intermediates can split the fusion that computes a wrong value: every tensor then matches,
    yet the plain graph's output does not, and that is still a mismatch."""
    from kumiko.accuracy import OutputCheck
    from kumiko.debug import BisectResult
    res = BisectResult(None, (), (OutputCheck("y", "fp32", 0.5, 1e-4, 0),), "cpu", {"M": 2})
    assert not res.ok and "fusion that exposing intermediates breaks up" in res.render()
    err = res.error()
    assert err.code == "E1705" and err.at == "output y on cpu"
