"""Lowering of contractions, windows, normalisation, reductions, gather and cumsum to naive Tiny IR.

Contractions follow tinygrad's dot exactly (reshape -> transpose -> broadcast -> MUL -> REDUCE(SUM)
over the last axis, seed 000 §0); windows (Conv, ConvTranspose, pooling in any spatial rank) are in
``lower_window``, registered with this module; attention is two contractions around the seed's row softmax
(REDUCE MAX, SUB, MUL log2e, EXP2, REDUCE SUM, FDIV; seed 002 §5.3). A causal mask is a PAD of ones
seen through an affine VIEW, so later stages see it as the affine predicate ``n <= m``.
"""
from __future__ import annotations

import math
from typing import Any

from kumiko import dtypes
from kumiko.frontend.lower import LOG2E, Ctx, broadcast_shapes, count, ew, keepdim, one_input, op, same_dtype
from kumiko.symbolic import Expr, dim

# ------------------------------------------------------------------------------------------------
# contractions


def dot(ctx: Ctx, x: str, w: str, acc: dtypes.DType, out: dtypes.DType) -> str:
    """tinygrad's ``Tensor.dot`` (1-D and N-D rules) with the accumulator dtype made explicit."""
    b = ctx.b
    xs, ws = ctx.shape(x), ctx.shape(w)
    dx, dw = len(xs), len(ws)
    if dx == 0 or dw == 0:
        raise ctx.err("E1011", f"matmul needs operands of rank >= 1, got ranks {dx} and {dw}")
    same_dtype(ctx, [x, w])
    axis_w = -min(dw, 2)
    if xs[-1] != ws[axis_w]:
        raise ctx.err("E1011", f"matmul contraction sizes differ: {[str(d) for d in xs]} @ {[str(d) for d in ws]} "
                      f"({xs[-1]} vs {ws[axis_w]})", suggestion="The last axis of the left operand must equal the "
                      "second-to-last axis of the right one (the only axis for 1-D).")
    n1 = min(dx - 1, dw - 1, 1)
    x = b.reshape(x, xs[:-1] + (1,) * n1 + xs[-1:])
    w = b.reshape(w, ws[:-2] + (1,) * n1 + ws[axis_w:])
    rank = len(ctx.shape(w))
    perm = list(range(rank))
    perm[-1], perm[axis_w] = perm[axis_w], perm[-1]
    w = b.permute(w, perm)
    shape = broadcast_shapes(ctx, ctx.shape(x), ctx.shape(w))
    p = b.add("MUL", [b.broadcast_to(x, shape), b.broadcast_to(w, shape)])
    return b.cast(b.reduce(p, "SUM", [len(shape) - 1], acc), out)


def _numeric(ctx: Ctx, x: str) -> dtypes.DType:
    dt = ctx.dtype(x)
    if dt is dtypes.bool_:
        raise ctx.err("E1012", f"{ctx.node.op} does not take bool operands")
    return dt


@op("MatMul", "GEMM")
def lower_matmul(ctx: Ctx, args: list) -> str:
    if len(args) != 2 or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", "MatMul takes two tensor inputs")
    a, w = args
    dt = _numeric(ctx, a)
    for key, which in (("trans_a", 0), ("trans_b", 1)):
        if ctx.attr(key, False):
            t = (a, w)[which]
            r = len(ctx.shape(t))
            if r < 2:
                raise ctx.err("E1010", f"{key} needs a rank >= 2 operand")
            perm = list(range(r))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            t = ctx.b.permute(t, perm)
            a, w = (t, w) if which == 0 else (a, t)
    return dot(ctx, a, w, ctx.acc_dtype(dt), ctx.dtype_attr("out_dtype", dt))


# ------------------------------------------------------------------------------------------------
# softmax, layernorm, attention


def softmax(ctx: Ctx, x: str, axis: int, log: bool = False) -> str:
    """Row softmax in the seed's form: max, subtract, exp2(x*log2e), sum, divide (in x's dtype)."""
    b = ctx.b
    shape = ctx.shape(x)
    m = b.reduce(x, "MAX", (axis,), ctx.dtype(x))
    s0 = b.add("SUB", [x, keepdim(ctx, m, shape, (axis,))])
    e = b.add("EXP2", [b.add("MUL", [s0, LOG2E])])
    z = b.reduce(e, "SUM", (axis,), ctx.dtype(x))
    if log:
        lz = b.add("MUL", [b.add("LOG2", [z]), math.log(2.0)])
        return b.add("SUB", [s0, keepdim(ctx, lz, shape, (axis,))])
    return b.add("FDIV", [e, keepdim(ctx, z, shape, (axis,))])


@op("Softmax", "LogSoftmax")
def lower_softmax(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    dt = ctx.dtype(x)
    if not dt.is_float:
        raise ctx.err("E1012", f"Softmax needs a float input, got {dt}")
    axis = ctx.axis(ctx.attr("axis", -1), len(ctx.shape(x)))
    acc = ctx.acc_dtype(dt)
    y = softmax(ctx, ctx.b.cast(x, acc), axis, log=ctx.node.op == "LogSoftmax" or bool(ctx.attr("log", False)))
    return ctx.b.cast(y, dt)


@op("LayerNorm", "LayerNormalization")
def lower_layernorm(ctx: Ctx, args: list) -> str:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over axes ``axis..-1``, in the acc dtype."""
    if not 1 <= len(args) <= 3 or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", "LayerNorm takes inputs [x], [x, weight] or [x, weight, bias]")
    b = ctx.b
    x = args[0]
    dt = ctx.dtype(x)
    if not dt.is_float:
        raise ctx.err("E1012", f"LayerNorm needs a float input, got {dt}")
    shape = ctx.shape(x)
    axis = ctx.axis(ctx.attr("axis", -1), len(shape))
    axes = tuple(range(axis, len(shape)))
    eps = float(ctx.number("eps", 1e-5, minimum=0))     # a negative eps can make var + eps <= 0: nan
    acc = ctx.acc_dtype(dt)
    xf = b.cast(x, acc)
    n = count(ctx, shape, axes, acc)
    mean = ew(ctx, "FDIV", b.reduce(xf, "SUM", axes, acc), n)
    xc = b.add("SUB", [xf, keepdim(ctx, mean, shape, axes)])
    var = ew(ctx, "FDIV", b.reduce(b.add("MUL", [xc, xc]), "SUM", axes, acc), n)
    inv = b.add("RSQRT", [ew(ctx, "ADD", var, eps)])
    y = b.add("MUL", [xc, keepdim(ctx, inv, shape, axes)])
    for extra in args[1:]:
        if ctx.shape(extra) != shape[axis:]:
            raise ctx.err("E1011", f"LayerNorm weight/bias must have shape {[str(d) for d in shape[axis:]]}, got "
                          f"{[str(d) for d in ctx.shape(extra)]}")
        same_dtype(ctx, [x, extra])
        y = b.add("MUL" if extra is args[1] else "ADD", [y, b.broadcast_to(b.cast(extra, acc), shape)])
    return b.cast(y, dt)


def causal_mask(ctx: Ctx, m: Any, n: Any) -> str:
    """bool [M, N], true where ``n <= m``: ones[M] padded on the left by N-1 falses, seen through
    the affine VIEW ``(m, n) -> m - n + N - 1`` (top-left aligned, as PyTorch's is_causal)."""
    b = ctx.b
    ones = b.const(True, dtypes.bool_, (m,))
    padded = b.pad(ones, [(dim(Expr.lift(n) - 1), 0)], False)
    i0, i1 = Expr.sym("i0"), Expr.sym("i1")
    return b.add("VIEW", [padded], result_shape=(m, n), index_map=(i0 - i1 + (Expr.lift(n) - 1),))


@op("Attention")
def lower_attention(ctx: Ctx, args: list) -> str:
    if len(args) not in (3, 4) or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", "Attention takes inputs [q, k, v] or [q, k, v, mask]")
    b = ctx.b
    q, k, v = args[:3]
    dt = ctx.dtype(q)
    if not dt.is_float:
        raise ctx.err("E1012", f"Attention needs float inputs, got {dt}")
    same_dtype(ctx, [q, k, v])
    qs, ks, vs = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if min(len(qs), len(ks), len(vs)) < 2:
        raise ctx.err("E1011", "Attention needs q [..., M, D], k [..., N, D], v [..., N, Dv]")
    if ks[-2] != vs[-2]:
        raise ctx.err("E1011", f"k and v must have the same sequence length ({ks[-2]} vs {vs[-2]})")
    scale = ctx.attr("scale")
    if scale is None:
        if not isinstance(qs[-1], int):
            raise ctx.err("E1010", "a symbolic head size needs an explicit 'scale'")
        scale = 1.0 / math.sqrt(qs[-1])
    acc = ctx.acc_dtype(dt)
    r = len(ks)
    kt = b.permute(k, list(range(r - 2)) + [r - 1, r - 2])
    s = dot(ctx, q, kt, acc, acc)
    s = b.add("MUL", [s, float(scale)])
    shape = ctx.shape(s)
    if ctx.attr("causal", False):
        mask = b.broadcast_to(causal_mask(ctx, shape[-2], shape[-1]), shape)
        s = b.add("WHERE", [mask, s, float("-inf")])
    if len(args) == 4:
        mask = args[3]
        full = broadcast_shapes(ctx, ctx.shape(mask), shape)
        if full != shape:
            raise ctx.err("E1001", f"mask {[str(d) for d in ctx.shape(mask)]} does not broadcast to the scores "
                          f"{[str(d) for d in shape]}")
        if ctx.dtype(mask) is dtypes.bool_:
            s = b.add("WHERE", [b.broadcast_to(mask, shape), s, float("-inf")])
        else:
            s = b.add("ADD", [s, b.broadcast_to(b.cast(mask, acc), shape)])
    p = b.cast(softmax(ctx, s, len(shape) - 1), dt)
    return dot(ctx, p, v, acc, dt)


# ------------------------------------------------------------------------------------------------
# reductions, gather, cumsum


@op("Reduce")
def lower_reduce(ctx: Ctx, args: list) -> str:
    x = one_input(ctx, args)
    b = ctx.b
    fn = str(ctx.attr("fn", "")).lower()
    if fn not in ("sum", "max", "min", "mean"):
        raise ctx.err("E1006", f"unknown reduce fn {fn!r}", suggestion="use sum, max, min or mean")
    dt = ctx.dtype(x)
    shape = ctx.shape(x)
    axes_attr = ctx.attr("axes")
    if axes_attr is None:
        axes = tuple(range(len(shape)))
    else:
        axes = ctx.axes(axes_attr if isinstance(axes_attr, (list, tuple)) else [axes_attr], len(shape))
    if fn in ("sum", "mean") and dt is dtypes.bool_:
        raise ctx.err("E1012", f"{fn} of bool is not supported; cast to i32 first")
    if fn == "mean" and not dt.is_float:
        raise ctx.err("E1012", f"mean needs a float input, got {dt}")
    if fn in ("max", "min"):
        y = b.reduce(x, fn.upper(), axes, dt)
    else:
        acc = ctx.acc_dtype(dt)
        y = b.reduce(x, "SUM", axes, acc)
        if fn == "mean":
            y = ew(ctx, "FDIV", y, count(ctx, shape, axes, acc))
        y = b.cast(y, dt)
    if ctx.attr("keepdim", False):
        y = b.reshape(y, tuple(1 if i in axes else d for i, d in enumerate(shape)))
    return y


@op("Gather")
def lower_gather(ctx: Ctx, args: list) -> str:
    """``mode="elements"`` (default) is torch.gather; ``mode="take"`` is numpy.take / ONNX Gather,
    lowered to the elementwise form by reshaping and expanding data and indices."""
    if len(args) != 2 or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", "Gather takes inputs [data, indices]")
    b = ctx.b
    x, idx = args
    if ctx.dtype(idx) is not dtypes.i32:
        raise ctx.err("E1012", f"gather indices must be i32, got {ctx.dtype(idx)}")
    xs, ins = ctx.shape(x), ctx.shape(idx)
    axis = ctx.axis(ctx.attr("axis", 0), len(xs))
    mode = ctx.attr("mode", "elements")
    if isinstance(xs[axis], int):  # negative indices count from the end
        idx = b.add("WHERE", [b.add("CMPLT", [idx, 0]), b.add("ADD", [idx, xs[axis]]), idx])
    if mode == "elements":
        if len(ins) != len(xs) or any(p != q for k, (p, q) in enumerate(zip(ins, xs)) if k != axis):
            raise ctx.err("E1011", f"indices {[str(d) for d in ins]} must match data {[str(d) for d in xs]} except "
                          f"on axis {axis}")
        return b.add("GATHER", [x, idx], axis=axis)
    if mode != "take":
        raise ctx.err("E1010", f"gather mode must be 'elements' or 'take', got {mode!r}")
    pre, post = xs[:axis], xs[axis + 1:]
    out = pre + ins + (1,) + post
    xd = b.expand(b.reshape(x, pre + (1,) * len(ins) + (xs[axis],) + post), pre + ins + (xs[axis],) + post)
    xi = b.expand(b.reshape(idx, (1,) * len(pre) + ins + (1,) + (1,) * len(post)), out)
    g = b.add("GATHER", [xd, xi], axis=len(pre) + len(ins))
    return b.reshape(g, pre + ins + post)


@op("CumSum")
def lower_cumsum(ctx: Ctx, args: list) -> str:
    """Inclusive prefix sum as tinygrad writes it: pad L-1 zeros in front, take length-L windows
    with the VIEW ``(i, j) -> i + j`` and sum each window; exclusive shifts by one first."""
    x = one_input(ctx, args)
    b = ctx.b
    dt = _numeric(ctx, x)
    shape = ctx.shape(x)
    r = len(shape)
    if r == 0:
        raise ctx.err("E1011", "CumSum needs a rank >= 1 input")
    axis = ctx.axis(ctx.attr("axis", -1), r)
    perm = [k for k in range(r) if k != axis] + [axis]
    x = b.permute(x, perm)
    if ctx.attr("reverse", False):
        x = b.flip(x, [r - 1])
    s = ctx.shape(x)
    size = s[-1]
    if ctx.attr("exclusive", False):
        x = b.shrink(b.pad(x, [(0, 0)] * (r - 1) + [(1, 0)]), [0] * r, s)
    xp = b.pad(x, [(0, 0)] * (r - 1) + [(dim(Expr.lift(size) - 1), 0)])
    i = [Expr.sym(f"i{k}") for k in range(r + 1)]
    xw = b.add("VIEW", [xp], result_shape=s + (size,), index_map=i[:r - 1] + [i[r - 1] + i[r]])
    y = b.cast(b.reduce(xw, "SUM", (r,), dtypes.default_acc(dt)), dt)
    if ctx.attr("reverse", False):
        y = b.flip(y, [r - 1])
    inv = [perm.index(k) for k in range(r)]
    return b.permute(y, inv)


from kumiko.frontend import lower_window  # noqa: E402,F401  (registers the window ops; it uses _numeric)
