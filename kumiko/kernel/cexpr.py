"""C spellings of the region's pieces: index expressions, dtypes, loads/stores with conversion, math.

Index arithmetic is ``long long``; ``floor(E/q)`` becomes ``kk_fdiv(E, q)`` (floor, not C's truncation).
Size symbols are the variables ``s_<name>`` read from the ABI's ``syms`` array. 16-bit floats are
stored as ``uint16_t`` and computed in ``float``; bool is stored as ``unsigned char``.
"""
from __future__ import annotations

import math

from kumiko import dtypes
from kumiko.symbolic import Expr, FloorDiv, Sym

STORAGE = {"fp16": "uint16_t", "bf16": "uint16_t", "fp32": "float", "fp64": "double", "i32": "int32_t",
           "bool": "unsigned char"}
COMPUTE = {"fp16": "float", "bf16": "float", "fp32": "float", "fp64": "double", "i32": "int32_t", "bool": "int"}

#: the target-neutral names the emitter uses, bound for the CPU to kumiko_cpu.h (the CUDA renderer binds
#: the same names to CUDA intrinsics); only the NaN-propagating max/min (numpy's semantics) live here
PRELUDE = r"""
#include "kumiko_cpu.h"
#define kk_fdiv kumiko_floordiv
#define kk_h2f kumiko_f16_to_f32
#define kk_f2h kumiko_f32_to_f16
#define kk_b2f kumiko_bf16_to_f32
#define kk_f2b kumiko_f32_to_bf16
static inline float kk_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float kk_minf(float a, float b) { return (a < b || a != a) ? a : b; }
"""


def index(e, axes: set) -> str:
    """A symbolic index/size expression in C (``long long``)."""
    e = Expr.lift(e)
    parts = []
    for mono, c in e.terms:
        factors = []
        for a in mono:
            if isinstance(a, Sym):
                factors.append(a.name if a.name in axes else f"s_{a.name}")
            else:
                assert isinstance(a, FloorDiv)
                factors.append(f"kk_fdiv({index(a.num, axes)}, {a.den}LL)")
        body = "*".join(factors)
        parts.append(f"{c}LL*{body}" if c != 1 else body)
    if e.const or not parts:
        parts.append(f"{e.const}LL")
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]


def offset(idx: tuple, shape: tuple, axes: set) -> str:
    """Row-major offset of ``idx`` into ``shape``."""
    off: Expr | None = None
    for i, d in zip(idx, shape):
        off = Expr.lift(i) if off is None else off * d + i
    return index(off if off is not None else Expr.lift(0), axes)


def load(buf: str, off: str, dt: dtypes.DType) -> str:
    raw = f"{buf}[{off}]"
    if dt.name == "fp16":
        return f"kk_h2f({raw})"
    if dt.name == "bf16":
        return f"kk_b2f({raw})"
    if dt.name == "bool":
        return f"((int){raw})"
    return raw


def store_value(v: str, dt: dtypes.DType) -> str:
    if dt.name == "fp16":
        return f"kk_f2h({v})"
    if dt.name == "bf16":
        return f"kk_f2b({v})"
    if dt.name == "bool":
        return f"(unsigned char)(({v}) != 0)"
    return v


def literal(v, dt: dtypes.DType | None) -> str:
    ct = COMPUTE[dt.name] if dt is not None else "float"
    if isinstance(v, bool):
        return "1" if v else "0"
    if ct in ("int32_t", "int"):
        return str(int(v))
    v = float(v)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if ct == "double":
        return repr(v)
    return f"{float(f'{v:.9g}')!r}f"


def cast(v: str, src: dtypes.DType, to: dtypes.DType) -> str:
    """Value conversion in compute types; a cast to a 16-bit float rounds to it (and back to float)."""
    if to.name == "fp16":
        return f"kk_h2f(kk_f2h((float)({v})))"
    if to.name == "bf16":
        return f"kk_b2f(kk_f2b((float)({v})))"
    if to.name == "bool":
        return f"(({v}) != 0)"
    if to.name == "i32" and src.is_float:
        return f"(int32_t)({v})"
    return f"({COMPUTE[to.name]})({v})"


UNARY = {"neg": "(-({x}))", "exp2": "exp2f({x})", "log2": "log2f({x})", "sqrt": "sqrtf({x})",
         "rsqrt": "(1.0f / sqrtf({x}))", "relu": "(({x}) < 0 ? 0 : ({x}))", "erf": "erff({x})"}
UNARY_F64 = {"exp2": "exp2({x})", "log2": "log2({x})", "sqrt": "sqrt({x})", "rsqrt": "(1.0 / sqrt({x}))",
             "erf": "erf({x})"}


def unary(fn: str, x: str, ct: str) -> str:
    tmpl = UNARY_F64.get(fn, UNARY[fn]) if ct == "double" else UNARY[fn]
    if ct == "int32_t" and fn == "neg":
        return f"(-({x}))"
    return tmpl.format(x=x)


def binary(fn: str, a: str, b: str, ct: str) -> str:
    if fn in ("max", "min"):
        if ct in ("float",):
            return f"kk_{fn}f({a}, {b})"
        return f"(({a}) {'>' if fn == 'max' else '<'} ({b}) ? ({a}) : ({b}))"
    if fn == "pow":
        return f"powf({a}, {b})" if ct == "float" else f"pow({a}, {b})"
    ops = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
    return f"(({a}) {ops[fn]} ({b}))"
