"""Pictures: the DOT of every example at every drawable stage parses (with a small DOT parser below,
so no graphviz is needed), shows what it must, and renders to SVG when graphviz's ``dot`` is here."""
from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kumiko import compiler
from kumiko.cli import main as cli
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.pipeline import DRAWINGS, draw, to_dot
from kumiko.tiny.ir import to_json as tiny_json
from kumiko.util.drawing import Cluster, to_svg

EXAMPLES = Path(__file__).parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.json")) + sorted(EXAMPLES.glob("*.kumiko"))
HAVE_DOT = shutil.which("dot") is not None
NEED_DOT = pytest.mark.skipif(not HAVE_DOT, reason="graphviz's `dot` is not installed (apt-get install graphviz)")

# ------------------------------------------------------------------------------------------------
# a small DOT parser (the grammar of graphviz.org/doc/info/lang.html, without ports and HTML labels)

_TOK = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|^#[^\n]*|(?P<str>"(?:[^"\\]|\\.)*")'
                  r'|(?P<id>[A-Za-z_\x80-\uffff][\w\x80-\uffff]*|-?(?:\.\d+|\d+(?:\.\d*)?))'
                  r'|(?P<op>->|--|[{}\[\];,=:])', re.S | re.M)
KEYWORDS = {"strict", "graph", "digraph", "node", "edge", "subgraph"}


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOK.match(text, pos)
        assert m and m.end() > pos, f"DOT: bad character at {pos}: {text[pos:pos + 20]!r}"
        if m.lastgroup == "str":
            out.append(("id", re.sub(r'\\(["\\])', r"\1", m.group()[1:-1])))
        elif m.lastgroup == "id":
            kw = m.group().lower()
            out.append(("kw", kw) if kw in KEYWORDS else ("id", m.group()))
        elif m.lastgroup == "op":
            out.append(("op", m.group()))
        pos = m.end()
    return out


class Dot:
    """Parses one graph; records nodes (id -> attrs), edges and clusters (name -> member ids)."""

    def __init__(self, text: str):
        self.t, self.i = _tokens(text), 0
        self.nodes: dict[str, dict] = {}
        self.edges: list[tuple[str, str, dict]] = []
        self.clusters: dict[str, list[str]] = {}
        self.attrs: dict[str, dict] = {}
        if self.peek() == ("kw", "strict"):
            self.i += 1
        kind = self.take()
        assert kind in (("kw", "graph"), ("kw", "digraph")), kind
        self.edgeop = "->" if kind[1] == "digraph" else "--"
        self.name = self.take()[1] if self.peek()[0] == "id" else None
        self.block(None)
        assert self.i == len(self.t), f"DOT: trailing tokens {self.t[self.i:self.i + 5]}"
        for a, b, _ in self.edges:
            assert a in self.nodes and b in self.nodes, f"edge {a} -> {b} names an undeclared node"

    def peek(self) -> tuple:
        return self.t[self.i] if self.i < len(self.t) else ("eof", "")

    def take(self, want: tuple | None = None) -> tuple:
        tok = self.peek()
        assert want is None or tok == want, f"DOT: expected {want}, got {tok} at token {self.i}"
        self.i += 1
        return tok

    def block(self, cluster: str | None) -> None:
        self.take(("op", "{"))
        while self.peek() != ("op", "}"):
            self.stmt(cluster)
            if self.peek() in (("op", ";"), ("op", ",")):
                self.i += 1
        self.take(("op", "}"))

    def attr_list(self) -> dict:
        out: dict = {}
        while self.peek() == ("op", "["):
            self.take()
            while self.peek() != ("op", "]"):
                k = self.take()
                assert k[0] in ("id", "kw"), k
                self.take(("op", "="))
                v = self.take()
                assert v[0] == "id", v
                out[k[1]] = v[1]
                if self.peek() in (("op", ";"), ("op", ",")):
                    self.i += 1
            self.take(("op", "]"))
        return out

    def stmt(self, cluster: str | None) -> None:
        tok = self.peek()
        if tok in (("kw", "graph"), ("kw", "node"), ("kw", "edge")):
            self.take()
            self.attrs.setdefault(tok[1], {}).update(self.attr_list())
            return
        if tok in (("kw", "subgraph"), ("op", "{")):
            name = None
            if tok[0] == "kw":
                self.take()
                if self.peek()[0] == "id":
                    name = self.take()[1]
            inner = name if name and name.startswith("cluster") else cluster
            if inner and inner not in self.clusters:
                self.clusters[inner] = []
            self.block(inner)
            return
        first = self.take()
        assert first[0] == "id", f"DOT: statement starts with {first}"
        if self.peek() == ("op", "="):
            self.take()
            assert self.take()[0] == "id"
            return
        chain = [first[1]]
        while self.peek() in (("op", "->"), ("op", "--")):
            assert self.take()[1] == self.edgeop, "edge operator does not match the graph kind"
            nxt = self.take()
            assert nxt[0] == "id", nxt
            chain.append(nxt[1])
        attrs = self.attr_list()
        if len(chain) == 1:
            self.nodes.setdefault(chain[0], {}).update(attrs)
            if cluster:
                self.clusters[cluster].append(chain[0])
        else:
            self.edges += [(a, b, attrs) for a, b in zip(chain, chain[1:])]


def test_the_dot_parser_rejects_broken_dot():
    for bad in ('digraph { "a" -> }', 'digraph { "a" [label=] }', 'digraph { a -> b ', 'graph { a -> b }',
                'digraph { a -> b; }'):
        with pytest.raises(AssertionError):
            Dot(bad)
    d = Dot('strict digraph "g" { node [shape=box]; "a" [label="x\\"y"]; b; subgraph cluster_1 { c; } a -> b -> c }')
    assert d.nodes["a"]["label"] == 'x"y' and d.clusters == {"cluster_1": ["c"]} and len(d.edges) == 2


# ------------------------------------------------------------------------------------------------
# the pictures


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_frontend_picture_of_every_example(path):
    g = compiler.load(path)
    text = to_dot(g)
    assert text == to_dot(g)                                     # deterministic
    d = Dot(text)
    for i in g.inputs:
        node = d.nodes[f"in:{i.tensor}"]
        assert node["shape"] == "invhouse" and i.tensor in node["label"] and i.role in node["label"]
    for o in g.outputs:
        node = d.nodes[f"out:{o}"]
        t = g.tensors[o]
        assert node["shape"] == "house" and f"{t.dtype.name}[" in node["label"]
    for n in g.nodes:
        label = d.nodes[f"op:{n.name}"]["label"]
        assert n.op in label and all(f"{o}: {g.tensors[o].dtype.name}[" in label for o in n.outputs)
    assert len(d.edges) == sum(isinstance(x, str) for n in g.nodes for x in n.inputs) + len(g.outputs)
    assert "rank=source" in text and "rank=sink" in text         # the signature is set apart


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_tiny_picture_of_every_example(path):
    g = compiler.load(path)
    d = Dot(to_dot(g, "tiny"))
    tj = tiny_json(g.tiny)
    assert {u["id"] for u in tj["uops"]} <= set(d.nodes)
    for u in tj["uops"]:
        assert d.nodes[u["id"]]["label"].startswith(f"{u['id']} {u['uop']}")
    assert {f"out:{o['tensor']}" for o in tj["outputs"]} <= set(d.nodes)


@NEED_DOT
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_svg_renders_for_every_example(path):
    g = compiler.load(path)
    for stage in ("frontend", "tiny"):
        root = ET.fromstring(draw(g, stage, "svg"))
        assert root.tag.endswith("svg")


def test_a_tiny_dump_draws_its_tiny_stage_only(tmp_path):
    from kumiko.pipeline import dump
    g = compiler.load(EXAMPLES / "gemm_bias_relu.json")
    dump(g, ["tiny"], tmp_path)
    t = compiler.load(tmp_path / "gemm_bias_relu.tiny.json")
    Dot(to_dot(t))
    with pytest.raises(KumikoError) as e:
        to_dot(t, "frontend")
    assert e.value.code == "E1009"


def test_clusters_draw_boxes_around_nodes():
    """How a region stage will draw its kernels: a Drawing with one cluster per kernel."""
    g = compiler.load(EXAMPLES / "gemm_bias_relu.json")
    ids = list(g.tiny.nodes)
    text = to_dot(g, "tiny", clusters=[Cluster("k0", "kernel 0: matmul", tuple(ids[3:10])),
                                       Cluster("k1", "kernel 1", tuple(ids[10:]))])
    d = Dot(text)
    assert d.clusters == {"cluster_k0": ids[3:10], "cluster_k1": ids[10:]}
    assert 'label="kernel 0: matmul"' in text
    assert set(ids) <= set(d.nodes)                              # clustered nodes are still declared once
    assert sum(1 for line in text.splitlines() if line.strip().startswith(f'"{ids[4]}" [')) == 1


def test_names_with_quotes_and_backslashes_are_escaped():
    g = Graph.from_json({"name": 'we"ird\\', "signature": {"inputs": ['x"1'], "outputs": ["y\\n"]},
                         "tensors": {'x"1': {"dtype": "fp32", "shape": [2]}},
                         "graph": [{"op": "Elementwise", "fn": "mul", "inputs": ['x"1', 2.0], "outputs": ["y\\n"]}]})
    d = Dot(to_dot(g))
    assert 'in:x"1' in d.nodes and "out:y\\\\n" in {k.replace("\\", "\\\\") for k in d.nodes}
    assert d.name == 'we"ird\\ (frontend)'


def test_unknown_stage_and_format():
    g = compiler.load(EXAMPLES / "gemm_bias_relu.json")
    with pytest.raises(KumikoError) as e:
        to_dot(g, "no_such_stage")
    assert e.value.code == "E1010" and "unknown stage" in e.value.why and "frontend" in e.value.suggestion
    from kumiko.pipeline import DUMPS
    for stage in set(DUMPS) - set(DRAWINGS):                  # a JSON-only stage says so
        with pytest.raises(KumikoError, match="no picture yet"):
            to_dot(g, stage)
    with pytest.raises(KumikoError):
        draw(g, "frontend", "png")
    assert set(DRAWINGS) >= {"frontend", "tiny"}


def test_missing_graphviz_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(KumikoError) as e:
        to_svg("digraph { a }")
    assert e.value.code == "E1501" and "apt-get install graphviz" in e.value.suggestion


# ------------------------------------------------------------------------------------------------
# the command line


def test_cli_dump_dot_to_stdout_and_files(tmp_path, capsys):
    src = str(EXAMPLES / "conv_relu_maxpool.kumiko")
    assert cli(["dump", src, "--stage", "frontend", "--format", "dot"]) == 0
    d = Dot(capsys.readouterr().out)
    assert "op:Yc" in d.nodes and "out:Y" in d.nodes
    assert cli(["dump", src, "--format", "dot", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv_relu_maxpool.frontend.dot",
                                                          "conv_relu_maxpool.tiny.dot"]
    for p in tmp_path.iterdir():
        Dot(p.read_text())
    assert cli(["dump", src, "--format", "json", "--stage", "frontend"]) == 0
    assert '"kumiko": "frontend"' in capsys.readouterr().out


def test_cli_svg_of_several_stages_needs_files(capsys):
    assert cli(["dump", str(EXAMPLES / "gemm_bias_relu.json"), "--format", "svg"]) == 2
    assert "--out" in capsys.readouterr().err


@NEED_DOT
def test_cli_dump_svg(tmp_path, capsys):
    assert cli(["dump", str(EXAMPLES / "gemm_bias_relu.kumiko"), "--stage", "frontend", "--format", "svg"]) == 0
    assert ET.fromstring(capsys.readouterr().out).tag.endswith("svg")
    assert cli(["dump", str(EXAMPLES / "gemm_bias_relu.kumiko"), "--format", "svg", "--out", str(tmp_path)]) == 0
    assert {p.suffix for p in tmp_path.iterdir()} == {".svg"}


def test_cli_svg_without_graphviz(monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert cli(["dump", str(EXAMPLES / "gemm_bias_relu.json"), "--stage", "tiny", "--format", "svg"]) == 2
    err = capsys.readouterr().err
    assert "E1501" in err and "apt-get install graphviz" in err
