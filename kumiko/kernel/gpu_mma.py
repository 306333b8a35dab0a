"""Instantiating the one MMA skeleton for a contraction region (seed 001 §9.1, SM80 path).

The contraction is found structurally by the region analysis (``kumiko.region.analysis.find_contraction``:
batch, M, N, K axes and the operands ``x``, ``y``); nothing here knows an op name. The Plan is injected:
tile (BM, BN, BK), stages, warp tile, the tail predicates, the epilogue and ``async.epilogue_overlap``. Each operand is
staged into a shared-memory ring either by cp.async, when it is a plain row-major tile of a MemRef (its
M/N and K axes are the trailing indices, in one of the two orders; rows 16-byte aligned, checked at run
time), or by a guarded scalar gather that evaluates the operand's expression at each (row, k) point -
transposes, conv windows with the pad Select as zero-fill (implicit GEMM), anything affine. Tails are
zero-filled (cp.async src-size, or the gather's guard), so the MMAs need no predicates.

The epilogue runs on the accumulator fragments: the region's other lets at each element, then a
predicated store. Two region shapes need more: a pointwise map and a window reduction over M rows after
the contraction (Conv -> ReLU -> MaxPool) stages the accumulator tile through shared memory, because a
window's rows live in different lanes; any other consumer (a row softmax over N) gets the accumulator in
a global scratch array and a SIMT kernel for the rest (``gpu_simt``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.kernel import cexpr as C
from kumiko.kernel.gpu_ir import (
    Barrier,
    CommitGroup,
    Compute,
    Epilogue,
    GatherTable,
    KLoop,
    LdMatrix,
    LoadFrag,
    LoadTile,
    Mma,
    MmaFrag,
    MmaKernel,
    OperandLoad,
    Param,
    SmemRing,
    SplitK,
    StGlobal,
    TileRef,
    Token,
    VecAccess,
    WaitGroup,
)
from kumiko.kernel.gpu_simt import accumulator_code, decompose, extent, kernel_params, status_params
from kumiko.kernel.loops import Assign, Decl
from kumiko.kernel.lower_base import RegionEmitter
from kumiko.kernel.pack import advance_counter
from kumiko.plan.gpu import MMA_DTYPES, mma_operand_dtype, ring_release
from kumiko.plan.plan import Plan
from kumiko.region.analysis import Contraction, analyze
from kumiko.region.operands import table_form
from kumiko.region.ssa import Cast, Read, Ref, Region, RExpr, VType
from kumiko.symbolic import Expr, FloorDiv, Sym

PAD = 8                     # halves of padding per smem row: rows stay 16-byte aligned, banks rotate


@dataclass(frozen=True)
class MmaLowering:
    """What instantiating the skeleton produced: the kernel, and for a two-kernel region the scratch
    array the accumulator goes to (``scratch``: (param name, let, axes))."""
    kernel: MmaKernel
    contraction: Contraction
    scratch: tuple | None = None


def _vec_access(lo: RegionEmitter, e: RExpr, s_axes: tuple, k_axes: tuple) -> tuple[str, VecAccess] | None:
    """(layout, access) when ``e`` is a plain 2-D tile of a 16-bit MemRef: the trailing indices are
    exactly the operand's s axes then its K axes (``sk``: K contiguous) or K then s (``ks``), bare, with
    the MemRef's extents equal to the axes' sizes; leading indices use neither."""
    if not isinstance(e, Read) or e.flat:
        return None
    m = lo.memrefs[e.tensor]
    if m.dtype.name not in MMA_DTYPES:
        return None
    n = len(s_axes) + len(k_axes)
    comps = [Expr.lift(i) for i in e.index]
    if len(comps) < n:
        return None
    names = [x.as_symbol() for x in comps[-n:]]
    if any(x.symbols() & (set(s_axes) | set(k_axes)) for x in comps[:-n]):
        return None
    if names == list(s_axes) + list(k_axes):
        layout, contig = "sk", extent(lo, k_axes)
    elif names == list(k_axes) + list(s_axes):
        layout, contig = "ks", extent(lo, s_axes)
    else:
        return None
    if any(Expr.lift(d) != Expr.lift(lo.sizes[a]) for d, a in zip(m.shape[-n:], names)):
        return None
    off = C.offset(e.index, m.shape, lo.axes_in_scope())
    steps = ("(" + extent(lo, k_axes) + ")", "1") if layout == "sk" else ("1", f"({contig})")
    return layout, VecAccess(lo.cname[e.tensor], f"({contig}) % 8 == 0", off, *steps)


def _below(size, limit: int) -> bool:
    """Whether an axis size is a constant below ``limit``."""
    n = Expr.lift(size).as_int()
    return n is not None and n < limit


def _bound(e: Expr, sizes: dict, axes: set, scope: set) -> str | None:
    """C text (64-bit) bounding ``|e|`` while its ``axes`` range over ``[0, size)`` (sizes are positive): a term
    is a number times sizes times at most one axis, or a number times the floor division of such an expression by
    a constant (a flattened K split back into a head and its offset: ``floor(r0/64)``); None when an axis occurs
    otherwise (squared, a floor division times another factor)."""
    parts = [f"{abs(e.const)}LL"] if e.const else []
    for mono, coef in e.terms:
        if len(mono) == 1 and isinstance(mono[0], FloorDiv) and mono[0].num.symbols() & axes:
            inner = _bound(mono[0].num, sizes, axes, scope)
            if inner is None:
                return None
            parts.append(f"{abs(coef)}LL * ({inner} / {mono[0].den}LL + 1LL)")
            continue
        ax = [a for a in mono if isinstance(a, Sym) and a.name in axes]
        if any(not isinstance(a, Sym) and set(a.num.symbols()) & axes for a in mono) or len(ax) > 1:
            return None
        factors = Expr({tuple(a for a in mono if a not in ax): abs(coef)}) if len(mono) > len(ax) else None
        term = [C.index(factors, scope)] if factors is not None else [f"{abs(coef)}LL"] if abs(coef) != 1 else []
        if ax:
            term.append(f"({C.index(sizes[ax[0].name], set())} - 1LL)")
        parts.append(" * ".join(term) or "1LL")
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0] if parts else "0LL"


def _table(lo: RegionEmitter, e: RExpr, side: str, s_axes: tuple, k_axes: tuple, batch: tuple,
           mma_dt: str) -> GatherTable | None:
    """The operand's gather through per-warp K tables (``GatherTable``), when it has a table form whose parts
    are bounded (affine in each axis); None otherwise."""
    tf = table_form(e, lo.memrefs, set(s_axes), set(k_axes))
    if tf is None:
        return None
    scope = lo.axes_in_scope()
    rest, rp, kp = tf.off
    rows = set(s_axes) | set(batch)
    cols: list = [kp]
    guards: list = []
    row_ok: list = []
    ints: list = []                         # every value the table path computes in 32 bits
    for op, (g0, gr, gk) in tf.guards:
        r = g0 + gr
        if gk.as_int() == 0:
            row_ok.append(f"({C.index(r, scope)}) {'>=' if op == 'ge' else '=='} 0")
            continue
        if gk in cols:
            i, sign = cols.index(gk), 1
        elif -gk in cols:
            i, sign = cols.index(-gk), -1
        else:
            cols.append(gk)
            i, sign = len(cols) - 1, 1
        # sign * col + r (>= | ==) 0
        if op == "ge":
            guards.append(("ge", i, C.index(-r, scope)) if sign == 1 else ("le", i, C.index(r, scope)))
        else:
            guards.append(("eq", i, C.index(-r if sign == 1 else r, scope)))
        ints.append((r, rows))
    ints += [(x, set(k_axes)) for x in cols]
    bounds = [_bound(x, lo.sizes, ax, scope) for x, ax in ints]
    if any(b is None for b in bounds):
        return None
    buf = lo.cname[tf.tensor]
    raw = tf.dtype.name == mma_dt and tf.value in (Ref("__ld"), Cast(Ref("__ld"), dtypes.fp32))
    value: list = []
    ld_decl = ""
    if not raw:
        saved = dict(lo.storage)
        lo.storage["__ld"] = ("scalar", "kk_ld")
        lo.ty.lets["__ld"] = VType(tf.dtype, ())
        v = lo.expr(tf.value, value)
        value.append(Assign("kk_v", f"(float)({v})"))
        lo.storage = saved
        ld = C.load("kk_gb" + side, "kk_ix", tf.dtype).replace(f"kk_gb{side}[kk_ix]", f"__ldg(kk_gb{side} + kk_ix)")
        ld_decl = f"const {C.COMPUTE[tf.dtype.name]} kk_ld = {ld};"
    return GatherTable(buf, C.STORAGE[tf.dtype.name], C.index(rest, scope), C.index(rp, scope),
                       tuple(C.index(x, scope) for x in cols), tuple(guards), " && ".join(row_ok) or "true",
                       " && ".join(f"{b} < (1LL << 30)" for b in bounds), raw, tuple(value), ld_decl)


def _operand(lo: RegionEmitter, c: Contraction, side: str, ring: str, allow_ks: bool,
             mma_dt: str) -> tuple[OperandLoad, str]:
    e = c.x if side == "x" else c.y
    s_axes = c.m_axes if side == "x" else c.n_axes
    k_axes = tuple(a.name for a in c.k_axes)
    window = tuple(a.name for a in c.outer.axes) if c.outer is not None else ()
    lo.red_axes = list(k_axes) + list(window)
    decl_s: list = []
    decompose(lo, f"kk_s{side}", s_axes, decl_s)
    decl_k: list = []
    decompose(lo, "kk_gk", k_axes, decl_k)
    # the same decomposition as mutable counters; one below a constant size (conv's kh, kw) is an int: its
    # updates cost a third of a 64-bit one's
    run_k = [replace(d, ctype="int" if _below(lo.sizes[d.name], 2 ** 31) else "long long") for d in decl_k]
    advance_k = advance_counter(k_axes, tuple(C.index(lo.sizes[a], set()) for a in k_axes))
    gather: list = []
    v = lo.expr(e, gather)
    t = lo.dt(e)
    gather.append(Assign("kk_v", v if t is None or t.name == "fp32" else f"(float)({v})"))
    acc = _vec_access(lo, e, s_axes, k_axes)
    lo.red_axes = []
    layout, vec = ("sk", None)
    if acc is not None and (acc[0] == "sk" or allow_ks):
        layout, vec = acc
    lo.red_axes = list(k_axes) + list(window)
    table = _table(lo, e, side, s_axes, k_axes, c.batch, mma_dt) if vec is None else None
    lo.red_axes = []
    return OperandLoad(side, ring, extent(lo, s_axes), extent(lo, k_axes), tuple(decl_s), tuple(decl_k),
                       tuple(gather), vec, tuple(run_k), advance_k, table), layout


def lower_mma(region: Region, syms: tuple, name: str, plan: Plan) -> MmaLowering:
    """Instantiate the MMA skeleton for ``region`` under ``plan`` (raises E1801 when it does not apply)."""
    facts = analyze(region)
    c = facts.contraction
    lo = RegionEmitter(region, syms, name, facts=facts)
    at = f"region {region.name}"
    if c is None:
        raise KumikoError("E1801", at=at, why="an MMA plan needs a contraction and this region has none",
                          suggestion='use algo_choice {"region": "simt"}')
    dt = mma_operand_dtype(facts, c)
    if dt is None:
        raise KumikoError("E1801", at=at, why=f"mma.sync needs fp16 or bf16 operands, the contraction's are "
                          f"{lo.dt(c.x)} and {lo.dt(c.y)}", suggestion='use algo_choice {"region": "simt"}')
    bm, bn, bk = plan.tile
    wm, wn = (int(x) for x in str(plan.warp_tile).split("x"))
    stages = plan.stages
    for a in c.k_axes + (c.outer.axes if c.outer is not None else ()):
        lo.sizes[a.name] = a.size
    lo.ty.add_axes(c.k_axes + (c.outer.axes if c.outer is not None else ()))
    ld_x, _ = _operand(lo, c, "x", "sA", allow_ks=False, mma_dt=dt)
    ld_y, lay_y = _operand(lo, c, "y", "sB", allow_ks=True, mma_dt=dt)
    ring_x = SmemRing("sA", "x", "sk", bm, bk, PAD, stages)
    ring_y = SmemRing("sB", "y", lay_y, bk if lay_y == "ks" else bn, bn if lay_y == "ks" else bk, PAD, stages)
    # the batch is the grid's z (its axes are decomposed from blockIdx.z below); split-K CTAs of one output tile
    # are consecutive in z
    splits = int(plan.split_k)
    setup: list = [Decl("const long long", "kk_M", extent(lo, c.m_axes)),
                   Decl("const long long", "kk_N", extent(lo, c.n_axes)),
                   Decl("const long long", "kk_K", extent(lo, tuple(a.name for a in c.k_axes)))]
    decompose(lo, "(long long)blockIdx.z" if splits == 1 else f"(long long)(blockIdx.z / {splits}u)", c.batch, setup)
    setup += lo.unit_decls(c)
    window = tuple(a.name for a in c.outer.axes) if c.outer is not None else ()
    decl_m: list = []
    decl_n: list = []
    decompose(lo, "kk_gn", c.n_axes, decl_n)
    scratch = None
    extra: tuple = ()
    m_step = 0
    t_mma, t_epi = Token("tC", "TokCompute"), Token("tE", "TokEpilogue")
    overlap = bool(plan.get("async_", "epilogue_overlap", False))
    ops = tuple(plan.epilogue)
    if c.outer is not None:
        outer_m = tuple(a for a in c.m_axes if a not in window)
        decompose(lo, "kk_go", outer_m, decl_m)
        decompose(lo, "kk_w", window, decl_m_w := [])
        lo.storage = {"__acc": ("scalar", "kk_acc")}
        lo.ty.lets["__acc"] = VType(dtypes.fp32, ())
        lo.red_axes = list(window)
        body: list = []
        fv = lo.expr(c.f, body, c.outer.dtype)
        body.append(Decl("const float", "kk_f", fv))
        used = " ".join(repr(x) for x in body)      # a window axis is declared where the window row's code uses it
        wcode = [d for d in decl_m_w if re.search(rf"\b{d.name}\b", used)] + body
        outer_let = next(x.name for x in lo.r.lets if x.expr == c.outer)
        code = tuple(lo.point_code(outer_let, "kk_red"))
        ws = 1
        for a in c.outer.axes:
            ws *= int(a.size)
        epi = Epilogue(ops, t_mma, t_epi, "smem_window", ws, code, tuple(wcode), c.outer.op,
                       C.literal(c.outer.init, c.outer.dtype), overlap)
        m_step = bm // ws * ws if bm % ws else 0     # tiles start whole windows apart (a 49-row pool, BM 64)
    else:
        decompose(lo, "kk_gm", c.m_axes, decl_m)
        code, scratch, extra = accumulator_code(lo, c)
        epi = Epilogue(ops, t_mma, t_epi, "fragment", 1, code, overlap=overlap)
    t_load = Token("tL", "TokLoad")
    lda, ldb, mma = LdMatrix("x", False), LdMatrix("y", lay_y == "ks"), Mma(dt)
    release = ring_release(plan)                             # one of RELEASES (validate_gpu_plan)
    # the ring's schedule: "trailing" keeps every stage in flight and releases the stage just read with a
    # second barrier; "merged" keeps stages - 1 in flight and refills the stage read in the previous
    # iteration right after this iteration's one barrier, which also released it; "registers" double-
    # buffers the fragments: k16 step j + 1 is loaded while step j's MMAs run, and the one barrier sits
    # after the tile's last ldmatrix (its stage is free from there on) and before the next tile's first,
    # so that load's latency hides behind the last step's MMAs (BK a multiple of 32: the steps alternate
    # between the two register buffers the same way in every tile)
    ahead = stages if release == "trailing" else stages - 1
    prologue = []
    for s in range(ahead):
        prologue += [LoadTile(TileRef(s, in_loop=False), t_load), CommitGroup()]
    compute = Compute(TileRef(0), (t_load,), t_mma, lda, ldb, mma)
    if release == "trailing":
        body = [WaitGroup(stages - 1, (t_load,)), Barrier("landed"), compute,
                Barrier("release"), LoadTile(TileRef(stages), t_load), CommitGroup()]
    elif release == "merged":
        body = [WaitGroup(stages - 2, (t_load,)), Barrier("landed+release"),
                LoadTile(TileRef(stages - 1), t_load), CommitGroup(), compute]
    else:
        steps = bk // 16
        prologue += [WaitGroup(stages - 2, (t_load,)), Barrier("landed"),
                     LoadFrag(TileRef(0, in_loop=False), 0, 0, (t_load,), lda, ldb)]
        body = []
        for j in range(steps - 1):
            body += [LoadFrag(TileRef(0), j + 1, (j + 1) % 2, (t_load,), lda, ldb), MmaFrag(j % 2, t_mma, mma)]
            if j == 0:      # the refill's address arithmetic issues while step 0's MMAs run
                body += [LoadTile(TileRef(stages - 1), t_load), CommitGroup()]
        body += [WaitGroup(stages - 2, (t_load,)), Barrier("landed+release"),
                 LoadFrag(TileRef(1), 0, 0, (t_load,), lda, ldb), MmaFrag((steps - 1) % 2, t_mma, mma)]
    drain: tuple = ()
    if epi.mode == "smem_window" or not overlap:
        drain = (WaitGroup(0),)
    if epi.mode == "smem_window":
        drain += (Barrier("epilogue"),)
    notes = tuple(region.notes) + (
        f"MMA skeleton: contraction {c.let}, batch {list(c.batch)}, M {list(c.m_axes)}, N {list(c.n_axes)}, "
        f"K {[a.name for a in c.k_axes]}; x by {'cp.async' if ld_x.vec else 'gather'}, "
        f"y by {'cp.async' if ld_y.vec else 'gather'} ({lay_y})",)
    split = None
    if splits > 1:
        split = SplitK(splits, "kk_ws", "kk_cnt")
        extra += (Param("kk_ws", "float"), Param("kk_cnt", "int"))
    kern = MmaKernel(name, plan.arch, kernel_params(lo, extra + status_params(lo)), (bm, bn, bk), (bm // wm, bn // wn),
                     stages,
                     (ring_x, ring_y), (ld_x, ld_y), tuple(prologue), KLoop("kt", tuple(body)), drain, epi,
                     StGlobal(t_epi, width=2 if epi.mode == "fragment" else 1), tuple(setup), tuple(decl_m),
                     tuple(decl_n), notes, group_m=int(plan.get("layout_hints", "group_m", 1)),
                     gather_check=lo.uses_gather, split=split, m_step=m_step)
    return MmaLowering(kern, c, scratch)
