"""Index expressions of the IndexBook, on top of ``kumiko.symbolic.Expr``.

``Expr`` already is the immutable, hashable affine + floordiv expression the seed asks for (gcd
normalisation, constant folding, ``%`` expanded to ``E - q*floor(E/q)``). This module adds what the
IndexBook needs around it:

* axis variables ``i0, i1, ...`` (a value's own axes) and ``r0, r1, ...`` (a REDUCE's reduce axes);
* ``Range`` (``lo <= expr < hi``), the one constraint form of domains, pad pieces and guards;
* div guards: every ``floor(E/q)`` in a map is defined by ``0 <= E - q*floor(E/q) < q`` (seed 001
  §4.3: ``%`` lives as div + guard; E1203 when a guard is missing);
* ``ParamTable``: size symbols become ISL parameters. A size that is not affine in them (``M*K``
  after a reshape merges axes) is given a fresh parameter (``M_K``) that *stands for* the product;
  ISL then knows only ``M_K >= 1``, not the product relation. That is sound for every question the
  Poly Core asks about one value's domain (nothing is derived from the relation), and it is recorded
  in the IndexBook (``derived_params``) so nobody mistakes it for a real symbol.
* exact conversion to ISL: strings, and ``isl.Aff``/``PwAff``/``MultiAff`` objects, plus the way back
  (``aff_to_expr``) for reading results such as footprint extents.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import islpy as isl

from kumiko.symbolic import Expr, FloorDiv

_INDEX = re.compile(r"[ir]\d+")


def axis_var(k: int) -> Expr:
    return Expr.sym(f"i{k}")


def red_var(k: int) -> Expr:
    return Expr.sym(f"r{k}")


def is_index_name(name: str) -> bool:
    """Axis (``i3``) and reduce (``r0``) variables; everything else in an expression is a size symbol."""
    return _INDEX.fullmatch(name) is not None


def index_names(e: Expr) -> frozenset[str]:
    return frozenset(s for s in e.symbols() if is_index_name(s))


def param_names(e: Expr) -> frozenset[str]:
    return frozenset(s for s in e.symbols() if not is_index_name(s))


def floor_atoms(e: Expr) -> set[FloorDiv]:
    """Every ``floor(E/q)`` in ``e``, nested ones included."""
    out: set[FloorDiv] = set()
    for m, _ in e.terms:
        for a in m:
            if isinstance(a, FloorDiv):
                out.add(a)
                out |= floor_atoms(a.num)
    return out


def lift(x) -> Expr:
    return Expr.lift(x)


# ------------------------------------------------------------------------------------------------
# Range: lo <= expr < hi

@dataclass(frozen=True)
class Range:
    """``lo <= expr < hi``; either bound may be absent. ``make`` normalises ``lo`` to 0 so equal
    constraints compare equal (``S-1 <= S+i0-i1-1`` becomes ``0 <= i0-i1``)."""
    expr: Expr
    lo: Expr | None
    hi: Expr | None

    @staticmethod
    def make(expr, lo=0, hi=None) -> "Range":
        e = lift(expr)
        lo_e = None if lo is None else lift(lo)
        hi_e = None if hi is None else lift(hi)
        if lo_e is not None and lo_e != 0:
            e = e - lo_e
            hi_e = None if hi_e is None else hi_e - lo_e
            lo_e = Expr((), 0)
        return Range(e, lo_e, hi_e)

    def subs(self, env: Mapping[str, Expr]) -> "Range":
        return Range.make(self.expr.subs(env), self.lo, self.hi)

    def halves(self) -> list["Range"]:
        out = []
        if self.lo is not None:
            out.append(Range(self.expr, self.lo, None))
        if self.hi is not None:
            out.append(Range(self.expr, None, self.hi))
        return out

    def decided(self) -> bool | None:
        """True/False when the range is a constant fact, None when it depends on variables or sizes."""
        d = [self.expr - b if b is not None else None for b in (self.lo, self.hi)]
        lo_ok = None if d[0] is None else d[0].as_int()
        hi_ok = None if d[1] is None else d[1].as_int()
        if (self.lo is not None and lo_ok is None) or (self.hi is not None and hi_ok is None):
            return None
        return (lo_ok is None or lo_ok >= 0) and (hi_ok is None or hi_ok < 0)

    def parts(self) -> list[str]:
        """Seed 001 §4.5 shape: ``["0 <= E", "E < hi"]``."""
        out = []
        if self.lo is not None:
            out.append(f"{self.lo} <= {self.expr}")
        if self.hi is not None:
            out.append(f"{self.expr} < {self.hi}")
        return out

    def to_isl(self, table: "ParamTable | None" = None) -> str:
        f = table.affine if table is not None else (lambda x: x)
        return " and ".join(_isl_cmp(f(a), op, f(b)) for a, op, b in self._cmps())

    def _cmps(self):
        if self.lo is not None:
            yield self.lo, "<=", self.expr
        if self.hi is not None:
            yield self.expr, "<", self.hi

    def holds(self, env: Mapping[str, object]):
        """Vectorised truth (numpy arrays in ``env`` allowed)."""
        v = self.expr.evaluate(env)
        ok = True
        if self.lo is not None:
            ok = ok & (v >= self.lo.evaluate(env))
        if self.hi is not None:
            ok = ok & (v < self.hi.evaluate(env))
        return ok

    @staticmethod
    def from_parts(parts: Iterable[str]) -> "Range":
        lo = hi = expr = None
        for p in parts:
            if "<=" in p:
                a, b = p.split("<=")
                lo, expr = lift(a.strip()), lift(b.strip())
            else:
                a, b = p.split("<")
                expr, hi = lift(a.strip()), lift(b.strip())
        if expr is None:
            raise ValueError(f"not a range: {list(parts)}")
        return Range(expr, lo, hi)


def _isl_cmp(a: Expr, op: str, b: Expr) -> str:
    return f"{a.to_isl()} {op} {b.to_isl()}"


def div_guard(a: FloorDiv) -> Range:
    """The definition of ``q = floor(E/d)`` as a constraint: ``0 <= E - d*q < d``."""
    return Range(a.num - a.den * Expr({(a,): 1}), Expr((), 0), Expr((), a.den))


def guards_for(exprs: Iterable[Expr]) -> tuple[Range, ...]:
    atoms: set[FloorDiv] = set()
    for e in exprs:
        atoms |= floor_atoms(e)
    return tuple(div_guard(a) for a in sorted(atoms))


# ------------------------------------------------------------------------------------------------
# ParamTable: size symbols -> ISL parameters

class NonAffine(ValueError):
    """An index expression multiplies an index variable by a size (not representable in ISL)."""


class ParamTable:
    """ISL parameters for a graph: the signature's size symbols, then fresh ones for non-affine sizes."""

    def __init__(self, params: Iterable[str], derived: Iterable[tuple[str, Expr]] = ()):
        self.params: list[str] = list(dict.fromkeys(params))
        self.derived: dict[str, Expr] = {}
        self._by_expr: dict[Expr, str] = {}
        for name, e in derived:
            self.derived[name] = e
            self._by_expr[e] = name

    @property
    def names(self) -> list[str]:
        return self.params + list(self.derived)

    def header(self) -> str:
        return "[" + ", ".join(self.names) + "]"

    def fresh(self, e: Expr) -> str:
        """A parameter standing for the non-affine size ``e`` (deterministic name from its symbols)."""
        if e in self._by_expr:
            return self._by_expr[e]
        base = "_".join(re.sub(r"\W", "", str(a.render())) for m, _ in e.terms for a in m) or "P"
        name, k = base, 1
        taken = set(self.params) | set(self.derived)
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        self.derived[name] = e
        self._by_expr[e] = name
        return name

    def affine(self, e: Expr) -> Expr:
        """``e`` with every non-affine size part replaced by a fresh parameter; index vars must stay affine."""
        if e.is_affine():
            return e
        out = Expr((), e.const)
        for m, c in e.terms:
            if len(m) == 1 and isinstance(m[0], FloorDiv):
                out = out + c * self.affine(m[0].num).floordiv(m[0].den)
                continue
            if len(m) == 1:
                out = out + Expr({m: c})
                continue
            mono = Expr({m: 1})
            if index_names(mono):
                raise NonAffine(f"{e} multiplies an index variable by a size")
            out = out + c * Expr.sym(self.fresh(mono))
        return out

    def context(self) -> isl.Set:
        """Every size is at least 1 (a zero-size tensor is not compiled)."""
        cons = " and ".join(f"{n} >= 1" for n in self.names)
        return isl.Set(f"{self.header()} -> {{ : {cons} }}" if cons else "{ : }")


# ------------------------------------------------------------------------------------------------
# ISL strings and objects

def dims_str(names: Iterable[str]) -> str:
    return ", ".join(names)


def isl_set_str(table: ParamTable, name: str, dims: Iterable[str], cons: Iterable[str]) -> str:
    c = " and ".join(x for x in cons if x)
    return f"{table.header()} -> {{ {name}[{dims_str(dims)}]{' : ' + c if c else ''} }}"


def isl_map_str(table: ParamTable, src: str, dims: Iterable[str], dst: str, exprs: Iterable[Expr],
                cons: Iterable[str] = ()) -> str:
    out = ", ".join(table.affine(e).to_isl() for e in exprs)
    c = " and ".join(x for x in cons if x)
    return f"{table.header()} -> {{ {src}[{dims_str(dims)}] -> {dst}[{out}]{' : ' + c if c else ''} }}"


def aff_str(table: ParamTable, dims: Iterable[str], e: Expr) -> str:
    return f"{table.header()} -> {{ [{dims_str(dims)}] -> [({table.affine(e).to_isl()})] }}"


def multi_aff_str(table: ParamTable, dims: Iterable[str], exprs: Iterable[Expr], out: str = "") -> str:
    body = ", ".join(f"({table.affine(e).to_isl()})" for e in exprs)
    return f"{table.header()} -> {{ [{dims_str(dims)}] -> {out}[{body}] }}"


def to_aff(table: ParamTable, dims: Iterable[str], e: Expr) -> isl.Aff:
    return isl.Aff(aff_str(table, dims, e))


def to_pw_aff(table: ParamTable, dims: Iterable[str], e: Expr) -> isl.PwAff:
    return isl.PwAff(aff_str(table, dims, e))


def to_multi_aff(table: ParamTable, dims: Iterable[str], exprs: Iterable[Expr], out: str = "") -> isl.MultiAff:
    return isl.MultiAff(multi_aff_str(table, dims, exprs, out))


def aff_to_expr(aff: isl.Aff) -> Expr | None:
    """An ``isl.Aff`` back to an ``Expr`` (parameters and input dims by name); None if rational."""
    den = aff.get_denominator_val().to_python()
    if den != 1:
        return None
    out = Expr((), int(aff.get_constant_val().to_python()))
    for typ in (isl.dim_type.param, isl.dim_type.in_):
        for k in range(aff.dim(typ)):
            c = int(aff.get_coefficient_val(typ, k).to_python())
            if c:
                name = aff.get_dim_name(typ, k) or f"i{k}"
                out = out + c * Expr.sym(name)
    for k in range(aff.dim(isl.dim_type.div)):
        c = int(aff.get_coefficient_val(isl.dim_type.div, k).to_python())
        if not c:
            continue
        d = aff.get_div(k)   # floor(num/den) as an Aff with a rational coefficient
        dden = int(d.get_denominator_val().to_python())
        num = aff_to_expr(d.scale_val(isl.Val.int_from_si(d.get_ctx(), dden)))
        if num is None:
            return None
        out = out + c * num.floordiv(dden)
    return out


def pw_aff_to_expr(pa: isl.PwAff, context: isl.Set | None = None) -> Expr | None:
    """The single affine piece of ``pa`` (after gist with ``context``), or None when it stays piecewise."""
    if context is not None:
        pa = pa.gist_params(context) if pa.dim(isl.dim_type.in_) == 0 else pa
    pieces = pa.coalesce().get_pieces()
    exprs = {aff_to_expr(a) for _, a in pieces}
    if len(exprs) != 1:
        return None
    return next(iter(exprs))
