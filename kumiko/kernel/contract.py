"""The packed contraction path: a top-level ``Reduce(sum, K, mul(x, y))`` of a region runs as a
BLIS-style blocked GEMM with packed panels and a register-blocked micro-kernel whose shape comes from
the Plan (``micro=(MR, NR)``, ``vectorize.width``, ``tile=(MC, NC, KC)``).

Nothing here knows op names. The axes of the contraction are classified from the region itself:
output axes that only ``x`` reads are M, those only ``y`` reads are N, those both read are batch, and
the reduce axes are K.

Orientation and row order. The micro-kernel's B panels are NR rows wide along the vector lanes, so the
operand whose rows are contiguous in memory goes to the B (N) side: ``x`` and ``y`` swap roles when
only ``x`` has a unit-stride row axis (a stride-1 convolution's pixels against its weights), and always
when a window reduction (a pooling consumer computed at the contraction) is fused, so windows run along
the columns of the accumulator tile. Each side's row axes are ordered by decreasing memory stride (the
pixels of a pooled conv become ``(n, oh, ow)`` again), which keeps consecutive rows consecutive in
memory.

Packing through index tables. An operand of the form ``guard ? v(src[index]) : 0`` - nested pad
Selects over one Read, with casts or pointwise maps of the loaded element - whose index and guard
expressions split into a part over the row axes, a part over K and a part over batch/sizes (affine
maps do; a floor division mixing rows and K does not) is packed from tables computed once per call:
a row offset and a row guard value per row, a K offset and K guard value per K index, a scalar per
batch point. The row tables are filled with counters (no division per row). A panel (MR or NR rows)
is classified once per K block: its rows are one contiguous run, two runs (a row of pixels that wraps),
or apart; each guard's extremes over its rows and over the block's K decide whether every row is
valid at every k. Then: one copy of R floats per k (a run), or 8 x 8 transposes (rows apart, K
consecutive: a row-major A); otherwise per k a copy, zeros, or a per-row mask from the guards (AVX2
masked loads of the runs or a masked gather; scalar code without AVX2). Anything else (a data-dependent
gather, a non-separable index, a pad of another value) is packed by the generic expression emitter per
element.

Parallelism. One ``omp parallel`` region; the tables are filled cooperatively. The threads split the
work one of three ways, chosen at run time: whole batch points each (private buffers, no barrier); a
range of N each (private buffers, no barrier: when M is small, so A is packed once per batch point and
kept for every K, or when rows split unevenly); or a range of M rows each, in blocks of at most MC
rows, sharing each (N block, K block) of packed B that they pack together into one of two buffers (one
barrier per K block). K blocks are of equal size (at most KC). The accumulator lives in a C scratch
(row stride padded off multiples of 4 KiB) across K blocks; the micro-kernel zeroes its accumulators,
prefetches its C tile and adds it at the end. After the last K block the rest of the region (the
epilogue: bias, activation, cast; SRNF R3) runs on each thread's rows of the block, along runs of the
innermost N axis (``omp simd``), with counters instead of divisions; a fused window reduction runs
over (row, window group) units (after a barrier when the rows are shared). Scratch buffers are kept
per thread between calls (``kk_scratch``): fresh pages each call cost more than packing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Assign, Block, Comment, Decl, For, If, Kernel, Raw, Store
from kumiko.kernel.lower_cpu import CpuLowering, _refs
from kumiko.plan.plan import Plan
from kumiko.region.srnf import free_axes
from kumiko.region.ssa import (
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Guard,
    Read,
    Reduce,
    Ref,
    RExpr,
    Select,
    Transpose,
    Unary,
    VType,
)
from kumiko.symbolic import Expr, FloorDiv, Sym, prod


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


def micro_name(mr: int, nr: int, vw: int, a_rows: bool = False) -> str:
    return f"kk_micro_{'rows_' if a_rows else ''}{mr}x{nr}_v{vw}"


def micro_kernel(mr: int, nr: int, vw: int, a_rows: bool = False) -> str:
    """An MR x NR register-blocked micro-kernel: C[MR][NR] (+)= sum_p A[p][MR] * B[p][NR].

    The accumulators start at zero and C is added at the end (``acc``), its rows prefetched at the start:
    a C tile that comes from L3 then costs no stall before the first multiply-add. With ``a_rows`` A is
    not a packed panel but MR rows of a row-major tile (``a[i*lda + p]``, an extra ``lda`` argument): the
    row-block pipeline (``kumiko.kernel.stream``) stores P along its rows and multiplies it in place."""
    nv = nr // vw
    a_arg = "const float* KUMIKO_RESTRICT a, long long lda" if a_rows else "const float* KUMIKO_RESTRICT a"
    lines = [f"static void {micro_name(mr, nr, vw, a_rows)}(long long kc, {a_arg}, const float* KUMIKO_RESTRICT b, "
             "float* KUMIKO_RESTRICT c, long long ldc, int acc) {"]
    accs = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    if a_rows:
        for i in range(mr):
            lines.append(f"  const float* KUMIKO_RESTRICT a{i}r = a + {i}*lda;")
    for i in range(mr):
        lines.append(f"  __builtin_prefetch(c + {i}*ldc, 0, 3); __builtin_prefetch(c + {i}*ldc + {nr - 1}, 0, 3);")
    for i in range(mr):
        lines.append("  " + " ".join(f"kk_vf {accs[i][v]} = (kk_vf){{0}};" for v in range(nv)))
    lines.append("  for (long long p = 0; p < kc; ++p) {")
    for v in range(nv):
        lines.append(f"    kk_vf b{v} = *(const kk_vf*)(b + p*{nr} + {v * vw});")
    for i in range(mr):
        src = f"a{i}r[p]" if a_rows else f"a[p*{mr} + {i}]"
        lines.append(f"    {{ const float s{i} = {src}; kk_vf a{i} = (kk_vf){{{', '.join([f's{i}'] * vw)}}};")
        lines.append("      " + " ".join(f"{accs[i][v]} += a{i} * b{v};" for v in range(nv)) + " }")
    lines.append("  }")
    lines.append("  if (acc) {")
    for i in range(mr):
        for v in range(nv):
            lines.append(f"    {accs[i][v]} += *(const kk_vfu*)(c + {i}*ldc + {v * vw});")
    lines.append("  }")
    for i in range(mr):
        for v in range(nv):
            lines.append(f"  *(kk_vfu*)(c + {i}*ldc + {v * vw}) = {accs[i][v]};")
    lines.append("}")
    return "\n".join(lines)


#: what the contraction kernels need besides kumiko_cpu.h: the OpenMP thread queries (stubs without OpenMP)
_HELPERS = """#ifndef KK_CONTRACT_HELPERS
#define KK_CONTRACT_HELPERS
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif
/* Scratch kept by each thread between calls, grow-only, shared by the contraction kernels of this program
 * (they run one at a time on a thread): a fresh multi-MiB allocation per call is fresh pages, and the page
 * faults cost more than a large GEMM's packing. Slots: 0 accumulator tile, 1 B panels, 2-3 index tables,
 * 4 the thread's A panels; 5-9 and 0 the row-block pipeline (kumiko.kernel.stream). A slot above 64 MiB is
 * freed at the end of the call. */
#define KK_SCRATCH_SLOTS 10
static _Thread_local void* kk_scratch_p[KK_SCRATCH_SLOTS];
static _Thread_local size_t kk_scratch_n[KK_SCRATCH_SLOTS];
__attribute__((unused)) static void* kk_scratch(int slot, size_t bytes) {
  if (bytes > kk_scratch_n[slot]) {
    free(kk_scratch_p[slot]);
    kk_scratch_p[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    kk_scratch_n[slot] = kk_scratch_p[slot] ? bytes : 0;
  }
  return kk_scratch_p[slot];
}
/* at the end of a call: a slot above 64 MiB is given back (its page faults are small next to its work) */
__attribute__((unused)) static void kk_scratch_trim(int slot) {
  if (kk_scratch_n[slot] > ((size_t)64 << 20)) {
    free(kk_scratch_p[slot]);
    kk_scratch_p[slot] = 0;
    kk_scratch_n[slot] = 0;
  }
}
#if defined(__AVX__)
/* dst[p*ld + i] = rows[i][p] for i < nr (<= 8), p < kc: 8 x 8 transposes. A store of a short column spills
 * into the next column's place (rewritten next, or by a later, wider chunk); only the last one is cut. */
__attribute__((unused, noinline)) static void kk_pack_rows8(float* KUMIKO_RESTRICT dst, long long ld,
                                                            const float* const* rows, int nr, long long kc) {
  const float* r[8];
  for (int i = 0; i < 8; ++i) r[i] = rows[i < nr ? i : 0];
  long long p = 0;
  for (; p + 8 <= kc; p += 8) {
    const __m256 a0 = _mm256_loadu_ps(r[0] + p), a1 = _mm256_loadu_ps(r[1] + p), a2 = _mm256_loadu_ps(r[2] + p);
    const __m256 a3 = _mm256_loadu_ps(r[3] + p), a4 = _mm256_loadu_ps(r[4] + p), a5 = _mm256_loadu_ps(r[5] + p);
    const __m256 a6 = _mm256_loadu_ps(r[6] + p), a7 = _mm256_loadu_ps(r[7] + p);
    const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
    const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    __m256 o[8];
    o[0] = _mm256_permute2f128_ps(u0, u4, 0x20); o[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    o[2] = _mm256_permute2f128_ps(u2, u6, 0x20); o[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    o[4] = _mm256_permute2f128_ps(u0, u4, 0x31); o[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    o[6] = _mm256_permute2f128_ps(u2, u6, 0x31); o[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
    for (int j = 0; j < 8; ++j) {
      if (nr == 8 || p + j + 1 < kc) _mm256_storeu_ps(dst + (p + j) * ld, o[j]);
      else { float t[8]; _mm256_storeu_ps(t, o[j]); memcpy(dst + (p + j) * ld, t, sizeof(float) * nr); }
    }
  }
  for (; p < kc; ++p)
    for (int i = 0; i < nr; ++i) dst[p * ld + i] = r[i][p];
}
#endif
#endif
"""


def vector_types(vw: int) -> str:
    return (f"typedef float kk_vf __attribute__((vector_size({4 * vw})));\n"
            "typedef kk_vf kk_vfu __attribute__((aligned(4)));\n" + _HELPERS)


# index tables -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Table:
    """An operand as ``valid ? value(src[o0 + o_row + o_k]) : 0`` where every guard is
    ``g0 + g_row + g_k (>= | ==) 0``: each part of an index depends on the rows, on K, or on neither
    (batch axes and sizes: part 0)."""
    tensor: str
    dtype: dtypes.DType
    off: tuple            # (rest, row part, k part): Exprs
    guards: tuple         # ((op, (rest, row part, k part)), ...)
    value: RExpr          # the packed value, over Ref("__ld") (the loaded element in its compute type)
    identity: bool        # value is the fp32 element itself (vector copies apply)


def _names(atom) -> set:
    return {atom.name} if isinstance(atom, Sym) else set(atom.num.symbols())


def _parts(e: Expr, rows: set, ks: set) -> tuple | None:
    """(rest, row part, k part) of ``e``; None when one term mixes rows and K."""
    out: tuple = ({}, {}, {})
    for mono, coef in e.terms:
        names: set = set()
        for a in mono:
            names |= _names(a)
        r, k = bool(names & rows), bool(names & ks)
        if r and k:
            return None
        out[1 if r else 2 if k else 0][mono] = coef
    return Expr(out[0], e.const), Expr(out[1]), Expr(out[2])


def _is_zero(e: RExpr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and float(e.value) == 0.0


def _table_form(e: RExpr, memrefs: dict, rows: set, ks: set) -> _Table | None:
    guards: list = []
    casts: list = []
    node = e
    while True:
        if isinstance(node, Select) and isinstance(node.pred, Guard) and _is_zero(node.other):
            guards += list(node.pred.constraints)
            node = node.then
        elif isinstance(node, Cast):
            casts.append(node.to)
            node = node.x
        elif isinstance(node, (BroadcastInDim, Transpose)):
            node = node.operand
        else:
            break
    reads: list = []

    def rebuild(x: RExpr) -> RExpr | None:
        if isinstance(x, Read):
            reads.append(x)
            return Ref("__ld")
        if isinstance(x, (BroadcastInDim, Transpose)):
            return rebuild(x.operand)
        if isinstance(x, Unary):
            y = rebuild(x.x)
            return None if y is None else Unary(x.fn, y)
        if isinstance(x, Cast):
            y = rebuild(x.x)
            return None if y is None else Cast(y, x.to)
        if isinstance(x, Binary) and isinstance(x.y, Const):
            y = rebuild(x.x)
            return None if y is None else Binary(x.fn, y, x.y)
        if isinstance(x, Binary) and isinstance(x.x, Const):
            y = rebuild(x.y)
            return None if y is None else Binary(x.fn, x.x, y)
        return None
    value = rebuild(node)
    if value is None or len(reads) != 1:
        return None
    for to in reversed(casts):
        value = Cast(value, to)
    rd = reads[0]
    m = memrefs[rd.tensor]
    if rd.flat:
        off = Expr.lift(rd.index[0])
    else:
        off = Expr.lift(0)
        for i, d in zip(rd.index, m.shape):
            off = off * d + i
    op = _parts(off, rows, ks)
    gs = []
    for g, kind in guards:
        gp = _parts(Expr.lift(g), rows, ks)
        if op is None or gp is None:
            return None
        gs.append((kind, gp))
    if op is None:
        return None
    if m.dtype.name == "fp32" and value == Cast(Ref("__ld"), dtypes.fp32):
        value = Ref("__ld")
    identity = value == Ref("__ld") and m.dtype.name == "fp32"
    return _Table(rd.tensor, m.dtype, op, tuple(gs), value, identity)


def _stride(off: Expr, a: str) -> int | None:
    """How far ``off`` moves when axis ``a`` grows by one, when that is a number (else None)."""
    k = 0
    for mono, coef in off.terms:
        for atom in mono:
            if isinstance(atom, FloorDiv) and a in atom.num.symbols():
                return None
            if isinstance(atom, Sym) and atom.name == a:
                if mono != (atom,):
                    return None
                k = coef
    return k


def _row_order(axes: tuple, t: _Table | None) -> tuple:
    """Rows ordered by decreasing memory stride (sizes counted as 64): consecutive rows then tend to be
    consecutive elements. Axes that move nothing or move it non-affinely go outermost."""
    if t is None:
        return axes

    def weight(a: str) -> float:
        w = 0
        for mono, coef in t.off[1].terms:
            if any(isinstance(x, FloorDiv) and a in x.num.symbols() for x in mono):
                return float("inf")
            if sum(1 for x in mono if isinstance(x, Sym) and x.name == a) == 1:
                w += abs(coef) * 64 ** (len(mono) - 1)
        return w or float("inf")
    return tuple(sorted(axes, key=lambda a: -weight(a)))


@dataclass(frozen=True)
class _Side:
    key: str              # "a": packed into A panels (the M side), "b": into B panels (the N side)
    expr: RExpr
    rows: tuple           # row axes, outermost first: a packed row is the row-major flat index over them
    r: int                # panel width (MR or NR)
    table: _Table | None  # None: packed by the generic emitter, element by element
    count: str            # the C variable holding the number of rows


def _unit(rows: tuple, t: _Table | None) -> bool:
    return t is not None and bool(rows) and _stride(t.off[1], rows[-1]) == 1


def _carry(names: tuple, sizes: tuple) -> str:
    """Advance a row-major counter over ``names`` by one (the outermost never wraps)."""
    text = f"++{names[0]};"
    for n, s in zip(names[1:], sizes[1:]):
        text = f"if (++{n} == {s}) {{ {n} = 0; {text} }}"
    return text


_BIG = "(1LL << 62)"       # beyond any index: the starting point of the panel's guard extremes
_SMALL = "(1LL << 30)"     # guard values within this use 32-bit vector compares
_ARES = 65536              # floats of A a thread packs once per batch point for every K (half of a 512 KiB L2)


def _split(flat: str, names: tuple, sizes: list, out: list) -> None:
    """``long long name = ...`` for each of ``names`` from a row-major flat index over ``sizes``."""
    rest = flat
    for k, (a, sz) in enumerate(zip(reversed(names), reversed(sizes))):
        if k == len(names) - 1:
            out.append(Decl("long long", a, rest))
        else:
            out.append(Decl("long long", a, f"({rest}) % {sz}"))
            rest = f"({rest}) / {sz}"


def _ld8(arr: str, c0: int) -> str:
    return f"_mm256_load_si256((const __m256i*)({arr} + {c0}))"


class _PackText:
    """The C text that packs panels of one table-form operand (``ContractionLowering._pack_table``).

    Per K block: whether the K offsets are consecutive, and each guard's extremes over K. Per panel: the
    rows' offsets relative to the first (one contiguous run, two runs, or a gather), each guard's
    threshold per row and its extremes over the panel. Then, when every row is valid at every k of the
    block, one copy per k (a run) or 8 x 8 transposes (rows apart, K consecutive); else per k: a copy
    (every row valid), zeros (none), or a per-row mask - AVX2 masked loads of the runs or a masked
    gather, a scalar loop without AVX2 or past 32-bit guard values."""

    def __init__(self, sd: _Side, src: str, at_run: tuple, at_rel: tuple, at_k: tuple):
        self.t, self.R, self.p, self.src = sd.table, sd.r, f"kk_{sd.key}", src
        self.G = len(self.t.guards)
        self.RV = (self.R + 7) // 8 * 8
        self.vec = self.t.identity              # fp32 elements as they are: vector copies apply
        self.at_run, self.at_rel, self.at_k = at_run, at_rel, at_k   # (decl of kk_ld, value) at an index

    def block(self, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        p, G = self.p, self.G
        L = ["{", "int kk_kcontig = kk_kcb > 0;     /* the K offsets of the block are consecutive */",
             f"for (long long kk_k = kk_pc; kk_k < kk_pc + kk_kcb; ++kk_k) "
             f"kk_kcontig &= {p}ko[kk_k] == {p}ko[kk_pc] + (kk_k - kk_pc);"]
        L += [f"long long kk_kmin{j} = {_BIG}, kk_kmax{j} = -{_BIG};" for j in range(G)]
        if G:     # the extremes of each guard's K part over the K block
            L += ["for (long long kk_k = kk_pc; kk_k < kk_pc + kk_kcb; ++kk_k) {"]
            L += [f"  kk_kmin{j} = {p}kg{j}[kk_k] < kk_kmin{j} ? {p}kg{j}[kk_k] : kk_kmin{j}; "
                  f"kk_kmax{j} = {p}kg{j}[kk_k] > kk_kmax{j} ? {p}kg{j}[kk_k] : kk_kmax{j};" for j in range(G)]
            L += ["}"]
        L += [f"for (long long kk_q = {q0}; kk_q < {q1}; ++kk_q) {{", *self.panel(rowbase, limit, dst),
              *self.whole_block(), *self.per_k(), "}", "}"]
        return L

    def panel(self, rowbase: str, limit: str, dst: str) -> list:
        R, RV, p = self.R, self.RV, self.p
        L = [f"  const long long kk_r0 = {rowbase} + kk_q*{R};",
             f"  const long long kk_nv = {limit} - kk_r0 < {R} ? ({limit} - kk_r0 > 0 ? {limit} - kk_r0 : 0) : {R};",
             f"  float* KUMIKO_RESTRICT kk_d = {dst} + kk_q*{R}*kk_kcb;",
             f"  const long long* kk_ro = {p}ro + kk_r0;",
             f"  const long long kk_base = {p}bo + kk_ro[0];",
             f"  long long kk_rel[{R}];",
             f"  for (int kk_r = 0; kk_r < {R}; ++kk_r) kk_rel[kk_r] = kk_r < kk_nv ? kk_ro[kk_r] - kk_ro[0] : 0;",
             "  /* the rows: one contiguous run (1), two runs [0, kk_s) and [kk_s, kk_nv) (2), or apart (3) */",
             "  long long kk_s = 0;",
             "  while (kk_s < kk_nv && kk_rel[kk_s] == kk_s) ++kk_s;",
             "  const long long kk_d2 = kk_s < kk_nv ? kk_rel[kk_s] - kk_s : 0;",
             "  int kk_runs = kk_s == kk_nv ? 1 : 2;",
             "  for (long long kk_r = kk_s; kk_r < kk_nv; ++kk_r) if (kk_rel[kk_r] != kk_d2 + kk_r) kk_runs = 3;"]
        for j in range(self.G):     # row r is valid at k when the K part (+ batch part) reaches kk_t[r]
            L += [f"  long long kk_t{j}[{R}], kk_hi{j} = -{_BIG}, kk_lo{j} = {_BIG};",
                  f"  for (int kk_r = 0; kk_r < kk_nv; ++kk_r) {{ kk_t{j}[kk_r] = -{p}rg{j}[kk_r0 + kk_r]; "
                  f"kk_hi{j} = kk_t{j}[kk_r] > kk_hi{j} ? kk_t{j}[kk_r] : kk_hi{j}; "
                  f"kk_lo{j} = kk_t{j}[kk_r] < kk_lo{j} ? kk_t{j}[kk_r] : kk_lo{j}; }}"]
        if self.vec:
            L += ["#if defined(__AVX2__)",
                  f"  KUMIKO_ALIGN(32) int kk_l1[{RV}], kk_l2[{RV}], kk_ri[{RV}];",
                  "  int kk_small = 1;",
                  f"  for (int kk_r = 0; kk_r < {RV}; ++kk_r) {{",
                  "    kk_l1[kk_r] = kk_r < kk_s && kk_r < kk_nv ? -1 : 0;",
                  "    kk_l2[kk_r] = kk_r >= kk_s && kk_r < kk_nv ? -1 : 0;",
                  "    kk_ri[kk_r] = kk_r < kk_nv ? (int)kk_rel[kk_r] : 0;",
                  "    kk_small &= kk_r >= kk_nv || (kk_rel[kk_r] > -2147483647LL && kk_rel[kk_r] < 2147483647LL);",
                  "  }"]
            for j in range(self.G):
                L += [f"  KUMIKO_ALIGN(32) int kk_i{j}[{RV}];",
                      f"  for (int kk_r = 0; kk_r < {RV}; ++kk_r) {{",
                      f"    kk_i{j}[kk_r] = kk_r < kk_nv ? (int)kk_t{j}[kk_r] : 0;",
                      f"    kk_small &= kk_r >= kk_nv || (kk_t{j}[kk_r] > -{_SMALL} && kk_t{j}[kk_r] < {_SMALL});",
                      "  }"]
            L.append("#endif")
        return L

    def whole_block(self) -> list:
        """Every row valid at every k of the K block: copies without tests."""
        R, p, src = self.R, self.p, self.src
        conds = [f"kk_nv == {R}"] + [f"kk_kmin{j} + {p}bg{j} >= kk_hi{j}" if op == "ge" else
                                     f"kk_kmin{j} + {p}bg{j} == kk_hi{j} && kk_kmax{j} + {p}bg{j} == kk_lo{j}"
                                     for j, (op, _) in enumerate(self.t.guards)]
        if self.vec:
            copy = f"memcpy(kk_d + kk_p*{R}, {src} + kk_base + {p}ko[kk_pc + kk_p], sizeof(float) * {R});"
        else:
            ld, v = self.at_k
            copy = f"for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld} kk_d[kk_p*{R} + kk_r] = {v}; }}"
        L = [f"  const int kk_allfull = {' && '.join(conds)};",
             "  if (kk_runs == 1 && kk_allfull) {",
             f"    for (long long kk_p = 0; kk_p < kk_kcb; ++kk_p) {copy}",
             "    continue;",
             "  }"]
        if self.vec:
            L += ["#if defined(__AVX__)",
                  "  if (kk_kcontig && kk_allfull) {",
                  f"    const float* kk_rp[{self.RV}];",
                  f"    for (int kk_r = 0; kk_r < {self.RV}; ++kk_r) "
                  f"kk_rp[kk_r] = {src} + kk_base + {p}ko[kk_pc] + kk_rel[kk_r < {R} ? kk_r : 0];"]
            for c0 in reversed(range(0, R, 8)):     # a short last chunk first: its spill is overwritten
                L.append(f"    kk_pack_rows8(kk_d + {c0}, {R}, kk_rp + {c0}, {min(8, R - c0)}, kk_kcb);")
            L += ["    continue;", "  }", "#endif"]
        return L

    def per_k(self) -> list:
        R, p, G, src = self.R, self.p, self.G, self.src
        gk = [f"kk_g{j}" for j in range(G)]
        L = ["  for (long long kk_p = 0; kk_p < kk_kcb; ++kk_p) {",
             "    const long long kk_k = kk_pc + kk_p;",
             f"    const long long kk_o = kk_base + {p}ko[kk_k];",
             f"    float* KUMIKO_RESTRICT kk_dp = kk_d + kk_p*{R};"]
        L += [f"    const long long {gk[j]} = {p}kg{j}[kk_k] + {p}bg{j};" for j in range(G)]
        full, empty, row = [f"kk_nv == {R}"], ["kk_nv == 0"], ["kk_r < kk_nv"]
        for j, (op, _) in enumerate(self.t.guards):
            if op == "ge":
                full.append(f"{gk[j]} >= kk_hi{j}")
                empty.append(f"{gk[j]} < kk_lo{j}")
                row.append(f"{gk[j]} >= kk_t{j}[kk_r]")
            else:
                full.append(f"{gk[j]} == kk_hi{j} && {gk[j]} == kk_lo{j}")
                empty.append(f"{gk[j]} < kk_lo{j} || {gk[j]} > kk_hi{j}")
                row.append(f"{gk[j]} == kk_t{j}[kk_r]")
        (ld_c, v_c), (ld_g, v_g) = self.at_run, self.at_rel
        if self.vec:
            copy = f"memcpy(kk_dp, {src} + kk_o, sizeof(float) * {R});"
            runs2 = [f"      if (kk_runs == 2) {{ memcpy(kk_dp, {src} + kk_o, sizeof(float) * kk_s); "
                     f"memcpy(kk_dp + kk_s, {src} + kk_o + kk_d2 + kk_s, sizeof(float) * ({R} - kk_s)); }}",
                     "      else"]
        else:
            copy = f"for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld_c} kk_dp[kk_r] = {v_c}; }}"
            runs2 = []
        L += [f"    if ({' && '.join(full)}) {{",
              f"      if (kk_runs == 1) {{ {copy} }}",
              "      else {", *runs2,
              f"      for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld_g} kk_dp[kk_r] = {v_g}; }}",
              "      }"]
        if G:
            L += [f"    }} else if ({' || '.join(empty)}) {{",
                  f"      memset(kk_dp, 0, sizeof(float) * {R});"]
        L += ["    } else {", *self.masked(gk),
              f"      for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ float kk_v = 0.0f; "
              f"if ({' && '.join(row)}) {{ {ld_g} kk_v = {v_g}; }} kk_dp[kk_r] = kk_v; }}",
              "    }", "  }"]
        return L

    def masked(self, gk: list) -> list:
        """Some rows valid: the lanes' mask from the guards, then masked loads of the runs or a gather."""
        if not self.vec:
            return []
        R, src = self.R, self.src
        L = ["#if defined(__AVX2__)", "      if (kk_small) {"]
        for j in range(self.G):
            L.append(f"        const __m256i kk_gv{j} = _mm256_set1_epi32((int)({gk[j]} < -{_SMALL} ? "
                     f"-{_SMALL} : {gk[j]} > {_SMALL} ? {_SMALL} : {gk[j]}));")
        for c0 in range(0, R, 8):
            l1, l2 = _ld8("kk_l1", c0), _ld8("kk_l2", c0)
            L.append(f"        {{ __m256i kk_m = _mm256_or_si256({l1}, {l2}); __m256 kk_v;")
            for j, (op, _) in enumerate(self.t.guards):
                if op == "ge":
                    L.append(f"          kk_m = _mm256_andnot_si256(_mm256_cmpgt_epi32({_ld8(f'kk_i{j}', c0)}, "
                             f"kk_gv{j}), kk_m);")
                else:
                    L.append(f"          kk_m = _mm256_and_si256(_mm256_cmpeq_epi32({_ld8(f'kk_i{j}', c0)}, "
                             f"kk_gv{j}), kk_m);")
            L += ["          if (kk_runs == 3)",
                  f"            kk_v = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), {src} + kk_o, "
                  f"{_ld8('kk_ri', c0)}, _mm256_castsi256_ps(kk_m), 4);",
                  "          else {",
                  f"            kk_v = _mm256_maskload_ps({src} + kk_o + {c0}, _mm256_and_si256(kk_m, {l1}));",
                  "            if (kk_runs == 2)",
                  f"              kk_v = _mm256_or_ps(kk_v, _mm256_maskload_ps({src} + kk_o + kk_d2 + {c0}, "
                  f"_mm256_and_si256(kk_m, {l2})));",
                  "          }"]
            if c0 + 8 <= R:
                L.append(f"          _mm256_storeu_ps(kk_dp + {c0}, kk_v); }}")
            else:
                L.append("          KUMIKO_ALIGN(32) float kk_tmp[8]; _mm256_store_ps(kk_tmp, kk_v); "
                         f"memcpy(kk_dp + {c0}, kk_tmp, sizeof(float) * {R - c0}); }}")
        return L + ["      } else", "#endif"]


class ContractionLowering:
    """Emits the blocked contraction into a region kernel (in front of the epilogue or generic rest)."""

    def __init__(self, lo: CpuLowering, c: Contraction, plan: Plan):
        self.lo, self.c, self.plan = lo, c, plan
        self.mr, self.nr = plan.micro
        self.vw = plan.vector_width
        self.mc, self.nc, self.kc = plan.tile
        extra = c.k_axes + (c.outer.axes if c.outer is not None else ())
        for a in extra:
            lo.sizes[a.name] = a.size
        ks = {a.name for a in c.k_axes}
        tx = _table_form(c.x, lo.memrefs, set(c.m_axes), ks)
        ty = _table_form(c.y, lo.memrefs, set(c.n_axes), ks)
        ox, oy = _row_order(c.m_axes, tx), _row_order(c.n_axes, ty)
        self.swapped = c.outer is not None or (_unit(ox, tx) and not _unit(oy, ty))
        if self.swapped:
            self.a = _Side("a", c.y, oy, self.mr, ty, "kk_M")
            self.b = _Side("b", c.x, ox, self.nr, tx, "kk_N")
        else:
            self.a = _Side("a", c.x, ox, self.mr, tx, "kk_M")
            self.b = _Side("b", c.y, oy, self.nr, ty, "kk_N")

    def size(self, axes) -> str:
        return C.index(prod([self.lo.sizes[a] for a in axes]) if axes else 1, set())

    def decompose(self, flat: str, axes: tuple, out: list) -> None:
        """``long long a = ...`` for each axis from a row-major flat index over ``axes``."""
        _split(flat, axes, [C.index(self.lo.sizes[a], set()) for a in axes], out)

    def operand(self, e: RExpr, out: list) -> str:
        lo = self.lo
        saved = list(lo.red_axes)
        lo.red_axes = [a.name for a in self.c.k_axes + (self.c.outer.axes if self.c.outer is not None else ())]
        v = lo.expr(e, out)
        t = lo.dt(e)
        lo.red_axes = saved
        return v if t is None or t.name == "fp32" else f"(float)({v})"

    # tables ---------------------------------------------------------------------------------------------
    def _tables(self, sd: _Side) -> tuple[list, list]:
        """(allocation, cooperative fill) of a side's index tables."""
        t, p, n = sd.table, f"kk_{sd.key}", 1 + len(sd.table.guards)
        names = [("o", 0)] + [(f"g{j}", j + 1) for j in range(n - 1)]
        alloc = [Raw(f"long long* {p}tab = (long long*)kk_scratch({2 if sd.key == 'a' else 3}, sizeof(long long) * "
                     f"(size_t)(({sd.count} + {sd.r}) * {n} + kk_K * {n}));")]
        for nm, j in names:
            alloc.append(Decl("long long* KUMIKO_RESTRICT", f"{p}r{nm}", f"{p}tab + {j} * ({sd.count} + {sd.r})"))
        for nm, j in names:
            alloc.append(Decl("long long* KUMIKO_RESTRICT", f"{p}k{nm}", f"{p}tab + {n} * ({sd.count} + {sd.r}) + "
                              f"{j} * kk_K"))
        exprs = [t.off] + [g for _, g in t.guards]
        fill: list = []
        k_axes = tuple(a.name for a in self.c.k_axes)
        for side, axes, count, part in (("r", sd.rows, sd.count, 1), ("k", k_axes, "kk_K", 2)):
            var = f"kk_f{side}"
            body: list = [Store(f"{p}{side}{nm}", var, C.index(e[part], set(axes))) for (nm, _), e in zip(names, exprs)]
            sizes = tuple(C.index(self.lo.sizes[a], set()) for a in axes)
            dec: list = []
            self.decompose(f"{var}0", axes, dec)
            fill.append(Block((Decl("const long long", f"{var}0", f"kk_t * {count} / kk_nt"),
                               Decl("const long long", f"{var}1", f"(kk_t + 1) * {count} / kk_nt"),
                               If(f"{var}0 < {var}1", (*dec, For(var, f"{var}0", f"{var}1", tuple(body) + (
                                   Raw(_carry(axes, sizes)),)))))))
        fill.append(If("kk_t == 0", (For("kk_fr", sd.count, f"{sd.count} + {sd.r}", tuple(
            Store(f"{p}r{nm}", "kk_fr", "0") for nm, _ in names)),)))
        return alloc, fill

    def _batch_parts(self, sd: _Side) -> list:
        t, p = sd.table, f"kk_{sd.key}"
        scope = set(self.c.batch)
        out = [Decl("const long long", f"{p}bo", C.index(t.off[0], scope))]
        out += [Decl("const long long", f"{p}bg{j}", C.index(g[0], scope)) for j, (_, g) in enumerate(t.guards)]
        return out

    # packing --------------------------------------------------------------------------------------------
    def _pack(self, sd: _Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        """Pack panels [q0, q1) of ``sd``'s rows from ``rowbase`` (rows >= ``limit`` are zero) at
        K in [kk_pc, kk_pc + kk_kcb) into ``dst`` (panel q at ``dst + q*R*kk_kcb``, layout [p][R])."""
        if sd.table is None:
            return self._pack_expr(sd, q0, q1, rowbase, limit, dst)
        return [Raw(self._pack_table(sd, q0, q1, rowbase, limit, dst))]

    def _pack_expr(self, sd: _Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        R = sd.r
        rows: list = []
        self.decompose("kk_r0 + kk_i", sd.rows, rows)
        ks: list = []
        self.decompose("kk_pc + kk_p", tuple(a.name for a in self.c.k_axes), ks)
        v = self.operand(sd.expr, vb := [])
        return [For("kk_q", q0, q1, (
            Decl("const long long", "kk_r0", f"{rowbase} + kk_q*{R}"),
            Decl("float* KUMIKO_RESTRICT", "kk_d", f"{dst} + kk_q*{R}*kk_kcb"),
            For("kk_i", "0", str(R), (
                If(f"kk_r0 + kk_i < {limit}",
                   tuple(rows) + (For("kk_p", "0", "kk_kcb", tuple(ks) + tuple(vb) + (
                       Store("kk_d", f"kk_p*{R} + kk_i", v),)),),
                   (For("kk_p", "0", "kk_kcb", (Store("kk_d", f"kk_p*{R} + kk_i", "0.0f"),)),)),)),))]

    def _value(self, sd: _Side, idx: str) -> tuple[str, str]:
        """(declaration of kk_ld, the packed float value) of the element at ``src[idx]``."""
        lo, t = self.lo, sd.table
        ct = C.COMPUTE[t.dtype.name]
        decl = f"const {ct} kk_ld = {C.load(lo.cname[t.tensor], idx, t.dtype)};"
        lo.storage["__ld"] = ("scalar", "kk_ld")
        lo.ty.lets["__ld"] = VType(t.dtype, ())
        out: list = []
        v = lo.expr(t.value, out)
        assert not out, "table-form values are expressions"
        dt = lo.dt(t.value)
        return decl, (v if dt is None or dt.name == "fp32" else f"(float)({v})")

    def _pack_table(self, sd: _Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> str:
        """C text packing panels [q0, q1) from the index tables (see the module docstring)."""
        at_k = f"kk_base + kk_{sd.key}ko[kk_pc + kk_p] + kk_r"
        pk = _PackText(sd, self.lo.cname[sd.table.tensor], self._value(sd, "kk_o + kk_r"),
                       self._value(sd, "kk_o + kk_rel[kk_r]"), self._value(sd, at_k))
        return "\n".join(pk.block(q0, q1, rowbase, limit, dst))

    # epilogues ------------------------------------------------------------------------------------------
    def _epi_pointwise(self, epilogue, r0: str, r1: str, c0: str, c1: str) -> list:
        """``epilogue()`` at rows [r0, r1) x columns [c0, c1) of the block: runs of the innermost N axis
        (``omp simd``), the other axes advanced by counters."""
        lo, A, B = self.lo, self.a, self.b
        dm: list = []
        self.decompose("kk_ii", A.rows, dm)
        last, outer = B.rows[-1], B.rows[:-1]
        sizes = [C.index(lo.sizes[a], set()) for a in B.rows]
        dn: list = []
        _split(f"kk_jc + {c0}", outer + ("kk_nl",), sizes, dn)
        g0 = lo.uses_gather
        lo.uses_gather = False
        body = tuple(epilogue())
        simd = not lo.uses_gather
        lo.uses_gather = lo.uses_gather or g0
        s_last = sizes[-1]
        carry = "kk_nl = 0;" if not outer else "kk_nl = 0; " + _carry(outer, tuple(sizes[:-1]))
        return [For("kk_ii", r0, r1, tuple(dm) + tuple(dn) + (
            Decl("long long", "kk_j", c0),
            Raw(f"while (kk_j < {c1}) {{"),
            Decl("const long long", "kk_run", f"{c1} - kk_j < {s_last} - kk_nl ? {c1} - kk_j : {s_last} - kk_nl"),
            Decl("const float* KUMIKO_RESTRICT", "kk_cr", "kk_Ct + kk_ii*kk_ldc + kk_j"),
            For(last, "kk_nl", "kk_nl + kk_run", (Decl("float", "kk_acc", f"kk_cr[{last} - kk_nl]"),) + body,
                vector=int(simd)),
            Raw(f"kk_j += kk_run; kk_nl += kk_run;\nif (kk_nl == {s_last}) {{ {carry} }}\n}}")))]

    def _epi_window(self, epilogue, u0: str, u1: str) -> list:
        """Units (row, window group) [u0, u1) of the block: reduce each window of ``f(acc)`` with the
        outer op (the windows lie inside one group of G consecutive columns), then the epilogue."""
        c, lo, A, B = self.c, self.lo, self.a, self.b
        wset = [a.name for a in c.outer.axes]
        first = min(B.rows.index(w) for w in wset)
        prefix, suffix = B.rows[:first], B.rows[first:]
        nonw = tuple(a for a in suffix if a not in wset)
        wins = tuple(a for a in suffix if a in wset)
        col, stride = Expr.lift(0), Expr.lift(1)
        for a in reversed(suffix):
            col = col + Expr.sym(a) * stride
            stride = stride * lo.sizes[a]
        lo.storage["__acc"] = ("scalar", "kk_w")
        lo.ty.lets["__acc"] = VType(dtypes.fp32, ())
        saved = list(lo.red_axes)
        lo.red_axes = list(wset)
        fv_stmts: list = []
        fv = lo.expr(c.f, fv_stmts, c.outer.dtype)
        lo.red_axes = saved
        ct = C.COMPUTE[c.outer.dtype.name]
        upd = {"sum": f"kk_acc + {fv}", "max": C.binary("max", "kk_acc", fv, ct),
               "min": C.binary("min", "kk_acc", fv, ct)}[c.outer.op]
        dm: list = []
        self.decompose("kk_m", A.rows, dm)
        dp: list = []
        self.decompose("kk_jc / kk_G + kk_g", prefix, dp)
        de: list = []
        self.decompose("kk_e", nonw, de)
        dw: list = []
        self.decompose("kk_wi", wins, dw)
        ws = int(prod([lo.sizes[a] for a in wins]))
        win = For("kk_wi", "0", str(ws), tuple(dw) + (
            Decl("float", "kk_w", f"kk_cg[{C.index(col, set(suffix))}]"),) + tuple(fv_stmts) + (Assign("kk_acc", upd),))
        return [For("kk_u", u0, u1, (
            Decl("const long long", "kk_m", "kk_u / kk_ngr"),
            Decl("const long long", "kk_g", "kk_u % kk_ngr"),
            *dm, *dp,
            Decl("const float* KUMIKO_RESTRICT", "kk_cg", "kk_Ct + kk_m*kk_ldc + kk_g*kk_G"),
            For("kk_e", "0", self.size(nonw), tuple(de) + (
                Decl(ct, "kk_acc", C.literal(c.outer.init, c.outer.dtype)), win) + tuple(epilogue())),
        ))]

    # the kernel -----------------------------------------------------------------------------------------
    def emit(self, epilogue) -> list:  # noqa: C901
        """The whole contraction as statements; ``epilogue()`` returns the per-element work (the current
        point's axes are declared; the accumulator value is the C variable ``kk_acc``)."""
        c, lo, A, B = self.c, self.lo, self.a, self.b
        mr, nr, mc, nc, kc = self.mr, self.nr, self.mc, self.nc, self.kc
        k_axes = tuple(a.name for a in c.k_axes)
        lo.ty.add_axes(c.k_axes + (c.outer.axes if c.outer is not None else ()))
        win = c.outer is not None

        def how(sd: _Side) -> str:
            return "index tables" if sd.table is not None else "per element"
        s: list = [Comment(f"contraction {c.let}: batch {list(c.batch)}, M {list(A.rows)} ({how(A)}), "
                           f"N {list(B.rows)} ({how(B)}), K {list(k_axes)}; micro {mr}x{nr}, "
                           f"blocks MC<={mc} NC<={nc} KC<={kc}"),
                   Decl("const long long", "kk_B", self.size(c.batch)),
                   Decl("const long long", "kk_M", self.size(A.rows)),
                   Decl("const long long", "kk_N", self.size(B.rows)),
                   Decl("const long long", "kk_K", self.size(k_axes)),
                   Decl("const long long", "kk_Mp", f"(kk_M + {mr - 1}) / {mr} * {mr}")]
        if win:       # N blocks and thread ranges hold whole window groups (the N axes from the first window axis in)
            first = min(B.rows.index(a.name) for a in c.outer.axes)
            s += [Decl("const long long", "kk_G", f"{self.size(B.rows[first:])} > 0 ? {self.size(B.rows[first:])} : 1"),
                  Decl("const long long", "kk_nc0", f"kk_G * ({nc} / kk_G > 0 ? {nc} / kk_G : 1)"),
                  Decl("const long long", "kk_nc", "kk_nc0 < kk_N ? kk_nc0 : kk_N"),
                  Decl("const long long", "kk_un", "kk_G")]
        else:
            s += [Decl("const long long", "kk_nc", f"kk_N < {nc} ? kk_N : {nc}"),
                  Decl("const long long", "kk_un", str(nr))]
        s += [Decl("const long long", "kk_nun", "(kk_N + kk_un - 1) / kk_un"),
              Decl("const long long", "kk_ncp", f"(kk_nc + {nr - 1}) / {nr} * {nr}"),
              Decl("const long long", "kk_ldc", "kk_ncp % 1024 == 0 ? kk_ncp + 16 : kk_ncp"),
              # K blocks of equal size, at most KC
              Decl("const long long", "kk_nkb", f"kk_K > 0 ? (kk_K + {kc - 1}) / {kc} : 1"),
              Decl("const long long", "kk_kc", "kk_K > 0 ? (kk_K + kk_nkb - 1) / kk_nkb : 1"),
              Decl("const long long", "kk_bsz", "kk_ncp * kk_kc"),
              Decl("const long long", "kk_T", "omp_get_max_threads()"),
              # the most rows x columns one thread computes when threads split M, or N
              Decl("const long long", "kk_wm", f"(kk_Mp / {mr} + kk_T - 1) / kk_T * {mr} * kk_N"),
              Decl("const long long", "kk_wn", "(kk_nun + kk_T - 1) / kk_T * kk_un * kk_Mp"),
              # 2: whole batch points per thread; 1: a range of N per thread (when M splits unevenly or A is
              # small enough to pack once); both with private buffers and no barrier. 0: a range of M rows of
              # every block, whose B panels the threads pack together (a barrier per K block)
              Decl("const int", "kk_mode", "kk_T > 1 && kk_B > 1 && (kk_B % kk_T == 0 || kk_B >= 4 * kk_T) ? 2 : "
                   f"kk_T > 1 && (kk_wm * 20 > kk_wn * 21 || (kk_Mp * kk_K <= {_ARES} && kk_wn * 10 <= kk_wm * 11))"
                   " ? 1 : 0"),
              Decl("const long long", "kk_nbuf", "kk_mode ? kk_T : 1")]
        fills: list = []
        for sd in (A, B):
            if sd.table is not None:
                al, fi = self._tables(sd)
                s += al
                fills += fi
        s.append(Raw("float* kk_Bp = (float*)kk_scratch(1, sizeof(float) * (size_t)(kk_nbuf * 2 * kk_bsz));\n"
                     "float* kk_C = (float*)kk_scratch(0, sizeof(float) * (size_t)(kk_nbuf * kk_Mp * kk_ldc));"))
        par: list = [Decl("const int", "kk_t", "omp_get_thread_num()"),
                     Decl("const int", "kk_nt", "omp_get_num_threads()")]
        if fills:
            par += fills + [Raw("#pragma omp barrier")]
        par += [
            Decl("const long long", "kk_m0", f"kk_mode ? 0 : kk_t * (kk_Mp / {mr}) / kk_nt * {mr}"),
            Decl("const long long", "kk_m1", f"kk_mode ? kk_Mp : (kk_t + 1) * (kk_Mp / {mr}) / kk_nt * {mr}"),
            Decl("const long long", "kk_n0", "kk_mode == 1 ? kk_t * kk_nun / kk_nt * kk_un : 0"),
            Decl("const long long", "kk_n1x", "kk_mode == 1 ? (kk_t + 1) * kk_nun / kk_nt * kk_un : kk_N"),
            Decl("const long long", "kk_n1", "kk_n1x < kk_N ? kk_n1x : kk_N"),
            Decl("const long long", "kk_b0", "kk_mode == 2 ? kk_t * kk_B / kk_nt : 0"),
            Decl("const long long", "kk_b1", "kk_mode == 2 ? (kk_t + 1) * kk_B / kk_nt : kk_B"),
            # this thread's rows in blocks of at most MC, as even as MR allows; all of them packed once per
            # batch point (for every K) when that fits in L2
            Decl("const long long", "kk_nmb", f"(kk_m1 - kk_m0 + {mc - 1}) / {mc}"),
            Decl("const long long", "kk_mblk",
                 f"kk_nmb > 0 ? ((kk_m1 - kk_m0 + kk_nmb - 1) / kk_nmb + {mr - 1}) / {mr} * {mr} : {mr}"),
            Decl("const int", "kk_ares", f"(kk_m1 - kk_m0) * kk_K <= {_ARES}"),
            Decl("float* KUMIKO_RESTRICT", "kk_Ap", "(float*)kk_scratch(4, sizeof(float) * (size_t)(kk_ares ? "
                 f"(kk_m1 - kk_m0) * kk_K : {mc} * kk_kc))"),
            Decl("float*", "kk_Bt", "kk_Bp + (kk_mode ? kk_t : 0) * 2 * kk_bsz"),
            Decl("float*", "kk_Ct", "kk_C + (kk_mode ? kk_t : 0) * kk_Mp * kk_ldc"),
            Decl("long long", "kk_it", "0")]
        bdec: list = []
        self.decompose("kk_b", c.batch, bdec)
        for sd in (A, B):
            if sd.table is not None:
                bdec += self._batch_parts(sd)
        bdec.append(If("kk_ares", (Block((
            Decl("const long long", "kk_pc", "0"), Decl("const long long", "kk_kcb", "kk_K"),
            *self._pack(A, "0", f"(kk_m1 - kk_m0) / {mr}", "kk_m0", "kk_M", "kk_Ap"))),)))
        pack_b = self._pack(B, "kk_q0", "kk_q1", "kk_jc", "kk_jc + kk_ncur", "kk_Bc")
        pack_a = self._pack(A, "0", f"kk_mcb / {mr}", "kk_ic", "kk_M", "kk_Ap")
        micro = For("kk_jr", "0", "kk_np", (For("kk_ir", "0", "kk_mcb", (
            Raw(f"{micro_name(mr, nr, self.vw)}(kk_kcb, kk_Ac + kk_ir*kk_lda, kk_Bc + kk_jr*{nr}*kk_kcb, "
                f"kk_Ct + (kk_ic + kk_ir)*kk_ldc + kk_jr*{nr}, kk_ldc, kk_pc > 0);"),), step=str(mr)),))
        block = [Decl("const long long", "kk_mcb", "kk_m1 - kk_ic < kk_mblk ? kk_m1 - kk_ic : kk_mblk"),
                 If("!kk_ares", tuple(pack_a)),
                 Decl("const float*", "kk_Ac", f"kk_ares ? kk_Ap + (kk_ic - kk_m0) * kk_K + kk_pc * {mr} : kk_Ap"),
                 Decl("const long long", "kk_lda", "kk_ares ? kk_K : kk_kcb"),
                 micro]
        if not win:
            block.append(If("kk_last", tuple(self._epi_pointwise(
                epilogue, "kk_ic", "(kk_ic + kk_mcb < kk_M ? kk_ic + kk_mcb : kk_M)", "0", "kk_ncur"))))
        barrier = Raw("if (kk_mode == 0) {\n#pragma omp barrier\n}")
        kblock = [Decl("const long long", "kk_kcb", "kk_K - kk_pc < kk_kc ? kk_K - kk_pc : kk_kc"),
                  Decl("float* KUMIKO_RESTRICT", "kk_Bc", "kk_Bt + (kk_it++ & 1) * kk_bsz"),
                  Decl("const int", "kk_last", "kk_pc + kk_kcb >= kk_K"),
                  *pack_b, barrier,
                  For("kk_ic", "kk_m0", "kk_m1", tuple(block), step="kk_mblk")]
        if win:
            kblock.append(If("kk_last", (
                barrier,
                Decl("const long long", "kk_ngr", "kk_ncur / kk_G"),
                Decl("const long long", "kk_nu", "kk_M * kk_ngr"),
                *self._epi_window(epilogue, "(kk_mode ? 0 : kk_t * kk_nu / kk_nt)",
                                  "(kk_mode ? kk_nu : (kk_t + 1) * kk_nu / kk_nt)"))))
        jblock = [Decl("const long long", "kk_ncur", "kk_n1 - kk_jc < kk_nc ? kk_n1 - kk_jc : kk_nc"),
                  Decl("const long long", "kk_np", f"(kk_ncur + {nr - 1}) / {nr}"),
                  Decl("const long long", "kk_q0", "kk_mode ? 0 : kk_t * kk_np / kk_nt"),
                  Decl("const long long", "kk_q1", "kk_mode ? kk_np : (kk_t + 1) * kk_np / kk_nt"),
                  Raw("for (long long kk_pc = 0; kk_pc < kk_K || kk_pc == 0; kk_pc += kk_kc) {"), *kblock, Raw("}")]
        par.append(For("kk_b", "kk_b0", "kk_b1", tuple(bdec) + (
            For("kk_jc", "kk_n0", "kk_n1", tuple(jblock), step="kk_nc"),)))
        par.append(Raw("kk_scratch_trim(4);"))
        s += [Raw("#pragma omp parallel num_threads(kk_T)\n{"), *par, Raw("}"),
              Raw("kk_scratch_trim(0); kk_scratch_trim(1); kk_scratch_trim(2); kk_scratch_trim(3);")]
        return s


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


def pointwise_epilogue(lo: CpuLowering, c: Contraction) -> list:
    """The region's other lets and its store at one point, with the accumulator in the C scalar ``kk_acc``
    (the point's axes are declared by the caller)."""
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


def lower_contraction_region(lo: CpuLowering, plan: Plan) -> Kernel | None:
    """The region as contraction (+ in-tile epilogue, or + generic rest over a scratch accumulator)."""
    c = find_contraction(lo)
    if c is None:
        return None
    cl = ContractionLowering(lo, c, plan)
    if c.pointwise:
        body = cl.emit(lambda: pointwise_epilogue(lo, c))
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
