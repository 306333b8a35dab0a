"""Drawings as Graphviz DOT text (and SVG through graphviz's ``dot`` when installed): a leaf module.

A stage's picture is built in two steps: the stage gives a ``Drawing`` (labelled nodes, edges and
optional clusters), and ``render_dot`` writes any Drawing as DOT. Signature inputs sit in the top rank and
outputs in the bottom rank, each with its own shape and colour. The frontend and Tiny IR drawings are
``kumiko.frontend.visualize``'s, the region stage's ``kumiko.region.draw``'s; ``kumiko.pipeline.draw``
picks the one of a stage. The text is deterministic (node order follows the program, attributes keep their
order) so that pictures can be compared and checked in.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

from kumiko.diagnostics import KumikoError

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
