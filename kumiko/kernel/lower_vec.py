"""Vector emission for the generic CPU nest: the ``VectorEmitter`` mixin of ``CpuLowering``
(``kumiko.kernel.lower_cpu``).

An innermost loop over an axis whose every access is contiguous (or invariant) runs ``KUMIKO_VW``
points at a time with ``kumiko_cpu.h``'s ``kv_t`` lanes, then a scalar tail loop for the rest
(``for (n = 0; n < N - (VW-1); n += VW) {...} for (n = N/VW*VW; n < N; n++) {...}``):

- a let of the loop is a vector variable, or a vector store into its scratch row; values invariant in
  the axis stay scalar (computed by the scalar emitter) and are broadcast where they meet lanes;
- a reduction in scalar context whose body is contiguous along its innermost axis keeps vector
  accumulators and reduces them horizontally at the end (``kv_hsum``); max/min use the one-instruction
  ``kv_max`` and track NaN inputs in a mask, so numpy's NaN propagation holds (``kv_hmax_nan``);
- a reduction inside a vector loop (over axes other than the loop's) reduces lane-wise;
- exp2 is ``kv_exp2``, and the scalar code of these nests uses its scalar twin ``kumiko_exp2``, so
  vector lanes and tails agree bit for bit; bools are lane masks; an affine guard over the loop's axis is
  a lane mask when its branches read no memory (a causal mask);
- a read with a small constant stride along the axis (``MAX_LANE_STRIDE``: a strided window) is a gather
  (stride 2: two loads deinterleaved); loops with a larger stride, a gather of data-dependent indices, a
  strided store, i32 or fp64 lanes stay scalar.

Index-set splitting. A guard over the lanes whose branches read memory (the padding of a window: ``x[i +
r - 1]`` where ``0 <= i + r - 1 < W``) makes the loop three (``split_loop``), in whole vectors from the
row's start (``ceil(n / VW)`` iterations, never more): an interior range of the axis where every such
constraint ``k*i + c(r, outer) >= 0`` holds for every point of the reductions in scope (``c`` at its
weakest corner of their box), computed at run time from the outer loop indices; there the guard is
statically true and dropped (plain, unaligned loads, no mask). Masked iterations cover the head up to the
first vector boundary past the interior's start: their lanes past the range and the lanes a guard rejects
touch no memory (masked loads and stores, ``kv_*_mask``), so no scalar code is left. Plain iterations run
while a whole vector fits in the interior; the last vector is the interior body under a tail mask when the
interior reaches the row's end (a stride-2 row of 28 lanes: one masked vector, one tail with no lane guard
computed), else masked. A constraint that cannot be proven so (``==``, a non-affine bound) stays a lane
mask there too.

The mixin holds no state of its own: it reads and sets ``CpuLowering``'s (``_vctx``, ``_vnames``,
``red_axes``, ``storage``...) and calls its scalar emitters (``expr``, ``tmp``, ``trip``...). When to
emit vector code at all is decided by ``CpuLowering.emit_items``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kumiko import dtypes, ops
from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Assign, Block, Decl, For, If, Stmt, VecStore, axis_loop
from kumiko.kernel.lower_base import fma_factors
from kumiko.region.srnf import children
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
    RExpr,
    Select,
    Transpose,
    Unary,
)
from kumiko.symbolic import Expr

#: loops and reductions with a constant trip count below this stay scalar (no vector iteration at any width)
MIN_VECTOR_TRIP = 4
#: vector accumulators of a horizontal sum (independent dependency chains; the combine below assumes 4)
SUM_ACCUMULATORS = 4
#: a sum of products over other axes inside a vector loop takes one accumulator per point of its first reduce
#: axis with a constant trip count of 2 to this (``VectorEmitter._split_fma``)
MAX_SPLIT_CHAINS = 4
#: the largest element stride of a vector load along the lanes: a window's stride (2 deinterleaves, others
#: gather a few cache lines); a larger one (a transpose, a matrix-vector product along its rows) stays
#: scalar, where a reduction along the contiguous axis vectorises instead
MAX_LANE_STRIDE = 4


class NotVector(Exception):
    """A value with no vector form along the loop's axis: the loop (or reduction) stays scalar."""


class NeedSplit(NotVector):
    """A guard over the lanes whose branches read memory, met by a plain vector loop: the loop is emitted
    again, split (``VectorEmitter.split_loop``); elsewhere (a horizontal reduction) it stays scalar."""


@dataclass
class VectorCtx:
    var: str                   # the axis whose KUMIKO_VW consecutive points the lanes hold
    vlets: dict = field(default_factory=dict)   # let -> (kind, C variable) of lets held as vectors
    #: "plain" (every lane a point, no lane guard reads memory), "interior" (the middle of a split loop:
    #: lane constraints that hold on the whole interior are assumed) or "masked" (its borders: ``mask``)
    mode: str = "plain"
    mask: str | None = None    # a kvi_t: the lanes that may touch memory (None: all of them)
    guarded: bool = False      # emitting a branch of a lane guard (``mask`` says which lanes take it)
    assumed: list = field(default_factory=list)   # (lane coefficient, constraint at its weakest point)
    red_trip: dict = field(default_factory=dict)  # reduce axis in scope -> its trip count


def _reads_memory(e: RExpr) -> bool:
    return isinstance(e, (Read, Gather)) or any(_reads_memory(k) for k in children(e))


class VectorEmitter:
    """The vector half of ``CpuLowering``: KUMIKO_VW-wide loops, lane expressions, vector reductions
    and stores. A value with no vector form raises ``NotVector``; ``vector_loop`` and ``hreduce`` catch it
    and return None (the caller emits scalar code)."""

    def vector_loop(self, var: str, size, emit) -> list | None:
        """``emit()``'s statements as a KUMIKO_VW-wide loop over ``var`` and a scalar tail loop (or, when
        a guard over the lanes reads memory, the split loops of ``split_loop``), or None when some value
        has no vector form (the caller emits the scalar loop)."""
        n_const = Expr.lift(size).as_int()
        if n_const is not None and n_const < MIN_VECTOR_TRIP:
            return None
        try:
            body = self._vemit(VectorCtx(var), emit)
        except NeedSplit:
            return self.split_loop(var, size, emit)
        except NotVector:
            return None
        red = list(self.red_axes)
        tail = emit()
        self.red_axes = red
        n = C.index(size, set())
        return [For(var, "0", f"{n} - (KUMIKO_VW - 1)", tuple(body), step="KUMIKO_VW"),
                For(var, f"({n}) / KUMIKO_VW * KUMIKO_VW", n, tuple(tail), tail=True)]

    def _vemit(self, ctx: VectorCtx, emit) -> list:
        """``emit()`` with ``ctx`` as the vector loop being emitted (NotVector passes through)."""
        outer, red = self._vctx, list(self.red_axes)
        self._vctx = ctx
        try:
            return emit()
        finally:
            self._vctx, self.red_axes = outer, red
            self._vnames -= set(ctx.vlets)

    def split_loop(self, var: str, size, emit) -> list | None:
        """The loop over ``var`` split by index set, in whole vectors from 0 (never more iterations than
        the row's ``ceil(n / VW)``): masked ones from 0 until they cover [0, lo), plain ones while a whole
        vector fits before hi, then one last vector to n: a tail whose lanes the guards all let through
        when hi reaches n (only the lanes past n masked: the interior body with a tail mask, no lane guard
        computed), else masked. [lo, hi) is where every lane constraint the interior bodies assumed holds
        (computed at run time: it may depend on the outer loop indices). With constant sizes the head is
        one iteration at 0 and gcc folds its masks. None: no vector form."""
        mask = self.tmp()
        try:
            inner = VectorCtx(var, mode="interior")
            body = self._vemit(inner, emit)
            tailed = VectorCtx(var, mode="interior", mask=mask)
            end = self._vemit(tailed, emit)
            border = self._vemit(VectorCtx(var, mode="masked", mask=mask), emit)
        except NotVector:
            return None
        axes = set(self.iters) - {var}
        n = C.index(size, set())
        lo, hi = "0LL", n
        for k, w in dict.fromkeys(inner.assumed + tailed.assumed):
            if k > 0:       # k*var + w >= 0  <=>  var >= ceil(-w / k)
                b = C.index(-w, axes)
                lo = f"kumiko_max_ll({lo}, {b if k == 1 else f'kumiko_ceildiv({b}, {k}LL)'})"
            else:           # var <= floor(w / -k)
                b = C.index(w + 1, axes) if k == -1 else f"kumiko_floordiv({C.index(w, axes)}, {-k}LL) + 1LL"
                hi = f"kumiko_min_ll({hi}, {b})"
        t_lo, t_hi, t_a, t_b = (self.tmp() for _ in range(4))
        decls = [Decl("const long long", t_lo, f"kumiko_min_ll({lo}, {n})"),
                 Decl("const long long", t_hi, f"kumiko_max_ll(kumiko_min_ll({hi}, {n}), {t_lo})"),
                 # the head: whole vectors from 0 over [0, lo); then plain whole vectors inside [lo, hi)
                 Decl("const long long", t_a, f"kumiko_min_ll(kumiko_ceildiv({t_lo}, KUMIKO_VW) * KUMIKO_VW, {n})"),
                 Decl("const long long", t_b, f"{t_a} + kumiko_max_ll({t_hi} - {t_a}, 0LL) / KUMIKO_VW * KUMIKO_VW")]

        def masked(stop: str, stmts) -> tuple:
            lanes = f"kv_tail_mask((int)kumiko_min_ll(KUMIKO_VW, {stop} - {var}))"
            return (Decl("const kvi_t", mask, lanes),) + tuple(stmts)
        return decls + [For(var, "0LL", t_a, masked(t_a, border), step="KUMIKO_VW", tail=True),
                        For(var, t_a, t_b, tuple(body), step="KUMIKO_VW"),
                        If(f"{t_hi} >= {n}", (For(var, t_b, n, masked(n, end), step="KUMIKO_VW", tail=True),),
                           (For(var, t_b, n, masked(n, border), step="KUMIKO_VW", tail=True),))]

    def _assume(self, c: Expr, k: int) -> bool:
        """In an interior body: whether the lane constraint ``c >= 0`` (coefficient ``k`` of the vector
        axis) can be proven on the whole interior, and if so note it. It can when everything in ``c``
        but the axis is a reduce axis in scope with a constant coefficient (taken at the corner of its
        range where ``c`` is smallest), an outer loop index or a size symbol."""
        ctx = self._vctx
        rest = Expr.lift(c) - Expr.sym(ctx.var) * k
        corner = {}
        for a in rest.symbols():
            if a in ctx.red_trip:
                ka = C.stride(rest, a)
                if ka is None:
                    return False
                corner[a] = Expr.lift(ctx.red_trip[a]) - 1 if ka < 0 else 0
            elif a in self.red_axes or a == ctx.var:    # a gather's variable
                return False
        if (k, rest.subs(corner)) not in ctx.assumed:
            ctx.assumed.append((k, rest.subs(corner)))
        return True

    def varies(self, e: RExpr) -> bool:
        """Whether ``e`` depends on the vector axis (else the scalar emitter computes it once per vector)."""
        var = self._vctx.var
        if isinstance(e, Const):
            return False
        if isinstance(e, Read):
            return any(var in Expr.lift(i).symbols() for i in e.index)
        if isinstance(e, Ref):
            if e.name in self._vctx.vlets:
                return True
            kind = self.storage.get(e.name)
            return kind is not None and kind[0] == "array" and var in kind[2]
        if isinstance(e, Gather):
            return any(var in Expr.lift(i).symbols() for i in e.index) or self.varies(e.by)
        if isinstance(e, Select) and isinstance(e.pred, Guard):
            if any(var in Expr.lift(c).symbols() for c, _ in e.pred.constraints):
                return True
            return self.varies(e.then) or self.varies(e.other)
        return any(self.varies(k) for k in children(e))

    def _contiguous(self, off: Expr) -> str:
        if C.stride(off, self._vctx.var) != 1:
            raise NotVector("strided")
        return C.index(off, self.axes_in_scope())

    def _vload(self, buf: str, off: Expr, dt: dtypes.DType) -> str:
        """The lanes ``buf[off]`` at KUMIKO_VW points of the axis: strided (a constant stride) and masked
        as the context says."""
        k = C.stride(off, self._vctx.var)
        if k is None or k == 0 or abs(k) > MAX_LANE_STRIDE:
            raise NotVector("strided")
        v = C.vload(buf, C.index(off, self.axes_in_scope()), dt, stride=k, mask=self._vctx.mask)
        if v is None:
            raise NotVector("load type")
        return v

    def _masked(self, extra: str) -> str:
        """A kvi_t variable: the context's mask and ``extra`` (lanes a guard lets through)."""
        if self._vctx.mask is None:
            return extra
        return f"({self._vctx.mask} & {extra})"

    def vexpr(self, e: RExpr, out: list, hint: dtypes.DType | None = None) -> tuple[str, str]:  # noqa: C901
        """(kind, C vector expression) of ``e`` at KUMIKO_VW consecutive points of the vector axis:
        kind 'f' is a kv_t of float lanes, 'm' a kvi_t mask (bools). Raises NotVector."""
        if not self.varies(e):
            kind = C.vkind(self.dt(e) or hint)
            if kind is None:
                raise NotVector("lane type")
            if self._vctx.guarded and _reads_memory(e):
                # the same address for every lane, under a lane guard: read only when some lane takes
                # this branch (a point where the scalar code reads it too), so never out of range
                stmts: list = []
                v, t = self.expr(e, stmts, hint), self.tmp()
                out += [Decl(self.ctype(e) if self.dt(e) else "float", t),
                        If(f"kv_any({self._vctx.mask})", tuple(stmts) + (Assign(t, v),), (Assign(t, "0"),))]
                return kind, C.vbroadcast(t, kind)
            return kind, C.vbroadcast(self.expr(e, out, hint), kind)
        if isinstance(e, Read):
            m = self.memrefs[e.tensor]
            off = Expr.lift(e.index[0]) if e.flat else C.offset_expr(e.index, m.shape)
            return C.vkind(m.dtype), self._vload(self.cname[e.tensor], off, m.dtype)
        if isinstance(e, Ref):
            if e.name in self._vctx.vlets:
                return self._vctx.vlets[e.name]
            _, var, dims = self.storage[e.name]
            if C.vkind(self.types[e.name].dtype) != "f":
                raise NotVector("scratch type")
            return "f", self._vload(var, self.scratch_expr(dims), dtypes.fp32)
        if isinstance(e, Unary):
            k, x = self.vexpr(e.x, out)
            v = C.vunary(e.fn, x)
            if k != "f" or self.ctype(e) != "float" or v is None:
                raise NotVector("unary type")
            return "f", v
        if isinstance(e, Cast):
            src = self.dt(e.x) or e.to
            _, x = self.vexpr(e.x, out, src)
            v = C.vcast(x, src, e.to)
            if v is None:
                raise NotVector("cast")
            return C.vkind(e.to), v
        if isinstance(e, Binary):
            hint2 = self.dt(e.x) or self.dt(e.y)
            if e.fn == "div" and not self.varies(e.y) and self.ctype(e) == "float":
                # a divisor the same for every lane (a row's sum): one division per vector loop, then a
                # multiply per lane (vdivps is ~10x a vmulps; within 1.5 ulp of x / y, as PyTorch's softmax)
                ka, a = self.vexpr(e.x, out, hint2)
                if ka == "f":
                    return "f", f"({a} * kv_broadcast(1.0f / ({self.expr(e.y, out, hint2)})))"
            (ka, a), (kb, b) = self.vexpr(e.x, out, hint2), self.vexpr(e.y, out, hint2)
            v = C.vbinary(e.fn, a, b, ka) if ka == kb else None
            if v is None:
                raise NotVector("binary")
            return ("m" if ops.fn_kind(e.fn) == "compare" else ka), v
        if isinstance(e, (BroadcastInDim, Transpose)):
            return self.vexpr(e.operand, out, hint)
        if isinstance(e, Select):
            return self.vselect(e, out, hint)
        if isinstance(e, Reduce):
            return self.vreduce(e, out)
        raise NotVector(type(e).__name__)      # a gather: its index check is per point

    def _cond(self, cons) -> str:
        return " && ".join(f"({C.index(c, self.axes_in_scope())} {'>=' if op == 'ge' else '=='} 0)" for c, op in cons)

    def _lane_mask(self, cons) -> str:
        return " & ".join(f"kv_affine_{op}({C.index(c, self.axes_in_scope())}, {C.stride(c, self._vctx.var)})"
                          for c, op in cons)

    def _branch(self, e: RExpr, out: list, dt, mask: str | None) -> tuple[str, str]:
        """``e``, a branch of a lane select, with ``mask`` as the lanes its loads may touch."""
        ctx = self._vctx
        outer = ctx.mask, ctx.guarded
        ctx.mask, ctx.guarded = mask, True
        try:
            return self.vexpr(e, out, dt)
        finally:
            ctx.mask, ctx.guarded = outer

    def _if_select(self, cond: str, e: Select, out: list, dt, then_mask: str | None = None,
                   lane: str | None = None) -> tuple[str, str]:
        """An if on ``cond`` (the same for every lane); on its true side the branches as a lane select on
        ``lane`` when there is one (``then`` loads masked by ``then_mask``), else ``then``."""
        then: list = []
        if lane is None:
            kt, tv = self.vexpr(e.then, then, dt)
        else:
            kt, tv = self._branch(e.then, then, dt, then_mask)
            ko, ov = self._branch(e.other, then, dt, self._masked(f"~{lane}"))
            if kt != ko:
                raise NotVector("select kinds")
            tv = f"kv_select({lane}, {tv}, {ov})" if kt == "f" else f"(({lane} & {tv}) | (~{lane} & {ov}))"
        if not cond:
            out += then
            return kt, tv
        other: list = []
        ko, ov = self.vexpr(e.other, other, dt)
        if kt != ko:
            raise NotVector("select kinds")
        v = self.tmp()
        out.append(Decl(C.vtype(kt), v))
        out.append(If(cond, tuple(then) + (Assign(v, tv),), tuple(other) + (Assign(v, ov),)))
        return kt, v

    def vselect(self, e: Select, out: list, hint) -> tuple[str, str]:
        dt = self.dt(e) or hint
        if isinstance(e.pred, Guard):
            ctx = self._vctx
            ks = [C.stride(c, ctx.var) for c, _ in e.pred.constraints]
            if None in ks or any(abs(k) >= 1 << 20 for k in ks):
                raise NotVector("guard")
            uniform = self.assume_interior([(c, op) for (c, op), k in zip(e.pred.constraints, ks) if k == 0])
            lane = [(c, op) for (c, op), k in zip(e.pred.constraints, ks) if k != 0]
            if ctx.mode == "interior":        # constraints true on the whole interior are dropped there
                lane = [(c, op) for c, op in lane if not (op == "ge" and self._assume(c, C.stride(c, ctx.var)))]
            if not lane:                      # the same branch for every lane: an if, as scalar code has
                return self._if_select(self._cond(uniform), e, out, dt)
            if _reads_memory(e.then) or _reads_memory(e.other):
                # a guard over the lanes whose branches read memory: the lanes it rejects must not load
                if ctx.mode == "plain":
                    raise NeedSplit("guard")
                gm = self.tmp()
                out.append(Decl("const kvi_t", gm, self._lane_mask(lane)))
                return self._if_select(self._cond(uniform), e, out, dt, self._masked(gm), gm)
            # a guard over the lanes whose branches read no memory: both computed, then a lane select
            mask = self._lane_mask(uniform + lane)
        else:
            km, mask = self.vexpr(e.pred, out)
            if km != "m":
                raise NotVector("predicate")
        (kt, tv), (ko, ov) = self.vexpr(e.then, out, dt), self.vexpr(e.other, out, dt)
        if kt != ko:
            raise NotVector("select kinds")
        m = self.tmp()
        out.append(Decl("kvi_t", m, mask))
        v = f"kv_select({m}, {tv}, {ov})" if kt == "f" else f"(({m} & {tv}) | (~{m} & {ov}))"
        return kt, v

    def _vupdate(self, op: str, acc: str, nan: str | None, v: str, stmts: list) -> None:
        """acc op= v on lanes; max/min note NaN lanes in ``nan`` (kv_max alone would drop them)."""
        r = ops.REDUCE_BY_FN[op]
        if not r.nan_lanes:
            stmts.append(Assign(acc, r.cv.format(acc=acc, v=v)))
            return
        x = self.tmp()
        stmts += [Decl("kv_t", x, v), Assign(nan, f"{nan} | ({x} != {x})"), Assign(acc, r.cv.format(acc=acc, v=x))]

    def _vfma(self, e: Reduce, out: list) -> tuple[str, str] | None:
        """A sum of fp32 products (``fma_factors``): its two factors as vectors, for ``kv_fma``; else None."""
        f = fma_factors(e, self.dt) if self.FMA else None
        if f is None:
            return None
        hint = self.dt(f[0]) or self.dt(f[1])
        (ka, a), (kb, b) = self.vexpr(f[0], out, hint), self.vexpr(f[1], out, hint)
        if ka != "f" or kb != "f":
            raise NotVector("product")
        return a, b

    def _vbody(self, e: Reduce, out: list) -> str:
        k, v = self.vexpr(e.body, out, e.dtype)
        bt = self.dt(e.body)
        if bt is not None and bt is not e.dtype:
            v = C.vcast(v, bt, e.dtype)
        if k != "f" or v is None:
            raise NotVector("reduce body")
        return v

    def _vacc(self, e: Reduce, out: list) -> tuple[str, str | None]:
        acc = self.tmp()
        out.append(Decl("kv_t", acc, f"kv_broadcast({C.literal(e.init, e.dtype)})"))
        if not ops.REDUCE_BY_FN[e.op].nan_lanes:
            return acc, None
        nan = self.tmp()
        out.append(Decl("kvi_t", nan, "kv_mask_broadcast(0)"))
        return acc, nan

    def vreduce(self, e: Reduce, out: list) -> tuple[str, str]:
        """A reduction over other axes inside a vector loop: one accumulator lane per point."""
        if C.vkind(e.dtype) != "f":
            raise NotVector("reduce type")
        acc, nan = self._vacc(e, out)
        self.ty.add_axes(e.axes)
        self._vctx.red_trip.update({a.name: self.trip(a.name, a.size) for a in e.axes})
        self.red_trip.update(self._vctx.red_trip)
        self.red_axes += [a.name for a in e.axes]
        body: list = []
        fma = self._vfma(e, body)
        if fma is not None:
            split = self._split_axis(e)
            if split is not None:
                self._split_fma(e, split, acc, body, fma, out)
                return "f", acc
            body.append(Assign(acc, f"kv_fma({fma[0]}, {fma[1]}, {acc})"))
        else:
            self._vupdate(e.op, acc, nan, self._vbody(e, body), body)
        for a in e.axes:
            self.red_axes.remove(a.name)
        inner: tuple = tuple(body)
        for a in reversed(e.axes):
            inner = (axis_loop(a.name, self.trip(a.name, a.size), inner),)
        out.append(Block(inner))
        if nan is not None:
            out.append(Assign(acc, f"kv_select({nan}, kv_broadcast(NAN), {acc})"))
        return "f", acc

    def _split_axis(self, e: Reduce):
        """The reduce axis whose points get accumulators of their own: the first with a constant trip count
        of 2 to ``MAX_SPLIT_CHAINS`` (a 3x3 window's rows), if any."""
        for a in e.axes:
            t = Expr.lift(self.trip(a.name, a.size)).as_int()
            if t is not None and 2 <= t <= MAX_SPLIT_CHAINS:
                return a, t
        return None

    def _split_fma(self, e: Reduce, split: tuple, acc: str, body: list, fma: tuple, out: list) -> None:
        """A sum of products whose ``split`` axis (trip count t) runs as t copies of the other loops, each
        into its own accumulator, added at the end: t independent chains of multiply-adds instead of one
        (a 3x3 depthwise conv's 9 dependent multiply-adds per output vector become 3 chains of 3: 0.89-0.98
        of the time for MobileNetV2's depthwise convs on AVX2, alternating in one process)."""
        a, t = split
        accs = [acc] + [self.tmp() for _ in range(t - 1)]
        out += [Decl("kv_t", x, "kv_broadcast(0.0f)") for x in accs[1:]]
        for a2 in e.axes:
            self.red_axes.remove(a2.name)
        copies = []
        for j, x in enumerate(accs):
            inner: tuple = tuple(body) + (Assign(x, f"kv_fma({fma[0]}, {fma[1]}, {x})"),)
            for b in reversed(e.axes):
                if b.name != a.name:
                    inner = (axis_loop(b.name, self.trip(b.name, b.size), inner),)
            copies.append(Block((Decl("const long long", a.name, f"{j}LL"),) + inner))
        out += [Block(tuple(copies), unrolled=True), Assign(acc, " + ".join(accs))]

    def hreduce(self, e: Reduce, out: list) -> str | None:
        """A reduction in scalar context, vectorised along its innermost axis: vector accumulators, a
        scalar tail per outer point, one horizontal reduction at the end. None: it stays scalar."""
        last = e.axes[-1]
        n_const = Expr.lift(self.trip(last.name, last.size)).as_int()
        if C.vkind(e.dtype) != "f" or C.COMPUTE[e.dtype.name] != "float" or \
                (n_const is not None and n_const < MIN_VECTOR_TRIP):
            return None
        self.ty.add_axes(e.axes)
        # a loop body handed over by _fused_loop: computed and stored at each point of this loop first
        fuse = self._fuse[0] if self._fuse is not None and self._fuse[1] is e else None
        outer, red = self._vctx, list(self.red_axes)
        ctx = self._vctx = VectorCtx(last.name)
        self.red_trip.update({a.name: self.trip(a.name, a.size) for a in e.axes})
        self.red_axes += [a.name for a in e.axes]
        pre: list = []
        vb: list = []
        try:
            if fuse is not None:
                vb += fuse()
            if not self.varies(e.body):
                self.red_axes = red
                return None
            acc, nan = self._vacc(e, pre)
            fma = self._vfma(e, vb)
            v = None if fma is not None else self._vbody(e, vb)
        except NotVector:
            self.red_axes = red
            return None
        finally:
            self._vctx = outer
            self._vnames -= set(ctx.vlets)
        n = C.index(self.trip(last.name, last.size), set())
        body: list = list(vb)

        def add_to(a: str) -> Assign:           # a sum of products: one fused multiply-add a lane
            return Assign(a, f"kv_fma({fma[0]}, {fma[1]}, {a})" if fma is not None else f"{a} + {v}")
        if fma is not None:
            body.append(add_to(acc))
        else:
            self._vupdate(e.op, acc, nan, v, body)
        vloops: tuple = (For(last.name, "0", f"{n} - (KUMIKO_VW - 1)", tuple(body), step="KUMIKO_VW"),)
        combine: tuple = ()
        if e.op == "sum":
            # SUM_ACCUMULATORS independent add chains (one vaddps each has a latency of several cycles)
            accs = [acc] + [self.tmp() for _ in range(SUM_ACCUMULATORS - 1)]
            pre += [Decl("kv_t", a, "kv_zero()") for a in accs[1:]]
            u, step = self.tmp(), f"{SUM_ACCUMULATORS}*KUMIKO_VW"
            blocks = tuple(Block((Decl("const long long", last.name, f"{u} + {k}*KUMIKO_VW"),) + tuple(vb) +
                                 (add_to(a),)) for k, a in enumerate(accs))
            vloops = (For(u, "0", f"{n} - ({step} - 1)", blocks, step=step),
                      dataclasses.replace(vloops[0], lo=f"({n}) / ({step}) * ({step})"))
            # combined once, after the loops over the reduction's outer axes: inside them the other
            # accumulators would be added again at every outer point
            combine = (Assign(acc, f"({accs[0]} + {accs[1]}) + ({accs[2]} + {accs[3]})"),)
        # the scalar tail, into the scalar accumulator the caller reads
        ct = C.COMPUTE[e.dtype.name]
        res = self.tmp()
        out.append(Decl(ct, res, C.literal(e.init, e.dtype)))
        tail: list = []
        if fuse is not None:
            tail += fuse()
        tail.append(Assign(res, self.reduce_step(e, res, tail, ct)))     # fused where the vector lanes are
        self.red_axes = red
        inner: tuple = vloops + (For(last.name, f"({n}) / KUMIKO_VW * KUMIKO_VW", n, tuple(tail), tail=True),)
        for a in reversed(e.axes[:-1]):
            inner = (axis_loop(a.name, self.trip(a.name, a.size), inner),)
        fin = C.reduce_update(e.op, res, ops.REDUCE_BY_FN[e.op].cv_h.format(acc=acc, nan=nan), ct)
        out.append(Block(tuple(pre) + inner + combine + (Assign(res, fin),)))
        self._fused = fuse is not None
        return res

    def vstore_scratch(self, kind: tuple, k: str, v: str) -> Stmt:
        _, var, dims = kind
        if k != "f":
            raise NotVector("scratch type")
        mask = self._vctx.mask
        return VecStore(C.vstore_fn(dtypes.fp32, mask is not None), var, self._contiguous(self.scratch_expr(dims)),
                        f"{v}, {mask}" if mask else v)

    def vstore(self, value: RExpr) -> list:
        stmts: list = []
        src = self.types[self.r.yields[0].src].dtype
        k, v = self.vexpr(value, stmts, src)
        out_axes = tuple(a.name for a in self.r.iters)
        for y in self.r.yields:
            m = self.memrefs[y.to]
            w = C.vcast(v, src, y.cast) if y.cast is not None else v
            mask = self._vctx.mask
            fn = C.vstore_fn(m.dtype, mask is not None)
            if w is None or fn is None or C.vkind(m.dtype) != C.vkind(y.cast or src):
                raise NotVector("store type")
            off = C.offset_expr(tuple(Expr.sym(a) for a in out_axes), m.shape)
            stmts.append(VecStore(fn, self.cname[y.to], self._contiguous(off), f"{w}, {mask}" if mask else w))
        return stmts
