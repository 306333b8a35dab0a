"""Region -> CPU loop nest (the generic path: any region, correct by construction).

Scheduling. Each top-level let lives at the loop depth of its last axis (its *level*); consecutive lets
deeper than the current level share one loop over the next iter, recursively, so a row softmax becomes
``for b,h,m { for n: S; Mrow = max_n S; for n: A; Z = sum_n A; for n: out }``. Every such loop is a
doall (a let is a pure function of its point), so the outermost ones run under OpenMP.

Storage. A let is a scalar in its loop body when every use is in that body at the same point; a let
used across loop instances - after its loop closed, or inside a reduction over one of its axes - gets
a thread-private scratch array over its axes that are not shared with all uses (a row buffer for the
softmax above). Scratch arrays are allocated once per thread, not per row: the parallel nest becomes
``#pragma omp parallel { scratch; #pragma omp for ... }`` (a small constant-size array lives on the
stack). Guarded branches (pads, tails) are ``if`` blocks in scalar code, so an out-of-bounds address is
never read (vector code reads such lanes with masked loads, which touch nothing for the lanes masked off).
Contractions are handled faster by ``kumiko.kernel.contract`` when the plan asks for it.

Vectors. An innermost loop over an axis whose every access is contiguous, invariant or strided by a small
constant runs ``KUMIKO_VW`` points at a time with ``kumiko_cpu.h``'s ``kv_t`` lanes, then a scalar tail
loop; a loop whose padding guards vary along the lanes (a window: depthwise convolution, pooling) is split
by index set instead: plain vector iterations over the interior where every guard holds, masked vector
iterations on the borders. A reduction in scalar context is vectorised along its innermost axis. That half
of the emitter is the ``VectorEmitter`` mixin in ``kumiko.kernel.lower_vec`` (which says what vectorises
and what stays scalar).

The expression emitter itself (reads, gathers, selects, scalar reductions, the store) is the shared
``RegionEmitter`` (``kumiko.kernel.lower_base``), which the CUDA lowerings use too; vector code is only
emitted by ``CpuLowering.emit_items``, and a caller that emits expressions outside a nest (a contraction's
packing and epilogue) gets scalar C with the CPU's math.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kumiko import dtypes, ops
from kumiko.kernel import cexpr as C
from kumiko.kernel.jam import jam, jammable
from kumiko.kernel.loops import (
    Block,
    Decl,
    For,
    If,
    Kernel,
    Parallel,
    Param,
    Scratch,
    Stmt,
    Store,
    axis_loop,
)
from kumiko.kernel.lower_base import Interior, RegionEmitter
from kumiko.kernel.lower_vec import NotVector, VectorCtx, VectorEmitter
from kumiko.region.analysis import RegionFacts, contains, depth, let_refs, reused_reduce_axes
from kumiko.region.srnf import children
from kumiko.region.ssa import (
    Let,
    Read,
    Reduce,
    Ref,
    Region,
    RExpr,
    VType,
)
from kumiko.symbolic import Expr, prod


@dataclass
class _Item:
    let: Let | None            # None for a loop
    level: int
    path: tuple                # ids of the enclosing loops
    axis: str = ""
    phase: bool = False        # a let computed in loops of its own (it reduces over an enclosing axis)
    items: list = field(default_factory=list)
    lid: int = 0


#: a scratch array of at most this many bytes with a constant size lives on the stack
STACK_SCRATCH_BYTES = 16384
_CSIZE = {"float": 4, "double": 8, "int32_t": 4, "int": 4}


class CpuLowering(VectorEmitter, RegionEmitter):
    """The region's loop nest (see the module docstring) on the shared expression emitter, with the CPU's
    own math: a float exp2 is ``kumiko_cpu.h``'s ``kumiko_exp2``, the scalar twin of the lanes' ``kv_exp2``
    (vectorisable, and the same bits in a vector loop's lanes and its tail, or in a GEMM's epilogue). A sum
    of products accumulates through one fused multiply-add (``KUMIKO_FMAF``, ``kv_fma``: ``reduce_step``)."""

    FMA = "KUMIKO_FMAF"
    #: max(x, +0) / min(x, +0) as ``kumiko_max0f`` / ``kumiko_min0f`` (a compare and an and-not): a ReLU6
    #: epilogue's two selects had been nine vector instructions (MobileNetV2 0.976 of the time, the same bits)
    ZERO_MASKS = True

    def __init__(self, region: Region, syms: tuple, name: str, parallel: bool = True,
                 facts: RegionFacts | None = None):
        super().__init__(region, syms, name, facts)
        self.parallel = parallel
        self.staged = False                      # a contraction reads B from a stage (stage micro-kernel)
        self.a_staged: bool | str = False        # a contraction reads A from a stage (A-stage micro-kernel;
        #                                          "u": its rows a unit apart, kumiko.kernel.stage's rdim)
        self.b_ld = False                        # a skinny contraction reads B in place (kumiko.kernel.skinny)
        self.m_tail = 0                          # rows of a contraction's last M tile, when MR does not divide M
        self.tile_epilogue = False               # its epilogue runs on the micro-kernels' accumulators (``_o`` kinds)
        self.vectorize = True                    # kv_* loops where safe
        self._nest = False                       # emitting a loop nest (vector loops may be made)
        self._vctx: VectorCtx | None = None      # the vector loop (or reduction) being emitted
        self._vnames: set = set()                # lets held as vectors right now (never read as scalars)
        self._fuse: tuple | None = None          # (emit a loop's body, Reduce): hreduce may run it in its loops
        self._fused = False                      # ... and it did
        self._enclosing: list = []               # the axis loops around the statements being emitted

    # scheduling ------------------------------------------------------------------------------------
    def level(self, let_name: str) -> int:
        return depth(self.types[let_name].axes, self.iters)

    def cap(self, let: Let) -> int:
        """A let reducing over an iter axis x needs every x: it lives outside x's loop (level <= x)."""
        xs = [self.iters.index(a) for a in reused_reduce_axes(let.expr, set(self.iters))]
        return min(xs, default=len(self.iters) + 1)

    def schedule(self) -> list:
        lets = list(self.r.lets) + [Let("__store", Ref(self.r.yields[0].src))]
        self.types["__store"] = VType(self.types[self.r.yields[0].src].dtype, tuple(self.iters))
        self.loops = 0

        def group(k: int, lets: list, path: tuple) -> list:
            items, run = [], []

            def flush():
                if run:
                    self.loops += 1
                    loop = _Item(None, k, path, self.iters[k], lid=self.loops)
                    loop.items = group(k + 1, list(run), path + (self.loops,))
                    items.append(loop)
                    run.clear()
            for let in lets:
                cap = self.cap(let)
                if self.level(let.name) <= k:
                    flush()
                    items.append(_Item(let, k, path))
                elif cap <= k:
                    # the loop over a reduced axis would enclose it: an array phase with its own loops
                    flush()
                    items.append(_Item(let, k, path, phase=True))
                else:
                    run.append(let)
            flush()
            return items
        return group(0, lets, ())

    def plan_storage(self, tree: list) -> None:
        where: dict[str, _Item] = {}

        def visit(items):
            for it in items:
                if it.let is None:
                    visit(it.items)
                else:
                    where[it.let.name] = it
        visit(tree)
        self.decl_at: dict[tuple, list] = {}
        for name, it in where.items():
            if name == "__store":
                continue
            axes = self.types[name].axes
            shared = it.level
            if it.phase:
                shared = min(shared, it.level)
                dims = tuple(a for a in axes if self.iters.index(a) >= it.level)
                if dims:
                    self.storage[name] = ("array", f"a_{name}", dims)
                    self.decl_at.setdefault(it.path[:it.level], []).append(name)
                    continue
            for uit in where.values():
                for ref, red in let_refs(uit.let.expr):
                    if ref != name:
                        continue
                    common = 0
                    for a, b in zip(it.path, uit.path):
                        if a != b:
                            break
                        common += 1
                    cut = min([common] + [self.iters.index(x) for x in red if x in axes])
                    shared = min(shared, cut)
            if shared >= it.level:
                self.storage[name] = ("scalar", f"v_{name}")
            else:
                dims = tuple(a for a in axes if self.iters.index(a) >= shared)
                self.storage[name] = ("array", f"a_{name}", dims)
                self.decl_at.setdefault(it.path[:shared], []).append(name)

    # the vector half's hooks into the scalar emitter -----------------------------------------------------
    def expr(self, e: RExpr, out: list, hint: dtypes.DType | None = None) -> str:
        if isinstance(e, Ref) and e.name in self._vnames:
            raise NotVector(e.name)
        return super().expr(e, out, hint)

    def unary(self, fn: str, x: str, ct: str) -> str:
        twin = ops.BY_FN[fn].c_cpu
        if twin is not None and ct == "float":
            return twin.format(x=x)     # kumiko_cpu.h's scalar twin of the lanes' kv_* helper
        return super().unary(fn, x, ct)

    def reduce(self, e: Reduce, out: list) -> str:
        if self._nest:
            acc = self.hreduce(e, out)
            if acc is not None:
                return acc
        return super().reduce(e, out)

    def store(self, value: RExpr) -> list:
        if self._vctx is not None:
            return self.vstore(value)
        return super().store(value)

    # emission ----------------------------------------------------------------------------------------
    def emit_items(self, items: list, path: tuple) -> list:
        outer = self._nest
        self._nest = self.vectorize
        try:
            return self._emit_items(items, path)
        finally:
            self._nest = outer

    def _emit_items(self, items: list, path: tuple) -> list:
        out: list = []
        for name in self.decl_at.get(path, []):
            _, var, dims = self.storage[name]
            size = prod([self.sizes[a] for a in dims]) if dims else 1
            ct = C.COMPUTE[self.types[name].dtype.name]
            n = Expr.lift(size).as_int()
            stack = n is not None and n * _CSIZE.get(ct, 8) <= STACK_SCRATCH_BYTES
            out.append(Scratch(ct, var, C.index(size, set()), stack=stack))
        skip = False
        for k, it in enumerate(items):
            if skip:
                skip = False
                continue
            if it.let is None:
                nxt = items[k + 1] if k + 1 < len(items) else None
                if nxt is not None and self._fusable(it, path, nxt):
                    out += self._fused_loop(it, path, nxt.let)
                    skip = True
                    continue
                out += self._loop_item(it, path)
                continue
            self.red_axes = []
            if it.let.name == "__store":
                out += self.store(it.let.expr)
                continue
            if it.phase and self.storage[it.let.name][0] == "array":
                out.append(self.phase(it.let))
                continue
            out += self.let_stmts(it.let)
        return out

    def _loop_item(self, it, path: tuple) -> list:
        """The loop over ``it.axis`` and its lets: a vector loop with a scalar tail where it can be."""
        sub = path + (it.lid,)
        loops = None
        if self._nest and not self.decl_at.get(sub) and all(x.let is not None for x in it.items):
            loops = self.vector_loop(it.axis, self.trip(it.axis),
                                     lambda items=it.items, sub=sub: self._emit_items(items, sub))
        if loops is None:
            self._enclosing.append(it.axis)
            try:
                loops = self._interior_split(it, sub)
            finally:
                self._enclosing.pop()
        return loops

    def _interior_split(self, it, sub: tuple) -> list:
        """The loop ``it``; where its guards (a padded window's bound checks) hold at every point of the loops
        inside it for the current indices, its body a second time without them: ``if (interior) { copy }
        else { body }``. Each constraint the copy drops is tested once there, at its weakest point over the
        reduce axes (``assume_interior``), instead of at every tap: a 3x3 depthwise conv had tested four bounds
        before each of its nine loads. Only at the last loop around innermost loops (the copy wraps the vector
        loop; the outer loops stay one perfect nest for the threads), and not around scratch arrays (each copy
        would declare them).

        Where the body reads a window along ``it``'s axis (``_jam_points``), the loop also steps JAM points at
        a time: a run of JAM interior points runs as one jammed copy (``kumiko.kernel.jam``: the points' taps
        merged, so each input vector of a window row is loaded once for all of them), other runs point by
        point as above."""
        a, n = it.axis, C.index(self.trip(it.axis), set())
        plain = self._emit_items(it.items, sub)
        inner = [x for x in it.items if x.let is None]
        if (not self._nest or self.interior is not None or not inner
                or any(y.let is None for x in inner for y in x.items) or self.decl_at.get(sub)
                or any(self.decl_at.get(sub + (x.lid,)) for x in inner)):
            return [axis_loop(a, self.trip(a), tuple(plain))]
        ctx = self.interior = Interior(frozenset(self._enclosing))
        try:
            fast = self._emit_items(it.items, sub)
        finally:
            self.interior = None
        if not ctx.assumed:
            return [axis_loop(a, self.trip(a), tuple(plain))]
        axes = self.axes_in_scope()
        cond = " && ".join(f"({C.index(w, axes)} >= 0)" for w in ctx.assumed)
        split = (If(cond, tuple(fast), tuple(plain)),)
        u = self._jam_points(it)
        if u < 2 or not jammable(tuple(fast)):
            return [axis_loop(a, self.trip(a), split)]
        base = f"{a}_jam"
        keep = frozenset(self.iters) | frozenset(self.red_trip)
        # a run is inside when its first and last points are (the interior is convex along the axis)
        along = [w for w in ctx.assumed if a in Expr.lift(w).symbols()]
        ends = " && ".join([f"({C.index(w, axes)} >= 0)" for w in ctx.assumed if w not in along] +
                           [f"({C.rename(C.index(w, axes), {a: f'({base} + {k}LL)'})} >= 0)"
                            for k in (0, u - 1) for w in along])
        last = f"kumiko_min_ll({base} + {u}LL, {n})"
        # the runs start where the interior does, when that is known when compiling (a pad of 1: the runs are
        # 1..4, 5..8, ...; from 0 a 7-wide row had no run of 4 inside and a 14-wide one two of its three)
        first = _interior_start(ctx.assumed, a) % u
        start = first - u if first else 0
        return [For(base, str(start), n, (If(f"{base} >= 0LL && {base} + {u - 1}LL < {n} && {ends}",
                                              jam(tuple(fast), a, base, u, keep),
                                              (For(a, f"kumiko_max_ll({base}, 0LL)", last, split),)),),
                    step=f"{u}LL")]

    def _jam_points(self, it) -> int:
        """How many points of ``it``'s axis a jammed copy computes: JAM where a reduction inside reads along
        the axis and one of its own axes together, the axis stepping no farther than the reduce axis (a window
        whose neighbouring points share taps: stride 1, or a stride up to the dilation; a stride-2 3x3 window's
        4 points share 3 of their 12 loads, and jammed ran no faster), fewer where the window's rows already
        take many accumulators (``_split_axis``: JAM x rows of them stay within the 16 vector registers of
        AVX2); 1: no such window."""
        best = 1
        for e in _reduces(it.items):
            red = [x.name for x in e.axes]
            if any(_shares_taps(Expr.lift(i), it.axis, red) for r in _reads(e.body) for i in r.index):
                split = self._split_axis(e)
                rows = split[1] if split is not None else 1
                best = max(best, max(1, min(JAM, JAM_ACCUMULATORS // rows)))
        return best

    def _fusable(self, it, path: tuple, nxt) -> bool:
        """Whether the loop ``it`` (lets only, no reductions) and the reduction over its axis right after
        it (a scalar let, ``nxt``) can share one pass: what the loop stores at a point is what the
        reduction reads there (a softmax's exp and its row sum, an attention score's scale and its max)."""
        if not self._nest or nxt.let is None or nxt.phase or nxt.let.name == "__store" or \
                self.decl_at.get(path + (it.lid,)) or any(x.let is None or x.phase for x in it.items):
            return False
        e = nxt.let.expr
        return (isinstance(e, Reduce) and len(e.axes) == 1 and e.axes[0].name == it.axis
                and Expr.lift(self.trip(it.axis)) == Expr.lift(self.trip(it.axis, e.axes[0].size))
                and self.storage.get(nxt.let.name, ("",))[0] == "scalar"
                and not any(contains(x.let.expr, (Reduce,)) for x in it.items))

    def _fused_loop(self, it, path: tuple, red: Let) -> list:
        """The loop ``it`` inside the vector loops of the reduction ``red`` (one pass over the row instead
        of two); when that reduction is not vectorised, the loop on its own first, then the reduction."""
        sub = path + (it.lid,)

        def body() -> list:          # emitted inside the reduction's loops, which keep their reduced axes
            scope = list(self.red_axes)
            try:
                return self._emit_items(it.items, sub)
            finally:
                self.red_axes = scope
        self._fuse, self._fused = (body, red.expr), False
        try:
            stmts = self.let_stmts(red)
        finally:
            fused, self._fuse, self._fused = self._fused, None, False
        return stmts if fused else self._loop_item(it, path) + stmts

    def let_stmts(self, let: Let) -> list:
        """Compute ``let`` at the current point (KUMIKO_VW points in a vector loop) into its storage."""
        stmts: list = []
        dt = self.types[let.name].dtype
        kind = self.storage[let.name]
        if self._vctx is not None and self.varies(let.expr):
            k, v = self.vexpr(let.expr, stmts, dt)
            if kind[0] == "scalar":
                stmts.append(Decl(C.vtype(k), kind[1], v))
                self._vctx.vlets[let.name] = (k, kind[1])
                self._vnames.add(let.name)
            else:
                stmts.append(self.vstore_scratch(kind, k, v))
            return stmts
        v = self.expr(let.expr, stmts, dt)
        if kind[0] == "scalar":
            stmts.append(Decl(C.COMPUTE[dt.name], kind[1], v))
        elif self._vctx is not None and C.stride(self.scratch_expr(kind[2]), self._vctx.var) != 0:
            k = C.vkind(dt)
            if k is None:
                raise NotVector(let.name)
            stmts.append(self.vstore_scratch(kind, k, C.vbroadcast(v, k)))
        else:
            stmts.append(Store(kind[1], self.scratch_offset(kind[2]), v))
        return stmts

    def phase(self, let: Let) -> Stmt:
        """Compute ``let`` into its array over its remaining axes, in loops of its own."""
        _, var, dims = self.storage[let.name]
        last = dims[-1]
        body = self.vector_loop(last, self.trip(last), lambda: self.let_stmts(let)) if self._nest else None
        if body is None:
            body = [axis_loop(last, self.trip(last), tuple(self.let_stmts(let)))]
        loops: tuple = tuple(body)
        for a in reversed(dims[:-1]):
            loops = (axis_loop(a, self.trip(a), loops),)
        return Block(loops)

    def lower(self) -> Kernel:
        tree = self.schedule()
        self.plan_storage(tree)
        self.red_axes: list = []
        body = self.emit_items(tree, ())
        body = [parallelize(s) if self.parallel else hoisted(s) for s in body]
        params = tuple(Param(self.cname[n], C.STORAGE[m.dtype.name], n in dict(self.r.inputs))
                       for n, m in self.memrefs.items())
        return Kernel(self.name, params, self.syms, tuple(body), self.r.notes, gather_check=self.uses_gather,
                      no_loop_vectorize=self.reversed_reduce)


def _strip_scratch(s: Stmt, found: list) -> Stmt:
    """``s`` without the Scratch declarations inside its loops (appended to ``found``). Each scratch
    array is written before it is read within one iteration of the loop that declared it, so one array
    per thread serves every iteration."""
    def strip(body: tuple) -> tuple:
        kept = []
        for b in body:
            if isinstance(b, Scratch):
                found.append(b)
            else:
                kept.append(_strip_scratch(b, found))
        return tuple(kept)
    if isinstance(s, For):
        return dataclasses.replace(s, body=strip(s.body))
    if isinstance(s, Block):
        return dataclasses.replace(s, body=strip(s.body))
    if isinstance(s, If):
        return If(s.cond, strip(s.then), strip(s.other))
    return s


def hoisted(s: Stmt) -> Stmt:
    """A serial top-level loop with its scratch arrays allocated once, before it."""
    found: list = []
    s = _strip_scratch(s, found)
    return Block(tuple(found) + (s,)) if found else s


def parallelize(s: Stmt) -> Stmt:
    """Run the outermost loops in parallel, collapsing a perfect nest (up to 3 deep). Scratch arrays
    inside are allocated once per thread: ``omp parallel { scratch; omp for ... }``. A vector loop's
    scalar tail (fewer than KUMIKO_VW iterations) stays serial."""
    if not isinstance(s, For) or s.tail:
        return s
    found: list = []
    s = _strip_scratch(s, found)
    depth, cur = 1, s
    while depth < 3 and len(cur.body) == 1 and isinstance(cur.body[0], For) and not cur.body[0].tail:
        cur = cur.body[0]
        depth += 1
    cond = _enough_work(s)
    if not found:
        return dataclasses.replace(s, parallel=True, collapse=depth, par_if=cond)
    return Parallel(tuple(found) + (dataclasses.replace(s, workshare=True, collapse=depth),), cond=cond)


#: the fewest points of a loop nest worth waking threads for: below it the nest runs on the calling thread
#: (a kernel over 16 floats took 50 us when it woke a pool, and milliseconds where other pools were busy)
PARALLEL_MIN_POINTS = 1 << 15
#: ... or the fewest points x taps (the constant trip counts of the loops inside a point: a 3x3 window's 9)
#: worth threads for a nest whose points alone are fewer: a depthwise 3x3 of 576 x 7 x 7 points ran 24 us on
#: one thread, 13 on two; 16 x 17 x 17 points (a few us) stay on one
PARALLEL_MIN_WORK = 1 << 17


def _enough_work(s: For) -> str:
    """C for "the nest has at least PARALLEL_MIN_POINTS points, or PARALLEL_MIN_WORK points x taps": the
    product of the extents along its loop chain, and the most constant trips of loops nested inside the
    chain's last level (inner loops of symbolic trips only add work, so this errs towards one thread for
    small nests only). Where a body holds several loops over one variable (a vector loop's masked head,
    plain interior and masked tail: a depthwise conv's row) the chain counts their union and goes on into
    the first; a bound that names a value of the nest itself (its loop variables, its locals) ends the chain."""
    inner = _names_inside(s)
    extents: list[str] = []
    level: list[For] = [s]
    while level:
        lo, hi = level[0].lo, level[-1].hi
        if any(x.var != level[0].var for x in level) or (extents and inner & set(C.IDENT.findall(lo + " " + hi))):
            break
        extents.append(f"({hi} - ({lo}))")
        taps = max(_taps(x.body) for x in level)
        level = _loops(level[0].body)
    points = " * ".join(extents)
    if taps <= 1:
        return f"{points} >= {PARALLEL_MIN_POINTS}LL"
    return f"{points} >= {PARALLEL_MIN_POINTS}LL || {points} * {taps}LL >= {PARALLEL_MIN_WORK}LL"


def _taps(body: tuple) -> int:
    """The largest product of constant trip counts (``For.trips``) of loops nested in ``body`` (1: none)."""
    best = 1
    for b in body:
        if isinstance(b, For):
            best = max(best, max(1, b.trips or 1) * _taps(b.body))
        elif isinstance(b, If):
            best = max(best, _taps(b.then), _taps(b.other))
        elif isinstance(b, Block) and b.unrolled:
            best = max(best, sum(_taps((s,)) for s in b.body))
        elif isinstance(b, (Block, Parallel)):
            best = max(best, _taps(b.body))
    return best


def _loops(body: tuple) -> list:
    """The loops of a body, those of an ``if``'s first branch included (a split loop's last vector)."""
    return [x for b in body for x in ((b,) if isinstance(b, For) else _loops(b.then) if isinstance(b, If) else ())]


#: the points of a window's output axis one jammed copy computes (``CpuLowering._interior_split``): a 3x3
#: depthwise conv over 112x112 x 32 channels ran 0.35-0.45 of its time point by point in a C model of the
#: kernel on a 2-core Zen 3 (each input vector loaded once for the 4 points, not 3 times each)
JAM = 4
#: ... with at most this many vector accumulators in all (JAM x the window's rows, ``_split_axis``)
JAM_ACCUMULATORS = 12


def _interior_start(assumed: list, axis: str) -> int:
    """The least point of ``axis`` that the lower bounds among ``assumed`` (each ``k*axis + c >= 0``, k > 0, c
    a constant) let into the interior; 0 when none is such a bound."""
    lo = 0
    for w in assumed:
        k = C.stride(w, axis)
        rest = (Expr.lift(w) - Expr.sym(axis) * k).as_int() if k else None
        if k is not None and k > 0 and rest is not None:
            lo = max(lo, -(rest // k))          # ceil(-rest / k)
    return lo


def _shares_taps(index: Expr, axis: str, red: list) -> bool:
    """Whether neighbouring points of ``axis`` read some of the same elements through ``index`` as a reduce axis
    in ``red`` moves: both step it, the axis by at most as much."""
    k = C.stride(index, axis)
    if not k:
        return False
    return any((kr := C.stride(index, r)) and abs(k) <= abs(kr) for r in red if r in index.symbols())


def _reduces(items: list) -> list:
    """The reductions in the lets of a schedule's items, nested loops included."""
    found: list = []

    def walk(e: RExpr) -> None:
        if isinstance(e, Reduce):
            found.append(e)
        for k in children(e):
            walk(k)
    for x in items:
        if x.let is not None:
            walk(x.let.expr)
        else:
            found += _reduces(x.items)
    return found


def _reads(e: RExpr) -> list:
    """The reads of memory in ``e`` (not through a gather)."""
    return ([e] if isinstance(e, Read) else []) + [r for k in children(e) for r in _reads(k)]


def _names_inside(s) -> set[str]:
    """The loop variables and locals a statement declares, at any depth."""
    if isinstance(s, For):
        return {s.var}.union(*(_names_inside(b) for b in s.body))
    if isinstance(s, (Decl, Scratch)):
        return {s.name}
    if isinstance(s, If):
        return set().union(*(_names_inside(b) for b in s.then + s.other))
    if isinstance(s, (Block, Parallel)):
        return set().union(*(_names_inside(b) for b in s.body))
    return set()
