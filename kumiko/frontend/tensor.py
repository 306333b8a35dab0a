"""A tinygrad-style lazy ``Tensor`` that records frontend ops and builds the same ``Graph``.

    x = Tensor.input("x", ("M", 64), "fp32")          # symbolic dims allowed
    w = Tensor(np.random.randn(64, 32).astype(np.float32), name="w", role="param")
    y = (x @ w + b).relu()
    g = y.graph("y")                                  # a validated kumiko Graph
    kumiko.compile(g)(x=..., w=..., b=...)

Each op's result type is inferred the moment it is recorded by lowering that single op (the same
code the Graph uses), so shape errors surface at the line that caused them. ``.numpy()`` runs the
graph on the tensors' bound data.

Every misuse is a ``KumikoError`` with a code, never a plain ValueError/TypeError/IndexError: an
operand that is neither a Tensor nor a number, an axis or index out of range (E1010), a dtype kumiko
lacks (E1012), two inputs with one name (E1016). Data arrays take kumiko dtypes as they are; numpy's
defaults are narrowed as tinygrad does: float64 to fp32 and int64 to i32, checked to keep every
value (E1012 otherwise). Other numpy dtypes (uint8, int8, int16, complex, ...) are E1012.
"""
from __future__ import annotations

import itertools
import operator
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph, OpNode, SigInput, TensorType, check_sig_input
from kumiko.frontend.lower import lower_op
from kumiko.symbolic import Expr, dim, dim_json
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.ir import FrozenDict

_ids = itertools.count()


def _infer(op: str, inputs: Sequence[Any], attrs: Mapping) -> TensorType:
    b = TinyBuilder()
    args = [b.add("INPUT", tensor_id=f"in{k}", dtype=x.dtype.name, shape=x.shape) if isinstance(x, Tensor) else x
            for k, x in enumerate(inputs)]
    node = OpNode(op, f"{op.lower()}", tuple(x.name if isinstance(x, Tensor) else x for x in inputs), ("out",),
                  FrozenDict({k: _freeze(v) for k, v in attrs.items()}))
    res = lower_op(b, node, args)[0]
    return TensorType(b.dtype(res), b.shape(res))


def _err(code: str, at: str, why: str, **kw: Any) -> KumikoError:
    return KumikoError(code, at=f"Tensor.{at}", why=why, **kw)


#: numpy's default dtypes, narrowed to kumiko's when no dtype is given (tinygrad's defaults)
_NARROW = {np.dtype(np.float64): dtypes.fp32, np.dtype(np.int64): dtypes.i32}


def _dtype_arg(dtype: Any, at: str) -> dtypes.DType:
    dt = dtypes.lookup(dtype) if isinstance(dtype, (str, dtypes.DType)) else None
    if dt is None and dtype is not None and not isinstance(dtype, (str, dtypes.DType)):
        try:
            dt = dtypes.from_numpy(np.dtype(dtype))
        except TypeError:
            dt = None
    if dt is None or dt.name not in dtypes.USER:
        raise _err("E1012", at, f"dtype {dtype!r} is not one kumiko computes in", suggestion=f"use one of "
                   f"{', '.join(dtypes.USER)}")
    return dt


def _data_arg(data: Any, dtype: Any) -> tuple[np.ndarray, dtypes.DType]:
    """The array a data leaf holds and its dtype; narrowing (float64 -> fp32, int64 -> i32) must keep
    every value: an int64 outside i32 or a finite float64 beyond fp32 is E1012, not a wrapped value."""
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise _err("E1010", "__init__", f"data is not an array: {e}") from None
    if dtype is not None:
        dt = _dtype_arg(dtype, "__init__")
    else:
        dt = _NARROW.get(arr.dtype) or dtypes.from_numpy(arr.dtype)
        if dt is None or dt.name not in dtypes.USER:
            raise _err("E1012", "__init__", f"numpy dtype {arr.dtype} is not one kumiko computes in",
                       suggestion=f"convert the array to one of {', '.join(dtypes.USER)} (float32, int32, ...)")
    known = arr.dtype.kind in "biuf" or dtypes.from_numpy(arr.dtype) is not None     # (bf16's kind is 'V')
    if not known or (arr.dtype.kind in "iu" and dt.is_int and arr.size
                     and not np.iinfo(dt.np).min <= arr.min() <= arr.max() <= np.iinfo(dt.np).max):
        raise _err("E1012", "__init__", f"data of dtype {arr.dtype} does not fit {dt} without changing values")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dt.np)
    if arr.dtype.kind == "f" and dt.is_float and (np.isinf(out) & np.isfinite(arr)).any():
        raise _err("E1012", "__init__", f"finite {arr.dtype} data overflows {dt}")
    return out, dt


def _shape_arg(shape: Any, at: str, wildcard: bool = False) -> list:
    """Sizes given to the Tensor API: ints >= 0 (or -1 where ``wildcard``), size names or expressions."""
    if not isinstance(shape, (list, tuple)):
        raise _err("E1010", at, f"a shape is a list or tuple of sizes, got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, (np.integer,)):
            d = int(d)
        if isinstance(d, int) and not isinstance(d, bool):
            if d < 0 and not (wildcard and d == -1):
                raise _err("E1010", at, f"shape {list(shape)!r} has the negative size {d}")
            out.append(d)
            continue
        if not isinstance(d, (str, Expr)) or (isinstance(d, str) and len(d) > 1000):
            raise _err("E1010", at, f"shape {list(shape)!r}: a size is an int, a size name or an expression, "
                       f"got {d!r}")
        try:
            out.append(dim(d))
        except (SyntaxError, TypeError, ValueError, RecursionError) as e:
            raise _err("E1010", at, f"shape {list(shape)!r}: cannot read the size {d!r} ({e})") from None
    return out


def _axis_arg(a: Any, rank: int, at: str) -> int:
    """An axis in ``-rank..rank-1`` (numpy ints accepted), as a non-negative int."""
    if isinstance(a, np.integer):
        a = int(a)
    if not isinstance(a, int) or isinstance(a, bool) or not -rank <= a < rank:
        raise _err("E1010", at, f"axis {a!r} is out of range for rank {rank}")
    return a % rank


def _operand(x: Any) -> Any:
    """An op's input: a Tensor, a numpy array (a data leaf) or a real number (an immediate)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor(x)
    if isinstance(x, np.generic) and x.dtype.kind in "biuf":
        return x.item()
    if isinstance(x, (bool, int, float)):
        return x
    raise _err("E1010", "op", f"operand {x!r} is neither a Tensor nor a number",
               suggestion="use a Tensor, a numpy array or a Python number")


class Tensor:
    """A lazy tensor. Leaves are graph inputs (optionally holding data); others are recorded ops."""

    __slots__ = ("op", "srcs", "attrs", "type", "name", "data", "role", "storage")
    __array_priority__ = 100  # make numpy defer to our reflected operators

    def __init__(self, data: Any = None, *, name: str | None = None, shape: Iterable | None = None,
                 dtype: str | dtypes.DType | None = None, role: str = "data", storage: str | None = None):
        self.op: str | None = None
        self.srcs: tuple = ()
        self.attrs: dict = {}
        self.role, self.storage = role, storage
        if name is not None and (not isinstance(name, str) or not name):
            raise _err("E1013", "__init__", f"a tensor's name must be a non-empty string, got {name!r}")
        self.name = name or f"x{next(_ids)}"
        check_sig_input(SigInput(self.name, role, "immutable", storage), f"Tensor {self.name!r}")
        if data is not None:
            self.data, dt = _data_arg(data, dtype)
            self.type = TensorType(dt, tuple(self.data.shape))
        else:
            if shape is None:
                raise _err("E1010", "__init__", "a Tensor needs data or a shape")
            self.data = None
            self.type = TensorType(_dtype_arg(dtype or "fp32", "input"), tuple(_shape_arg(shape, "input")))

    @staticmethod
    def input(name: str, shape: Iterable, dtype: str | dtypes.DType = "fp32", role: str = "data",
              storage: str | None = None) -> "Tensor":
        return Tensor(name=name, shape=shape, dtype=dtype, role=role, storage=storage)

    @staticmethod
    def _record(op: str, srcs: Sequence[Any], **attrs: Any) -> "Tensor":
        attrs = {k: v for k, v in attrs.items() if v is not None}
        # a numpy array operand (``arr @ t``, ``arr + t``) becomes a data leaf, not an immediate
        srcs = tuple(_operand(s) for s in srcs)
        t = Tensor.__new__(Tensor)
        t.op, t.srcs, t.attrs = op, tuple(srcs), attrs
        t.type = _infer(op, srcs, attrs)
        t.name, t.data, t.role, t.storage = f"t{next(_ids)}", None, "data", None
        return t

    # properties -----------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def dtype(self) -> dtypes.DType:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        what = self.op or ("input" if self.data is None else "data")
        return f"<Tensor {self.name} {self.type} ({what})>"

    # elementwise ----------------------------------------------------------------------------------
    def _ew(self, fn: str, *others: Any, **attrs: Any) -> "Tensor":
        return Tensor._record("Elementwise", (self, *others), fn=fn, **attrs)

    def __add__(self, o): return self._ew("add", o)
    def __radd__(self, o): return Tensor._record("Elementwise", (o, self), fn="add")
    def __sub__(self, o): return self._ew("sub", o)
    def __rsub__(self, o): return Tensor._record("Elementwise", (o, self), fn="sub")
    def __mul__(self, o): return self._ew("mul", o)
    def __rmul__(self, o): return Tensor._record("Elementwise", (o, self), fn="mul")
    def __truediv__(self, o): return self._ew("div", o)
    def __rtruediv__(self, o): return Tensor._record("Elementwise", (o, self), fn="div")
    def __pow__(self, o): return self._ew("pow", o)
    def __neg__(self): return self._ew("neg")
    def __lt__(self, o): return self._ew("lt", o)
    def __le__(self, o): return self._ew("le", o)
    def __gt__(self, o): return self._ew("gt", o)
    def __ge__(self, o): return self._ew("ge", o)
    def __matmul__(self, o): return self.matmul(o)
    def __rmatmul__(self, o): return Tensor._record("MatMul", (o, self))

    def eq(self, o): return self._ew("eq", o)
    def ne(self, o): return self._ew("ne", o)
    def maximum(self, o): return self._ew("max", o)
    def minimum(self, o): return self._ew("min", o)
    def pow(self, o): return self._ew("pow", o)
    def neg(self): return self._ew("neg")
    def relu(self): return self._ew("relu")
    def exp(self): return self._ew("exp")
    def exp2(self): return self._ew("exp2")
    def log(self): return self._ew("log")
    def log2(self): return self._ew("log2")
    def sqrt(self): return self._ew("sqrt")
    def rsqrt(self): return self._ew("rsqrt")
    def reciprocal(self): return self._ew("recip")
    def sigmoid(self): return self._ew("sigmoid")
    def silu(self): return self._ew("silu")
    def tanh(self): return self._ew("tanh")
    def erf(self): return self._ew("erf")
    def abs(self): return self._ew("abs")
    def gelu(self, approximate: str = "none"): return self._ew("gelu", approximate=approximate)
    def leaky_relu(self, alpha: float = 0.01): return self._ew("leaky_relu", alpha=alpha)
    def clip(self, min_=None, max_=None): return self._ew("clip", min=min_, max=max_)

    def where(self, a: Any, b: Any) -> "Tensor":
        """``self`` is a bool condition: ``cond.where(a, b)`` (tinygrad's spelling)."""
        return Tensor._record("Elementwise", (self, a, b), fn="where")

    def cast(self, dtype: str | dtypes.DType) -> "Tensor":
        return self._ew("cast", to=_dtype_arg(dtype, "cast").name)

    def float(self): return self.cast("fp32")
    def half(self): return self.cast("fp16")

    # contractions and nn --------------------------------------------------------------------------
    def matmul(self, w: "Tensor", acc_dtype: str | None = None) -> "Tensor":
        return Tensor._record("MatMul", (self, w), acc_dtype=acc_dtype)

    dot = matmul

    def conv2d(self, weight: "Tensor", bias: "Tensor | None" = None, stride=1, padding=0, dilation=1,
               groups: int = 1) -> "Tensor":
        srcs = (self, weight) if bias is None else (self, weight, bias)
        return Tensor._record("Conv2D", srcs, stride=_lst(stride), padding=_lst(padding),
                              dilation=_lst(dilation), groups=groups)

    def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode=False) -> "Tensor":
        return Tensor._record("MaxPool", (self,), kernel=_lst(kernel_size), stride=_lst(stride),
                              padding=_lst(padding), dilation=_lst(dilation), ceil_mode=ceil_mode)

    def avg_pool2d(self, kernel_size=2, stride=None, padding=0, ceil_mode=False,
                   count_include_pad=True) -> "Tensor":
        return Tensor._record("AvgPool", (self,), kernel=_lst(kernel_size), stride=_lst(stride),
                              padding=_lst(padding), ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    def softmax(self, axis: int = -1) -> "Tensor":
        return Tensor._record("Softmax", (self,), axis=axis)

    def log_softmax(self, axis: int = -1) -> "Tensor":
        return Tensor._record("LogSoftmax", (self,), axis=axis)

    def layernorm(self, axis: int = -1, eps: float = 1e-5, weight: "Tensor | None" = None,
                  bias: "Tensor | None" = None) -> "Tensor":
        srcs = tuple(x for x in (self, weight, bias) if x is not None)
        if bias is not None and weight is None:
            raise _err("E1010", "layernorm", "a bias needs a weight (pass weight=ones to shift only)")
        return Tensor._record("LayerNorm", srcs, axis=axis, eps=eps)

    def scaled_dot_product_attention(self, key: "Tensor", value: "Tensor", attn_mask: "Tensor | None" = None,
                                     is_causal: bool = False, scale: float | None = None) -> "Tensor":
        srcs = (self, key, value) if attn_mask is None else (self, key, value, attn_mask)
        return Tensor._record("Attention", srcs, causal=is_causal, scale=scale)

    # reductions -----------------------------------------------------------------------------------
    def _reduce(self, fn: str, axis, keepdim: bool) -> "Tensor":
        axes = None if axis is None else (list(axis) if isinstance(axis, (list, tuple)) else [axis])
        return Tensor._record("Reduce", (self,), fn=fn, axes=axes, keepdim=keepdim)

    def sum(self, axis=None, keepdim: bool = False): return self._reduce("sum", axis, keepdim)
    def max(self, axis=None, keepdim: bool = False): return self._reduce("max", axis, keepdim)
    def min(self, axis=None, keepdim: bool = False): return self._reduce("min", axis, keepdim)
    def mean(self, axis=None, keepdim: bool = False): return self._reduce("mean", axis, keepdim)

    def cumsum(self, axis: int = 0, exclusive: bool = False, reverse: bool = False) -> "Tensor":
        return Tensor._record("CumSum", (self,), axis=axis, exclusive=exclusive, reverse=reverse)

    def gather(self, dim_: int, index: "Tensor") -> "Tensor":
        """torch.gather: ``out[i][j] = self[i][index[i][j]]`` along ``dim_``."""
        return Tensor._record("Gather", (self, index), axis=dim_, mode="elements")

    def take(self, index: "Tensor", axis: int = 0) -> "Tensor":
        return Tensor._record("Gather", (self, index), axis=axis, mode="take")

    # movement -------------------------------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
        return Tensor._record("Reshape", (self,), shape=[dim_json(d) for d in _shape_arg(shape, "reshape", True)])

    def permute(self, *order) -> "Tensor":
        order = order[0] if len(order) == 1 and isinstance(order[0], (list, tuple)) else order
        return Tensor._record("Permute", (self,), perm=list(order))

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        a, b = _axis_arg(a, self.ndim, "transpose"), _axis_arg(b, self.ndim, "transpose")
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    def expand(self, *shape) -> "Tensor":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
        return Tensor._record("Expand", (self,), shape=[dim_json(d) for d in _shape_arg(shape, "expand", True)])

    def pad(self, pads: Sequence[Sequence[int]], value: float = 0.0) -> "Tensor":
        return Tensor._record("Pad", (self,), pads=_pairs(pads, "pad"), value=value)

    def shrink(self, bounds: Sequence[Sequence[int]]) -> "Tensor":
        return Tensor._record("Shrink", (self,), bounds=_pairs(bounds, "shrink"))

    def flip(self, axes) -> "Tensor":
        return Tensor._record("Flip", (self,), axes=list(axes) if isinstance(axes, (list, tuple)) else [axes])

    def flatten(self, start: int = 0) -> "Tensor":
        start = _axis_arg(start, max(self.ndim, 1), "flatten")
        return self.reshape(*self.shape[:start], -1)

    def unsqueeze(self, axis: int) -> "Tensor":
        axis = _axis_arg(axis, self.ndim + 1, "unsqueeze")
        return self.reshape(*self.shape[:axis], 1, *self.shape[axis:])

    def squeeze(self, axis: int | None = None) -> "Tensor":
        """Drop size-1 axes (all, or ``axis`` if it has size 1; another size is kept, as in PyTorch)."""
        axis = None if axis is None else _axis_arg(axis, self.ndim, "squeeze")
        keep = [d for k, d in enumerate(self.shape) if not (d == 1 and (axis is None or k == axis))]
        return self.reshape(*keep)

    def cat(self, *others: "Tensor", dim: int = 0) -> "Tensor":  # noqa: A002 (tinygrad's name)
        return Tensor._record("Concat", (self, *others), axis=dim)

    def __getitem__(self, idx) -> "Tensor":
        """Basic indexing: ints, slices (any step) and ``...``; ints drop their axis."""
        idx = tuple(_index(i) for i in (idx if isinstance(idx, tuple) else (idx,)))
        if sum(i is Ellipsis for i in idx) > 1:
            raise _err("E1010", "__getitem__", "an index may hold one '...' only")
        if Ellipsis in idx:
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (self.ndim - len(idx) + 1) + idx[k + 1:]
        idx = idx + (slice(None),) * (self.ndim - len(idx))
        if len(idx) != self.ndim:
            raise _err("E1010", "__getitem__", f"too many indices for a rank-{self.ndim} tensor")
        starts, ends, axes, steps, drop = [], [], [], [], []
        for k, (i, size) in enumerate(zip(idx, self.shape)):
            if isinstance(i, int):
                if isinstance(size, int) and not -size <= i < size:
                    raise _err("E1010", "__getitem__", f"index {i} is out of range for axis {k} of size {size}")
                i = i % size if isinstance(size, int) else i
                end = size if i == -1 else i + 1   # x[-1] on a symbolic axis ends at the axis end, not at 0
                starts.append(i), ends.append(end), axes.append(k), steps.append(1), drop.append(k)
            elif isinstance(i, slice):
                if i == slice(None):
                    continue
                st = 1 if i.step is None else i.step
                big = 2 ** 31 - 1
                start = i.start if i.start is not None else (0 if st > 0 else big)
                end = i.stop if i.stop is not None else (big if st > 0 else -big)
                if not isinstance(size, int):
                    end = size if i.stop is None else end
                starts.append(start), ends.append(end), axes.append(k), steps.append(st)
        out = self if not axes else Tensor._record("Slice", (self,), starts=starts, ends=[dim_json(e) for e in ends],
                                                   axes=axes, steps=steps)
        if drop:
            out = out.reshape(*[d for k, d in enumerate(out.shape) if k not in drop])
        return out

    # graphs and execution -------------------------------------------------------------------------
    def graph(self, *names: str, outputs: Mapping[str, "Tensor"] | None = None, name: str = "main",
              symbols: Mapping[str, int] | None = None) -> Graph:
        """The Graph that computes this tensor (named ``names[0]``, default ``out``) and any ``outputs``."""
        if not isinstance(outputs or {}, Mapping) or not all(isinstance(n, str) and n for n in names) or \
                not isinstance(name, str):
            raise _err("E1013", "graph", "output names and the graph's name are strings; outputs= maps names to "
                       "Tensors")
        outs = dict(outputs or {})
        if names or not any(t is self for t in outs.values()):     # already among outputs=: not named twice
            outs = {(names[0] if names else "out"): self, **outs}
        return build_graph(outs, name=name, symbols=symbols)

    def numpy(self) -> np.ndarray:
        """The value, computed eagerly by the reference evaluator (tinygrad's ``.numpy()``); compile the graph
        (``kumiko.compile(t.graph())``) to run it on a target."""
        from kumiko.tiny.evaluate import evaluate
        g = self.graph("out")
        leaves = _leaves([self])
        missing = [t.name for t in leaves if t.data is None]
        if missing:
            raise _err("E1015", "numpy", f"inputs {missing} have no data",
                       suggestion="run the graph with kumiko.compile(t.graph())(**inputs)")
        return evaluate(g.tiny, {t.name: t.data for t in leaves})["out"]


def _lst(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _pairs(v: Any, at: str) -> list:
    """``[(lo, hi), ...]`` for pad and shrink (the op checks the sizes)."""
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in v):
        raise _err("E1010", at, f"expected one (lo, hi) pair per axis, got {v!r}")
    return [list(p) for p in v]


def _index(i: Any) -> Any:
    """One entry of ``t[...]``: an int (numpy ints too), a slice of ints or ``...``; bools, None
    (newaxis), tensors and arrays are refused (gather/take and reshape do those)."""
    if i is Ellipsis:
        return i
    if isinstance(i, slice):
        parts = [_index(p) if p is not None else None for p in (i.start, i.stop, i.step)]
        if any(isinstance(p, slice) or p is Ellipsis for p in parts):
            raise _err("E1010", "__getitem__", f"slice {i!r} must hold ints")
        return slice(*parts)
    if not isinstance(i, bool) and not isinstance(i, np.bool_):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise _err("E1010", "__getitem__", f"unsupported index {i!r}: kumiko indexes with ints, slices and '...'",
               suggestion="use .take(indices, axis) or .gather(axis, indices) for tensor indices, "
               ".unsqueeze(axis) for a new axis")


def _leaves(roots: Iterable[Tensor]) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    order: list[Tensor] = []
    stack = list(roots)[::-1]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        if t.op is None:
            order.append(t)
        stack.extend(s for s in reversed(t.srcs) if isinstance(s, Tensor))
    return order


def build_graph(outputs: Mapping[str, Tensor], name: str = "main", symbols: Mapping[str, int] | None = None) -> Graph:
    """Walk the tensors' DAG into a validated Graph; output tensors take the given names."""
    for n, t in outputs.items():
        if not isinstance(t, Tensor):
            raise _err("E1013", "graph", f"output {n!r} is {t!r}, not a Tensor")
        if t.op is None:
            raise _err("E1013", "graph", f"output {n!r} is an input tensor; compute something from it first")
    order: list[Tensor] = []
    state: dict[int, int] = {}
    for root in outputs.values():
        stack = [(root, False)]
        while stack:
            t, done = stack.pop()
            if done:
                order.append(t)
                continue
            if id(t) in state:
                continue
            state[id(t)] = 1
            stack.append((t, True))
            stack.extend((s, False) for s in reversed(t.srcs) if isinstance(s, Tensor) and id(s) not in state)
    out_name: dict[int, str] = {}
    for n, t in outputs.items():
        if id(t) in out_name:
            raise _err("E1013", "graph", f"outputs {out_name[id(t)]!r} and {n!r} are one tensor",
                       suggestion="Name each tensor once among the outputs (a copy under a second name: t + 0).")
        out_name[id(t)] = n
    names: dict[int, str] = {}
    inputs, tensors, nodes, params = [], {}, [], {}
    used: set[str] = set()
    for t in order:
        nm = out_name.get(id(t), t.name)
        if nm in used:
            raise _err("E1016", "graph", f"two tensors are both named {nm!r}; give inputs distinct names")
        used.add(nm)
        names[id(t)] = nm
        if t.op is None:
            inputs.append(SigInput(nm, t.role, "immutable", t.storage))
            tensors[nm] = t.type
            if t.role == "param" and t.data is not None:     # bound by compile, like ONNX initializers
                params[nm] = t.data
        else:
            nodes.append(OpNode(t.op, f"{t.op.lower()}_{len(nodes)}",
                                tuple(names[id(s)] if isinstance(s, Tensor) else s for s in t.srcs), (nm,),
                                FrozenDict({k: _freeze(v) for k, v in t.attrs.items()})))
    return Graph.make(inputs, list(outputs), tensors, nodes, symbols, name, params=params)


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v
