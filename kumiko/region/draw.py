"""The picture of the region stage: each kernel is a cluster of its lets; MemRefs (inputs, intermediate
buffers, outputs) sit outside and connect the kernels in execution order."""
from __future__ import annotations

from kumiko.region.srnf import children
from kumiko.region.ssa import Gather, Program, Read, Reduce, Ref, RExpr
from kumiko.util.drawing import Cluster, DrawEdge, Drawing, DrawNode


def _uses(e: RExpr) -> tuple[set, set]:
    """(MemRefs read, lets referenced) by an expression."""
    reads: set = set()
    refs: set = set()

    def walk(x: RExpr) -> None:
        if isinstance(x, (Read, Gather)):
            reads.add(x.tensor)
        if isinstance(x, Ref):
            refs.add(x.name)
        for k in children(x):
            walk(k)
    walk(e)
    return reads, refs


def _kind(e: RExpr) -> str:
    if isinstance(e, Reduce):
        return f"reduce {e.op} over {', '.join(a.name for a in e.axes)}"
    return getattr(e, "fn", None) or type(e).__name__.lower()


def _mem(m) -> str:
    return f"{m.dtype}[{', '.join(str(d) for d in m.shape)}]"


def draw_program(p: Program) -> Drawing:
    """The picture of a region Program: a cluster per kernel."""
    nodes, edges, clusters = [], [], []
    outputs = {n for n, _ in p.outputs}
    for n, m in p.inputs:
        nodes.append(DrawNode(f"mem:{n}", (n, _mem(m)), "input"))
    for n, m in p.buffers:
        nodes.append(DrawNode(f"mem:{n}", (n, _mem(m), "intermediate"), "const"))
    for n, m in p.outputs:
        nodes.append(DrawNode(f"mem:{n}", (n, _mem(m)), "output"))
    for r in p.regions:
        members = []
        for let in r.lets:
            nid = f"{r.name}:{let.name}"
            members.append(nid)
            nodes.append(DrawNode(nid, (let.name, _kind(let.expr))))
            reads, refs = _uses(let.expr)
            edges += [DrawEdge(f"mem:{t}", nid) for t in sorted(reads)]
            edges += [DrawEdge(f"{r.name}:{x}", nid) for x in sorted(refs)]
        for y in r.yields:
            edges.append(DrawEdge(f"{r.name}:{y.src}", f"mem:{y.to}", "yield" + (f" {y.cast}" if y.cast else "")))
        mat = ", ".join(o.materialize for o in r.outputs if o.name not in outputs) or "gmem"
        clusters.append(Cluster(r.name, f"kernel {r.name} ({mat})", tuple(members)))
    return Drawing(f"{p.name}: regions", tuple(nodes), tuple(edges), tuple(clusters))
