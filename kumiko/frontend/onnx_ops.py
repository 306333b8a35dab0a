"""The ONNX op table: how each supported ONNX op becomes frontend ops (converters). The ops that shape
arithmetic is made of are also evaluated with numpy at import when their inputs are known: their
folders are in ``onnx_fold``.

A converter gets the ``Importer`` and the node and returns one kumiko tensor (or a numpy constant)
per ONNX output. Converters stay thin on purpose: semantics live in the frontend lowering, and a
converter only translates ONNX conventions (pads order, auto_pad, 1-D as 2-D, int64, opset
differences) into the frontend's attributes. Attention and pooling live in ``onnx_nn``.
"""
from __future__ import annotations

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_fold import (
    _constant_of_shape_value,
    _ints,
    _reshape_target,
    _shape_slice,
    _sizes_array,
    _unsqueezed,
    fold_constant,
    fold_constant_of_shape,
    fold_range,
)
from kumiko.frontend.onnx_import import ATTRS, CONVERTERS, NP_KUMIKO, Importer, SymbolicValue, is_symbolic, kumiko_dtype
from kumiko.frontend.onnx_import import onnx_dtype_name as dtype_name
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.symbolic import Expr, dim, prod


def converter(*names: str, attrs: str = ""):
    """Register a converter for ONNX ops ``names``; ``attrs`` lists the attributes it understands (any
    other attribute on such a node is a diagnostic rather than silently ignored)."""
    def deco(fn):
        for n in names:
            CONVERTERS[n] = fn
            ATTRS[n] = frozenset(attrs.split())
        return fn
    return deco


def _dims(v) -> list:
    """Sizes an op takes as they are, ints or symbolic (Reshape's shape, Expand's, Slice's starts/ends)."""
    return [dim(x) if isinstance(x, Expr) else int(x) for x in np.asarray(v).reshape(-1)]


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


# conv, pooling and attention (onnx_nn), the index/shape ops (onnx_index), activations and trig (onnx_act),
# normalisations (onnx_norm) and Pad/Resize (onnx_resize) register themselves on import
from kumiko.frontend import onnx_act, onnx_index, onnx_nn, onnx_norm, onnx_resize  # noqa: E402,F401
