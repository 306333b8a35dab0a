"""The packed contraction path: a top-level ``Reduce(sum, K, mul(x, y))`` of a region runs as a
BLIS-style blocked GEMM with packed panels and a register-blocked micro-kernel whose shape comes from
the Plan (``micro=(MR, NR)``, ``vectorize.width``, ``tile=(MC, NC, KC)``).

Nothing here knows op names. The axes of the contraction are classified from the region itself:
output axes that only ``x`` reads are M, those only ``y`` reads are N, those both read are batch, and
the reduce axes are K. Packing evaluates ``x`` and ``y`` with the generic expression emitter at each
(m, k) / (n, k) point, so any affine access the region holds - a transpose, a strided conv window with
its pad Select (implicit GEMM), a gather - is packed correctly, zero-filled past the edges. The
accumulator tile lives in a C scratch across K blocks; after the last K block the rest of the region
(the epilogue: bias, activation, cast; SRNF R3) is applied element by element in the tile and stored.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Assign, Block, Comment, Decl, For, If, Kernel, Raw, Store
from kumiko.kernel.lower_cpu import CpuLowering, _refs
from kumiko.plan.plan import Plan
from kumiko.region.srnf import free_axes
from kumiko.region.ssa import Binary, Cast, Reduce, Ref, RExpr, Unary, VType
from kumiko.symbolic import Expr, prod


@dataclass(frozen=True)
class Contraction:
    let: str                  # the let holding the accumulator
    x: RExpr                  # the M-side operand
    y: RExpr                  # the N-side operand
    batch: tuple              # axis names
    m_axes: tuple
    n_axes: tuple
    k_axes: tuple             # reduce Axis objects
    pointwise: bool           # every other let is a pointwise epilogue at full depth
    outer: Reduce | None = None   # compute-at: an outer reduction over window axes around the contraction
    f: RExpr | None = None        # the pointwise map between them, with the accumulator as Ref("__acc")


def _strip(e: RExpr) -> RExpr:
    return e.x if isinstance(e, Cast) else e


def _has(e: RExpr, kinds: tuple) -> bool:
    if isinstance(e, kinds):
        return True
    return any(_has(getattr(e, k), kinds) for k in ("x", "y", "then", "other", "operand", "by", "body")
               if hasattr(e, k)) or (hasattr(e, "pred") and not hasattr(e.pred, "constraints") and
                                     _has(e.pred, kinds))


def _is_contraction(e: RExpr) -> bool:
    if not (isinstance(e, Reduce) and e.op == "sum" and e.dtype.name == "fp32"):
        return False
    body = _strip(e.body)
    return isinstance(body, Binary) and body.fn == "mul" and not any(
        _has(o, (Ref, Reduce)) for o in (body.x, body.y))


def _inner_contractions(e: RExpr) -> list:
    if _is_contraction(e):
        return [e]
    out = []
    for k in ("x", "y", "then", "other", "operand", "body"):
        if hasattr(e, k):
            out += _inner_contractions(getattr(e, k))
    return out


def _substitute(e: RExpr, target: RExpr, by: RExpr) -> RExpr:
    if e == target:
        return by
    if isinstance(e, Unary):
        return Unary(e.fn, _substitute(e.x, target, by))
    if isinstance(e, Cast):
        return Cast(_substitute(e.x, target, by), e.to)
    if isinstance(e, Binary):
        return Binary(e.fn, _substitute(e.x, target, by), _substitute(e.y, target, by))
    return e


def find_contraction(lo: CpuLowering) -> Contraction | None:
    """The first top-level let that is ``sum_K x*y`` - or ``reduce_W f(sum_K x*y)`` with f pointwise
    (a consumer reduction computed at the contraction: seed 003's Conv -> ReLU -> MaxPool)."""
    r = lo.r
    for let in r.lets:
        e, outer, f = let.expr, None, None
        if isinstance(e, Reduce) and not _is_contraction(e):
            inner = set(_inner_contractions(e.body))
            if len(inner) != 1:
                continue
            (c,) = inner
            f = _substitute(e.body, c, Ref("__acc"))
            if _has(f, (Reduce,)) or any(name != "__acc" for name, _ in _refs(f)) or \
                    not all(isinstance(a.size, int) for a in e.axes):
                continue
            outer, e = let.expr, c
        if not _is_contraction(e):
            continue
        body = _strip(e.body)
        x, y = body.x, body.y
        w_names = tuple(a.name for a in outer.axes) if outer is not None else ()
        out_axes = lo.types[let.name].axes + w_names
        k_names = {a.name for a in e.axes}
        fx = {a for a in free_axes(x) if a in lo.sizes or a in k_names or a in w_names}
        fy = {a for a in free_axes(y) if a in lo.sizes or a in k_names or a in w_names}
        if any(a in fy for a in w_names):
            continue
        batch = tuple(a for a in out_axes if a in fx and a in fy)
        m_axes = tuple(a for a in out_axes if a not in fy and a not in w_names) + w_names
        n_axes = tuple(a for a in out_axes if a in fy and a not in fx)
        if not m_axes or not n_axes:
            continue
        others = [x2 for x2 in r.lets if x2.name != let.name]
        full = len(lo.iters)
        pointwise = lo.types[let.name].axes == tuple(a.name for a in r.iters) and all(
            lo.level(o.name) == full and not _has(o.expr, (Reduce,)) and all(
                not red for _, red in _refs(o.expr)) for o in others) and r.lets.index(let) == 0
        if outer is not None and not pointwise:
            continue
        return Contraction(let.name, x, y, batch, m_axes, n_axes, e.axes, pointwise, outer, f)
    return None


def micro_kernel(mr: int, nr: int, vw: int) -> str:
    """An MR x NR register-blocked micro-kernel: C[MR][NR] (+)= sum_p A[p][MR] * B[p][NR]."""
    nv = nr // vw
    name = f"kk_micro_{mr}x{nr}_v{vw}"
    lines = [f"static void {name}(long long kc, const float* KUMIKO_RESTRICT a, const float* KUMIKO_RESTRICT b, "
             "float* KUMIKO_RESTRICT c, long long ldc, int acc) {"]
    accs = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    for i in range(mr):
        for v in range(nv):
            lines.append(f"  kk_vf {accs[i][v]} = acc ? *(const kk_vfu*)(c + {i}*ldc + {v * vw}) : (kk_vf){{0}};")
    lines.append("  for (long long p = 0; p < kc; ++p) {")
    for v in range(nv):
        lines.append(f"    kk_vf b{v} = *(const kk_vf*)(b + p*{nr} + {v * vw});")
    for i in range(mr):
        lines.append(f"    {{ const float s{i} = a[p*{mr} + {i}]; kk_vf a{i} = (kk_vf){{{', '.join([f's{i}'] * vw)}}};")
        lines.append("      " + " ".join(f"{accs[i][v]} += a{i} * b{v};" for v in range(nv)) + " }")
    lines.append("  }")
    for i in range(mr):
        for v in range(nv):
            lines.append(f"  *(kk_vfu*)(c + {i}*ldc + {v * vw}) = {accs[i][v]};")
    lines.append("}")
    return "\n".join(lines)


def vector_types(vw: int) -> str:
    return (f"typedef float kk_vf __attribute__((vector_size({4 * vw})));\n"
            f"typedef float kk_vfu __attribute__((vector_size({4 * vw}), aligned(4)));\n")


class ContractionLowering:
    """Emits the blocked contraction into a region kernel (in front of the epilogue or generic rest)."""

    def __init__(self, lo: CpuLowering, c: Contraction, plan: Plan):
        self.lo, self.c, self.plan = lo, c, plan
        self.mr, self.nr = plan.micro
        self.vw = plan.vector_width
        self.mc, self.nc, self.kc = plan.tile

    def size(self, axes) -> str:
        return C.index(prod([self.lo.sizes[a] for a in axes]) if axes else 1, set())

    def decompose(self, flat: str, axes: tuple, out: list) -> None:
        """``long long a = ...`` for each axis from a row-major flat index over ``axes``."""
        rest = flat
        for k, a in enumerate(reversed(axes)):
            size = C.index(self.lo.sizes[a], set())
            if k == len(axes) - 1:
                out.append(Decl("long long", a, rest))
            else:
                out.append(Decl("long long", a, f"({rest}) % {size}"))
                rest = f"({rest}) / {size}"

    def operand(self, e: RExpr, out: list) -> str:
        lo = self.lo
        saved = list(lo.red_axes)
        lo.red_axes = [a.name for a in self.c.k_axes + (self.c.outer.axes if self.c.outer is not None else ())]
        v = lo.expr(e, out)
        t = lo.dt(e)
        lo.red_axes = saved
        return v if t is None or t.name == "fp32" else f"(float)({v})"

    def window_epilogue(self, epilogue) -> For:
        """Reduce each window (``ws`` consecutive rows of the block: the window axes are the innermost
        M axes) of ``f(acc)`` with the outer op, then run the rest of the epilogue on the result."""
        c, lo = self.c, self.lo
        ws = _window_size(c)
        outer_m = tuple(a for a in c.m_axes if a not in {w.name for w in c.outer.axes})
        w_axes = tuple(a.name for a in c.outer.axes)
        for a in c.outer.axes:
            lo.sizes[a.name] = a.size
        lo.ty.add_axes(c.outer.axes)
        ep: list = []
        self.decompose(f"(kk_ic + ii) / {ws}", outer_m, ep)
        en: list = []
        self.decompose("kk_jc + jj", c.n_axes, en)
        ew: list = []
        self.decompose("w", w_axes, ew)
        lo.storage["__acc"] = ("scalar", "kk_w")
        lo.ty.lets["__acc"] = VType(dtypes.fp32, ())
        saved = list(lo.red_axes)
        lo.red_axes = list(w_axes)
        fv_stmts: list = []
        fv = lo.expr(c.f, fv_stmts, c.outer.dtype)
        lo.red_axes = saved
        op = c.outer.op
        ct = C.COMPUTE[c.outer.dtype.name]
        upd = {"sum": f"kk_acc + {fv}", "max": C.binary("max", "kk_acc", fv, ct),
               "min": C.binary("min", "kk_acc", fv, ct)}[op]
        win = For("w", "0", str(ws), tuple(ew) + (
            Decl("float", "kk_w", "kk_C[(kk_ic + ii + w)*kk_ncap + jj]"),) + tuple(fv_stmts) + (Assign("kk_acc", upd),))
        body = tuple(en) + (Decl(ct, "kk_acc", C.literal(c.outer.init, c.outer.dtype)), win) + tuple(epilogue())
        return For("ii", "0", f"(kk_M - kk_ic < {self.mc} ? kk_M - kk_ic : {self.mc})", tuple(ep) + (
            For("jj", "0", "(kk_N - kk_jc < kk_ncap ? kk_N - kk_jc : kk_ncap)", body),), step=str(ws))

    def emit(self, epilogue) -> list:
        """The whole contraction as statements; ``epilogue(stmts)`` appends per-element work (the current
        point's axes are declared; the accumulator value is the C variable ``kk_acc``)."""
        c, lo = self.c, self.lo
        mr, nr, mc, nc, kc = self.mr, self.nr, self.mc, self.nc, self.kc
        k_axes = tuple(a.name for a in c.k_axes)
        for a in c.k_axes + (c.outer.axes if c.outer is not None else ()):
            lo.sizes[a.name] = a.size
        lo.ty.add_axes(c.k_axes + (c.outer.axes if c.outer is not None else ()))
        s: list = [Comment(f"contraction {c.let}: batch {list(c.batch)}, M {list(c.m_axes)}, N {list(c.n_axes)}, "
                           f"K {list(k_axes)}; micro {mr}x{nr}, blocks MC={mc} NC={nc} KC={kc}"),
                   Decl("const long long", "kk_B", self.size(c.batch)),
                   Decl("const long long", "kk_M", self.size(c.m_axes)),
                   Decl("const long long", "kk_N", self.size(c.n_axes)),
                   Decl("const long long", "kk_K", self.size(k_axes)),
                   Decl("const long long", "kk_Mp", f"(kk_M + {mr - 1}) / {mr} * {mr}"),
                   Decl("const long long", "kk_ncap", f"kk_N < {nc} ? (kk_N + {nr - 1}) / {nr} * {nr} : {nc}"),
                   Decl("const long long", "kk_kcap", f"kk_K < {kc} ? kk_K : {kc}"),
                   Raw("float* kk_Bp = (float*)aligned_alloc(64, (size_t)((kk_ncap * kk_kcap * 4 + 63) / 64 * 64));\n"
                       "float* kk_C = (float*)aligned_alloc(64, (size_t)((kk_Mp * kk_ncap * 4 + 63) / 64 * 64));")]
        # pack B: NR-wide panels [p][NR] for n in [jc + jr, +NR), k in [pc, pc + kcb)
        pack_b: list = []
        self.decompose("kk_pc + p", k_axes, pack_b_k := [])
        nb: list = []
        self.decompose("kk_jc + jr + j", c.n_axes, nb)
        yv = self.operand(c.y, yb := [])
        pack_b = [For("jr", "0", "kk_ncb", (
            For("p", "0", "kk_kcb", tuple(pack_b_k) + (
                For("j", "0", str(nr), (
                    Decl("float", "kk_v", "0.0f"),
                    If("kk_jc + jr + j < kk_N", tuple(nb) + tuple(yb) + (Assign("kk_v", yv),)),
                    Store("kk_Bp", f"jr*kk_kcb + p*{nr} + j", "kk_v"))),)),), step=str(nr), parallel=True)]
        # pack A: MR-high panels [p][MR] for m in [ic + ir, +MR)
        ma: list = []
        self.decompose("kk_ic + ir + i", c.m_axes, ma)
        pack_a_k: list = []
        self.decompose("kk_pc + p", k_axes, pack_a_k)
        xv = self.operand(c.x, xb := [])
        pack_a = For("ir", "0", "kk_mcb", (
            For("i", "0", str(mr), (
                If("kk_ic + ir + i < kk_M",
                   tuple(ma) + (For("p", "0", "kk_kcb", tuple(pack_a_k) + tuple(xb) + (
                       Store("kk_Ap", f"ir*kk_kcb + p*{mr} + i", xv),)),),
                   (For("p", "0", "kk_kcb", (Store("kk_Ap", f"ir*kk_kcb + p*{mr} + i", "0.0f"),)),)),)),),
            step=str(mr))
        micro = For("jr", "0", "kk_ncb", (
            For("ir", "0", "kk_mcb", (
                Raw(f"kk_micro_{mr}x{nr}_v{self.vw}(kk_kcb, kk_Ap + ir*kk_kcb, kk_Bp + jr*kk_kcb, "
                    f"kk_C + (kk_ic + ir)*kk_ncap + jr, kk_ncap, kk_pc > 0);"),), step=str(mr)),), step=str(nr))
        # epilogue over the finished block
        if c.outer is None:
            ep: list = []
            self.decompose("kk_ic + ii", c.m_axes, ep)
            en: list = []
            self.decompose("kk_jc + jj", c.n_axes, en)
            body = tuple(en) + (Decl("float", "kk_acc", "kk_C[(kk_ic + ii)*kk_ncap + jj]"),)
            body += tuple(epilogue())
            epi = For("ii", "0", f"(kk_M - kk_ic < {mc} ? kk_M - kk_ic : {mc})", tuple(ep) + (
                For("jj", "0", "(kk_N - kk_jc < kk_ncap ? kk_N - kk_jc : kk_ncap)", body),))
        else:
            epi = self.window_epilogue(epilogue)
        block_ic = For("kk_ic", "0", "kk_M", (
            Decl("const long long", "kk_mcb",
                 f"(kk_M - kk_ic < {mc} ? (kk_M - kk_ic + {mr - 1}) / {mr} * {mr} : {mc})"),
            pack_a, micro, If("kk_pc + kk_kcb >= kk_K", (epi,))), step=str(mc), parallel=True)
        batch: list = []
        self.decompose("kk_b", c.batch, batch)
        nest = For("kk_b", "0", "kk_B", tuple(batch) + (
            For("kk_jc", "0", "kk_N", (
                Decl("const long long", "kk_ncb", f"(kk_N - kk_jc < kk_ncap ? (kk_N - kk_jc + {nr - 1}) / {nr} * {nr}"
                     " : kk_ncap)"),
                For("kk_pc", "0", "kk_K", (
                    Decl("const long long", "kk_kcb", "(kk_K - kk_pc < kk_kcap ? kk_K - kk_pc : kk_kcap)"),
                    *pack_b, block_ic), step="kk_kcap")), step="kk_ncap"),))
        s.append(Raw("#pragma omp parallel\n{\n"
                     f"float* kk_Ap = (float*)aligned_alloc(64, (size_t)(({mc} * kk_kcap * 4 + 63) / 64 * 64));"))
        s.append(_omp_for_inside(nest))
        s.append(Raw("free(kk_Ap);\n}"))
        s.append(Raw("free(kk_Bp); free(kk_C);"))
        return s


def _window_size(c: Contraction) -> int:
    return int(prod([a.size for a in c.outer.axes]))


def _omp_for_inside(s):
    """Inside ``#pragma omp parallel``, the parallel loops are worksharing ``omp for`` loops."""
    if isinstance(s, For):
        return For(s.var, s.lo, s.hi, tuple(_omp_for_inside(b) for b in s.body), s.step, parallel=False,
                   vector=s.vector, workshare=s.parallel)
    if isinstance(s, Block):
        return Block(tuple(_omp_for_inside(b) for b in s.body))
    if isinstance(s, If):
        return If(s.cond, tuple(_omp_for_inside(b) for b in s.then), tuple(_omp_for_inside(b) for b in s.other))
    return s


def lower_contraction_region(lo: CpuLowering, plan: Plan) -> Kernel | None:
    """The region as contraction (+ in-tile epilogue, or + generic rest over a scratch accumulator)."""
    c = find_contraction(lo)
    if c is None:
        return None
    cl = ContractionLowering(lo, c, plan)
    if c.pointwise:
        def epilogue() -> list:
            lo.storage = {c.let: ("scalar", "kk_acc")}
            out: list = []
            lo.red_axes = []
            for let in lo.r.lets:
                if let.name == c.let:
                    continue
                v = lo.expr(let.expr, out, lo.types[let.name].dtype)
                lo.storage[let.name] = ("scalar", f"v_{let.name}")
                out.append(Decl(C.COMPUTE[lo.types[let.name].dtype.name], f"v_{let.name}", v))
            out += lo.store(Ref(lo.r.yields[0].src))
            return out
        body = cl.emit(epilogue)
        return _kernel(lo, body)
    # 2-phase: accumulator into a full scratch array over its axes, then the generic nest for the rest
    axes = lo.types[c.let].axes
    scratch = "a_" + c.let
    size = C.index(prod([lo.sizes[a] for a in axes]), set())

    def to_scratch() -> list:
        off = C.offset(tuple(Expr.sym(a) for a in axes), tuple(lo.sizes[a] for a in axes), set(axes))
        return [Store(scratch, off, "kk_acc")]
    body = [Raw(f"float* {scratch} = (float*)malloc(sizeof(float) * (size_t)({size}));")] + cl.emit(to_scratch)
    rest = [x for x in lo.r.lets if x.name != c.let]
    import dataclasses
    lo.r = dataclasses.replace(lo.r, lets=tuple(rest))
    tree = lo.schedule()
    lo.plan_storage(tree)
    lo.storage[c.let] = ("array", scratch, axes)
    lo.red_axes = []
    from kumiko.kernel.lower_cpu import _parallelize
    body += [_parallelize(s) for s in lo.emit_items(tree, ())]
    body.append(Raw(f"free({scratch});"))
    return _kernel(lo, body)


def _kernel(lo: CpuLowering, body: list) -> Kernel:
    from kumiko.kernel.loops import Param
    params = tuple(Param(lo.cname[n], C.STORAGE[m.dtype.name], n in dict(lo.r.inputs)) for n, m in lo.memrefs.items())
    return Kernel(lo.name, params, lo.syms, tuple(body), lo.r.notes, gather_check=lo.uses_gather)


