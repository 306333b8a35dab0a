"""ONNX import: ``from_onnx(model) -> Graph`` (extra ``[onnx]``).

An ONNX model becomes an ordinary frontend ``Graph``, so everything after the frontend (Tiny IR,
the evaluator, the backends) never hears of ONNX. The importer is deliberately all-or-nothing: an
op, dtype or attribute it cannot express is a ``KumikoError`` naming the ONNX node, the op and what
is missing, and no Graph is returned, so nothing half-imported can run.

This module holds the dtype mapping, the op registries (``CONVERTERS``, ``ATTRS``, ``FOLDERS``), shape
values and the ``Importer``, which walks the graph: folding what is known, converting the rest.
Reading the model (loading, opset conversion, nodes, attributes, tensors) is ``onnx_model``'s; the
converters are in ``onnx_ops`` (and the ``onnx_*`` modules it imports), the folders in ``onnx_fold``.

Rules (docs/onnx.md has the user-facing version):

* Initializers become ``param`` signature inputs (storage ``const_pool``) named after the
  initializer; their values ride along in ``Graph.params`` and executables fill them in.
* Models older than opset 13 are converted with onnx's version converter first.
* Everything kumiko needs to know statically -- Reshape's shape, Slice's starts/ends, Reduce axes,
  Pad pads, Expand shape, Unsqueeze axes, Clip bounds, ... -- must be known at import: constants,
  initializers, ``Shape`` and constant subgraphs over them are folded with numpy. ``Shape`` of a
  symbolic (``dim_param``) size is a *shape value*: an object array of ints and ``Expr``s (see
  ``shape_value``), so ``B, T, D = x.shape`` arithmetic folds to symbolic sizes that Reshape, Expand,
  Slice, ConstantOfShape and Range take as they are; a shape value used as run-time data is computed
  from the bound sizes (``Importer._shape_tensor``).
  ``static_inputs`` gives values for graph inputs that must be folded the same way (the node tests
  feed Reshape's shape as a graph input); such an input leaves the signature if nothing at run
  time still reads it.
* dtypes: FLOAT, FLOAT16, BFLOAT16, INT32, BOOL map to fp32, fp16, bf16, i32, bool. INT64 (ONNX's
  index and shape type) is narrowed to i32: constants are checked to fit (E1012 otherwise), int64
  graph inputs are declared i32 (executables narrow int64 arrays that fit). DOUBLE is fp64, computed
  in float64 as onnxruntime does; ``narrow_double=True`` narrows it to fp32 after import
  (``Graph.with_float_dtype("fp32", only="fp64")``: initializers checked to stay finite, DOUBLE graph
  inputs declared fp32 and listed in ``Graph.fp64_inputs`` so executables take float64 arrays for
  them). Everything else is E1012.
"""
from __future__ import annotations

import collections
import re
from typing import Any, Callable, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph, OpNode, SigInput, TensorType
from kumiko.frontend.onnx_model import (
    SOURCE_OPSET,
    OnnxNode,
    _check_arity,
    _decode_attrs,
    _default_opset,
    _symbol,
    load_model,
    tensor_array,
)
from kumiko.symbolic import Expr, dim
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.ir import FrozenDict
from kumiko.util import reachable

#: ONNX TensorProto elem types kumiko represents (INT64 narrowed to i32)
ONNX_DTYPES = {1: dtypes.fp32, 10: dtypes.fp16, 16: dtypes.bf16, 6: dtypes.i32, 7: dtypes.i32, 9: dtypes.bool_,
               11: dtypes.fp64}
NP_KUMIKO = {np.dtype(np.float32): dtypes.fp32, np.dtype(np.float16): dtypes.fp16, dtypes.bf16.np: dtypes.bf16,
             np.dtype(np.int32): dtypes.i32, np.dtype(np.int64): dtypes.i32, np.dtype(np.bool_): dtypes.bool_,
             np.dtype(np.float64): dtypes.fp64}
_I32 = np.iinfo(np.int32)

#: ONNX op type -> converter(importer, node) -> one kumiko tensor name (or constant array) per output
CONVERTERS: dict[str, Callable] = {}
#: ONNX op type -> the attributes its converter understands
ATTRS: dict[str, frozenset] = {}
#: ONNX op type -> folder(node, input arrays) -> output arrays (numpy; used when all inputs are known)
FOLDERS: dict[str, Callable] = {}


def onnx_dtype_name(t: int) -> str:
    import onnx
    try:
        return onnx.TensorProto.DataType.Name(t)
    except ValueError:
        return f"type {t}"


def kumiko_dtype(t: int, where: str) -> dtypes.DType:
    """The kumiko dtype for an ONNX elem type, or E1012 naming the ONNX type."""
    dt = ONNX_DTYPES.get(t)
    if dt is None:
        raise KumikoError("E1012", at=where, why=f"ONNX dtype {onnx_dtype_name(t)} is not supported",
                          suggestion="kumiko imports FLOAT, FLOAT16, BFLOAT16, INT32, INT64 (as i32), DOUBLE "
                                     "and BOOL")
    return dt


class SymbolicValue(ValueError):
    """A folder met a shape value it cannot evaluate at import (a comparison the sizes do not decide, a
    float cast, a symbolic index or bound): the node is then converted instead, its symbolic operands
    computed at run time, or -- for ops kumiko only folds -- refused naming the reason."""


def shape_value(arr) -> np.ndarray:
    """The canonical form of a value shape arithmetic produced: int64 when every element is an int (so
    all-static shape subgraphs stay plain numpy), else an object array of ints and ``Expr``s, constant
    expressions collapsed to ints. Keeping one array type lets the numpy folders (Gather, Concat,
    Reshape, Slice, Where, ...) move symbolic sizes around unchanged."""
    arr = np.asarray(arr)
    if arr.dtype != object:
        return arr
    flat = [dim(x) if isinstance(x, Expr) else x for x in arr.reshape(-1)]
    if flat and all(isinstance(x, (bool, np.bool_)) for x in flat):
        return arr.astype(bool)
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in flat):
        return np.asarray(flat, dtype=np.int64).reshape(arr.shape)
    if any(not isinstance(x, (int, np.integer, Expr)) or isinstance(x, bool) for x in flat):
        raise SymbolicValue("a shape value mixes sizes with non-integers")
    out = np.empty(len(flat), dtype=object)
    out[:] = [x if isinstance(x, Expr) else int(x) for x in flat]
    return out.reshape(arr.shape)


def is_symbolic(arr) -> bool:
    return isinstance(arr, np.ndarray) and arr.dtype == object


class Importer:
    """Walks the ONNX graph in order, folding what is known and emitting frontend ops for the rest.

    Emitted ops are lowered on a private TinyBuilder as they are made, so every converter sees the
    exact kumiko shape and dtype of its operands (Flatten, Squeeze, auto_pad and Expand need them).
    """

    def __init__(self, model, static_inputs: Mapping[str, Any] | None, name: str):
        from kumiko.frontend import lower_nn  # noqa: F401  (registers the nn lowerings)
        self.graph = model.graph
        self.opset = _default_opset(model)
        #: the opset the model was written for (older ones were converted to MIN_OPSET by load_model)
        self.source_opset = next((int(m.value) for m in model.metadata_props
                                  if m.key == SOURCE_OPSET and m.value.isdigit()), self.opset)
        self.static = {k: np.asarray(v) for k, v in (static_inputs or {}).items()}
        self.consts: dict[str, np.ndarray] = {}     # ONNX tensors known at import
        self.kt: dict[str, str] = {}                # ONNX tensor -> kumiko tensor (run-time values)
        self.producer: dict[str, OnnxNode] = {}
        self.b = TinyBuilder(name)
        self.env: dict[str, str] = {}               # kumiko tensor -> tiny id (incremental lowering)
        self.nodes: list[OpNode] = []
        self.sig: list[SigInput] = []
        self.types: dict[str, TensorType] = {}
        self.params: dict[str, np.ndarray] = {}
        self.cur: OnnxNode | None = None
        self.fresh: dict[str, int] = {}             # tensors the current node made -> index in self.nodes
        self.consumed: set[str] = set()
        self.taken: set[str] = set()
        self.onnx_names = {n for node in self.graph.node for n in (*node.input, *node.output)} | \
            {i.name for i in self.graph.input} | {o.name for o in self.graph.output} | \
            {t.name for t in self.graph.initializer}
        self.input_types: dict[str, Any] = {}
        self._uses: collections.Counter | None = None     # ``uses``: counted once, on the first question
        self.fold_why = ""                          # why the last fold of a shape value failed
        self.unfolded: dict[str, str] = {}          # outputs whose shape-value fold failed -> why

    def uses(self, name: str) -> int:
        """How many node inputs and graph outputs of the ONNX graph read tensor ``name``."""
        if self._uses is None:
            self._uses = collections.Counter(n for node in self.graph.node for n in node.input)
            self._uses.update(o.name for o in self.graph.output)
        return self._uses[name]

    # values ---------------------------------------------------------------------------------------
    def const(self, name: str, what: str, code: str = "E1011") -> np.ndarray:
        """The value of an ONNX tensor that must be known at import, folding its producers if need be.
        ``code`` is E1011 (shapes) where the value decides a shape -- a Reshape target, pads, axes: from
        tensor data that shape would be data-dependent -- and E1010 where it is a fixed setting of the op
        (Dropout's training_mode, Pad's value, Trilu's k) that kumiko cannot take at run time."""
        v = self._try_const(name, set())[0] if name else None
        cause = self._unfolded_cause(name) if v is None and name else None
        if cause:
            raise self.err("E1011", f"{what} ({name!r}) must be known at import time, but it rests on a value "
                           f"kumiko computes at run time: {cause}",
                           suggestion="give these axes fixed sizes (dim_value), or build the value from sizes with "
                                      "ops kumiko folds symbolically (docs/onnx.md, Folding)")
        if v is None and code != "E1011":
            raise self.err(code, f"{what} ({name!r}) must be known at import time: kumiko takes it as a fixed "
                           "setting of the op, but it is computed at run time",
                           suggestion="make it an initializer or a Constant (or pass its value with static_inputs)")
        if v is None:
            raise self.err("E1011", f"{what} ({name!r}) must be known at import time, but it is computed at run "
                           "time from tensor data (kumiko's shapes may be symbolic in the input sizes, not "
                           "data-dependent)",
                           suggestion="make it an initializer or a Constant, derive it from Shape, or pass its "
                                      "value with static_inputs")
        return v

    def _unfolded_cause(self, name: str) -> str | None:
        """Why a value upstream of ``name`` stayed a run-time value although it came from sizes (so the
        diagnostic names the comparison or cast that could not be folded, not "tensor data")."""
        seen, stack = set(), [name]
        while stack:
            t = stack.pop()
            if t in self.unfolded:
                return self.unfolded[t]
            if t in seen:
                continue
            seen.add(t)
            p = self.producer.get(t)
            stack.extend(i for i in (p.inputs if p else ()) if i)
        return None

    def _try_const(self, name: str, seen: set) -> tuple[np.ndarray | None, bool]:
        """(value or None, whether it rests on static_inputs). Only values that rest on true constants
        join ``consts`` (and so fold later nodes eagerly); the others serve the asking op alone, so a
        static input still feeds run-time uses as an input."""
        if name in self.consts:
            return self.consts[name], False
        if name in self.static:
            return self.static[name], True
        p = self.producer.get(name)
        if p is None or p.op_type not in FOLDERS or name in seen:
            return None, False
        seen.add(name)
        vals, static = [], False
        for i in p.inputs:
            v, st = self._try_const(i, seen) if i else (None, False)
            if i and v is None:
                return None, False
            vals.append(v)
            static |= st
        folded = self._fold(p, vals)
        if folded is None:
            return None, False
        outs = dict(zip(p.outputs, folded))
        if not static:
            for o, v in outs.items():
                if o:
                    self.consts.setdefault(o, v)
        return outs.get(name), static

    def _fold(self, node: OnnxNode, vals: list) -> list[np.ndarray] | None:
        """The node's outputs evaluated at import, or None when a shape value defeats its folder (the
        reason kept in ``fold_why``). A folder meeting an ``Expr`` where numpy needs a number fails
        with whatever numpy raises; with symbolic inputs that means "not foldable", not a bad model."""
        symbolic = any(is_symbolic(v) for v in vals)
        try:
            return [shape_value(v) for v in FOLDERS[node.op_type](node, vals)]
        except SymbolicValue as e:
            self.fold_why = str(e)
        except (TypeError, ValueError, ArithmeticError) as e:
            if not symbolic:
                raise
            self.fold_why = f"{type(e).__name__}: {e}"
        return None

    def tensor(self, name: str) -> str:
        """The kumiko tensor holding an ONNX tensor at run time (constants become params)."""
        if not name:
            raise self.err("E1009", "a required input is missing")
        if name in self.kt:
            k = self.kt[name]
        elif name in self.consts:
            k = self._param(name, self.consts[name])
        elif name in self.input_types:
            k = self._declare(name, self.input_types[name])
        else:
            raise self.err("E1007", f"input {name!r} is not defined before this node")
        self.consumed.add(k)
        return k

    def operand(self, name: str, runtime_rank: int) -> Any:
        """An elementwise operand: a size-1 constant that does not change the broadcast shape becomes a
        numeric literal (no param for ``x * 2``); anything else is a tensor."""
        c = self.consts.get(name)
        if c is not None and c.size == 1 and c.ndim <= runtime_rank and c.dtype in NP_KUMIKO:
            v = c.reshape(()).item()
            return v
        return self.tensor(name)

    def _param(self, name: str, arr: np.ndarray) -> str:
        if is_symbolic(arr):
            return self._shape_tensor(name, arr)
        dt = NP_KUMIKO.get(arr.dtype)
        where = self.cur.where() if self.cur else f"onnx initializer {name!r}"
        if dt is None:
            raise KumikoError("E1012", at=where, why=f"constant {name!r} has dtype {arr.dtype}, which kumiko "
                              "does not support", suggestion="use FLOAT, FLOAT16, BFLOAT16, INT32, INT64 or BOOL")
        if arr.dtype == np.int64 and arr.size and (arr.min() < _I32.min or arr.max() > _I32.max):
            raise KumikoError("E1012", at=where, why=f"int64 constant {name!r} holds values outside the i32 "
                              "range; kumiko narrows INT64 to i32")
        k = self.fresh_name(name)
        # no copy when the constant is already C-ordered in its dtype (an initializer: its own array, never
        # written; BERT-base's 440 MB of weights had been copied once more); ascontiguousarray makes 0-d 1-d
        self.params[k] = np.asarray(arr, dtype=dt.np, order="C")
        self.kt[name] = k
        return self._input(k, TensorType(dt, tuple(int(d) for d in arr.shape)), "param", "const_pool")

    def _shape_tensor(self, name: str, arr: np.ndarray) -> str:
        """A shape value read as run-time data (``x * T``, ``Cast(T, float)``, Range(T, 2T)): an i32 tensor
        whose symbolic elements are each the sum of ``e`` ones (a Reduce over an Expand to ``[e]``), so
        the value comes from the sizes the executable binds and the graph stays free of data-dependent
        shapes. A negative ``e`` at run time is a size error when the sizes are bound."""
        one = None
        parts = []
        for e in arr.reshape(-1):
            if isinstance(e, Expr):
                if one is None:
                    one = self._param(f"{name}::one", np.ones((1,), np.int32))
                ones = self.emit("Expand", [one], shape=[e])
                parts.append(self.emit("Reduce", [ones], fn="sum", axes=[0], keepdim=True))
            else:
                parts.append(self._param(f"{name}::{len(parts)}", np.array([e], np.int32)))
        y = parts[0] if len(parts) == 1 else self.emit("Concat", parts, axis=0)
        y = self.reshape(y, arr.shape)
        self.kt[name] = y
        return y

    def _declare(self, name: str, tt: TensorType) -> str:
        self.kt[name] = name
        self.taken.add(name)
        return self._input(name, tt, "data", None)

    def _input(self, k: str, tt: TensorType, role: str, storage: str | None) -> str:
        self.sig.append(SigInput(k, role, "immutable", storage))
        self.types[k] = tt
        self.env[k] = self.b.add("INPUT", tensor_id=k, dtype=tt.dtype.name, shape=tt.shape,
                                 **({"storage": storage} if storage else {}))
        return k

    def fresh_name(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken or (name != base and name in self.onnx_names) or name in self.types:
            k += 1
            name = f"{base}::{k}"
        self.taken.add(name)
        return name

    # types ----------------------------------------------------------------------------------------
    def shape(self, k: str) -> tuple:
        return self.b.shape(self.env[k])

    def dtype(self, k: str) -> dtypes.DType:
        return self.b.dtype(self.env[k])

    # emitting -------------------------------------------------------------------------------------
    def emit(self, op: str, inputs: list, **attrs: Any) -> str:
        """Append one frontend op (lowered at once, so its type is known) and return its tensor."""
        from kumiko.frontend.lower import lower_op
        base = (self.cur.outputs[0] if self.cur and self.cur.outputs and self.cur.outputs[0] else
                self.cur.name if self.cur else op.lower())
        out = self.fresh_name(f"{base}::{op.lower()}")
        attrs = {a: _freeze(v) for a, v in attrs.items() if v is not None}
        node = OpNode(op, self.fresh_name(f"{self.cur.name if self.cur else op}::{op.lower()}"),
                      tuple(inputs), (out,), FrozenDict(attrs))
        args = [self.env[x] if isinstance(x, str) else x for x in inputs]
        try:
            res = lower_op(self.b, node, args)
        except KumikoError as e:
            raise self.err(e.code, e.why, suggestion=e.suggestion, kumiko_op=f"{op} {dict(attrs)}") from None
        self.env[out] = res[0]
        self.consumed.update(x for x in inputs if isinstance(x, str))
        self.fresh[out] = len(self.nodes)
        self.nodes.append(node)
        return out

    def ew(self, fn: str, *xs: Any, **attrs: Any) -> str:
        return self.emit("Elementwise", list(xs), fn=fn, **attrs)

    def reshape(self, x: str, shape) -> str:
        return x if tuple(shape) == self.shape(x) else self.emit("Reshape", [x], shape=list(shape))

    def permute(self, x: str, perm) -> str:
        return x if list(perm) == list(range(len(perm))) else self.emit("Permute", [x], perm=list(perm))

    def cast(self, x: str, dt: dtypes.DType) -> str:
        return x if self.dtype(x) is dt else self.emit("Cast", [x], to=dt.name)

    def err(self, code: str, why: str, **kw) -> KumikoError:
        if self.cur is None:
            return KumikoError(code, at="onnx graph", why=why, **kw)
        return self.cur.err(code, why, **kw)

    # driver ---------------------------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.graph
        if g.sparse_initializer:
            raise KumikoError("E1012", at="onnx graph", why="sparse initializers are not supported")
        for t in g.initializer:
            self.consts[t.name] = tensor_array(t, f"onnx initializer {t.name!r}")
        for i in g.input:
            if i.name in self.consts:
                continue      # IR < 4 lists initializers as inputs too
            self.input_types[i.name] = self._value_type(i, f"onnx input {i.name!r}")
        for i in g.input:     # inputs not folded away keep their place (and order) in the signature
            if i.name in self.input_types and i.name not in self.static:
                self._declare(i.name, self.input_types[i.name])
        for k, proto in enumerate(g.node):
            self._convert(OnnxNode(proto, k, self.opset, _decode_attrs(proto)))
        self.cur = None
        outputs = [self._output(o.name) for o in g.output]
        return self._finish(outputs)

    def _value_type(self, vi, where: str) -> TensorType:
        t = vi.type
        if t.WhichOneof("value") != "tensor_type":
            raise KumikoError("E1012", at=where, why=f"only tensor values are supported, got {t.WhichOneof('value')}")
        dt = kumiko_dtype(t.tensor_type.elem_type, where)
        if not t.tensor_type.HasField("shape"):
            raise KumikoError("E1013", at=where, why="the input has no shape; kumiko needs its rank and sizes",
                              suggestion="give the input a shape (fixed sizes or dim_param names)")
        shape = []
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                shape.append(_symbol(d.dim_param))
            else:
                raise KumikoError("E1013", at=where, why="a dimension has neither a size nor a name",
                                  suggestion="give every input dimension a dim_value or a dim_param")
        return TensorType(dt, tuple(shape))

    def _convert(self, node: OnnxNode) -> None:
        self.cur = node
        self.fresh = {}
        self.consumed = set()
        p = node.proto
        if p.domain not in ("", "ai.onnx"):
            raise node.err("E1006", f"op {p.domain}.{node.op_type} is outside the default ONNX domain")
        for o in node.outputs:
            if o:
                self.producer[o] = node
        if node.op_type not in CONVERTERS:
            raise node.err("E1006", f"the ONNX importer does not support op {node.op_type!r}",
                           suggestion=f"supported ops: {', '.join(sorted(CONVERTERS))} (see docs/onnx.md)")
        unknown = sorted(set(node.attrs) - ATTRS.get(node.op_type, frozenset()))
        if unknown:
            raise node.err("E1010", f"{node.op_type} attribute{'s' * (len(unknown) > 1)} {', '.join(unknown)} "
                           f"{'are' if len(unknown) > 1 else 'is'} not supported",
                           suggestion="see docs/onnx.md for the attributes each op imports")
        _check_arity(node)
        known = [i for i in node.inputs if i]
        try:
            if node.op_type in FOLDERS and all(i in self.consts for i in known):
                outs = self._fold(node, [self.consts[i] if i else None for i in node.inputs])
                if outs is not None:
                    for o, v in zip(node.outputs, outs):
                        if o:
                            self.consts[o] = v
                    return
                self.unfolded.update({o: f"{node.where()}: {self.fold_why}" for o in node.outputs if o})
            res = CONVERTERS[node.op_type](self, node)
        except KumikoError:
            raise
        except SymbolicValue as e:
            raise node.err("E1011", f"{node.op_type} cannot be evaluated over symbolic sizes at import: {e}",
                           suggestion="give these axes fixed sizes (dim_value), or compute the value from "
                                      "sizes with Shape arithmetic kumiko folds (Gather, Concat, Add/Sub/Mul, Div "
                                      "by a constant)") from None
        except (IndexError, KeyError, ValueError, TypeError, ArithmeticError) as e:
            # a model the checks above let through but a converter cannot read (an input list or attribute of
            # a shape ONNX does not allow): the user's file is malformed, so a diagnostic, not a traceback
            raise node.err("E1009", f"the {node.op_type} node cannot be imported: {type(e).__name__}: {e}",
                           suggestion="check the node against the ONNX operator's definition "
                                      "(onnx.checker.check_model finds most such errors)") from None
        res = [res] if isinstance(res, (str, np.ndarray)) else list(res)
        for o, r in zip(node.outputs, res):
            if not o or r is None:
                continue
            if isinstance(r, np.ndarray):
                self.consts[o] = shape_value(r)
            else:
                self.kt[o] = self._rename(r, o)
        for k, o in enumerate(node.outputs):
            if o and o not in self.kt and o not in self.consts:
                raise node.err("E1010", f"output {k} ({o!r}) is not supported")

    def _rename(self, k: str, o: str) -> str:
        """Give a tensor this node made its ONNX name (so dumps and outputs read like the model)."""
        if k not in self.fresh or k in self.consumed or o in self.taken or o in self.types:
            return k
        i = self.fresh.pop(k)
        n = self.nodes[i]
        name = n.name
        if self.cur is not None and self.cur.name not in self.taken:
            name = self.cur.name
            self.taken.add(name)
        self.nodes[i] = OpNode(n.op, name, n.inputs, (o,), n.attrs)
        self.env[o] = self.env.pop(k)
        self.taken.add(o)
        return o

    def _output(self, name: str) -> str:
        if name in self.kt and self.kt[name] == name:
            return name
        if name not in self.kt and name in self.consts:
            return self._param(name, self.consts[name])
        if name not in self.kt and name in self.input_types:
            return self._declare(name, self.input_types[name])
        if name not in self.kt:
            raise KumikoError("E1013", at=f"onnx output {name!r}", why="the graph output is not produced")
        k = self.kt[name]        # an alias (Identity): a no-op reshape gives the output its own name
        node = OpNode("Reshape", self.fresh_name(f"{name}::identity"), (k,), (name,),
                      FrozenDict({"shape": tuple(self.shape(k))}))
        self.nodes.append(node)
        self.taken.add(name)
        self.env[name] = self.env[k]
        return name

    def _finish(self, outputs: list[str]) -> Graph:
        """Drop what only import-time folding needed, then build (and so re-validate) the Graph."""
        producer = {o: n for n in self.nodes for o in n.outputs}
        live = reachable(outputs, lambda t: [x for x in producer[t].inputs if isinstance(x, str)]
                         if t in producer else ())
        nodes = [n for n in self.nodes if n.outputs[0] in live]
        sig = [s for s in self.sig if s.tensor in live or (s.role == "data" and s.tensor not in self.static)]
        tensors = {s.tensor: self.types[s.tensor] for s in sig}
        params = {s.tensor: self.params[s.tensor] for s in sig if s.role == "param"}
        return Graph.make(sig, outputs, tensors, nodes, {}, self.b.name, params=params)


def _freeze(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def supported_ops() -> list[str]:
    """The ONNX op types the importer converts (sorted)."""
    from kumiko.frontend import onnx_ops  # noqa: F401
    return sorted(CONVERTERS)


def from_onnx(model, *, static_inputs: Mapping[str, Any] | None = None, name: str | None = None,
              narrow_double: bool = False) -> Graph:
    """Import an ONNX model (a path or an ``onnx.ModelProto``) as a frontend ``Graph``.

    ``graph.params`` holds the initializers (``kumiko.compile(graph)`` fills them in); pass the
    data inputs by their ONNX names. ``static_inputs`` maps graph-input names to values that the
    importer may fold where it needs a constant (a Reshape shape fed as an input, say). DOUBLE tensors
    compute in float64; ``narrow_double=True`` narrows them to fp32 instead (see the module docstring).
    """
    from kumiko.frontend import onnx_ops  # noqa: F401  (registers CONVERTERS and FOLDERS)
    model = load_model(model)
    name = name or re.sub(r"\W", "_", model.graph.name or "main") or "main"
    g = Importer(model, static_inputs, name).run()
    return g.with_float_dtype("fp32", only="fp64") if narrow_double else g
