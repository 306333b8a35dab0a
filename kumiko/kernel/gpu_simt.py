"""Region -> SIMT kernel: one CUDA thread (or one warp) per row, any region, correct by construction.

The GPU cannot give every thread a heap row buffer the way the CPU nest does, so the SIMT skeleton
trades memory for recomputation. The iteration axes that some let reduces over (a row softmax's ``n``)
are the *inner* axes; every other iter is an *outer* axis and one thread owns one outer point. Lets
whose axes are all outer are computed once per thread into registers, in order; every other let is
computed where it is used (inside the reduction over its row, or in the final store loop over the
inner axes), once per use scope. A row softmax is therefore three passes over its row per thread -
max, sum, store - each recomputing the row's values from the inputs (or from a contraction's
accumulator that the MMA kernel wrote, see ``gpu_mma``). Expressions are the CPU emitter's C strings
(``RegionEmitter.expr``, ``kumiko.kernel.lower_base``): CUDA C accepts the same math, with the prelude's
device helpers.

Where a row is contiguous in memory (a softmax or layernorm over the last axis, a row sum), one thread
per row would read rows a row apart in every warp instruction; the plan then binds a row to a *warp*
(``bind.point = "warp"``, ``kumiko.plan.gpu.simt_binding``): the lanes stride over the row together (coalesced), the
row-level lets' top-level reductions become lane-strided loops combined by a shuffle butterfly (every
lane gets the result), and the store loop is lane-strided too (lane 0 stores a point with no inner
axes). Reductions nested inside another (per-lane) loop, and ones not in fp32, stay serial per lane -
each lane then computes the whole reduction, which is the same value - so the warp binding never
changes what is computed, only who computes it.
"""
from __future__ import annotations

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.gpu_ir import Param, SimtKernel
from kumiko.kernel.loops import Assign, Decl, For, If, Store
from kumiko.kernel.lower_base import RegionEmitter
from kumiko.plan.gpu import WARP
from kumiko.region.analysis import row_axes
from kumiko.region.ssa import Guard, Reduce, Ref, Region, RExpr, Select
from kumiko.symbolic import Expr, prod


def decompose(lo: RegionEmitter, flat: str, axes: tuple, out: list, sizes: tuple | None = None) -> None:
    """``long long a = ...`` for each axis from a row-major flat index over ``axes`` (of ``sizes``, C
    expressions; default: the axes' sizes)."""
    rest = flat
    if sizes is None:
        sizes = tuple(C.index(lo.sizes[a], set()) for a in axes)
    for k, (a, size) in enumerate(zip(reversed(axes), reversed(sizes))):
        if k == len(axes) - 1:
            out.append(Decl("const long long", a, rest))
        else:
            out.append(Decl("const long long", a, f"({rest}) % {size}"))
            rest = f"({rest}) / {size}"


def extent(lo: RegionEmitter, axes) -> str:
    return C.index(prod([lo.sizes[a] for a in axes]) if axes else 1, set())


def kernel_params(lo: RegionEmitter, extra: tuple = ()) -> tuple:
    """The ABI every generated kernel of a region shares: its MemRefs (inputs const), then scratch
    arrays, then the program's size symbols as ``long long`` scalars (sorted names)."""
    ps = [Param(lo.cname[n], C.STORAGE[m.dtype.name], const=n in dict(lo.r.inputs)) for n, m in lo.memrefs.items()]
    ps += list(extra)
    ps += [Param(f"s_{s}", "long long", pointer=False) for s in lo.syms]
    return tuple(ps)


def status_params(lo: RegionEmitter) -> tuple:
    """The status word of a kernel that checks data-dependent (gather) indices: an out-of-range index sets the
    thread's ``kk_bad`` (the lowering reads element 0 instead), and the kernel then stores
    ``STATUS_BAD_INDEX`` to ``*kk_status``, which the runtime reads after the launches (E1015, as on the CPU)."""
    return (Param("kk_status", "int"),) if lo.uses_gather else ()


def accumulator_code(lo: RegionEmitter, c) -> tuple[tuple, tuple | None, tuple]:
    """(code at one point with the accumulator in ``kk_acc``, scratch, extra params) of a GPU contraction's epilogue:
    the region's pointwise rest (no scratch), or else the accumulator stored to an fp32 scratch ``a_<let>``
    (scratch: (param name, let, axes)) for the SIMT kernel that runs the rest (``lower_simt`` with it precomputed)."""
    if c.pointwise:
        return tuple(lo.point_code(c.let, "kk_acc")), None, ()
    axes = lo.types[c.let].axes
    var = f"a_{c.let}"
    off = C.offset(tuple(Expr.sym(a) for a in axes), tuple(lo.sizes[a] for a in axes), set(axes))
    return (Store(var, off, "kk_acc"),), (var, c.let, axes), (Param(var, "float"),)


class SimtLowering(RegionEmitter):
    """The shared expression emitter whose Refs to row-varying lets are recomputed at the use (memoised per scope);
    ``warp``: a row per warp, its top-level row reductions lane-strided and combined by shuffles."""

    def __init__(self, region: Region, syms: tuple, name: str, precomputed: dict | None = None,
                 warp: bool = False):
        super().__init__(region, syms, name)
        self.precomputed = dict(precomputed or {})          # let -> ("array", var, axes) in gmem scratch
        self.inner, self.outer = row_axes(self.r, self.precomputed)
        self.warp = warp
        self.split = False              # a Reduce met now may be lane-strided (a row-level let's top level)
        self.lets = {x.name: x for x in self.r.lets}
        self.memo: dict[str, str] = {}
        self.storage.update(self.precomputed)

    def row_level(self, name: str) -> bool:
        return set(self.types[name].axes) <= set(self.outer)

    def expr(self, e: RExpr, out: list, hint: dtypes.DType | None = None) -> str:
        if isinstance(e, Ref) and e.name not in self.storage:
            if e.name not in self.memo:
                let = self.lets[e.name]
                # through self.expr: a let that is just another let's name (``out = v_n17``) is a Ref too
                v = self.expr(let.expr, out, self.types[e.name].dtype)
                var = self.tmp()
                out.append(Decl(C.COMPUTE[self.types[e.name].dtype.name], var, v))
                self.memo[e.name] = var
            return self.memo[e.name]
        return super().expr(e, out, hint)

    def reduce(self, e: Reduce, out: list) -> str:
        saved, split = dict(self.memo), self.split
        # inside the reduction its axes take new values: a let memoised outside that varies along one of them
        # (a softmax's exp, summed over the axis an enclosing reduction is already iterating) is recomputed
        rebound = {a.name for a in e.axes}
        self.memo = {k: v for k, v in self.memo.items() if not rebound & set(self.types[k].axes)}
        self.split = False                  # a reduction inside this one runs within one lane's iterations
        try:
            if split and C.COMPUTE[e.dtype.name] == "float":
                v = self.warp_reduce(e, out)
            else:
                v = super().reduce(e, out)
        finally:
            self.split = split
        self.memo = saved
        return v

    def warp_reduce(self, e: Reduce, out: list) -> str:
        """The reduction over the flattened axes, lane ``lane`` taking every 32nd point, then a butterfly of
        ``shfl_xor`` so that every lane holds the whole reduction (the same order-free ops: sum, max, min)."""
        ct = C.COMPUTE[e.dtype.name]
        acc, flat = self.tmp(), self.tmp()
        out.append(Decl(ct, acc, C.literal(e.init, e.dtype)))
        self.ty.add_axes(e.axes)
        self.red_axes += [a.name for a in e.axes]
        sizes = tuple(f"({C.index(self.trip(a.name, a.size), set())})" for a in e.axes)
        body: list = []
        decompose(self, flat, tuple(a.name for a in e.axes), body, sizes)
        v = self.expr(e.body, body, e.dtype)
        bt = self.dt(e.body)
        if bt is not None and bt is not e.dtype:
            v = C.cast(v, bt, e.dtype)
        body.append(Assign(acc, C.reduce_update(e.op, acc, v, ct)))
        for a in e.axes:
            self.red_axes.remove(a.name)
        out.append(For(flat, "lane", " * ".join(sizes), tuple(body), step=str(WARP)))
        for off in (16, 8, 4, 2, 1):
            out.append(Assign(acc, C.reduce_update(e.op, acc, f"shfl_xor_f32({acc}, {off})", ct)))
        return acc

    def select(self, e: Select, out: list, hint) -> str:
        if not isinstance(e.pred, Guard):
            return super().select(e, out, hint)
        ct, dt, v = self.ctype(e), self.dt(e) or hint, self.tmp()
        cond = " && ".join(f"({C.index(c, self.axes_in_scope())} {'>=' if op == 'ge' else '=='} 0)"
                           for c, op in e.pred.constraints)
        saved = dict(self.memo)
        then: list = []
        tv = self.expr(e.then, then, dt)
        self.memo = dict(saved)
        other: list = []
        ov = self.expr(e.other, other, dt)
        self.memo = saved
        out.append(Decl(ct, v))
        out.append(If(cond, tuple(then) + (Assign(v, tv),), tuple(other) + (Assign(v, ov),)))
        return v

    def body(self) -> list:
        out: list = []
        for let in self.r.lets:
            if let.name in self.precomputed or not self.row_level(let.name):
                continue
            self.red_axes = []
            self.split = self.warp
            v = super().expr(let.expr, out, self.types[let.name].dtype)
            self.split = False
            var = f"v_{let.name}"
            out.append(Decl(C.COMPUTE[self.types[let.name].dtype.name], var, v))
            self.storage[let.name] = ("scalar", var)
        self.memo = {}
        store = self.store(Ref(self.r.yields[0].src))
        if self.warp and not self.inner:            # one point: every lane holds its value, lane 0 stores it
            return out + [If("lane == 0", tuple(store))]
        if self.warp:                   # the row's points, lane-strided (adjacent lanes, adjacent elements)
            decl: list = []
            decompose(self, "kk_j", self.inner, decl)
            return out + [For("kk_j", "lane", extent(self, self.inner), tuple(decl) + tuple(store), step=str(WARP))]
        for a in reversed(self.inner):
            store = [For(a, "0", C.index(self.sizes[a], set()), tuple(store))]
        return out + store


def lower_simt(region: Region, syms: tuple, name: str, precomputed: dict | None = None,
               threads: int = 256, bind: str = "thread") -> SimtKernel:
    """A SIMT kernel for any region; ``precomputed`` lets (a contraction's accumulator) come from
    scratch arrays that an earlier kernel wrote; ``bind`` ``"warp"`` gives each point (row) a warp."""
    lo = SimtLowering(region, syms, name, precomputed, warp=bind == "warp")
    decl: list = []
    decompose(lo, "kk_p", lo.outer, decl)
    extra = tuple(Param(var, "float", const=True) for _, var, _ in (lo.precomputed[k] for k in sorted(lo.precomputed)))
    who = "warp" if lo.warp else "thread"
    loops = (f", {'its lanes striding' if lo.warp else 'looping'} over {list(lo.inner)}" if lo.inner else "")
    notes = tuple(region.notes) + (f"SIMT: one {who} per point of {list(lo.outer)}{loops}",)
    body = tuple(lo.body())             # first: it finds out whether the kernel gathers (status_params)
    return SimtKernel(name, kernel_params(lo, extra + status_params(lo)), extent(lo, lo.outer), tuple(decl), body,
                      threads=threads, notes=notes, outer=lo.outer, warp=lo.warp, gather_check=lo.uses_gather)
