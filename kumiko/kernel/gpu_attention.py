"""Fused streaming attention on SM80 (FlashAttention-2 structure), derived from the attention Region pair.

Seed 001 §15.3: the scores' region and the P·V region are a pair whose P is ``deferred``. The pair is found
from the regions' structure, never from an op name (``find_attention_pair``):

- the **producer** is a contraction ``S = sum_K x*y`` (batch axes, one M axis - the queries -, one N axis -
  the keys -, K the head dim) followed by a *streaming softmax* row program: pointwise *score* lets of the
  accumulator (a scale, a mask ``select(guard, s, -inf)``, anything pointwise, reads included), a row max
  ``m`` over N of the score ``z``, pointwise lets whose value is ``exp2(k * (z - m))`` (``exp`` folds
  ``log2 e`` into ``k``; ``k > 0``), their row sum ``l`` and the yielded ``e / l``;
- the **consumer** is a contraction whose M-side operand reads exactly that output at (batch, M, K1) with
  K1 the producer's N axis, with a pointwise epilogue; its N-side operand (V) is a plain row-major tile.

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
``kumiko.render.cuda_attention``.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from kumiko.diagnostics import KumikoError
from kumiko.kernel import cexpr as C
from kumiko.kernel.elide import masked_elision, prefix_bound
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
from kumiko.kernel.stream import acc_guards
from kumiko.plan.gpu import FUSED, MMA_DTYPES, STREAMING, WARP_ROWS
from kumiko.plan.plan import Plan, make_plan
from kumiko.region.analysis import Contraction, RegionFacts, chained_contractions
from kumiko.region.srnf import children, map_children
from kumiko.region.ssa import Binary, BroadcastInDim, Const, Program, Read, Reduce, Ref, RExpr, Select, Unary
from kumiko.symbolic import Expr


# -- the pair ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionPair:
    producer: int              # index of the producer region in the program
    f0: RegionFacts
    c0: Contraction
    f1: RegionFacts
    c1: Contraction
    p: str                     # the deferred buffer the fused kernel never writes
    score: tuple               # the score lets (names, in order), the last one is z
    z: str
    k2: float                  # p = exp2(k2 * (z - m))
    guards: tuple              # the score's guards, when only they observe the accumulator
    head: tuple                # (D, DV): the head dims of Q/K and V (constants)


def _refs(e: RExpr) -> set:
    if isinstance(e, Ref):
        return {e.name}
    out: set = set()
    for k in children(e):
        out |= _refs(k)
    return out


def _has(e: RExpr, kind) -> bool:
    return isinstance(e, kind) or any(_has(k, kind) for k in children(e))


def _lin(e: RExpr, z: str, m: str, env: dict):
    """``e`` as ``a*z + b*m + c`` (a, b, c floats) when it is that affine form of the score ``z`` and the row
    max ``m`` (through the lets in ``env``), else None."""
    if isinstance(e, BroadcastInDim):
        return _lin(e.operand, z, m, env)
    if isinstance(e, Ref):
        return (1.0, 0.0, 0.0) if e.name == z else (0.0, 1.0, 0.0) if e.name == m else env.get(e.name)
    if isinstance(e, Const):
        return (0.0, 0.0, float(e.value)) if isinstance(e.value, (int, float)) and math.isfinite(e.value) else None
    if isinstance(e, Unary) and e.fn == "neg":
        x = _lin(e.x, z, m, env)
        return None if x is None else tuple(-v for v in x)
    if not isinstance(e, Binary) or e.fn not in ("add", "sub", "mul", "div"):
        return None
    x, y = _lin(e.x, z, m, env), _lin(e.y, z, m, env)
    if x is None or y is None:
        return None
    if e.fn in ("add", "sub"):
        s = 1.0 if e.fn == "add" else -1.0
        return tuple(a + s * b for a, b in zip(x, y))
    if e.fn == "mul" and (x[:2] == (0.0, 0.0) or y[:2] == (0.0, 0.0)):
        c, v = (x[2], y) if x[:2] == (0.0, 0.0) else (y[2], x)
        return tuple(c * a for a in v)
    if e.fn == "div" and y[:2] == (0.0, 0.0) and y[2] != 0.0:
        return tuple(a / y[2] for a in x)
    return None


def _row_program(f0: RegionFacts, c0: Contraction, n: str):
    """(score lets, z, k2) when the producer's lets after the contraction are a streaming softmax over ``n``
    (module docstring), else None."""
    lets = [x for x in f0.region.lets if x.name != c0.let]
    full = {x.name for x in lets if n in f0.types[x.name].axes}
    score, i = [], 0
    while i < len(lets) and lets[i].name in full and not _has(lets[i].expr, Reduce) \
            and _refs(lets[i].expr) <= {c0.let, *score}:
        score.append(lets[i].name)
        i += 1
    rest = lets[i:]
    if not score or not rest:
        return None
    mx = rest[0]
    if not (isinstance(mx.expr, Reduce) and mx.expr.op == "max" and [a.name for a in mx.expr.axes] == [n]
            and mx.expr.init == -math.inf and isinstance(mx.expr.body, Ref) and mx.expr.body.name in score
            and mx.name not in full):
        return None
    z, env = mx.expr.body.name, {}
    k2, e_let = None, None
    chain = list(itertools.takewhile(lambda x: x.name in full, rest[1:]))    # the lets between the max and the sum
    for let in chain:
        form = _lin(let.expr, z, mx.name, env)
        if form is not None:
            env[let.name] = form
            continue
        if not (isinstance(let.expr, Unary) and let.expr.fn in ("exp", "exp2") and e_let is None):
            return None
        a, b, c = _lin(let.expr.x, z, mx.name, env) or (0.0, 0.0, 1.0)
        if a <= 0.0 or b != -a or c != 0.0:
            return None
        k2, e_let = (a if let.expr.fn == "exp2" else a * math.log2(math.e)), let.name
    tail = rest[1 + len(chain):]
    if e_let is None or len(tail) != 2:
        return None
    sm, out = tail
    if not (isinstance(sm.expr, Reduce) and sm.expr.op == "sum" and [a.name for a in sm.expr.axes] == [n]
            and sm.expr.init == 0 and sm.expr.body == Ref(e_let) and sm.name not in full):
        return None
    d = out.expr
    den = d.y.operand if isinstance(d, Binary) and isinstance(d.y, BroadcastInDim) else getattr(d, "y", None)
    if not (isinstance(d, Binary) and d.fn == "div" and d.x == Ref(e_let) and den == Ref(sm.name)
            and f0.region.yields[0].src == out.name and len(f0.region.yields) == 1):
        return None
    return tuple(score), z, k2


def strided_tile(memrefs: dict, e: RExpr, rows: tuple, cols: tuple) -> int | None:
    """The row step (elements) when ``e`` reads a 16-bit tile whose element offset is ``base + row * step + col``
    for its one row axis and one column axis (columns contiguous), with the step and the base multiples of 8
    halves (16-byte rows for cp.async): a head of a projection's output ``[tokens, heads * d]`` read as
    ``[tokens, d]``, as well as a plain ``[..., rows, d]`` tile; else None."""
    if not isinstance(e, Read) or e.flat or len(rows) != 1 or len(cols) != 1:
        return None
    m = memrefs[e.tensor]
    if m.dtype.name not in MMA_DTYPES:
        return None
    off = C.offset_expr(e.index, m.shape)
    (r,), (c,) = rows, cols
    step = off.coeff(r)
    if off.coeff(c) != 1 or step <= 0 or step % 8:
        return None
    rest = off - Expr.sym(r) * step - Expr.sym(c)
    if rest.symbols() & {r, c} or rest.const % 8 or any(coef % 8 for _, coef in rest.terms):
        return None
    return step


def _operand_tiles(f0: RegionFacts, c0: Contraction, f1: RegionFacts, c1: Contraction) -> list:
    """Q's, K's and V's row steps (``strided_tile``): Q, K [rows, head dim], V [keys, head dim]; None where not."""
    k0, k1 = tuple(a.name for a in c0.k_axes), tuple(a.name for a in c1.k_axes)
    return [strided_tile(f0.memrefs, c0.x, c0.m_axes, k0), strided_tile(f0.memrefs, c0.y, c0.n_axes, k0),
            strided_tile(f1.memrefs, c1.y, k1, c1.n_axes)]


def find_attention_pair(program: Program, k: int) -> AttentionPair | None:
    """The attention pair of regions ``k`` and ``k + 1``, when their structure is one (module docstring)."""
    ch = chained_contractions(program, k)
    if ch is None:
        return None
    f0, c0, f1, c1, p, n0 = ch.f0, ch.c0, ch.f1, ch.c1, ch.p, ch.n0
    r0 = program.regions[k]
    dts = {f0.dtype_of(c0.x), f0.dtype_of(c0.y), f1.dtype_of(c1.y), r0.outputs[0].memref.dtype}
    if len(dts) != 1 or next(iter(dts)) is None or next(iter(dts)).name not in MMA_DTYPES:
        return None
    d, dv = _size([a.size for a in c0.k_axes]), _size([f1.sizes[a] for a in c1.n_axes])
    if len(c0.k_axes) != 1 or not d or d % 16 or d > 256 or not dv or dv % 16 or dv > 256:
        return None
    rp = _row_program(f0, c0, n0)
    if rp is None or None in _operand_tiles(f0, c0, f1, c1):
        return None
    guards = acc_guards(r0.lets, c0.let, tuple(y.src for y in r0.yields)) or ()
    if guards and masked_elision(r0.lets, c0.let, n0, guards, r0.yields[0].src, f0.types) is None:
        guards = ()                 # masked columns may matter: every key block is computed
    return AttentionPair(k, f0, c0, f1, c1, p, *rp, guards, (d, dv))


def _size(sizes) -> int:
    """The product of constant sizes (0 when one is symbolic)."""
    return math.prod(Expr.lift(x).as_int() or 0 for x in sizes)


# -- the SM90 kernel's tensor maps ---------------------------------------------------------------------------
#: head dims the SM90 kernel (``gpu_attention_sm90``) takes (Q/K's and V's): whole 64-half boxes of the 128-byte
#: swizzle, and registers for S, P and O
HEAD_DIMS_SM90 = (64, 128)
#: a TMA box's rows and columns are at most 256; the map has the head dim, the rows and at most 3 batch axes
MAX_BATCH_DIMS = 3


@dataclass(frozen=True)
class OperandMap:
    """One of Q, K, V as a tensor map: the element offset of the batch point's row 0, column 0 is ``origin`` plus
    ``sum(stride_b * b)`` over ``batch`` ((axis of the producer, stride in elements), moving axes only); rows are
    ``step`` elements apart, ``rows`` of them, ``cols`` columns (the head dim)."""
    origin: Expr
    batch: tuple
    step: int
    rows: Expr
    cols: int


def _affine(f: RegionFacts, e, rows: tuple, cols: tuple, batch: tuple, step: int) -> tuple | None:
    """(origin, ((axis, stride), ...)) when ``e``'s element offset is origin + sum(stride * axis) over ``batch`` +
    ``step`` * row + col, the strides free of the region's axes; None otherwise."""
    off = C.offset_expr(e.index, f.memrefs[e.tensor].shape)
    axes = {a.name for a in f.region.iters} | set(rows) | set(cols) | set(batch)
    zero = {a: Expr.lift(0) for a in axes}
    origin = off.subs(zero)
    out, rebuilt = [], origin
    for a in batch:
        s = off.subs({**zero, a: Expr.lift(1)}) - origin
        if s.symbols() & axes:
            return None
        out.append((a, s))
        rebuilt = rebuilt + s * Expr.sym(a)
    rebuilt = rebuilt + Expr.sym(rows[0]) * step + Expr.sym(cols[0])
    if (off - rebuilt).as_int() != 0:
        return None
    return origin, tuple(out)


def operand_maps(pair: AttentionPair) -> tuple | None:
    """Q's, K's and V's ``OperandMap`` (V's batch axes named by the producer's), or None when one is not a tensor
    map's view (not a ``strided_tile``, an offset not affine in the batch axes, more than ``MAX_BATCH_DIMS`` moving
    batch axes). From the regions' facts alone: the planner asks it before any code exists."""
    c0, c1 = pair.c0, pair.c1
    to0 = dict(zip(c1.batch, c0.batch))
    out = []
    for (e, side, rows, cols), step in zip(operand_reads(pair), _operand_tiles(pair.f0, c0, pair.f1, c1)):
        f, c = (pair.f0, c0) if side == 0 else (pair.f1, c1)
        got = None if step is None else _affine(f, e, rows, cols, c.batch, step)
        if got is None:
            return None
        origin, strides = got
        moving = tuple((to0.get(a, a), s) for a, s in strides if s.as_int() != 0)
        if len(moving) > MAX_BATCH_DIMS:
            return None
        sizes = {**f.sizes, **{a.name: a.size for a in c.k_axes}}
        out.append(OperandMap(origin, moving, step, Expr.lift(sizes[rows[0]]), Expr.lift(sizes[cols[0]]).as_int()))
    return tuple(out)


def sm90_attention_applies(pair: AttentionPair) -> bool:
    """Whether the SM90 kernel (``gpu_attention_sm90``) takes the pair: head dims in ``HEAD_DIMS_SM90``, Q, K, V
    tensor-map views."""
    d, dv = pair.head
    return d in HEAD_DIMS_SM90 and dv in HEAD_DIMS_SM90 and operand_maps(pair) is not None


# -- plans ------------------------------------------------------------------------------------------------
#: the SM count the SM90 plan assumes when it sizes the query block (an H100 SXM's 132)
SM90_SMS = 132


def attention_plan(arch: str, pair: AttentionPair, consumer: str) -> Plan:
    """The producer's plan. On sm90, when the SM90 kernel takes the pair: BM = 128 query rows (two consumer
    warpgroups; 64 when constant sizes give fewer query blocks than two a SM), BN = 128 keys a block, K and V
    double-buffered rings filled by TMA (``gpu_attention_sm90``). Otherwise BM = 64 query rows (4 warps of 16),
    BN = 64 keys per block, k16 steps over the head dim, K and V double-buffered (2 stages) by cp.async. P is
    handed to the consumer's MMA in registers either way."""
    c0 = pair.c0
    if arch == "sm90" and sm90_attention_applies(pair):
        sizes = {a.name: a.size for a in pair.f0.region.iters}
        m, batch = _size([sizes[a] for a in c0.m_axes]), _size([sizes[a] for a in c0.batch]) if c0.batch else 1
        consumers = 1 if m and batch and -(-m // 128) * batch < 2 * SM90_SMS else 2
        return make_plan(arch, tile=(64 * consumers, 128, 64), stages=2, threads=128 * (1 + consumers),
                         bind={"m.o": "block.x", "batch": "block.y", "m.i.o": "warpgroup"},
                         predicate_tail=c0.m_axes + c0.n_axes, algo_choice={"contraction": STREAMING},
                         barrier_model="mbarrier", local_edges=({"from": pair.p, "to": consumer, "buffer": "reg"},),
                         async_={"enable": True, "prefetch_depth": 1, "epilogue_overlap": False,
                                 "pingpong": consumers == 2})
    return make_plan(arch, tile=(64, 64, 16), stages=2, warp_tile=f"{WARP_ROWS}x64", threads=128,
                     bind={"m.o": "block.x", "batch": "block.y", "m.i.o": "warp"},
                     vectorize={"axis": "k", "width": 8}, predicate_tail=c0.m_axes + c0.n_axes,
                     algo_choice={"contraction": STREAMING}, barrier_model="cp_async_group",
                     local_edges=({"from": pair.p, "to": consumer, "buffer": "reg"},),
                     async_={"enable": True, "prefetch_depth": 1, "epilogue_overlap": False})


def fused_plan(arch: str, pair: AttentionPair, producer: str) -> Plan:
    """The consumer's plan: run inside the producer's kernel."""
    return make_plan(arch, algo_choice={"region": FUSED}, local_edges=({"from": pair.p, "to": producer,
                                                                         "buffer": "reg"},))


def pair_attention(program: Program, plans: dict, arch: str, given=()) -> dict:
    """``plans`` with every attention pair whose plans the chooser made (neither in ``given``) on the fused
    streaming kernel."""
    out = dict(plans)
    for k, r in enumerate(program.regions[:-1]):
        r1 = program.regions[k + 1]
        if r.name in given or r1.name in given or out[r.name].algo == FUSED:
            continue
        pair = find_attention_pair(program, k)
        if pair is not None:
            out[r.name], out[r1.name] = attention_plan(arch, pair, r1.name), fused_plan(arch, pair, r.name)
    return out


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
    steps = _operand_tiles(pair.f0, c0, pair.f1, c1)
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


def operand_reads(pair: AttentionPair) -> tuple:
    """Q's, K's and V's (read, emitter side, row axes, column axes): 0 the producer's, 1 the consumer's."""
    c0, c1 = pair.c0, pair.c1
    k0, k1 = tuple(a.name for a in c0.k_axes), tuple(a.name for a in c1.k_axes)
    return ((c0.x, 0, c0.m_axes, k0), (c0.y, 0, c0.n_axes, k0), (c1.y, 1, k1, c1.n_axes))


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
