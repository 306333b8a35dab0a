"""Region -> SIMT kernel: one CUDA thread per output point (or per row), any region, correct by construction.

The GPU cannot give every thread a heap row buffer the way the CPU nest does, so the SIMT skeleton
trades memory for recomputation. The iteration axes that some let reduces over (a row softmax's ``n``)
are the *inner* axes; every other iter is an *outer* axis and one thread owns one outer point. Lets
whose axes are all outer are computed once per thread into registers, in order; every other let is
computed where it is used (inside the reduction over its row, or in the final store loop over the
inner axes), once per use scope. A row softmax is therefore three passes over its row per thread -
max, sum, store - each recomputing the row's values from the inputs (or from a contraction's
accumulator that the MMA kernel wrote, see ``gpu_mma``). Expressions are the CPU emitter's C strings
(``CpuLowering.expr``): CUDA C accepts the same math, with the prelude's device helpers.
"""
from __future__ import annotations

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.gpu_ir import Param, SimtKernel
from kumiko.kernel.loops import Assign, Decl, For, If
from kumiko.kernel.lower_cpu import CpuLowering, reused_reduce_axes
from kumiko.region.ssa import Guard, Reduce, Ref, Region, RExpr, Select
from kumiko.symbolic import prod


def decompose(lo: CpuLowering, flat: str, axes: tuple, out: list) -> None:
    """``long long a = ...`` for each axis from a row-major flat index over ``axes``."""
    rest = flat
    for k, a in enumerate(reversed(axes)):
        size = C.index(lo.sizes[a], set())
        if k == len(axes) - 1:
            out.append(Decl("const long long", a, rest))
        else:
            out.append(Decl("const long long", a, f"({rest}) % {size}"))
            rest = f"({rest}) / {size}"


def extent(lo: CpuLowering, axes) -> str:
    return C.index(prod([lo.sizes[a] for a in axes]) if axes else 1, set())


def kernel_params(lo: CpuLowering, extra: tuple = ()) -> tuple:
    """The ABI every generated kernel of a region shares: its MemRefs (inputs const), then scratch
    arrays, then the program's size symbols as ``long long`` scalars (sorted names)."""
    ps = [Param(lo.cname[n], C.STORAGE[m.dtype.name], const=n in dict(lo.r.inputs)) for n, m in lo.memrefs.items()]
    ps += list(extra)
    ps += [Param(f"s_{s}", "long long", pointer=False) for s in lo.syms]
    return tuple(ps)


class SimtLowering(CpuLowering):
    """CpuLowering whose Refs to row-varying lets are recomputed at the use (memoised per scope)."""

    def __init__(self, region: Region, syms: tuple, name: str, precomputed: dict | None = None):
        super().__init__(region, syms, name, parallel=False)
        self.precomputed = dict(precomputed or {})          # let -> ("array", var, axes) in gmem scratch
        iters = [a.name for a in self.r.iters]
        inner: set = set()
        for let in self.r.lets:
            if let.name not in self.precomputed:
                inner |= reused_reduce_axes(let.expr, set(iters))
        self.inner = tuple(a for a in iters if a in inner)
        self.outer = tuple(a for a in iters if a not in inner)
        self.lets = {x.name: x for x in self.r.lets}
        self.memo: dict[str, str] = {}
        self.storage.update(self.precomputed)

    def row_level(self, name: str) -> bool:
        return set(self.types[name].axes) <= set(self.outer)

    def expr(self, e: RExpr, out: list, hint: dtypes.DType | None = None) -> str:
        if isinstance(e, Ref) and e.name not in self.storage:
            if e.name not in self.memo:
                let = self.lets[e.name]
                v = super().expr(let.expr, out, self.types[e.name].dtype)
                var = self.tmp()
                out.append(Decl(C.COMPUTE[self.types[e.name].dtype.name], var, v))
                self.memo[e.name] = var
            return self.memo[e.name]
        return super().expr(e, out, hint)

    def reduce(self, e: Reduce, out: list) -> str:
        saved = dict(self.memo)
        v = super().reduce(e, out)
        self.memo = saved
        return v

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
            v = super().expr(let.expr, out, self.types[let.name].dtype)
            var = f"v_{let.name}"
            out.append(Decl(C.COMPUTE[self.types[let.name].dtype.name], var, v))
            self.storage[let.name] = ("scalar", var)
        self.memo = {}
        store = self.store(Ref(self.r.yields[0].src))
        for a in reversed(self.inner):
            store = [For(a, "0", C.index(self.sizes[a], set()), tuple(store))]
        return out + store


def lower_simt(region: Region, syms: tuple, name: str, precomputed: dict | None = None,
               threads: int = 256) -> SimtKernel:
    """A SIMT kernel for any region; ``precomputed`` lets (a contraction's accumulator) come from
    scratch arrays that an earlier kernel wrote."""
    lo = SimtLowering(region, syms, name, precomputed)
    decl: list = []
    decompose(lo, "kk_p", lo.outer, decl)
    extra = tuple(Param(var, "float", const=True) for _, var, _ in (lo.precomputed[k] for k in sorted(lo.precomputed)))
    notes = tuple(region.notes) + (f"SIMT: one thread per point of {list(lo.outer)}"
                                   + (f", looping over {list(lo.inner)}" if lo.inner else ""),)
    return SimtKernel(name, kernel_params(lo, extra), extent(lo, lo.outer), tuple(decl), tuple(lo.body()),
                      threads=threads, notes=notes, outer=lo.outer)
