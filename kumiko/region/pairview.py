"""Poly Core's compute-at verdicts for region formation, asked of the producer/consumer pair's own subgraph.

Region formation asks Poly Core whether a reducing producer may be computed at its consumer (rule
R-window). Building the whole graph's IndexBook and Poly-View for that took much of a network's region
stage (ResNet-50 under a profiler: 8 of 13 s, for 58 questions about 25 distinct subgraphs). The
answer depends only on the blocks on the dependence paths from the producer to the consumer, their
access relations and the consumer's domain, so each question is asked of a small graph:

- the nodes on some path producer -> consumer (both included; Tiny IR is value-SSA, so every element has
  one writer and the dataflow among these blocks is the restriction of the whole graph's);
- each such node's sources through their movement chains (movement values fold into their readers'
  access relations), and the MUL a REDUCE(SUM) sums (it merges into the contraction block);
- every other source becomes an INPUT of the same shape and dtype (an array no block of the pair writes);
  a MUL also read outside the pair gets a stand-in reader, so it stays a block of its own as in the graph.

The verdict is cached under the subgraph's canonical form (node ids renumbered in graph order), across
the graph and across compiles: a network's repeated blocks are analysed once.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Mapping

from kumiko.symbolic import dim_json
from kumiko.tiny.ir import MOVEMENT, FrozenDict, Node, TinyGraph, is_ref

#: verdicts kept across compiles (canonical subgraph -> (ok, why) or None)
CACHE_SIZE = 4096
_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()


def _path_nodes(g: TinyGraph, users: dict, producer: str, consumer: str) -> set[str]:
    """Nodes on some path producer -> ... -> consumer, both ends included."""
    up: set[str] = set()
    stack = [consumer]
    while stack:
        n = stack.pop()
        if n not in up:
            up.add(n)
            stack.extend(g.nodes[n].refs)
    if producer not in up:
        return {producer, consumer}
    down: set[str] = set()
    stack = [producer]
    while stack:
        n = stack.pop()
        if n not in down and n in up:
            down.add(n)
            stack.extend(users[n])
    return down | {consumer}


def pair_graph(g: TinyGraph, producer: str, consumer: str, users: Mapping[str, list] | None = None
               ) -> tuple[TinyGraph, tuple]:
    """The pair's subgraph (node ids kept) and its canonical form (the cache key). ``users``: ``g.consumers()``,
    when the caller has it (it walks the whole graph)."""
    users = g.consumers() if users is None else users
    keep = _path_nodes(g, users, producer, consumer)
    stack = list(keep)
    while stack:        # movement chains and a contraction's MUL fold into their readers' blocks
        n = g.nodes[stack.pop()]
        for s in n.refs:
            sn = g.nodes[s]
            if s not in keep and (sn.uop in MOVEMENT or (sn.uop == "MUL" and n.uop == "REDUCE")):
                keep.add(s)
                stack.append(s)
    ext = {s for n in keep for s in g.nodes[n].refs if s not in keep}
    order = [nid for nid in g.nodes if nid in keep or nid in ext]
    num = {nid: k for k, nid in enumerate(order)}
    nodes: dict[str, Node] = {}
    canon = []
    for nid in order:
        n = g.nodes[nid]
        if nid in ext and n.uop != "CONST":
            nodes[nid] = Node(nid, "INPUT", (), FrozenDict(tensor_id=nid, shape=[dim_json(d) for d in n.shape],
                                                         dtype=n.dtype.name), n.dtype, n.shape)
            canon.append(("INPUT", n.dtype.name, str(n.shape)))
            continue
        nodes[nid] = n
        arg = tuple(sorted((k, repr(v)) for k, v in n.arg.items() if k != "tensor_id"))
        src = tuple(("ref", num[s]) if is_ref(s) else ("imm", repr(s)) for s in n.src)
        canon.append((n.uop, n.dtype.name, str(n.shape), arg, src))
        if n.uop == "MUL" and not set(users[nid]) <= keep:
            # read outside the pair too: a stand-in reader keeps it a block of its own, not merged into
            # the REDUCE that sums it (Poly-View merges a MUL only when that REDUCE is its one reader)
            sink = f"{nid}_reader"
            nodes[sink] = Node(sink, "NEG", (nid,), FrozenDict(), n.dtype, n.shape)
            canon.append(("NEG", ("ref", num[nid])))
    inputs = tuple((nid, nid) for nid, n in nodes.items() if n.uop == "INPUT")
    sub = TinyGraph(nodes, inputs, ((consumer, consumer),), dict(g.symbols), name=f"{g.name}.pair")
    key = (tuple(canon), num[producer], num[consumer], tuple(sorted(g.symbols.items())))
    return sub, key


def compute_at_verdict(g: TinyGraph, producer: str, consumer: str, users: Mapping[str, list] | None = None
                       ) -> tuple[bool, str] | None:
    """Poly Core's compute-at report on the pair: (legal with buffer class ``reg``, why), or None when
    Poly Core cannot analyse it (a value outside the SCoP, or the producer part of the consumer's block).
    ``users``: as for ``pair_graph``."""
    sub, key = pair_graph(g, producer, consumer, users)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    verdict = _analyse(sub, producer, consumer)
    with _lock:
        _cache[key] = verdict
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return verdict


def _analyse(sub: TinyGraph, producer: str, consumer: str) -> tuple[bool, str] | None:
    from kumiko.indexbook import build_indexbook
    from kumiko.poly import compute_at, poly_view
    try:
        view = poly_view(build_indexbook(sub), emit=False)
        pb = view.blocks.get(producer) or view.block_of_value(producer)
        cb = view.blocks.get(consumer) or view.block_of_value(consumer)
        if pb is None or cb is None or pb.name == cb.name:
            raise LookupError("not two statements")   # part of the consumer's own statement
        ca = compute_at(view, producer, consumer, all_footprints=False)
    except Exception:    # noqa: BLE001 - a value outside the SCoP: the caller falls back to the index check
        return None
    buf = dict(ca.min_buffer).get("buffer") if ca.min_buffer else None
    if not ca.ok:
        return False, ca.diagnostic.why if ca.diagnostic else "illegal"
    if buf != "reg":
        return False, f"minimum buffer {buf}: " + str(dict(ca.min_buffer).get("why", "producer elements are reused"))
    return True, str(dict(ca.min_buffer).get("why", "no recompute"))
