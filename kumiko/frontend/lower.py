"""Frontend -> Tiny IR lowering: every high-level op becomes the naive form (movement -> elementwise
-> REDUCE), exactly as the seeds spell it. This module holds the driver, elementwise ops and
movement ops; ``lower_nn`` holds contractions, pooling, normalisation and the rest.

Lowering is also the frontend's shape and dtype inference: a node's output type is the type of the
Tiny value it lowers to. Errors a user is likely to make are checked here first with a message in
frontend terms; anything Tiny IR rejects later is re-attributed to the frontend op that caused it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import Expr, dim, dims, prod
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.ir import TinyGraph

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


@dataclass
class Ctx:
    """What one op's lowering sees: the builder, the op (for diagnostics) and its attributes."""
    b: TinyBuilder
    node: Any

    @property
    def attrs(self) -> Mapping:
        return self.node.attrs

    def err(self, code: str, why: str, **kw) -> KumikoError:
        return KumikoError(code, at=f"op {self.node.describe()}", why=why, **kw)

    def attr(self, key: str, default: Any = None, kind: type | tuple | None = None) -> Any:
        v = self.node.attrs.get(key, default)
        if kind is not None and v is not None and not isinstance(v, kind):
            want = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
            raise self.err("E1010", f"attribute {key!r} must be {want}, got {v!r}")
        return v

    def shape(self, x: str) -> tuple:
        return self.b.shape(x)

    def dtype(self, x: str) -> dtypes.DType:
        return self.b.dtype(x)

    def axis(self, a: Any, rank: int, what: str = "axis") -> int:
        if not isinstance(a, int) or isinstance(a, bool) or not -rank <= a < rank:
            raise self.err("E1010", f"{what} {a!r} is out of range for rank {rank}")
        return a % rank

    def axes(self, listed: Any, rank: int) -> tuple[int, ...]:
        """Distinct axes, sorted; naming an axis twice (``[1, 1]``, or ``[1, -1]`` for rank 2) is an
        error rather than silently the same as naming it once."""
        out = [self.axis(a, rank) for a in listed]
        if len(set(out)) != len(out):
            raise self.err("E1010", f"axes {list(listed)!r} name an axis more than once (rank {rank})")
        return tuple(sorted(out))

    def dtype_attr(self, key: str, default: dtypes.DType) -> dtypes.DType:
        v = self.node.attrs.get(key)
        if v is None:
            return default
        dt = dtypes.lookup(v)
        if dt is None or dt.name not in dtypes.USER:
            raise self.err("E1012", f"{key}={v!r} is not a supported dtype")
        return dt

    def acc_dtype(self, dt: dtypes.DType, default: dtypes.DType | None = None) -> dtypes.DType:
        """The ``acc_dtype`` attribute for a sum over ``dt`` values. An accumulator of another kind
        (integer for floats: every partial sum truncated; bool; float for integers: sums past 2**24
        rounded) or narrower than ``dt`` would compute a different answer than the op means, so it is
        refused rather than honoured."""
        acc = self.dtype_attr("acc_dtype", default or dtypes.default_acc(dt))
        if acc is not dt and (acc is dtypes.bool_ or acc.is_float != dt.is_float
                              or acc.itemsize <= dt.itemsize):
            want = dtypes.default_acc(dt).name
            raise self.err("E1010", f"acc_dtype={acc.name} is not an accumulator for {dt} values: it "
                           f"must be {dt} or a wider dtype of the same kind", suggestion=f"use acc_dtype={want!r}")
        return acc

    def number(self, key: str, default: Any = None, minimum: float | None = None,
               infinite: bool = False) -> Any:
        """A real-number attribute: bools, nan and (unless ``infinite``) inf are refused, as is a value
        below ``minimum``."""
        v = self.node.attrs.get(key, default)
        if v is None:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and \
            (infinite or isinstance(v, int) or math.isfinite(v)) and (minimum is None or v >= minimum)
        if not ok:
            what = "a number" if infinite else "a finite number"
            raise self.err("E1010", f"attribute {key!r} must be {what}"
                           f"{f' >= {minimum}' if minimum is not None else ''}, got {v!r}")
        return v


Lowering = Callable[[Ctx, list], "str | list[str]"]
OPS: dict[str, Lowering] = {}


def op(*names: str):
    def deco(fn: Lowering) -> Lowering:
        for n in names:
            OPS[n] = fn
        return fn
    return deco


# ------------------------------------------------------------------------------------------------
# driver

def lower_graph(inputs, outputs, tensors, nodes, symbols, name) -> tuple[dict, TinyGraph]:
    from kumiko.frontend.graph import TensorType
    b = TinyBuilder(name)
    env: dict[str, str] = {}
    table: dict[str, TensorType] = {}
    for i in inputs:
        t = tensors[i.tensor]
        env[i.tensor] = b.add("INPUT", tensor_id=i.tensor, dtype=t.dtype.name,
                              shape=t.shape, **({"storage": i.storage} if i.storage else {}))
        table[i.tensor] = t
    for n in nodes:
        ctx = Ctx(b, n)
        res = lower_op(b, n, [env[x] if isinstance(x, str) else x for x in n.inputs])
        if len(res) != len(n.outputs):
            raise ctx.err("E1009", f"{n.op} produces {len(res)} outputs, the op lists {len(n.outputs)}")
        for tname, tid in zip(n.outputs, res):
            env[tname] = tid
            got = TensorType(b.dtype(tid), b.shape(tid))
            want = tensors.get(tname)
            if want is not None and (want.dtype is not got.dtype or want.shape != got.shape):
                raise ctx.err("E1011", f"tensor {tname!r} is declared {want} but the op computes {got}")
            table[tname] = got
    tiny = b.finish([(i.tensor, env[i.tensor]) for i in inputs], [(o, env[o]) for o in outputs], symbols,
                    {"inputs": [i.to_json() for i in inputs], "outputs": [{"tensor": o} for o in outputs]})
    return table, tiny


OP_ALIASES = {"matmul": "MatMul", "gemm": "MatMul", "conv": "ConvND", "conv2d": "Conv2D"}


def lower_op(b: TinyBuilder, node: Any, args: list) -> list[str]:
    """Lower one frontend op onto ``b`` and return its Tiny ids (one per output).

    The one entry every frontend (JSON graphs, the Tensor API, the ONNX importer) types an op through,
    so an op's failure is the same diagnostic everywhere: a ``KumikoError`` located at the op, never a
    plain Python exception from a lowering that met an attribute of a kind no explicit check names."""
    from kumiko.frontend import lower_nn  # noqa: F401  (registers the nn ops)
    ctx = Ctx(b, node)
    key = node.op if node.op in OPS else OP_ALIASES.get(node.op.lower()) if isinstance(node.op, str) else None
    if key is None:
        raise ctx.err("E1006", f"unknown op {node.op!r}", suggestion=f"supported ops: {', '.join(sorted(OPS))}")
    try:
        res = OPS[key](ctx, args)
    except KumikoError as e:
        if e.at.startswith("op "):
            raise
        raise KumikoError(e.code, at=f"op {node.describe()}", why=e.why, suggestion=e.suggestion,
                          **{"tiny": e.at, **e.details}) from None
    except RecursionError:
        # only a pathological attribute (a size expression nested thousands deep) recurses here
        raise ctx.err("E1018", f"an attribute of {node.op} nests too deeply to evaluate") from None
    except (TypeError, ValueError, KeyError, IndexError, ArithmeticError, AttributeError, SyntaxError) as e:
        # an attribute or literal of a kind no check above names: still a diagnostic, never a traceback
        raise ctx.err("E1010", f"cannot lower {node.op} with these attributes/inputs "
                      f"({type(e).__name__}: {e})") from None
    return [res] if isinstance(res, str) else list(res)


# ------------------------------------------------------------------------------------------------
# shared helpers

def broadcast_shapes(ctx: Ctx, *shapes: tuple) -> tuple:
    """Right-aligned broadcast (E1001 when two sizes > 1 differ)."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        sizes = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        big = [d for d in sizes if d != 1]
        for d in big[1:]:
            if d != big[0]:
                raise ctx.err("E1001", f"cannot broadcast shapes {[[str(d) for d in s] for s in shapes]}: "
                              f"axis {k - rank} has sizes {big[0]} and {d}",
                              lhs_shape=list(shapes[0]), rhs_shape=list(shapes[-1]))
        out.append(big[0] if big else 1)
    return tuple(out)


def same_dtype(ctx: Ctx, xs: list) -> dtypes.DType | None:
    dts = {ctx.dtype(x) for x in xs if isinstance(x, str)}
    if len(dts) > 1:
        raise ctx.err("E1005", f"operand dtypes {sorted(d.name for d in dts)} differ and kumiko never casts "
                      "implicitly")
    return dts.pop() if dts else None


def ew(ctx: Ctx, uop: str, *xs: Any) -> str:
    """An elementwise Tiny op over broadcast operands; python scalars stay immediates."""
    refs = [x for x in xs if isinstance(x, str)]
    if not refs:
        raise ctx.err("E1009", f"{uop} needs at least one tensor operand")
    value_refs = refs if uop != "WHERE" else [x for x in xs[1:] if isinstance(x, str)]
    if value_refs:
        dt = same_dtype(ctx, value_refs)
        for v in (xs if uop != "WHERE" else xs[1:]):
            if not isinstance(v, str):
                literal(ctx, v, dt)
    shape = broadcast_shapes(ctx, *[ctx.shape(x) for x in refs])
    xs = tuple(ctx.b.broadcast_to(x, shape) if isinstance(x, str) else _imm(x) for x in xs)
    return ctx.b.add(uop, xs)


def _imm(x: Any) -> Any:
    if isinstance(x, bool) or isinstance(x, (int, float)):
        return x
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not a scalar: {x!r}")


def literal(ctx: Ctx, v: Any, dt: dtypes.DType) -> int | float | bool:
    """A numeric literal about to take its tensor sibling's dtype ``dt``. One that would change value
    doing so (a fraction, inf or nan for an integer dtype; an integer outside i32 or bool; an integer
    too large for any float) is refused: a diagnostic instead of a silently wrapped or truncated
    operand."""
    x = _imm(v) if isinstance(v, (bool, int, float, np.generic)) else None
    if not isinstance(x, (bool, int, float)):
        raise ctx.err("E1010", f"operand {v!r} is neither a tensor nor a number")
    if dt.is_float:
        if isinstance(x, int) and not isinstance(x, bool) and abs(x) > 2 ** 1023:
            raise ctx.err("E1012", f"the literal {x} is too large for {dt}", suggestion="use a float literal (inf)")
        return x
    if isinstance(x, float) and not x.is_integer():
        raise ctx.err("E1005", f"the literal {v!r} would be cast to {dt} implicitly and change value",
                      suggestion=f"Cast the {dt} operand to a float dtype first, or use an integral literal.")
    lo, hi = (0, 1) if dt is dtypes.bool_ else (int(np.iinfo(dt.np).min), int(np.iinfo(dt.np).max))
    if not lo <= x <= hi:
        raise ctx.err("E1012", f"the literal {v!r} does not fit {dt} ({lo}..{hi}) and would change value",
                      suggestion=f"use a literal in {dt}'s range, or cast the {dt} operand to a wider dtype first")
    return x


def to_compute(ctx: Ctx, x: str) -> tuple[str, dtypes.DType]:
    """Transcendentals on 16-bit floats run in fp32 (and are cast back by the caller)."""
    dt = ctx.dtype(x)
    if dt in (dtypes.fp16, dtypes.bf16):
        return ctx.b.cast(x, dtypes.fp32), dt
    return x, dt


def keepdim(ctx: Ctx, x: str, shape: tuple, axes: tuple) -> str:
    """Reshape a reduced value back to rank with size-1 axes, then expand to ``shape``."""
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return ctx.b.expand(ctx.b.reshape(x, kept), shape)


def count(ctx: Ctx, shape: tuple, axes: tuple, dt: dtypes.DType = dtypes.fp32) -> Any:
    """The number of elements over ``axes``: an int immediate, or a REDUCE of ones in ``dt`` (the dtype
    it divides) when symbolic."""
    n = prod([shape[a] for a in axes])
    if isinstance(n, int):
        return float(n)
    ones = ctx.b.const(1.0, dt, shape)
    return ctx.b.reduce(ones, "SUM", axes, dt)


# ------------------------------------------------------------------------------------------------
# elementwise

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


def one_input(ctx: Ctx, args: list) -> str:
    if len(args) != 1 or not isinstance(args[0], str):
        raise ctx.err("E1009", f"{ctx.node.op} takes one tensor input")
    return args[0]


# ------------------------------------------------------------------------------------------------
# movement

@op("Reshape")
def lower_reshape(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    shape = list(ctx.attr("shape", None, (list, tuple)) or [])
    src = ctx.shape(x)
    if sum(1 for d in shape if d == -1) > 1:
        raise ctx.err("E1010", "only one -1 is allowed in a reshape")
    if -1 in shape:
        known = prod([d for d in shape if d != -1])
        rest = Expr.lift(prod(src)).exact_div(known) if known != 0 else None
        if rest is None:
            raise ctx.err("E1002", f"cannot infer -1: {prod(src)} elements do not divide by {known}")
        shape[shape.index(-1)] = dim(rest)
    shape = dims(shape)
    if prod(shape) != prod(src):
        raise ctx.err("E1002", f"reshape {[str(d) for d in src]} -> {[str(d) for d in shape]} changes the element "
                      f"count ({prod(src)} vs {prod(shape)})")
    return ctx.b.reshape(x, shape)


@op("Permute", "Transpose")
def lower_permute(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    rank = len(ctx.shape(x))
    perm = ctx.attr("perm", None)
    perm = tuple(range(rank))[::-1] if perm is None else tuple(perm)
    if sorted(perm) != list(range(rank)):
        raise ctx.err("E1003", f"perm {list(perm)} is not a permutation of the {rank} axes")
    return ctx.b.permute(x, perm)


@op("Expand")
def lower_expand(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    want = list(ctx.attr("shape", None, (list, tuple)) or [])
    src = ctx.shape(x)
    if len(want) < len(src):
        raise ctx.err("E1001", f"cannot expand rank {len(src)} to rank {len(want)}")
    off = len(want) - len(src)
    want = [src[k - off] if d == -1 and k >= off else d for k, d in enumerate(want)]
    target = broadcast_shapes(ctx, src, dims(want))
    if target != dims(want):
        raise ctx.err("E1001", f"cannot expand {[str(d) for d in src]} to {want}")
    return ctx.b.broadcast_to(x, target)


@op("Pad")
def lower_pad(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    rank = len(ctx.shape(x))
    pads = ctx.attr("pads", None, (list, tuple))
    if pads is None or len(pads) != rank or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pads):
        raise ctx.err("E1010", f"Pad needs 'pads' as {rank} [lo, hi] pairs")
    value = ctx.attr("value", 0)
    pos = [(max(dim(lo), 0) if isinstance(dim(lo), int) else dim(lo),
            max(dim(hi), 0) if isinstance(dim(hi), int) else dim(hi)) for lo, hi in pads]
    x = ctx.b.pad(x, pos, value)
    shape = ctx.shape(x)
    lo = [-dim(a) if isinstance(dim(a), int) and dim(a) < 0 else 0 for a, _ in pads]
    hi = [d - (-dim(b) if isinstance(dim(b), int) and dim(b) < 0 else 0) for d, (_, b) in zip(shape, pads)]
    return ctx.b.shrink(x, lo, dims(hi))


@op("Slice", "Shrink")
def lower_slice(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    shape = ctx.shape(x)
    rank = len(shape)
    if ctx.node.op == "Shrink":
        bounds = ctx.attr("bounds", None, (list, tuple))
        if bounds is None or len(bounds) != rank or \
                not all(isinstance(b, (list, tuple)) and len(b) == 2 for b in bounds):
            raise ctx.err("E1010", f"Shrink needs 'bounds' as {rank} [lo, hi] pairs")
        for a, ((lo, hi), size) in enumerate(zip(bounds, shape)):
            # unlike Slice (Python semantics, clamped), Shrink's bounds are exact: 0 <= lo <= hi <= size
            if all(isinstance(v, int) for v in (lo, hi, size)) and not 0 <= lo <= hi <= size:
                raise ctx.err("E1010", f"Shrink bounds [{lo}, {hi}] on axis {a} are outside 0..{size} or reversed")
        starts, ends, axes, steps = [b[0] for b in bounds], [b[1] for b in bounds], list(range(rank)), [1] * rank
    else:
        starts = list(ctx.attr("starts", [], (list, tuple)))
        ends = list(ctx.attr("ends", [], (list, tuple)))
        axes = list(ctx.attr("axes", None) or range(len(starts)))
        steps = list(ctx.attr("steps", None) or [1] * len(starts))
        if not (len(starts) == len(ends) == len(axes) == len(steps)):
            raise ctx.err("E1010", "starts, ends, axes and steps must have the same length")
    lo, hi, step = [0] * rank, list(shape), [1] * rank
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = ctx.axis(a, rank)
        size = shape[a]
        if not isinstance(st, int) or st == 0:
            raise ctx.err("E1010", f"slice step must be a non-zero int, got {st!r}")
        if isinstance(size, int) and isinstance(s, int) and isinstance(e, int):
            r = range(*slice(s, e, st).indices(size))
            n = len(r)
            if st > 0:
                lo[a], hi[a], step[a] = (r.start, r.start + (n - 1) * st + 1, st) if n else (0, 0, 1)
            else:
                flips.append(a)
                first = size - 1 - r.start
                lo[a], hi[a], step[a] = (first, first + (n - 1) * -st + 1, -st) if n else (0, 0, 1)
        else:
            if st < 0:
                raise ctx.err("E1010", "negative slice steps need a concrete axis size")
            s = dim(Expr.lift(size) + s) if isinstance(s, int) and s < 0 else dim(s)
            if isinstance(e, int) and e >= 2 ** 31 - 1:   # INT_MAX-style "to the end" (ONNX, x[a:])
                e = size
            e = dim(Expr.lift(size) + e) if isinstance(e, int) and e < 0 else dim(e)
            lo[a], hi[a], step[a] = s, e, st
    x = ctx.b.flip(x, flips)
    return ctx.b.shrink(x, lo, hi, step)


@op("Flip")
def lower_flip(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    return ctx.b.flip(x, ctx.axes(ctx.attr("axes", [], (list, tuple)), len(ctx.shape(x))))


@op("Concat")
def lower_concat(ctx: Ctx, args: list) -> str:
    """Concatenation as tinygrad does it: pad every piece to the full extent, then add (OR for bool)."""
    if not args or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", "Concat takes one or more tensor inputs")
    same_dtype(ctx, args)
    rank = len(ctx.shape(args[0]))
    ax = ctx.axis(ctx.attr("axis", 0), rank)
    for a in args[1:]:
        s0, s1 = ctx.shape(args[0]), ctx.shape(a)
        if len(s1) != rank or any(p != q for k, (p, q) in enumerate(zip(s0, s1)) if k != ax):
            raise ctx.err("E1011", f"Concat pieces must agree except on axis {ax}: {[str(d) for d in s0]} vs "
                          f"{[str(d) for d in s1]}")
    if len(args) == 1:
        return args[0]
    total = dim(sum((Expr.lift(ctx.shape(a)[ax]) for a in args), Expr.lift(0)))
    offset: Any = 0
    out = None
    combine = "MAX" if ctx.dtype(args[0]) is dtypes.bool_ else "ADD"
    for a in args:
        size = ctx.shape(a)[ax]
        after = dim(Expr.lift(total) - offset - size)
        pads = [(0, 0)] * rank
        pads[ax] = (offset, after)
        p = ctx.b.pad(a, pads, False if combine == "MAX" else 0)
        out = p if out is None else ctx.b.add(combine, [out, p])
        offset = dim(Expr.lift(offset) + size)
    return out
