"""Fused streaming attention on SM80 (FlashAttention-2 structure): the GPU IR of the kernel for an attention Region
pair (found and planned by ``attention_pair``: a contraction with a streaming softmax row program, then the P·V
contraction reading its deferred P) and its lowering from the pair's regions.

``exp2(k (z - m))`` factors as ``exp2(k (z - m')) * exp2(k (m' - m))``: that is what lets the softmax run one
key block at a time with a running max, rescaling the running sum and output when the max grows (online
softmax). One CTA then owns BM query rows of one batch point (4 warps, 16 rows each) and loops over key
blocks of BN: K and V blocks arrive by cp.async into double-buffered shared memory, ``S = Q K^T`` is
mma.sync m16n8k16 with Q's fragments held in registers, the region's score code runs on each accumulator
element, the row max and sum live in registers (a quad of lanes shares a row: two shuffles), P is packed
to the 16-bit type in registers - the m16n8k16 accumulator layout of two n8 tiles is the A layout of one
k16 step (PTX ISA "Matrix Fragments for mma.m16n8k16": C rows g / g+8, columns 2t, 2t+1; A registers 0-3
rows g, g+8, g, g+8, columns 2t(+1), +8 for registers 2, 3) - and fed to the P·V mma.sync; at the end
O is divided by the row sum and the consumer's epilogue stores it. P never reaches memory.

Key blocks past the last column a block's rows can see through the score's guards (a causal mask:
``kumiko.kernel.elide.prefix_bound``, exact when ``masked_elision`` shows those columns add nothing) are not
loaded at all; the diagonal block is masked by the score code itself, and key columns past N get ``-inf``
(V's rows past N are zero-filled), query rows past M are computed on zero-filled Q and not stored.

The schedule is GPU IR (``gpu_ir``'s CommitGroup, WaitGroup, Barrier, TileRef and Token plus the records
below), checked by ``kumiko.kernel.gpu_verify_attention`` for 1 to 4 key blocks, rendered by
``kumiko.render.cuda_attention``. The element code (``pair_code``) is shared with the SM90 kernel
(``gpu_attention_sm90``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kumiko.diagnostics import KumikoError
from kumiko.kernel import cexpr as C
from kumiko.kernel.attention_pair import AttentionPair, operand_reads, operand_tiles
from kumiko.kernel.elide import prefix_bound
from kumiko.kernel.gpu_ir import (
    Barrier,
    CommitGroup,
    Epilogue,
    KLoop,
    LdMatrix,
    Mma,
    Param,
    SmemRing,
    StGlobal,
    TileRef,
    Token,
    WaitGroup,
)
from kumiko.kernel.gpu_mma import PAD
from kumiko.kernel.gpu_simt import decompose, extent
from kumiko.kernel.loops import Assign, Decl
from kumiko.kernel.lower_base import RegionEmitter
from kumiko.plan.gpu import STREAMING, WARP_ROWS
from kumiko.plan.plan import Plan
from kumiko.region.srnf import map_children
from kumiko.region.ssa import Program, Select
from kumiko.symbolic import Expr


# -- GPU IR -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockLoad:
    """How ring ``ring`` is filled: ``rows`` rows of ``cols`` halves from ``base`` (a pointer expression once the
    batch axes are declared) plus ``row`` * ``row_step``; rows at or past ``extent`` are zero-filled."""
    ring: str
    base: str
    row_step: str
    extent: str


@dataclass(frozen=True)
class LoadBlock:
    """cp.async block ``tile`` of ring ``ring`` into stage ``tile % stages`` (key blocks past the last are
    skipped; ``pred_rows=False`` drops the zero-fill past the extent: a bug, for tests)."""
    ring: str
    tile: TileRef
    out_token: Token
    pred_rows: bool = True


@dataclass(frozen=True)
class LoadQFrag:
    """ldmatrix the warp's Q fragments (16 rows x the head dim) into registers, once."""
    in_tokens: tuple
    lda: LdMatrix


@dataclass(frozen=True)
class _BlockMma:
    """mma.sync over key block ``tile``, its B operand (K or V) by ldmatrix from the block's ring stage."""
    tile: TileRef
    in_tokens: tuple
    out_token: Token
    ldb: LdMatrix
    mma: Mma


class ScoreMma(_BlockMma):
    """S = Q K^T for key block ``tile``: K fragments by ldmatrix, mma.sync into the S accumulators."""


@dataclass(frozen=True)
class OnlineSoftmax:
    """The score code on each S element, the running row max, P = exp2(k2 (z - m)) in place of S, the row sum;
    ``rescale``: O and the sum are scaled by exp2(k2 (m_old - m_new)) (False: a bug, for tests)."""
    in_token: Token
    out_token: Token
    rescale: bool = True
    mask_tail: bool = True


class PvMma(_BlockMma):
    """O += P V for key block ``tile``: P from the S registers as A fragments, V by ldmatrix.trans."""


@dataclass(frozen=True)
class AttentionKernel:
    name: str
    arch: str
    params: tuple
    tile: tuple                     # (BM, BN, 16)
    head: tuple                     # (D, DV): Q/K's and V's head dims
    rings: tuple                    # SmemRing sQ, sK, sV
    loads: tuple                    # BlockLoad per ring
    prologue: tuple
    loop: KLoop                     # over key blocks ``kt``
    drain: tuple
    epilogue: Epilogue              # the consumer's epilogue on O / l (``kk_acc``)
    store: StGlobal
    setup: tuple                    # loops.Stmt: kk_M, kk_N and the batch axes (from blockIdx.y)
    batch1: tuple                   # loops.Stmt: the consumer's batch axes (V's base, the epilogue)
    decl_score: tuple               # loops.Stmt: the producer's M, N axes from kk_gm, kk_gn
    score: tuple                    # loops.Stmt: kk_z = the score at kk_acc
    decl_out: tuple                 # loops.Stmt: the consumer's M, N axes from kk_gm, kk_gn
    k2: float
    bound: str = ""                 # C: first key column no row <= kk_mhi sees ("" : every column)
    notes: tuple = ()

    @property
    def threads(self) -> int:
        return self.tile[0] // WARP_ROWS * 32

    @property
    def smem_bytes(self) -> int:
        return sum(r.nbytes for r in self.rings)

    def estimated_registers(self) -> int:
        """Q fragments + S + O accumulators + ~40 for addresses, row state and the score code."""
        d, dv = self.head
        return d // 16 * 4 + self.tile[1] // 8 * 4 + dv // 8 * 4 + 40


@dataclass(frozen=True)
class PairCode:
    """What both fused attention kernels (SM80 here, SM90 in ``gpu_attention_sm90``) take from the pair's regions:
    the emitters (``lo0`` the producer's, ``lo1`` the consumer's, buffers named ``b<i>``), the loop statements that
    declare ``kk_M``, ``kk_N``, the producer's batch axes from ``blockIdx.y`` (``setup``) and the consumer's
    (``batch1``), the score code (``kk_z`` from ``kk_acc`` at ``kk_gm``, ``kk_gn``: ``decl_score``, ``score``), the
    consumer's epilogue (``decl_out``, ``out``), the causal bound (C over ``kk_mhi``; "" when every key block
    counts), the parameters and Q's, K's and V's row steps."""
    lo0: RegionEmitter
    lo1: RegionEmitter
    setup: tuple
    batch1: tuple
    decl_score: tuple
    score: tuple
    decl_out: tuple
    out: tuple
    bound: str
    params: tuple
    steps: tuple
    inside: str = ""            # C over kk_r0, kk_r1, kk_c0, kk_c1: every guard holds on that rectangle
    decl_free: tuple = ()
    score_free: tuple = ()      # the score code with the guards' selects taken as true


def _score_code(pair: AttentionPair, lo0, drop: tuple = ()) -> list:
    """Loop statements setting ``kk_z`` from ``kk_acc``: the producer's score lets at one point (selects on the
    guards in ``drop`` replaced by their ``then`` branch)."""
    def strip(e):
        e = map_children(e, strip)
        return e.then if isinstance(e, Select) and e.pred in drop else e

    lo0.storage = {pair.c0.let: ("scalar", "kk_acc")}
    score: list = []
    for nm in pair.score:
        let = next(x for x in lo0.r.lets if x.name == nm)
        v = lo0.expr(strip(let.expr) if drop else let.expr, score, lo0.types[nm].dtype)
        lo0.storage[nm] = ("scalar", f"v_{nm}")
        score.append(Decl(C.COMPUTE[lo0.types[nm].dtype.name], f"v_{nm}", v))
    score.append(Assign("kk_z", f"(float)(v_{pair.z})"))
    return score


def inside_guards(guards: tuple, m: str, n: str, index) -> str:
    """C over the rectangle rows [kk_r0, kk_r1] x columns [kk_c0, kk_c1]: true when every guard holds at every
    point of it ("" when a guard is not a conjunction of ``>=`` constraints affine in the row and column). Each
    constraint ``a*m + b*n + rest >= 0`` is smallest at a corner: the rectangle is inside exactly when that corner
    is."""
    out = []
    for g in guards:
        for e, op in g.constraints:
            e = Expr.lift(e)
            a, b = e.coeff(m), e.coeff(n)
            rest = e - Expr.sym(m) * a - Expr.sym(n) * b
            if op != "ge" or {m, n} & rest.symbols():
                return ""
            low = rest + Expr.sym("kk_r0" if a >= 0 else "kk_r1") * a + Expr.sym("kk_c0" if b >= 0 else "kk_c1") * b
            out.append(f"({index(low)}) >= 0")
    return " && ".join(out)


def pair_code(pair: AttentionPair, syms: tuple, name: str, names: list) -> PairCode:
    """The pair's element code and parameters (``names``: the buffers in parameter order, ``b<i>``)."""
    c0, c1 = pair.c0, pair.c1
    lo0 = RegionEmitter(pair.f0.region, syms, name, facts=pair.f0)
    lo1 = RegionEmitter(pair.f1.region, syms, name, facts=pair.f1)
    lo0.cname = lo1.cname = {n: f"b{i}" for i, n in enumerate(names)}
    for lo, c in ((lo0, c0), (lo1, c1)):
        for a in c.k_axes:
            lo.sizes[a.name] = a.size
        lo.ty.add_axes(c.k_axes)
    # Q, K as [rows, head dim] and V as [keys, head dim] tiles, each with its row step (a plain tile's row
    # length, or a head of a projection's [tokens, heads x d] output): find_attention_pair checked them
    steps = operand_tiles(pair.f0, c0, pair.f1, c1)
    if None in steps:
        raise KumikoError("E1801", at=f"region {pair.f0.region.name}", why=f"the {STREAMING} kernel copies Q, K as "
                          "row-major [rows, head dim] tiles and V as [keys, head dim]; an operand is not such a tile",
                          suggestion='use the MMA plans (algo_choice {"contraction": "mma"})')
    setup = [Decl("const long long", "kk_M", extent(lo0, c0.m_axes)),
             Decl("const long long", "kk_N", extent(lo0, c0.n_axes))]
    decompose(lo0, "(long long)blockIdx.y", c0.batch, setup)
    batch1: list = []                   # the consumer's batch axes (its names may differ: declared in a scope)
    decompose(lo1, "(long long)blockIdx.y", c1.batch, batch1)
    setup += lo0.unit_decls(c0)
    batch1 += lo1.unit_decls(c1)
    # the score: the producer's score lets at one point, the accumulator in kk_acc
    score = _score_code(pair, lo0)
    decl_score: list = []
    decompose(lo0, "kk_gm", c0.m_axes, decl_score)
    decompose(lo0, "kk_gn", c0.n_axes, decl_score)
    decl_out: list = []
    decompose(lo1, "kk_gm", c1.m_axes, decl_out)
    decompose(lo1, "kk_gn", c1.n_axes, decl_out)
    out_code = tuple(lo1.point_code(c1.let, "kk_acc"))
    decl_score, decl_out = _used(decl_score, score), _used(decl_out, out_code)   # e.g. no mask: no row index
    bound, inside, decl_free, score_free = "", "", (), ()
    if pair.guards:
        bound = prefix_bound(pair.guards, c0.m_axes[0], c0.n_axes[0], "kk_mhi", set(a.name for a in lo0.r.iters),
                             lambda e: C.index(e, {"kk_mhi"})) or ""
        scope = set(lo0.iters) | {"kk_r0", "kk_r1", "kk_c0", "kk_c1"}
        inside = inside_guards(pair.guards, c0.m_axes[0], c0.n_axes[0], lambda e: C.index(e, scope))
        if inside:          # blocks the guards wholly admit run the score code without them
            score_free = tuple(_score_code(pair, lo0, pair.guards))
            full: list = []
            decompose(lo0, "kk_gm", c0.m_axes, full)
            decompose(lo0, "kk_gn", c0.n_axes, full)
            decl_free = tuple(_used(full, score_free))
    inputs = {n for r in (lo0.r, lo1.r) for n, _ in r.inputs}
    params = tuple(Param(f"b{i}", C.STORAGE[_memref(pair, n).dtype.name], const=n in inputs)
                   for i, n in enumerate(names)) + tuple(Param(f"s_{s}", "long long", pointer=False) for s in syms)
    return PairCode(lo0, lo1, tuple(setup), tuple(batch1), tuple(decl_score), tuple(score), tuple(decl_out),
                    out_code, bound, params, tuple(steps), inside, decl_free, score_free)


def lower_attention(program: Program, pair: AttentionPair, plan: Plan, syms: tuple, name: str,
                    names: list) -> AttentionKernel:
    """The fused kernel of ``pair`` under ``plan``; ``names``: the buffers in parameter order (``b<i>``)."""
    pc = pair_code(pair, syms, name, names)
    lo0, lo1 = pc.lo0, pc.lo1
    bm, bn, _ = plan.tile
    d, dv = pair.head
    dt = pair.f0.dtype_of(pair.c0.x).name
    loads = []
    for ring, step, (e, side, rows, cols) in zip(("sQ", "sK", "sV"), pc.steps, operand_reads(pair)):
        lo = (lo0, lo1)[side]
        # the element offset at row 0, column 0 of the batch point
        off = C.offset_expr(e.index, lo.memrefs[e.tensor].shape).subs({a: Expr.lift(0) for a in (*rows, *cols)})
        loads.append(BlockLoad(ring, f"{lo.cname[e.tensor]} + ({C.index(off, set(lo.iters))})", f"{step}LL",
                               extent(lo, rows)))
    rings = (SmemRing("sQ", "x", "sk", bm, d, PAD, 1), SmemRing("sK", "y", "sk", bn, d, PAD, 2),
             SmemRing("sV", "y", "ks", bn, dv, PAD, 2))
    tq, tk, tv = Token("tQ", "TokLoad"), Token("tK", "TokLoad"), Token("tV", "TokLoad")
    ts, tp, to, te = (Token("tS", "TokCompute"), Token("tP", "TokCompute"), Token("tO", "TokCompute"),
                      Token("tE", "TokEpilogue"))
    mma = Mma(dt)
    first = TileRef(0, in_loop=False)
    # groups: (Q, K0), (V0), then per key block kt: K[kt + 1] after S's wait, V[kt + 1] after P·V's: the wait
    # at each use leaves exactly the other ring's newest group in flight; each barrier also frees the stage
    # the previous block's MMAs read, which the refill right after it overwrites
    prologue = (LoadBlock("sQ", first, tq), LoadBlock("sK", first, tk), CommitGroup(),
                LoadBlock("sV", first, tv), CommitGroup(), WaitGroup(1, (tq, tk)), Barrier("landed"),
                LoadQFrag((tq,), LdMatrix("x", False)))
    body = (WaitGroup(1, (tk,)), Barrier("landed+release"), LoadBlock("sK", TileRef(1), tk), CommitGroup(),
            ScoreMma(TileRef(0), (tk,), ts, LdMatrix("y", False), mma), OnlineSoftmax(ts, tp),
            WaitGroup(1, (tv,)), Barrier("landed+release"), LoadBlock("sV", TileRef(1), tv), CommitGroup(),
            PvMma(TileRef(0), (tp, tv), to, LdMatrix("y", True), mma))
    kern = AttentionKernel(name, plan.arch, pc.params, (bm, bn, 16), (d, dv), rings, tuple(loads), prologue,
                           KLoop("kt", body), (WaitGroup(0),),
                           Epilogue(tuple(plan.epilogue), to, te, "fragment", code=pc.out),
                           StGlobal(te), pc.setup, pc.batch1, pc.decl_score, pc.score, pc.decl_out,
                           pair.k2, pc.bound, (pair_note(pair, pc.bound),))
    return kern


def pair_note(pair: AttentionPair, bound: str) -> str:
    c0 = pair.c0
    d, dv = pair.head
    return (f"streaming attention: {pair.f0.region.name} (contraction {c0.let} + online softmax over "
            f"{c0.n_axes[0]}) -> {pair.f1.region.name} (contraction {pair.c1.let}); {pair.p} stays in registers; "
            f"D {d}, DV {dv}, exp2 scale {pair.k2!r}" + ("; key blocks past the guards skipped" if bound else ""))


def _used(decls: list, code) -> list:
    """The declarations ``code`` uses (an unused one is an nvcc warning)."""
    text = " ".join(repr(x) for x in code)
    return [d for d in decls if re.search(rf"\b{re.escape(d.name)}\b", text)]


def _memref(pair: AttentionPair, name: str):
    return {**pair.f0.memrefs, **pair.f1.memrefs}[name]


def pair_buffers(pair: AttentionPair) -> list:
    """The fused kernel's buffers in parameter order: the producer's inputs, the consumer's other inputs, then
    the consumer's outputs (the deferred P is none of them)."""
    r0, r1 = pair.f0.region, pair.f1.region
    ins = [n for n, _ in r0.inputs] + [n for n, _ in r1.inputs if n != pair.p]
    return list(dict.fromkeys(ins)) + [o.name for o in r1.outputs]
