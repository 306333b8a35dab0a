"""Frontend -> Tiny IR lowering: every high-level op becomes the naive form (movement -> elementwise
-> REDUCE), exactly as the seeds spell it. This module holds what every lowering shares: the per-op
context (``Ctx``), the op registry (``OPS``, ``op``), the driver (``lower_graph``, ``lower_op``) and
the helpers (broadcasting, dtype agreement, literals, ``ew``). The ops register themselves from
``lower_ew`` (elementwise math, Cast), ``lower_move`` (reshape, permute, expand, pad, slice, flip,
concat) and ``lower_nn`` (contractions, pooling, normalisation and the rest, with ``lower_window``).

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
from kumiko.symbolic import prod
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.ir import TinyGraph

LOG2E = math.log2(math.e)


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



def one_input(ctx: Ctx, args: list) -> str:
    if len(args) != 1 or not isinstance(args[0], str):
        raise ctx.err("E1009", f"{ctx.node.op} takes one tensor input")
    return args[0]


# the elementwise and movement ops register themselves on import (the nn ops when ``lower_op`` first runs);
# ``UNARY_FNS`` is also read from here (tests/test_new_op.py)
from kumiko.frontend import lower_ew, lower_move  # noqa: E402,F401
from kumiko.frontend.lower_ew import UNARY_FNS  # noqa: E402,F401
