"""The op table: every elementwise and reduce op's meaning, written once.

Each Tiny IR elementwise uop (``kumiko.tiny.ir``'s UNARY, BINARY, COMPARE, plus WHERE and CAST) and each
REDUCE op has one entry here, and every stage reads it instead of spelling the op itself:

- ``np``: the numpy meaning on compute-dtype values (16-bit floats arrive as fp32) - the evaluator
  (``tiny/evaluate.py``), region playback and the masked-column elision's constant folding;
- ``fn``: the op's name in Region Buffer SSA (``region/form.py`` builds it, ``region/ssa.py`` checks it);
- ``c``: the C spelling per compute type (key ``""``: any other), with ``{x}`` (unary), ``{a}``/``{b}``
  (binary) and ``{ct}`` (the compute type); ``c_cpu`` the scalar twin of a ``kumiko_cpu.h`` vector helper
  used in CPU loop nests; ``cv``/``cv_mask`` the spelling on ``kv_t`` float lanes / ``kvi_t`` bool masks
  (None: the loop stays scalar). CUDA C compiles the same spellings: ``kk_*`` names are bound by each
  target's prelude, and ``helpers`` holds the definitions that differ per target (``"c"``, ``"cuda"``) or
  are shared over compute types (``"typed"``, expanded over ``helper_cts``);
- ``flops``: what ``runtime/flops.py`` counts per output element (per input element for a reduce op);
- algebra used by simplification and elision: ``identity`` (``x op e == x``; on both sides when
  ``commutative``), ``absorbing`` (``z op x == z`` for every finite x: on the left, on both sides when
  commutative; ``nonzero_other``: only for a nonzero x), ``anticommutative`` (``x op y == -(y op x)``),
  ``nan_propagates``; a reduce op's ``identity``, its ``combine`` (the binary op adding one element) and
  ``hoists`` (the binary op whose invariant operand leaves the reduction, R1).

Adding an op is one ``register(Op(...))`` call (``docs/ARCHITECTURE.md``, "How to add an op"): the Tiny IR
accepts the registered uop, and every stage above handles it. This module is a leaf: it imports only
``kumiko.dtypes``, ``kumiko.diagnostics`` and numpy.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError

KINDS = ("unary", "binary", "compare", "select", "cast")
INF = math.inf


@dataclass(frozen=True)
class Op:
    name: str                         # the Tiny IR uop ("EXP2")
    fn: str                           # the region (RB-SSA) name ("exp2")
    kind: str                         # one of KINDS
    np: Callable                      # numpy meaning on compute-dtype values
    c: Mapping[str, str] = field(default_factory=dict)
    c_cpu: str | None = None          # kumiko_cpu.h scalar twin of the vector spelling (fp32 CPU loop nests)
    c_small_int: Callable | None = None   # (a, n, one) -> the spelling when ``b`` is a small integer constant n
    cv: str | None = None             # on kv_t float lanes
    cv_mask: str | None = None        # on kvi_t bool lane masks
    helpers: Mapping[str, str] = field(default_factory=dict)   # "c" | "cuda" | "typed" -> definitions
    helper_cts: tuple = ()            # compute types a "typed" helper is written for
    flops: int = 1
    numeric: bool = False             # unary: also takes i32 operands (else float only)
    float_only: bool = False          # binary: float operands only
    identity: float | None = None
    absorbing: tuple = ()
    nonzero_other: bool = False
    commutative: bool = False
    anticommutative: bool = False
    nan_propagates: bool = False

    @property
    def arity(self) -> int:
        return {"unary": 1, "cast": 1, "select": 3}.get(self.kind, 2)

    def spell(self, ct: str, **operands: str) -> str:
        """The C spelling for compute type ``ct``."""
        return (self.c.get(ct) or self.c[""]).format(ct=ct, **operands)


@dataclass(frozen=True)
class ReduceOp:
    name: str                         # the REDUCE arg ("SUM")
    fn: str                           # the region name ("sum")
    np: Callable                      # numpy reduction over ``axis``
    combine: str                      # the binary op (Tiny IR name) adding one element to the accumulator
    identity: float                   # in float dtypes (``dtypes.neutral`` gives it per dtype)
    hoists: str                       # R1: the binary op whose reduction-invariant operand leaves the reduction
    c: str | None = None              # C update ``{acc}``, ``{v}`` (None: the combine op's spelling)
    cv: str = ""                      # the update on kv_t lanes
    cv_h: str = ""                    # the horizontal reduction of the lanes ``{acc}`` (NaN lanes ``{nan}``)
    nan_lanes: bool = False           # vector lanes track NaN inputs apart (the lane op drops them)
    flops: int = 1

    def update(self, acc: str, v: str, ct: str) -> str:
        if self.c is not None:
            return self.c.format(acc=acc, v=v)
        return ELEMENTWISE[self.combine].spell(ct, a=acc, b=v)


_erf_u = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """math.erf element by element (in float64, back in ``x``'s dtype)."""
    x = np.asarray(x)
    return np.asarray(_erf_u(x.astype(np.float64)), dtype=np.float64).astype(x.dtype) if x.size else x


def cast(x: np.ndarray, to: dtypes.DType, dest=None, via=None) -> np.ndarray:
    """CAST's meaning: a float to an integer truncates toward zero (C), to bool is ``!= 0``, anything else
    converts to ``dest`` (default ``to``'s storage dtype), through ``via`` first when given."""
    if to.is_int and x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.trunc(x).astype(to.np)
    if to is dtypes.bool_:
        return x != 0
    return (x if via is None else x.astype(via)).astype(to.np if dest is None else dest)


def _infix(sym: str) -> dict:
    return {"c": {"": f"(({{a}}) {sym} ({{b}}))"}, "cv": f"({{a}} {sym} {{b}})"}


def _math(f32: str, f64: str, cv: str | None, **kw) -> dict:
    return {"c": {"": f32, "double": f64}, "cv": cv, **kw}


_NANMAX_C = ("/* NaN-propagating max/min (a NaN in either wins). Two selects, no short-circuit: GCC makes them\n"
             " * branch-free (a compare-driven branch on data mispredicts half the time in a pooling tail). */\n")
_MINMAX_CTS = ("double", "int32_t", "int")


def _minmax(fn: str, op: str, identity: float, mask: str) -> dict:
    return {"c": {"float": f"kk_{fn}f({{a}}, {{b}})", "": f"kk_{fn}_{{ct}}({{a}}, {{b}})"},
            "cv": f"kv_{fn}nan({{a}}, {{b}})", "cv_mask": mask,
            "helpers": {"c": ("" if fn == "min" else _NANMAX_C) + f"static inline float kk_{fn}f(float a, float b) "
                        f"{{ const float m = a {op} b ? a : b; return a != a ? a : m; }}",
                        "cuda": f"__device__ __forceinline__ float kk_{fn}f(float a, float b) "
                        f"{{ return (a {op} b || a != a) ? a : b; }}",
                        "typed": f"{{q}} {{ct}} kk_{fn}_{{ct}}({{ct}} a, {{ct}} b) {{{{ return a {op} b ? a : b; }}}}"},
            "helper_cts": _MINMAX_CTS, "identity": identity, "absorbing": (-identity,), "commutative": True,
            "nan_propagates": True}


def _pow_chain(a: str, n: int, one: str) -> str:
    """``a`` to the integer power ``n`` by binary exponentiation written out (x^3 = x * (x * x)); a negative ``n``
    divides ``one`` by it. Within an ulp or two of powf, as the evaluator's bound allows."""
    r, b, m = None, a, abs(n)
    while m:
        if m & 1:
            r = b if r is None else f"({r} * {b})"
        m >>= 1
        if m:
            b = f"({b} * {b})"
    return f"({one} / {r})" if n < 0 else r


_OPS = (
    Op("NEG", "neg", "unary", lambda x: -x, c={"": "(-({x}))"}, cv="(-({x}))", numeric=True),
    Op("EXP2", "exp2", "unary", np.exp2, c_cpu="kumiko_exp2({x})", **_math("exp2f({x})", "exp2({x})", "kv_exp2({x})")),
    Op("LOG2", "log2", "unary", np.log2, **_math("log2f({x})", "log2({x})", "kv_map(log2f, {x})")),
    Op("SQRT", "sqrt", "unary", np.sqrt, **_math("sqrtf({x})", "sqrt({x})", "kv_sqrt({x})")),
    Op("RSQRT", "rsqrt", "unary", lambda x: 1 / np.sqrt(x),
       **_math("(1.0f / sqrtf({x}))", "(1.0 / sqrt({x}))", "(kv_broadcast(1.0f) / kv_sqrt({x}))")),
    # a function, so the operand is written once (30 nested relus as ?: kept gcc busy for minutes)
    Op("RELU", "relu", "unary", lambda x: np.maximum(x, 0), c={"": "kk_relu_{ct}({x})"}, cv="kv_max(kv_zero(), {x})",
       helpers={"typed": "{q} {ct} kk_relu_{ct}({ct} x) {{ return x < 0 ? 0 : x; }}"},
       helper_cts=("float", "double", "int32_t", "int"), numeric=True),
    Op("ERF", "erf", "unary", erf, c_cpu="kumiko_erff({x})", **_math("erff({x})", "erf({x})", "kv_erf({x})")),
    Op("ADD", "add", "binary", lambda x, y: x + y, identity=0.0, absorbing=(INF, -INF), commutative=True,
       nan_propagates=True, **_infix("+")),
    Op("SUB", "sub", "binary", lambda x, y: x - y, identity=0.0, absorbing=(INF, -INF), anticommutative=True,
       nan_propagates=True, **_infix("-")),
    Op("MUL", "mul", "binary", lambda x, y: x * y, cv_mask="({a} & {b})", identity=1.0, absorbing=(0.0,),
       commutative=True, nan_propagates=True, **_infix("*")),
    Op("FDIV", "div", "binary", lambda x, y: x / y, identity=1.0, absorbing=(0.0,), nonzero_other=True,
       nan_propagates=True, float_only=True, **_infix("/")),
    Op("MAX", "max", "binary", np.maximum, **_minmax("max", ">", -INF, "({a} | {b})")),
    Op("MIN", "min", "binary", np.minimum, **_minmax("min", "<", INF, "({a} & {b})")),
    # x**n for a small integer constant n: a chain of multiplies written out (vectorisable in any loop, where
    # powf is a call per element and a loop over n's bits kept gcc from vectorising GPT-2's tanh-GELU epilogue)
    Op("POW", "pow", "binary", np.power, c={"float": "powf({a}, {b})", "": "pow({a}, {b})"},
       c_small_int=lambda a, n, one: _pow_chain(a, n, one), cv="kv_map2(powf, {a}, {b})", float_only=True,
       identity=1.0, absorbing=(1.0,)),
    Op("CMPLT", "lt", "compare", np.less, c=_infix("<")["c"], cv="({a} < {b})", cv_mask="(~{a} & {b})"),
    Op("CMPLE", "le", "compare", np.less_equal, c=_infix("<=")["c"], cv="({a} <= {b})", cv_mask="(~{a} | {b})"),
    Op("CMPEQ", "eq", "compare", np.equal, c=_infix("==")["c"], cv="({a} == {b})", cv_mask="({a} == {b})",
       commutative=True),
    Op("CMPNE", "ne", "compare", np.not_equal, c=_infix("!=")["c"], cv="({a} != {b})", cv_mask="({a} != {b})",
       commutative=True),
    Op("WHERE", "select", "select", np.where),
    Op("CAST", "cast", "cast", cast, flops=0),
)

#: elementwise ops by Tiny IR uop, and by region name
ELEMENTWISE: dict[str, Op] = {o.name: o for o in _OPS}
BY_FN: dict[str, Op] = {o.fn: o for o in _OPS}

REDUCE: dict[str, ReduceOp] = {r.name: r for r in (
    ReduceOp("SUM", "sum", np.sum, "ADD", 0.0, "MUL", c="{acc} + {v}", cv="{acc} + {v}", cv_h="kv_hsum({acc})"),
    ReduceOp("MAX", "max", np.max, "MAX", -INF, "ADD", cv="kv_max({acc}, {v})", cv_h="kv_hmax_nan({acc}, {nan})",
             nan_lanes=True),
    ReduceOp("MIN", "min", np.min, "MIN", INF, "ADD", cv="kv_min({acc}, {v})", cv_h="kv_hmin_nan({acc}, {nan})",
             nan_lanes=True),
)}
REDUCE_BY_FN: dict[str, ReduceOp] = {r.fn: r for r in REDUCE.values()}


def kind(uop: str) -> str | None:
    """The kind of a Tiny IR uop in the table (None: not an elementwise op)."""
    op = ELEMENTWISE.get(uop)
    return op.kind if op is not None else None


def fn_kind(fn: str) -> str | None:
    """The kind of a region op name (None: unknown)."""
    op = BY_FN.get(fn)
    return op.kind if op is not None else None


def register(op: Op) -> Op | None:
    """Add (or replace) an elementwise op; returns the entry it replaced. The Tiny IR accepts ``op.name``
    from then on (``tiny.ir.infer`` asks this table), and every stage spells it from the entry."""
    at = f"ops.register({op.name})"
    if op.kind not in ("unary", "binary", "compare"):
        raise KumikoError("E1010", at=at, why=f"only unary, binary and compare ops can be registered, not "
                          f"{op.kind!r}", suggestion="Give kind 'unary', 'binary' or 'compare'.")
    if "" not in op.c:
        raise KumikoError("E1010", at=at, why="the op has no C spelling for every compute type",
                          suggestion="Give c={'': '...'} (and per-type keys such as 'double' where they differ).")
    if op.fn in BY_FN and BY_FN[op.fn].name != op.name:
        raise KumikoError("E1016", at=at, why=f"region name {op.fn!r} already names {BY_FN[op.fn].name}")
    old = ELEMENTWISE.get(op.name)
    if old is not None:
        del BY_FN[old.fn]
    ELEMENTWISE[op.name] = BY_FN[op.fn] = op
    return old


def unregister(name: str, previous: Op | None = None) -> None:
    """Remove a registered op (or put ``previous``, what ``register`` returned, back)."""
    op = ELEMENTWISE.pop(name)
    BY_FN.pop(op.fn, None)
    if previous is not None:
        ELEMENTWISE[name] = BY_FN[previous.fn] = previous


@contextlib.contextmanager
def registered(op: Op) -> Iterator[Op]:
    """``op`` in the table for the duration of a ``with`` block (tests; a patched spelling)."""
    old = register(op)
    try:
        yield op
    finally:
        unregister(op.name, old)


def helpers(target: str, qualifier: str) -> str:
    """The helper definitions the spellings call, for a prelude: first each op's ``target``-specific ones
    (``"c"`` or ``"cuda"``), then the ``"typed"`` ones with ``qualifier``; ops whose typed helpers cover
    the same compute types are written together, type by type."""
    out = [o.helpers[target] for o in ELEMENTWISE.values() if target in o.helpers]
    groups: dict[tuple, list] = {}
    for o in ELEMENTWISE.values():
        if "typed" in o.helpers:
            groups.setdefault(o.helper_cts, []).append(o.helpers["typed"])
    for cts, texts in groups.items():
        out += [t.format(q=qualifier, ct=ct) for ct in cts for t in texts] if cts else \
            [t.replace("{q}", qualifier) for t in texts]
    return "\n".join(out) + "\n"


def finite_fold(op: Op, c: float, c_left: bool):
    """What ``c op x`` (``x op c`` when not ``c_left``) is for every finite ``x``, from the op's algebra:
    a float, ``OTHER`` (x itself), or None when it depends on x; ``(value, NONZERO)`` when it holds only for
    a nonzero x."""
    if math.isnan(c):
        return c if op.nan_propagates else None
    if c == op.identity and (op.commutative or not c_left):
        return OTHER
    if c_left or op.commutative:
        if c in op.absorbing:
            return (c, NONZERO) if op.nonzero_other else c
    elif op.anticommutative:
        v = finite_fold(op, c, True)
        return -v if isinstance(v, float) else None
    return None


OTHER = "other"
NONZERO = "nonzero"
