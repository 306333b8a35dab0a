"""Pictures of the frontend and Tiny IR stages: each is a ``kumiko.util.drawing.Drawing``.

Signature inputs sit in the top rank and outputs in the bottom rank; ops show their kind, output names,
dtypes and shapes and their attributes. ``kumiko.pipeline.to_dot``/``draw`` render the picture of any
stage (later stages draw their own: the region stage in ``kumiko.region.draw``).
"""
from __future__ import annotations

from typing import Any

from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph, TensorType
from kumiko.symbolic import dim_json
from kumiko.tiny.ir import TinyGraph
from kumiko.util.drawing import DrawEdge, Drawing, DrawNode

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


def frontend_stage_drawing(program: Graph | TinyGraph) -> Drawing:
    if not isinstance(program, Graph):
        raise KumikoError("E1009", at="dump", why="the frontend stage needs a frontend graph, not a Tiny IR dump")
    return frontend_drawing(program)


def tiny_stage_drawing(program: Graph | TinyGraph) -> Drawing:
    return tiny_drawing(program if isinstance(program, TinyGraph) else program.tiny)
