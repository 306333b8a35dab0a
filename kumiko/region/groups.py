"""Group axes: an output axis that one operand of a contraction reads only in whole groups, made two axes.

A grouped convolution ``y[n, co, p] = sum_{ci, t} x[n, G*floor(co/G) + ci, p + t] * w[co, ci, t]`` (8 groups of
8 channels: ``G = 8``) is no contraction as region formation writes it: its output channel ``co`` is read by
both operands, so ``find_contraction`` sees a batch axis and no N, and the region ran as a loop nest (one
output channel per pass over its inputs: each input value read once per channel). Writing ``co = G*g + c``
(``g`` < groups, ``c`` < G) makes ``floor(co/G)`` the plain ``g``: ``g`` is read by both operands (a batch
axis, as a batched matmul's) and ``c`` by the weights only (N), and the region is the group-batched GEMM
the packed micro-kernel runs.

``split_groups`` does that rewrite where, and only where, it turns a region without a contraction into one
with it. The region's iters are its outputs' axes, so the outputs are written through views whose dimension
of ``co`` is split in two: ``[N, 64, H, W]`` as ``[N, 8, 8, H, W]``, the same row-major memory (the program's
buffers keep their shapes; a later region reads them as before)."""
from __future__ import annotations

from dataclasses import replace

from kumiko.region.analysis import analyze
from kumiko.region.srnf import map_lets, map_nodes
from kumiko.region.ssa import Axis, BroadcastInDim, Gather, Guard, Program, Read, Region, RExpr, Select, Transpose
from kumiko.symbolic import Expr, FloorDiv, iter_ranges, prod, simplify

#: the smallest group the split pays for (2-core Zen 3, bound weights, NCHW; time split / loop nest, median of
#: 16 alternating rounds): N output channels and K = input channels x taps of one group. 8 groups of 8 -> 8 3x3
#: at 56x56 0.57, ResNeXt's 32 groups of 4 to 32 channels 0.43-0.79, a 1x1 with 8 groups of 24 0.45, 16 groups
#: of 8 3x3 at 28x28 0.49; but 2 output channels a group (K 9 or 18) 1.17-1.23, a depthwise conv with 4
#: outputs per channel (K 9) 0.97, a 1x1 with 16 groups of 4 (K 4) 1.21: the micro-kernel's rows and K
#: steps are mostly padding there
MIN_GROUP_N = 4
MIN_GROUP_K = 16


def _floor_dens(e: Expr, axis: str, out: set) -> None:
    """The divisors ``q`` of every ``floor(num/q)`` in ``e`` whose numerator holds ``axis``."""
    for m, _ in e.terms:
        for a in m:
            if isinstance(a, FloorDiv):
                if axis in a.num.symbols():
                    out.add(a.den)
                _floor_dens(a.num, axis, out)


def _indices(e: RExpr, out: list) -> RExpr:
    if isinstance(e, (Read, Gather)):
        out.extend(Expr.lift(i) for i in e.index)
    elif isinstance(e, Select) and isinstance(e.pred, Guard):
        out.extend(Expr.lift(c) for c, _ in e.pred.constraints)
    return e


def _candidates(r: Region) -> list[tuple[str, int]]:
    """(iter, G) pairs: an iter of constant size S read through ``floor(.../G)``, 1 < G < S, G | S."""
    exprs: list = []
    for let in r.lets:
        map_nodes(let.expr, lambda e: _indices(e, exprs))
    out = []
    for a in r.iters:
        if not isinstance(a.size, int):
            continue
        dens: set = set()
        for e in exprs:
            _floor_dens(e, a.name, dens)
        out += [(a.name, q) for q in sorted(dens, reverse=True) if 1 < q < a.size and a.size % q == 0]
    return out


def split_axis(r: Region, axis: str, q: int) -> Region | None:
    """``r`` with its iter ``axis`` (size S) written as ``q*axis_g + axis_c`` over two iters of sizes S/q and q,
    and its outputs as views with that dimension split; None where the region cannot say it (a Transpose
    over its axes, an output whose rank is not the iters')."""
    k = next(i for i, a in enumerate(r.iters) if a.name == axis)
    size = r.iters[k].size
    names = {a.name for a in r.iters}
    hi, lo = f"{axis}_g", f"{axis}_c"
    if hi in names or lo in names:
        return None
    if any(len(o.memref.shape) != len(r.iters) or o.memref.shape[k] != size for o in r.outputs):
        return None
    iters = r.iters[:k] + (Axis(hi, size // q), Axis(lo, q)) + r.iters[k + 1:]
    sizes = {a.name: a.size for a in iters}
    env = {axis: Expr.sym(hi) * q + Expr.sym(lo)}
    ranges = iter_ranges(sizes)
    bad = []

    def ix(e) -> Expr:
        e = Expr.lift(e)
        if axis not in e.symbols():
            return e
        return simplify(e.subs(env), ranges)

    def f(e: RExpr) -> RExpr:
        if isinstance(e, (Read, Gather)):        # a flat Read's one linear offset too
            return replace(e, index=tuple(ix(i) for i in e.index))
        if isinstance(e, Select) and isinstance(e.pred, Guard):
            return replace(e, pred=Guard(tuple((ix(c), op) for c, op in e.pred.constraints)))
        if isinstance(e, BroadcastInDim) and axis in e.axes:
            j = e.axes.index(axis)
            return replace(e, axes=e.axes[:j] + (hi, lo) + e.axes[j + 1:])
        if isinstance(e, Transpose):
            bad.append(e)
        return e

    mapped = map_lets(r, f)
    if bad:
        return None
    outs = tuple(replace(o, memref=replace(o.memref, shape=o.memref.shape[:k] + (size // q, q)
                                           + o.memref.shape[k + 1:])) for o in r.outputs)
    note = f"{axis} = {q}*{hi} + {lo}: read in groups of {q} (floor({axis}/{q})), a batch axis of the contraction"
    return replace(mapped, iters=iters, outputs=outs, notes=r.notes + (note,))


def _pays(facts) -> bool:
    """Does the group-batched GEMM beat the loop nest? Where each group's N (its output channels) and K
    (input channels x taps) are large enough: ``MIN_GROUP_N``, ``MIN_GROUP_K``."""
    c = facts.contraction
    n = Expr.lift(prod([facts.sizes[a] for a in c.n_axes])).as_int()
    k = Expr.lift(prod([a.size for a in c.k_axes])).as_int()
    return n is not None and k is not None and n >= MIN_GROUP_N and k >= MIN_GROUP_K


def split_group(r: Region) -> Region:
    """``r`` with its first group axis split where that makes it a contraction (``split_axis``) that pays
    (``_pays``), else ``r``."""
    cands = _candidates(r)
    if not cands or analyze(r).contraction is not None:
        return r
    for axis, q in cands:
        s = split_axis(r, axis, q)
        if s is None:
            continue
        facts = analyze(s)
        if facts.contraction is not None and _pays(facts):
            return s
    return r


def split_groups(p: Program) -> Program:
    """Every region of ``p`` through ``split_group``."""
    regions = tuple(split_group(r) for r in p.regions)
    return p if all(a is b for a, b in zip(regions, p.regions)) else replace(p, regions=regions)
