"""The emitter every region lowering shares: a region's expressions as C at one point.

``RegionEmitter`` holds what any lowering of one region needs - the region's facts
(``kumiko.region.analysis``: typed lets, sizes, loop order) in copies it may extend, the C names of its
MemRefs, where each let lives (``storage``), the reduce axes in scope - and turns an expression into C
statements and a value (``expr``): reads at their offsets, data-dependent gathers with their range check,
guarded selects as ``if`` blocks, reductions as loops, and the store of the yielded value. It speaks the
target-neutral names (``kk_h2f``, ``kk_fdiv``, ...) that each renderer binds.

Two lowerings build on it: ``kumiko.kernel.lower_cpu.CpuLowering`` (loop nests, vector lanes, and the CPU's
own math: ``kumiko_cpu.h``'s exp2) and ``kumiko.kernel.gpu_simt.SimtLowering`` (a thread or a warp per row);
the MMA skeleton (``kumiko.kernel.gpu_mma``) uses it as it is for its operands' gathers and its epilogue.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Assign, Block, Decl, If, Store, axis_loop
from kumiko.region.analysis import Contraction, RegionFacts, analyze, unit_iters
from kumiko.region.ssa import (
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Gather,
    Guard,
    Read,
    Reduce,
    Ref,
    Region,
    RExpr,
    Select,
    Transpose,
    Unary,
)
from kumiko.symbolic import Expr, prod

#: an operand that needs no local of its own: a name or a number literal (``1.0f``, ``-1.0f``, ``1e-05f``)
_SIMPLE = re.compile(r"[A-Za-z_]\w*|\(?-?[0-9][0-9.e+-]*f?\)?")


@dataclass
class Interior:
    """A loop body emitted a second time for the points where its guards hold throughout (a conv window's
    padding checks away from the border): ``enclosing`` are the loop indices fixed where the copy's test
    runs; ``assumed`` collects the constraints (each at its weakest point, ``>= 0``) the copy dropped, whose
    conjunction is that test (``CpuLowering._interior_split``)."""
    enclosing: frozenset
    assumed: list = field(default_factory=list)


class RegionEmitter:
    """C for one region's expressions; its facts come from ``facts`` (``analyze(region)`` when not given),
    copied: a lowering extends them (reduce axes as sizes, lets of its own)."""

    #: how the target spells a fused multiply-add for a sum of products (``reduce_step``); None: a plain add
    #: (the GPU emitters, whose nvcc fuses on its own)
    FMA: str | None = None
    #: the max or min of a value and +0 as the CPU header's masks (``cexpr.binary``'s ``zero_masks``)
    ZERO_MASKS = False

    def __init__(self, region: Region, syms: tuple, name: str, facts: RegionFacts | None = None):
        self.facts = facts if facts is not None else analyze(region)
        self.r, self.types = self.facts.region, dict(self.facts.types)
        self.syms = syms
        self.name = name
        self.sizes = dict(self.facts.sizes)
        self.extent: dict = {}                   # axis -> loop trip count when it differs from its size
        self.iters = list(self.facts.iters)
        self.memrefs = dict(self.facts.memrefs)
        self.cname = {n: f"b{k}" for k, n in enumerate(list(self.memrefs))}
        self.ty = self.facts.typer()
        self.n_tmp = 0
        self.storage: dict[str, tuple] = {}      # let -> ("scalar", var) | ("array", var, axes)
        self.red_axes: list = []                 # reduce axes (and gather vars) in scope while emitting
        self.red_trip: dict = {}                 # reduce axis -> its trip count (set as a reduction is entered)
        self.interior: Interior | None = None    # emitting a loop body's guard-free interior copy (``Interior``)
        self.uses_gather = False                 # the kernel checks data-dependent indices (kk_bad)
        self.reversed_reduce = False             # a scalar reduction reads backwards (Kernel.no_loop_vectorize)

    def unit_decls(self, c: Contraction) -> list:
        """``const long long a = 0`` for each size-1 iter that is none of ``c``'s batch, M or N axes
        (``region.analysis.unit_iters``): an operand or the epilogue may read it."""
        return [Decl("const long long", a, "0") for a in unit_iters(self.facts, c)]

    def trip(self, axis: str, size=None):
        """How far the loops over ``axis`` run: its size, unless ``extent`` cuts them short (a caller that
        computes a prefix of the axis; array strides keep using ``sizes``)."""
        return self.extent.get(axis, self.sizes[axis] if size is None else size)

    def tmp(self) -> str:
        self.n_tmp += 1
        return f"t{self.n_tmp}"

    def ctype(self, e: RExpr) -> str:
        t = self.ty.type_of(e)[1]
        return C.COMPUTE[t.dtype.name] if t is not None else "float"

    def dt(self, e: RExpr) -> dtypes.DType | None:
        t = self.ty.type_of(e)[1]
        return t.dtype if t is not None else None

    def axes_in_scope(self) -> set:
        return set(self.iters) | set(self.red_axes)

    def unary(self, fn: str, x: str, ct: str) -> str:
        """``fn`` of the C value ``x`` of compute type ``ct``: the target-neutral math (``cexpr.unary``)."""
        return C.unary(fn, x, ct)

    def expr(self, e: RExpr, out: list, hint: dtypes.DType | None = None) -> str:  # noqa: C901
        if isinstance(e, Const):
            return C.literal(e.value, e.dtype or hint)
        if isinstance(e, Ref):
            kind = self.storage[e.name]
            if kind[0] == "scalar":
                return kind[1]
            return f"{kind[1]}[{self.scratch_offset(kind[2])}]"
        if isinstance(e, Read):
            m = self.memrefs[e.tensor]
            off_e = Expr.lift(e.index[0]) if e.flat else C.offset_expr(e.index, m.shape)
            strides = [C.stride(off_e, a) for a in self.red_axes if a in off_e.symbols()]
            if any(k is None or k < 0 for k in strides):   # backwards, or through a floor division
                self.reversed_reduce = True
            return C.load(self.cname[e.tensor], C.index(off_e, self.axes_in_scope()), m.dtype)
        if isinstance(e, Gather):
            by = self.expr(e.by, out)
            var = e.var
            out.append(Decl("long long", var, f"(long long)({by})"))
            self.red_axes.append(var)
            m = self.memrefs[e.tensor]
            off = C.offset(e.index, m.shape, self.axes_in_scope())
            total = C.index(prod(m.shape) if m.shape else 1, set())
            # a data-dependent index is checked: out of range sets the kernel's error flag, reads element 0
            out.append(If(f"({off}) < 0 || ({off}) >= {total}", (Assign("kk_bad", "1"), Assign(var, "0"))))
            v = C.load(self.cname[e.tensor], off, m.dtype)
            self.red_axes.remove(var)
            self.uses_gather = True
            return v
        if isinstance(e, Unary):
            return self.unary(e.fn, self.expr(e.x, out), self.ctype(e))
        if isinstance(e, Cast):
            src = self.dt(e.x)
            return C.cast(self.expr(e.x, out), src or e.to, e.to)
        if isinstance(e, Binary):
            hint2 = self.dt(e.x) or self.dt(e.y)
            a, b = self.expr(e.x, out, hint2), self.expr(e.y, out, hint2)
            return C.binary(e.fn, a, b, C.COMPUTE[hint2.name] if hint2 else "float", self.ZERO_MASKS)
        if isinstance(e, (BroadcastInDim, Transpose)):
            return self.expr(e.operand, out, hint)
        if isinstance(e, Select):
            return self.select(e, out, hint)
        if isinstance(e, Reduce):
            return self.reduce(e, out)
        raise TypeError(e)

    def assume_interior(self, cons) -> list:
        """``cons`` (a guard's (affine expression, "ge" | "eq") constraints) less those the interior being
        emitted assumes (``Interior``): each ``c >= 0`` whose symbols are the loop indices the interior's test
        sees, size symbols and reduce axes in scope with a constant coefficient. Its weakest point over those
        axes' ranges (``c`` at the corner where it is smallest) joins the interior's test instead."""
        ctx = self.interior
        if ctx is None:
            return list(cons)
        keep = []
        for c, op in cons:
            corner: dict = {}
            ok = op == "ge"
            for a in Expr.lift(c).symbols() if ok else ():
                if a in ctx.enclosing:
                    continue
                if a in self.red_axes and a in self.red_trip:
                    k = C.stride(Expr.lift(c), a)
                    if k is None:
                        ok = False
                        break
                    corner[a] = Expr.lift(self.red_trip[a]) - 1 if k < 0 else 0
                elif a in self.red_axes or a in self.iters:     # a gather's variable, a loop inside the test
                    ok = False
                    break
            if not ok:
                keep.append((c, op))
                continue
            w = Expr.lift(c).subs(corner) if corner else Expr.lift(c)
            if w not in ctx.assumed:
                ctx.assumed.append(w)
        return keep

    def select(self, e: Select, out: list, hint) -> str:
        ct = self.ctype(e)
        dt = self.dt(e) or hint
        if isinstance(e.pred, Guard) and not (cons := self.assume_interior(e.pred.constraints)):
            return self.expr(e.then, out, dt)
        v = self.tmp()
        if isinstance(e.pred, Guard):
            cond = " && ".join(f"({C.index(c, self.axes_in_scope())} {'>=' if op == 'ge' else '=='} 0)"
                               for c, op in cons)
            then: list = []
            tv = self.expr(e.then, then, dt)
            other: list = []
            ov = self.expr(e.other, other, dt)
            out.append(Decl(ct, v))
            out.append(If(cond, tuple(then) + (Assign(v, tv),), tuple(other) + (Assign(v, ov),)))
            return v
        p = self.expr(e.pred, out)
        tv, ov = self.expr(e.then, out, dt), self.expr(e.other, out, dt)
        if ct in ("float", "double"):
            # both sides into locals first (floats do not trap; a value predicate guards no index): a load inside
            # the ternary is a conditional load, and gcc 12.2's loop vectorizer made it a masked load with the
            # wrong stride across an outer loop's rows at -O3 (where(y < 0, x, -1) over 2 x 4 read x[1, j] from
            # x[0, j + 2]: a wrong answer a random-graph test found; the plain loads vectorise correctly)
            tv, ov = self._local(tv, ct, out), self._local(ov, ct, out)
        out.append(Decl(ct, v, f"({p}) ? ({tv}) : ({ov})"))
        return v

    def _local(self, value: str, ct: str, out: list) -> str:
        """``value`` as a local of type ``ct`` declared in ``out`` (a literal or a name as it is)."""
        if _SIMPLE.fullmatch(value):
            return value
        t = self.tmp()
        out.append(Decl(ct, t, value))
        return t

    def reduce(self, e: Reduce, out: list) -> str:
        ct = C.COMPUTE[e.dtype.name]
        acc = self.tmp()
        out.append(Decl(ct, acc, C.literal(e.init, e.dtype)))
        self.ty.add_axes(e.axes)
        self.red_trip.update({a.name: self.trip(a.name, a.size) for a in e.axes})
        for a in e.axes:
            self.red_axes.append(a.name)
        body: list = []
        upd = self.reduce_step(e, acc, body, ct)
        inner: tuple = tuple(body) + (Assign(acc, upd),)
        for a in reversed(e.axes):
            inner = (axis_loop(a.name, self.trip(a.name, a.size), inner),)
        for a in e.axes:
            self.red_axes.remove(a.name)
        out.append(Block(inner))
        return acc

    def reduce_step(self, e: Reduce, acc: str, out: list, ct: str) -> str:
        """The accumulator's next value after the element at the current point. An fp32 sum of products (a dot
        product, a conv window) is one fused multiply-add where the emitter spells one (``FMA``: the CPU's
        ``KUMIKO_FMAF``); nothing else is fused: the CPU kernels build with ``-ffp-contract=off``, so ``x -
        mean(x)`` over one element is exactly 0 as in the evaluator (with contraction gcc fused the product into
        the subtraction and left its rounding error)."""
        f = fma_factors(e, self.dt) if self.FMA else None
        if f is not None and ct == "float":
            hint = self.dt(f[0]) or self.dt(f[1])
            a, b = self.expr(f[0], out, hint), self.expr(f[1], out, hint)
            return f"{self.FMA}({a}, {b}, {acc})"
        v = self.expr(e.body, out, e.dtype)
        bt = self.dt(e.body)
        if bt is not None and bt is not e.dtype:
            v = C.cast(v, bt, e.dtype)
        return C.reduce_update(e.op, acc, v, ct)

    def scratch_expr(self, dims: tuple) -> Expr:
        return C.offset_expr(tuple(Expr.sym(a) for a in dims), tuple(self.sizes[a] for a in dims))

    def scratch_offset(self, dims: tuple) -> str:
        return C.offset(tuple(Expr.sym(a) for a in dims), tuple(self.sizes[a] for a in dims), self.axes_in_scope())

    def store(self, value: RExpr) -> list:
        """Store ``value`` (the yielded let at the current point) into every output."""
        stmts: list = []
        v = self.expr(value, stmts)
        src = self.types[self.r.yields[0].src].dtype
        for y in self.r.yields:
            m = self.memrefs[y.to]
            w = C.cast(v, src, y.cast) if y.cast is not None else v
            out_axes = tuple(a.name for a in self.r.iters)        # the MemRef's layout, not the loop order
            off = C.offset(tuple(Expr.sym(a) for a in out_axes), m.shape, set(out_axes))
            stmts.append(Store(self.cname[y.to], off, C.store_value(w, m.dtype)))
        return stmts

    def point_code(self, acc: str, var: str) -> list:
        """The region's lets but ``acc`` at one point, with ``acc`` in the C scalar ``var``, then the store:
        a contraction's epilogue (the point's axes are declared by the caller)."""
        self.storage = {acc: ("scalar", var)}
        out: list = []
        self.red_axes = []
        for let in self.r.lets:
            if let.name == acc:
                continue
            v = self.expr(let.expr, out, self.types[let.name].dtype)
            self.storage[let.name] = ("scalar", f"v_{let.name}")
            out.append(Decl(C.COMPUTE[self.types[let.name].dtype.name], f"v_{let.name}", v))
        out += self.store(Ref(self.r.yields[0].src))
        return out


def fma_factors(e: Reduce, dt) -> tuple | None:
    """The two factors of a sum whose element is a product of fp32 values (no cast between): the reductions
    whose update is a fused multiply-add. ``dt``: the lowering's dtype of an expression (None: unknown)."""
    b = e.body
    if e.op != "sum" or e.dtype != dtypes.fp32 or not isinstance(b, Binary) or b.fn != "mul":
        return None
    if any(dt(x) is not None and dt(x) != dtypes.fp32 for x in (b, b.x, b.y)):
        return None
    return b.x, b.y
