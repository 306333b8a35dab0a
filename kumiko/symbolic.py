"""Symbolic integer expressions: sizes (``M``, ``2*H + 1``) and index maps (``2*i2 + i4 - 1``).

One immutable, hashable representation serves every stage: frontend shape inference, Tiny IR shapes,
VIEW index maps and the IndexBook's AxisMaps. An expression is a polynomial with integer coefficients
over *atoms*; an atom is a symbol (a size like ``M`` or an axis variable like ``i0``) or ``floor(E/q)``
with a positive integer ``q``. ``E % q`` is never kept: it is expanded to ``E - q*floor(E/q)`` at
construction (seed 001 §4.3). The affine subset (degree <= 1, which is what ISL accepts) is what index
maps use; products of size symbols appear only in sizes (``M*K`` after a reshape).

The canonical form makes structural equality mean mathematical equality for everything our
rewrites produce, so shapes compare with ``==``.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Mapping, Union

Number = int
DimLike = Union[int, str, "Expr"]


@total_ordering
@dataclass(frozen=True)
class Sym:
    name: str

    def key(self) -> tuple:
        return (0, self.name)

    def __lt__(self, other: "Atom") -> bool:
        return self.key() < other.key()

    def render(self) -> str:
        return self.name


@total_ordering
@dataclass(frozen=True)
class FloorDiv:
    num: "Expr"
    den: int

    def key(self) -> tuple:
        return (1, str(self.num), self.den)

    def __lt__(self, other: "Atom") -> bool:
        return self.key() < other.key()

    def render(self) -> str:
        inner = str(self.num)
        simple = self.num.as_symbol() is not None
        return f"floor({inner}/{self.den})" if simple else f"floor(({inner})/{self.den})"


Atom = Union[Sym, FloorDiv]
Monomial = tuple  # sorted tuple of atoms (repetition = power); () is the constant monomial


def _mono_str(m: Monomial) -> str:
    return "*".join(a.render() for a in m)


@functools.lru_cache(maxsize=4096)
def _sym_expr(name: str) -> "Expr":
    """``Expr.sym``: one immutable expression per name, made once (asked some 15,000 times a ResNet-50)."""
    return Expr({(Sym(name),): 1})


def _term_key(mc: tuple) -> list:
    return [a.key() for a in mc[0]]


class Expr:
    """A canonical polynomial ``sum(coef * monomial) + const`` over symbols and floor-divisions."""

    __slots__ = ("terms", "const", "_hash")

    def __init__(self, terms: Mapping[Monomial, int] | tuple = (), const: int = 0):
        # (hasattr, not isinstance with typing's Mapping: its check was a third of this, which region
        # formation calls some 100,000 times for ResNet-50; one term needs no sort)
        if terms:
            ts = [(m, c) for m, c in (terms.items() if hasattr(terms, "items") else terms) if c != 0]
            if len(ts) > 1:
                ts.sort(key=_term_key)
            self.terms: tuple[tuple[Monomial, int], ...] = tuple(ts)
        else:
            self.terms = ()
        self.const = const if type(const) is int else int(const)
        self._hash = hash((self.terms, self.const))

    # construction -------------------------------------------------------------------------------
    @staticmethod
    def sym(name: str) -> "Expr":
        return _sym_expr(name)

    @staticmethod
    def lift(x: "DimLike | Expr") -> "Expr":
        if isinstance(x, Expr):
            return x
        if isinstance(x, bool):
            raise TypeError("bool is not a size")
        if isinstance(x, int):
            return Expr((), x)
        if isinstance(x, str):
            return parse_expr(x)
        if hasattr(x, "__index__"):
            return Expr((), int(x))
        raise TypeError(f"cannot make a symbolic expression from {x!r}")

    # queries ------------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    def as_int(self) -> int | None:
        return self.const if not self.terms else None

    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for m, _ in self.terms:
            for a in m:
                out |= {a.name} if isinstance(a, Sym) else a.num.symbols()
        return frozenset(out)

    def is_affine(self) -> bool:
        return all(len(m) <= 1 and (isinstance(m[0], Sym) or m[0].num.is_affine())
                   for m, _ in self.terms if m)

    def as_symbol(self) -> str | None:
        """The name if this expression is exactly one plain symbol, else None."""
        if self.const == 0 and len(self.terms) == 1:
            (m, c), = self.terms
            if c == 1 and len(m) == 1 and isinstance(m[0], Sym):
                return m[0].name
        return None

    def coeff(self, name: str) -> int:
        """Coefficient of the plain symbol ``name`` (degree-1 term)."""
        for m, c in self.terms:
            if m == (Sym(name),):
                return c
        return 0

    # arithmetic ---------------------------------------------------------------------------------
    def __add__(self, o: DimLike) -> "Expr":
        o = Expr.lift(o)
        acc = dict(self.terms)
        for m, c in o.terms:
            acc[m] = acc.get(m, 0) + c
        return Expr(acc, self.const + o.const)

    __radd__ = __add__

    def __neg__(self) -> "Expr":
        return Expr({m: -c for m, c in self.terms}, -self.const)

    def __sub__(self, o: DimLike) -> "Expr":
        return self + (-Expr.lift(o))

    def __rsub__(self, o: DimLike) -> "Expr":
        return Expr.lift(o) - self

    def __mul__(self, o: DimLike) -> "Expr":
        o = Expr.lift(o)
        acc: dict = {}
        lhs = list(self.terms) + [((), self.const)]
        rhs = list(o.terms) + [((), o.const)]
        for m1, c1 in lhs:
            for m2, c2 in rhs:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        const = acc.pop((), 0)
        return Expr(acc, const)

    __rmul__ = __mul__

    def floordiv(self, q: int) -> "Expr":
        """``floor(self / q)`` for a positive integer ``q``, normalised (gcd, whole multiples pulled out)."""
        if not isinstance(q, int) or q <= 0:
            raise ValueError(f"floordiv denominator must be a positive int, got {q!r}")
        if q == 1:
            return self
        if self.is_const:
            return Expr((), self.const // q)
        g = math.gcd(q, self.const, *(c for _, c in self.terms))
        num, q = (self.exact_div_int(g), q // g) if g > 1 else (self, q)
        if q == 1:
            return num
        whole = Expr({m: c // q for m, c in num.terms if c % q == 0})
        rest = Expr({m: c for m, c in num.terms if c % q != 0}, num.const)
        # move the constant's whole part out too: floor((r + q*t)/q) = t + floor(r/q)
        t = rest.const // q
        rest = Expr(rest.terms, rest.const - q * t)
        if rest.is_const:
            return whole + (rest.const // q) + t
        inner = lone_floor(rest)
        if inner is not None:
            # floor((floor(x/a) + c)/q) = floor((x + a*c)/(a*q)): nested divisions flatten
            return whole + t + (inner.num + inner.den * rest.const).floordiv(inner.den * q)
        return whole + t + Expr({(FloorDiv(rest, q),): 1})

    def __floordiv__(self, q: int) -> "Expr":
        return self.floordiv(q)

    def __mod__(self, q: int) -> "Expr":
        return self - q * self.floordiv(q)

    def ceildiv(self, q: int) -> "Expr":
        return (self + (q - 1)).floordiv(q)

    def exact_div_int(self, g: int) -> "Expr":
        assert all(c % g == 0 for _, c in self.terms) and self.const % g == 0
        return Expr({m: c // g for m, c in self.terms}, self.const // g)

    def exact_div(self, o: DimLike) -> "Expr | None":
        """``self / o`` when ``o`` divides every term exactly (for reshape's -1), else None."""
        o = Expr.lift(o)
        if o.is_const:
            if o.const == 0:
                return None
            if self.const % o.const or any(c % o.const for _, c in self.terms):
                return None
            return self.exact_div_int(o.const) if o.const > 0 else -self.exact_div_int(-o.const)
        if len(o.terms) != 1 or o.const != 0:
            return None
        (om, oc), = o.terms
        if self.const != 0:
            return None
        acc = {}
        for m, c in self.terms:
            rest = list(m)
            for a in om:
                if a not in rest:
                    return None
                rest.remove(a)
            if c % oc:
                return None
            acc[tuple(rest)] = c // oc
        const = acc.pop((), 0)
        return Expr(acc, const)

    # substitution and evaluation ------------------------------------------------------------------
    def subs(self, env: Mapping[str, "DimLike | Expr"]) -> "Expr":
        out = Expr((), self.const)
        for m, c in self.terms:
            prod = Expr((), c)
            for a in m:
                if isinstance(a, Sym):
                    prod = prod * (Expr.lift(env[a.name]) if a.name in env else Expr({(a,): 1}))
                else:
                    prod = prod * a.num.subs(env).floordiv(a.den)
            out = out + prod
        return out

    def evaluate(self, env: Mapping[str, object]):
        """Numeric value; ``env`` values may be ints or integer numpy arrays (vectorised maps)."""
        total = self.const
        for m, c in self.terms:
            prod = c
            for a in m:
                if isinstance(a, Sym):
                    if a.name not in env:
                        raise KeyError(a.name)
                    prod = prod * env[a.name]
                else:
                    prod = prod * (a.num.evaluate(env) // a.den)
            total = total + prod
        return total

    # comparison and printing ----------------------------------------------------------------------
    def __eq__(self, o: object) -> bool:
        if isinstance(o, (int, str)) and not isinstance(o, bool):
            try:
                o = Expr.lift(o)
            except (SyntaxError, TypeError):
                return False
        return isinstance(o, Expr) and self.terms == o.terms and self.const == o.const

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        parts: list[str] = []
        for m, c in self.terms:
            body = _mono_str(m)
            mag = abs(c)
            piece = body if mag == 1 else f"{mag}*{body}"
            parts.append(("- " if c < 0 else "+ ") + piece)
        if self.const or not parts:
            parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
        s = " ".join(parts)
        return s[2:] if s.startswith("+ ") else "-" + s[2:]

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def to_isl(self) -> str:
        """ISL affine syntax (``floor((...)/q)`` kept); raises if not affine."""
        if not self.is_affine():
            raise ValueError(f"{self} is not affine")
        return str(self)


def lone_floor(e: "Expr") -> FloorDiv | None:
    """``A`` when ``e`` is ``A + c`` for one floor atom ``A`` with coefficient 1 and a constant ``c``."""
    if len(e.terms) == 1:
        (m, c), = e.terms
        if c == 1 and len(m) == 1 and isinstance(m[0], FloorDiv):
            return m[0]
    return None


# ------------------------------------------------------------------------------------------------
# simplification with known ranges: index maps over iterators ``0 <= i < size``
#
# Interval bounds are inclusive, ints or +-inf (floats) for "unbounded". Every rule below is an
# identity for all values of the symbols inside their ranges, and a symbol without a range may take any
# integer value, so a symbolic size (``0 <= i < M``) only gives ``i >= 0``: nothing is simplified that
# is not provable for every size.

Interval = tuple
_INF = math.inf


def _imul(a: Interval, b: Interval) -> Interval:
    prods = [0 if x == 0 or y == 0 else x * y for x in a for y in b]
    return min(prods), max(prods)


def _ifloor(x, q: int):
    return x if math.isinf(x) else x // q


def bounds(e: "Expr", ranges: Mapping[str, Interval]) -> Interval:
    """Inclusive ``(lo, hi)`` of ``e`` when each symbol ``s`` lies in ``ranges[s]`` (others unbounded)."""
    lo = hi = e.const
    for m, c in e.terms:
        iv: Interval = (c, c)
        for a in m:
            if isinstance(a, Sym):
                iv = _imul(iv, ranges.get(a.name, (-_INF, _INF)))
            else:
                blo, bhi = bounds(a.num, ranges)
                iv = _imul(iv, (_ifloor(blo, a.den), _ifloor(bhi, a.den)))
        lo, hi = lo + iv[0], hi + iv[1]
    return lo, hi


def least(e: "DimLike | Expr") -> int | float:
    """The least value of ``e`` when every symbol in it (a size) is at least 1: a bound a choice of speed can
    rely on for every size (a batch of images has at least the pixels of one); ``-inf`` when there is none."""
    e = Expr.lift(e)
    return bounds(e, {s: (1, _INF) for s in e.symbols()})[0]


def iter_ranges(sizes: Mapping[str, "DimLike | Expr"]) -> dict[str, Interval]:
    """``0 <= name < size`` as inclusive intervals; a symbolic size bounds only from below."""
    out: dict[str, Interval] = {}
    for name, size in sizes.items():
        d = Expr.lift(size)
        hi = bounds(d, {})[1] - 1
        out[name] = (0, hi)
    return out


def _divisors(q: int) -> list[int]:
    """Divisors of ``q`` greater than 1, largest first."""
    small = [d for d in range(2, math.isqrt(q) + 1) if q % d == 0]
    return sorted(set(small + [q // d for d in small] + [q]), reverse=True)


def _floor_in(num: "Expr", q: int, ranges: Mapping[str, Interval]) -> "Expr":
    """``floor(num/q)`` simplified with ``ranges`` (``num`` already simplified).

    For a divisor ``c`` of ``q``, split ``num = c*X + R`` (X: the terms whose coefficients ``c``
    divides); when ``k*c <= R < (k+1)*c`` holds over the ranges, ``floor(num/q) = floor((X + k)/(q/c))``.
    With ``c = q`` that is ``floor((q*X + R)/q) = X + k`` (``floor(i/q) = 0`` for ``0 <= i < q``, and
    ``i mod q = i``); with a smaller ``c`` it is ``floor((6*a + b)/12) = floor(a/2)`` for ``0 <= b < 6``."""
    if q == 1:
        return num
    inner = lone_floor(Expr(num.terms, 0))
    if inner is not None:     # floor((floor(x/a) + c)/q) = floor((x + a*c)/(a*q))
        return _floor_in(inner.num + inner.den * num.const, inner.den * q, ranges)
    for c in _divisors(q):
        whole = Expr({m: k // c for m, k in num.terms if k % c == 0})
        rest = Expr({m: k for m, k in num.terms if k % c != 0}, num.const)
        lo, hi = bounds(rest, ranges)
        if math.isinf(lo) or math.isinf(hi):
            continue
        k = lo // c
        if hi // c == k:
            return _floor_in(whole + k, q // c, ranges)
    return num.floordiv(q)


def simplify(e: "Expr", ranges: Mapping[str, Interval]) -> "Expr":
    """``e`` with its floor atoms simplified where ``ranges`` (inclusive bounds per symbol, see
    ``iter_ranges``) prove it: equal to ``e`` at every point inside the ranges, not outside them."""
    if all(isinstance(a, Sym) for m, _ in e.terms for a in m):
        return e
    out = Expr((), e.const)
    for m, c in e.terms:
        prod = Expr((), c)
        for a in m:
            if isinstance(a, Sym):
                prod = prod * Expr({(a,): 1})
            else:
                prod = prod * _floor_in(simplify(a.num, ranges), a.den, ranges)
        out = out + prod
    return out


def expr_size(e: "Expr") -> int:
    """Terms in ``e``, those inside its floor atoms included (how big an index expression has grown)."""
    return len(e.terms) + sum(expr_size(a.num) for m, _ in e.terms for a in m if isinstance(a, FloorDiv))


def simplify_in(e: "DimLike | Expr", sizes: Mapping[str, "DimLike | Expr"]) -> "Expr":
    """``simplify`` over iterators ``0 <= name < sizes[name]``."""
    return simplify(Expr.lift(e), iter_ranges(sizes))


# ------------------------------------------------------------------------------------------------
# dims: the public vocabulary for shapes

def dim(x: DimLike) -> int | Expr:
    """Normalise a size: ints stay ints, constant expressions collapse to ints."""
    if isinstance(x, bool):
        raise TypeError("bool is not a size")
    if isinstance(x, int):
        return x
    e = Expr.lift(x)
    return e.const if e.is_const else e


def dim_json(d: int | Expr) -> int | str:
    return d if isinstance(d, int) else str(d)


def dims(xs) -> tuple:
    return tuple(dim(x) for x in xs)


def dim_eval(d: int | Expr, env: Mapping[str, int]) -> int:
    return d if isinstance(d, int) else int(Expr.lift(d).evaluate(env))


def prod(xs) -> int | Expr:
    out: int | Expr = 1
    for x in xs:
        out = dim(Expr.lift(out) * x) if not (isinstance(out, int) and isinstance(x, int)) else out * x
    return out


# ------------------------------------------------------------------------------------------------
# parser: "2*h + kh - 1", "floor((H + 1)/2)", "(H+1)//2", "E % 4", "M*K"

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9']*)|(//|[-+*/%(),]))")


def _tokenize(text: str) -> list[str]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise SyntaxError(f"unexpected character {text[pos]!r} at column {pos + 1} in {text!r}")
        out.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.text, self.toks, self.i = text, _tokenize(text), 0
        self.stop_slash = False   # inside floor(E/q): a top-level '/' ends E

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise SyntaxError(f"expected {want or 'a term'} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Expr:
        e = self.sum()
        if self.peek() is not None:
            raise SyntaxError(f"unexpected {self.peek()!r} in {self.text!r}")
        return e

    def sum(self) -> Expr:
        e = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.product()
            e = e + rhs if op == "+" else e - rhs
        return e

    def product(self) -> Expr:
        e = self.unary()
        while self.peek() in ("*", "//", "%", "/"):
            if self.peek() == "/" and self.stop_slash:
                break
            op = self.take()
            rhs = self.unary()
            if op == "*":
                e = e * rhs
                continue
            q = rhs.as_int()
            if q is None or q <= 0:
                raise SyntaxError(f"'{op}' needs a positive integer divisor in {self.text!r}")
            if op == "/":
                ex = e.exact_div(q)
                if ex is None:
                    raise SyntaxError(f"'/' outside floor() must divide exactly in {self.text!r}; use floor(E/q)")
                e = ex
            else:
                e = e.floordiv(q) if op == "//" else e % q
        return e

    def unary(self) -> Expr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.atom()

    def atom(self) -> Expr:
        tok = self.take()
        if tok.isdigit():
            return Expr((), int(tok))
        if tok == "(":
            saved, self.stop_slash = self.stop_slash, False
            e = self.sum()
            self.stop_slash = saved
            self.take(")")
            return e
        if tok in ("floor", "ceil") and self.peek() == "(":
            self.take("(")
            saved, self.stop_slash = self.stop_slash, True
            num = self.sum()
            self.stop_slash = saved
            self.take("/")
            den = self.unary().as_int()
            self.take(")")
            if den is None or den <= 0:
                raise SyntaxError(f"{tok}() needs a positive integer divisor in {self.text!r}")
            return num.floordiv(den) if tok == "floor" else num.ceildiv(den)
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9']*", tok):
            return Expr.sym(tok)
        raise SyntaxError(f"unexpected {tok!r} in {self.text!r}")


def parse_expr(text: str) -> Expr:
    return _Parser(text).parse()
