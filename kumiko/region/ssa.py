"""Region Buffer SSA (seed 001 §6): one region = one kernel; only outputs are MemRefs; inside, pure
value SSA over *named axes*.

Every expression has a dtype and a tuple of axis names (its shape, in the region's canonical axis
order: the region's iters first, then reduce axes in the order they are introduced). ``Read`` indexes
a MemRef with affine + floordiv expressions over axis names; ``Select`` guards pads, slices and tails
(``Guard`` holds affine constraints); ``Reduce`` removes its axes; ``BroadcastInDim`` adds axes and
``Transpose`` reorders them. A Binary's operands must have the result's axes: ``typecheck`` inserts
``BroadcastInDim`` where an operand lacks axes, except inside a reduce body, where operands are
broadcast by their indices (C-CON1: the body of a contraction reads its operands directly,
``mul(Read(A[m,k]), Read(B[k,n]))``), and except scalar constants.

Pattern names (matmul, conv) never appear here: they stay in Poly-View.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union

from kumiko import dtypes, ops
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import Expr, dim_json

# op names (``Unary.fn``, ``Binary.fn``, ``Reduce.op``) are the op table's region names (``kumiko.ops``)


@dataclass(frozen=True)
class Axis:
    name: str
    size: Any        # int or symbolic Expr

    def to_json(self) -> dict:
        return {"name": self.name, "size": dim_json(self.size)}


@dataclass(frozen=True)
class Layout:
    kind: str = "row_major"          # row_major | col_major | swizzled
    params: tuple = ()               # sorted (key, value) pairs, e.g. (("swizzle", "xor32"), ("vec_bytes", 16))

    def to_json(self) -> dict:
        d: dict = {"kind": self.kind}
        if self.params:
            d["params"] = dict(self.params)
        return d


@dataclass(frozen=True)
class MemRef:
    shape: tuple
    dtype: dtypes.DType
    layout: Layout = Layout()
    alignment: int = 128
    noalias: bool = True

    def to_json(self) -> dict:
        return {"shape": [dim_json(d) for d in self.shape], "dtype": self.dtype.name, "alignment": self.alignment,
                "noalias": self.noalias, "layout": self.layout.to_json()}


# ------------------------------------------------------------------------------------------------
# expressions


@dataclass(frozen=True)
class Read:
    tensor: str
    index: tuple              # one symbolic Expr per MemRef axis, over axis names and size symbols
    flat: bool = False        # index is one row-major linear offset (a reshape that merges symbolic axes)


@dataclass(frozen=True)
class Const:
    value: Any
    dtype: dtypes.DType | None = None   # None: takes its sibling's dtype in a Binary/Select


@dataclass(frozen=True)
class Ref:
    name: str                 # a let of this region


@dataclass(frozen=True)
class Unary:
    fn: str
    x: "RExpr"


@dataclass(frozen=True)
class Cast:
    x: "RExpr"
    to: dtypes.DType


@dataclass(frozen=True)
class Binary:
    fn: str
    x: "RExpr"
    y: "RExpr"


@dataclass(frozen=True)
class Guard:
    """A conjunction of affine constraints ``e >= 0`` (op ``ge``) or ``e == 0`` (op ``eq``)."""
    constraints: tuple        # ((Expr, "ge"|"eq"), ...)


@dataclass(frozen=True)
class Select:
    pred: Union[Guard, "RExpr"]   # an index Guard, or a bool-valued expression
    then: "RExpr"
    other: "RExpr"


@dataclass(frozen=True)
class Reduce:
    op: str
    axes: tuple               # Axis, ...
    init: Any
    dtype: dtypes.DType
    body: "RExpr"


@dataclass(frozen=True)
class BroadcastInDim:
    operand: "RExpr"
    axes: tuple               # result axis names; the operand's axes are a subsequence


@dataclass(frozen=True)
class Transpose:
    operand: "RExpr"
    perm: tuple


@dataclass(frozen=True)
class Gather:
    """A data-dependent read: ``tensor[index]`` where the index expressions use the symbol ``var``,
    bound to the i32 value ``by`` at each point (non-SCoP; the IndexBook marks it)."""
    tensor: str
    index: tuple
    var: str
    by: "RExpr"


RExpr = Union[Read, Const, Ref, Unary, Cast, Binary, Select, Reduce, BroadcastInDim, Transpose, Gather]


@dataclass(frozen=True)
class Let:
    name: str
    expr: RExpr


@dataclass(frozen=True)
class Output:
    name: str
    memref: MemRef
    materialize: str = "gmem"     # gmem | deferred (hint: consumed by the next region in place)


@dataclass(frozen=True)
class Yield:
    src: str                  # a let
    to: str                   # an output
    cast: dtypes.DType | None = None


@dataclass(frozen=True)
class Region:
    name: str
    iters: tuple              # Axis, ... (the outputs' axes, in order)
    inputs: tuple             # (name, MemRef), ...
    outputs: tuple            # Output, ...
    lets: tuple               # Let, ...
    yields: tuple             # Yield, ...
    notes: tuple = ()         # why this region is where it is (for `kumiko explain`)


@dataclass(frozen=True)
class Program:
    """Regions in execution order; ``buffers`` are the intermediate MemRefs between regions."""
    name: str
    regions: tuple
    inputs: tuple             # (name, MemRef) of the graph's signature inputs
    outputs: tuple            # (name, MemRef) of the graph's signature outputs
    buffers: tuple = ()       # (name, MemRef) intermediates written by one region, read by later ones
    symbols: Mapping[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# typing

@dataclass(frozen=True)
class VType:
    dtype: dtypes.DType
    axes: tuple               # axis names, canonical order


class Typer:
    """Types expressions of one region and inserts the BroadcastInDim nodes Binary needs."""

    def __init__(self, region_name: str, axes: Iterable[Axis], tensors: Mapping[str, MemRef]):
        self.where = f"region {region_name}"
        self.axes: dict[str, Axis] = {a.name: a for a in axes}
        self.order: list[str] = [a.name for a in axes]
        self.tensors = tensors
        self.lets: dict[str, VType] = {}

    def add_axes(self, axes: Iterable[Axis]) -> None:
        for a in axes:
            if a.name in self.axes and self.axes[a.name].size != a.size:
                raise KumikoError("E1304", at=self.where, why=f"axis {a.name} has sizes {self.axes[a.name].size} "
                                  f"and {a.size}")
            if a.name not in self.axes:
                self.axes[a.name] = a
                self.order.append(a.name)

    def canon(self, names: Iterable[str]) -> tuple:
        s = set(names)
        return tuple(n for n in self.order if n in s)

    def index_axes(self, index: Iterable) -> tuple:
        free: set[str] = set()
        for e in index:
            if e is not None:
                free |= {s for s in Expr.lift(e).symbols() if s in self.axes}
        return self.canon(free)

    def type_of(self, e: RExpr, in_reduce: bool = False) -> tuple[RExpr, VType | None]:
        """Returns the (possibly rewritten) expression and its type; a bare Const has type None."""
        if isinstance(e, Const):
            return e, (VType(e.dtype, ()) if e.dtype is not None else None)
        if isinstance(e, Read):
            m = self.tensors.get(e.tensor)
            if m is None:
                raise KumikoError("E1007", at=self.where, why=f"Read of unknown tensor {e.tensor!r}")
            if len(e.index) != (1 if e.flat else len(m.shape)):
                raise KumikoError("E1304", at=self.where, why=f"Read {e.tensor} has {len(e.index)} indices for "
                                  f"rank {len(m.shape)}")
            return e, VType(m.dtype, self.index_axes(e.index))
        if isinstance(e, Gather):
            by, bt = self.type_of(e.by, in_reduce)
            m = self.tensors[e.tensor]
            return Gather(e.tensor, e.index, e.var, by), VType(m.dtype, self.canon(
                set(self.index_axes(e.index)) | set(bt.axes if bt else ())))
        if isinstance(e, Ref):
            if e.name not in self.lets:
                raise KumikoError("E1007", at=self.where, why=f"let {e.name!r} is used before it is defined")
            return e, self.lets[e.name]
        if isinstance(e, Unary):
            x, t = self.type_of(e.x, in_reduce)
            if ops.fn_kind(e.fn) != "unary":
                raise KumikoError("E1006", at=self.where, why=f"unknown unary {e.fn!r}")
            return Unary(e.fn, x), t
        if isinstance(e, Cast):
            x, t = self.type_of(e.x, in_reduce)
            return Cast(x, e.to), VType(e.to, t.axes if t else ())
        if isinstance(e, Binary):
            return self._binary(e, in_reduce)
        if isinstance(e, Select):
            return self._select(e, in_reduce)
        if isinstance(e, Reduce):
            if e.op not in ops.REDUCE_BY_FN:
                raise KumikoError("E1006", at=self.where, why=f"unknown reduce op {e.op!r}")
            if e.dtype is None:
                raise KumikoError("E1004", at=self.where, why="Reduce has no accumulator dtype")
            self.add_axes(e.axes)
            body, bt = self.type_of(e.body, in_reduce=True)
            names = {a.name for a in e.axes}
            axes = tuple(a for a in (bt.axes if bt else ()) if a not in names)
            return Reduce(e.op, e.axes, e.init, e.dtype, body), VType(e.dtype, axes)
        if isinstance(e, BroadcastInDim):
            x, t = self.type_of(e.operand, in_reduce)
            axes = self.canon(e.axes)
            if t and not set(t.axes) <= set(axes):
                raise KumikoError("E1001", at=self.where, why=f"BroadcastInDim to {list(axes)} drops axes of "
                                  f"{list(t.axes)}")
            return BroadcastInDim(x, axes), VType(t.dtype if t else None, axes)
        if isinstance(e, Transpose):
            x, t = self.type_of(e.operand, in_reduce)
            return Transpose(x, e.perm), VType(t.dtype, tuple(t.axes[p] for p in e.perm))
        raise TypeError(f"not an RB-SSA expression: {e!r}")

    def _widen(self, x: RExpr, t: VType | None, axes: tuple, in_reduce: bool) -> RExpr:
        """Explicit BroadcastInDim outside reductions (seed 001 §6.4); inside a reduction body, operands
        are broadcast by their indices (C-CON1), and a scalar constant broadcasts everywhere."""
        if t is None or t.axes == axes or in_reduce or isinstance(x, Const):
            return x
        return BroadcastInDim(x, axes)

    def _binary(self, e: Binary, in_reduce: bool) -> tuple[RExpr, VType]:
        if ops.fn_kind(e.fn) not in ("binary", "compare"):
            raise KumikoError("E1006", at=self.where, why=f"unknown binary {e.fn!r}")
        x, tx = self.type_of(e.x, in_reduce)
        y, ty = self.type_of(e.y, in_reduce)
        if tx is None and ty is None:
            raise KumikoError("E1009", at=self.where, why=f"{e.fn} of two untyped constants")
        if tx is not None and ty is not None and tx.dtype is not ty.dtype:
            raise KumikoError("E1005", at=self.where, why=f"{e.fn} of {tx.dtype} and {ty.dtype}")
        axes = self.canon(set(tx.axes if tx else ()) | set(ty.axes if ty else ()))
        dt = (tx or ty).dtype
        out = Binary(e.fn, self._widen(x, tx, axes, in_reduce), self._widen(y, ty, axes, in_reduce))
        return out, VType(dtypes.bool_ if ops.fn_kind(e.fn) == "compare" else dt, axes)

    def _select(self, e: Select, in_reduce: bool) -> tuple[RExpr, VType]:
        if isinstance(e.pred, Guard):
            pred, paxes = e.pred, self.index_axes(c for c, _ in e.pred.constraints)
        else:
            pred, pt = self.type_of(e.pred, in_reduce)
            if pt is None or pt.dtype is not dtypes.bool_:
                raise KumikoError("E1005", at=self.where, why="Select's predicate must be bool")
            paxes = pt.axes
        then, tt = self.type_of(e.then, in_reduce)
        other, to = self.type_of(e.other, in_reduce)
        if tt is None and to is None:
            raise KumikoError("E1009", at=self.where, why="Select of two untyped constants")
        if tt is not None and to is not None and tt.dtype is not to.dtype:
            raise KumikoError("E1005", at=self.where, why=f"Select branches of {tt.dtype} and {to.dtype}")
        axes = self.canon(set(paxes) | set(tt.axes if tt else ()) | set(to.axes if to else ()))
        return Select(pred, self._widen(then, tt, axes, in_reduce), self._widen(other, to, axes, in_reduce)), \
            VType((tt or to).dtype, axes)


def typecheck(r: Region) -> tuple[Region, dict[str, VType]]:
    """Type every let (inserting BroadcastInDim), check yields; returns the region and let types."""
    tensors = dict(r.inputs)
    tensors.update({o.name: o.memref for o in r.outputs})
    ty = Typer(r.name, r.iters, tensors)
    lets = []
    for let in r.lets:
        if let.name in ty.lets:
            raise KumikoError("E1016", at=f"region {r.name}", why=f"let {let.name!r} is defined twice")
        e, t = ty.type_of(let.expr)
        if t is None:
            raise KumikoError("E1009", at=f"region {r.name}", why=f"let {let.name!r} is an untyped constant")
        ty.lets[let.name] = t
        lets.append(Let(let.name, e))
    outs = {o.name: o for o in r.outputs}
    iters = tuple(a.name for a in r.iters)
    for y in r.yields:
        if y.src not in ty.lets or y.to not in outs:
            raise KumikoError("E1007", at=f"region {r.name}", why=f"yield {y.src} -> {y.to} names an unknown value")
        t = ty.lets[y.src]
        if set(t.axes) - set(iters):
            raise KumikoError("E1304", at=f"region {r.name}", why=f"yielded {y.src} keeps non-iter axes {t.axes}")
        want = outs[y.to].memref.dtype
        if (y.cast or t.dtype) is not want:
            raise KumikoError("E1005", at=f"region {r.name}", why=f"yield {y.src} ({t.dtype}) into {y.to} ({want}) "
                              "needs a cast")
    return Region(r.name, r.iters, r.inputs, r.outputs, tuple(lets), r.yields, r.notes), ty.lets
