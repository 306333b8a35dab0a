"""Poly-View (seed 001 §5): the SCoP of a graph as ISL sets and maps, built from the IndexBook.

One *block* (an ISL statement ``S_<value>``) per computed value — elementwise, REDUCE, or a
``non_scop`` boundary. Movement values are not blocks: the IndexBook already folded them into the
accesses. A ``MUL`` read only by a ``REDUCE(SUM)`` is merged into that REDUCE's block (its operands
read directly inside the reduction, as Region's C-CON1 will), and the pair is checked for a
ContractionPattern. A block's domain is its box over ``i*`` (and ``r*`` for a REDUCE); it writes its
value at ``[i*]`` and reads each base through the composed AxisMap, restricted to the pieces that
read. Pad pieces (where a constant replaces the read) are kept as separate ISL sets. Every relation
is coalesced and freed of redundant constraints; W2101 flags one that still has too many pieces.

Arrays are the signature tensors (by name, as in seed 001 §5.2: ``A[m,k]``) and computed values
(by id). Symbolic sizes are ISL parameters (``ParamTable``), every size >= 1 in the context.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import islpy as isl

from kumiko.diagnostics import KumikoError
from kumiko.indexbook.build import View
from kumiko.indexbook.expr import ParamTable, Range, isl_map_str, isl_set_str, lift
from kumiko.indexbook.model import Access, IndexBook, IndexInfo, fill_json
from kumiko.poly.contraction import ContractionPattern, detect

#: more basic sets than this in one access or pad set after coalescing is ExcessivePiecewise (W2101)
PIECE_LIMIT = 8


@dataclass(frozen=True, eq=False)
class Array:
    """A tensor in the ISL model: a signature tensor (by name) or a computed value (by id)."""
    name: str
    value_id: str
    tensor: str | None
    dtype: str
    shape: tuple
    box: isl.Set

    @property
    def itemsize(self) -> int:
        from kumiko import dtypes
        dt = dtypes.lookup(self.dtype)
        return dt.np.itemsize if dt is not None else 4


@dataclass(frozen=True, eq=False)
class AccessRel:
    """One read or write of a block: ``rel`` maps statement instances to array elements."""
    kind: str
    array: str
    value_id: str
    map: tuple | None                  # affine map over the block dims (None: not affine)
    rel: isl.Map
    pads: tuple[tuple[isl.Set, Any], ...] = ()
    operand: int | None = None         # which operand of the block's compute reads it
    accumulate: bool = False           # a REDUCE reading its own partial result
    full: isl.Map | None = None        # the map on the whole domain, pad pieces included (footprints)

    @property
    def virtual(self) -> isl.Map:
        """What a tile must hold: padded positions count (they are predicated, not skipped)."""
        return self.full if self.full is not None else self.rel


@dataclass(frozen=True, eq=False)
class Block:
    name: str
    kind: str                          # contraction_pattern | reduce | elementwise | non_scop
    uop: str
    nodes: tuple[str, ...]
    dims: tuple[str, ...]
    n_out: int
    sizes: tuple
    domain: isl.Set
    reads: tuple[AccessRel, ...]
    write: AccessRel
    dtype: str
    reduce_op: str | None = None
    contraction: ContractionPattern | None = None
    reason: str | None = None

    @property
    def stmt(self) -> str:
        return f"S_{self.name}"

    @property
    def out_dims(self) -> tuple[str, ...]:
        return self.dims[:self.n_out]

    @property
    def reduce_dims(self) -> tuple[str, ...]:
        return self.dims[self.n_out:]


@dataclass(frozen=True)
class Edge:
    """Value ``array`` written by block ``producer`` and read by block ``consumer``."""
    producer: str
    consumer: str
    array: str


@dataclass(frozen=True, eq=False)
class PolyView:
    name: str
    book: IndexBook
    table: ParamTable
    context: isl.Set
    arrays: Mapping[str, Array]
    blocks: Mapping[str, Block]
    edges: tuple[Edge, ...]
    diagnostics: tuple[KumikoError, ...] = ()

    def block_of_value(self, vid: str) -> Block | None:
        for b in self.blocks.values():
            if vid in b.nodes:
                return b
        return None

    def writer(self, array: str) -> Block | None:
        return next((b for b in self.blocks.values() if b.write.array == array), None)

    def reads(self, blocks=None) -> isl.UnionMap:
        return union_of([r.rel for b in self._sel(blocks) for r in b.reads])

    def writes(self, blocks=None) -> isl.UnionMap:
        return union_of([b.write.rel for b in self._sel(blocks)])

    def schedule(self, blocks=None) -> isl.UnionMap:
        """The original order: blocks one after the other (topological), each in lexicographic order."""
        sel = list(self._sel(blocks))
        width = max((len(b.dims) for b in sel), default=0)
        maps = []
        for pos, b in enumerate(self.blocks.values()):
            if b not in sel:
                continue
            pad = ", ".join(["0"] * (width - len(b.dims)))
            body = ", ".join([str(pos)] + list(b.dims) + ([pad] if pad else []))
            maps.append(isl.Map(f"{self.table.header()} -> {{ {b.stmt}[{', '.join(b.dims)}] -> [{body}] }}"))
        return union_of(maps)

    def _sel(self, blocks):
        return self.blocks.values() if blocks is None else [self.blocks[b] if isinstance(b, str) else b
                                                           for b in blocks]

    def verify(self) -> None:
        """Raise the first error diagnostic (out-of-bounds reads, missing div guards)."""
        self.book.verify()
        for d in self.diagnostics:
            if not d.is_warning:
                raise d


def union_of(maps) -> isl.UnionMap:
    out = None
    for m in maps:
        u = isl.UnionMap.from_map(m)
        out = u if out is None else out.union(u)
    return out if out is not None else isl.UnionMap("{ }")


def _simplify(x):
    return x.coalesce().remove_redundancies()


# ------------------------------------------------------------------------------------------------

class _Builder:
    def __init__(self, book: IndexBook):
        self.book = book
        self.table = book.param_table()
        self.ctx = self.table.context()
        self.arrays: dict[str, Array] = {}
        self.names: dict[str, str] = {}
        self.diags: list[KumikoError] = []
        # who reads a value, movement folded away: a MUL read only by one REDUCE is never materialised
        self.users: dict[str, list[str]] = {vid: [] for vid in book.values}
        for vid, info in book.values.items():
            if not info.is_movement:
                for acc in info.inputs:
                    self.users[acc.value_id].append(vid)

    def array(self, vid: str) -> Array:
        if vid in self.names:
            return self.arrays[self.names[vid]]
        info = self.book[vid]
        name = re.sub(r"\W", "_", info.tensor) if info.tensor and info.uop == "INPUT" else vid
        if not name or name[0].isdigit() or name in self.arrays or name.startswith("S_"):
            name = f"T_{name}"
        dims = [f"a{k}" for k in range(len(info.axes))]
        box = [Range.make(lift(d), 0, a.size).to_isl(self.table) for d, a in zip(dims, info.axes)]
        arr = Array(name, vid, info.tensor, info.dtype, info.shape, isl.Set(isl_set_str(self.table, name, dims, box)))
        self.arrays[name] = arr
        self.names[vid] = name
        return arr

    def merged_mul(self, info: IndexInfo) -> IndexInfo | None:
        """The MUL a REDUCE(SUM) sums, when nothing else reads it and it multiplies two values."""
        if info.reduce_op != "SUM" or len(info.inputs) != 1 or info.inputs[0].pieces:
            return None
        mul = self.book.values.get(info.inputs[0].value_id)
        if mul is None or mul.uop != "MUL" or len(mul.inputs) != 2 or self.users[mul.value_id] != [info.value_id]:
            return None
        return mul

    def build(self) -> PolyView:
        merged = set()
        blocks: dict[str, Block] = {}
        for info in self.book.values.values():
            mul = self.merged_mul(info) if info.uop == "REDUCE" else None
            if mul is not None:
                merged.add(mul.value_id)
        for vid, info in self.book.values.items():
            if info.uop in ("INPUT", "CONST") or info.is_movement or vid in merged:
                continue
            blocks[vid] = self.block(info)
        for vid, info in self.book.values.items():
            if info.uop in ("INPUT", "CONST"):
                self.array(vid)
        edges = []
        writer = {b.write.array: b.name for b in blocks.values()}
        for b in blocks.values():
            seen = set()
            for r in b.reads:
                p = writer.get(r.array)
                if p is not None and p != b.name and r.array not in seen:
                    seen.add(r.array)
                    edges.append(Edge(p, b.name, r.array))
        arrays = dict(sorted(self.arrays.items()))
        return PolyView(self.book.name, self.book, self.table, self.ctx, arrays, blocks, tuple(edges),
                        tuple(self.diags))

    def block(self, info: IndexInfo) -> Block:
        vid = info.value_id
        dims = tuple(info.vars)
        stmt = f"S_{vid}"
        box = " and ".join(r.to_isl(self.table) for r in info.box(with_reduce=True))
        domain = _simplify(isl.Set(isl_set_str(self.table, stmt, dims, [box])))
        accesses: list[Access] = list(info.inputs)
        nodes: tuple[str, ...] = (vid,)
        contraction = None
        mul = self.merged_mul(info) if info.uop == "REDUCE" else None
        if mul is not None:
            f = info.inputs[0].map
            accesses = [_compose(a, f) for a in mul.inputs]
            nodes = (mul.value_id, vid)
            names = [self.array(a.value_id).name for a in accesses]
            contraction = detect(info, accesses[0], accesses[1], names[0], names[1])
        reads = [self.access(stmt, dims, box, a, k) for k, a in enumerate(accesses)]
        me = self.array(vid)
        n_out = len(info.axes)
        out_map = tuple(lift(d) for d in dims[:n_out])
        write_rel = _simplify(isl.Map(isl_map_str(self.table, stmt, dims, me.name, out_map, [box])))
        write = AccessRel("write", me.name, vid, out_map, write_rel)
        if info.uop == "REDUCE":
            reads.append(AccessRel("read", me.name, vid, out_map, write_rel, accumulate=True))
        if info.non_scop:
            kind = "non_scop"
        elif contraction is not None:
            kind = "contraction_pattern"
        elif info.uop == "REDUCE":
            kind = "reduce"
        else:
            kind = "elementwise"
        sizes = tuple(a.size for a in info.axes + info.reduce)
        return Block(vid, kind, info.uop, nodes, dims, n_out, sizes, domain, tuple(reads), write, info.dtype,
                     info.reduce_op, contraction, info.reason)

    def access(self, stmt: str, dims: tuple, box: str, acc: Access, operand: int) -> AccessRel:
        arr = self.array(acc.value_id)
        if acc.map is None:
            adims = [f"a{k}" for k in range(len(arr.shape))]
            cons = [box] + [Range.make(lift(d), 0, s).to_isl(self.table) for d, s in zip(adims, arr.shape)]
            rel = isl.Map(f"{self.table.header()} -> {{ {stmt}[{', '.join(dims)}] -> {arr.name}[{', '.join(adims)}]"
                          f" : {' and '.join(cons)} }}")
            return AccessRel("read", arr.name, acc.value_id, None, rel, operand=operand)
        full = isl.Map(isl_map_str(self.table, stmt, dims, arr.name, acc.map, [box]))
        unclipped = _simplify(full)
        pads: list[tuple[isl.Set, Any]] = []
        if acc.pieces:
            covered = None
            read_set = None
            for p in acc.pieces:
                cons = [box] + [r.to_isl(self.table) for r in p.constraints]
                ps = isl.Set(isl_set_str(self.table, stmt, dims, cons))
                eff = ps if covered is None else ps.subtract(covered)
                covered = ps if covered is None else covered.union(ps)
                if eff.is_empty():
                    continue
                if p.reads:
                    read_set = eff if read_set is None else read_set.union(eff)
                else:
                    pads.append((_simplify(eff), p.fill))
            full = full.intersect_domain(read_set) if read_set is not None else full.subtract(full)
        rel = _simplify(full)
        self.check(stmt, arr, rel, pads)
        return AccessRel("read", arr.name, acc.value_id, acc.map, rel, tuple(pads), operand,
                         full=unclipped if pads else None)

    def check(self, stmt: str, arr: Array, rel: isl.Map, pads) -> None:
        if not rel.range().intersect_params(self.ctx).is_subset(arr.box):
            self.diags.append(KumikoError("E1401", at=f"Poly-View:{stmt}", why=f"the read of {arr.name} can leave "
                                          f"its bounds {[str(s) for s in arr.shape]}", access=str(rel)))
        n = max([rel.n_basic_map()] + [s.n_basic_set() for s, _ in pads])
        if n > PIECE_LIMIT:
            self.diags.append(KumikoError("W2101", at=f"Poly-View:{stmt}", why=f"the read of {arr.name} keeps {n} "
                                          f"pieces after coalesce/remove_redundancies (limit {PIECE_LIMIT})",
                                          at_value=arr.value_id))


def _compose(acc: Access, f) -> Access:
    v = View(acc.value_id, acc.map or (), acc.pieces).compose(tuple(f))
    return Access(acc.value_id, v.exprs if acc.map is not None else None, v.pieces, acc.tensor, acc.note)


def poly_view(book: IndexBook, emit: bool = True) -> PolyView:
    """Poly-View of an IndexBook (warnings are kept in ``diagnostics``, and emitted unless ``emit`` is
    False: a view built to answer one question about part of a graph)."""
    view = _Builder(book).build()
    for d in view.diagnostics if emit else ():
        if d.is_warning:
            from kumiko.diagnostics import warn
            warn(d.code, at=d.at, why=d.why, **d.details)
    return view


# ------------------------------------------------------------------------------------------------
# JSON (seed 001 §5.2 shape)

def rel_str(view: PolyView, rel, domain: isl.Set | None = None) -> str:
    """A relation printed compactly: known parameter facts and (optionally) the domain gisted away."""
    if domain is None:
        x = rel
    else:
        x = rel.gist(domain) if isinstance(rel, isl.Set) else rel.gist_domain(domain)
    return str(_simplify(x.gist_params(view.context)))


def block_json(view: PolyView, b: Block) -> dict:
    d: dict = {"name": b.name, "kind": b.kind, "uop": b.uop, "nodes": list(b.nodes), "dims": list(b.dims)}
    if b.reduce_op:
        d["reduce_op"] = b.reduce_op
    d["domain"] = {"set": rel_str(view, b.domain)}
    accs = []
    for r in b.reads + (b.write,):
        arr = view.arrays[r.array]
        a: dict = {"tensor": arr.name, "kind": r.kind}
        if arr.tensor and arr.name != arr.tensor:
            a["signature_tensor"] = arr.tensor
        a["map"] = rel_str(view, r.rel, b.domain)
        if r.map is None:
            a["affine"] = False
        if r.accumulate:
            a["accumulate"] = True
        if r.pads:
            a["pad_pieces"] = [{"set": rel_str(view, s, b.domain), "value": fill_json(v)} for s, v in r.pads]
        accs.append(a)
    d["accesses"] = accs
    d["attrs"] = b.contraction.to_json() if b.contraction else {}
    if b.reason:
        d["reason"] = b.reason
    return d


def to_json(view: PolyView) -> dict:
    return {
        "blocks": [block_json(view, b) for b in view.blocks.values()],
        "edges": [{"from": e.producer, "to": e.consumer, "value": e.array} for e in view.edges],
        "arrays": {n: {"value_id": a.value_id, "shape": [str(s) for s in a.shape], "dtype": a.dtype}
                   for n, a in view.arrays.items()},
    }
