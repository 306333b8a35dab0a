"""The register-blocked micro-kernels of the packed contraction path (``kumiko.kernel.contract``) and
the C text they need besides ``kumiko_cpu.h``.

``micro_kernel(MR, NR, VW)`` is one ``static`` C function per micro-tile shape of the program's plans
(``register_block`` (MR, NR), ``vectorize.width``): ``C[MR][NR] (+)= A panel x B panel`` in GCC vector types
(``kk_vf``, VW floats). The row-block pipeline (``kumiko.kernel.stream``) uses a variant whose A is MR rows
of a row-major tile. ``vector_types(VW)`` is the translation unit's prelude for them: the vector types,
the OpenMP thread queries (stubs without OpenMP), the per-thread scratch kept between calls
(``kk_scratch``, ``kk_scratch_trim``) and the 8 x 8 transposing row packer (``kk_pack_rows8``) that
``kumiko.kernel.pack`` calls.
"""
from __future__ import annotations

#: how many times the micro-kernels' loop over k is unrolled (``#pragma GCC unroll``). Rolled, each k paid a
#: compare, a branch and the pointer steps beside its 12 multiply-adds (AVX2's 6 x 16): on a 2-core Zen 3,
#: in-process A/Bs, 20 pairs, unrolled 4 times against rolled: BERT 0.927 (IQR 0.885-0.988), MobileNetV2 0.948
#: (0.898-0.987), ResNet-50 0.946 (0.903-1.012); GEMMs 128 x 768 x 768 0.945, 128 x 3072 x 768 0.926
MICRO_UNROLL = 4


def _rows(mr: int, rows: int | None, out: bool = False) -> str:
    """The name suffix of a tail micro-kernel: ``rows`` of an MR-row tile computed (the last tile of an M
    that MR does not divide), its A panel still MR rows wide; ``_o``: the accumulators handed back (``out``)."""
    return (f"_r{rows}" if rows is not None and rows != mr else "") + ("_o" if out else "")


def micro_name(mr: int, nr: int, vw: int, a_rows: bool = False, b_ld: bool = False, rows: int | None = None,
               out: bool = False) -> str:
    return f"kk_micro_{'rows_' if a_rows else ''}{'bld_' if b_ld else ''}{mr}x{nr}_v{vw}{_rows(mr, rows, out)}"


#: independent multiply-add chains a micro-kernel keeps in flight, at least: a multiply-add's latency (4 cycles
#: on Zen 3 and Skylake) times the two a cycle issue. A tail kernel of fewer rows (``rows``) has fewer
#: accumulators than that, each one chain over all of k: it splits k among several sets of them (``chains``)
FMA_CHAINS = 8


def chains(rows: int, nv: int, vw: int) -> int:
    """How many sets of accumulators a tile of ``rows`` x ``nv`` vectors of ``vw`` floats splits k among (1 for
    the plans' full tiles): at least ``FMA_CHAINS`` chains in flight where the registers allow (16 of them, 32
    on AVX-512: the accumulators, the B vectors and a broadcast). A 7x7 conv's 49 pixels end in a tile of one
    row: its two accumulators' chains over all of K (2048 in ResNet-50's last stage) had run a multiply-add
    every 2 cycles, not 2 a cycle."""
    regs = 32 if vw == 16 else 16
    h = -(-FMA_CHAINS // (rows * nv))
    while h > 1 and rows * nv * h + nv + 1 > regs:
        h -= 1
    return max(h, 1)


def _acc(i: int, v: int, h: int) -> str:
    """The accumulator of row i, vector v, of the h-th set of them (``chains``)."""
    return f"c{i}_{v}" + (f"_{h}" if h else "")


def _fmas(mr: int, nv: int, vw: int, src, indent: str, h: int = 0) -> list:
    """The multiply-adds of one k: each A element broadcast against the B vectors ``b0..``, into the h-th set
    of accumulators."""
    lines = []
    for i in range(mr):
        lines.append(f"{indent}{{ const float s{i} = {src(i)}; kk_vf a{i} = (kk_vf){{{', '.join([f's{i}'] * vw)}}};")
        lines.append(f"{indent}  " + " ".join(f"{_acc(i, v, h)} = kk_vfma(a{i}, b{v}, {_acc(i, v, h)});"
                                                for v in range(nv)) + " }")
    return lines


def _head(name: str, args: str, out: bool) -> str:
    """A micro-kernel's first line: its C tile and ``acc`` last or, ``out``, the vectors it hands back instead
    (always inlined: the caller's epilogue takes them from registers)."""
    if out:
        return f"static inline __attribute__((always_inline)) void {name}({args}, kk_vf* KUMIKO_RESTRICT o) {{"
    return f"static void {name}({args}, float* KUMIKO_RESTRICT c, long long ldc, int acc) {{"


def _start(mr: int, nr: int, nv: int, nh: int = 1, out: bool = False) -> list:
    """Prefetch the C tile's rows (not ``out``: no C tile) and zero the accumulators (``nh`` sets)."""
    lines = [] if out else [f"  __builtin_prefetch(c + {i}*ldc, 0, 3); "
                            f"__builtin_prefetch(c + {i}*ldc + {nr - 1}, 0, 3);" for i in range(mr)]
    return lines + ["  " + " ".join(f"kk_vf {_acc(i, v, h)} = (kk_vf){{0}};" for v in range(nv))
                    for h in range(nh) for i in range(mr)]


def _finish(mr: int, nv: int, vw: int, nh: int = 1, out: bool = False) -> list:
    """Sum the sets of accumulators, then add the C tile when ``acc`` and store the accumulators into it or,
    ``out``, hand them back (``o[i*NV + v]``); close the function."""
    lines = [f"  {_acc(i, v, 0)} += " + " + ".join(_acc(i, v, h) for h in range(1, nh)) + ";"
             for i in range(mr) for v in range(nv)] if nh > 1 else []
    if out:
        return lines + [f"  o[{i * nv + v}] = c{i}_{v};" for i in range(mr) for v in range(nv)] + ["}"]
    lines.append("  if (acc) {")
    lines += [f"    c{i}_{v} += *(const kk_vfu*)(c + {i}*ldc + {v * vw});" for i in range(mr) for v in range(nv)]
    lines.append("  }")
    lines += [f"  *(kk_vfu*)(c + {i}*ldc + {v * vw}) = c{i}_{v};" for i in range(mr) for v in range(nv)]
    return lines + ["}"]


def _k_loop(indent: str, body, nh: int = 1) -> list:
    """The micro-kernels' loop over k, ``body(p, h)`` the lines of one k (``p``, C) into accumulator set h.
    One set: unrolled MICRO_UNROLL times (gcc left it rolled: one compare and branch, and the pointer steps,
    per 12 multiply-adds). ``nh`` sets (``chains``): k in steps of ``nh``, each k of a step into its own set,
    the rest of k into the first."""
    if nh == 1:
        return [f"{indent}#pragma GCC unroll {MICRO_UNROLL}", f"{indent}for (long long p = 0; p < kc; ++p) {{",
                *body("p", 0), f"{indent}}}"]
    lines = [f"{indent}{{ long long p = 0;", f"{indent}for (; p + {nh} <= kc; p += {nh}) {{"]
    for h in range(nh):
        lines += [f"{indent}  {{ const long long q = p + {h};", *body("q", h), f"{indent}  }}"]
    return lines + [f"{indent}}}", f"{indent}for (; p < kc; ++p) {{", *body("p", 0), f"{indent}}} }}"]


def stage_micro_name(mr: int, nr: int, vw: int, rows: int | None = None, out: bool = False) -> str:
    return f"kk_micro_stage_{mr}x{nr}_v{vw}{_rows(mr, rows, out)}"


def stage_micro_kernel(mr: int, nr: int, vw: int, rows: int | None = None, out: bool = False) -> str:
    """An MR x NR micro-kernel whose B is read in place from a padded copy of the operand (a stage, see
    ``kumiko.kernel.contract``), not from a packed panel: lane j of the panel at k is
    ``b[ko[k] + j]`` for j < s and ``b[ko[k] + d2 + j]`` from s on (a row of pixels that wraps: two runs).
    At most one vector holds both runs; it is the blend of two loads, every other vector one load, so
    the loop is generated once per position of that vector (and once for none)."""
    nv, mt = nr // vw, rows or mr
    nh = chains(mt, nv, vw)
    iota = ", ".join(str(j) for j in range(vw))
    lines = [_head(stage_micro_name(mr, nr, vw, rows, out), "long long kc, const float* KUMIKO_RESTRICT a, "
                   "const float* KUMIKO_RESTRICT b, const long long* KUMIKO_RESTRICT ko, long long s, long long d2",
                   out), *_start(mt, nr, nv, nh, out),
             f"  const long long kk_sv = s >= {nr} || s % {vw} == 0 ? -1 : s / {vw};   /* the vector with both runs */",
             f"  const int kk_s1 = (int)(s % {vw});   /* its lanes below kk_s1 are in the first run */",
             f"  const kk_vmi kk_mk = (kk_vmi){{{iota}}} < (kk_vmi){{{', '.join(['kk_s1'] * vw)}}};"]
    lines += [f"  const long long o{v} = {v * vw} >= s ? d2 + {v * vw} : {v * vw};" for v in range(nv)]

    def loop(blend: int) -> list:
        def body(p: str, h: int) -> list:
            lines = [f"    const float* KUMIKO_RESTRICT bp = b + ko[{p}];"]
            for v in range(nv):
                if v == blend:
                    lines.append(f"    const kk_vmi kk_x{v} = (kk_vmi)*(const kk_vfu*)(bp + {v * vw}), "
                                 f"kk_y{v} = (kk_vmi)*(const kk_vfu*)(bp + d2 + {v * vw});")
                    lines.append(f"    kk_vf b{v} = (kk_vf)((kk_x{v} & kk_mk) | (kk_y{v} & ~kk_mk));")
                else:
                    lines.append(f"    kk_vf b{v} = *(const kk_vfu*)(bp + o{v});")
            return lines + _fmas(mt, nv, vw, lambda i: f"a[{p}*{mr} + {i}]", "    ", h)
        return _k_loop("  ", body, nh)
    for v in range(-1, nv):
        lines += [f"  {'if' if v == -1 else 'else if'} (kk_sv == {v}) {{", *["  " + x for x in loop(v)], "  }"]
    return "\n".join(lines + _finish(mt, nv, vw, nh, out))


def astage_micro_name(mr: int, nr: int, vw: int, unit: bool = False, rows: int | None = None,
                      out: bool = False) -> str:
    return f"kk_micro_astage_{'u_' if unit else ''}{mr}x{nr}_v{vw}{_rows(mr, rows, out)}"


def astage_micro_kernel(mr: int, nr: int, vw: int, unit: bool = False, rows: int | None = None,
                        out: bool = False) -> str:
    """An MR x NR micro-kernel whose A is read in place from a padded copy of its operand (a stage on the A
    side, see ``kumiko.kernel.contract``), B from a packed panel: row i of the tile at k is ``a[ko[k] + i]``
    for i < s and ``a[ko[k] + d2 + i]`` from s on (a panel of pixels that wraps an output row: two runs;
    s = MR, one). Each row's broadcast is a load at a constant offset from one of two pointers, so the loop
    is generated once per s. ``unit``: rows ``u`` elements apart (an argument: a channels-last conv's pixels,
    each its channels), row i at ``a[ko[k] + i*u]`` and ``a[ko[k] + d2 + i*u]``. ``rows``: the tile's first
    ``rows`` rows only (``micro_kernel``), the loop once per s below ``rows`` and once for the rest."""
    nv, mt = nr // vw, rows or mr
    nh = chains(mt, nv, vw)
    lines = [_head(astage_micro_name(mr, nr, vw, unit, rows, out), "long long kc, const float* KUMIKO_RESTRICT a, "
                   "const long long* KUMIKO_RESTRICT ko, long long s, long long d2, "
                   f"{'long long u, ' if unit else ''}const float* KUMIKO_RESTRICT b", out),
             *_start(mt, nr, nv, nh, out)]
    if unit:
        lines += [f"  const long long u{i} = {i} * u;" for i in range(1, mt)]
    lines.append("  switch (s) {")
    at = (lambda i: f"[u{i}]" if i else "[0]") if unit else (lambda i: f"[{i}]")
    for j in range(1, mt + 1):       # from s = rows on, every row computed is in the first run
        def body(p: str, h: int, j=j) -> list:
            lines = [f"      const float* KUMIKO_RESTRICT ap = a + ko[{p}];"]
            if j < mt:
                lines.append("      const float* KUMIKO_RESTRICT ap2 = ap + d2;")
            lines += [f"      kk_vf b{v} = *(const kk_vf*)(b + {p}*{nr} + {v * vw});" for v in range(nv)]
            if unit:
                lines += [f"      KK_PIN{4 * vw}(b{v});" for v in range(nv)]
            return lines + _fmas(mt, nv, vw, lambda i: f"ap{at(i)}" if i < j else f"ap2{at(i)}", "      ", h)
        lines += [f"  {'default' if j == mt else f'case {j}'}:", *_k_loop("    ", body, nh), "    break;"]
    lines.append("  }")
    return "\n".join(lines + _finish(mt, nv, vw, nh, out))


def micro_kernel(mr: int, nr: int, vw: int, a_rows: bool = False, b_ld: bool = False,
                 rows: int | None = None, out: bool = False) -> str:
    """An MR x NR register-blocked micro-kernel: C[MR][NR] (+)= sum_p A[p][MR] * B[p][NR].

    The accumulators start at zero and C is added at the end (``acc``), its rows prefetched at the start:
    a C tile that comes from L3 then costs no stall before the first multiply-add. With ``a_rows`` A is
    not a packed panel but MR rows of a row-major tile (``a[i*lda + p]``, an extra ``lda`` argument): the
    row-block pipeline (``kumiko.kernel.stream``) stores P along its rows and multiplies it in place. With
    ``b_ld`` B is not a packed panel but NR consecutive elements of each of kc rows ``ldb`` apart, read in
    place with unaligned loads (an extra ``ldb`` argument: the skinny path's unpacked weights). With ``rows``
    (< MR) only the tile's first ``rows`` rows are computed and stored, A still a panel of MR rows: the last
    tile of an M that MR does not divide (128 rows: 21 tiles of 6 and one of 2) multiplies no padding rows.
    With ``out`` (every variant has it, name suffix ``_o``) there is no C tile: the sums of the kc products are
    handed back in ``o`` (``o[i*NV + v]``), the function always inlined: the caller's epilogue runs on them in
    registers (``ContractionLowering._tile_epilogue``, where K is one block; gcc scalarises ``o``)."""
    nv, mt = nr // vw, rows or mr
    a_arg = "const float* KUMIKO_RESTRICT a, long long lda" if a_rows else "const float* KUMIKO_RESTRICT a"
    b_arg = "const float* KUMIKO_RESTRICT b, long long ldb" if b_ld else "const float* KUMIKO_RESTRICT b"
    lines = [_head(micro_name(mr, nr, vw, a_rows, b_ld, rows, out), f"long long kc, {a_arg}, {b_arg}", out)]
    if a_rows:
        for i in range(mt):
            lines.append(f"  const float* KUMIKO_RESTRICT a{i}r = a + {i}*lda;")
    nh = chains(mt, nv, vw)

    def body(p: str, h: int) -> list:
        lines = [f"    kk_vf b{v} = *(const kk_vfu*)(b + {p}*ldb + {v * vw});" if b_ld else
                 f"    kk_vf b{v} = *(const kk_vf*)(b + {p}*{nr} + {v * vw});" for v in range(nv)]
        return lines + _fmas(mt, nv, vw, (lambda i: f"a{i}r[{p}]") if a_rows else (lambda i: f"a[{p}*{mr} + {i}]"),
                             "    ", h)
    lines += _start(mt, nr, nv, nh, out) + _k_loop("  ", body, nh)
    return "\n".join(lines + _finish(mt, nv, vw, nh, out))


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
 * 4 the thread's A panels; 5-9 and 0 the row-block pipeline (kumiko.kernel.stream); 10 the padded stage of
 * an operand (kumiko.kernel.contract). A slot above 64 MiB is freed at the end of the call. */
#define KK_SCRATCH_SLOTS 11
/* keep a vector of N bytes in a register (KK_PIN<N>): gcc otherwise folds a B vector's load into each
 * multiply-add that uses it when the tile takes all 16 AVX2 registers (4 x 24: one load per multiply-add
 * instead of one per k). Only where the ISA has registers that wide (a wider GCC vector type is emulated) */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)
#define KK_PIN64(v) __asm__("" : "+v"(v))
#else
#define KK_PIN64(v) ((void)0)
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
#define KK_PIN32(v) __asm__("" : "+v"(v))
#else
#define KK_PIN32(v) ((void)0)
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
#define KK_PIN16(v) __asm__("" : "+v"(v))
#else
#define KK_PIN16(v) ((void)0)
#endif
#ifdef KUMIKO_TRACE_STAGE
long long kk_stage_blocks;   /* blocks whose B was read from a stage (tests build with -DKUMIKO_TRACE_STAGE) */
long long kk_pack_s2;         /* AVX2 panel copies of stride-2 runs: every row valid, */
long long kk_pack_s2m;        /* some rows valid (the same tests) */
long long kk_dealt;           /* M blocks the threads took with kk_take (the same tests) */
#endif
/* The next of n units (a contraction's M blocks) for thread t of nt: from its own share
 * (units [t*n/nt, (t+1)*n/nt), counted in cnt[8*t]) while it lasts, then from the others' in turn (*vic, from
 * t on): a thread keeps the rows it would have had (and the caches that hold them), and one that runs ahead
 * finishes a slower one's share instead of waiting for it. -1: none left. */
__attribute__((unused)) static inline long long kk_take(long long* cnt, int t, int nt, long long n, int* vic) {
  while (*vic < t + nt) {
    const int v = *vic % nt;
    const long long lo = v * n / nt, hi = (v + 1) * n / nt;
    if (lo + __atomic_load_n(&cnt[8 * v], __ATOMIC_RELAXED) < hi) {
      const long long k = __atomic_fetch_add(&cnt[8 * v], 1, __ATOMIC_RELAXED);
      if (lo + k < hi) return lo + k;
    }
    ++*vic;
  }
  return -1;
}
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
 * into the next column's place (rewritten next, or by a later, wider chunk); a store that would reach past
 * the last column's nr values is cut (with ld < 4, as a 2- or 3-row skinny panel has, that is more than the
 * last one: a full store there ran past the buffer). */
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
      if ((p + j) * ld + 8 <= (kc - 1) * ld + nr) _mm256_storeu_ps(dst + (p + j) * ld, o[j]);
      else { float t[8]; _mm256_storeu_ps(t, o[j]); memcpy(dst + (p + j) * ld, t, sizeof(float) * nr); }
    }
  }
  for (; p < kc; ++p)
    for (int i = 0; i < nr; ++i) dst[p * ld + i] = r[i][p];
}
#endif
#endif
"""


#: the micro-kernels' fused multiply-add by vector width: an explicit instruction (the kernels build with
#: -ffp-contract=off, so nothing else in them is fused); without FMA hardware a multiply and an add
_VFMA = {16: ("defined(__AVX512F__)", "_mm512_fmadd_ps", "__m512"),
         8: ("defined(__FMA__)", "_mm256_fmadd_ps", "__m256")}


def vector_types(vw: int) -> str:
    fma = "#define kk_vfma(a, b, c) ((a) * (b) + (c))\n"
    if vw in _VFMA:
        guard, fn, t = _VFMA[vw]
        fma = (f"#if {guard}\n#define kk_vfma(a, b, c) ((kk_vf){fn}(({t})(a), ({t})(b), ({t})(c)))\n#else\n"
               f"{fma}#endif\n")
    return (f"typedef float kk_vf __attribute__((vector_size({4 * vw})));\n"
            "typedef kk_vf kk_vfu __attribute__((aligned(4)));\n"
            f"typedef int kk_vmi __attribute__((vector_size({4 * vw})));\n" + fma + _HELPERS)


def winograd_name(kind: str, m: int, vw: int) -> str:
    return f"kk_wino_{kind}{m}_v{vw}"


def _combine(coefs, names) -> str:
    """C for the linear combination ``sum coefs[i] * names[i]`` of vectors: additions for +-1, a product by
    the float literal for any other nonzero coefficient."""
    out = ""
    for c, x in zip(coefs, names):
        if c == 0:
            continue
        mag = abs(c)
        term = x if mag == 1 else f"{float(mag)!r}f * {x}"
        out += (f" - {term}" if c < 0 else f" + {term}") if out else (f"-{term}" if c < 0 else term)
    assert out, "a transform row of zeros"
    return out


def _transform(mat, get, out_name: str, inner: int) -> list:
    """``X = mat @ D @ mat^T`` of the ``inner`` x ``inner`` matrix ``get(a, b)`` (C vector expressions), rows
    first (``t`` temporaries), as declarations of ``{out_name}{i}_{j}``."""
    rows = len(mat)
    lines = []
    for i in range(rows):
        for b in range(inner):
            lines.append(f"    const kk_vf t{i}_{b} = {_combine(mat[i], [get(a, b) for a in range(inner)])};")
    for i in range(rows):
        for j in range(rows):
            terms = _combine(mat[j], [f"t{i}_{b}" for b in range(inner)])
            lines.append(f"    const kk_vf {out_name}{i}_{j} = {terms};")
    return lines


def winograd_helpers(m: int, vw: int, bt, at) -> str:
    """The transforms of Winograd's F(m x m, 3x3) (``kumiko.kernel.winograd``), VW channels at a time, from its
    matrices B^T (n x n, n = m + 2) and A^T (m x n) (``kumiko.plan.winograd.TRANSFORMS``).

    ``in``: the n x n patch of pixels at ``s`` (rows ``sh``, columns ``sw`` floats apart, each pixel's ``c``
    channels consecutive) to ``V = B^T d B``, element xi = n*i + j of it at ``v + xi*vs`` (``c`` floats each).
    ``out``: the n*n products of a tile at ``x + xi*xs`` (``cols`` columns each) to ``Y = A^T M A``, its
    pixel (i, j) at ``y + i*yr + j*yc`` (``cols`` columns)."""
    n = m + 2

    def fn(kind: str, args: str, count: str, load, mat, store, rows: int) -> list:
        """One transform: the n x n vectors ``load(a, b)`` (addresses) to ``mat @ D @ mat^T``, its ``rows`` x
        ``rows`` elements stored at ``store(i, j)``."""
        body = [f"__attribute__((unused)) static void {winograd_name(kind, m, vw)}({args}) {{",
                f"  for (long long k = 0; k < {count}; k += {vw}) {{"]
        body += [f"    const kk_vf d{a}_{b} = *(const kk_vfu*)({load(a, b)} + k);" for a in range(n) for b in range(n)]
        body += _transform(mat, lambda a, b: f"d{a}_{b}", "r", n)
        body += [f"    *(kk_vfu*)({store(i, j)} + k) = r{i}_{j};" for i in range(rows) for j in range(rows)]
        return body + ["  }", "}"]
    lines = fn("in", "const float* KUMIKO_RESTRICT s, long long sh, long long sw, long long c, "
               "float* KUMIKO_RESTRICT v, long long vs", "c", lambda a, b: f"s + {a}*sh + {b}*sw", bt,
               lambda i, j: f"v + {n * i + j}*vs", n)
    lines += fn("out", "const float* KUMIKO_RESTRICT x, long long xs, long long cols, float* KUMIKO_RESTRICT y, "
                "long long yr, long long yc", "cols", lambda a, b: f"x + {n * a + b}*xs", at,
                lambda i, j: f"y + {i}*yr + {j}*yc", m)
    return "\n".join(lines)
