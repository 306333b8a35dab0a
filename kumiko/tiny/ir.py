"""Tiny IR (seed 002 rules it): a NodeId-only pure DAG of UOps.

Every node has an ``id``, a ``uop``, ``src`` (NodeIds or immediate scalars, order kept), an ``arg``
and an optional ``tag``; its result dtype and shape are inferred here and carried on the node so
later stages never re-derive them. Binary ops take operands of identical shape and dtype (EXPAND and
CAST are explicit); an immediate scalar in ``src`` takes the dtype of its sibling. ``REDUCE`` deletes
its axes and must name its accumulator dtype, which is also its result dtype.

Vocabulary beyond seed 002 §2, each because a frontend op needs it and the seed's "…" allows it:
``CONST`` (a scalar; shapes come from RESHAPE+EXPAND), ``LOG2``, ``SQRT``, ``ERF``, ``POW``,
``CMPLT/CMPLE/CMPEQ/CMPNE`` (comparisons, bool result) and ``GATHER`` (a data-dependent index:
the IndexBook marks it non_scop). There is no CONTRACT: contractions stay MUL -> REDUCE(SUM).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kumiko import dtypes, ops
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import Expr, dim, dim_json, parse_expr, prod

MOVEMENT = ("RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "VIEW")
UNARY = ("NEG", "EXP2", "LOG2", "SQRT", "RSQRT", "RELU", "ERF")
BINARY = ("ADD", "SUB", "MUL", "FDIV", "MAX", "MIN", "POW")
COMPARE = ("CMPLT", "CMPLE", "CMPEQ", "CMPNE")
OTHER = ("INPUT", "CONST", "CAST", "WHERE", "REDUCE", "GATHER")
UOPS = frozenset(MOVEMENT + UNARY + BINARY + COMPARE + OTHER)
REDUCE_OPS = ("SUM", "MAX", "MIN")
# what each elementwise and reduce op means is written once, in the op table (``kumiko.ops``); an op
# registered there (``ops.register``) is a uop too
assert set(UNARY + BINARY + COMPARE + ("WHERE", "CAST")) <= set(ops.ELEMENTWISE) and set(REDUCE_OPS) == set(ops.REDUCE)


def is_uop(uop: str) -> bool:
    return uop in UOPS or uop in ops.ELEMENTWISE


Immediate = (int, float, bool)


def is_ref(s: Any) -> bool:
    return isinstance(s, str)


class FrozenDict(dict):
    """A dict that refuses mutation and hashes by content (node args)."""

    def _ro(self, *a, **k):
        raise TypeError("Tiny IR args are immutable")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _ro  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))

    def __reduce__(self):
        # rebuilt from its items (pickle's default fills an empty dict item by item, which mutation refuses)
        return (type(self), (dict(self),))


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


@dataclass(frozen=True)
class Node:
    id: str
    uop: str
    src: tuple
    arg: FrozenDict
    dtype: dtypes.DType
    shape: tuple
    tag: str | None = None

    @functools.cached_property
    def refs(self) -> tuple[str, ...]:
        # (kept: region formation asks some 100,000 times for ResNet-50; a frozen node's srcs never change)
        return tuple(s for s in self.src if isinstance(s, str))


@dataclass(frozen=True)
class TinyGraph:
    """Nodes in topological order; ``inputs``/``outputs`` map signature tensor names to NodeIds."""
    nodes: Mapping[str, Node]
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    symbols: Mapping[str, int] = field(default_factory=dict)   # default sizes (for `kumiko run`)
    signature: Mapping[str, Any] = field(default_factory=dict)  # roles/mutability/storage, kept for the ABI
    name: str = "main"

    def __getitem__(self, nid: str) -> Node:
        return self.nodes[nid]

    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {nid: [] for nid in self.nodes}
        for n in self.nodes.values():
            for r in n.refs:
                out[r].append(n.id)
        return out

    def output_node(self, tensor: str) -> Node:
        return self.nodes[dict(self.outputs)[tensor]]


# ------------------------------------------------------------------------------------------------
# inference: the single source of truth for what a node's dtype and shape are

def _err(code: str, nid: str, uop: str, why: str, **kw) -> KumikoError:
    return KumikoError(code, at=f"tiny:{nid} ({uop})", why=why, **kw)


def _shape_str(shape: Iterable) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _norm_axes(axes, rank: int, nid: str, uop: str) -> tuple[int, ...]:
    out = []
    for a in axes:
        if not isinstance(a, int) or isinstance(a, bool) or not -rank <= a < rank:
            raise _err("E1010", nid, uop, f"axis {a!r} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise _err("E1010", nid, uop, f"axes {list(axes)} repeat an axis")
    return tuple(sorted(out))


def _is_imm(v: Any) -> bool:
    return isinstance(v, numbers.Real)   # python and numpy ints, floats and bools


def _sizes(nid: str, uop: str, shape: Iterable) -> tuple:
    """A result shape: sizes are ints >= 0 or symbolic expressions."""
    out = tuple(dim(d) for d in shape)
    if any(isinstance(d, int) and d < 0 for d in out):
        raise _err("E1010", nid, uop, f"shape {_shape_str(out)} has a negative size")
    return out


def infer(nid: str, uop: str, srcs: list, arg: Mapping) -> tuple[dtypes.DType, tuple]:
    """Return (dtype, shape) of a node; ``srcs`` holds Nodes for refs and raw scalars for immediates."""
    if not is_uop(uop):
        raise _err("E1006", nid, uop, f"'{uop}' is not a Tiny IR uop",
                   suggestion=f"use one of {sorted(UOPS | set(ops.ELEMENTWISE))}")
    nodes = [s for s in srcs if isinstance(s, Node)]
    op = ops.ELEMENTWISE.get(uop)
    arity = op.arity if op is not None else {"INPUT": 0, "CONST": 0, "GATHER": 2}.get(uop, 1)
    if len(srcs) != arity:
        raise _err("E1009", nid, uop, f"{uop} takes {arity} sources, got {len(srcs)}")
    if uop == "INPUT":
        if not isinstance(arg.get("tensor_id"), str):
            raise _err("E1009", nid, uop, "INPUT needs a 'tensor_id' naming its signature tensor")
        dt = dtypes.lookup(arg.get("dtype"))
        if dt is None or dt.name not in dtypes.USER:
            raise _err("E1012", nid, uop, f"input dtype {arg.get('dtype')!r} is not supported")
        return dt, _sizes(nid, uop, arg["shape"])
    if uop == "CONST":
        dt = dtypes.lookup(arg.get("dtype"))
        if dt is None:
            raise _err("E1012", nid, uop, f"const dtype {arg.get('dtype')!r} is not supported")
        if not _is_imm(arg.get("value")):
            raise _err("E1010", nid, uop, f"CONST needs a scalar 'value', got {arg.get('value')!r}")
        return dt, ()
    if op is not None and op.arity > 1:
        return _infer_elementwise(nid, uop, srcs)
    if any(not isinstance(s, Node) for s in srcs):
        raise _err("E1009", nid, uop, f"{uop} needs node sources, not immediates")
    x = nodes[0]
    if op is not None and op.kind == "unary":
        if not x.dtype.is_float and (not op.numeric or x.dtype is dtypes.bool_):
            raise _err("E1012", nid, uop, f"{uop} needs a {'numeric' if op.numeric else 'float'} "
                       f"operand, got {x.dtype}")
        return x.dtype, x.shape
    if uop == "CAST":
        to = dtypes.lookup(arg.get("to"))
        if to is None:
            raise _err("E1012", nid, uop, f"cast target {arg.get('to')!r} is not a dtype")
        return to, x.shape
    if uop == "REDUCE":
        if arg.get("op") not in REDUCE_OPS:
            raise _err("E1010", nid, uop, f"reduce op must be one of {REDUCE_OPS}, got {arg.get('op')!r}")
        if not arg.get("dtype"):
            raise _err("E1004", nid, uop, "REDUCE has no accumulator dtype")
        acc = dtypes.lookup(arg["dtype"])
        if acc is None:
            raise _err("E1012", nid, uop, f"accumulator dtype {arg['dtype']!r} is not a dtype")
        axes = _norm_axes(arg.get("axes", ()), len(x.shape), nid, uop)
        return acc, tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if uop == "GATHER":
        idx = nodes[1]
        axis = arg.get("axis")
        if not isinstance(axis, int) or not 0 <= axis < len(x.shape):
            raise _err("E1010", nid, uop, f"gather axis {axis!r} is out of range for rank {len(x.shape)}")
        if idx.dtype is not dtypes.i32:
            raise _err("E1012", nid, uop, f"gather index must be i32, got {idx.dtype}")
        if len(idx.shape) != len(x.shape) or any(
                a != b for i, (a, b) in enumerate(zip(idx.shape, x.shape)) if i != axis):
            raise _err("E1011", nid, uop, f"index shape {_shape_str(idx.shape)} must equal the input shape "
                       f"{_shape_str(x.shape)} except on axis {axis}")
        return x.dtype, idx.shape
    return x.dtype, _infer_movement(nid, uop, x, arg)


def _infer_elementwise(nid: str, uop: str, srcs: list) -> tuple[dtypes.DType, tuple]:
    nodes = [s for s in srcs if isinstance(s, Node)]
    if not nodes:
        raise _err("E1009", nid, uop, f"{uop} needs at least one node source")
    operands = nodes[1:] if uop == "WHERE" and isinstance(srcs[0], Node) else nodes
    if uop == "WHERE":
        if isinstance(srcs[0], Node) and srcs[0].dtype is not dtypes.bool_:
            raise _err("E1005", nid, uop, f"WHERE's condition must be bool, got {srcs[0].dtype}")
        operands = [s for s in srcs[1:] if isinstance(s, Node)]
    shape = nodes[0].shape
    for s in nodes[1:]:
        if s.shape != shape:
            raise _err("E1001", nid, uop, f"operand shapes {_shape_str(shape)} and {_shape_str(s.shape)} differ; "
                       "Tiny IR binary ops need identical shapes", lhs_shape=list(shape), rhs_shape=list(s.shape))
    if operands:
        dt = operands[0].dtype
        for s in operands[1:]:
            if s.dtype is not dt:
                raise _err("E1005", nid, uop, f"operand dtypes {dt} and {s.dtype} differ (no implicit casts)")
    else:
        raise _err("E1009", nid, uop, "WHERE needs at least one node among its value operands")
    op = ops.ELEMENTWISE[uop]
    if op.kind == "compare":
        return dtypes.bool_, shape
    if op.float_only and not dt.is_float:
        raise _err("E1012", nid, uop, f"{uop} needs float operands, got {dt}")
    return dt, shape


def _infer_movement(nid: str, uop: str, x: Node, arg: Mapping) -> tuple:
    rank = len(x.shape)
    if uop == "RESHAPE":
        new = _sizes(nid, uop, arg["result_shape"])
        if prod(new) != prod(x.shape):
            raise _err("E1002", nid, uop, f"reshape {_shape_str(x.shape)} -> {_shape_str(new)} changes the "
                       f"element count ({prod(x.shape)} vs {prod(new)})")
        return new
    if uop == "PERMUTE":
        perm = tuple(arg["perm"])
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in perm) or \
                sorted(perm) != list(range(rank)):
            raise _err("E1003", nid, uop, f"{list(perm)} is not a permutation of {list(range(rank))}")
        return tuple(x.shape[p] for p in perm)
    if uop == "EXPAND":
        new = _sizes(nid, uop, arg["result_shape"])
        if len(new) != rank:
            raise _err("E1001", nid, uop, f"EXPAND keeps the rank ({rank}); reshape first to add axes",
                       lhs_shape=list(x.shape), rhs_shape=list(new))
        for a, b in zip(x.shape, new):
            if a != b and a != 1:
                raise _err("E1001", nid, uop, f"cannot expand {_shape_str(x.shape)} to {_shape_str(new)}: "
                           "only size-1 axes broadcast", lhs_shape=list(x.shape), rhs_shape=list(new))
        return new
    if uop == "PAD":
        pads = arg["pad"]
        if len(pads) != rank:
            raise _err("E1010", nid, uop, f"pad has {len(pads)} pairs for rank {rank}")
        for lo, hi in pads:
            if any(isinstance(v, int) and v < 0 for v in (dim(lo), dim(hi))):
                raise _err("E1010", nid, uop, "negative padding; use SHRINK to cut")
        if not _is_imm(arg.get("value", 0)):
            raise _err("E1010", nid, uop, f"PAD needs a scalar 'value', got {arg.get('value')!r}")
        return tuple(dim(Expr.lift(d) + lo + hi) for d, (lo, hi) in zip(x.shape, pads))
    if uop == "SHRINK":
        lo, hi = arg["lo"], arg["hi"]
        step = arg.get("step") or [1] * rank
        if not (len(lo) == len(hi) == len(step) == rank):
            raise _err("E1010", nid, uop, f"lo/hi/step must have {rank} entries")
        out = []
        for d, a, b, s in zip(x.shape, lo, hi, step):
            a, b = dim(a), dim(b)
            if not isinstance(s, int) or s < 1:
                raise _err("E1010", nid, uop, f"step must be a positive int, got {s!r} (use FLIP for negative)")
            if isinstance(a, int) and isinstance(b, int) and not 0 <= a <= b:
                raise _err("E1010", nid, uop, f"range [{a}, {b}) is empty or negative")
            if isinstance(b, int) and isinstance(d, int) and b > d:
                raise _err("E1010", nid, uop, f"range [{a}, {b}) exceeds the axis size {d}")
            out.append(dim((Expr.lift(b) - a).ceildiv(s)))
        return tuple(out)
    if uop == "FLIP":
        _norm_axes(arg["axes"], rank, nid, uop)
        return x.shape
    if uop == "VIEW":
        new = _sizes(nid, uop, arg["result_shape"])
        imap = arg["index_map"]
        if len(imap) != rank:
            raise _err("E1010", nid, uop, f"index_map has {len(imap)} expressions for an input of rank {rank}")
        allowed = {f"i{k}" for k in range(len(new))}
        for e in imap:
            if not e.is_affine():
                raise _err("E1010", nid, uop, f"index expression {e} is not affine + floordiv")
            stray = {s for s in e.symbols() if s.startswith("i") and s[1:].isdigit()} - allowed
            if stray:
                raise _err("E1010", nid, uop, f"index expression {e} uses {sorted(stray)} beyond the result rank")
        return new
    raise AssertionError(uop)


# ------------------------------------------------------------------------------------------------
# JSON (seed 002 §1.1 node format, plus each node's inferred dtype and shape)

def _imm_json(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return {"const": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    return v


def imm_load(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"const"}:
        return float(v["const"])
    return v


def arg_to_json(uop: str, arg: Mapping) -> dict:
    out = {}
    for k, v in arg.items():
        if k in ("result_shape", "shape", "lo", "hi"):
            v = [dim_json(d) for d in v]
        elif k == "pad":
            v = [[dim_json(a), dim_json(b)] for a, b in v]
        elif k == "index_map":
            v = [str(e) for e in v]
        elif k == "value":
            v = _imm_json(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


def arg_from_json(uop: str, arg: Mapping, shape_of_src: tuple | None = None) -> FrozenDict:
    """Parse a JSON arg into canonical form (dims as ints/Exprs, index maps as Exprs, tuples)."""
    out: dict = {}
    for k, v in dict(arg or {}).items():
        if k in ("result_shape", "shape", "lo", "hi"):
            v = tuple(dim(d) for d in v)
        elif k == "pad":
            v = tuple((dim(a), dim(b)) for a, b in v)
        elif k == "index_map":
            v = tuple(parse_expr(e) if isinstance(e, str) else Expr.lift(e) for e in v)
        elif k == "value":
            v = imm_load(v)
        elif k == "axes" and uop == "REDUCE" and shape_of_src is not None:
            v = tuple(_axis_by_name(a, shape_of_src) for a in v)
        elif isinstance(v, list):
            v = tuple(v)
        out[k] = v
    if uop == "EXPAND" and shape_of_src is not None and "result_shape" in out:
        out.setdefault("broadcast_dimensions", tuple(
            i for i, (a, b) in enumerate(zip(shape_of_src, out["result_shape"])) if a == b))
    return FrozenDict(out)


def _axis_by_name(a: Any, shape: tuple) -> Any:
    """Seed 002 writes reduce axes by size symbol (``"K"``); map a name that names one axis to its index."""
    if isinstance(a, int):
        return a
    hits = [i for i, d in enumerate(shape) if isinstance(d, Expr) and d == a]
    return hits[0] if len(hits) == 1 else a


def node_to_json(n: Node) -> dict:
    d: dict = {"id": n.id, "uop": n.uop}
    if n.src:
        d["src"] = [_imm_json(s) for s in n.src]
    if n.arg:
        d["arg"] = arg_to_json(n.uop, n.arg)
    d["dtype"] = n.dtype.name
    d["shape"] = [dim_json(x) for x in n.shape]
    if n.tag:
        d["tag"] = n.tag
    return d


def to_json(g: TinyGraph) -> dict:
    return {
        "kumiko": "tiny", "version": 1, "name": g.name,
        "symbols": dict(g.symbols),
        "signature": g.signature,
        "inputs": [{"tensor": t, "node": n} for t, n in g.inputs],
        "outputs": [{"tensor": t, "node": n} for t, n in g.outputs],
        "uops": [node_to_json(n) for n in g.nodes.values()],
    }
