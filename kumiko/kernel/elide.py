"""Masked-column elision for the row-block pipeline (``kumiko.kernel.stream``): which columns of a block's
row program need not be computed at all, and under what run-time conditions that is exact.

A pipeline's producer computes ``S = contraction`` then a row program over the N axis whose accumulator is
only observed under guards (``select(i >= j, s, -inf)``: a causal mask). For one block of rows, the
columns where *every* guard fails for *every* row of the block are "masked": there the row program sees
only the ``other`` branches. This module proves, by evaluating the row program on those columns in a small
abstract domain, that they change nothing:

- each reduction over N receives its identity there (``max`` gets ``-inf``, ``sum`` gets ``0``), so
  reducing over the block's unmasked prefix alone gives the same value;
- the output ``P`` is ``0`` there, so the consumer contraction (``sum_k P[m, k] * V[k, n]``) loses nothing
  when its panel of ``V`` is finite (``0 * v == 0``), which the pipeline already checks per batch point.

Values in the abstract domain are exact floats (``-inf``, ``0.0``, ...), ``Fin(lets)`` (finite, on the
condition that the row scalars ``lets`` are) or ``None`` (unknown). Row scalars (lets without the N axis,
such as a row's max or sum) are assumed finite, and nonzero where they divide; the assumptions are
returned so the generated code checks them per row at run time and recomputes the block over every
column when one fails (a row of ``-inf``, an overflow, a zero sum): the elision is exact either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kumiko import ops
from kumiko.region.srnf import children
from kumiko.region.ssa import (
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Guard,
    Reduce,
    Ref,
    RExpr,
    Select,
    Transpose,
    Unary,
)
from kumiko.symbolic import Expr


@dataclass(frozen=True)
class Fin:
    """A finite value, provided the row scalars ``lets`` are finite."""
    lets: frozenset


@dataclass
class Elision:
    """What the generated code must check per row (row-scalar let names) for the elision to be exact."""
    finite: set = field(default_factory=set)
    nonzero: set = field(default_factory=set)


def _f32(op: ops.Op, *xs) -> float | None:
    """The op on exact fp32 constants, by its numpy meaning (None for a comparison: not a float)."""
    if op.kind not in ("unary", "binary"):
        return None
    with np.errstate(all="ignore"):
        return float(op.np(*(np.float32(x) for x in xs)))


class _Eval:
    def __init__(self, acc: str, n: str, guards: tuple, types: dict):
        self.acc, self.n, self.guards, self.types = acc, n, set(guards), types
        self.env: dict = {}
        self.need = Elision()

    def row_scalar(self, name: str) -> bool:
        return self.n not in self.types[name].axes

    def ev(self, e: RExpr):  # noqa: C901 - one case per node kind
        if isinstance(e, Const):
            v = e.value
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if isinstance(e, Ref):
            if e.name == self.acc:
                return None
            if self.row_scalar(e.name):
                self.need.finite.add(e.name)
                return Fin(frozenset([e.name]))
            return self.env.get(e.name)
        if isinstance(e, (BroadcastInDim, Transpose)):
            return self.ev(e.operand)
        if isinstance(e, Cast):
            v = self.ev(e.x)
            return v if isinstance(v, float) and e.to.is_float and (v == 0.0 or math.isinf(v)) else None
        if isinstance(e, Select):
            if isinstance(e.pred, Guard) and e.pred in self.guards:
                return self.ev(e.other)           # every guard fails on an elided column
            a, b = self.ev(e.then), self.ev(e.other)
            return a if isinstance(a, float) and isinstance(b, float) and a == b else None
        if isinstance(e, Unary):
            x = self.ev(e.x)
            return _f32(ops.BY_FN[e.fn], x) if isinstance(x, float) else None
        if isinstance(e, Binary):
            return self.binary(e.fn, self.ev(e.x), self.ev(e.y))
        return None          # Read, Gather, a nested Reduce: unknown

    def binary(self, fn: str, x, y):
        op = ops.BY_FN[fn]
        if isinstance(x, float) and isinstance(y, float):
            return _f32(op, x, y)
        if x is None or y is None or op.kind != "binary":
            return None
        if isinstance(x, Fin) and isinstance(y, Fin):
            return None                            # finite op finite can overflow: unknown
        c, f, c_left = (x, y, True) if isinstance(x, float) else (y, x, False)
        v = ops.finite_fold(op, c, c_left)         # the op's algebra: identity, absorbing elements, NaN
        if v == ops.OTHER:
            return f
        if isinstance(v, tuple):                   # e.g. 0 / f == 0 when f is nonzero
            self.need.nonzero |= f.lets
            return v[0]
        return v


def masked_elision(lets: tuple, acc: str, n: str, guards: tuple, out: str, types: dict) -> Elision | None:
    """The run-time conditions under which a block's columns that fail every guard in ``guards`` can be
    skipped by the row program ``lets`` (after the contraction ``acc``, over the N axis ``n``) whose
    output let is ``out``; None when that cannot be shown.

    ``types`` maps let names to their VType (axes). Every reduction over ``n`` must see its identity on
    such a column and ``out`` must be 0 there."""
    if not guards:
        return None
    ev = _Eval(acc, n, guards, types)

    def reductions_see_identity(e: RExpr) -> bool:
        """Every reduction over N in ``e`` (at the top or nested) gets its identity on an elided column:
        its loops run over the block's prefix only, so what it would have seen past it must not count."""
        if isinstance(e, Reduce) and n in [a.name for a in e.axes]:
            if [a.name for a in e.axes] != [n] or e.op not in ops.REDUCE_BY_FN:
                return False
            v = ev.ev(e.body)
            if not isinstance(v, float) or v != ops.REDUCE_BY_FN[e.op].identity:
                return False
        return all(reductions_see_identity(k) for k in children(e))

    for let in lets:
        if let.name == acc:
            continue
        if not reductions_see_identity(let.expr):
            return None
        if not ev.row_scalar(let.name):
            ev.env[let.name] = ev.ev(let.expr)
    v = ev.env.get(out)
    if not isinstance(v, float) or v != 0.0:
        return None
    return ev.need


def prefix_bound(guards: tuple, m: str, n: str, m_hi: str, scope: set, index) -> str | None:
    """A C expression of the first column past which every guard fails for every row ``m <= m_hi``
    (the rows of a block, ``m_hi`` their largest index): ``max over guards of (largest n allowed) + 1``.
    None when some guard does not bound ``n`` from above by an affine function of ``m`` alone.

    A constraint ``a*m + b*n + c >= 0`` with ``b < 0`` allows ``n <= floor((a*m + c) / -b)``, largest at
    ``m = m_hi`` when ``a >= 0`` (the only case taken: rows further down see further right, as in a
    causal mask). ``index`` renders an Expr in C."""
    bounds = []
    for g in guards:
        best = None
        for e, op in g.constraints:
            e = Expr.lift(e)
            b, a = e.coeff(n), e.coeff(m)
            rest = e - Expr.sym(n) * b - Expr.sym(m) * a
            if b == 0 or rest.symbols() & scope:
                continue                           # no bound on n, or one that depends on another axis
            if op == "eq":
                b, a, rest = -abs(b), a if b < 0 else -a, rest if b < 0 else -rest
            if b >= 0 or a < 0:
                continue
            top = rest + Expr.sym(m_hi) * a
            c = f"{index(top)} + 1" if b == -1 else f"kk_fdiv({index(top)}, {-b}LL) + 1"
            best = c if best is None else f"({best} < {c} ? {best} : {c})"
        if best is None:
            return None
        bounds.append(best)
    out = bounds[0]
    for c in bounds[1:]:
        out = f"({out} > {c} ? {out} : {c})"
    return out
