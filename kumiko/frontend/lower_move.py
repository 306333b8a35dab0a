"""Lowering of the movement ops: Reshape, Permute/Transpose, Expand, Pad, Slice/Shrink, Flip and
Concat, each a view (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP) of its input in Tiny IR (Concat: the
pieces padded to the full extent and added). Registered on ``lower.OPS`` when ``lower`` is imported."""
from __future__ import annotations

from typing import Any

from kumiko import dtypes
from kumiko.frontend.lower import Ctx, broadcast_shapes, one_input, op, same_dtype
from kumiko.symbolic import Expr, dim, dims, prod


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
