"""Lowering of windowed ops in any number of spatial dimensions: convolution, transposed convolution,
max and average pooling.

Conv is pad + a sliding-window VIEW + MUL + REDUCE (seed 002 §5.2); pooling is pad + VIEW + REDUCE.
The window VIEW is affine, ``[..., I1..In] -> [..., O1..On, K1..Kn]`` with ``s*o + d*k`` per axis,
so 1-D, 2-D and 3-D windows are the same code (the 2-D ops lower exactly as they always have).
ConvTranspose is tinygrad's formulation: the input's zero insertion (reshape -> pad -> reshape ->
shrink), a pad (or shrink) of ``d*(k-1) - pad`` per side, then a stride-1 Conv with the grouped
weight transposed and flipped -- still one contraction, which the CPU packed path finds.

Op names: ``Conv1D``/``Conv2D``/``Conv3D`` fix the spatial rank, ``ConvND`` (the ``conv`` alias)
takes it from the input's rank; ``MaxPool``/``AvgPool`` take it from the kernel (an int kernel is
2-D), ``MaxPool1D``/``MaxPool2D``/``MaxPool3D`` (and ``AvgPool*``) fix it; ``ConvTranspose`` takes it
from the input's rank. ``padding`` is an int, one value per spatial axis, or two per axis in the
order ``[a1_begin, a1_end, a2_begin, a2_end, ...]`` (2-D: ``[top, bottom, left, right]``).
"""
from __future__ import annotations

import math
from typing import Any

from kumiko import dtypes
from kumiko.frontend.lower import Ctx, ew, one_input, op, same_dtype
from kumiko.frontend.lower_nn import _numeric
from kumiko.symbolic import Expr, dim


def _ints(ctx: Ctx, key: str, default: Any, n: int, minimum: int = 1) -> tuple:
    """A window attribute (kernel, stride, dilation): an int or ``n`` ints, each >= ``minimum``. A zero
    or negative one has no meaning (a 0 kernel pools nothing: -inf or nan; stride 0 never advances)."""
    v = ctx.attr(key, default)
    v = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else tuple(v) if isinstance(v, (list, tuple)) \
        else ()
    if len(v) != n or not all(isinstance(e, int) and not isinstance(e, bool) for e in v):
        raise ctx.err("E1010", f"{key} must be an int or {n} ints, got {ctx.attr(key)!r}")
    if any(e < minimum for e in v):
        raise ctx.err("E1010", f"{key} must be >= {minimum}, got {list(v)}")
    return v


def _padding(ctx: Ctx, n: int, signed: bool = False) -> tuple:
    """``padding``: an int, ``n`` ints (both sides) or ``2n`` ints ``[a1_begin, a1_end, ...]`` ->
    ``((begin, end), ...)`` per spatial axis (>= 0 unless ``signed``: ConvTranspose's may be negative)."""
    p = ctx.attr("padding", 0)
    p = (p,) * 2 * n if isinstance(p, int) and not isinstance(p, bool) else tuple(p) \
        if isinstance(p, (list, tuple)) else (p,)
    if len(p) == n:
        p = tuple(e for v in p for e in (v, v))
    if len(p) != 2 * n or not all(isinstance(e, int) and not isinstance(e, bool) and (signed or e >= 0) for e in p):
        form = "[ph, pw] or [top, bottom, left, right]" if n == 2 else f"{n} or {2 * n} ints"
        raise ctx.err("E1010", f"padding must be an int, {form}{'' if signed else ' >= 0'}, got {p!r}")
    return tuple((p[2 * a], p[2 * a + 1]) for a in range(n))


def windows(ctx: Ctx, x: str, kernel: tuple, stride: tuple, dilation: tuple, out: tuple) -> str:
    """The sliding-window VIEW ``[..., I1..In] -> [..., O1..On, K1..Kn]`` (affine: ``s*o + d*k``)."""
    shape = ctx.shape(x)
    n = len(kernel)
    lead = len(shape) - n
    rs = shape[:lead] + tuple(out) + tuple(kernel)
    i = [Expr.sym(f"i{k}") for k in range(len(rs))]
    imap = i[:lead] + [stride[a] * i[lead + a] + dilation[a] * i[lead + n + a] for a in range(n)]
    return ctx.b.add("VIEW", [x], result_shape=rs, index_map=imap)


def _out_size(size: Any, lo: int, hi: int, k: Any, s: int, d: int) -> Any:
    return dim((Expr.lift(size) + lo + hi - d * (Expr.lift(k) - 1) - 1).floordiv(s) + 1)


def _spatial_rank(ctx: Ctx, fixed: int | None, rank: int, what: str) -> int:
    n = fixed if fixed is not None else rank - 2
    if rank != n + 2 or n < 1:
        want = f"[N, C, {', '.join(f'I{a + 1}' for a in range(n))}]" if fixed else "[N, C, I1, ...] (rank >= 3)"
        raise ctx.err("E1011", f"{ctx.node.op} takes x {want} and {what}; got rank {rank}")
    return n


def _groups(ctx: Ctx) -> int:
    g = ctx.attr("groups", 1, int)
    if isinstance(g, bool) or g < 1:
        raise ctx.err("E1010", f"groups must be an int >= 1, got {g!r}")
    return g


def _grouped(ctx: Ctx, total: Any, g: int, what: str) -> Any:
    per = Expr.lift(total).exact_div(g)
    if per is None:
        raise ctx.err("E1011", f"{what} {total} are not divisible by groups ({g})")
    return dim(per)


def _bias(ctx: Ctx, y: str, bias: str, acc: dtypes.DType, last: bool = False) -> str:
    b = ctx.b
    shape = ctx.shape(y)
    cout = shape[-1 if last else 1]
    if ctx.shape(bias) != (cout,):
        raise ctx.err("E1011", f"bias must have shape [{cout}], got {[str(d) for d in ctx.shape(bias)]}")
    lift = (1,) * (len(shape) - 1) + (cout,) if last else (1, cout) + (1,) * (len(shape) - 2)
    return b.add("ADD", [y, b.expand(b.reshape(b.cast(bias, acc), lift), shape)])


def _conv(ctx: Ctx, x: str, w: str, stride: tuple, dil: tuple, pads: tuple, g: int, acc: dtypes.DType,
          x_last: bool = False, y_last: bool = False) -> str:
    """The grouped convolution ``[N, C, I...] * [Cout, C/g, K...] -> [N, Cout, O...]`` in ``acc``; ``x_last``:
    x is channels-last ``[N, I..., C]``, ``y_last``: the result is ``[N, O..., Cout]``."""
    b = ctx.b
    if x_last:
        x = _channels_first(ctx, x)
    xs, ws = ctx.shape(x), ctx.shape(w)
    n, cin_total, sizes = xs[0], xs[1], xs[2:]
    cout, cin, kernel = ws[0], ws[1], ws[2:]
    ns = len(kernel)
    if any(isinstance(k, int) and k < 1 for k in kernel):
        raise ctx.err("E1010", f"the kernel {'x'.join(map(str, kernel))} is empty: the weight's spatial sizes "
                      "must be >= 1")
    if dim(Expr.lift(cin) * g) != cin_total:
        raise ctx.err("E1011", f"input channels {cin_total} != groups ({g}) x weight's Cin ({cin})")
    rcout = _grouped(ctx, cout, g, "output channels")
    out = tuple(_out_size(sizes[a], pads[a][0], pads[a][1], kernel[a], stride[a], dil[a]) for a in range(ns))
    if any(isinstance(o, int) and o <= 0 for o in out):
        raise ctx.err("E1011", f"the kernel does not fit: output size would be {' x '.join(map(str, out))}")
    xp = b.pad(x, [(0, 0), (0, 0), *pads])
    xw = windows(ctx, xp, tuple(kernel), stride, dil, out)
    x1 = b.reshape(xw, (n, g, cin, 1, *out, *kernel))
    x2 = b.expand(x1, (n, g, cin, rcout, *out, *kernel))
    x3 = b.permute(x2, (0, 1, 3, *range(4, 4 + ns), 2, *range(4 + ns, 4 + 2 * ns)))
    full = (n, g, rcout, *out, cin, *kernel)
    w3 = b.expand(b.reshape(w, (1, g, rcout, *(1,) * ns, cin, *kernel)), full)
    if y_last or x_last:
        # y_last: the output axes in the order [N, O..., G, Cout/G] (the reduction's result is channels-last);
        # x_last: the reduced axes in the order [K..., Cin/G], so that K runs along each pixel's channels
        # (contiguous channels-last) in the contraction, not from tap to tap
        outer = (0, *range(3, 3 + ns), 1, 2) if y_last else (0, 1, 2, *range(3, 3 + ns))
        red = (*range(4 + ns, 4 + 2 * ns), 3 + ns) if x_last else tuple(range(3 + ns, 4 + 2 * ns))
        x3, w3 = b.permute(x3, outer + red), b.permute(w3, outer + red)
    y = b.reduce(b.add("MUL", [x3, w3]), "SUM", range(3 + ns, 4 + 2 * ns), acc)
    return b.reshape(y, (n, *out, cout) if y_last else (n, cout, *out))


def _conv_inputs(ctx: Ctx, args: list, name: str) -> tuple[str, str, dtypes.DType]:
    if len(args) not in (2, 3) or not all(isinstance(a, str) for a in args):
        raise ctx.err("E1009", f"{name} takes inputs [x, weight] or [x, weight, bias]")
    x, w = args[:2]
    dt = _numeric(ctx, x)
    same_dtype(ctx, [x, w])
    return x, w, dt


LAYOUTS = ("channels_first", "channels_last")


def _layout(ctx: Ctx, key: str) -> bool:
    """Is the ``key`` attribute ``channels_last``? For ``x_layout`` and ``y_layout`` that is ``[N, I..., C]``,
    for ``w_layout`` ``[K..., Cin/groups, Cout]``; the default ``channels_first`` is ``[N, C, I...]`` and
    ``[Cout, Cin/groups, K...]`` (ONNX's and PyTorch's)."""
    v = ctx.attr(key, "channels_first", str)
    if v not in LAYOUTS:
        raise ctx.err("E1010", f"{key} must be one of {list(LAYOUTS)}, got {v!r}")
    return v == "channels_last"


def _channels_first(ctx: Ctx, x: str) -> str:
    """A channels-last ``[N, I..., C]`` as the view ``[N, C, I...]``."""
    r = len(ctx.shape(x))
    return ctx.b.permute(x, (0, r - 1, *range(1, r - 1)))


def _make_conv(fixed: int | None):
    def lower(ctx: Ctx, args: list) -> str:
        x, w, dt = _conv_inputs(ctx, args, ctx.node.op)
        x_last, y_last = _layout(ctx, "x_layout"), _layout(ctx, "y_layout")
        if _layout(ctx, "w_layout"):       # [K..., Cin/groups, Cout] (TensorFlow's HWIO) as [Cout, Cin/groups, K...]
            r = len(ctx.shape(w))
            w = ctx.b.permute(w, (r - 1, r - 2, *range(r - 2)))
        xs, ws = ctx.shape(x), ctx.shape(w)
        n = _spatial_rank(ctx, fixed, len(xs), "weight [Cout, Cin/groups, K...] of the same rank")
        if len(ws) != len(xs):
            raise ctx.err("E1011", f"{ctx.node.op} takes x [N, C, I...] and weight [Cout, Cin/groups, K...] of the "
                          f"same rank; got ranks {len(xs)} and {len(ws)}")
        stride, dil = _ints(ctx, "stride", 1, n), _ints(ctx, "dilation", 1, n)
        pads = _padding(ctx, n)
        acc = ctx.acc_dtype(dt)
        y = _conv(ctx, x, w, stride, dil, pads, _groups(ctx), acc, x_last, y_last)
        if len(args) == 3:
            y = _bias(ctx, y, args[2], acc, y_last)
        return ctx.b.cast(y, ctx.dtype_attr("out_dtype", dt))
    return lower


for _n, _name in ((1, "Conv1D"), (2, "Conv2D"), (3, "Conv3D"), (None, "ConvND")):
    op(_name)(_make_conv(_n))


@op("ConvTranspose")
def lower_conv_transpose(ctx: Ctx, args: list) -> str:
    """``y[n, g*Co/g + co, o] = sum_{ci, k} x[n, g*Ci/g + ci, i] * w[g*Ci/g + ci, co, k]`` where
    ``o = s*i + d*k - pad_begin``; weight [Cin, Cout/groups, K...]; ``output_padding`` (< stride or
    dilation) adds to the end. Negative padding extends the output (ONNX's output_shape can ask it)."""
    b = ctx.b
    x, w, dt = _conv_inputs(ctx, args, "ConvTranspose")
    xs, ws = ctx.shape(x), ctx.shape(w)
    n = _spatial_rank(ctx, None, len(xs), "weight [Cin, Cout/groups, K...] of the same rank")
    if len(ws) != len(xs):
        raise ctx.err("E1011", f"ConvTranspose takes x [N, Cin, I...] and weight [Cin, Cout/groups, K...] of the "
                      f"same rank; got ranks {len(xs)} and {len(ws)}")
    stride, dil = _ints(ctx, "stride", 1, n), _ints(ctx, "dilation", 1, n)
    extra = _ints(ctx, "output_padding", 0, n, minimum=0)
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dil)):
        raise ctx.err("E1010", f"output_padding {list(extra)} must be smaller than the stride {list(stride)} or the "
                      f"dilation {list(dil)} on each axis")
    pads = _padding(ctx, n, signed=True)
    g = _groups(ctx)
    cin, rcout, kernel = ws[0], ws[1], ws[2:]
    if cin != xs[1]:
        raise ctx.err("E1011", f"input channels {xs[1]} != the weight's Cin ({cin})")
    if not all(isinstance(k, int) and k >= 1 for k in kernel):
        raise ctx.err("E1010", f"ConvTranspose needs a static kernel of sizes >= 1, got {list(kernel)}")
    rcin = _grouped(ctx, cin, g, "input channels")
    # the weight as a Conv's: [g, Ci/g, Co/g, K...] -> [g, Co/g, Ci/g, K...] -> [Cout, Ci/g, K...], flipped
    wc = b.reshape(w, (g, rcin, rcout, *kernel))
    wc = b.permute(wc, (0, 2, 1, *range(3, 3 + n)))
    wc = b.flip(b.reshape(wc, (dim(Expr.lift(rcout) * g), rcin, *kernel)), range(2, 2 + n))
    sizes = xs[2:]
    if any(s > 1 for s in stride):     # zero insertion: [I] -> [I, 1] -> pad -> [I, s] -> [I*s] -> [(I-1)*s+1]
        x = b.reshape(x, (*xs[:2], *(e for sz in sizes for e in (sz, 1))))
        x = b.pad(x, [(0, 0), (0, 0), *(p for s in stride for p in ((0, 0), (0, s - 1)))])
        x = b.reshape(x, (*xs[:2], *(dim(Expr.lift(sz) * s) for sz, s in zip(sizes, stride))))
        sizes = tuple(dim((Expr.lift(sz) - 1) * s + 1) for sz, s in zip(sizes, stride))
        x = b.shrink(x, (0,) * len(xs), (*xs[:2], *sizes))
    edge = [(d * (k - 1) - lo, d * (k - 1) - hi + e) for k, d, (lo, hi), e in zip(kernel, dil, pads, extra)]
    out = [dim(Expr.lift(sz) + a + c - d * (k - 1)) for sz, (a, c), k, d in zip(sizes, edge, kernel, dil)]
    if any(isinstance(o, int) and o <= 0 for o in out):
        raise ctx.err("E1011", f"the padding leaves no output: output size would be {' x '.join(map(str, out))}")
    cut = any(a < 0 or c < 0 for a, c in edge)
    if cut:
        x = b.shrink(x, (0, 0, *(max(0, -a) for a, _ in edge)),
                     (*xs[:2], *(dim(Expr.lift(sz) + min(0, c)) for sz, (_, c) in zip(sizes, edge))))
    acc = ctx.acc_dtype(dt)
    y = _conv(ctx, x, wc, (1,) * n, dil, tuple((max(0, a), max(0, c)) for a, c in edge), g, acc)
    if len(args) == 3:
        y = _bias(ctx, y, args[2], acc)
    return b.cast(y, ctx.dtype_attr("out_dtype", dt))


# ------------------------------------------------------------------------------------------------
# pooling

_POOL_RANK = {"MaxPool1D": 1, "MaxPool2D": 2, "MaxPool3D": 3, "AvgPool1D": 1, "AvgPool2D": 2, "AvgPool3D": 3}


def _pool_geometry(ctx: Ctx, x: str):
    shape = ctx.shape(x)
    k = ctx.attr("kernel")
    if k is None:
        raise ctx.err("E1010", f"{ctx.node.op} needs a 'kernel' size")
    n = _POOL_RANK.get(ctx.node.op, len(k) if isinstance(k, (list, tuple)) and k else 2)
    if len(shape) < n + 1 and isinstance(k, (list, tuple)) and ctx.node.op not in _POOL_RANK:
        raise ctx.err("E1010", f"kernel {list(k)} gives {n} window axes, but the input "
                      f"{[str(d) for d in shape]} has at most {len(shape) - 1} after a leading axis")
    if len(shape) < n + 1:
        axes = ", ".join(("H", "W") if n == 2 else [f"I{a + 1}" for a in range(n)])
        raise ctx.err("E1011", f"{ctx.node.op} needs [..., {axes}] with at least one leading axis")
    kernel = _ints(ctx, "kernel", None, n)
    stride = _ints(ctx, "stride", list(kernel), n) if ctx.attr("stride") is not None else kernel
    dil = _ints(ctx, "dilation", 1, n)
    pads = _padding(ctx, n)
    ceil = bool(ctx.attr("ceil_mode", False))
    out, extra = [], []
    for ax in range(n):
        size, (lo, hi), k, s, d = shape[-n + ax], pads[ax], kernel[ax], stride[ax], dil[ax]
        if max(lo, hi) >= d * (k - 1) + 1:
            # kumiko's rule (docs/frontend.md): a pad must be smaller than the window's extent, so an
            # undilated window always holds an input element (ONNX allows e.g. pads 2 for a 3 kernel,
            # which PyTorch's pad <= kernel//2 would refuse); a window of padding alone is -inf / nan
            raise ctx.err("E1010", f"padding {max(lo, hi)} on axis {ax - n} is not smaller than the window extent "
                          f"{d * (k - 1) + 1} (kernel {k}, dilation {d}): a window could hold only padding",
                          suggestion="use a padding below the kernel size, or a larger kernel")
        if ceil:
            if not isinstance(size, int):
                raise ctx.err("E1010", "ceil_mode needs concrete spatial sizes")
            span = size + lo + hi - d * (k - 1) - 1
            o = -(-span // s) + 1
            if (o - 1) * s >= size + lo:   # PyTorch: the last window must start inside the input or left pad
                o -= 1
            extra.append(max(0, (o - 1) * s + d * (k - 1) + 1 - (size + lo + hi)))
        else:
            o = _out_size(size, lo, hi, k, s, d)
            extra.append(0)
        if isinstance(o, int) and o <= 0:
            raise ctx.err("E1011", f"the pooling window does not fit axis {ax - n} (size {size})")
        out.append(o)
    return shape, kernel, stride, dil, pads, extra, tuple(out)


def _pool_input(ctx: Ctx, x: str) -> tuple[str, bool]:
    """A pool's input as ``[..., C, I...]`` and whether its ``layout`` is ``channels_last`` (x and the result
    ``[N, I..., C]``: the window axes pooled are the ones before the last)."""
    last = _layout(ctx, "layout")
    if last:
        if len(ctx.shape(x)) < 3:
            raise ctx.err("E1011", f"a channels_last {ctx.node.op} takes [N, I..., C]; got rank {len(ctx.shape(x))}")
        x = _channels_first(ctx, x)
    return x, last


def _windows_last(ctx: Ctx, xw: str, n: int, last: bool) -> str:
    """The window view ``[N, C, O..., K...]`` as ``[N, O..., C, K...]`` when channels-last (the reduction's
    result then is)."""
    if not last:
        return xw
    return ctx.b.permute(xw, (0, *range(2, 2 + n), 1, *range(2 + n, 2 + 2 * n)))


@op("MaxPool", "MaxPool1D", "MaxPool2D", "MaxPool3D")
def lower_maxpool(ctx: Ctx, args: list) -> str:
    x, last = _pool_input(ctx, one_input(ctx, args))
    dt = _numeric(ctx, x)
    shape, kernel, stride, dil, pads, extra, out = _pool_geometry(ctx, x)
    n = len(kernel)
    lead = [(0, 0)] * (len(shape) - n)
    low = dtypes.neutral("MAX", dt).item()
    xp = ctx.b.pad(x, lead + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)], low)
    xw = _windows_last(ctx, windows(ctx, xp, kernel, stride, dil, out), n, last)
    r = len(ctx.shape(xw))
    return ctx.b.reduce(xw, "MAX", range(r - n, r), dt)


@op("AvgPool", "AvgPool1D", "AvgPool2D", "AvgPool3D")
def lower_avgpool(ctx: Ctx, args: list) -> str:
    """Window sums over the window's element count; the count follows ``count_include_pad`` (default
    true, as PyTorch and tinygrad) and never includes ceil_mode's overflow (PyTorch semantics)."""
    x, last = _pool_input(ctx, one_input(ctx, args))
    dt = _numeric(ctx, x)
    if not dt.is_float:
        raise ctx.err("E1012", f"AvgPool needs a float input, got {dt}")
    b = ctx.b
    shape, kernel, stride, dil, pads, extra, out = _pool_geometry(ctx, x)
    n = len(kernel)
    include = bool(ctx.attr("count_include_pad", True))
    acc = ctx.acc_dtype(dt)
    lead = [(0, 0)] * (len(shape) - n)
    full = [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    xw = _windows_last(ctx, windows(ctx, b.pad(x, lead + full), kernel, stride, dil, out), n, last)
    r = len(ctx.shape(xw))
    s = b.reduce(xw, "SUM", range(r - n, r), acc)
    if include and not any(extra) or not any(p for pair in pads for p in pair) and not any(extra):
        return b.cast(ew(ctx, "FDIV", s, float(math.prod(kernel))), dt)
    # the per-window element count, from an indicator of what counts (ones), pooled the same way
    ones = b.const(1.0, acc, shape[-n:])
    if include:
        ones = b.pad(ones, list(pads), 1.0)
        ones = b.pad(ones, [(0, e) for e in extra], 0.0)
    else:
        ones = b.pad(ones, full, 0.0)
    cnt = b.reduce(windows(ctx, ones, kernel, stride, dil, out), "SUM", range(n, 2 * n), acc)
    if last:            # [O...] against [N, O..., C]: the counts before the channels
        cnt = b.reshape(cnt, (*out, 1))
    return b.cast(b.add("FDIV", [s, b.broadcast_to(cnt, ctx.shape(s))]), dt)
