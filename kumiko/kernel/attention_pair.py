"""The attention Region pair: found from the regions' structure and planned for the fused streaming attention
kernels (``gpu_attention`` on SM80, ``gpu_attention_sm90`` on SM90), before any code exists.

Seed 001 §15.3: the scores' region and the P·V region are a pair whose P is ``deferred``. The pair is found
from the regions' structure, never from an op name (``find_attention_pair``):

- the **producer** is a contraction ``S = sum_K x*y`` (batch axes, one M axis - the queries -, one N axis -
  the keys -, K the head dim) followed by a *streaming softmax* row program: pointwise *score* lets of the
  accumulator (a scale, a mask ``select(guard, s, -inf)``, anything pointwise, reads included), a row max
  ``m`` over N of the score ``z``, pointwise lets whose value is ``exp2(k * (z - m))`` (``exp`` folds
  ``log2 e`` into ``k``; ``k > 0``), their row sum ``l`` and the yielded ``e / l``;
- the **consumer** is a contraction whose M-side operand reads exactly that output at (batch, M, K1) with
  K1 the producer's N axis, with a pointwise epilogue; its N-side operand (V) is a plain row-major tile.

This module owns the pair (``AttentionPair``), its operands' views (Q, K, V as row-strided tiles:
``strided_tile``, ``operand_tiles``, ``operand_reads``; as the SM90 kernel's tensor maps: ``operand_maps``) and
the pair's plans (``attention_plan``, ``fused_plan``; ``pair_attention`` puts the chooser's plans of every pair on
the fused kernel). The kernels' GPU IR and lowering are ``gpu_attention`` and ``gpu_attention_sm90``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from kumiko.kernel import cexpr as C
from kumiko.kernel.elide import masked_elision
from kumiko.kernel.stream import acc_guards
from kumiko.plan.gpu import FUSED, MMA_DTYPES, STREAMING, WARP_ROWS
from kumiko.plan.plan import Plan, make_plan
from kumiko.region.analysis import Contraction, RegionFacts, chained_contractions
from kumiko.region.srnf import children
from kumiko.region.ssa import Binary, BroadcastInDim, Const, Program, Read, Reduce, Ref, RExpr, Unary
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


def operand_tiles(f0: RegionFacts, c0: Contraction, f1: RegionFacts, c1: Contraction) -> list:
    """Q's, K's and V's row steps (``strided_tile``): Q, K [rows, head dim], V [keys, head dim]; None where not."""
    k0, k1 = tuple(a.name for a in c0.k_axes), tuple(a.name for a in c1.k_axes)
    return [strided_tile(f0.memrefs, c0.x, c0.m_axes, k0), strided_tile(f0.memrefs, c0.y, c0.n_axes, k0),
            strided_tile(f1.memrefs, c1.y, k1, c1.n_axes)]


def operand_reads(pair: AttentionPair) -> tuple:
    """Q's, K's and V's (read, emitter side, row axes, column axes): 0 the producer's, 1 the consumer's."""
    c0, c1 = pair.c0, pair.c1
    k0, k1 = tuple(a.name for a in c0.k_axes), tuple(a.name for a in c1.k_axes)
    return ((c0.x, 0, c0.m_axes, k0), (c0.y, 0, c0.n_axes, k0), (c1.y, 1, k1, c1.n_axes))


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
    if rp is None or None in operand_tiles(f0, c0, f1, c1):
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
    for (e, side, rows, cols), step in zip(operand_reads(pair), operand_tiles(pair.f0, c0, pair.f1, c1)):
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
