"""Building and loading Tiny IR: every node passes through ``infer`` exactly once, so a TinyGraph that
exists is well-typed. ``load`` additionally checks ids (unique, defined, acyclic) of a dumped graph."""
from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim, dims
from kumiko.tiny.ir import Node, TinyGraph, arg_from_json, imm_load, infer, is_ref
from kumiko.util import reachable


class TinyBuilder:
    """Appends nodes with fresh ids (``n0, n1, ...``); the helpers skip no-op movements."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.nodes: dict[str, Node] = {}
        self._next = 0

    # core ---------------------------------------------------------------------------------------
    def add(self, uop: str, src: Iterable = (), tag: str | None = None, nid: str | None = None, **arg: Any) -> str:
        src = tuple(src)
        for s in src:
            if not is_ref(s) and not isinstance(s, numbers.Real):
                raise KumikoError("E1009", at=f"tiny:{nid or 'new'} ({uop})", why=f"source {s!r} is neither a "
                                  "node id nor a scalar immediate")
            if is_ref(s) and s not in self.nodes:
                raise KumikoError("E1007", at=f"tiny:{nid or 'new'} ({uop})", why=f"source {s!r} is not defined")
        if nid is None:
            while f"n{self._next}" in self.nodes:
                self._next += 1
            nid = f"n{self._next}"
        elif nid in self.nodes:
            raise KumikoError("E1016", at=f"tiny:{nid}", why=f"node id {nid!r} is defined twice")
        first = self.nodes[src[0]] if src and is_ref(src[0]) else None
        farg = arg_from_json(uop, arg, first.shape if first is not None else None)
        dt, shape = infer(nid, uop, [self.nodes[s] if is_ref(s) else s for s in src], farg)
        self.nodes[nid] = Node(nid, uop, src, farg, dt, shape, tag)
        return nid

    def node(self, nid: str) -> Node:
        return self.nodes[nid]

    def shape(self, nid: str) -> tuple:
        return self.nodes[nid].shape

    def dtype(self, nid: str) -> dtypes.DType:
        return self.nodes[nid].dtype

    def finish(self, inputs: Iterable[tuple[str, str]], outputs: Iterable[tuple[str, str]],
               symbols: Mapping[str, int] | None = None, signature: Mapping | None = None) -> TinyGraph:
        live = reachable([n for _, n in outputs], lambda nid: self.nodes[nid].refs)
        inputs = tuple(inputs)
        keep = {nid: n for nid, n in self.nodes.items() if nid in live or nid in dict(inputs).values()}
        return TinyGraph(keep, inputs, tuple(outputs), dict(symbols or {}), dict(signature or {}), self.name)

    # movement helpers (no-ops skipped) ------------------------------------------------------------
    def const(self, value, dtype: dtypes.DType | str, shape: Iterable = ()) -> str:
        dt = dtypes.lookup(dtype)
        c = self.add("CONST", value=value, dtype=dt.name)
        shape = dims(shape)
        if not shape:
            return c
        return self.expand(self.reshape(c, (1,) * len(shape)), shape)

    def reshape(self, x: str, shape: Iterable) -> str:
        shape = dims(shape)
        return x if shape == self.shape(x) else self.add("RESHAPE", [x], result_shape=shape)

    def permute(self, x: str, perm: Iterable[int]) -> str:
        perm = tuple(perm)
        return x if perm == tuple(range(len(perm))) else self.add("PERMUTE", [x], perm=perm)

    def expand(self, x: str, shape: Iterable) -> str:
        shape = dims(shape)
        return x if shape == self.shape(x) else self.add("EXPAND", [x], result_shape=shape)

    def broadcast_to(self, x: str, shape: Iterable) -> str:
        """Right-aligned broadcast: reshape to add leading 1s, then EXPAND (seed 002 §0)."""
        shape = dims(shape)
        xs = self.shape(x)
        if len(xs) < len(shape):
            x = self.reshape(x, (1,) * (len(shape) - len(xs)) + xs)
        return self.expand(x, shape)

    def cast(self, x: str, to: dtypes.DType | str) -> str:
        to = dtypes.lookup(to)
        return x if self.dtype(x) is to else self.add("CAST", [x], to=to.name)

    def pad(self, x: str, pads: Iterable, value: Any = 0) -> str:
        pads = tuple((dim(a), dim(b)) for a, b in pads)
        if all(a == 0 and b == 0 for a, b in pads):
            return x
        return self.add("PAD", [x], pad=pads, value=value)

    def shrink(self, x: str, lo: Iterable, hi: Iterable, step: Iterable[int] | None = None) -> str:
        lo, hi = dims(lo), dims(hi)
        step = tuple(step) if step is not None else (1,) * len(lo)
        if all(a == 0 for a in lo) and hi == self.shape(x) and all(s == 1 for s in step):
            return x
        if all(s == 1 for s in step):
            return self.add("SHRINK", [x], lo=lo, hi=hi)
        return self.add("SHRINK", [x], lo=lo, hi=hi, step=step)

    def flip(self, x: str, axes: Iterable[int]) -> str:
        axes = tuple(sorted(axes))
        return x if not axes else self.add("FLIP", [x], axes=axes)

    def reduce(self, x: str, op: str, axes: Iterable[int], acc: dtypes.DType | str) -> str:
        axes = tuple(sorted(a % len(self.shape(x)) for a in axes))
        return self.add("REDUCE", [x], op=op, axes=axes, dtype=dtypes.lookup(acc).name)


# ------------------------------------------------------------------------------------------------

_MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError)


def load(d: Mapping) -> TinyGraph:
    """A TinyGraph from its JSON dump (or a hand-written seed-002 style ``{"uops": [...]}``).

    Whatever the dump holds, a bad one is a diagnostic (never a Python traceback)."""
    try:
        return _load(d)
    except _MALFORMED as e:
        raise KumikoError("E1009", at="tiny", why=f"malformed Tiny IR ({type(e).__name__}: {e})") from e


def _load(d: Mapping) -> TinyGraph:
    if not isinstance(d, Mapping) or not isinstance(d.get("uops"), list):
        raise KumikoError("E1009", at="tiny", why="a Tiny IR file needs a 'uops' list")
    raw: dict[str, Mapping] = {}
    for i, u in enumerate(d["uops"]):
        if not isinstance(u, Mapping) or not isinstance(u.get("id"), str) or not isinstance(u.get("uop"), str):
            raise KumikoError("E1009", at=f"tiny:uops[{i}]", why="each uop needs a string 'id' and 'uop'")
        if u["id"] in raw:
            raise KumikoError("E1016", at=f"tiny:{u['id']}", why=f"node id {u['id']!r} is defined twice")
        raw[u["id"]] = u
    srcs = {nid: [imm_load(s) for s in u.get("src", [])] for nid, u in raw.items()}
    for nid, ss in srcs.items():
        for s in ss:
            if is_ref(s) and s not in raw:
                raise KumikoError("E1007", at=f"tiny:{nid} ({raw[nid]['uop']})", why=f"source {s!r} is not defined")
    order = _topo(srcs)
    b = TinyBuilder(d.get("name", "main"))
    for nid in order:
        u = raw[nid]
        try:
            b.add(u["uop"], srcs[nid], tag=u.get("tag"), nid=nid, **dict(u.get("arg") or {}))
        except _MALFORMED as e:
            raise KumikoError("E1010", at=f"tiny:{nid} ({u['uop']})", why=f"bad arg or src "
                              f"({type(e).__name__}: {e})") from e
        n = b.node(nid)
        if "dtype" in u and dtypes.lookup(u["dtype"]) is not n.dtype:
            raise KumikoError("E1011", at=f"tiny:{nid} ({n.uop})", why=f"declared dtype {u['dtype']} but the node "
                              f"computes {n.dtype}")
        if "shape" in u and dims(u["shape"]) != n.shape:
            raise KumikoError("E1011", at=f"tiny:{nid} ({n.uop})", why=f"declared shape {u['shape']} but the node "
                              f"computes {[str(x) for x in n.shape]}")
    if "outputs" in d:
        outputs = [(o["tensor"], o["node"]) for o in d["outputs"]]
    else:  # a bare uop list: every node no one consumes is an output
        used = {r for n in b.nodes.values() for r in n.refs}
        outputs = [(nid, nid) for nid in b.nodes if nid not in used]
    if "inputs" in d:
        inputs = [(o["tensor"], o["node"]) for o in d["inputs"]]
    else:
        inputs = [(n.arg["tensor_id"], nid) for nid, n in b.nodes.items() if n.uop == "INPUT"]
    for t, nid in list(outputs) + list(inputs):
        if not isinstance(t, str) or not isinstance(nid, str):
            raise KumikoError("E1009", at="tiny:outputs", why=f"input/output entries map a tensor name to a node id "
                              f"(strings), got {t!r} -> {nid!r}")
        if nid not in b.nodes:
            raise KumikoError("E1007", at="tiny:outputs", why=f"output/input node {nid!r} is not defined")
    b._next = len(b.nodes)
    symbols = d.get("symbols") or {}
    if not isinstance(symbols, Mapping) or not all(isinstance(k, str) and isinstance(v, int) and
                                                   not isinstance(v, bool) for k, v in symbols.items()):
        raise KumikoError("E1009", at="tiny.symbols", why="'symbols' must map size names to ints")
    return b.finish(inputs, outputs, symbols, d.get("signature"))


def _topo(srcs: Mapping[str, list]) -> list[str]:
    """Kahn's algorithm, stable in file order; a leftover node means a cycle."""
    indeg = {nid: sum(1 for s in ss if is_ref(s)) for nid, ss in srcs.items()}
    users: dict[str, list[str]] = {nid: [] for nid in srcs}
    for nid, ss in srcs.items():
        for s in ss:
            if is_ref(s):
                users[s].append(nid)
    ready = [nid for nid in srcs if indeg[nid] == 0]
    order: list[str] = []
    pos = {nid: i for i, nid in enumerate(srcs)}
    while ready:
        ready.sort(key=pos.__getitem__)
        nid = ready.pop(0)
        order.append(nid)
        for u in users[nid]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(order) != len(srcs):
        stuck = sorted(set(srcs) - set(order), key=pos.__getitem__)
        raise KumikoError("E1008", at=f"tiny:{stuck[0]}", why=f"nodes {stuck} depend on each other in a cycle")
    return order
