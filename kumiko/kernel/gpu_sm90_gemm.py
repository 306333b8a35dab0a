"""The SM90 GEMM skeleton from a contraction Region and an SM90 plan (issue 24; ``plan/gpu_sm90``).

Nothing here knows an op name: the contraction is the region analysis' (batch, M, N, K axes, operands x and y),
``sm90_operands`` says which input buffer TMA reads for each operand and in which orientation, the plan gives the
tile (BM = 64 a consumer warpgroup, BN, BK = 64) and the ring's stages. The kernel (an ``Sm90Kernel``):

* warpgroup 0 is the producer (``setmaxnreg.dec``): one thread waits on ``empty[s]`` (parity ((kt / S) & 1) ^ 1:
  the first round passes on the fresh barriers), announces the stage's bytes on ``full[s]`` and issues the TMA
  loads - A's 64-halves-wide K slice of BM rows, B's BN rows of K (K-major) or BN / 64 boxes of 64 N columns
  (MN-major, a row-major K x N input) -, the 128-byte swizzle, a batch coordinate when the operand has one;
* warpgroups 1.. are the consumers (``setmaxnreg.inc``), 64 rows each: wait on ``full[s]``, four
  ``wgmma m64nBNk16`` through 128B-swizzle descriptors, commit, then (``async_.wgmma_in_flight`` 1, the default)
  ``wgmma.wait_group 1`` and arrive on the previous k tile's ``empty`` barrier, so one tile's MMAs run while the
  next tile's are issued (the last stage is released after ``wait_group 0``), or (0) ``wait_group 0`` and arrive
  on ``empty[s]``;
* the epilogue runs on each consumer's accumulator fragment (``FragEpilogue``): the region's other lets at each
  element (bias, activation, residual, cast), then a store predicated on M and N.

Tails: TMA fills out-of-bounds rows and K columns with zeros (they add nothing to the sums), the epilogue's stores
are predicated. One CTA per output tile (grid N tiles x M tiles x batch), or (``async_.epilogue_overlap``) a
persistent grid striding over the tiles in the grouped order; or (``Plan.split_k`` > 1, few output tiles over a long
K) ``split_k`` CTAs a tile (grid z = batch x splits), each over its share of the K tiles, their fp32 partial sums
added by the tile's last CTA to arrive (``SplitKSum``) before the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import Param, SplitK
from kumiko.kernel.gpu_ir_sm90 import (
    BarDecl,
    BarRef,
    Elect,
    FenceMbarInit,
    For,
    FragEpilogue,
    IExpr,
    If,
    Let,
    MatDesc,
    MbarArrive,
    MbarArriveTx,
    MbarInit,
    MbarWait,
    Ring,
    Role,
    Roles,
    SetMaxNReg,
    Sm90Kernel,
    SmemBuf,
    SmemRef,
    SplitKSum,
    SyncThreads,
    TensorMapDesc,
    TmaLoad,
    WgmmaCommit,
    WgmmaFence,
    WgmmaMma,
    WgmmaWait,
    layout_smem,
)
from kumiko.kernel.gpu_simt import accumulator_code, decompose, kernel_params, status_params
from kumiko.kernel.lower_base import RegionEmitter
from kumiko.plan.gpu_sm90 import CONSUMER_REGS, PRODUCER_REGS, SM90_BK, Sm90Gemm, TmaOperand, sm90_operands
from kumiko.plan.plan import Plan
from kumiko.region.analysis import Contraction, analyze
from kumiko.region.ssa import Region
from kumiko.symbolic import Expr

#: the kernel's int scalars (the launch computes them from the sizes): M, N, K, K tiles, batch
SCALARS = ("kk_M", "kk_N", "kk_K", "kk_KT", "kk_B")


def ceil_div(x, d: int):
    """ceil(x / d) for an int or a symbolic size."""
    n = Expr.lift(x).as_int()
    return -(-n // d) if n is not None else (Expr.lift(x) + (d - 1)) // d


@dataclass(frozen=True)
class Sm90Lowering:
    """The kernel, the contraction, and for each tensor map the region input it maps (in the kernel's order); for a
    two-kernel region the scratch array the accumulator goes to (``scratch``: (param name, let, axes))."""
    kernel: Sm90Kernel
    contraction: Contraction
    gemm: Sm90Gemm
    map_bufs: tuple
    scratch: tuple | None = None
    split: SplitK | None = None


def _map(name: str, op: TmaOperand, dtype: str, box: tuple) -> TensorMapDesc:
    """A row-major (rows x cols) operand, batched or not, as a 2-D / 3-D tiled map with the 128-byte swizzle."""
    v = IExpr.var
    if op.head:             # x over [H, M, D]: (D, M, H), a box of one head's 64 columns
        return TensorMapDesc(name, op.buf, dtype, (IExpr.const(op.head), v("kk_M"), v("kk_K") // op.head),
                             (IExpr.const(op.head * 2), v("kk_M") * (op.head * 2)), box + (1,), "128B")
    rows, cols = ("kk_M", "kk_K") if name == "tmA" else (("kk_N", "kk_K") if op.major == "K" else ("kk_K", "kk_N"))
    dims, strides = (v(cols), v(rows)), (v(cols) * 2,)
    if op.batched:
        dims, strides = dims + (v("kk_B"),), strides + (v(cols) * v(rows) * 2,)
        box = box + (1,)
    return TensorMapDesc(name, op.buf, dtype, dims, strides, box, "128B")


def lower_sm90_gemm(region: Region, syms: tuple, name: str, plan: Plan) -> Sm90Lowering:
    """Instantiate the SM90 GEMM skeleton for ``region`` under ``plan`` (E1801 when it does not apply)."""
    facts = analyze(region)
    c = facts.contraction
    g = sm90_operands(region, facts, c)
    if g is None:
        raise KumikoError("E1801", at=f"region {region.name}", why="the SM90 GEMM skeleton does not apply to this "
                          "region (plan.gpu_sm90.sm90_operands)", suggestion='use algo_choice {"contraction": "mma"}')
    bm, bn, bk = plan.tile
    S, consumers = plan.stages, bm // 64
    in_flight = plan.get("async_", "wgmma_in_flight", 1)
    persistent = bool(plan.get("async_", "epilogue_overlap", False))
    splits = int(plan.split_k)
    if persistent and splits > 1:
        raise KumikoError("E1801", at=f"plan of {region.name}", why="a persistent SM90 plan takes no split-K",
                          suggestion="split_k 1")
    if persistent and c.batch:
        raise KumikoError("E1801", at=f"plan of {region.name}", why="a persistent SM90 plan (async.epilogue_overlap) "
                          f"takes a GEMM without batch axes; this one has {list(c.batch)}",
                          suggestion="async.epilogue_overlap false")
    assert bk == SM90_BK
    lo = RegionEmitter(region, syms, name, facts=facts)
    for a in c.k_axes:
        lo.sizes[a.name] = a.size
    lo.ty.add_axes(c.k_axes)
    v, ci_ = IExpr.var, IExpr.const
    kt, ks = v("kt"), v("ks")
    KT = v("kk_KT")
    if persistent:      # the CTA's tl-th tile: its coordinates (Let) from the grouped order, k steps counted on
        bx, by, bz, it = v("kk_bx"), v("kk_by"), v("blockIdx.z"), v("tl") * KT + kt
    else:
        bx, by, bz, it = v("blockIdx.x"), v("blockIdx.y"), v("blockIdx.z"), kt
    ktl, kg = KT, kt                # the K tiles this CTA runs, and K tile kt's index in K
    if splits > 1:                  # split-K: grid z = batch x splits, split z % splits runs K tiles [t0, t0 + ktl)
        bz, ktl, kg = v("blockIdx.z") // splits, v("kk_ktl"), kt + v("kk_t0")
    st = it % S
    a_bytes, b_bytes = bm * bk * 2, bn * bk * 2
    mn = g.y.major == "MN"
    maps = (_map("tmA", g.x, g.dtype, (bk, bm)), _map("tmB", g.y, g.dtype, (64, bk) if mn else (bk, bn)))
    smem = layout_smem((SmemBuf("sA", "uint16_t", a_bytes, S), SmemBuf("sB", "uint16_t", b_bytes, S)))
    full, empty = (lambda i: BarRef("kk_full", i)), (lambda i: BarRef("kk_empty", i))

    def coords(op: TmaOperand, *xy) -> tuple:
        return xy + ((bz,) if op.batched else ())

    if g.x.head:            # K tile kt: head kt // (D / BK), its columns from kt % (D / BK) * BK
        per = g.x.head // bk
        loads = [TmaLoad("tmA", SmemRef("sA", st), full(st), ((kg % per) * bk, by * bm, kg // per))]
    else:
        loads = [TmaLoad("tmA", SmemRef("sA", st), full(st), coords(g.x, kg * bk, by * bm))]
    if mn:
        loads += [TmaLoad("tmB", SmemRef("sB", st, j * 64 * bk * 2), full(st), coords(g.y, bx * bn + 64 * j, kg * bk))
                  for j in range(bn // 64)]
    else:
        loads.append(TmaLoad("tmB", SmemRef("sB", st), full(st), coords(g.y, kg * bk, bx * bn)))
    fill = (For("kt", ci_(0), ktl, (
        MbarWait(empty(st), ((it // S) & 1) ^ 1), MbarArriveTx(full(st), a_bytes + b_bytes), *loads)),)

    # the epilogue: the M and N axes at the element's row and column, then the region's other lets and stores
    decls: list = []
    decompose(lo, "kk_gm", c.m_axes, decls)
    decompose(lo, "kk_gn", c.n_axes, decls)
    code, scratch, extra = accumulator_code(lo, c)     # (not pointwise: to scratch, the SIMT kernel runs the rest)
    db = (MatDesc(SmemRef("sB", st), "128B", 64 * bk * 2, 1024, "MN", ks * 16 * 128) if mn else
          MatDesc(SmemRef("sB", st), "128B", 16, 1024, "K", ks * 32))

    def consume(i: int) -> tuple:
        da = MatDesc(SmemRef("sA", st, i * 64 * 128), "128B", 16, 1024, "K", ks * 32)
        mma = (MbarWait(full(st), (it // S) & 1),
               WgmmaFence(),
               For("ks", ci_(0), ci_(bk // 16), (WgmmaMma("acc", da, db, bn, g.dtype, kt.gt(0) | ks.gt(0)),),
                   unroll=True),
               WgmmaCommit())
        if in_flight:
            # k tile kt's group stays in flight while the next one issues: waiting until at most one group is
            # pending retires kt - 1's, whose stage goes back to the producer (the last one after the loop)
            last = (v("tl") * KT + KT - 1) if persistent else ktl - 1
            loop = (*mma, WgmmaWait(1), If(kt.gt(0), (MbarArrive(empty((it - 1) % S)),)))
            drain: tuple = (WgmmaWait(0), MbarArrive(empty(last % S)))
            if splits > 1:          # a split may have no K tiles (K short of splits x its share)
                drain = (If(ktl.gt(0), drain),)
        else:
            loop, drain = (*mma, WgmmaWait(0), MbarArrive(empty(st))), ()
        epi = FragEpilogue("acc", by * bm + 64 * i, bx * bn, tuple(decls), code)
        if splits > 1:
            tile = (bz * v("gridDim.y") + by) * v("gridDim.x") + bx
            epi = SplitKSum("acc", splits, "kk_ws", "kk_cnt", tile, v("blockIdx.z") % splits, i, consumers,
                            ktl.gt(0), (epi,))
        return (For("kt", ci_(0), ktl, loop), *drain, epi)

    if persistent:
        # grid = min(tiles, CTAs the device holds); CTA b runs tiles b, b + gridDim.x, ... in the grouped order:
        # runs of group_m M tiles sweep N, so the B panels a run reads stay in L2. The producer runs ahead into the
        # next tile's stages while the consumers store this one's epilogue (async.epilogue_overlap).
        gm = int(plan.get("layout_hints", "group_m", 8))
        tm, tn, gx = v("kk_tm"), v("kk_tn"), v("gridDim.x")
        tile, width = v("kk_tile"), tn * gm
        first, rows = v("kk_gfirst"), v("kk_grows")      # the tile's run: its first M tile, and how many M tiles
        where = (Let("kk_tile", v("blockIdx.x") + v("tl") * gx), Let("kk_gfirst", (tile // width) * gm),
                 Let("kk_grows", (tm - first).min(gm)),
                 Let("kk_by", first + (tile % width) % rows), Let("kk_bx", (tile % width) // rows))
        count = (Let("kk_tm", (v("kk_M") + (bm - 1)) // bm), Let("kk_tn", (v("kk_N") + (bn - 1)) // bn),
                 Let("kk_ntl", (tm * tn - v("blockIdx.x") + gx - 1) // gx))

        def tiles(body: tuple) -> tuple:
            return (For("tl", ci_(0), v("kk_ntl"), (*where, *body)),)
    else:
        count = ()
        if splits > 1:
            count = (Let("kk_per", (KT + (splits - 1)) // splits),
                     Let("kk_t0", (v("blockIdx.z") % splits) * v("kk_per")),
                     Let("kk_ktl", (KT - v("kk_t0")).min(v("kk_per"))))

        def tiles(body: tuple) -> tuple:
            return body
    producer = (SetMaxNReg(False, PRODUCER_REGS), Elect(tiles(fill)))

    def consumer(i: int) -> tuple:
        return (SetMaxNReg(True, CONSUMER_REGS[consumers]), *tiles(consume(i)))

    body = (Elect((For("s", ci_(0), ci_(S), (MbarInit(full(v("s")), 1), MbarInit(empty(v("s")), 128 * consumers))),
                   FenceMbarInit())),
            SyncThreads(),
            *count,
            Roles((Role("producer", 0, 1, producer),
                   *(Role(f"consumer{i}", 1 + i, 1, consumer(i)) for i in range(consumers)))))
    setup: list = []
    decompose(lo, "(long long)blockIdx.z" if splits == 1 else f"(long long)(blockIdx.z / {splits}u)", c.batch, setup)
    setup += lo.unit_decls(c)
    notes = tuple(region.notes) + (
        f"SM90 GEMM skeleton: contraction {c.let}, batch {list(c.batch)}, M {list(c.m_axes)}, N {list(c.n_axes)}, "
        f"K {[a.name for a in c.k_axes]}; tile {bm}x{bn}x{bk}, {S} stages, A K-major, B {g.y.major}-major, "
        f"{consumers} consumer warpgroup(s), {in_flight} wgmma group(s) in flight past each wait"
        + (", persistent (grid = the device's SMs, grouped tile order, the producer runs into the next tile while "
           "the consumers store this one)" if persistent else "")
        + (f", split K x{splits} (the tile's last CTA adds the splits' partial sums)" if splits > 1 else ""),)
    split = None
    if splits > 1:
        split = SplitK(splits, "kk_ws", "kk_cnt")
        extra += (Param("kk_ws", "float"), Param("kk_cnt", "int"))
    params = kernel_params(lo, extra + status_params(lo))
    kern = Sm90Kernel(name, 128 * (1 + consumers), maps, SCALARS, smem,
                      (BarDecl("kk_full", S), BarDecl("kk_empty", S)), (("acc", bn),), body,
                      rings=(Ring(("sA", "sB"), "kk_full", "kk_empty", S),),
                      verify_sizes=(("kk_KT", (1, 2, S, S + 1, 2 * S + 1)),) + (
                          (("kk_M", (bm, 3 * bm)), ("kk_N", (bn,)), ("gridDim.x", (1, 2))) if persistent else ())
                      + ((("blockIdx.z", (0, splits - 1)),) if splits > 1 else ()),
                      notes=notes,
                      params=params, setup=tuple(setup))
    return Sm90Lowering(kern, c, g, (g.x.buf, g.y.buf), scratch, split)


def scalar_sizes(g: Sm90Gemm) -> tuple:
    """The kernel's int scalars (``SCALARS``) as sizes (ints or symbolic) for the launch to evaluate."""
    return tuple(zip(SCALARS, (g.m, g.n, g.k, ceil_div(g.k, SM90_BK), g.batch)))
