"""The IndexBook data model (seed 001 §4): per value its axes, domain, AxisMaps, reduce axes, flags.

A value's ``inputs`` are *composed* accesses: movement chains are folded away, so every value reads
straight from a *base* value — a graph INPUT tensor, a CONST, a computed value (elementwise, REDUCE)
or a ``non_scop`` boundary. ``src_maps`` keep the one-step AxisMap to each Tiny source (the per-op
update rule's result, e.g. EXPAND's constant 0), so both views of the seed are available.

A piecewise read (``pieces``) is ordered and first-match: a point takes the first piece whose
constraints hold; the last piece has no constraints (``else_pad_piece`` in the dump). A piece either
reads through the map or yields its ``fill`` constant (a PAD value). Pieces are in the value's own
axis space; a REDUCE's accesses live in its (axes + reduce axes) space.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kumiko.diagnostics import KumikoError
from kumiko.indexbook.expr import (
    NonAffine,
    ParamTable,
    Range,
    axis_var,
    floor_atoms,
    guards_for,
    index_names,
    lift,
    red_var,
)
from kumiko.symbolic import Expr, dim, dim_json
from kumiko.tiny.ir import MOVEMENT

KINDS = ("iter", "reduce", "broadcast")
ELSE = "else_pad_piece"


@dataclass(frozen=True)
class Axis:
    """An axis of a value: ``id`` is unique in the book, ``name`` is ``i<k>`` (or ``r<k>`` for reduce)."""
    id: int
    name: str
    size: int | Expr
    kind: str = "iter"

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "size": dim_json(self.size), "kind": self.kind}

    @staticmethod
    def from_json(d: Mapping) -> "Axis":
        return Axis(int(d["id"]), d["name"], dim(d["size"]), d.get("kind", "iter"))


@dataclass(frozen=True)
class Piece:
    """Where ``constraints`` hold (and no earlier piece did): read through the map, or ``fill``."""
    constraints: tuple[Range, ...] = ()
    fill: Any = None

    @property
    def reads(self) -> bool:
        return self.fill is None

    def to_json(self) -> dict:
        cons = [r.parts() for r in self.constraints] if self.constraints else [[ELSE]]
        return {"constraints": cons, "value": "read" if self.fill is None else fill_json(self.fill)}

    @staticmethod
    def from_json(d: Mapping) -> "Piece":
        cons = d.get("constraints", [])
        rs = () if cons == [[ELSE]] else tuple(Range.from_parts(c) for c in cons)
        v = d.get("value", "read")
        return Piece(rs, None if v == "read" else _fill_load(v))


def fill_json(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return {"const": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    return v


def _fill_load(v: Any) -> Any:
    return float(v["const"]) if isinstance(v, dict) else v


@dataclass(frozen=True)
class Access:
    """An AxisMap: value ``value_id`` is read at ``map`` (one Expr per axis of that value).

    ``map`` is None when the access is not affine (a data-dependent gather, a reshape with a symbolic
    stride); ``note`` then says why. ``tensor`` names the signature tensor when the base is an INPUT.
    """
    value_id: str
    map: tuple[Expr, ...] | None
    pieces: tuple[Piece, ...] = ()
    tensor: str | None = None
    note: str | None = None

    @property
    def affine(self) -> bool:
        return self.map is not None

    def exprs(self) -> list[Expr]:
        out = list(self.map or ())
        for p in self.pieces:
            out += [r.expr for r in p.constraints]
        return out

    def to_json(self, pieces: bool = True) -> dict:
        d: dict = {"value_id": self.value_id}
        if self.tensor:
            d["tensor"] = self.tensor
        d["map"] = None if self.map is None else [_map_item(e) for e in self.map]
        if self.note:
            d["note"] = self.note
        if pieces and self.pieces:
            d["pieces"] = [p.to_json() for p in self.pieces]
        return d

    @staticmethod
    def from_json(d: Mapping) -> "Access":
        m = d.get("map")
        return Access(d["value_id"], None if m is None else tuple(lift(x) for x in m),
                      tuple(Piece.from_json(p) for p in d.get("pieces", ())), d.get("tensor"), d.get("note"))


def _map_item(e: Expr) -> int | str:
    c = e.as_int()
    return c if c is not None else str(e)


@dataclass(frozen=True)
class IndexInfo:
    """Everything the IndexBook knows about one Tiny IR value."""
    value_id: str
    uop: str
    dtype: str
    axes: tuple[Axis, ...]
    inputs: tuple[Access, ...] = ()
    src_maps: tuple[Access, ...] = ()
    reduce: tuple[Axis, ...] = ()
    reduce_op: str | None = None
    non_scop: bool = False
    reason: str | None = None
    tensor: str | None = None
    guards: tuple[Range, ...] = ()

    @property
    def shape(self) -> tuple:
        return tuple(a.size for a in self.axes)

    @property
    def reduce_axes(self) -> tuple[int, ...]:
        """Ids (in the source value) of the axes a REDUCE deleted (seed 001 §4.3 rule 4)."""
        return tuple(a.id for a in self.reduce)

    @property
    def is_movement(self) -> bool:
        return self.uop in MOVEMENT and not self.non_scop

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The value's piecewise domain: a movement value is exactly its one read, pieces included."""
        return self.inputs[0].pieces if self.is_movement and self.inputs else ()

    @property
    def vars(self) -> list[str]:
        return [a.name for a in self.axes] + [a.name for a in self.reduce]

    def box(self, with_reduce: bool = False) -> tuple[Range, ...]:
        axes = self.axes + (self.reduce if with_reduce else ())
        return tuple(Range(lift(a.name), Expr((), 0), lift(a.size)) for a in axes)

    def needed_guards(self) -> tuple[Range, ...]:
        """Div guards for every ``floor`` in the maps and pieces (the ``%``-origin guards of seed 001 §4.4)."""
        exprs: list[Expr] = []
        for acc in self.inputs:
            exprs += acc.exprs()
        return guards_for(exprs)

    def to_json(self) -> dict:
        d: dict = {"uop": self.uop, "dtype": self.dtype}
        if self.tensor:
            d["tensor"] = self.tensor
        d["axes"] = [a.to_json() for a in self.axes]
        if self.reduce:
            d["reduce"] = [a.to_json() for a in self.reduce]
        dom: dict = {"constraints": [r.parts() for r in self.box()]}
        if self.pieces:
            dom["pieces"] = [p.to_json() for p in self.pieces]
        if self.guards:
            dom["guards"] = [r.parts() for r in self.guards]
        d["domain"] = dom
        d["inputs"] = [a.to_json(pieces=not self.is_movement) for a in self.inputs]
        if self.src_maps:
            d["src_maps"] = [a.to_json(pieces=False) for a in self.src_maps]
        if self.reduce:
            d["reduce_op"] = self.reduce_op
            d["reduce_axes"] = list(self.reduce_axes)
        if self.non_scop:
            d["non_scop"] = True
            d["reason"] = self.reason
        return d

    @staticmethod
    def from_json(vid: str, d: Mapping) -> "IndexInfo":
        pieces = tuple(Piece.from_json(p) for p in d.get("domain", {}).get("pieces", ()))
        inputs = [Access.from_json(a) for a in d.get("inputs", ())]
        if pieces and inputs:
            inputs[0] = Access(inputs[0].value_id, inputs[0].map, pieces, inputs[0].tensor, inputs[0].note)
        return IndexInfo(vid, d["uop"], d.get("dtype", ""), tuple(Axis.from_json(a) for a in d["axes"]),
                         tuple(inputs), tuple(Access.from_json(a) for a in d.get("src_maps", ())),
                         tuple(Axis.from_json(a) for a in d.get("reduce", ())), d.get("reduce_op"),
                         bool(d.get("non_scop", False)), d.get("reason"), d.get("tensor"),
                         tuple(Range.from_parts(g) for g in d.get("domain", {}).get("guards", ())))


@dataclass(frozen=True)
class IndexBook:
    """The side table for a whole Tiny graph, in the graph's topological order."""
    name: str
    params: tuple[str, ...]
    values: Mapping[str, IndexInfo]
    inputs: tuple[tuple[str, str], ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()
    derived: tuple[tuple[str, Expr], ...] = ()
    diagnostics: tuple[KumikoError, ...] = field(default=(), compare=False)

    def __getitem__(self, vid: str) -> IndexInfo:
        return self.values[vid]

    def __iter__(self):
        return iter(self.values)

    def param_table(self) -> ParamTable:
        return ParamTable(self.params, self.derived)

    # ------------------------------------------------------------------------------------------------
    def verify(self) -> None:
        """Check the seed 001 §4.3 invariants; raises the first violation as a KumikoError."""
        ids: set[int] = set()
        for vid, info in self.values.items():
            at = f"IndexBook:{vid}"
            for k, a in enumerate(info.axes):
                if a.name != f"i{k}":
                    raise KumikoError("E1304", at=at, why=f"axis {k} is named {a.name!r}, not i{k} (axes are "
                                      "numbered i0, i1, ... in order)")
                if a.kind not in KINDS:
                    raise KumikoError("E1304", at=at, why=f"axis {a.name} has kind {a.kind!r}")
            for k, a in enumerate(info.reduce):
                if a.name != f"r{k}" or a.kind != "reduce":
                    raise KumikoError("E1304", at=at, why=f"reduce axis {k} must be r{k} of kind reduce")
            for a in info.axes:
                if a.id in ids:
                    raise KumikoError("E1304", at=at, why=f"axis id {a.id} is used twice")
                ids.add(a.id)
            allowed = set(info.vars)
            for acc in info.inputs:
                self._verify_access(vid, info, acc, allowed, composed=True)
            for acc in info.src_maps:
                self._verify_access(vid, info, acc, allowed, composed=False)
            if info.non_scop and not info.reason:
                raise KumikoError("E1304", at=at, why="a non_scop value must say why")

    def _verify_access(self, vid: str, info: IndexInfo, acc: Access, allowed: set[str], composed: bool) -> None:
        at = f"IndexBook:{vid}"
        src = self.values.get(acc.value_id)
        if src is None:
            raise KumikoError("E1007", at=at, why=f"input {acc.value_id!r} is not a value of the book")
        if composed and src.is_movement:
            raise KumikoError("E1304", at=at, why=f"input {acc.value_id} is a movement value; maps must be "
                              "composed down to a base value")
        if acc.map is None:
            if not (info.non_scop or acc.note):
                raise KumikoError("E1304", at=at, why=f"the map to {acc.value_id} is not affine but the value "
                                  "is not marked non_scop")
            return
        if len(acc.map) != len(src.axes):
            raise KumikoError("E1304", at=at, why=f"the map to {acc.value_id} has {len(acc.map)} entries for "
                              f"{len(src.axes)} axes")
        table = self.param_table()
        for e in acc.exprs():
            try:
                table.affine(e)    # products of sizes are parameters; an index times a size is not affine
            except NonAffine:
                raise KumikoError("E1304", at=at, why=f"{e} is not affine + floordiv") from None
            stray = index_names(e) - allowed
            if stray:
                raise KumikoError("E1304", at=at, why=f"{e} uses {sorted(stray)}, which are not axes of {vid}")
        if composed:
            have = set(info.guards)
            for e in acc.exprs():
                for a in floor_atoms(e):
                    if guards_for([Expr({(a,): 1})])[0] not in have:
                        raise KumikoError("E1203", at=at, why=f"{a.render()} in the map to {acc.value_id} has no "
                                          "div guard")

    # ------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "kumiko": "indexbook", "version": 1, "name": self.name,
            "params": list(self.params),
            "derived_params": {k: str(v) for k, v in self.derived},
            "inputs": [{"tensor": t, "value_id": v} for t, v in self.inputs],
            "outputs": [{"tensor": t, "value_id": v} for t, v in self.outputs],
            "index_book": {vid: info.to_json() for vid, info in self.values.items()},
            "diagnostics": [d.to_dict() for d in self.diagnostics],
        }

    @staticmethod
    def from_json(d: Mapping) -> "IndexBook":
        """Load a dumped IndexBook (tests and later stages may start from a dump)."""
        if not isinstance(d, Mapping) or "index_book" not in d:
            raise KumikoError("E1009", at="indexbook", why="an IndexBook dump needs an 'index_book' table")
        values = {vid: IndexInfo.from_json(vid, v) for vid, v in d["index_book"].items()}
        return IndexBook(d.get("name", "main"), tuple(d.get("params", ())), values,
                         tuple((x["tensor"], x["value_id"]) for x in d.get("inputs", ())),
                         tuple((x["tensor"], x["value_id"]) for x in d.get("outputs", ())),
                         tuple((k, lift(v)) for k, v in d.get("derived_params", {}).items()))


def identity_map(n: int) -> tuple[Expr, ...]:
    return tuple(axis_var(k) for k in range(n))


def reduce_env(n_out: int, axes: Iterable[int], rank: int) -> tuple[Expr, ...]:
    """A REDUCE's map to its source: kept axes are ``i*`` in order, deleted ones ``r*``."""
    axes = set(axes)
    out, i, r = [], 0, 0
    for k in range(rank):
        if k in axes:
            out.append(red_var(r))
            r += 1
        else:
            out.append(axis_var(i))
            i += 1
    assert i == n_out
    return tuple(out)
