"""Row-block fusion of a producer/consumer pair of contraction regions: the CPU's answer to seed 001
§6.9 (``materialize: "deferred"`` hands a value to the next region on the same core, with no round trip
through memory) and §15.3 (attention as ``streaming_softmax``).

The pair is found from the regions' structure, never from op names:

- the **producer** ``k0`` is a contraction ``c0`` (batch, one M axis, one N axis, K) followed by a *row
  program*: lets whose reductions run only over the N axis (a row softmax, a row normalisation, ...), at least
  one (two GEMMs with only a pointwise map between them stay two kernels, each with its constants pre-packed). It
  yields one fp32 buffer ``P[batch, M, N]`` that is ``deferred`` (read by the next region only);
- the **consumer** ``k1`` is a contraction ``c1`` whose M-side operand is exactly ``P`` read at
  (batch, M, K1) - the same batch and row axes, with P's N axis as its reduce axis - plus a pointwise
  epilogue; its N-side operand does not read ``P``.

One kernel then runs both, a block of ``BM`` rows at a time (``BM`` a multiple of both contractions'
micro-tile rows; each contraction keeps its own plan's micro-tile):

1. (parallel) both N-side operands are packed once, for every batch point, into full-K panels; for each
   batch point the runtime notes whether ``c1``'s panel is all finite;
2. (parallel over batch x row blocks) the block's rows of ``c0``'s M-side operand are packed and the
   micro-kernels fill an ``S`` tile [BM x N]. A micro-tile whose every point fails the guard under which
   the accumulator is *only* consumed (a causal mask: ``select(i >= j, s, -inf)``) is not computed - its
   values would be discarded. The generic loop-nest emitter then runs the row program on the tile's rows
   (its outer loops pinned to the block) and stores ``P`` straight into ``c1``'s packed A-panel layout,
   so ``P`` never reaches memory. The columns where the block's ``P`` is nonzero bound ``c1``'s K range:
   when ``c1``'s panel is finite, ``0 * v`` adds nothing and skipping is exact (fully masked key blocks
   cost nothing). ``c1``'s micro-kernels, epilogue and store follow.

The result equals running the two regions one after the other (same operations per element, the same
summation order within each micro-kernel), which the tests check against the numpy evaluator.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

from kumiko.kernel import cexpr as C
from kumiko.kernel.contract import ContractionLowering, pointwise_epilogue
from kumiko.kernel.elide import Elision, masked_elision, prefix_bound
from kumiko.kernel.loops import Block, Comment, Decl, For, If, Kernel, Param, Raw, Store
from kumiko.kernel.lower_cpu import CpuLowering, hoisted
from kumiko.kernel.micro import micro_name
from kumiko.plan.plan import Plan
from kumiko.region.analysis import Contraction, RegionFacts, chained_contractions, reused_reduce_axes
from kumiko.region.srnf import children
from kumiko.region.ssa import Guard, Program, Reduce, Ref, RExpr, Select
from kumiko.symbolic import Expr

#: rows per block, in micro-tiles: the S and P tiles of a block (BM x N floats each) stay in L2
BLOCK_MICRO_ROWS = 4


@dataclass
class RowPipe:
    f0: RegionFacts            # the producer region's facts
    c0: Contraction
    f1: RegionFacts            # the consumer's
    c1: Contraction
    p: str                     # the deferred buffer the pair never writes
    guards: tuple              # Guard, ...: the accumulator of c0 is only consumed where one holds
    elide: Elision | None = None   # a block's columns past ``bound`` need no row program (checks to run)
    bound: str = ""               # C: the first such column, from the block's last row ``kk_mhi``


def acc_guards(lets: tuple, acc: str, yielded: tuple = ()) -> tuple | None:
    """The guards under which the value of ``acc`` is observed, when that is the only way it is observed.

    Lets computed pointwise from ``acc`` are followed; every other use must sit in the ``then`` branch
    of a guarded Select at the same point. None when some use escapes (a reduction over it, or a
    yielded let computed from it): then every point is needed."""
    derived, guards = {acc}, []

    def walk(e: RExpr, guard: Guard | None, reduced: bool) -> bool | None:
        """True: e's value depends on a derived let outside any guard (pointwise); None: escapes."""
        if isinstance(e, Ref):
            if e.name not in derived:
                return False
            if guard is not None:
                guards.append(guard)
                return False
            return None if reduced else True
        if isinstance(e, Select) and isinstance(e.pred, Guard):
            t = walk(e.then, e.pred if guard is None else guard, reduced)
            o = walk(e.other, guard, reduced)
            if t is None or o is None:
                return None
            return t or o
        hit = False
        for k in children(e):
            r = walk(k, guard, reduced or isinstance(e, Reduce))
            if r is None:
                return None
            hit = hit or r
        return hit

    for let in lets:
        if let.name == acc:
            continue
        r = walk(let.expr, None, False)
        if r is None:
            return None
        if r:
            derived.add(let.name)
    if derived & set(yielded):
        return None
    return tuple(dict.fromkeys(guards)) if guards else None


def find_pipe(program: Program, k: int, syms: tuple, plans: dict) -> RowPipe | None:
    """The row-block pipeline of regions ``k`` and ``k + 1``, when their structure allows it."""
    if k + 1 >= len(program.regions):
        return None
    r0, r1 = program.regions[k], program.regions[k + 1]
    p0, p1 = plans[r0.name], plans[r1.name]
    if p0.algo != "packed" or p1.algo != "packed" or p0.arch != p1.arch or p0.vector_width != p1.vector_width:
        return None
    if len(r0.outputs) != 1 or r0.outputs[0].materialize != "deferred":
        return None
    if r0.outputs[0].memref.dtype.name != "fp32" or r0.yields[0].cast is not None:
        return None
    ch = chained_contractions(program, k)
    if ch is None:
        return None
    f0, c0, f1, c1, p, m0, n0 = ch.f0, ch.c0, ch.f1, ch.c1, ch.p, ch.m0, ch.n0
    iters0 = list(ch.iters0)
    rest = [x for x in r0.lets if x.name != c0.let]
    if any(not reused_reduce_axes(x.expr, set(iters0)) <= {n0} for x in rest):
        return None
    # no row program (two GEMMs with a pointwise map between, a transformer's MLP): the pair keeps nothing out of
    # memory the plain path would not keep in cache, and it would pack c1's N side on every call where the plain
    # path reads a constant's panels packed once (GPT-2's 12 MLPs at batch 1: 73.6 ms a call, 34 as two kernels each)
    if not any(reused_reduce_axes(x.expr, set(iters0)) for x in rest):
        return None
    guards = acc_guards(r0.lets, c0.let, tuple(y.src for y in r0.yields)) or ()
    elide, bound = None, ""
    if guards:
        bound = prefix_bound(guards, m0, n0, "kk_mhi", set(iters0), lambda e: C.index(e, {"kk_mhi"})) or ""
        elide = masked_elision(r0.lets, c0.let, n0, guards, r0.yields[0].src, f0.types) if bound else None
    return RowPipe(f0, c0, f1, c1, p, guards, elide, bound if elide is not None else "")


def _rewrite(s, on_for):
    """``s`` with every For replaced by ``on_for(loop)`` (its body rewritten first); Blocks and Ifs are
    rebuilt around them, other statements kept."""
    if isinstance(s, For):
        return on_for(dataclasses.replace(s, body=tuple(_rewrite(b, on_for) for b in s.body)))
    if isinstance(s, Block):
        return dataclasses.replace(s, body=tuple(_rewrite(b, on_for) for b in s.body))
    if isinstance(s, If):
        return If(s.cond, tuple(_rewrite(b, on_for) for b in s.then), tuple(_rewrite(b, on_for) for b in s.other))
    return s


def _pin(s, bounds: dict):
    """Loops over the batch and row axes run over the block only."""
    def pin(loop: For) -> For:
        # a pinned axis always encloses the N loop, so it is never a vector loop (step 1, no tail)
        assert loop.var not in bounds or (loop.step == "1" and not loop.tail), loop.var
        lo, hi = bounds.get(loop.var, (loop.lo, loop.hi))
        return dataclasses.replace(loop, lo=lo, hi=hi, parallel=False, collapse=1)
    return _rewrite(s, pin)


def _box_max(e: Expr, box: dict) -> Expr:
    """The largest value of affine ``e`` over a box {axis: (lo var, hi var)}: each axis at the end its
    coefficient's sign picks."""
    return e.subs({a: Expr.sym(hi if e.coeff(a) > 0 else lo) for a, (lo, hi) in box.items()})


def _affine_in(e: Expr, axes) -> bool:
    rest = e - sum((Expr.sym(a) * e.coeff(a) for a in axes), Expr.lift(0))
    return not (rest.symbols() & set(axes))


def block_rows(mr0: int, mr1: int) -> int:
    """BM: BLOCK_MICRO_ROWS micro-tiles of the first contraction, rounded up to whole micro-tiles of the
    second (each contraction keeps its plan's micro-tile: attention's P x V with a 64-wide head takes 6 x 64
    tiles, P read once per block, while Q x K^T keeps 12 x 32)."""
    step = math.lcm(mr0, mr1)
    return -(-mr0 * BLOCK_MICRO_ROWS // step) * step


def lower_pipe(pipe: RowPipe, plan0: Plan, plan1: Plan, syms: tuple, name: str, cname: dict,
               notes: tuple) -> Kernel:
    c0, c1 = pipe.c0, pipe.c1
    lo0 = CpuLowering(pipe.f0.region, syms, name, facts=pipe.f0)
    lo1 = CpuLowering(pipe.f1.region, syms, name, facts=pipe.f1)
    lo0.cname = lo1.cname = cname
    try:
        rp = _row_program(pipe, lo0)
    except ValueError:             # the elision's row checks have nowhere to go: every column, every block
        pipe = dataclasses.replace(pipe, elide=None, bound="")
        rp = _row_program(pipe, lo0)
    (mr, nr), (mr1, nr1) = plan0.register_block, plan1.register_block
    vw = plan0.vector_width
    kc, kc1 = plan0.cache_block.kc, plan1.cache_block.kc
    bm = block_rows(mr, mr1)
    lo1.n_tmp = 1000                      # temporaries of the two lowerings never share a name
    cl0, cl1 = ContractionLowering(lo0, c0, plan0), ContractionLowering(lo1, c1, plan1)
    for lo, c in ((lo0, c0), (lo1, c1)):
        for a in c.k_axes:
            lo.sizes[a.name] = a.size
        lo.ty.add_axes(c.k_axes)
    k0 = tuple(a.name for a in c0.k_axes)
    k1 = c1.k_axes[0].name
    micro = micro_name(mr, nr, vw)
    s: list = [
        Comment(f"row-block pipeline: {lo0.r.name} (contraction {c0.let} + row program) -> {lo1.r.name} "
                f"(contraction {c1.let} + epilogue); {pipe.p} stays in the block's packed panels; "
                f"micro {mr}x{nr} then {mr1}x{nr1}, BM={bm}, KC={kc} then {kc1}"),
        Decl("const long long", "kk_B", cl0.size(c0.batch)),
        Decl("const long long", "kk_M", cl0.size(c0.m_axes)),
        Decl("const long long", "kk_N0", cl0.size(c0.n_axes)),
        Decl("const long long", "kk_K0", cl0.size(k0)),
        Decl("const long long", "kk_N1", cl1.size(c1.n_axes)),
        Decl("const long long", "kk_K1", "kk_N0"),
        # the P tile's row stride: padded so that MR rows 4 KiB apart do not share an L1 set
        Decl("const long long", "s_kk_ldP", "(kk_K1 + 15) / 16 * 16 + 16"),
        Decl("const long long", "kk_N0p", f"(kk_N0 + {nr - 1}) / {nr} * {nr}"),
        Decl("const long long", "kk_N1p", f"(kk_N1 + {nr1 - 1}) / {nr1} * {nr1}"),
        Decl("const long long", "s_kk_ldS", "kk_N0p + 16"),
        Decl("const long long", "kk_nblk", f"(kk_M + {bm - 1}) / {bm}"),
        Raw("float* kk_Y0 = (float*)kk_scratch(5, sizeof(float) * (size_t)(kk_B * kk_N0p * kk_K0));\n"
            "float* kk_Y1 = (float*)kk_scratch(6, sizeof(float) * (size_t)(kk_B * kk_N1p * kk_K1));\n"
            "unsigned char* kk_fin = (unsigned char*)malloc((size_t)kk_B);"),
    ]
    # 1. pack both N-side operands for every batch point: panels [jr][p][NR] over the full K
    for c, cl, ybuf, npad, ksz, kaxes, w in ((c0, cl0, "kk_Y0", "kk_N0p", "kk_K0", k0, nr),
                                             (c1, cl1, "kk_Y1", "kk_N1p", "kk_K1", (k1,), nr1)):
        nsz = "kk_N0" if c is c0 else "kk_N1"
        bat: list = cl.lo.unit_decls(c)
        cl.decompose("kk_b", c.batch, bat)
        pk: list = []
        cl.decompose("p", kaxes, pk)
        nb: list = []
        cl.decompose("jr + j", c.n_axes, nb)
        yv = cl.operand(c.y, yb := [])
        inner = For("j", "0", str(w), (
            Decl("float", "kk_v", "0.0f"),
            If(f"jr + j < {nsz}", tuple(nb) + tuple(yb) + (Raw(f"kk_v = {yv};"),)),
            Store(ybuf, f"(kk_b * {npad} + jr) * {ksz} + p*{w} + j", "kk_v")))
        s.append(For("kk_b", "0", "kk_B", tuple(bat) + (
            For("jr", "0", npad, (For("p", "0", ksz, tuple(pk) + (inner,)),), step=str(w)),), parallel=True))
    s.append(For("kk_b", "0", "kk_B", (
        Decl("const float*", "kk_y", "kk_Y1 + kk_b * kk_N1p * kk_K1"),
        Decl("int", "kk_ok", "1"),
        For("t", "0", "kk_N1p * kk_K1", (Raw("kk_ok &= (kk_y[t] - kk_y[t] == 0.0f);"),)),
        Store("kk_fin", "kk_b", "(unsigned char)kk_ok")), parallel=True))

    # 2. per (batch point, block of rows)
    blk: list = [Decl("const long long", "kk_b", "kk_u / kk_nblk"),
                 Decl("const long long", "kk_ic", f"(kk_u % kk_nblk) * {bm}"),
                 Decl("const long long", "kk_rows", f"(kk_M - kk_ic < {bm} ? kk_M - kk_ic : {bm})"),
                 Decl("const long long", "kk_mcb", f"(kk_rows + {mr - 1}) / {mr} * {mr}"),
                 Decl("const long long", "kk_mcb1", f"(kk_rows + {mr1 - 1}) / {mr1} * {mr1}"),
                 Decl("long long", "s_kk_nh", "kk_N0")]
    if pipe.elide is not None:
        # the block's columns from s_kk_nh on fail every guard for every row: no S tile, no row program,
        # no P there (exact while c1's panel is finite; see kumiko.kernel.elide)
        blk.append(If("kk_fin[kk_b]", (Raw("const long long kk_mhi = kk_ic + kk_rows - 1;\n"
                                           f"s_kk_nh = {pipe.bound};\n"
                                           "s_kk_nh = s_kk_nh > kk_N0 ? kk_N0 : s_kk_nh < 1 ? 1 : s_kk_nh;"),)))
    # 2a. pack the block's rows of c0's M-side operand: panels [ir][p][MR] over the full K0
    bat0: list = lo0.unit_decls(c0)
    cl0.decompose("kk_b", c0.batch, bat0)
    ma: list = []
    cl0.decompose("kk_ic + ir + i", c0.m_axes, ma)
    pk0: list = []
    cl0.decompose("p", k0, pk0)
    xv = cl0.operand(c0.x, xb := [])
    pack_a = For("ir", "0", "kk_mcb", (For("i", "0", str(mr), (
        If("ir + i < kk_rows",
           tuple(ma) + (For("p", "0", "kk_K0", tuple(pk0) + tuple(xb) + (
               Store("kk_A0", f"ir*kk_K0 + p*{mr} + i", xv),)),),
           (For("p", "0", "kk_K0", (Store("kk_A0", f"ir*kk_K0 + p*{mr} + i", "0.0f"),)),)),)),), step=str(mr))
    # 2b. S tile = A0 * Y0, skipping micro-tiles that every guard on the accumulator rejects. The tile's
    # rows are s_kk_ldS >= N0p long (a last panel narrower than NR writes into the padding; the padding
    # also keeps MR rows 4 KiB apart out of one L1 set); the row program indexes it with that stride
    call0 = Raw(f"for (long long pc = 0; pc < kk_K0; pc += {kc}) {{\n"
                f"  const long long kcb = kk_K0 - pc < {kc} ? kk_K0 - pc : {kc};\n"
                f"  {micro}(kcb, kk_A0 + ir*kk_K0 + pc*{mr}, kk_Y0 + (kk_b * kk_N0p + jr) * kk_K0 + pc*{nr}, "
                "kk_S + ir*s_kk_ldS + jr, s_kk_ldS, pc > 0);\n"
                "}")
    skip = _skip_condition(pipe, mr, nr)
    tiles = For("jr", "0", f"(s_kk_nh + {nr - 1}) / {nr} * {nr}", (For("ir", "0", "kk_mcb", (
        If(skip, (), (call0,)) if skip else call0,), step=str(mr)),), step=str(nr))
    # 2c. the row program on the block's rows (rp, emitted first), P into the P tile
    # 2d. the K range of c1 where the block's P is nonzero (exact to skip when c1's panel is finite)
    krange = Raw("long long kk_klo = 0, kk_khi = s_kk_nh;\n"
                 "if (kk_fin[kk_b]) {\n"
                 "  kk_klo = s_kk_nh; kk_khi = 0;\n"
                 "  for (long long ii = 0; ii < kk_rows; ++ii) {\n"
                 "    const float* kk_r = kk_P + ii*s_kk_ldP;\n"
                 "    long long j = s_kk_nh;\n"
                 "    for (; j - 8 >= kk_khi; j -= 8) {   /* eight at a time, then one by one */\n"
                 "      int kk_z = 1;\n"
                 "      for (int t = 1; t <= 8; ++t) kk_z &= kk_r[j - t] == 0.0f;\n"
                 "      if (!kk_z) break;\n"
                 "    }\n"
                 "    while (j > kk_khi && kk_r[j - 1] == 0.0f) --j;\n"
                 "    kk_khi = j > kk_khi ? j : kk_khi;\n"
                 "    long long l = 0;\n"
                 "    while (l < kk_klo && kk_r[l] == 0.0f) ++l;\n"
                 "    kk_klo = l < kk_klo ? l : kk_klo;\n"
                 "  }\n"
                 "}")
    # 2e. O tile = P * Y1 over [klo, khi), then c1's epilogue
    rows = micro_name(mr1, nr1, vw, a_rows=True)
    call1 = Raw(f"if (kk_khi <= kk_klo) {rows}(0, kk_P, s_kk_ldP, kk_Y1, kk_O + ir*kk_N1p + jr, kk_N1p, 0);\n"
                f"for (long long pc = kk_klo; pc < kk_khi; pc += {kc1}) {{\n"
                f"  const long long kcb = kk_khi - pc < {kc1} ? kk_khi - pc : {kc1};\n"
                f"  {rows}(kcb, kk_P + ir*s_kk_ldP + pc, s_kk_ldP, kk_Y1 + (kk_b * kk_N1p + jr) * kk_K1 + pc*{nr1}, "
                f"kk_O + ir*kk_N1p + jr, kk_N1p, pc > kk_klo);\n"
                "}")
    tiles1 = For("jr", "0", "kk_N1p", (For("ir", "0", "kk_mcb1", (call1,), step=str(mr1)),), step=str(nr1))
    blk += [Block(tuple(bat0) + (pack_a, tiles)), rp, krange, tiles1, _epilogue1(c1, cl1)]
    # the thread's tiles and the shared panels persist between calls (kk_scratch: no fresh pages per call)
    s.append(Raw("#pragma omp parallel\n{\n"
                 f"float* kk_A0 = (float*)kk_scratch(7, sizeof(float) * (size_t)({bm} * kk_K0));\n"
                 f"float* kk_S = (float*)kk_scratch(8, sizeof(float) * (size_t)({bm} * s_kk_ldS));\n"
                 f"float* kk_P = (float*)kk_scratch(9, sizeof(float) * (size_t)({bm} * s_kk_ldP));\n"
                 f"float* kk_O = (float*)kk_scratch(0, sizeof(float) * (size_t)({bm} * kk_N1p));"))
    s.append(For("kk_u", "0", "kk_B * kk_nblk", tuple(blk), workshare=True))
    s.append(Raw("for (int kk_t = 7; kk_t <= 9; ++kk_t) kk_scratch_trim(kk_t);\nkk_scratch_trim(0);\n}"))
    s.append(Raw("kk_scratch_trim(5); kk_scratch_trim(6); free(kk_fin);"))
    params = tuple(Param(cname[n], C.STORAGE[m.dtype.name], const) for n, (m, const) in _params(pipe).items())
    gather = lo0.uses_gather or lo1.uses_gather
    return Kernel(name, params, syms, tuple(s), notes, gather_check=gather,
                  no_loop_vectorize=lo0.reversed_reduce or lo1.reversed_reduce)


def _params(pipe: RowPipe) -> dict:
    """The fused kernel's buffers, in ABI order: the producer's inputs, the consumer's inputs but P,
    then the consumer's outputs. name -> (MemRef, read-only)."""
    out: dict = {}
    for n, m in pipe.f0.region.inputs:
        out[n] = (m, True)
    for n, m in pipe.f1.region.inputs:
        if n != pipe.p:
            out.setdefault(n, (m, True))
    for o in pipe.f1.region.outputs:
        out[o.name] = (o.memref, False)
    return out


def pipe_buffers(pipe: RowPipe) -> tuple:
    return tuple(_params(pipe))


def _skip_condition(pipe: RowPipe, mr: int, nr: int) -> str:
    """C condition true when the micro-tile (rows kk_ic+ir.., columns jr..) fails every guard."""
    if not pipe.guards:
        return ""
    (m0,), (n0,) = pipe.c0.m_axes, pipe.c0.n_axes
    box = {m0: ("kk_mlo", "kk_mhi"), n0: ("kk_nlo", "kk_nhi")}
    scope = set(pipe.f0.iters) | {"kk_mlo", "kk_mhi", "kk_nlo", "kk_nhi"}
    fails = []
    for g in pipe.guards:
        dead = []
        for e, op in g.constraints:
            if op != "ge" or not _affine_in(e, box):
                continue
            dead.append(f"({C.index(_box_max(e, box), scope)} < 0)")
        if not dead:
            return ""
        fails.append("(" + " || ".join(dead) + ")")
    bounds = ("const long long kk_mlo = kk_ic + ir, kk_mhi = kk_ic + (ir + {mr} < kk_rows ? ir + {mr} : kk_rows) - 1, "
              "kk_nlo = jr, kk_nhi = (jr + {nr} < kk_N0 ? jr + {nr} : kk_N0) - 1;").format(mr=mr, nr=nr)
    return "({ " + bounds + " " + " && ".join(fails) + "; })"


def _row_program(pipe: RowPipe, lo0: CpuLowering) -> Block:
    """The producer's lets after its contraction on the block's rows, by the generic loop-nest emitter
    (vectorised along N like any row program). Its accumulator is the S tile and its output P the P
    tile: both are named through pointers offset so that the region's own row-major indexing
    (``[batch..., m, n]``) lands in the block's tile - the block's rows are one contiguous slab of P,
    and the S tile has the same row length."""
    c0 = pipe.c0
    (m0,), (n0,) = c0.m_axes, c0.n_axes
    rp = copy.copy(lo0)
    rp.r = dataclasses.replace(lo0.r, lets=tuple(x for x in lo0.r.lets if x.name != c0.let))
    rp.storage, rp.n_tmp = {}, 500
    rp.cname = dict(lo0.cname, **{pipe.p: "kk_Pv"})
    pm = rp.memrefs[pipe.p]                        # P's rows are s_kk_ldP long in the tile
    rp.memrefs = dict(rp.memrefs, **{pipe.p: dataclasses.replace(pm, shape=pm.shape[:-1] + (Expr.sym("kk_ldP"),))})
    tree = rp.schedule()
    rp.plan_storage(tree)
    rp.storage[c0.let] = ("array", "kk_Sv", (m0, n0))
    rp.red_axes = []
    rp.sizes = dict(lo0.sizes, **{n0: Expr.sym("kk_ldS")})     # the S tile's row stride (C: s_kk_ldS) ...
    rp.extent = {n0: Expr.sym("kk_nh")}            # ... and the columns computed: N0, or the block's prefix
    body = rp.emit_items(tree, ())
    pre: list = [Raw("/* the tiles seen at the region's own offsets (never dereferenced outside the block) */\n"
                     "float* const kk_Sv = kk_S - kk_ic*s_kk_ldS;\n"
                     "float* const kk_Pv = kk_P - (kk_b*kk_M + kk_ic)*s_kk_ldP;")]
    # batch values under names of their own (the pinned loops declare the axis names themselves)
    flat = "kk_b"
    names = list(c0.batch)
    for k, a in enumerate(reversed(names)):
        size = C.index(lo0.sizes[a], set())
        if k == len(names) - 1:
            pre.append(Decl("const long long", f"kk_bv_{a}", flat))
        else:
            pre.append(Decl("const long long", f"kk_bv_{a}", f"({flat}) % {size}"))
            flat = f"({flat}) / {size}"
    bounds = {a: (f"kk_bv_{a}", f"kk_bv_{a} + 1") for a in c0.batch}
    bounds[m0] = ("kk_ic", "kk_ic + kk_rows")
    prog = tuple(hoisted(_pin(b, bounds)) for b in body)
    if pipe.elide is None:
        return Block(tuple(pre) + prog)
    # each row checks the assumptions of the elision on its row scalars; when one fails, the block's row
    # program runs again over every column
    checks = [f"({rp.storage[x][1]} - {rp.storage[x][1]} == 0)" for x in sorted(pipe.elide.finite)]
    checks += [f"({rp.storage[x][1]} != 0)" for x in sorted(pipe.elide.nonzero)]
    prog = _append_in_loop(prog, m0, [rp.storage[x][1] for x in pipe.elide.finite | pipe.elide.nonzero],
                           Raw(f"kk_rowok &= {' & '.join(checks)};" if checks else ""))
    retry = Raw("if (kk_rowok || s_kk_nh == kk_N0) break;\n"
                "s_kk_nh = kk_N0;   /* an assumption failed on some row: every column */")
    return Block(tuple(pre) + (For("kk_try", "0", "2", (Decl("int", "kk_rowok", "1"),) + prog + (retry,)),))


def _append_in_loop(stmts: tuple, var: str, names: list, stmt) -> tuple:
    """``stmts`` with ``stmt`` appended to the body of the loop over ``var``, which must declare each of
    ``names`` directly in its body (so they are in scope at its end); ValueError when there is no such loop."""
    hits = []

    def append(loop: For) -> For:
        if loop.var != var:
            return loop
        declared = {d.name for d in loop.body if isinstance(d, Decl)}
        if not set(names) <= declared:
            raise ValueError(f"row scalars {sorted(set(names) - declared)} are not scalars of the row loop")
        hits.append(loop)
        return dataclasses.replace(loop, body=loop.body + (stmt,))
    out = tuple(_rewrite(x, append) for x in stmts)
    if len(hits) != 1:
        raise ValueError(f"{len(hits)} loops over the row axis {var}")
    return out


def _epilogue1(c: Contraction, cl1: ContractionLowering) -> For:
    lo = cl1.lo
    ep: list = []
    cl1.decompose("kk_ic + ii", c.m_axes, ep)
    en: list = []
    cl1.decompose("jj", c.n_axes, en)
    bat: list = lo.unit_decls(c)
    cl1.decompose("kk_b", c.batch, bat)
    out = pointwise_epilogue(lo, c)
    body = tuple(en) + (Decl("float", "kk_acc", "kk_O[ii*kk_N1p + jj]"),) + tuple(out)
    return Block(tuple(bat) + (For("ii", "0", "kk_rows", tuple(ep) + (For("jj", "0", "kk_N1", body),)),))
