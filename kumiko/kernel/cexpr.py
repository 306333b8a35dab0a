"""C spellings of the region's pieces: index expressions, dtypes, loads/stores with conversion, math.

Index arithmetic is ``long long``; ``floor(E/q)`` becomes ``kk_fdiv(E, q)`` (floor, not C's truncation).
Size symbols are the variables ``s_<name>`` read from the ABI's ``syms`` array. 16-bit floats are
stored as ``uint16_t`` and computed in ``float``; bool is stored as ``unsigned char``.

The ``v*`` functions are the vector spellings the CPU loop nest uses for a loop over a contiguous axis
(``kumiko_cpu.h``'s ``kv_t``: KUMIKO_VW float lanes; bools become ``kvi_t`` lane masks of 0 / -1).
They return None where a value has no vector form; the loop then stays scalar. Loads may be strided
(a gather, or a deinterleave for stride 2) and masked (the border iterations of an index-set split loop).
"""
from __future__ import annotations

import math
import re

from kumiko import dtypes, ops
from kumiko.symbolic import Expr, FloorDiv, Sym

STORAGE = {"fp16": "uint16_t", "bf16": "uint16_t", "fp32": "float", "fp64": "double", "i32": "int32_t",
           "bool": "unsigned char"}
COMPUTE = {"fp16": "float", "bf16": "float", "fp32": "float", "fp64": "double", "i32": "int32_t", "bool": "int"}
#: a 16-bit float's conversions: (to float, from float)
HALF = {"fp16": ("kk_h2f", "kk_f2h"), "bf16": ("kk_b2f", "kk_f2b")}

#: the target-neutral names the emitter uses, bound for the CPU to kumiko_cpu.h (the CUDA renderer binds
#: the same names to CUDA intrinsics); the helpers the op table's spellings call follow (``ops.helpers``)
_PRELUDE_HEAD = r"""
#include "kumiko_cpu.h"
#define kk_fdiv kumiko_floordiv
#define kk_h2f kumiko_f16_to_f32
#define kk_f2h kumiko_f32_to_f16
#define kk_b2f kumiko_bf16_to_f32
#define kk_f2b kumiko_f32_to_bf16
"""


def __getattr__(name: str):
    if name == "PRELUDE":      # read when a source is rendered: an op registered since import brings its helpers
        return _PRELUDE_HEAD + ops.helpers("c", "static inline")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SMALL_INT = re.compile(r"^\(?\s*(-?[1-4])(?:\.0*)?f?\s*\)?$")
#: a float literal as ``literal`` spells it (never NaN)
_FLOAT_LIT = re.compile(r"^(?:-?\d+(?:\.\d*)?(?:e[+-]?\d+)?f|INFINITY|\(-INFINITY\))$")
_VEC_LIT = re.compile(r"^kv_broadcast\((.*)\)$")
IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def rename(text: str | None, subst: dict) -> str | None:
    """The C expression ``text`` with each identifier that is a key of ``subst`` replaced by its value."""
    if text is None:
        return None
    return IDENT.sub(lambda m: subst.get(m.group(0), m.group(0)), text)


def _lit_value(s: str) -> float | None:
    """The value of a float literal operand (None: not one)."""
    if not _FLOAT_LIT.match(s):
        return None
    return {"INFINITY": math.inf, "(-INFINITY)": -math.inf}.get(s) or float(s[:-1])


def _minmax_lit(fn: str, a: str, b: str, la: str | None, lb: str | None, pick, pick_tie=None) -> str | None:
    """numpy's ``maximum``/``minimum`` of ``a`` and ``b`` when one is a float literal ``L`` (its text ``la`` or
    ``lb``), as the one-instruction form ``pick(L, x)`` = ``L > x ? L : x`` (``<`` for min; x86's maxps/minps:
    a NaN ``x`` comes out, as numpy's). numpy gives its second operand on a tie: with ``L`` first that is
    ``x``, as ``pick``; with ``L`` second it differs only for zeros of the other sign, so ``L = +0`` takes
    ``pick_tie(L, x)`` = ``x <= L ? L : x`` (``>=`` for min: L on a tie, a NaN ``x`` out), or adds ``+0`` to
    ``pick`` (a ``-0`` becomes ``+0``, any other value is unchanged), and ``L = -0`` keeps the general form.
    The scalar C takes the one select: gcc does not if-convert ``(L > x ? L : x) + 0`` on AVX2 (it moves the
    add onto one arm, and an add may trap), so a ReLU6 epilogue stayed scalar."""
    if fn not in ("max", "min"):
        return None
    if la is not None and _lit_value(la) is not None:
        return pick(a, b)
    v = _lit_value(lb) if lb is not None else None
    if v is None or (v == 0 and math.copysign(1.0, v) < 0):
        return None
    if v != 0:
        return pick(b, a)
    return pick_tie(b, a) if pick_tie is not None else f"({pick(b, a)} + {b})"


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


def offset_expr(idx: tuple, shape: tuple) -> Expr:
    """Row-major offset of ``idx`` into ``shape``, symbolic."""
    off: Expr | None = None
    for i, d in zip(idx, shape):
        off = Expr.lift(i) if off is None else off * d + i
    return off if off is not None else Expr.lift(0)


def offset(idx: tuple, shape: tuple, axes: set) -> str:
    """Row-major offset of ``idx`` into ``shape``."""
    return index(offset_expr(idx, shape), axes)


def stride(e, var: str) -> int | None:
    """How far ``e`` moves when ``var`` grows by one: 0 when ``var`` does not occur, the integer
    coefficient when it occurs only as a plain degree-1 term, None otherwise (times a size symbol,
    inside a floor division)."""
    e = Expr.lift(e)
    k = 0
    for mono, c in e.terms:
        for a in mono:
            if isinstance(a, Sym) and a.name == var:
                if mono != (a,):
                    return None
                k = c
            elif isinstance(a, FloorDiv) and var in a.num.symbols():
                return None
    return k


def load(buf: str, off: str, dt: dtypes.DType) -> str:
    raw = f"{buf}[{off}]"
    if dt.name in HALF:
        return f"{HALF[dt.name][0]}({raw})"
    if dt.name == "bool":
        return f"((int){raw})"
    return raw


def _call_arg(v: str, fn: str) -> str | None:
    """``X`` when ``v`` is exactly the call ``fn(X)``, else None."""
    if not (v.startswith(fn + "(") and v.endswith(")")):
        return None
    depth = 0
    for i, ch in enumerate(v[len(fn):], len(fn)):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return v[len(fn) + 1:-1] if i == len(v) - 1 else None
    return None


def store_value(v: str, dt: dtypes.DType) -> str:
    """The value ``v`` (a compute-type expression) as the stored type; a value that was just widened from
    that 16-bit type (a cast to it, a load of it) is stored as the 16 bits it came from."""
    if dt.name in HALF:
        widen, narrow = HALF[dt.name]
        inner = _call_arg(v, widen)
        return inner if inner is not None else f"{narrow}({v})"
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
    if to.name in HALF:
        widen, narrow = HALF[to.name]
        return f"{widen}({narrow}((float)({v})))"
    if to.name == "bool":
        return f"(({v}) != 0)"
    if to.name == "i32" and src.is_float:
        return f"(int32_t)({v})"
    return f"({COMPUTE[to.name]})({v})"


def unary(fn: str, x: str, ct: str) -> str:
    return ops.BY_FN[fn].spell(ct, x=x)


def reduce_update(op: str, acc: str, v: str, ct: str) -> str:
    """The new value of a reduction's accumulator ``acc`` after element ``v``."""
    if op not in ops.REDUCE_BY_FN:
        raise KeyError(f"reduction op {op!r}")
    return ops.REDUCE_BY_FN[op].update(acc, v, ct)


def binary(fn: str, a: str, b: str, ct: str, zero_masks: bool = False) -> str:
    """``fn`` of ``a`` and ``b`` in C. ``zero_masks``: the max or min of a value and a +0 literal as the CPU
    header's ``kumiko_max0f``/``kumiko_min0f`` (a compare and an and-not) instead of a select."""
    op = ops.BY_FN[fn]
    n = _SMALL_INT.match(b) if op.c_small_int and ct == "float" else None
    if n is not None:
        return op.c_small_int(a, int(n.group(1)), "1.0f")
    if ct == "float":
        sym = ">" if fn == "max" else "<"
        tie = "<=" if fn == "max" else ">="

        def pick_tie(c: str, x: str) -> str:
            return f"kumiko_{fn}0f({x})" if zero_masks else f"(({x}) {tie} {c} ? {c} : ({x}))"
        lit = _minmax_lit(fn, a, b, a, b, lambda c, x: f"({c} {sym} ({x}) ? {c} : ({x}))", pick_tie)
        if lit is not None:
            return lit
    return op.spell(ct, a=a, b=b)


# vectors -------------------------------------------------------------------------------------------------
#: compute dtypes whose values are float lanes (kv_t) in a vector loop
VFLOAT = ("fp32", "fp16", "bf16")
_VLOAD = {"fp32": "kv_load", "fp16": "kv_load_f16", "bf16": "kv_load_bf16", "bool": "kv_load_bool"}
_VSTORE = {"fp32": "kv_store", "fp16": "kv_store_f16", "bf16": "kv_store_bf16", "bool": "kv_store_bool"}


def vunary(fn: str, x: str) -> str | None:
    """The spelling of a unary op on float lanes (None: it has none)."""
    cv = ops.BY_FN[fn].cv
    return cv.format(x=x) if cv is not None else None


def vkind(dt: dtypes.DType | None) -> str | None:
    """'f' for float lanes, 'm' for bool lane masks, None for what stays scalar (i32, fp64)."""
    if dt is None or dt.name in VFLOAT:
        return "f"
    return "m" if dt.name == "bool" else None


def vtype(kind: str) -> str:
    return "kv_t" if kind == "f" else "kvi_t"


def vbroadcast(v: str, kind: str) -> str:
    return f"kv_broadcast({v})" if kind == "f" else f"kv_mask_broadcast({v})"


def vload(buf: str, off: str, dt: dtypes.DType, stride: int = 1, mask: str | None = None) -> str | None:
    """KUMIKO_VW elements ``buf[off + l * stride]`` (consecutive by default); with a ``mask`` (a kvi_t) only
    the lanes it sets are read, the others are 0 and touch no memory. None: no vector form for this storage."""
    fn = _VLOAD.get(dt.name)
    if fn is None:
        return None
    p = f"{buf} + {off}"
    if dt.name == "fp32":
        if stride == 1:
            return f"kv_load_mask({p}, {mask})" if mask else f"kv_load({p})"
        return f"kv_load_stride_mask({p}, {stride}, {mask})" if mask else f"kv_load_stride({p}, {stride})"
    if stride == 1 and mask is None:
        return f"{fn}({p})"
    return f"{fn}_sm({p}, {stride}, {mask or 'kv_mask_broadcast(1)'})"


def vstore_fn(dt: dtypes.DType, masked: bool = False) -> str | None:
    """The helper that stores KUMIKO_VW consecutive lanes (``masked``: ``fn(p, v, mask)``, the set lanes only)."""
    fn = _VSTORE.get(dt.name)
    return f"{fn}_mask" if fn and masked else fn


def vcast(v: str, src: dtypes.DType, to: dtypes.DType) -> str | None:
    """The vector form of ``cast`` (masks in and out for bool); None where it has none."""
    sk, tk = vkind(src), vkind(to)
    if sk is None or tk is None:
        return None
    if sk == "m":
        return v if tk == "m" else f"kv_select({v}, kv_broadcast(1.0f), kv_zero())"
    if tk == "m":
        return f"(({v}) != kv_zero())"
    return {"fp16": f"kv_round_f16({v})", "bf16": f"kv_round_bf16({v})"}.get(to.name, v)


def vbinary(fn: str, a: str, b: str, kind: str) -> str | None:
    """Lane-wise ``binary`` of two vectors of ``kind`` ('m': bools as 0 / -1 masks); comparisons give masks."""
    op = ops.BY_FN[fn]
    if kind == "f":
        va, vb = (_VEC_LIT.match(x) for x in (a, b))
        lit = _minmax_lit(fn, a, b, va and va.group(1), vb and vb.group(1), lambda c, x: f"kv_{fn}({c}, {x})")
        if lit is not None:
            return lit
    if kind == "f" and op.c_small_int:
        vb = _VEC_LIT.match(b)
        n = _SMALL_INT.match(vb.group(1)) if vb else None
        if n is not None:
            return op.c_small_int(a, int(n.group(1)), "kv_broadcast(1.0f)")
    tmpl = op.cv_mask if kind == "m" else op.cv
    return tmpl.format(a=a, b=b) if tmpl is not None else None
