"""Compute-at legality, footprints, halo and minimum buffer (seed 003; seed 001 §4.6, §7).

Computing a producer P *at* a consumer C's loops means: for each tile of C, compute exactly the P
instances the tile needs, inside the tile's iteration. Seed 003's rule, done with ISL:

1. **Backward slice** (the pre-image of the tile). A tile is a box ``o_d <= d < o_d + T_d`` over C's
   dims, with the origins ``o_d`` and symbolic sizes ``T_d`` as extra ISL parameters — a tile never
   needs ``T*t`` (non-affine), which is how symbolic tiles stay affine (seed 003: strip-mining is left
   to code generation). Walking the blocks between P and C backwards (reads, then the inverse of
   each producer's write), ISL gives the instances of every block and the elements of every array
   the tile touches. Per array axis ``dim_min``/``dim_max`` give the footprint as affine expressions
   of the tile; ``extent - advance`` (advance: how far the footprint moves when the tile moves by one
   tile) is the halo, the part neighbouring tiles both read. Footprints count padded positions.
2. **Schedule check.** C's instance ``j`` runs at ``(out(j), |group|, j)``; a producer instance at
   ``(place(i), pos, i)`` where ``place`` is, by default, the lexicographically first consumer point
   that needs it (ISL ``lexmin``), or a placement you give (``"aligned"``: naive loop fusion, the
   producer's loops share the consumer's counters). Legal iff every dependence among the fused
   blocks (ISL dataflow) goes from an earlier to a later time; otherwise E1305 with a violating pair.
3. **Minimum buffer** for P's value: ``reg`` when each element is used by a single consumer point
   (the relation element -> consumer point is single-valued: produce and consume in one thread);
   otherwise ``smem_ring`` when the tile footprint is bounded by the tile (depth 3 with a cross-tile
   halo, else 2: one slot loading while one is read); ``gmem`` when it grows with a size symbol.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import islpy as isl

from kumiko.diagnostics import KumikoError
from kumiko.indexbook.expr import param_names, pw_aff_to_expr
from kumiko.poly.core import Dependences, dependences, umaps
from kumiko.poly.view import Block, PolyView, union_of
from kumiko.symbolic import Expr


@dataclass(frozen=True)
class AxisExtent:
    axis: str
    lo: Expr | None
    hi: Expr | None
    extent: Expr | None
    advance: Expr | None
    halo: Expr | None

    def to_json(self) -> dict:
        return {"lo": _j(self.lo), "hi": _j(self.hi), "extent": _j(self.extent), "halo": _j(self.halo)}


def _j(e: Expr | None):
    if e is None:
        return None
    return e.as_int() if e.as_int() is not None else str(e)


@dataclass(frozen=True, eq=False)
class Footprint:
    array: str
    set: isl.Set
    axes: tuple[AxisExtent, ...]
    itemsize: int

    @property
    def elements(self) -> Expr | None:
        out = Expr((), 1)
        for a in self.axes:
            if a.extent is None:
                return None
            out = out * a.extent
        return out

    @property
    def halo_elements(self) -> Expr | None:
        own = Expr((), 1)
        for a in self.axes:
            if a.extent is None or a.advance is None:
                return None
            own = own * (a.advance if a.advance != 0 else a.extent)
        el = self.elements
        return None if el is None else el - own

    def to_json(self) -> dict:
        el, he = self.elements, self.halo_elements
        return {"per_axis": {a.axis: a.to_json() for a in self.axes}, "elements": _j(el),
                "bytes": _j(None if el is None else el * self.itemsize),
                "halo_bytes": _j(None if he is None else he * self.itemsize)}


@dataclass(frozen=True, eq=False)
class ComputeAt:
    producer: str
    consumer: str
    ok: bool
    tile: Mapping[str, int | str]
    group: tuple[str, ...] = ()
    slices: Mapping[str, isl.Set] = field(default_factory=dict)
    footprints: Mapping[str, Footprint] = field(default_factory=dict)
    min_buffer: Mapping[str, object] = field(default_factory=dict)
    placement: Mapping[str, str] = field(default_factory=dict)
    diagnostic: KumikoError | None = None
    violation: str | None = None
    value: str = ""                    # the array of the producer's value

    @property
    def value_footprint(self) -> Footprint | None:
        return self.footprints.get(self.value)

    def halo(self) -> dict:
        """Seed 001 §7 shape: the halo of a consumer tile over the producer's value."""
        fp = self.value_footprint
        if fp is None:
            return {"bytes": None, "per_axis": {}}
        he = fp.halo_elements
        return {"bytes": _j(None if he is None else he * fp.itemsize),
                "per_axis": {a.axis: _j(a.halo) for a in fp.axes}}

    def to_json(self, detail: bool = True) -> dict:
        d: dict = {"ok": self.ok, "producer": self.producer, "consumer": self.consumer,
                   "tile": {k: v for k, v in self.tile.items()}, "halo": self.halo()}
        if self.min_buffer:
            d["min_buffer"] = dict(self.min_buffer)
        if self.diagnostic is not None:
            d["diagnostic"] = self.diagnostic.to_dict()
        if detail:
            d["group"] = list(self.group)
            d["footprints"] = {k: f.to_json() for k, f in sorted(self.footprints.items())}
            d["placement"] = dict(self.placement)
        return d


# ------------------------------------------------------------------------------------------------

def between(view: PolyView, producer: str, consumer: str) -> list[str]:
    """Blocks on some dependence path producer -> ... -> consumer (producer included, consumer not)."""
    succ: dict[str, set[str]] = {b: set() for b in view.blocks}
    pred: dict[str, set[str]] = {b: set() for b in view.blocks}
    for e in view.edges:
        succ[e.producer].add(e.consumer)
        pred[e.consumer].add(e.producer)

    def closure(start: str, nxt: dict[str, set[str]]) -> set[str]:
        seen: set[str] = set()
        stack = list(nxt[start])
        while stack:
            b = stack.pop()
            if b not in seen:
                seen.add(b)
                stack.extend(nxt[b])
        return seen
    down = closure(producer, succ) | {producer}
    up = closure(consumer, pred)
    return [b for b in view.blocks if b in down and b in up and b != consumer]


def default_tile(view: PolyView, b: Block) -> dict[str, int | str]:
    """A symbolic tile ``T_<dim>`` per output dim and per symbolic reduce dim; constant windows whole."""
    out: dict[str, int | str] = {}
    for d, s in zip(b.dims, b.sizes):
        e = Expr.lift(s)
        if e == 1:
            continue
        if d in b.reduce_dims and e.as_int() is not None:
            continue
        out[d] = f"T_{d}"
    return out


class _Tile:
    """The tile box as ISL: origins ``o_<dim>`` and symbolic sizes are extra parameters."""

    def __init__(self, view: PolyView, c: Block, tile: Mapping[str, int | str]):
        self.view, self.c = view, c
        taken = set(view.table.names)
        self.size: dict[str, Expr] = {}
        self.origin: dict[str, str] = {}
        for d in c.dims:
            if d in tile:
                t = tile[d]
            elif d in c.out_dims:
                t = 1
            else:
                continue   # an untiled reduce dim: the whole extent
            o = f"o_{d}"
            while o in taken:
                o = "_" + o
            self.origin[d] = o
            self.size[d] = Expr.lift(t)     # an int, a symbol ("TH") or an affine size ("2*TB")
        syms = sorted({n for e in self.size.values() for n in e.symbols()} - taken)
        self.params = view.table.names + list(self.origin.values()) + syms
        hdr = "[" + ", ".join(self.params) + "]"
        box = [f"{o} <= {d} < {o} + {self.size[d].to_isl()}" for d, o in self.origin.items()]
        sizes = {d: view.table.affine(Expr.lift(s)) for d, s in zip(c.dims, c.sizes)}
        ctx = [f"{n} >= 1" for n in view.table.names + syms]
        ctx += [f"{o} >= 0 and {o} + {self.size[d].to_isl()} <= {sizes[d].to_isl()}" for d, o in self.origin.items()]
        self.context = isl.Set(f"{hdr} -> {{ : {' and '.join(ctx)} }}")
        cons = " and ".join(box) if box else ""
        self.set = isl.Set(f"{hdr} -> {{ {c.stmt}[{', '.join(c.dims)}]{' : ' + cons if cons else ''} }}")
        self.set = self.set.intersect(c.domain).intersect_params(self.context)

    def advance(self, lo: Expr | None) -> Expr | None:
        if lo is None:
            return None
        out = Expr((), 0)
        for d, o in self.origin.items():
            out = out + lo.coeff(o) * self.size[d]
        return out


def _footprint(view: PolyView, tile: _Tile, name: str, s: isl.Set) -> Footprint:
    arr = view.arrays[name]
    info = view.book[arr.value_id]
    s = s.coalesce()
    axes = []
    for k in range(s.dim(isl.dim_type.set)):
        lo = pw_aff_to_expr(s.dim_min(k), tile.context)
        hi = pw_aff_to_expr(s.dim_max(k), tile.context)
        ext = None if lo is None or hi is None else hi - lo + 1
        adv = tile.advance(lo)
        halo = None if ext is None or adv is None else (ext - adv if adv != 0 else Expr((), 0))
        axes.append(AxisExtent(info.axes[k].name if k < len(info.axes) else f"a{k}", lo, hi, ext, adv, halo))
    return Footprint(name, s, tuple(axes), arr.itemsize)


def _slices(view: PolyView, c: Block, group: list[str], start: isl.Set | None):
    """(needed elements per array, needed instances per block) for the tile ``start`` of ``c``."""
    need: dict[str, isl.Set] = {}

    def add(arr: str, s: isl.Set) -> None:
        need[arr] = need[arr].union(s) if arr in need else s
    for r in c.reads:
        if not r.accumulate:
            add(r.array, start.apply(r.virtual))
    slices: dict[str, isl.Set] = {}
    for name in reversed(group):
        b = view.blocks[name]
        elems = need.get(b.write.array)
        if elems is None:
            continue
        inst = elems.apply(b.write.rel.reverse()).coalesce()
        slices[name] = inst
        for r in b.reads:
            if not r.accumulate:
                add(r.array, inst.apply(r.virtual))
    return need, slices


def _needed_by(view: PolyView, c: Block, group: list[str]) -> tuple[dict[str, isl.Map], dict[str, isl.Map]]:
    """Per array and per block: consumer instance -> element / instance it (transitively) needs."""
    need: dict[str, isl.Map] = {}

    def add(arr: str, m: isl.Map) -> None:
        need[arr] = need[arr].union(m) if arr in need else m
    for r in c.reads:
        if not r.accumulate:
            add(r.array, r.rel)
    inst: dict[str, isl.Map] = {}
    for name in reversed(group):
        b = view.blocks[name]
        if b.write.array not in need:
            continue
        m = need[b.write.array].apply_range(b.write.rel.reverse()).coalesce()
        inst[name] = m
        for r in b.reads:
            if not r.accumulate:
                add(r.array, m.apply_range(r.rel))
    return need, inst


def _out_proj(view: PolyView, c: Block) -> isl.Map:
    return isl.Map(f"{view.table.header()} -> {{ {c.stmt}[{', '.join(c.dims)}] -> [{', '.join(c.out_dims)}] }}")


def _aligned(view: PolyView, b: Block, c: Block) -> isl.Map:
    """Naive loop fusion: the producer's non-unit output dims take the consumer's loop counters."""
    mine = [d for d, s in zip(b.out_dims, b.sizes) if Expr.lift(s) != 1]
    theirs = [k for k, (d, s) in enumerate(zip(c.out_dims, c.sizes)) if Expr.lift(s) != 1]
    if len(mine) != len(theirs):
        raise KumikoError("E1305", at=f"Poly-Core.compute_at({b.name} in {c.name})", why=f"cannot align the "
                          f"{len(mine)} loops of {b.name} with the {len(theirs)} loops of {c.name}")
    out = ["0"] * len(c.out_dims)
    for d, k in zip(mine, theirs):
        out[k] = d
    return isl.Map(f"{view.table.header()} -> {{ {b.stmt}[{', '.join(b.dims)}] -> [{', '.join(out)}] }}")


def _time(view: PolyView, b: Block, place: isl.Map, pos: int, width: int) -> isl.Map:
    pad = ["0"] * (width - len(b.dims))
    rest = isl.Map(f"{view.table.header()} -> {{ {b.stmt}[{', '.join(b.dims)}] -> "
                   f"[{', '.join([str(pos)] + list(b.dims) + pad)}] }}")
    return place.intersect_domain(b.domain).flat_range_product(rest.intersect_domain(b.domain))


def compute_at(view: PolyView, producer: str, consumer: str, tile: Mapping[str, int | str] | None = None,
               placement: str | Mapping[str, str] | None = None, deps: Dependences | None = None,
               all_footprints: bool = True) -> ComputeAt:
    """Can ``producer`` be computed at ``consumer``'s tile loops? (value ids or block names)

    ``deps``: the whole program's dependences, when already computed (Tiny IR is value-SSA: every
    element has one writer, so the dataflow among a subset of blocks is the restriction of the whole
    program's). ``all_footprints=False`` computes only the footprint of the producer's value.
    """
    p = view.blocks.get(producer) or view.block_of_value(producer)
    c = view.blocks.get(consumer) or view.block_of_value(consumer)
    if p is None or c is None:
        raise KumikoError("E1305", at="Poly-Core.compute_at", why=f"{producer if p is None else consumer} is not "
                          "a block of the Poly-View (movement values are folded into their readers)")
    tile = {d: (t if isinstance(t, int) else str(t)) for d, t in (default_tile(view, c) if tile is None
                                                                  else tile).items()}
    at = f"Poly-Core.compute_at({p.name} in {c.name})"
    group = between(view, p.name, c.name)
    if not group:
        why = (f"{p.name} reads what {c.name} computes" if between(view, c.name, p.name)
               else f"{p.name} does not flow into {c.name}")
        diag = KumikoError("E1305", at=at, why=why + "; there is nothing to compute at the consumer's loops")
        return ComputeAt(p.name, c.name, False, tile, diagnostic=diag)
    t = _Tile(view, c, tile)
    need, slices = _slices(view, c, group, t.set)
    fps = {a: _footprint(view, t, a, s) for a, s in sorted(need.items())
           if all_footprints or a == p.write.array}
    # schedule check
    _, needed = _needed_by(view, c, group)
    proj = _out_proj(view, c)
    width = max(len(view.blocks[g].dims) for g in group + [c.name])
    times = [_time(view, c, proj.intersect_domain(c.domain), len(group), width)]
    places: dict[str, str] = {}
    for pos, g in enumerate(group):
        b = view.blocks[g]
        given = placement.get(g) if isinstance(placement, Mapping) else None
        if placement == "aligned":
            pl = _aligned(view, b, c)
        elif given is not None:
            pl = isl.Map(given)
        elif g in needed:
            pl = needed[g].reverse().apply_range(proj).lexmin()
        else:
            continue
        places[g] = str(pl.coalesce())
        times.append(_time(view, b, pl, pos, width))
    theta = isl.UnionMap.from_map(times[0])
    for m in times[1:]:
        theta = theta.union(isl.UnionMap.from_map(m))
    fused = group + [c.name]
    if deps is None:
        dep = dependences(view, fused).all()
    else:
        stmts = {view.blocks[g].stmt for g in fused}
        dep = union_of([m for m in umaps(deps.all()) if m.get_tuple_name(isl.dim_type.in_) in stmts
                        and m.get_tuple_name(isl.dim_type.out) in stmts])
    bad = dep.intersect(theta.lex_ge_union_map(theta)).intersect_params(view.context)
    diag, example = None, None
    if not bad.is_empty():
        m = sorted(umaps(bad), key=str)[0]
        example = str(m.sample())
        src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        diag = KumikoError("E1305", at=at, why=f"under this placement {src} produces a value after {dst} needs it "
                           "(a dependence runs backwards in the fused schedule)", example=example)
    buf = _min_buffer(view, p, c, needed, fps.get(p.write.array))
    return ComputeAt(p.name, c.name, diag is None, tile, tuple(group), slices, fps, buf, places, diag, example,
                     p.write.array)


def _min_buffer(view: PolyView, p: Block, c: Block, needed: Mapping[str, isl.Map], fp: Footprint | None) -> dict:
    if p.name not in needed or fp is None:
        return {"buffer": "gmem", "depth": 1, "why": "the consumer does not read the producer's value"}
    users = needed[p.name].reverse().apply_range(_out_proj(view, c))
    sizes = set(view.table.names)
    if users.is_single_valued():
        return {"buffer": "reg", "depth": 1, "why": "each element is used by one consumer point"}
    exts = [a.extent for a in fp.axes]
    if any(e is None or param_names(e) & sizes for e in exts):
        return {"buffer": "gmem", "depth": 1, "why": "the tile footprint grows with a size symbol"}
    halo = any(a.halo is not None and a.halo != 0 for a in fp.axes)
    return {"buffer": "smem_ring", "depth": 3 if halo else 2,
            "why": "elements are shared by several consumer points" + (" and by neighbouring tiles" if halo else "")}
