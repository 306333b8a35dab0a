"""Finding the first wrong node of a graph whose compiled outputs disagree with the evaluator.

``kumiko run --check`` says *that* an output is wrong; a fused kernel computes dozens of ops, so it cannot
say *where*. ``bisect`` recompiles the graph with every intermediate tensor exposed as an extra signature
output, runs that program on the target and the same program on the reference evaluator with the same
inputs, and compares every tensor in topological order (``kumiko.accuracy``: relative L2 error within
the tensor's dtype bound). The first tensor over its bound whose inputs are all within theirs was
computed wrongly by the kernel that computed it, not handed a wrong value by a producer.

Exposing an intermediate makes it a region root (R-out), so the exposed compile has other kernel
boundaries than the plain one: a bug that lives in one fusion can disappear, and one in the narrower
kernels can appear. The plain graph is therefore compiled and checked as well, and the result names the
plain compile's kernels (the regions and notes ``kumiko explain`` prints) that compute the node.
``batch`` exposes the tensors a few at a time (several smaller compiles, stopping after the batch that
holds the first wrong one) for graphs where one compile with every tensor exposed is too slow.

A Tiny IR program (a dump) is bisected node by node: its computing nodes (not inputs, constants or
movements, which only re-index a value checked elsewhere) are exposed under their node ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from kumiko.accuracy import OutputCheck, compare, judged_as
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph, SigInput
from kumiko.tiny.evaluate import evaluate
from kumiko.tiny.ir import MOVEMENT, TinyGraph


@dataclass(frozen=True)
class NodeCheck:
    """One checked tensor: the op that made it, its error against the evaluator, and where it ran.

    ``inputs`` pairs each tensor input with its own error (None for a graph input, which is given, not
    computed); ``kernels`` are the plain compile's regions that compute the value (several when a cheap
    value is recomputed in each consumer, none when the plain graph never computes it)."""
    index: int
    node: str
    op: str
    check: OutputCheck
    inputs: tuple = ()
    kernels: tuple = ()

    @property
    def tensor(self) -> str:
        return self.check.name

    @property
    def rel_l2(self) -> float:
        return self.check.rel_l2

    @property
    def ok(self) -> bool:
        return self.check.ok

    def to_json(self) -> dict:
        return {"index": self.index, "node": self.node, "op": self.op, "tensor": self.tensor,
                **self.check.to_json(), "kernels": list(self.kernels),
                "inputs": {t: None if e is None else e if np.isfinite(e) else "inf" for t, e in self.inputs}}


@dataclass(frozen=True)
class BisectResult:
    """``table``: every checked tensor in topological order; ``first_bad``: the first over its bound (None
    when all match); ``plain``: the plain graph's outputs, compiled without exposed intermediates;
    ``alone``: the first bad node evaluated by itself on the target's own values of its inputs, against
    the target's output (a small error there means its inputs' small errors grew, not a wrong kernel);
    ``notes``: the plain compile's notes of each kernel in ``first_bad.kernels``."""
    first_bad: NodeCheck | None
    table: tuple
    plain: tuple
    target: str
    sizes: dict
    compiles: int = 1
    alone: float | None = None
    notes: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.first_bad is None and all(c.ok for c in self.plain)

    @property
    def culprit(self) -> bool:
        """The first bad node's inputs all match, and evaluated alone on them it still disagrees: the kernel
        computing it is wrong."""
        b = self.first_bad
        return b is not None and all(e is None or e <= _bound_of(self.table, t) for t, e in b.inputs) and \
            (self.alone is None or self.alone > b.check.bound)

    def render(self) -> str:
        sizes = ",".join(f"{k}={v}" for k, v in sorted(self.sizes.items())) or "-"
        out = [f"bisect on {self.target} (sizes {sizes}): {len(self.table)} tensor(s) checked in {self.compiles} "
               "compile(s) with intermediates exposed"]
        for c in self.plain:
            out.append(f"  plain graph output {c.name}: relative L2 error {c.rel_l2:.3g} (bound {c.bound:g}): "
                       f"{'ok' if c.ok else 'MISMATCH'}")
        rows = [("#", "node", "op", "tensor", "dtype", "rel L2", "bound", "kernel (plain)", "")]
        rows += [(str(r.index), r.node, r.op, r.tensor, r.check.dtype, f"{r.rel_l2:.3g}", f"{r.check.bound:g}",
                  ",".join(r.kernels) or "-", "ok" if r.ok else "MISMATCH") for r in self.table]
        widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
        out += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
        out += ["  " + line for line in self.verdict()]
        return "\n".join(out)

    def verdict(self) -> list[str]:
        """What the table means, in words (also the diagnostic's ``why``, first line)."""
        b = self.first_bad
        if b is None:
            if self.ok:
                return ["every tensor matches the evaluator"]
            bad = ", ".join(c.name for c in self.plain if not c.ok)
            return [f"the plain graph's output {bad} is wrong, but with every intermediate exposed all tensors "
                    "match: the wrong value comes from a fusion that exposing intermediates breaks up (its "
                    "kernels are listed by `kumiko explain`)"]
        lines = [f"first wrong node: #{b.index} {b.node} ({b.op}) -> {b.tensor}: relative L2 error "
                 f"{b.rel_l2:.3g} > {b.check.dtype} bound {b.check.bound:g}"]
        ins = ", ".join(f"{t} " + ("(graph input)" if e is None else f"{e:.3g}") for t, e in b.inputs)
        lines.append(f"its inputs: {ins or 'none (constants only)'}")
        if self.alone is not None:
            lines.append(f"evaluated alone on the target's own input values: relative L2 error {self.alone:.3g}")
        lines.append(f"culprit: the kernel computing {b.node}" if self.culprit else
                     f"{b.node}'s inputs carry errors that this op amplifies: look at its producers")
        if all(c.ok for c in self.plain):
            lines.append("the plain graph's outputs match: the wrong value appears only with intermediates exposed")
        for k in b.kernels:
            lines.append(f"in the plain compile it runs in kernel {k}:")
            lines += [f"    {n}" for n in self.notes.get(k, ())]
        if not b.kernels:
            lines.append("the plain compile computes no kernel for it (a value no output needs)")
        return lines

    def error(self, table: bool = False) -> KumikoError | None:
        """E1705 for a mismatch (None when all match); ``table`` puts every row in the details (``--json``)."""
        if self.ok:
            return None
        b = self.first_bad
        extra = {"table": [r.to_json() for r in self.table]} if table else {}
        plain = {c.name: c.to_json() for c in self.plain}
        if b is None:
            c = next(c for c in self.plain if not c.ok)
            return KumikoError("E1705", at=f"output {c.name} on {self.target}", why=self.verdict()[0],
                               sizes=dict(self.sizes), outputs=plain, **extra)
        why = (f"the first tensor that differs from the evaluator is {b.tensor} (relative L2 error {b.rel_l2:.3g}, "
               f"{b.check.dtype} bound {b.check.bound:g}); " + ("its inputs match: the kernel computing it is wrong"
                                                                  if self.culprit else "its inputs already differ"))
        return KumikoError("E1705", at=f"node {b.node} ({b.op}) on {self.target}", why=why, sizes=dict(self.sizes),
                           kernels=list(b.kernels), inputs=dict(b.to_json()["inputs"]), outputs=plain, **extra)

    def to_json(self) -> dict:
        b = self.first_bad
        return {"target": self.target, "sizes": dict(self.sizes), "compiles": self.compiles, "ok": self.ok,
                "first_bad": None if b is None else {**b.to_json(), "culprit": self.culprit, "alone": self.alone},
                "plain": {c.name: c.to_json() for c in self.plain}, "table": [r.to_json() for r in self.table]}


def _bound_of(table: tuple, tensor: str) -> float:
    return next((r.check.bound for r in table if r.tensor == tensor), 0.0)


@dataclass(frozen=True)
class _Row:
    """A tensor to check, before it is checked: its name in the exposed program and what computed it."""
    tensor: str
    node: str
    op: str
    inputs: tuple            # tensor names (graph inputs among them)
    nids: tuple              # the Tiny IR nodes it lowered to (for the plain compile's kernels)


def bisect(graph: Graph | TinyGraph, inputs: Mapping[str, np.ndarray] | None = None, target: str = "cpu", *,
           batch: int | None = None, seed: int = 0, **options) -> BisectResult:
    """Compile ``graph`` for ``target`` with its intermediates exposed, run it and the evaluator on
    ``inputs`` (random ones from ``seed`` when None) and report the first tensor over its dtype's bound.
    ``batch``: expose at most this many tensors per compile. ``options`` go to ``kumiko.compile``."""
    from kumiko.compiler import Executable
    plain = Executable(graph, target, **options)
    inputs = dict(inputs) if inputs is not None else plain.random_inputs(seed)
    feeds = {**plain.params, **{k: np.asarray(v) for k, v in inputs.items()}}
    env = plain.bind(feeds)
    full = _expose(graph, _tensors(graph))
    rows = _rows(graph, full)
    want = evaluate(full.tiny if isinstance(full, Graph) else full, feeds, env)   # the plain outputs among them
    judged = judged_as(full.tiny if isinstance(full, Graph) else full)
    checks = tuple(compare(plain(**feeds), {t: want[t] for t in plain.output_names}, judged))
    got: dict[str, np.ndarray] = {}
    size = max(1, batch or len(rows) or 1)
    compiles = 0
    for start in range(0, len(rows), size):
        chunk = [r.tensor for r in rows[start:start + size]]
        exe = Executable(_expose(graph, chunk), target, **options) if batch else Executable(full, target, **options)
        out = exe(**feeds)
        compiles += 1
        got.update((t, out[t]) for t in chunk)
        if any(not c.ok for c in compare(got, {t: want[t] for t in chunk}, judged)):
            break                       # the first wrong tensor is in this batch: later ones cannot be first
    errs = {c.name: c for c in compare(got, {t: want[t] for t in got}, judged)}
    kernels, notes = _kernels(plain)
    table = tuple(NodeCheck(k, r.node, r.op, errs[r.tensor],
                            tuple((t, errs[t].rel_l2 if t in errs else None) for t in r.inputs),
                            kernels(r.nids)) for k, r in enumerate(rows) if r.tensor in errs)
    first = next((r for r in table if not r.ok), None)
    alone = None
    if first is not None and isinstance(graph, Graph):
        node = next(n for n in graph.nodes if n.name == first.node)
        alone = _alone(graph, node, first.tensor, {**feeds, **got}, env)
    return BisectResult(first, table, checks, target, dict(env), compiles, alone,
                        {k: notes[k] for k in (first.kernels if first else ()) if k in notes})


def _tensors(graph: Graph | TinyGraph) -> list[str]:
    """The tensors to check, in topological order: every op output of a Graph; every computing node of a
    Tiny IR program (named by node id, or ``<id>.bisect`` where a signature name already takes the id)."""
    if isinstance(graph, Graph):
        return [t for n in graph.nodes for t in n.outputs]
    taken = {t for t, _ in graph.inputs} | {t for t, _ in graph.outputs}
    return [nid if nid not in taken else f"{nid}.bisect" for nid, n in graph.nodes.items()
            if n.uop not in MOVEMENT and n.uop not in ("INPUT", "CONST")]


def _rows(graph: Graph | TinyGraph, full: Graph | TinyGraph) -> list[_Row]:
    """What computed each of ``_tensors(graph)``, exposed in ``full``."""
    if isinstance(graph, Graph):
        return [_Row(t, n.name, n.op + (f".{n.fn}" if n.fn else ""), tuple(x for x in n.inputs if isinstance(x, str)),
                     span) for n, span in zip(graph.nodes, _spans(graph, full)) for t in n.outputs]
    name = {t.removesuffix(".bisect"): t for t in _tensors(graph)}
    rows = []
    for nid in name:
        srcs = dict.fromkeys(_source(graph, s) for s in graph.nodes[nid].refs)
        rows.append(_Row(name[nid], nid, graph.nodes[nid].uop,
                         tuple(name.get(s, s) for s in srcs if graph.nodes[s].uop != "CONST"), (nid,)))
    return rows


def _spans(graph: Graph, full: Graph) -> list[tuple]:
    """The Tiny IR nodes each op of ``graph`` lowered to. Lowering adds an op's nodes after its inputs' and
    before the next op's, so they lie between the previous ops' outputs and its own in ``full``'s node order,
    and the ids are the plain graph's (one deterministic lowering; exposing outputs only prunes less). A
    graph whose own outputs' ids disagree would get wrong kernel names, so it gets none."""
    out_nid = dict(full.tiny.outputs)
    if any(out_nid.get(t) != nid for t, nid in graph.tiny.outputs):
        return [()] * len(graph.nodes)
    pos = {nid: k for k, nid in enumerate(full.tiny.nodes)}
    order = list(full.tiny.nodes)
    spans, done = [], -1
    for n in graph.nodes:
        last = max(pos[out_nid[t]] for t in n.outputs)
        # an op that adds no node (a reshape to the same shape) is its output's node, made earlier
        spans.append(tuple(order[done + 1:last + 1]) if last > done else tuple(out_nid[t] for t in n.outputs))
        done = max(done, last)
    return spans


def _source(g: TinyGraph, nid: str) -> str:
    """The node a movement chain re-indexes (a movement's error is its source's)."""
    while g.nodes[nid].uop in MOVEMENT:
        nid = g.nodes[nid].refs[0]
    return nid


def _expose(graph: Graph | TinyGraph, tensors: list[str]) -> Graph | TinyGraph:
    """``graph`` with ``tensors`` appended to its signature outputs (its own outputs first, names kept)."""
    if isinstance(graph, Graph):
        outs = tuple(dict.fromkeys((*graph.outputs, *tensors)))
        return Graph.make(graph.inputs, outs, graph.tensors, graph.nodes, graph.symbols, graph.name, graph.params)
    have = {t for t, _ in graph.outputs}
    extra = tuple((t, t.removesuffix(".bisect")) for t in tensors if t not in have)
    return TinyGraph(graph.nodes, graph.inputs, graph.outputs + extra, graph.symbols, graph.signature, graph.name)


_ROOT = re.compile(r"^root (\S+):")
_FUSES = re.compile(r"^fuses: (.*)$")


def _kernels(plain) -> tuple:
    """A function from an op's Tiny IR nodes to the plain compile's regions computing them (in execution
    order), and each region's notes. Read from the notes ``kumiko explain`` prints (``root nX: ...``,
    ``fuses: nA MUL, nB REDUCE``), the one record of what a region fuses. An op of movements only (a
    reshape) computes nothing: it is charged to the regions of the value it re-indexes."""
    from kumiko.region import form_regions
    program = getattr(plain._run, "program", None) or form_regions(plain.tiny)
    where: dict[str, list] = {}
    for r in program.regions:
        nids = set()
        for note in r.notes:
            if m := _ROOT.match(note):
                nids.add(m.group(1))
            elif m := _FUSES.match(note):
                nids.update(part.split()[0] for part in m.group(1).split(", ") if part)
        for nid in nids:
            where.setdefault(nid, []).append(r.name)
    tiny, rank = plain.tiny, {r.name: k for k, r in enumerate(program.regions)}

    def kernels(nids: tuple) -> tuple:
        nids = [nid for nid in nids if nid in tiny.nodes]
        computed = [nid for nid in nids if tiny.nodes[nid].uop not in (*MOVEMENT, "INPUT", "CONST")]
        found = {k for nid in computed or [_source(tiny, nid) for nid in nids[-1:]] for k in where.get(nid, ())}
        return tuple(sorted(found, key=rank.get))
    return kernels, {r.name: tuple(r.notes) for r in program.regions}


def _alone(graph: Graph, node, tensor: str, values: Mapping[str, np.ndarray], env: Mapping[str, int]) -> float | None:
    """``node`` evaluated by itself on ``values`` of its inputs, against ``values[tensor]``: the relative L2
    error of the target's value for that one op. None where the op cannot be cut out on its own."""
    names = list(dict.fromkeys(x for x in node.inputs if isinstance(x, str)))
    try:
        sub = Graph.make([SigInput(t) for t in names], node.outputs, {t: graph.tensors[t] for t in names}, [node],
                         graph.symbols, f"{graph.name}.{node.name}")
        want = evaluate(sub.tiny, {t: values[t] for t in names}, env)
    except KumikoError:
        return None
    return compare({tensor: values[tensor]}, {tensor: want[tensor]})[0].rel_l2
