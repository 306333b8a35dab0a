"""The ONNX op table: how each supported ONNX op becomes frontend ops (converters) and, for the ops
that shape arithmetic is made of, how it is evaluated with numpy at import (folders).

A converter gets the ``Importer`` and the node and returns one kumiko tensor (or a numpy constant)
per ONNX output. Converters stay thin on purpose: semantics live in the frontend lowering, and a
converter only translates ONNX conventions (pads order, auto_pad, 1-D as 2-D, int64, opset
differences) into the frontend's attributes. Attention and pooling live in ``onnx_nn``.
"""
from __future__ import annotations

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_import import (
    ATTRS,
    CONVERTERS,
    FOLDERS,
    NP_KUMIKO,
    Importer,
    OnnxNode,
    SymbolicValue,
    is_symbolic,
    kumiko_dtype,
    shape_value,
)
from kumiko.frontend.onnx_import import onnx_dtype_name as dtype_name
from kumiko.symbolic import Expr, bounds, dim, prod


def converter(*names: str, attrs: str = ""):
    """Register a converter for ONNX ops ``names``; ``attrs`` lists the attributes it understands (any
    other attribute on such a node is a diagnostic rather than silently ignored)."""
    def deco(fn):
        for n in names:
            CONVERTERS[n] = fn
            ATTRS[n] = frozenset(attrs.split())
        return fn
    return deco


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


def _dims(v) -> list:
    """Sizes an op takes as they are, ints or symbolic (Reshape's shape, Expand's, Slice's starts/ends)."""
    return [dim(x) if isinstance(x, Expr) else int(x) for x in np.asarray(v).reshape(-1)]


def _sizes_array(xs, shape=None) -> np.ndarray:
    """A shape value from a list of ints and Exprs (numpy would otherwise try to make numbers of them)."""
    out = np.empty(len(xs), dtype=object)
    out[:] = list(xs)
    return shape_value(out.reshape(shape if shape is not None else (len(xs),)))


# ------------------------------------------------------------------------------------------------
# elementwise

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Log": "log",
         "Sqrt": "sqrt", "Reciprocal": "recip", "Neg": "neg", "Abs": "abs"}
BINARY = {"Add": "add", "Sum": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max",
          "Min": "min", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}


def _in_dtype(imp: Importer, name: str) -> dtypes.DType:
    c = imp.consts.get(name)
    if c is None:
        return imp.dtype(imp.tensor(name))
    if is_symbolic(c):          # a shape value: int64, narrowed to i32 like every int64
        return dtypes.i32
    if c.dtype not in NP_KUMIKO:
        raise imp.err("E1012", f"constant {name!r} has dtype {c.dtype}, which kumiko does not support")
    return NP_KUMIKO[c.dtype]


def _operands(imp: Importer, names: list[str]) -> list:
    """Runtime operands stay tensors; size-1 constants become literals where the shape allows."""
    rank = max((len(imp.shape(imp.tensor(n))) for n in names if n not in imp.consts), default=-1)
    return [imp.operand(n, rank) for n in names]


@converter(*UNARY)
def conv_unary(imp: Importer, node: OnnxNode) -> str:
    return imp.ew(UNARY[node.op_type], imp.tensor(node.input(0)))


@converter("LeakyRelu", attrs="alpha")
def conv_leaky_relu(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    return imp.ew("leaky_relu", x, alpha=float(node.attr("alpha", 0.01)))


@converter("Gelu", attrs="approximate")
def conv_gelu(imp: Importer, node: OnnxNode) -> str:
    approx = node.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise node.err("E1010", f"approximate={approx!r} is not supported (none or tanh)")
    return imp.ew("gelu", imp.tensor(node.input(0)), approximate=approx)


@converter(*BINARY)
def conv_binary(imp: Importer, node: OnnxNode) -> str:
    fn = BINARY[node.op_type]
    names = [n for n in node.inputs if n]
    if not names:
        raise node.err("E1009", f"{node.op_type} needs at least one input")
    dt = _in_dtype(imp, names[0])
    if fn in ("div", "pow") and not dt.is_float:
        raise node.err("E1012", f"{node.op_type} of {dt} needs integer {'division' if fn == 'div' else 'powers'}, "
                       "which Tiny IR does not have (constant shape arithmetic is folded at import)",
                       suggestion="cast to a float dtype first")
    if fn == "pow" and _in_dtype(imp, names[1]) is not dt:    # ONNX Pow lets the exponent's dtype differ
        e = names[1]
        if e not in imp.consts:
            et = imp.cast(imp.tensor(e), dt)
            base = imp.operand(names[0], len(imp.shape(et))) if names[0] in imp.consts else imp.tensor(names[0])
            return imp.ew("pow", base, et)
        names = [names[0], imp.fresh_name(f"{e}::as_{dt}")]
        imp.consts[names[1]] = imp.consts[e].astype(dt.np)
    if len(names) == 1:          # variadic Max/Min of one input
        return imp.tensor(names[0])
    ops = _operands(imp, names)
    y = imp.ew(fn, ops[0], ops[1])
    for o in ops[2:]:
        y = imp.ew(fn, y, o)
    return y


LOGICAL = {"And": "min", "Or": "max", "Xor": "ne"}


@converter(*LOGICAL)
def conv_logical(imp: Importer, node: OnnxNode) -> str:
    """Bool logic as the Tiny ops that mean it on bools: MIN is and, MAX is or, CMPNE is xor."""
    if _in_dtype(imp, node.input(0)) is not dtypes.bool_:
        raise node.err("E1012", f"{node.op_type} takes bool inputs")
    return imp.ew(LOGICAL[node.op_type], *_operands(imp, node.inputs[:2]))


@converter("Not")
def conv_not(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    if imp.dtype(x) is not dtypes.bool_:
        raise node.err("E1012", "Not takes a bool input")
    return imp.ew("eq", x, False)


@converter("Where")
def conv_where(imp: Importer, node: OnnxNode) -> str:
    ops = _operands(imp, node.inputs[:3])
    if not isinstance(ops[1], str) and not isinstance(ops[2], str):   # WHERE needs one tensor value
        ops[1] = imp.tensor(node.input(1))
    return imp.ew("where", *ops)


@converter("Clip", attrs="min max")
def conv_clip(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    if "min" in node.attrs or "max" in node.attrs:     # opset < 11 form, kept for converted models
        return imp.ew("clip", x, min=node.attr("min"), max=node.attr("max"))
    for k, fn in ((1, "max"), (2, "min")):
        b = node.input(k)
        if not b:
            continue
        c = imp.consts.get(b)
        if c is not None and c.size == 1 and not is_symbolic(c):
            x = imp.ew(fn, x, c.reshape(()).item())
        else:
            x = imp.ew(fn, x, imp.tensor(b))
    return x


@converter("Cast", attrs="to saturate round_mode")
def conv_cast(imp: Importer, node: OnnxNode) -> str:
    to = kumiko_dtype(int(node.attr("to")), node.where())
    return imp.cast(imp.tensor(node.input(0)), to)


@converter("CastLike", attrs="saturate round_mode")
def conv_cast_like(imp: Importer, node: OnnxNode) -> str | np.ndarray:
    dt = _in_dtype(imp, node.input(1))
    if node.input(0) in imp.consts:       # only the dtype of the second input matters
        return imp.consts[node.input(0)].astype(dt.np)
    return imp.cast(imp.tensor(node.input(0)), dt)


@converter("Identity")
def conv_identity(imp: Importer, node: OnnxNode) -> str:
    return imp.tensor(node.input(0))


@converter("Constant", attrs="value value_float value_floats value_int value_ints value_string value_strings "
                             "sparse_value")
def conv_constant(imp: Importer, node: OnnxNode) -> np.ndarray:
    return fold_constant(node, [])[0]


# ------------------------------------------------------------------------------------------------
# contractions and reductions

@converter("MatMul")
def conv_matmul(imp: Importer, node: OnnxNode) -> str:
    return imp.emit("MatMul", [imp.tensor(node.input(0)), imp.tensor(node.input(1))])


@converter("Gemm", attrs="alpha beta transA transB")
def conv_gemm(imp: Importer, node: OnnxNode) -> str:
    """``alpha * A' @ B' + beta * C`` as MatMul (with its transposes), a scale and a broadcast add."""
    a, b = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    y = imp.emit("MatMul", [a, b], trans_a=bool(node.attr("transA", 0)), trans_b=bool(node.attr("transB", 0)))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = imp.ew("mul", y, alpha)
    c = node.input(2)
    if c and beta != 0.0:
        rank = len(imp.shape(y))
        cc = imp.operand(c, rank) if c in imp.consts else imp.tensor(c)
        if beta != 1.0:
            cc = cc * beta if not isinstance(cc, str) else imp.ew("mul", cc, beta)
        y = imp.ew("add", y, cc)
    return y


def _axes_arg(imp: Importer, node: OnnxNode, k: int) -> list[int] | None:
    """Reduce/Squeeze axes: the input ``k`` (opset 13 / 18 on) or the ``axes`` attribute (before)."""
    if node.input(k):
        return _ints(imp.const(node.input(k), "axes"))
    return node.ints("axes")


REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}


@converter(*REDUCE, attrs="axes keepdims noop_with_empty_axes")
def conv_reduce(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    axes = _axes_arg(imp, node, 1)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(len(imp.shape(x))))
    return imp.emit("Reduce", [x], fn=REDUCE[node.op_type], axes=axes, keepdim=bool(node.attr("keepdims", 1)))


@converter("GlobalAveragePool", "GlobalMaxPool")
def conv_global_pool(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    r = len(imp.shape(x))
    if r < 3:
        raise node.err("E1011", f"{node.op_type} needs an input [N, C, spatial...], got rank {r}")
    fn = "mean" if node.op_type == "GlobalAveragePool" else "max"
    return imp.emit("Reduce", [x], fn=fn, axes=list(range(2, r)), keepdim=True)


@converter("Softmax", "LogSoftmax", attrs="axis")
def conv_softmax(imp: Importer, node: OnnxNode) -> str:
    return imp.emit(node.op_type, [imp.tensor(node.input(0))], axis=int(node.attr("axis", -1)))


@converter("CumSum", attrs="exclusive reverse")
def conv_cumsum(imp: Importer, node: OnnxNode) -> str:
    axis = _ints(imp.const(node.input(1), "axis", "E1010"))
    if len(axis) != 1:
        raise node.err("E1010", f"CumSum's axis must be one value, got {axis}")
    return imp.emit("CumSum", [imp.tensor(node.input(0))], axis=axis[0], exclusive=bool(node.attr("exclusive", 0)),
                    reverse=bool(node.attr("reverse", 0)))


@converter("LayerNormalization", attrs="axis epsilon stash_type")
def conv_layernorm(imp: Importer, node: OnnxNode) -> list:
    """Y through the frontend LayerNorm; Mean and InvStdDev, when asked for, from Reduce ops in the
    stash type (fp32)."""
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    r = len(shape)
    axis = int(node.attr("axis", -1))
    if not -r <= axis < r:
        raise node.err("E1010", f"axis {axis} is out of range for rank {r}")
    axis %= r
    eps = float(node.attr("epsilon", 1e-5))
    if int(node.attr("stash_type", 1)) != 1:
        raise node.err("E1010", f"stash_type {dtype_name(int(node.attr('stash_type')))} is not supported "
                       "(kumiko normalises in fp32)")
    extra = []
    for k in (1, 2):            # Scale (required) and B, broadcast to the normalised shape if need be
        if k == 1 or node.input(k):
            w = imp.tensor(node.input(k))
            if imp.shape(w) != shape[axis:]:
                w = imp.emit("Expand", [w], shape=list(shape[axis:]))
            extra.append(w)
    y = imp.emit("LayerNorm", [x, *extra], axis=axis, eps=eps)
    outs: list = [y, None, None]
    if node.wants_output(1) or node.wants_output(2):
        axes = list(range(axis, r))
        xf = imp.cast(x, dtypes.fp32)
        mean = imp.emit("Reduce", [xf], fn="mean", axes=axes, keepdim=True)
        d = imp.ew("sub", xf, mean)
        var = imp.emit("Reduce", [imp.ew("mul", d, d)], fn="mean", axes=axes, keepdim=True)
        outs[1] = mean
        outs[2] = imp.ew("rsqrt", imp.ew("add", var, eps))
    return outs


# ------------------------------------------------------------------------------------------------
# movement

def _reshape_target(src: tuple, shape: list[int], allowzero: bool) -> list:
    return [src[k] if s == 0 and not allowzero else s for k, s in enumerate(shape)]


@converter("Reshape", attrs="allowzero")
def conv_reshape(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    shape = _reshape_target(imp.shape(x), _dims(imp.const(node.input(1), "shape")), bool(node.attr("allowzero", 0)))
    return imp.emit("Reshape", [x], shape=shape)


@converter("Transpose", attrs="perm")
def conv_transpose(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    perm = node.ints("perm") or list(range(len(imp.shape(x))))[::-1]
    return imp.emit("Permute", [x], perm=perm)


@converter("Flatten", attrs="axis")
def conv_flatten(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    s = imp.shape(x)
    axis = int(node.attr("axis", 1))
    if not -len(s) <= axis <= len(s):
        raise node.err("E1010", f"axis {axis} is out of range for rank {len(s)}")
    axis += len(s) if axis < 0 else 0
    return imp.emit("Reshape", [x], shape=[prod(s[:axis]), prod(s[axis:])])


@converter("Squeeze", attrs="axes")
def conv_squeeze(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    s = imp.shape(x)
    axes = _axes_arg(imp, node, 1)
    if axes is None:
        axes = [k for k, d in enumerate(s) if d == 1]
    axes = {a % len(s) for a in axes}
    if any(s[a] != 1 for a in axes):
        raise node.err("E1011", f"cannot squeeze axes {sorted(axes)} of shape {[str(d) for d in s]}")
    return imp.emit("Reshape", [x], shape=[d for k, d in enumerate(s) if k not in axes])


@converter("Unsqueeze", attrs="axes")
def conv_unsqueeze(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    return imp.emit("Reshape", [x], shape=_unsqueezed(imp.shape(x), _axes_arg(imp, node, 1) or []))


def _unsqueezed(s: tuple, axes: list[int]) -> list:
    r = len(s) + len(axes)
    axes = {a % r for a in axes}
    it = iter(s)
    return [1 if k in axes else next(it) for k in range(r)]


@converter("Slice")
def conv_slice(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    starts = _dims(imp.const(node.input(1), "starts"))      # symbolic bounds (x[:, :T]) are Slice's own
    ends = _dims(imp.const(node.input(2), "ends"))
    axes = _ints(imp.const(node.input(3), "axes")) if node.input(3) else list(range(len(starts)))
    steps = _ints(imp.const(node.input(4), "steps")) if node.input(4) else [1] * len(starts)
    return imp.emit("Slice", [x], starts=starts, ends=ends, axes=axes, steps=steps)


@converter("Expand")
def conv_expand(imp: Importer, node: OnnxNode) -> str:
    """ONNX Expand broadcasts both ways (the shape may hold 1s and be shorter than the input)."""
    x = imp.tensor(node.input(0))
    src = imp.shape(x)
    want = _dims(imp.const(node.input(1), "shape"))
    r = max(len(src), len(want))
    a = (1,) * (r - len(src)) + tuple(src)
    b = (1,) * (r - len(want)) + tuple(want)
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            raise node.err("E1001", f"cannot expand {[str(d) for d in src]} to {[str(d) for d in want]}")
        out.append(q if p == 1 else p)
    return imp.emit("Expand", [x], shape=out)


@converter("Concat", attrs="axis")
def conv_concat(imp: Importer, node: OnnxNode) -> str:
    xs = [imp.tensor(n) for n in node.inputs if n]
    return imp.emit("Concat", xs, axis=int(node.attr("axis")))


@converter("Gather", attrs="axis")
def conv_gather(imp: Importer, node: OnnxNode) -> str:
    x, idx = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    return imp.emit("Gather", [x, idx], axis=int(node.attr("axis", 0)), mode="take")


@converter("Shape", attrs="start end")
def conv_shape(imp: Importer, node: OnnxNode) -> np.ndarray:
    """The run-time tensor's sizes as a shape value: ints, and Exprs for symbolic (dim_param) sizes."""
    return _shape_slice(node, imp.shape(imp.tensor(node.input(0))))


@converter("Size")
def conv_size(imp: Importer, node: OnnxNode) -> np.ndarray:
    return _sizes_array([prod(imp.shape(imp.tensor(node.input(0))))], ())


def _shape_slice(node: OnnxNode, s) -> np.ndarray:
    r = len(s)
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = r if end is None else int(end)
    start, end = (min(max(v + r if v < 0 else v, 0), r) for v in (start, end))
    return _sizes_array(list(s)[start:end])


@converter("ConstantOfShape", attrs="value")
def conv_constant_of_shape(imp: Importer, node: OnnxNode) -> np.ndarray | str:
    """Folded for a static shape; for a symbolic one (a [T, T] causal mask) the value expanded to it."""
    shape = imp.const(node.input(0), "shape")
    if not is_symbolic(shape):
        return fold_constant_of_shape(node, [shape])[0]
    value = _constant_of_shape_value(node)
    v = imp._param(f"{node.outputs[0]}::value", value.reshape(1))
    return imp.emit("Expand", [v], shape=_dims(shape))


@converter("Range")
def conv_range(imp: Importer, node: OnnxNode) -> np.ndarray | str:
    """Folded when start, limit and delta are numbers. With a symbolic bound (``Range(0, T)`` of position
    ids) it is ``start + delta * iota(n)``, n = ceil((limit - start) / delta) as a size expression, the
    iota an exclusive CumSum of ones (``onnx_index._iota``); delta must then be a constant."""
    vals = [imp.const(n, f"input {k}") for k, n in enumerate(node.inputs)]
    if not any(is_symbolic(v) for v in vals):
        return fold_range(node, vals)[0]
    from kumiko.frontend.onnx_index import _iota
    start, limit, delta = (v.reshape(()).item() for v in vals)
    if not isinstance(delta, int) or delta == 0:
        raise SymbolicValue(f"Range over symbolic sizes needs a constant non-zero integer delta, got {delta}")
    n = (Expr.lift(limit) - start + delta - 1).floordiv(delta) if delta > 0 else \
        (Expr.lift(start) - limit - delta - 1).floordiv(-delta)
    y = _iota(imp, dim(n), 1, 0)
    if delta != 1:
        y = imp.ew("mul", y, delta)
    if isinstance(start, Expr):
        y = imp.ew("add", y, imp.tensor(node.input(0)))
    elif start:
        y = imp.ew("add", y, start)
    return imp.cast(y, NP_KUMIKO[vals[0].dtype]) if not is_symbolic(vals[0]) else y


@converter("ReduceProd", attrs="axes keepdims noop_with_empty_axes")
@converter("Mod", attrs="fmod")
def conv_fold_only(imp: Importer, node: OnnxNode) -> np.ndarray:
    """Ops kumiko only folds: their inputs must be known at import (shape values included, where the
    folder can evaluate them)."""
    vals = [imp.const(n, f"input {k}", "E1010") if n else None for k, n in enumerate(node.inputs)]
    out = imp._fold(node, vals)
    if out is None:
        raise SymbolicValue(imp.fold_why)
    return out[0]


# ------------------------------------------------------------------------------------------------
# folders: numpy semantics of the ops shape subgraphs are made of

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


# conv, pooling and attention (onnx_nn), the index/shape ops (onnx_index), activations and trig (onnx_act),
# normalisations (onnx_norm) and Pad/Resize (onnx_resize) register themselves on import
from kumiko.frontend import onnx_act, onnx_index, onnx_nn, onnx_norm, onnx_resize  # noqa: E402,F401
