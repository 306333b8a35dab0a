"""Index propagation through Tiny IR movement ops: given an index of a movement node's result, the
index of its source (and the guard constraints a PAD adds). Region formation uses it to inline.

There is one set of per-op rules (seed 001 §4.4): the IndexBook's one-step maps
(``kumiko.indexbook.build.step_map``), applied here to one concrete index tuple. A reshape that merges
symbolic axes has no affine inverse and gives ``None``. Also here: the row-major ``linear`` offset and
the ``injective`` test region formation uses for reused reductions.
"""
from __future__ import annotations

from typing import Mapping

from kumiko.indexbook.build import NonAffineStep, step_map
from kumiko.indexbook.expr import axis_var
from kumiko.symbolic import Expr, iter_ranges, lone_floor, simplify
from kumiko.tiny.ir import Node, TinyGraph


def move_index(g: TinyGraph, n: Node, index: tuple, sizes: Mapping | None = None) -> tuple:
    """(source index, guards) for ``n``'s result at ``index``; guards are ``(expr, "ge")`` pairs.

    The IndexBook's one-step map (``indexbook.build.step_map``) with the consumer's variables
    substituted; a PAD's in-bounds range becomes guards on the sides that are actually padded. A
    reshape that merges symbolic axes has no affine map: ``(None, ())``.

    ``sizes`` (iterator name -> extent) simplifies the result with the iterators' ranges
    (``symbolic.simplify``: ``floor(i/4) = 0`` for ``0 <= i < 4``), so a reshape round trip gives the
    plain index back instead of wrapping it in another layer of divisions."""
    src = g.nodes[n.src[0]]
    try:
        f, ranges = step_map(n, src)
    except NonAffineStep:
        return None, ()
    env = {axis_var(k).as_symbol(): Expr.lift(i) for k, i in enumerate(index)}
    guards: list = []
    if n.uop == "PAD":
        padded = [k for k, (lo, hi) in enumerate(n.arg["pad"]) if not (Expr.lift(lo) == 0 and Expr.lift(hi) == 0)]
        for k, r in zip(padded, ranges):
            lo, hi = n.arg["pad"][k]
            e = r.expr.subs(env)
            if Expr.lift(lo) != 0:
                guards.append((e - r.lo, "ge"))
            if Expr.lift(hi) != 0:
                guards.append((r.hi - 1 - e, "ge"))
    out = tuple(e.subs(env) for e in f)
    if sizes:
        ranges = iter_ranges(sizes)
        out = tuple(simplify(e, ranges) for e in out)
        guards = [(simplify(e, ranges), kind) for e, kind in guards]
    return out, tuple(guards)


def linear(index: tuple, shape: tuple) -> Expr:
    """Row-major offset of ``index`` in ``shape``."""
    off = Expr.lift(0)
    for i, d in zip(index, shape):
        off = off * d + i
    return off


def _merge_divmod(index: tuple) -> list[Expr]:
    """``index`` with each pair of components ``floor(X/q) + c`` and ``X - q*floor(X/q)`` (an axis split by a
    reshape: a grouped conv's channel is ``(g, c) = (floor(i/C), i mod C)``) replaced by ``X`` and 0. The pair
    is a bijection of ``X``, so the index is injective exactly when the merged one is."""
    exprs = [Expr.lift(e) for e in index]
    for j, e in enumerate(exprs):
        a = lone_floor(e)
        if a is None:
            continue
        rem = a.num - a.den * (e - e.const)
        k = next((k for k, f in enumerate(exprs) if k != j and f == rem), None)
        if k is not None:
            exprs[j], exprs[k] = a.num, Expr.lift(0)
    return exprs


def injective(index: tuple, sizes: dict) -> bool:
    """Is ``point -> index`` injective over the box of ``sizes``? Every axis must appear, in one index
    expression only, and within an expression the terms sorted by |coefficient| must not overlap
    (each term's span stays below the next coefficient); an axis split in two components by floor and
    remainder counts as one (``_merge_divmod``). Conservative with symbolic extents."""
    seen: set[str] = set()
    for e in _merge_divmod(index):
        terms = []
        for name in sorted(e.symbols()):
            if name not in sizes:
                continue
            c = e.coeff(name)
            if c == 0 or name in seen:
                return False
            seen.add(name)
            terms.append((abs(c), sizes[name]))
        terms.sort(key=lambda t: t[0])
        span = 0
        for k, (c, size) in enumerate(terms):
            if k and span >= c:
                return False
            if not isinstance(size, int):
                if k + 1 < len(terms):
                    return False
                continue
            span += c * (size - 1)
    return all(n in seen or sizes[n] == 1 for n in sizes)
