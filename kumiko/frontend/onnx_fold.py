"""The ONNX folders: how the ops that shape arithmetic is made of are evaluated with numpy at import,
registered in ``FOLDERS`` by op type (``folder``). A folder takes the node and its input arrays --
plain numpy, or shape values holding symbolic sizes (``onnx_import.shape_value``) -- and returns the
outputs; one that cannot evaluate a shape value raises ``SymbolicValue`` and the node is converted
instead (``onnx_ops``). Also the ONNX conventions converters and folders share (Reshape's 0, Unsqueeze's
axes, Shape's start/end, ConstantOfShape's default value) and the integer reading of axes and steps.
"""
from __future__ import annotations

import numpy as np

from kumiko.frontend.onnx_import import FOLDERS, SymbolicValue, is_symbolic, shape_value
from kumiko.frontend.onnx_import import onnx_dtype_name as dtype_name
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.symbolic import Expr, bounds


def folder(*names: str):
    def deco(fn):
        for n in names:
            FOLDERS[n] = fn
        return fn
    return deco


def _ints(v) -> list[int]:
    """Integers an op needs as numbers (axes, steps, indices); a symbolic size here cannot be folded."""
    out = []
    for x in np.asarray(v).reshape(-1):
        if isinstance(x, Expr):
            raise SymbolicValue(f"it needs a number here, got the symbolic size {x}")
        out.append(int(x))
    return out


def _sizes_array(xs, shape=None) -> np.ndarray:
    """A shape value from a list of ints and Exprs (numpy would otherwise try to make numbers of them)."""
    out = np.empty(len(xs), dtype=object)
    out[:] = list(xs)
    return shape_value(out.reshape(shape if shape is not None else (len(xs),)))


def _reshape_target(src: tuple, shape: list[int], allowzero: bool) -> list:
    return [src[k] if s == 0 and not allowzero else s for k, s in enumerate(shape)]


def _unsqueezed(s: tuple, axes: list[int]) -> list:
    r = len(s) + len(axes)
    axes = {a % r for a in axes}
    it = iter(s)
    return [1 if k in axes else next(it) for k in range(r)]


def _shape_slice(node: OnnxNode, s) -> np.ndarray:
    r = len(s)
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = r if end is None else int(end)
    start, end = (min(max(v + r if v < 0 else v, 0), r) for v in (start, end))
    return _sizes_array(list(s)[start:end])


_NP_BINARY = {"Add": np.add, "Sum": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum,
              "Min": np.minimum, "Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal,
              "Greater": np.greater, "GreaterOrEqual": np.greater_equal}


#: on shape values: (op, lo, hi) -> result, from the bounds lo <= a - b <= hi that the sizes allow; None when
#: the bounds do not decide it
_SYM_COMPARE = {
    "Equal": lambda a, b, lo, hi: True if lo == hi == 0 else False if lo > 0 or hi < 0 else None,
    "Less": lambda a, b, lo, hi: True if hi < 0 else False if lo >= 0 else None,
    "LessOrEqual": lambda a, b, lo, hi: True if hi <= 0 else False if lo > 0 else None,
    "Greater": lambda a, b, lo, hi: True if lo > 0 else False if hi <= 0 else None,
    "GreaterOrEqual": lambda a, b, lo, hi: True if lo >= 0 else False if hi < 0 else None,
    "Max": lambda a, b, lo, hi: a if lo >= 0 else b if hi <= 0 else None,
    "Min": lambda a, b, lo, hi: b if lo >= 0 else a if hi <= 0 else None,
}


def _sym_compare(op: str, a, b):
    """A comparison (or Max/Min) of sizes, decided by bounding ``a - b`` with every size symbol >= 0: Equal(T,
    -1) is false for any T, Max(T, 0) is T; Equal(T, 1) depends on T and is left to run time."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return {"Max": max, "Min": min}[op](a, b) if op in ("Max", "Min") else _NP_BINARY[op](a, b)
    d = Expr.lift(a) - Expr.lift(b)
    lo, hi = bounds(d, {s: (0, float("inf")) for s in d.symbols()})
    out = _SYM_COMPARE[op](a, b, lo, hi)
    if out is None:
        raise SymbolicValue(f"{op}({a}, {b}) depends on the sizes' values")
    return out


@folder(*_NP_BINARY)
def fold_binary(node: OnnxNode, v: list) -> list:
    """numpy's own ufuncs, which apply Expr's + - * elementwise to shape values; comparisons and Max/Min of
    sizes go through ``_sym_compare``."""
    out = v[0]
    for w in v[1:]:
        if node.op_type in _SYM_COMPARE and (is_symbolic(out) or is_symbolic(w)):
            out = np.frompyfunc(lambda a, b: _sym_compare(node.op_type, a, b), 2, 1)(out, w)
        else:
            out = _NP_BINARY[node.op_type](out, w)
    return [np.asarray(out)]


@folder("And", "Or", "Xor", "Not")
def fold_logical(node: OnnxNode, v: list) -> list:
    f = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}.get(node.op_type)
    return [np.logical_not(v[0]) if f is None else f(v[0], v[1])]


def _sym_div(a, b, what: str):
    """Integer Div/Mod with a symbolic operand: floor(a / q) (Expr floor division) for a positive constant q,
    truncating as ONNX does for a negative one; sizes are non-negative, where floor and truncation agree.
    A symbolic divisor divides only exactly (B*T / T = B)."""
    if isinstance(b, Expr):
        q = Expr.lift(a).exact_div(b) if what == "Div" else None
        if q is None:
            raise SymbolicValue(f"{what}({a}, {b}) divides by a symbolic size")
        return q
    b = int(b)
    if b == 0:
        raise SymbolicValue(f"{what}({a}, 0) divides by zero")
    if what == "Mod":
        if b < 0:
            raise SymbolicValue(f"Mod({a}, {b}) by a negative divisor")
        return Expr.lift(a) % b
    q = Expr.lift(a).floordiv(abs(b))
    return q if b > 0 else -q


@folder("Mod")
def fold_mod(node: OnnxNode, v: list) -> list:
    a, b = v
    if is_symbolic(a) or is_symbolic(b):
        return [np.frompyfunc(lambda x, y: _sym_div(x, y, "Mod"), 2, 1)(a, b)]
    if node.attr("fmod", 0):
        return [np.fmod(a, b)]
    return [np.mod(a, b)]


@folder("Div")
def fold_div(node: OnnxNode, v: list) -> list:
    a, b = v
    if is_symbolic(a) or is_symbolic(b):
        return [np.frompyfunc(lambda x, y: _sym_div(x, y, "Div"), 2, 1)(a, b)]
    if a.dtype.kind in "iu":
        return [np.trunc(a.astype(np.float64) / b).astype(a.dtype)]
    return [(a / b).astype(a.dtype)]


@folder("Neg", "Abs", "Sqrt", "Reciprocal", "Relu")
def fold_unary(node: OnnxNode, v: list) -> list:
    x = v[0]
    f = {"Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal,
         "Relu": lambda a: np.maximum(a, 0)}[node.op_type]
    return [np.asarray(f(x)).astype(x.dtype)]


@folder("Identity")
def fold_identity(node: OnnxNode, v: list) -> list:
    return [v[0]]


@folder("Cast")
def fold_cast(node: OnnxNode, v: list) -> list:
    from onnx import helper
    to = int(node.attr("to"))
    if is_symbolic(v[0]):
        if to not in (6, 7):        # INT32, INT64: sizes stay sizes; anything else is computed at run time
            raise SymbolicValue(f"a Cast of symbolic sizes to {dtype_name(to)} is computed at run time")
        return [v[0]]
    try:
        return [v[0].astype(helper.tensor_dtype_to_np_dtype(to))]
    except (KeyError, TypeError, ValueError):
        raise node.err("E1012", f"cannot cast to {dtype_name(to)}") from None


@folder("Constant")
def fold_constant(node: OnnxNode, v: list) -> list:
    a = node.attrs
    if "value" in a and isinstance(a["value"], np.ndarray):
        return [a["value"]]
    for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                    ("value_ints", np.int64)):
        if key in a:
            return [np.asarray(a[key], dtype=dt)]
    raise node.err("E1010", f"Constant with {sorted(a)} is not supported (value, value_float(s), value_int(s))")


@folder("Shape")
def fold_shape(node: OnnxNode, v: list) -> list:
    return [_shape_slice(node, v[0].shape)]


@folder("Size")
def fold_size(node: OnnxNode, v: list) -> list:
    return [np.asarray(v[0].size, dtype=np.int64)]


@folder("CastLike")
def fold_cast_like(node: OnnxNode, v: list) -> list:
    return [v[0].astype(v[1].dtype)]


@folder("Reshape")
def fold_reshape(node: OnnxNode, v: list) -> list:
    return [v[0].reshape(_reshape_target(v[0].shape, _ints(v[1]), bool(node.attr("allowzero", 0))))]


@folder("Transpose")
def fold_transpose(node: OnnxNode, v: list) -> list:
    return [np.transpose(v[0], node.ints("perm"))]


@folder("Flatten")
def fold_flatten(node: OnnxNode, v: list) -> list:
    axis = int(node.attr("axis", 1))
    axis += v[0].ndim if axis < 0 else 0
    return [v[0].reshape(int(np.prod(v[0].shape[:axis])), -1)]


@folder("Squeeze")
def fold_squeeze(node: OnnxNode, v: list) -> list:
    axes = _ints(v[1]) if len(v) > 1 and v[1] is not None else node.ints("axes")
    return [np.squeeze(v[0], axis=tuple(axes) if axes is not None else None)]


@folder("Unsqueeze")
def fold_unsqueeze(node: OnnxNode, v: list) -> list:
    axes = _ints(v[1]) if len(v) > 1 and v[1] is not None else node.ints("axes")
    return [v[0].reshape(_unsqueezed(v[0].shape, axes))]


@folder("Concat")
def fold_concat(node: OnnxNode, v: list) -> list:
    return [np.concatenate([a for a in v if a is not None], axis=int(node.attr("axis")))]


@folder("Gather")
def fold_gather(node: OnnxNode, v: list) -> list:
    return [np.take(v[0], v[1].astype(np.int64), axis=int(node.attr("axis", 0)))]


@folder("Slice")
def fold_slice(node: OnnxNode, v: list) -> list:
    x = v[0]
    starts, ends = _ints(v[1]), _ints(v[2])
    axes = _ints(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
    steps = _ints(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[a % x.ndim] = slice(s, e, st)
    return [x[tuple(sl)]]


@folder("Where")
def fold_where(node: OnnxNode, v: list) -> list:
    return [np.where(v[0], v[1], v[2])]


@folder("Expand")
def fold_expand(node: OnnxNode, v: list) -> list:
    return [v[0] * np.ones(_ints(v[1]), dtype=v[0].dtype)]


def _constant_of_shape_value(node: OnnxNode) -> np.ndarray:
    value = node.attr("value")
    return np.zeros((1,), np.float32) if value is None else np.asarray(value)


@folder("ConstantOfShape")
def fold_constant_of_shape(node: OnnxNode, v: list) -> list:
    value = _constant_of_shape_value(node)
    return [np.full(_ints(v[0]), value.reshape(-1)[0], dtype=value.dtype)]


@folder("Range")
def fold_range(node: OnnxNode, v: list) -> list:
    start, limit, delta = (a.reshape(()) for a in v)
    return [np.arange(start, limit, delta, dtype=start.dtype)]


@folder("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin")
def fold_reduce(node: OnnxNode, v: list) -> list:
    x = v[0]
    axes = _ints(v[1]) if len(v) > 1 and v[1] is not None else node.ints("axes")
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.ndim))
    f = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[node.op_type]
    return [np.asarray(f(x, axis=tuple(axes), keepdims=bool(node.attr("keepdims", 1)))).astype(x.dtype)]
