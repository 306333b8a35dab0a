"""Pictures of a program: Graphviz DOT text (and SVG through graphviz's ``dot`` when installed).

A stage's picture is built in two steps: the stage gives a ``Drawing`` (labelled nodes, edges and
optional clusters), and ``render_dot`` writes any Drawing as DOT. Signature inputs sit in the top
rank and outputs in the bottom rank, each with its own shape and colour; ops show their kind,
output names, dtypes and shapes and their attributes. A later stage draws its kernels by returning
a Drawing with ``clusters`` (one per kernel) and registering it with ``register_drawing``.

The text is deterministic (node order follows the program, attributes keep their order) so that
pictures can be compared and checked in.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph, TensorType
from kumiko.symbolic import dim_json
from kumiko.tiny.ir import TinyGraph

FORMATS = ("json", "dot", "svg")
MAX_LINE = 72          # label lines longer than this are cut (index maps can be long)


@dataclass(frozen=True)
class DrawNode:
    id: str
    lines: tuple[str, ...]
    kind: str = "op"             # input | param | op | const | output


@dataclass(frozen=True)
class DrawEdge:
    src: str
    dst: str
    label: str = ""


@dataclass(frozen=True)
class Cluster:
    """A box around some nodes (a kernel of the region stage): ``members`` are DrawNode ids."""
    id: str
    label: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class Drawing:
    title: str
    nodes: tuple[DrawNode, ...]
    edges: tuple[DrawEdge, ...]
    clusters: tuple[Cluster, ...] = ()


# ------------------------------------------------------------------------------------------------
# DOT


_STYLE = {
    "input": 'shape=invhouse, style=filled, fillcolor="#d6e6ff"',
    "param": 'shape=invhouse, style=filled, fillcolor="#fff0c2"',
    "output": 'shape=house, style=filled, fillcolor="#d3f2d3"',
    "const": 'shape=box, style="rounded,dashed"',
    "op": 'shape=box, style="rounded,filled", fillcolor="#f2f2f2"',
}


def quote(s: str) -> str:
    """A DOT double-quoted string (backslashes and quotes escaped, newlines as \\n)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(lines: Sequence[str]) -> str:
    cut = [ln if len(ln) <= MAX_LINE else ln[:MAX_LINE - 3] + "..." for ln in lines]
    return quote("\n".join(cut))


def render_dot(d: Drawing) -> str:
    """DOT text for a Drawing: nodes in their order, clusters as ``subgraph cluster_*`` blocks."""
    out = [f"digraph {quote(d.title)} {{",
           f"  graph [label={quote(d.title)}, labelloc=t, fontname=\"Helvetica\", rankdir=TB];",
           '  node [fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=9, color="#555555"];']
    clustered = {m for c in d.clusters for m in c.members}
    by_id = {n.id: n for n in d.nodes}

    def node_line(n: DrawNode, indent: str) -> str:
        return f"{indent}{quote(n.id)} [{_STYLE.get(n.kind, _STYLE['op'])}, label={_label(n.lines)}];"
    for n in d.nodes:
        if n.id not in clustered:
            out.append(node_line(n, "  "))
    for c in d.clusters:
        out.append(f"  subgraph {quote('cluster_' + c.id)} {{")
        out.append(f'    label={quote(c.label)}; style="rounded,dashed"; color="#3465a4";')
        out.extend(node_line(by_id[m], "    ") for m in c.members if m in by_id)
        out.append("  }")
    for e in d.edges:
        attrs = f" [label={quote(e.label)}]" if e.label else ""
        out.append(f"  {quote(e.src)} -> {quote(e.dst)}{attrs};")
    for kind, rank in (("input", "source"), ("output", "sink")):
        ids = [n.id for n in d.nodes if (n.kind == kind or kind == "input" and n.kind == "param")
               and n.id not in clustered]
        if ids:
            out.append(f"  {{ rank={rank}; {' '.join(quote(i) + ';' for i in ids)} }}")
    out.append("}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# drawings of the stages


def _tstr(t: TensorType) -> str:
    return f"{t.dtype.name}[{', '.join(str(dim_json(d)) for d in t.shape)}]"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def frontend_drawing(g: Graph) -> Drawing:
    """Signature inputs (data / param), one node per op, one node per output; edges carry tensor names."""
    nodes: list[DrawNode] = []
    edges: list[DrawEdge] = []
    producer: dict[str, str] = {}
    for i in g.inputs:
        role = ", ".join(x for x in (i.role, i.mutability if i.mutability != "immutable" else "", i.storage or "") if x)
        nid = f"in:{i.tensor}"
        nodes.append(DrawNode(nid, (i.tensor, _tstr(g.tensors[i.tensor]), f"input ({role})"),
                              "param" if i.role != "data" else "input"))
        producer[i.tensor] = nid
    for n in g.nodes:
        nid = f"op:{n.name}"
        kind = f"{n.op}.{n.fn}" if n.fn else n.op
        lines = [kind if n.name in n.outputs else f"{n.name}: {kind}"]
        lines += [f"{o}: {_tstr(g.tensors[o])}" for o in n.outputs]
        lines += [f"in{k} = {_value(x)}" for k, x in enumerate(n.inputs) if not isinstance(x, str)]
        lines += [f"{k}={_value(v)}" for k, v in n.attrs.items() if k != "fn"]
        nodes.append(DrawNode(nid, tuple(lines)))
        for k, x in enumerate(n.inputs):
            if isinstance(x, str):
                edges.append(DrawEdge(producer[x], nid, x if len(n.inputs) == 1 else f"{k}: {x}"))
        for o in n.outputs:
            producer[o] = nid
    for o in g.outputs:
        nid = f"out:{o}"
        nodes.append(DrawNode(nid, (o, _tstr(g.tensors[o]), "output"), "output"))
        edges.append(DrawEdge(producer[o], nid, o))
    return Drawing(f"{g.name} (frontend)", tuple(nodes), tuple(edges))


def tiny_drawing(t: TinyGraph) -> Drawing:
    """One node per uop (id, uop, dtype[shape], arg, immediates); inputs and outputs set apart."""
    from kumiko.tiny.ir import arg_to_json
    names = {nid: tensor for tensor, nid in t.inputs}
    nodes: list[DrawNode] = []
    edges: list[DrawEdge] = []
    for n in t.nodes.values():
        head = f"{n.id} {n.uop}" + (f" {names[n.id]}" if n.id in names else "")
        lines = [head, f"{n.dtype.name}[{', '.join(str(dim_json(d)) for d in n.shape)}]"]
        arg = arg_to_json(n.uop, n.arg)
        lines += [f"{k}={_value(v)}" for k, v in arg.items() if not (n.uop == "INPUT" and k in ("tensor_id", "dtype",
                                                                                                  "shape"))]
        lines += [f"src{k} = {_value(s)}" for k, s in enumerate(n.src) if not isinstance(s, str)]
        kind = "input" if n.uop == "INPUT" else "const" if n.uop == "CONST" else "op"
        nodes.append(DrawNode(n.id, tuple(lines), kind))
        refs = [s for s in n.src if isinstance(s, str)]
        for k, s in enumerate(n.src):
            if isinstance(s, str):
                edges.append(DrawEdge(s, n.id, str(k) if len(refs) > 1 else ""))
    for tensor, nid in t.outputs:
        out = f"out:{tensor}"
        node = t.nodes[nid]
        nodes.append(DrawNode(out, (tensor, f"{node.dtype.name}[{', '.join(str(dim_json(d)) for d in node.shape)}]",
                                    "output"), "output"))
        edges.append(DrawEdge(nid, out))
    return Drawing(f"{t.name} (tiny)", tuple(nodes), tuple(edges))


def _frontend(program: Graph | TinyGraph) -> Drawing:
    if not isinstance(program, Graph):
        raise KumikoError("E1009", at="dump", why="the frontend stage needs a frontend graph, not a Tiny IR dump")
    return frontend_drawing(program)


def _tiny(program: Graph | TinyGraph) -> Drawing:
    return tiny_drawing(program if isinstance(program, TinyGraph) else program.tiny)


#: stage -> the Drawing of a program at that stage (later stages register themselves)
DRAWINGS: dict[str, Callable[[Graph | TinyGraph], Drawing]] = {"frontend": _frontend, "tiny": _tiny}


def register_drawing(stage: str, fn: Callable[[Graph | TinyGraph], Drawing]) -> None:
    DRAWINGS[stage] = fn


def to_dot(program: Graph | TinyGraph, stage: str | None = None, clusters: Sequence[Cluster] = ()) -> str:
    """DOT text of a program at ``stage`` (default: frontend for a Graph, tiny for a TinyGraph);
    ``clusters`` draws boxes around groups of the drawing's nodes."""
    stage = stage or ("frontend" if isinstance(program, Graph) else "tiny")
    if stage not in DRAWINGS:
        from kumiko.pipeline import STAGES
        why = f"the {stage!r} stage has no picture yet" if stage in STAGES else f"unknown stage {stage!r}"
        raise KumikoError("E1010", at="dump --format", why=why,
                          suggestion=f"draw one of: {', '.join(DRAWINGS)}; or dump the stage as JSON")
    d = DRAWINGS[stage](program)
    if clusters:
        d = replace(d, clusters=d.clusters + tuple(clusters))
    return render_dot(d)


def dot_available() -> bool:
    return shutil.which("dot") is not None


INSTALL_HINT = ("install graphviz (Debian/Ubuntu: apt-get install graphviz; Fedora: dnf install graphviz; "
                "macOS: brew install graphviz; conda: conda install graphviz), or use --format dot and render "
                "the file elsewhere")


def to_svg(dot_text: str) -> str:
    """Render DOT text with graphviz's ``dot -Tsvg``."""
    exe = shutil.which("dot")
    if exe is None:
        raise KumikoError("E1501", at="dump --format svg", why="graphviz's `dot` program is not installed",
                          suggestion=INSTALL_HINT)
    try:
        r = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KumikoError("E1501", at="dump --format svg", why=f"running dot failed: {e}",
                          suggestion=INSTALL_HINT) from None
    if r.returncode != 0:
        raise KumikoError("E1501", at="dump --format svg", why=f"dot failed: {r.stderr.strip()[:500]}",
                          suggestion="report this as a kumiko bug (the DOT it wrote did not render)")
    return r.stdout


def draw(program: Graph | TinyGraph, stage: str, fmt: str) -> str:
    """The picture of one stage as ``dot`` or ``svg`` text."""
    if fmt not in ("dot", "svg"):
        raise KumikoError("E1010", at="dump --format", why=f"unknown picture format {fmt!r}",
                          suggestion="use --format dot or --format svg")
    text = to_dot(program, stage)
    return to_svg(text) if fmt == "svg" else text


def draw_stages(program: Graph | TinyGraph, stages: Sequence[str], fmt: str) -> dict[str, str]:
    """Pictures of several stages: stage -> text, all drawn before the caller writes any (a failure writes
    nothing; the CLI writes them under file names ``pipeline.dump_path`` makes safe)."""
    return {s: draw(program, s, fmt) for s in stages}
