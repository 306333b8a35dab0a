"""SRNF (seed 001 §6.6): small named rewrites that bring reductions to a normal form.

- R0 ``merge_nested``: ``Reduce(op,K1){Reduce(op,K2){E}} -> Reduce(op,K1+K2){E}`` (same op and dtype).
- R1 ``hoist_invariant``: a factor that does not depend on the reduced axes leaves the reduction:
  ``sum_K(g*E) -> g*sum_K(E)``, ``max_K(g+E) -> g+max_K(E)`` (and min).
- R2 ``distribute`` (optional, off by default): ``sum_K(E1+E2) -> sum_K(E1)+sum_K(E2)``; a reassociation,
  so results move within rounding.
- R3 ``epilogue``: every top-level reduction is its own accumulator let and the elementwise ops after
  it are applied to the accumulator (``epilogue(region)`` names them for the Plan).
- R4 barrier: reductions of different ops never merge (``merge_reduces`` raises E1402).
- C-CON1 ``check_ccon1``: inside a reduction body operands are read directly (no BroadcastInDim).
- ``fold_guard_pred``: ``select(select(guard, true, false), a, b) -> select(guard, a, b)`` so a mask made
  from a PAD (e.g. a causal mask) is an index predicate later stages can use to skip work.

Each pass is a pure function ``Region -> Region``; ``normalize`` runs them in order.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from kumiko import ops
from kumiko.diagnostics import KumikoError
from kumiko.region.ssa import (
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Gather,
    Guard,
    Let,
    Read,
    Reduce,
    Ref,
    Region,
    RExpr,
    Select,
    Transpose,
    Typer,
    Unary,
    typecheck,
)
from kumiko.symbolic import Expr

#: the fields of each expression node that hold sub-expressions, in order (a Select's ``pred`` is one
#: unless it is an index Guard); ``children`` and ``map_children`` are the one walker every pass uses
_CHILDREN: dict = {Unary: ("x",), Cast: ("x",), Binary: ("x", "y"), Select: ("pred", "then", "other"),
                   Reduce: ("body",), BroadcastInDim: ("operand",), Transpose: ("operand",), Gather: ("by",)}


def children(e: RExpr) -> list:
    """The sub-expressions of ``e`` (none for Read, Const, Ref; a Guard predicate is not one)."""
    return [k for k in (getattr(e, f) for f in _CHILDREN.get(type(e), ())) if not isinstance(k, Guard)]


def map_children(e: RExpr, f: Callable[[RExpr], RExpr]) -> RExpr:
    """``e`` with each sub-expression ``k`` replaced by ``f(k)``."""
    fields = _CHILDREN.get(type(e), ())
    if not fields:
        return e
    return replace(e, **{n: f(k) for n, k in ((n, getattr(e, n)) for n in fields) if not isinstance(k, Guard)})


def map_nodes(e: RExpr, f: Callable[[RExpr], RExpr]) -> RExpr:
    """Rebuild ``e`` bottom-up, applying ``f`` to every node after its children."""
    return f(map_children(e, lambda k: map_nodes(k, f)))


def map_lets(r: Region, f: Callable[[RExpr], RExpr]) -> Region:
    """``r`` with every let's expression rebuilt by ``map_nodes(expr, f)``."""
    return replace(r, lets=tuple(Let(x.name, map_nodes(x.expr, f)) for x in r.lets))


def free_axes(e: RExpr, r: Region | None = None) -> set[str]:
    """Axis and let names an expression depends on (let refs are expanded through the region)."""
    out: set[str] = set()
    lets = {x.name: x.expr for x in r.lets} if r is not None else {}

    def visit(x: RExpr) -> RExpr:
        if isinstance(x, (Read, Gather)):
            for i in x.index:
                out.update(Expr.lift(i).symbols())
        elif isinstance(x, Select) and isinstance(x.pred, Guard):
            for c, _ in x.pred.constraints:
                out.update(Expr.lift(c).symbols())
        elif isinstance(x, Ref) and x.name in lets:
            out.update(free_axes(lets[x.name], r))
        elif isinstance(x, BroadcastInDim):
            out.update(x.axes)
        return x
    map_nodes(e, visit)
    return out


# R0 / R4 ------------------------------------------------------------------------------------------

def merge_reduces(outer: Reduce, inner: Reduce) -> Reduce:
    """R0 for one pair; R4: different ops (or accumulators) never merge (NonAssociativeTransform)."""
    if outer.op != inner.op or outer.dtype is not inner.dtype:
        raise KumikoError("E1402", at=f"Reduce({outer.op}) over Reduce({inner.op})",
                          why=f"merging a {outer.op} of a {inner.op} would change the result (R4 barrier)")
    return Reduce(outer.op, outer.axes + inner.axes, outer.init, outer.dtype, inner.body)


def merge_nested(r: Region) -> Region:
    def f(e: RExpr) -> RExpr:
        if isinstance(e, Reduce) and isinstance(e.body, Reduce) and e.body.op == e.op and e.body.dtype is e.dtype:
            return merge_reduces(e, e.body)
        return e
    return map_lets(r, f)


# R1 -------------------------------------------------------------------------------------------------

def _hoists(op: str) -> str:
    """The binary op whose reduction-invariant operand leaves a reduction ``op`` (the op table's fact)."""
    return ops.ELEMENTWISE[ops.REDUCE_BY_FN[op].hoists].fn


def hoist_invariant(r: Region) -> Region:
    ty = _typer(r)

    def f(e: RExpr) -> RExpr:
        if not isinstance(e, Reduce) or not isinstance(e.body, Binary) or e.body.fn != _hoists(e.op):
            return e
        names = {a.name for a in e.axes}
        x, y = e.body.x, e.body.y
        for g, rest in ((x, y), (y, x)):
            if free_axes(g, r) & names or isinstance(rest, Const):
                continue
            # after hoisting, g meets the accumulator: only when it already has the accumulator's dtype
            gt = None if isinstance(g, Const) else ty.type_of(g)[1]
            if gt is None or gt.dtype is e.dtype:
                return Binary(e.body.fn, g, Reduce(e.op, e.axes, e.init, e.dtype, rest))
        return e
    return map_lets(r, f)


def _typer(r: Region) -> Typer:
    r2, types = typecheck(r)
    tensors = dict(r.inputs)
    tensors.update({o.name: o.memref for o in r.outputs})
    ty = Typer(r.name, r.iters, tensors)
    ty.lets.update(types)
    for let in r.lets:
        map_nodes(let.expr, lambda x: (ty.add_axes(x.axes) if isinstance(x, Reduce) else None) or x)
    return ty


# R2 -------------------------------------------------------------------------------------------------

def distribute(r: Region) -> Region:
    def f(e: RExpr) -> RExpr:
        if isinstance(e, Reduce) and e.op == "sum" and isinstance(e.body, Binary) and e.body.fn == "add":
            return Binary("add", Reduce("sum", e.axes, e.init, e.dtype, e.body.x),
                          Reduce("sum", e.axes, e.init, e.dtype, e.body.y))
        return e
    return map_lets(r, f)


# R3 -------------------------------------------------------------------------------------------------

def hoist_accumulators(r: Region) -> Region:
    """Give every reduction that sits inside a top-level elementwise expression its own let (SRNF:
    ``let acc = Reduce(op,K){body}``), so the post-reduce ops are applied to the accumulator."""
    lets: list[Let] = []
    counter = [0]
    for let in r.lets:
        def lift(e: RExpr, top: bool) -> RExpr:
            if isinstance(e, Reduce):
                if top:
                    return e
                name = f"acc{counter[0]}"
                counter[0] += 1
                lets.append(Let(name, e))
                return Ref(name)
            if isinstance(e, (Unary, Cast, Binary, BroadcastInDim)):
                return map_children(e, lambda k: lift(k, False))
            return e
        lets.append(Let(let.name, lift(let.expr, True)))
    return replace(r, lets=tuple(lets))


def epilogue(r: Region) -> list[str]:
    """The elementwise ops applied to the last top-level accumulator on the way to the yield."""
    lets = {x.name: x.expr for x in r.lets}
    accs = [x.name for x in r.lets if isinstance(x.expr, Reduce)]
    if not accs:
        return []
    found: list[str] = []
    target = r.yields[0].src
    seen: set[str] = set()

    def walk(e: RExpr) -> bool:
        """Collect ops on the path from ``e`` to an accumulator; True if one was reached."""
        if isinstance(e, Ref):
            if e.name in accs:
                return True
            if e.name in lets and e.name not in seen:
                seen.add(e.name)
                return walk(lets[e.name])
            return False
        if not isinstance(e, (Unary, Cast, Binary, BroadcastInDim, Select)):
            return False
        kids = [e.then, e.other] if isinstance(e, Select) else children(e)     # not through a predicate
        if any([walk(k) for k in kids]):
            found.append("cast" if isinstance(e, Cast) else "select" if isinstance(e, Select)
                         else getattr(e, "fn", "broadcast"))
            return True
        return False
    walk(lets[target]) if target not in accs else None
    if r.yields[0].cast is not None:
        found.append("cast")
    return [o for o in found if o != "broadcast"]


# C-CON1 and peepholes ----------------------------------------------------------------------------

def check_ccon1(r: Region) -> None:
    """Inside a reduction body, operands are read directly: no BroadcastInDim/Transpose wrappers."""
    def in_body(e: RExpr, inside: bool) -> None:
        if inside and isinstance(e, (BroadcastInDim, Transpose)):
            raise KumikoError("E1304", at=f"region {r.name}", why="a reduction body broadcasts an operand "
                              "instead of reading it with the needed indices (C-CON1)")
        for k in children(e):
            in_body(k, inside or isinstance(e, Reduce))
    for let in r.lets:
        in_body(let.expr, False)


def fold_guard_pred(r: Region) -> Region:
    lets = {x.name: x.expr for x in r.lets}

    def as_guard(p: RExpr) -> Guard | None:
        while isinstance(p, (Ref, BroadcastInDim)):
            p = lets.get(p.name) if isinstance(p, Ref) else p.operand
        if isinstance(p, Select) and isinstance(p.pred, Guard) and _is_bool(p.then, True) and \
                _is_bool(p.other, False):
            return p.pred
        return None

    def f(e: RExpr) -> RExpr:
        if isinstance(e, Select) and not isinstance(e.pred, Guard):
            g = as_guard(e.pred)
            if g is not None:
                return Select(g, e.then, e.other)
        return e
    return _drop_dead(map_lets(r, f))


def _is_bool(e: RExpr, v: bool) -> bool:
    return isinstance(e, Const) and isinstance(e.value, bool) and e.value is v


def _drop_dead(r: Region) -> Region:
    used = {y.src for y in r.yields}
    for let in reversed(r.lets):
        if let.name in used:
            map_nodes(let.expr, lambda x: (used.add(x.name) if isinstance(x, Ref) else None) or x)
    return replace(r, lets=tuple(x for x in r.lets if x.name in used))


PASSES: tuple = (("C-CON1 guard fold", fold_guard_pred), ("R0", merge_nested), ("R1", hoist_invariant),
                 ("R3", hoist_accumulators))


def normalize(r: Region, distribute_sums: bool = False) -> Region:
    for _, p in PASSES:
        r = p(r)
    if distribute_sums:
        r = distribute(r)
    r, _ = typecheck(r)   # makes every BroadcastInDim explicit (seed 001 §6.4)
    check_ccon1(r)
    return r
