"""Poly Core analyses on a PolyView (seed 001 §7): dependences, parallel/reduction axes, tail axes.

Dependences are ISL dataflow (``UnionAccessInfo.compute_flow``) under the original schedule — blocks
in topological order, each iterating its domain lexicographically:

* flow (RAW): sink = reads, must-source = writes (exact last-writer dataflow);
* anti (WAR): sink = writes, may-source = reads;
* output (WAW): sink = writes, must-source = writes.

In the value-SSA world of Tiny IR only a REDUCE rewrites its own partial result, so the dependences
inside a block are exactly its reduction's; an axis along which no dependence of the block has a
non-zero distance is parallel, the others carry the reduction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import islpy as isl

from kumiko.indexbook.expr import lift
from kumiko.poly.view import Block, PolyView


@dataclass(frozen=True, eq=False)
class Dependences:
    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap

    def all(self) -> isl.UnionMap:
        return self.flow.union(self.anti).union(self.output)

    def to_json(self) -> dict:
        return {k: umap_strs(getattr(self, k)) for k in ("flow", "anti", "output")}


def umap_strs(u: isl.UnionMap) -> list[str]:
    """A union map as a sorted list of its maps' strings (deterministic whatever ISL's hash order)."""
    return sorted(str(m.coalesce()) for m in umaps(u))


def umaps(u: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    u.foreach_map(out.append)
    return out


def dependences(view: PolyView, blocks=None) -> Dependences:
    """Flow/anti/output dependences among ``blocks`` (default: all) under the original schedule."""
    sched = view.schedule(blocks)
    reads, writes = view.reads(blocks), view.writes(blocks)
    flow = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(sched).compute_flow()
    anti = isl.UnionAccessInfo.from_sink(writes).set_may_source(reads).set_schedule_map(sched).compute_flow()
    out = isl.UnionAccessInfo.from_sink(writes).set_must_source(writes).set_schedule_map(sched).compute_flow()
    ctx = view.context
    return Dependences(*(f.get_may_dependence().gist_params(ctx).coalesce() for f in (flow, anti, out)))


def self_dependences(deps: Dependences, b: Block) -> isl.Map:
    space = b.domain.get_space()
    m = isl.Map.from_domain_and_range(b.domain, b.domain)
    return deps.all().extract_map(m.get_space()) if space else m


def carried_axes(view: PolyView, b: Block, deps: Dependences) -> list[str]:
    """Dims along which some dependence of the block on itself has a non-zero distance."""
    own = self_dependences(deps, b).intersect_params(view.context)
    if own.is_empty():
        return []
    delta = own.deltas()
    delta = delta.reset_tuple_id() if delta.has_tuple_id() else delta
    out = []
    names = ", ".join(f"d{k}" for k in range(len(b.dims)))
    for k, d in enumerate(b.dims):
        nz = isl.Set(f"{view.table.header()} -> {{ [{names}] : d{k} > 0 or d{k} < 0 }}")
        if not delta.intersect(nz).is_empty():
            out.append(d)
    return out


def axis_roles(view: PolyView, b: Block, deps: Dependences) -> dict:
    """Seed 001 §7 ``parallel_axes`` / ``reduce_axes`` (+ the dims that actually carry a dependence)."""
    carried = carried_axes(view, b, deps)
    return {"parallel_axes": [d for d in b.out_dims if d not in carried],
            "reduce_axes": list(b.reduce_dims), "carried_axes": carried}


def tail_axes(view: PolyView, b: Block, tile: Mapping[str, int | str] | None = None) -> list[str]:
    """Dims that need predication at a tile edge.

    With no tile, every dim whose extent is symbolic (no constant tile divides it for all sizes).
    With a tile, a dim tiled by ``t`` is a tail unless ISL proves ``t`` divides its extent for every
    size in the context; a symbolic tile size never divides provably. Untiled dims have no tail.
    """
    out = []
    for d, size in zip(b.dims, b.sizes):
        e = lift(size)
        if tile is None:
            if e.as_int() is None:
                out.append(d)
            continue
        t = tile.get(d)
        if t is None or t == 1:
            continue
        if not isinstance(t, int):
            out.append(d)
            continue
        if e.as_int() is not None:
            if e.as_int() % t:
                out.append(d)
            continue
        rem = isl.Set(f"{view.table.header()} -> {{ : ({view.table.affine(e).to_isl()}) mod {t} > 0 }}")
        if not rem.intersect_params(view.context).is_empty():
            out.append(d)
    return out
