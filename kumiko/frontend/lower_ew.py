"""Lowering of the ``Elementwise`` op and ``Cast``: the unary, binary and comparison fns
(``UNARY_FNS``, ``BINARY_FNS``, ``COMPARE_FNS``), ``where`` and ``clip``, and the transcendentals Tiny
IR has no op for (exp, sigmoid, tanh, gelu, sin/cos/tan) composed from EXP2, ERF and polynomials.
Registered on ``lower.OPS`` when ``lower`` is imported."""
from __future__ import annotations

import math
from typing import Callable

from kumiko import dtypes
from kumiko.frontend.lower import LOG2E, Ctx, _imm, ew, one_input, op, same_dtype, to_compute

LN2 = math.log(2.0)


def _exp(ctx: Ctx, x: str) -> str:
    return ctx.b.add("EXP2", [ew(ctx, "MUL", x, LOG2E)])


def _sigmoid(ctx: Ctx, x: str) -> str:
    e = ctx.b.add("EXP2", [ew(ctx, "MUL", x, -LOG2E)])
    return ew(ctx, "FDIV", 1.0, ew(ctx, "ADD", e, 1.0))


def _tanh(ctx: Ctx, x: str) -> str:
    return ew(ctx, "SUB", ew(ctx, "MUL", _sigmoid(ctx, ew(ctx, "MUL", x, 2.0)), 2.0), 1.0)


def _gelu(ctx: Ctx, x: str) -> str:
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.err("E1010", f"gelu's approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        inner = ew(ctx, "MUL", ew(ctx, "ADD", x, ew(ctx, "MUL", ew(ctx, "MUL", ew(ctx, "MUL", x, x), x), 0.044715)),
                   math.sqrt(2 / math.pi))
        return ew(ctx, "MUL", ew(ctx, "MUL", x, 0.5), ew(ctx, "ADD", _tanh(ctx, inner), 1.0))
    erf = ctx.b.add("ERF", [ew(ctx, "MUL", x, 1 / math.sqrt(2))])
    return ew(ctx, "MUL", ew(ctx, "MUL", x, 0.5), ew(ctx, "ADD", erf, 1.0))


#: pi/2 in three parts (Cody-Waite, as cephes' sinf): the leading parts have few significant bits, so
#: ``k * part`` is exact in fp32 for the quotients that matter and ``x - k*pi/2`` keeps its digits
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)
#: minimax polynomials of sin and cos on [-pi/4, pi/4] (cephes' sinf/cosf coefficients)
_SIN_POLY = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_POLY = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


def _floor(ctx: Ctx, x: str) -> str:
    """floor through CAST to i32 (truncation toward zero) and back, one down where that rounded up; the
    caller keeps ``x`` inside i32's range."""
    t = ctx.b.cast(ctx.b.cast(x, dtypes.i32), ctx.dtype(x))
    return ew(ctx, "WHERE", ew(ctx, "CMPLT", x, t), ew(ctx, "SUB", t, 1.0), t)


def _sincos(ctx: Ctx, x: str) -> tuple[str, str]:
    """(sin x, cos x) from the ops Tiny IR has, since it has no SIN/COS: x = k*pi/2 + r with |r| <= pi/4,
    short polynomials in r, then the quadrant k mod 4 picks and signs them. The quotient is clamped to
    +-2**22 so its CAST stays in range; beyond |x| ~ 1e5 fp32 reduction loses digits anyway, and such
    arguments are noise (their ulp is a sizeable part of the period)."""
    q = ew(ctx, "MIN", ew(ctx, "MAX", ew(ctx, "MUL", x, 2 / math.pi), -2.0 ** 22), 2.0 ** 22)
    k = _floor(ctx, ew(ctx, "ADD", q, 0.5))
    r = x
    for part in _PIO2:
        r = ew(ctx, "SUB", r, ew(ctx, "MUL", k, part))
    z = ew(ctx, "MUL", r, r)

    def poly(cs: tuple) -> str:
        p = ew(ctx, "MUL", z, cs[0])
        for c in cs[1:-1]:
            p = ew(ctx, "MUL", ew(ctx, "ADD", p, c), z)
        return ew(ctx, "ADD", p, cs[-1])

    s = ew(ctx, "ADD", ew(ctx, "MUL", ew(ctx, "MUL", poly(_SIN_POLY), z), r), r)
    c = ew(ctx, "ADD", ew(ctx, "SUB", ew(ctx, "MUL", ew(ctx, "MUL", poly(_COS_POLY), z), z), ew(ctx, "MUL", z, 0.5)),
           1.0)
    k4 = ew(ctx, "MUL", k, 0.25)
    m = ew(ctx, "MUL", ew(ctx, "SUB", k4, _floor(ctx, k4)), 4.0)                  # k mod 4, in {0, 1, 2, 3}
    ns, nc = ctx.b.add("NEG", [s]), ctx.b.add("NEG", [c])

    def pick(vals: tuple) -> str:
        out = vals[3]
        for j in (2, 1, 0):
            out = ew(ctx, "WHERE", ew(ctx, "CMPEQ", m, float(j)), vals[j], out)
        return out

    return pick((s, c, ns, nc)), pick((c, ns, nc, s))


def _tan(ctx: Ctx, x: str) -> str:
    s, c = _sincos(ctx, x)
    return ew(ctx, "FDIV", s, c)


#: fn -> (arity, builder over compute-dtype operands, runs in fp32 for 16-bit floats)
UNARY_FNS: dict[str, tuple[Callable[[Ctx, str], str], bool]] = {
    "neg": (lambda c, x: c.b.add("NEG", [x]), False),
    "relu": (lambda c, x: c.b.add("RELU", [x]), False),
    "abs": (lambda c, x: ew(c, "MAX", x, c.b.add("NEG", [x])), False),
    "exp": (_exp, True),
    "exp2": (lambda c, x: c.b.add("EXP2", [x]), True),
    "log": (lambda c, x: ew(c, "MUL", c.b.add("LOG2", [x]), LN2), True),
    "log2": (lambda c, x: c.b.add("LOG2", [x]), True),
    "sqrt": (lambda c, x: c.b.add("SQRT", [x]), True),
    "rsqrt": (lambda c, x: c.b.add("RSQRT", [x]), True),
    "recip": (lambda c, x: ew(c, "FDIV", 1.0, x), True),
    "sigmoid": (_sigmoid, True),
    "silu": (lambda c, x: ew(c, "MUL", x, _sigmoid(c, x)), True),
    "tanh": (_tanh, True),
    "gelu": (_gelu, True),
    "erf": (lambda c, x: c.b.add("ERF", [x]), True),
    "sin": (lambda c, x: _sincos(c, x)[0], True),
    "cos": (lambda c, x: _sincos(c, x)[1], True),
    "tan": (_tan, True),
    "leaky_relu": (lambda c, x: ew(c, "WHERE", ew(c, "CMPLT", x, 0.0), ew(c, "MUL", x, float(c.number("alpha", 0.01))),
                                   x), False),
}
BINARY_FNS = {"add": "ADD", "sub": "SUB", "mul": "MUL", "div": "FDIV", "max": "MAX", "min": "MIN", "pow": "POW"}
COMPARE_FNS = {"lt": ("CMPLT", False), "le": ("CMPLE", False), "gt": ("CMPLT", True), "ge": ("CMPLE", True),
               "eq": ("CMPEQ", False), "ne": ("CMPNE", False)}
FLOAT_ONLY = {"div", "pow"}


@op("Elementwise")
def lower_elementwise(ctx: Ctx, args: list) -> str:
    fn = ctx.attr("fn")
    if not isinstance(fn, str):
        raise ctx.err("E1009", "Elementwise needs an 'fn'")
    fn = fn.lower()
    arity = 1 if fn in UNARY_FNS or fn in ("cast", "clip") else 3 if fn == "where" else 2
    if fn not in UNARY_FNS and fn not in BINARY_FNS and fn not in COMPARE_FNS and fn not in ("where", "cast", "clip"):
        known = sorted([*UNARY_FNS, *BINARY_FNS, *COMPARE_FNS, "where", "cast", "clip"])
        raise ctx.err("E1006", f"unknown elementwise fn {fn!r}", suggestion=f"use one of {', '.join(known)}")
    if len(args) != arity:
        raise ctx.err("E1009", f"{fn} takes {arity} inputs, got {len(args)}")
    if fn == "cast":
        if not isinstance(args[0], str):
            raise ctx.err("E1009", "cast needs a tensor input")
        return ctx.b.cast(args[0], ctx.dtype_attr("to", ctx.dtype(args[0])))
    if fn in UNARY_FNS:
        x = args[0]
        if not isinstance(x, str):
            raise ctx.err("E1009", f"{fn} needs a tensor input")
        build, in_fp32 = UNARY_FNS[fn]
        if not ctx.dtype(x).is_float and (fn not in ("neg", "relu", "abs") or ctx.dtype(x) is dtypes.bool_):
            raise ctx.err("E1012", f"{fn} needs a {'numeric' if fn in ('neg', 'relu', 'abs') else 'float'} input, "
                          f"got {ctx.dtype(x)}")
        if in_fp32:
            xc, dt = to_compute(ctx, x)
            return ctx.b.cast(build(ctx, xc), dt)
        return build(ctx, x)
    if fn == "clip":
        x = args[0]
        lo, hi = ctx.number("min", infinite=True), ctx.number("max", infinite=True)   # min > max gives max
        if lo is not None:
            x = ew(ctx, "MAX", x, lo)
        if hi is not None:
            x = ew(ctx, "MIN", x, hi)
        return x
    if fn == "where":
        if isinstance(args[0], str) and ctx.dtype(args[0]) is not dtypes.bool_:
            raise ctx.err("E1005", f"where's condition must be bool, got {ctx.dtype(args[0])}")
        if isinstance(args[0], str) and not any(isinstance(a, str) for a in args[1:]):
            # both values are literals: the result dtype is fp32 if either is a float, else i32 (bool if both are)
            lits = [_imm(a) for a in args[1:]]
            dt = dtypes.fp32 if any(isinstance(v, float) for v in lits) else \
                dtypes.bool_ if all(isinstance(v, bool) for v in lits) else dtypes.i32
            args = [args[0], ctx.b.const(lits[0], dt, ctx.shape(args[0])), lits[1]]
        return ew(ctx, "WHERE", *args)
    if fn in COMPARE_FNS:
        uop, swap = COMPARE_FNS[fn]
        return ew(ctx, uop, *(args[::-1] if swap else args))
    dt = same_dtype(ctx, args)
    if fn in FLOAT_ONLY and dt is not None and not dt.is_float:
        raise ctx.err("E1012", f"{fn} needs float operands, got {dt}")
    if fn == "pow":
        xs = [to_compute(ctx, a)[0] if isinstance(a, str) else a for a in args]
        return ctx.b.cast(ew(ctx, "POW", *xs), dt)
    return ew(ctx, BINARY_FNS[fn], *args)


@op("Cast")
def lower_cast(ctx: Ctx, args: list) -> str:
    return ctx.b.cast(one_input(ctx, args), ctx.dtype_attr("to", ctx.dtype(args[0])))
