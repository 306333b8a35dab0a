"""Constant evaluation for the DSL: sizes in types (``f32[M, floor((H + 1)/2)]``), attribute values
(numbers, booleans, dtypes, strings, lists, size expressions) and folding of literal arithmetic.

Sizes are symbolic ``Expr``s in the current graph's terms: inside an inlined subgraph a size symbol
stands for what the caller's arguments bound it to, so ``reshape(x, shape=[B, -1])`` in a subgraph
becomes the caller's size. Attribute sizes are stored as the JSON form stores them (ints or the
canonical expression text), so a DSL graph and a JSON graph compare equal.
"""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl import DTYPES
from kumiko.frontend.dsl_ast import Binary, Call, ListLit, Name, Num, Str, TypeAst, Unary, left_spine
from kumiko.frontend.dsl_lex import closest_match
from kumiko.frontend.graph import TensorType
from kumiko.symbolic import Expr, dim, dim_json

if TYPE_CHECKING:
    from kumiko.frontend.dsl_elab import Frame


class Constants:
    """Mixin of the elaborator: needs ``self.error(pos, why, suggestion=None, code=...)``; ``f`` is a
    frame with ``syms`` (size symbol -> int | Expr), ``env`` (variables) and ``graph``."""

    def fold(self, e: Binary, a: Any, b: Any) -> Any:
        fns = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
               "**": operator.pow, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
               "==": operator.eq, "!=": operator.ne}
        if e.op not in fns:
            raise self.error(e.pos, f"{e.op!r} needs tensor operands")
        ints = all(isinstance(x, int) for x in (a, b))
        if ints and e.op == "**" and abs(a) > 1 and b > 63:
            # decided before computing: Python would evaluate 2 ** 2 ** 2 ** 2 ** 2 ** 2 exactly (forever)
            raise self._too_big(e, a, b)
        try:
            r = fns[e.op](a, b)
        except (ZeroDivisionError, OverflowError) as err:
            raise self.error(e.pos, f"cannot compute {a!r} {e.op} {b!r}: {err}") from None
        if isinstance(r, complex):
            raise self.error(e.pos, f"{a!r} ** {b!r} is not a real number")
        if isinstance(r, int) and not isinstance(r, bool) and not -2 ** 63 <= r < 2 ** 63:
            raise self._too_big(e, a, b)
        return r

    def _too_big(self, e: Binary, a: int, b: int) -> KumikoError:
        return self.error(e.pos, f"the integer {a} {e.op} {b} is outside the int64 range (integer constants fold in "
                          "int64)", code="E1012", suggestion="use float constants (2.0 instead of 2) to fold in "
                          "float64")

    def type_of(self, f: Frame, t: TypeAst) -> TensorType:
        shape = []
        for d in t.dims:
            v = dim(self.size(f, d))
            if isinstance(v, int) and v < 0:
                raise self.error(d.pos, f"a size must be >= 0, got {v}")
            shape.append(v)
        return TensorType(dtypes.lookup(t.dtype), tuple(shape))

    def size(self, f: Frame, e: Any) -> Expr:
        if isinstance(e, Num) and isinstance(e.value, int) and not isinstance(e.value, bool):
            return Expr.lift(e.value)
        if isinstance(e, Name):
            if e.name in f.syms:
                return Expr.lift(f.syms[e.name])
            if e.name in {s.name for s in f.graph.symbols}:
                raise self.error(e.pos, f"size {e.name!r} of graph {f.graph.name!r} cannot be inferred from the "
                                 "arguments", suggestion=f"give it a default (graph<{e.name}=...>) or use it as a "
                                 "whole axis of some input")
            raise self.error(e.pos, f"unknown size {e.name!r}", suggestion=f"declare it: graph<{e.name}=...> "
                             f"{f.graph.name}(...)")
        if isinstance(e, Unary):
            return -self.size(f, e.operand)
        if isinstance(e, Binary) and e.op in ("+", "-", "*", "/", "%"):
            leaf, spine = left_spine(e)
            acc = self.size(f, leaf)
            for b in spine:
                acc = self._size_binary(f, b, acc)
            return acc
        if isinstance(e, Call) and e.func in ("floor", "ceil") and len(e.args) == 1 and not e.kwargs:
            x = e.args[0]
            if isinstance(x, Binary) and x.op == "/":
                a, q = self.size(f, x.lhs), self.size(f, x.rhs).as_int()
                if q is None or q <= 0:
                    raise self.error(x.pos, f"{e.func}() needs a positive integer divisor")
                return a.floordiv(q) if e.func == "floor" else a.ceildiv(q)
            return self.size(f, x)
        raise self.error(e.pos, "a size is an integer expression of declared sizes",
                         suggestion="use + - * / %, floor(E/q) and ceil(E/q) over integers and sizes")

    def _size_binary(self, f: Frame, e: Binary, a: Expr) -> Expr:
        if e.op in ("+", "-", "*"):
            b = self.size(f, e.rhs)
            return a + b if e.op == "+" else a - b if e.op == "-" else a * b
        if e.op not in ("/", "%"):
            raise self.error(e.pos, "a size is an integer expression of declared sizes",
                             suggestion="use + - * / %, floor(E/q) and ceil(E/q) over integers and sizes")
        q = self.size(f, e.rhs).as_int()
        if q is None or q <= 0:
            raise self.error(e.pos, f"'{e.op}' on sizes needs a positive integer divisor")
        if e.op == "%":
            return a % q
        exact = a.exact_div(q)
        if exact is None:
            raise self.error(e.pos, f"{a} / {q} does not divide exactly", suggestion=f"write floor(({a})/{q})")
        return exact

    def const(self, f: Frame, e: Any) -> Any:
        return _final(self._const(f, e))

    def _const(self, f: Frame, e: Any) -> Any:
        if isinstance(e, (Num, Str)):
            return e.value
        if isinstance(e, ListLit):
            return tuple(self._const(f, x) for x in e.items)
        if isinstance(e, Name):
            if not e.quoted and e.name == "none":
                return None
            if not e.quoted and (e.name in DTYPES or e.name in DTYPES.values()):
                return DTYPES.get(e.name, e.name)
            if e.name in f.syms:
                return Expr.lift(f.syms[e.name])
            if e.name in f.env:
                raise self.error(e.pos, f"attribute values are constants, but {e.name!r} is a tensor",
                                 suggestion="pass tensors as inputs, before the attributes: conv2d(x, w, b, stride=2)")
            near = closest_match(e.name, [*f.syms, *DTYPES])
            raise self.error(e.pos, f"unknown name {e.name!r} in an attribute"
                             + (f"; did you mean {near!r}?" if near else ""),
                             suggestion='attributes are numbers, true/false, dtypes, sizes, "strings" and lists')
        if isinstance(e, Unary):
            v = self._const(f, e.operand)
            if not isinstance(v, (int, float, Expr)):
                raise self.error(e.pos, f"cannot negate {v!r}")
            return -v
        if isinstance(e, Binary):
            leaf, spine = left_spine(e)
            acc = self._const(f, leaf)
            for b in spine:
                acc = self._const_binary(b, acc, self._const(f, b.rhs))
            return acc
        if isinstance(e, Call) and e.func in ("floor", "ceil") and len(e.args) == 1 and not e.kwargs:
            x = e.args[0]
            if isinstance(x, Binary) and x.op == "/":
                a, q = self._const(f, x.lhs), self._const(f, x.rhs)
                if isinstance(a, Expr) or isinstance(q, Expr):
                    if isinstance(q, Expr):
                        q = q.as_int()
                    if not isinstance(q, int) or q <= 0:
                        raise self.error(x.pos, f"{e.func}() of a size needs a positive integer divisor")
                    a = Expr.lift(a)
                    return a.floordiv(q) if e.func == "floor" else a.ceildiv(q)
                v = self.fold(x, a, q)
            else:
                v = self._const(f, x)
            if isinstance(v, Expr):
                return v
            return (math.floor if e.func == "floor" else math.ceil)(v)
        if isinstance(e, Call):
            raise self.error(e.pos, "attribute values are constants; calls are not allowed here",
                             suggestion="compute the value in a statement and pass it as an input")
        raise self.error(e.pos, "this is not an attribute value")

    def _const_binary(self, e: Binary, a: Any, b: Any) -> Any:
        if isinstance(a, Expr) or isinstance(b, Expr):
            return self._sym_arith(e, a, b)
        if not all(isinstance(x, (int, float)) for x in (a, b)) or e.op in ("@", "%"):
            raise self.error(e.pos, f"cannot compute {a!r} {e.op} {b!r} in an attribute")
        if e.op == "/" and all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)) and b and a % b == 0:
            return a // b                     # 6 / 2 is the size 3; 1 / 8 is 0.125
        return self.fold(e, a, b)

    def _sym_arith(self, e: Binary, a: Any, b: Any) -> Expr:
        if isinstance(a, float) or isinstance(b, float) or not all(isinstance(x, (int, Expr)) for x in (a, b)):
            raise self.error(e.pos, f"sizes combine with integers only ({a!r} {e.op} {b!r})")
        a, b = Expr.lift(a), Expr.lift(b)
        if e.op in ("+", "-", "*"):
            return a + b if e.op == "+" else a - b if e.op == "-" else a * b
        q = b.as_int()
        if e.op in ("/", "%") and q is not None and q > 0:
            if e.op == "%":
                return a % q
            exact = a.exact_div(q)
            if exact is not None:
                return exact
            raise self.error(e.pos, f"{a} / {q} does not divide exactly", suggestion=f"write floor(({a})/{q})")
        raise self.error(e.pos, f"cannot compute {a} {e.op} {b} on sizes")


def _final(v: Any) -> Any:
    if isinstance(v, Expr):
        return dim_json(dim(v))
    if isinstance(v, tuple):
        return tuple(_final(x) for x in v)
    return v
