/* kumiko_cpu.h: the one header generated CPU kernels include.
 *
 * Why a header and not inline code in every kernel: generated C stays short and readable (it says
 * `kv_fma(a, b, acc)`, not an ISA-specific intrinsic), and each helper here is tested once
 * (tests/runtime/test_cpu_header.py) instead of trusted in every generated kernel.
 *
 * Contents
 *   macros       KUMIKO_RESTRICT, KUMIKO_INLINE, KUMIKO_ALIGN(n), KUMIKO_BUF_ALIGN, KUMIKO_ASSUME_ALIGNED(p, n),
 *                KUMIKO_LIKELY/UNLIKELY, KUMIKO_KERNEL (the exported `int NAME(void**, const long long*)` ABI),
 *                KUMIKO_THREAD_LOCAL
 *   heap scratch kumiko_tmp_alloc, kumiko_tmp_free (a few freed blocks kept per thread for reuse)
 *   integers     kumiko_floordiv, kumiko_ceildiv, kumiko_mod (floor semantics for negative numerators),
 *                kumiko_min_ll, kumiko_max_ll
 *   16-bit float kumiko_f16_to_f32, kumiko_f32_to_f16, kumiko_bf16_to_f32, kumiko_f32_to_bf16
 *                (round to nearest even; inf and NaN kept, NaN quieted)
 *   scalar math  kumiko_exp2, kumiko_erff (the same steps as kv_exp2, kv_erf, so vector body and scalar tail
 *                agree bit for bit)
 *   vectors      kv_t (KUMIKO_VW floats), kvi_t (KUMIKO_VW int32): GCC vector extensions, so + - * / and
 *                comparisons (giving kvi_t masks of 0 / -1) are plain operators
 *                kv_load, kv_store, kv_loadu_partial, kv_store_partial, kv_tail_mask, kv_select,
 *                kv_zero, kv_broadcast, kv_fma, kv_max, kv_min, kv_sqrt, kv_hsum, kv_hmax, kv_hmin,
 *                kv_exp2, kv_erf, kv_map / kv_map2 (lane-wise scalar fallback, e.g. for log2f/powf),
 *                kv_load_f16, kv_store_f16, kv_load_bf16, kv_store_bf16 (full vectors of 16-bit storage),
 *                kv_round_f16, kv_round_bf16 (fp32 lanes rounded to fp16/bf16 and back, as a cast does)
 *   for generated loop nests (kumiko/kernel/lower_cpu.py)
 *                kv_maxnan, kv_minnan (numpy's NaN-propagating max/min, lane-wise kk_maxf/kk_minf),
 *                kv_any, kv_hmax_nan, kv_hmin_nan (horizontal max/min of a vector accumulator whose NaN
 *                lanes were tracked in a mask), kv_mask_broadcast, kv_load_bool, kv_store_bool (bool
 *                storage <-> kvi_t masks), kv_affine_ge, kv_affine_eq (lane masks of an affine guard)
 *   masked and strided lanes (split window loops)
 *                kv_iota, kv_load_mask, kv_store_mask, kv_load_stride (stride 2 deinterleaves, others gather),
 *                kv_load_stride_mask, kv_load_f16_sm / kv_load_bf16_sm / kv_load_bool_sm (strided, masked),
 *                kv_store_f16_mask, kv_store_bf16_mask, kv_store_bool_mask
 *
 * The vector width follows what the compiler targets (-march=native on the build machine):
 * AVX-512F -> 16 floats, AVX/AVX2 -> 8, otherwise 4 (SSE, NEON, or GCC's generic lowering).
 * Outputs and arena buffers passed to kernels are 64-byte aligned (KUMIKO_BUF_ALIGN); inputs only to
 * their element size (the runtime passes numpy arrays in place). Loads and stores here are
 * unaligned-safe.
 */
#ifndef KUMIKO_CPU_H
#define KUMIKO_CPU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------- */
/* macros                                                                                          */

#ifdef __cplusplus
#define KUMIKO_RESTRICT __restrict__
#define KUMIKO_EXTERN_C extern "C"
#else
#define KUMIKO_RESTRICT restrict
#define KUMIKO_EXTERN_C
#endif
#ifdef __cplusplus
#define KUMIKO_THREAD_LOCAL thread_local
#else
#define KUMIKO_THREAD_LOCAL _Thread_local
#endif
#define KUMIKO_INLINE static inline __attribute__((always_inline))
#define KUMIKO_ALIGN(n) __attribute__((aligned(n)))
#define KUMIKO_BUF_ALIGN 64 /* every output and arena buffer the runtime passes is aligned to this */
#define KUMIKO_ASSUME_ALIGNED(p, n) __builtin_assume_aligned((p), (n))
#define KUMIKO_LIKELY(x) __builtin_expect(!!(x), 1)
#define KUMIKO_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* All of a run's kernels in one call from the runtime (kumiko.runtime.program): n ABI functions in order,
 * each with its own argument array and the shared symbols; the first non-zero status stops the run and its
 * step's index goes to *failed. Weak: every unit of a program defines it, the link keeps one. */
typedef int (*kumiko_abi_fn)(void** bufs, const long long* syms);
KUMIKO_EXTERN_C __attribute__((weak, visibility("default"), unused)) int kumiko_run_steps(
    long long n, const kumiko_abi_fn* fns, void** const* args, const long long* syms, long long* failed) {
    for (long long i = 0; i < n; ++i) {
        const int rc = fns[i](args[i], syms);
        if (rc) { *failed = i; return rc; }
    }
    return 0;
}
/* A kernel entry point: `KUMIKO_KERNEL my_region(void** bufs, const long long* syms) { ... return 0; }`.
 * Visible even under -fvisibility=hidden, unmangled if the file is compiled as C++. */
#define KUMIKO_KERNEL KUMIKO_EXTERN_C __attribute__((visibility("default"))) int

/* kumiko_phase_row: a source row of n floats, with lo zeros in front of it and zeros past its end, dealt into
 * f phases of sc floats each: dst[ph * ps + q] = src[q * f + ph - lo], 0 where that index is outside [0, n).
 * A strided conv's stage (kumiko/kernel/stage.py) fills its rows with it; the two-phase rows (stride 2) are
 * deinterleaved 16 floats at a time on AVX-512 (two loads, one permute), 8 at a time on AVX2 (two loads, a
 * shuffle and a cross-lane permute). */
KUMIKO_INLINE void kumiko_phase_row(float* KUMIKO_RESTRICT dst, long long ps, const float* KUMIKO_RESTRICT src,
                                    long long n, long long lo, long long sc, int f) {
    for (int ph = 0; ph < f; ph++) {
        float* KUMIKO_RESTRICT d = dst + ph * ps;
        long long q0 = lo > ph ? (lo - ph + f - 1) / f : 0;      /* the first q whose index is >= 0 */
        long long q1 = (n + lo - ph + f - 1) / f;                 /* past the last q whose index is < n */
        if (q1 > sc) q1 = sc;
        if (q0 > sc) q0 = sc;
        if (q1 < q0) q1 = q0;
        for (long long q = 0; q < q0; q++) d[q] = 0.0f;
        for (long long q = q1; q < sc; q++) d[q] = 0.0f;
        long long q = q0;
#if defined(__AVX512F__)
        if (f == 2) {
            const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            for (; q + 16 <= q1 && 2 * q + ph - lo + 32 <= n; q += 16) {
                const float* s = src + 2 * q + ph - lo;
                _mm512_storeu_ps(d + q, _mm512_permutex2var_ps(_mm512_loadu_ps(s), even, _mm512_loadu_ps(s + 16)));
            }
        }
#elif defined(__AVX2__)
        if (f == 2) {
            for (; q + 8 <= q1 && 2 * q + ph - lo + 16 <= n; q += 8) {
                const float* s = src + 2 * q + ph - lo;
                /* a0 a2 b0 b2 | a4 a6 b4 b6, then its 64-bit pairs in the order 0 2 1 3 */
                const __m256 e = _mm256_shuffle_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(s + 8), _MM_SHUFFLE(2, 0, 2, 0));
                _mm256_storeu_ps(d + q, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e),
                                                                              _MM_SHUFFLE(3, 1, 2, 0))));
            }
        }
#endif
        for (; q < q1; q++) d[q] = src[q * f + ph - lo];
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* heap scratch of generated loop nests                                                           */

/* kumiko_tmp_alloc / kumiko_tmp_free: the heap arrays of generated loop nests (a Scratch too large for
 * the stack). A freed block of up to KUMIKO_TMP_MAX bytes stays with its thread (KUMIKO_TMP_KEEP of them)
 * for the next allocation it fits, so a row program that allocates its row arrays per block of a
 * parallel loop calls malloc once per thread, not once per block: glibc trims the heap top on free, and
 * the next malloc faulted those pages in again (1-3 us a pair; 4% of causal attention). 64-byte aligned. */
#define KUMIKO_TMP_KEEP 4
#define KUMIKO_TMP_MAX ((size_t)1 << 20)
#define KUMIKO_TMP_HEAD 64   /* the block's capacity, kept in front of it */
static KUMIKO_THREAD_LOCAL char* kumiko_tmp_keep[KUMIKO_TMP_KEEP];

__attribute__((unused)) static void* kumiko_tmp_alloc(size_t bytes) {
    for (int i = 0; i < KUMIKO_TMP_KEEP; i++) {
        char* b = kumiko_tmp_keep[i];
        if (b && *(size_t*)b >= bytes) {
            kumiko_tmp_keep[i] = 0;
            return b + KUMIKO_TMP_HEAD;
        }
    }
    const size_t cap = (bytes + 63) / 64 * 64;
    char* b = (char*)aligned_alloc(64, KUMIKO_TMP_HEAD + cap);
    if (!b) return 0;
    *(size_t*)b = cap;
    return b + KUMIKO_TMP_HEAD;
}

__attribute__((unused)) static void kumiko_tmp_free(void* p) {
    if (!p) return;
    char* b = (char*)p - KUMIKO_TMP_HEAD;
    if (*(size_t*)b <= KUMIKO_TMP_MAX)
        for (int i = 0; i < KUMIKO_TMP_KEEP; i++)
            if (!kumiko_tmp_keep[i]) {
                kumiko_tmp_keep[i] = b;
                return;
            }
    free(b);
}

/* ---------------------------------------------------------------------------------------------- */
/* integer helpers: index expressions use floor division (seed 001 §4.3), C's `/` truncates        */

KUMIKO_INLINE long long kumiko_floordiv(long long a, long long q) { /* q > 0 */
    long long d = a / q;
    return d - ((a % q) < 0);
}
KUMIKO_INLINE long long kumiko_mod(long long a, long long q) { /* q > 0; result in [0, q) */
    long long r = a % q;
    return r < 0 ? r + q : r;
}
KUMIKO_INLINE long long kumiko_ceildiv(long long a, long long q) { return -kumiko_floordiv(-a, q); }
KUMIKO_INLINE long long kumiko_min_ll(long long a, long long b) { return a < b ? a : b; }
KUMIKO_INLINE long long kumiko_max_ll(long long a, long long b) { return a > b ? a : b; }

/* ---------------------------------------------------------------------------------------------- */
/* fp16 / bf16 <-> fp32 (storage is uint16_t). Bit-exact with numpy and ml_dtypes, tested over all  */
/* 65536 halves and around every rounding boundary.                                                */

KUMIKO_INLINE uint32_t kumiko_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
KUMIKO_INLINE float kumiko_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* numpy's maximum(x, +0) and minimum(x, +0): a NaN x comes out, either zero gives +0 (numpy's second operand on
 * a tie), as a compare and an and-not of the bits. The selects `x <= 0 ? 0 : x` mean the same, but in a loop
 * that also clips from above (ReLU6) gcc merged them into nine vector instructions where these make four. */
KUMIKO_INLINE float kumiko_max0f(float x) { return kumiko_bits_f32(kumiko_f32_bits(x) & ~(uint32_t)-(int32_t)(x <= 0.0f)); }
KUMIKO_INLINE float kumiko_min0f(float x) { return kumiko_bits_f32(kumiko_f32_bits(x) & ~(uint32_t)-(int32_t)(x >= 0.0f)); }

KUMIKO_INLINE float kumiko_f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return kumiko_bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0)); /* inf, NaN */
    if (e == 0) {
        if (m == 0) return kumiko_bits_f32(sign);
        e = 113; /* subnormal: normalise; 2^-24 * m */
        while (!(m & 0x400u)) { m <<= 1; e--; }
        return kumiko_bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
    }
    return kumiko_bits_f32(sign | ((e + 112) << 23) | (m << 13));
#endif
}

KUMIKO_INLINE uint16_t kumiko_f32_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, 0); /* 0 = round to nearest even */
#else
    uint32_t x = kumiko_f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf stays inf; NaN keeps its top payload bits and is quieted */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        if (a < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        r += (rem > half) || (rem == half && (r & 1u));
        return (uint16_t)(sign | r);
    }
    uint32_t r = (a - 0x38000000u) >> 13, rem = a & 0x1fffu; /* rebias 127 -> 15 */
    r += (rem > 0x1000u) || (rem == 0x1000u && (r & 1u)); /* a carry into the exponent is right */
    return (uint16_t)(sign | r);
#endif
}

KUMIKO_INLINE float kumiko_bf16_to_f32(uint16_t b) { return kumiko_bits_f32((uint32_t)b << 16); }

KUMIKO_INLINE uint16_t kumiko_f32_to_bf16(float f) {
    uint32_t x = kumiko_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN: quiet, keep sign */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);                /* RNE; overflow -> inf */
}

/* ---------------------------------------------------------------------------------------------- */
/* exp2: x = n + f with n = rint(x) (exact in fp32: the Cody-Waite split of exp2 needs no second   */
/* constant), 2^f on [-1/2, 1/2] by a degree-6 minimax polynomial (Cephes exp2f), then 2^n applied  */
/* in two halves so results in the subnormal range and at 2^128 (inf) come out right. Max error     */
/* about 2 ulp (tested). NaN in -> NaN out; +inf -> inf; -inf -> 0.                                 */

/* fmaf only where it is one instruction, so the scalar and vector forms round alike on every ISA */
#if defined(__FP_FAST_FMAF)
#define KUMIKO_FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define KUMIKO_FMAF(a, b, c) ((a) * (b) + (c))
#endif
#define KUMIKO_EXP2_P6 1.535336188319500e-4f
#define KUMIKO_EXP2_P5 1.339887440266574e-3f
#define KUMIKO_EXP2_P4 9.618437357674640e-3f
#define KUMIKO_EXP2_P3 5.550332471162809e-2f
#define KUMIKO_EXP2_P2 2.402264791363012e-1f
#define KUMIKO_EXP2_P1 6.931472028550421e-1f

KUMIKO_INLINE float kumiko_exp2(float x) {
    /* Branch-free, kv_exp2's AVX2 steps on one lane, so a loop of it vectorizes (the kernels build with
     * -fno-trapping-math, which lets gcc compute both arms of a select) without an underflow: x clamped to
     * [-150, 129] (a NaN stays NaN and makes p and the product NaN), n's integer read off the bits of
     * x + 1.5 * 2^23, and a dead x (<= -150: 2^x rounds to 0) scaled by +0 instead of 2^k1, an exact 0
     * rather than an underflow (an assist on Intel cores). */
    const uint32_t dead = x <= -150.0f ? 0xffffffffu : 0u;
    x = x > 129.0f ? 129.0f : x;
    x = x < -150.0f ? -150.0f : x;
    const float t = x + 12582912.0f;
    const float f = x - (t - 12582912.0f);  /* n = rint(x) for |x| < 2^22 (the 0x1.8p23 trick) */
    float p = KUMIKO_FMAF(KUMIKO_EXP2_P6, f, KUMIKO_EXP2_P5);
    p = KUMIKO_FMAF(p, f, KUMIKO_EXP2_P4);
    p = KUMIKO_FMAF(p, f, KUMIKO_EXP2_P3);
    p = KUMIKO_FMAF(p, f, KUMIKO_EXP2_P2);
    p = KUMIKO_FMAF(p, f, KUMIKO_EXP2_P1);
    p = KUMIKO_FMAF(p, f, 1.0f);
    const uint32_t k = kumiko_f32_bits(t) - 0x4B400000u, k1 = (uint32_t)((int32_t)k >> 1), k2 = k - k1;
    return p * kumiko_bits_f32(((k1 + 127u) << 23) & ~dead) * kumiko_bits_f32((k2 + 127u) << 23);
}

/* erf in fp32 (max error 2.5 ulp, 2.7 in the x86-64 baseline build, against the float64 erf over [-6, 6] and down to 1e-30; kv_erf is the same
 * steps lane-wise, so vector body and scalar tail agree bit for bit). |x| <= KUMIKO_ERF_SPLIT:
 * x + x * P(x^2); above: 1 - 2^Q(|x| - 2.5) with Q ~ log2(erfc), clamped to <= 0, and 1 from 4 on (erf(4)
 * rounds to 1). P and Q are least-squares fits (relative error of erf) on Chebyshev nodes of each interval
 * (tests/runtime/test_cpu_header.py checks the bound). */
#define KUMIKO_ERF_SPLIT 0.921875f
#define KUMIKO_ERF_P5 (-6.024051108397543e-4f)
#define KUMIKO_ERF_P4 5.0007677637040615e-3f
#define KUMIKO_ERF_P3 (-2.677285112440586e-2f)
#define KUMIKO_ERF_P2 1.128203496336937e-1f
#define KUMIKO_ERF_P1 (-3.761252462863922e-1f)
#define KUMIKO_ERF_P0 1.2837916612625122e-1f
#define KUMIKO_ERF_Q9 1.4378123296410195e-6f
#define KUMIKO_ERF_Q8 9.217295882990584e-6f
#define KUMIKO_ERF_Q7 (-8.348065421159845e-6f)
#define KUMIKO_ERF_Q6 1.1526807065820321e-4f
#define KUMIKO_ERF_Q5 (-6.126880180090666e-4f)
#define KUMIKO_ERF_Q4 3.1173445750027895e-3f
#define KUMIKO_ERF_Q3 (-1.5667034313082695e-2f)
#define KUMIKO_ERF_Q2 (-1.3617504835128784f)
#define KUMIKO_ERF_Q1 (-7.722285747528076f)
#define KUMIKO_ERF_Q0 (-11.262853622436523f)

/* 2^q for q <= 0 as erf needs it (q >= -25.3 wherever its value is used): q clamped to >= -126, so the
 * result is normal (n = -126 comes with f >= 0) and one multiply by 2^n rounds it; kumiko_exp2's polynomial,
 * evaluated as (P0 + P1 f) + f^2 ((P2 + P3 f) + f^2 (P4 + P5 f + P6 f^2)) to shorten its chain. A NaN stays NaN. */
KUMIKO_INLINE float kumiko_exp2_le0(float q) {
    q = q < -126.0f ? -126.0f : q;
    const float t = q + 12582912.0f;
    const float f = q - (t - 12582912.0f), f2 = f * f;
    const float p01 = KUMIKO_FMAF(KUMIKO_EXP2_P1, f, 1.0f);
    const float p23 = KUMIKO_FMAF(KUMIKO_EXP2_P3, f, KUMIKO_EXP2_P2);
    const float p46 = KUMIKO_FMAF(KUMIKO_EXP2_P6, f2, KUMIKO_FMAF(KUMIKO_EXP2_P5, f, KUMIKO_EXP2_P4));
    const float p = KUMIKO_FMAF(KUMIKO_FMAF(p46, f2, p23), f2, p01);
    return p * kumiko_bits_f32((kumiko_f32_bits(t) - 0x4B400000u + 127u) << 23);
}

KUMIKO_INLINE float kumiko_erff(float x) {
    /* Both sides computed and one selected, as kv_erf does: a loop of it has no branch to if-convert. The
     * polynomials in Estrin's scheme (pairs of terms, then pairs of pairs by powers of the argument): a chain
     * of 4 multiply-adds instead of 9 for Q, so the vector loop of a GELU epilogue overlaps its iterations
     * (0.95 -> 0.57 ms for 128 x 3072 points on one Zen 3 core). */
    const float a = fabsf(x), s = x * x, s2 = s * s;
    const float p01 = KUMIKO_FMAF(KUMIKO_ERF_P1, s, KUMIKO_ERF_P0);
    const float p23 = KUMIKO_FMAF(KUMIKO_ERF_P3, s, KUMIKO_ERF_P2);
    const float p45 = KUMIKO_FMAF(KUMIKO_ERF_P5, s, KUMIKO_ERF_P4);
    const float p = KUMIKO_FMAF(KUMIKO_FMAF(KUMIKO_FMAF(p45, s2, p23), s2, p01), x, x);
    const float u = a - 2.5f, u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
    const float q01 = KUMIKO_FMAF(KUMIKO_ERF_Q1, u, KUMIKO_ERF_Q0);
    const float q23 = KUMIKO_FMAF(KUMIKO_ERF_Q3, u, KUMIKO_ERF_Q2);
    const float q45 = KUMIKO_FMAF(KUMIKO_ERF_Q5, u, KUMIKO_ERF_Q4);
    const float q67 = KUMIKO_FMAF(KUMIKO_ERF_Q7, u, KUMIKO_ERF_Q6);
    const float q89 = KUMIKO_FMAF(KUMIKO_ERF_Q9, u, KUMIKO_ERF_Q8);
    float q = KUMIKO_FMAF(q89, u8, KUMIKO_FMAF(KUMIKO_FMAF(q67, u2, q45), u4, KUMIKO_FMAF(q23, u2, q01)));
    q = q > 0.0f ? 0.0f : q;                          /* min(q, 0), a NaN kept */
    const float e = 1.0f - kumiko_exp2_le0(q);
    const float r = a >= 4.0f ? 1.0f : e;
    return a <= KUMIKO_ERF_SPLIT ? p : copysignf(r, x);
}

/* ---------------------------------------------------------------------------------------------- */
/* vectors                                                                                          */

#if defined(__AVX512F__)
#define KUMIKO_VW 16
#elif defined(__AVX__)
#define KUMIKO_VW 8
#else
#define KUMIKO_VW 4
#endif

typedef float kv_t __attribute__((vector_size(KUMIKO_VW * 4)));
typedef int32_t kvi_t __attribute__((vector_size(KUMIKO_VW * 4)));
typedef uint32_t kvu_t __attribute__((vector_size(KUMIKO_VW * 4))); /* bit manipulation without signed overflow */
typedef uint16_t kvh_t __attribute__((vector_size(KUMIKO_VW * 2))); /* a vector of fp16/bf16 storage */

KUMIKO_INLINE kv_t kv_zero(void) { kv_t z = {0}; return z; }

KUMIKO_INLINE kv_t kv_broadcast(float x) { /* one broadcast instruction (hoisted out of loops); keeps -0.0 */
#if defined(__AVX512F__)
    return (kv_t)_mm512_set1_ps(x);
#elif defined(__AVX__) && KUMIKO_VW == 8
    return (kv_t)_mm256_set1_ps(x);
#elif defined(__SSE__) && KUMIKO_VW == 4
    return (kv_t)_mm_set1_ps(x);
#else
    kv_t v;
    for (int i = 0; i < KUMIKO_VW; i++) v[i] = x;
    return v;
#endif
}

/* Full-vector loads and stores; any alignment. */
KUMIKO_INLINE kv_t kv_load(const float* p) { kv_t v; memcpy(&v, p, sizeof v); return v; }
KUMIKO_INLINE void kv_store(float* p, kv_t v) { memcpy(p, &v, sizeof v); }

/* Lane mask for a tail of n lanes (0 <= n <= KUMIKO_VW): lanes < n are -1, the rest 0. */
KUMIKO_INLINE kvi_t kv_tail_mask(int n) {
    kvi_t iota;
    for (int i = 0; i < KUMIKO_VW; i++) iota[i] = i;
    return iota < n;
}

/* Lane-wise mask ? a : b, with masks as comparisons produce (0 or -1 per lane). */
KUMIKO_INLINE kv_t kv_select(kvi_t mask, kv_t a, kv_t b) { return (kv_t)((mask & (kvi_t)a) | (~mask & (kvi_t)b)); }

/* Tail load and store of n < KUMIKO_VW lanes: never touch memory past p[n-1]; unloaded lanes are 0.
 * For another fill (e.g. -inf before a max), kv_select(kv_tail_mask(n), v, kv_broadcast(fill)). */
KUMIKO_INLINE kv_t kv_loadu_partial(const float* p, int n) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif KUMIKO_VW == 8
    return (kv_t)_mm256_maskload_ps(p, (__m256i)kv_tail_mask(n));
#else
    kv_t v = kv_zero();
    memcpy(&v, p, (size_t)n * 4);
    return v;
#endif
}

KUMIKO_INLINE void kv_store_partial(float* p, kv_t v, int n) {
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), (__m512)v);
#elif KUMIKO_VW == 8
    _mm256_maskstore_ps(p, (__m256i)kv_tail_mask(n), (__m256)v);
#else
    memcpy(p, &v, (size_t)n * 4);
#endif
}

/* a * b + c, fused (one rounding) on every ISA that has FMA. */
KUMIKO_INLINE kv_t kv_fma(kv_t a, kv_t b, kv_t c) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && KUMIKO_VW == 8
    return (kv_t)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c; /* no FMA on this ISA: a multiply and an add (the kernels build with -ffp-contract=off) */
#endif
}

/* kv_max(a, b) = a > b ? a : b, kv_min(a, b) = a < b ? a : b, lane-wise: x86 maxps/minps semantics on
 * every ISA, so when either lane is NaN the result is b. Put the value whose NaN must propagate second:
 * ReLU is kv_max(kv_zero(), x). */
KUMIKO_INLINE kv_t kv_max(kv_t a, kv_t b) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_max_ps((__m512)a, (__m512)b);
#elif KUMIKO_VW == 8
    return (kv_t)_mm256_max_ps((__m256)a, (__m256)b);
#else
    return kv_select(a > b, a, b);
#endif
}

KUMIKO_INLINE kv_t kv_min(kv_t a, kv_t b) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_min_ps((__m512)a, (__m512)b);
#elif KUMIKO_VW == 8
    return (kv_t)_mm256_min_ps((__m256)a, (__m256)b);
#else
    return kv_select(a < b, a, b);
#endif
}

KUMIKO_INLINE kv_t kv_sqrt(kv_t a) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_sqrt_ps((__m512)a);
#elif KUMIKO_VW == 8
    return (kv_t)_mm256_sqrt_ps((__m256)a);
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = sqrtf(a[i]);
    return r;
#endif
}

/* Lane-wise scalar function (a fallback for what has no vector form here: log2f, powf, ...). */
#define kv_map(fn, v) __extension__({ kv_t _kv_in = (v), _kv_out; \
    for (int _kv_i = 0; _kv_i < KUMIKO_VW; _kv_i++) { _kv_out[_kv_i] = fn(_kv_in[_kv_i]); } _kv_out; })

/* Horizontal reductions by halving (a fixed tree: the summation order does not depend on the data). */
#define KUMIKO_HREDUCE(NAME, OP)                                                                       \
    KUMIKO_INLINE float NAME(kv_t v) {                                                                 \
        float t[KUMIKO_VW];                                                                            \
        memcpy(t, &v, sizeof t);                                                                       \
        for (int w = KUMIKO_VW / 2; w > 0; w /= 2)                                                     \
            for (int i = 0; i < w; i++) t[i] = OP(t[i], t[i + w]);                                     \
        return t[0];                                                                                   \
    }
#define KUMIKO_OP_ADD(a, b) ((a) + (b))
#define KUMIKO_OP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KUMIKO_OP_MIN(a, b) ((a) < (b) ? (a) : (b))
KUMIKO_HREDUCE(kv_hsum, KUMIKO_OP_ADD)
KUMIKO_HREDUCE(kv_hmax, KUMIKO_OP_MAX)
KUMIKO_HREDUCE(kv_hmin, KUMIKO_OP_MIN)

/* Vector exp2: the same steps and constants as kumiko_exp2 above, lane-wise. With AVX-512, n is rounded
 * by vrndscaleps and p * 2^n is one vscalefps: both round p * 2^n once, as kumiko_exp2's two exact-then-one
 * rounding multiplies do (p * 2^k1 stays normal for k >= -150), so the results agree bit for bit.
 * Lanes with x <= -150 (a masked score: -inf) are 0 without being computed: an underflowing multiply
 * takes a microcode assist on Intel cores (~100+ cycles a vector), which made the causal softmax's masked
 * diagonal tiles cost as much as the rest of its row program. */
KUMIKO_INLINE kv_t kv_exp2_poly(kv_t f) {   /* 2^f for |f| <= 0.5 */
    kv_t p = kv_fma(kv_broadcast(KUMIKO_EXP2_P6), f, kv_broadcast(KUMIKO_EXP2_P5));
    p = kv_fma(p, f, kv_broadcast(KUMIKO_EXP2_P4));
    p = kv_fma(p, f, kv_broadcast(KUMIKO_EXP2_P3));
    p = kv_fma(p, f, kv_broadcast(KUMIKO_EXP2_P2));
    p = kv_fma(p, f, kv_broadcast(KUMIKO_EXP2_P1));
    return kv_fma(p, f, kv_broadcast(1.0f));
}

KUMIKO_INLINE kv_t kv_exp2(kv_t x) {
#if defined(__AVX512F__)
    const __mmask16 live = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-150.0f), _CMP_NLE_UQ);   /* NaN: live */
    x = (kv_t)_mm512_maskz_mov_ps(live, (__m512)kv_min(kv_broadcast(129.0f), x));   /* a NaN lane stays NaN */
    const __m512 n = _mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return (kv_t)_mm512_maskz_scalef_ps(live, (__m512)kv_exp2_poly(x - (kv_t)n), n);
#else
    /* Clamped to [-150, 129] by maxps/minps with x second, so a NaN lane stays NaN, makes p NaN and the
     * product NaN whatever its exponent bits: no NaN mask to keep. n's integer is read off the bits of
     * x + 1.5 * 2^23 (no conversion to lose on a NaN), halved by a shift (k1 >= -75: p * 2^k1 is exact,
     * so the product rounds once, as kumiko_exp2's does). A dead lane's first factor is +0 instead of
     * 2^k1: its product is an exact 0, not an underflow (an assist on Intel cores). */
    kvi_t dead = x <= kv_broadcast(-150.0f);
    x = kv_min(kv_broadcast(129.0f), kv_max(kv_broadcast(-150.0f), x));
    kv_t t = x + kv_broadcast(12582912.0f);
    kv_t p = kv_exp2_poly(x - (t - kv_broadcast(12582912.0f)));
    kvu_t k = (kvu_t)t - 0x4B400000u, k1 = (kvu_t)((kvi_t)k >> 1), k2 = k - k1;
    return p * (kv_t)(((k1 + 127u) << 23) & ~(kvu_t)dead) * (kv_t)((k2 + 127u) << 23);
#endif
}

/* Vector erf: kumiko_erff's steps lane-wise (both branches computed, the lanes selected), with
 * kumiko_exp2_le0's steps for 2^q. */
KUMIKO_INLINE kv_t kv_exp2_le0(kv_t q) {
    q = kv_max(kv_broadcast(-126.0f), q);                 /* q second: a NaN lane stays NaN */
    const kv_t t = q + kv_broadcast(12582912.0f);
    const kv_t f = q - (t - kv_broadcast(12582912.0f)), f2 = f * f;
    const kv_t p01 = kv_fma(kv_broadcast(KUMIKO_EXP2_P1), f, kv_broadcast(1.0f));
    const kv_t p23 = kv_fma(kv_broadcast(KUMIKO_EXP2_P3), f, kv_broadcast(KUMIKO_EXP2_P2));
    const kv_t p46 = kv_fma(kv_broadcast(KUMIKO_EXP2_P6), f2,
                            kv_fma(kv_broadcast(KUMIKO_EXP2_P5), f, kv_broadcast(KUMIKO_EXP2_P4)));
    const kv_t p = kv_fma(kv_fma(p46, f2, p23), f2, p01);
    return p * (kv_t)(((kvu_t)t - 0x4B400000u + 127u) << 23);
}

KUMIKO_INLINE kv_t kv_erf(kv_t x) {
    const kv_t a = (kv_t)((kvu_t)x & 0x7fffffffu), s = x * x, s2 = s * s;
    const kv_t p01 = kv_fma(kv_broadcast(KUMIKO_ERF_P1), s, kv_broadcast(KUMIKO_ERF_P0));
    const kv_t p23 = kv_fma(kv_broadcast(KUMIKO_ERF_P3), s, kv_broadcast(KUMIKO_ERF_P2));
    const kv_t p45 = kv_fma(kv_broadcast(KUMIKO_ERF_P5), s, kv_broadcast(KUMIKO_ERF_P4));
    const kv_t p = kv_fma(kv_fma(kv_fma(p45, s2, p23), s2, p01), x, x);
    const kv_t u = a - kv_broadcast(2.5f), u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
    const kv_t q01 = kv_fma(kv_broadcast(KUMIKO_ERF_Q1), u, kv_broadcast(KUMIKO_ERF_Q0));
    const kv_t q23 = kv_fma(kv_broadcast(KUMIKO_ERF_Q3), u, kv_broadcast(KUMIKO_ERF_Q2));
    const kv_t q45 = kv_fma(kv_broadcast(KUMIKO_ERF_Q5), u, kv_broadcast(KUMIKO_ERF_Q4));
    const kv_t q67 = kv_fma(kv_broadcast(KUMIKO_ERF_Q7), u, kv_broadcast(KUMIKO_ERF_Q6));
    const kv_t q89 = kv_fma(kv_broadcast(KUMIKO_ERF_Q9), u, kv_broadcast(KUMIKO_ERF_Q8));
    kv_t q = kv_fma(q89, u8, kv_fma(kv_fma(q67, u2, q45), u4, kv_fma(q23, u2, q01)));
    q = kv_min(kv_zero(), q);                             /* q second: a NaN lane stays NaN */
    kv_t r = kv_select(a >= kv_broadcast(4.0f), kv_broadcast(1.0f), kv_broadcast(1.0f) - kv_exp2_le0(q));
    r = (kv_t)(((kvu_t)r & 0x7fffffffu) | ((kvu_t)x & 0x80000000u));
    return kv_select(a <= kv_broadcast(KUMIKO_ERF_SPLIT), p, r);
}

/* Full vectors of fp16 / bf16 storage (KUMIKO_VW elements) to and from fp32 lanes. */
KUMIKO_INLINE kv_t kv_load_f16(const uint16_t* p) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__) && KUMIKO_VW == 8
    return (kv_t)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = kumiko_f16_to_f32(p[i]);
    return r;
#endif
}

KUMIKO_INLINE void kv_store_f16(uint16_t* p, kv_t v) {
#if defined(__AVX512F__)
    _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph((__m512)v, 0));
#elif defined(__F16C__) && KUMIKO_VW == 8
    _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph((__m256)v, 0));
#else
    for (int i = 0; i < KUMIKO_VW; i++) p[i] = kumiko_f32_to_f16(v[i]);
#endif
}

KUMIKO_INLINE kv_t kv_load_bf16(const uint16_t* p) {
    kvh_t h;
    memcpy(&h, p, sizeof h);
    return (kv_t)(__builtin_convertvector(h, kvu_t) << 16);
}

KUMIKO_INLINE void kv_store_bf16(uint16_t* p, kv_t v) {
    kvu_t x = (kvu_t)v, lsb = (x >> 16) & 1u;
    kvu_t rne = (x + 0x7fffu + lsb) >> 16;
    kvu_t nan = (kvu_t)((x & 0x7fffffffu) > 0x7f800000u);
    kvu_t r = (nan & ((x >> 16) | 0x40u)) | (~nan & rne);
    kvh_t h = __builtin_convertvector(r, kvh_t);
    memcpy(p, &h, sizeof h);
}

/* fp32 lanes rounded to the nearest fp16 / bf16 and widened back: a cast to a 16-bit float in
 * compute (cexpr.cast: kk_h2f(kk_f2h(x))), bit-identical with the scalar conversions. */
KUMIKO_INLINE kv_t kv_round_f16(kv_t v) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_cvtph_ps(_mm512_cvtps_ph((__m512)v, 0));
#elif defined(__F16C__) && KUMIKO_VW == 8
    return (kv_t)_mm256_cvtph_ps(_mm256_cvtps_ph((__m256)v, 0));
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = kumiko_f16_to_f32(kumiko_f32_to_f16(v[i]));
    return r;
#endif
}

KUMIKO_INLINE kv_t kv_round_bf16(kv_t v) {
    kvu_t x = (kvu_t)v, lsb = (x >> 16) & 1u;
    kvu_t rne = ((x + 0x7fffu + lsb) >> 16) << 16;
    kvu_t nan = (kvu_t)((x & 0x7fffffffu) > 0x7f800000u);
    return (kv_t)((nan & (((x >> 16) | 0x40u) << 16)) | (~nan & rne));
}

/* ---------------------------------------------------------------------------------------------- */
/* helpers of the generated loop nests                                                             */

/* numpy's max/min: NaN in either lane gives NaN (lane-wise kk_maxf(a, b) = (a > b || a != a) ? a : b). */
KUMIKO_INLINE kv_t kv_maxnan(kv_t a, kv_t b) { return kv_select((a > b) | (a != a), a, b); }
KUMIKO_INLINE kv_t kv_minnan(kv_t a, kv_t b) { return kv_select((a < b) | (a != a), a, b); }

/* Lane-wise scalar function of two vectors (powf). */
#define kv_map2(fn, a, b) __extension__({ kv_t _kv_a = (a), _kv_b = (b), _kv_out; \
    for (int _kv_i = 0; _kv_i < KUMIKO_VW; _kv_i++) { _kv_out[_kv_i] = fn(_kv_a[_kv_i], _kv_b[_kv_i]); } _kv_out; })

/* 1 when some lane of the mask is set. */
KUMIKO_INLINE int kv_any(kvi_t m) {
#if defined(__AVX512F__)
    return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX__) && KUMIKO_VW == 8
    return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#else
    int r = 0;
    for (int i = 0; i < KUMIKO_VW; i++) r |= m[i] != 0;
    return r;
#endif
}

/* A max/min reduction keeps its accumulator with the fast kv_max/kv_min (one instruction, NaN not kept)
 * and tracks NaN inputs in a mask (nan |= v != v); these finish it: NaN when any lane saw one. */
KUMIKO_INLINE float kv_hmax_nan(kv_t acc, kvi_t nan) { return kv_any(nan) ? NAN : kv_hmax(acc); }
KUMIKO_INLINE float kv_hmin_nan(kv_t acc, kvi_t nan) { return kv_any(nan) ? NAN : kv_hmin(acc); }

/* A bool (0 / nonzero) broadcast to a lane mask (0 / -1). */
KUMIKO_INLINE kvi_t kv_mask_broadcast(int b) {
    const kvi_t zero = {0};
    return zero - (int32_t)(b != 0);
}

/* bool storage (one byte, 0 or 1) to and from lane masks. */
KUMIKO_INLINE kvi_t kv_load_bool(const unsigned char* p) {
    kvi_t m;
    for (int i = 0; i < KUMIKO_VW; i++) m[i] = p[i] ? -1 : 0;
    return m;
}
KUMIKO_INLINE void kv_store_bool(unsigned char* p, kvi_t m) {
    for (int i = 0; i < KUMIKO_VW; i++) p[i] = (unsigned char)(m[i] != 0);
}

/* the constant 0, 1, ..., KUMIKO_VW - 1 */
KUMIKO_INLINE kvi_t kv_iota(void) {
#if KUMIKO_VW == 16
    const kvi_t iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#elif KUMIKO_VW == 8
    const kvi_t iota = {0, 1, 2, 3, 4, 5, 6, 7};
#else
    const kvi_t iota = {0, 1, 2, 3};
#endif
    return iota;
}

/* Lane masks of an affine guard over the vectorised axis: lane l is set when c + k*l >= 0 (== 0), c the
 * constraint's value at lane 0 and k its coefficient of the axis (|k| < 2^20). c is clamped first: the
 * lanes' signs only depend on it within a few k of zero, so 32-bit lanes are exact. */
KUMIKO_INLINE kvi_t kv_affine_lanes(long long c, long long k) {
    const long long lim = 1LL << 28;
    const int32_t c32 = (int32_t)(c < -lim ? -lim : (c > lim ? lim : c));
    /* vector arithmetic on a constant 0, 1, 2, ... (a lane-by-lane loop here became 16 inserts per call) */
    return c32 + kv_iota() * (int32_t)k;
}
KUMIKO_INLINE kvi_t kv_affine_ge(long long c, long long k) { return kv_affine_lanes(c, k) >= 0; }
KUMIKO_INLINE kvi_t kv_affine_eq(long long c, long long k) { return kv_affine_lanes(c, k) == 0; }

/* ---------------------------------------------------------------------------------------------- */
/* masked and strided lanes (index-set split loops: the border iterations of a window over a padded */
/* axis, strided windows). A mask is a kvi_t of 0 / -1 per lane; a lane whose mask is 0 touches no */
/* memory (its address may lie outside the buffer) and loads as 0. s is the element stride of the  */
/* lanes (a constant after inlining, |s| < 2^20).                                                    */

#if defined(__AVX512F__)
KUMIKO_INLINE __mmask16 kv_kmask(kvi_t m) { return _mm512_cmplt_epi32_mask((__m512i)m, _mm512_setzero_si512()); }
#endif

KUMIKO_INLINE kv_t kv_load_mask(const float* p, kvi_t m) {
#if defined(__AVX512F__)
    return (kv_t)_mm512_maskz_loadu_ps(kv_kmask(m), p);
#elif defined(__AVX__) && KUMIKO_VW == 8
    return (kv_t)_mm256_maskload_ps(p, (__m256i)m);
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = m[i] ? p[i] : 0.0f;
    return r;
#endif
}

KUMIKO_INLINE void kv_store_mask(float* p, kv_t v, kvi_t m) {
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, kv_kmask(m), (__m512)v);
#elif defined(__AVX__) && KUMIKO_VW == 8
    _mm256_maskstore_ps(p, (__m256i)m, (__m256)v);
#else
    for (int i = 0; i < KUMIKO_VW; i++)
        if (m[i]) p[i] = v[i];
#endif
}

/* p[0], p[s], ..., p[(KUMIKO_VW - 1) * s]. Stride 2 deinterleaves two loads (the second one masked, so
 * nothing past p[2 * (KUMIKO_VW - 1)] is read); other strides gather. */
KUMIKO_INLINE kv_t kv_load_stride(const float* p, long long s) {
#if defined(__AVX512F__)
    if (s == 2) {
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        return (kv_t)_mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_maskz_loadu_ps(0x7fff, p + 16));
    }
    return (kv_t)_mm512_i32gather_ps((__m512i)(kv_iota() * (int32_t)s), p, 4);
#elif defined(__AVX2__) && KUMIKO_VW == 8
    if (s == 2) {
        const __m256 a = _mm256_loadu_ps(p);
        const __m256 b = _mm256_maskload_ps(p + 8, _mm256_set_epi32(0, -1, -1, -1, -1, -1, -1, -1));
        return (kv_t)_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    }
    return (kv_t)_mm256_i32gather_ps(p, (__m256i)(kv_iota() * (int32_t)s), 4);
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = p[i * s];
    return r;
#endif
}

/* Masked: stride 2 deinterleaves two loads whose masks are the lanes' mask spread to their even elements. */
KUMIKO_INLINE kv_t kv_load_stride_mask(const float* p, long long s, kvi_t m) {
#if defined(__AVX512F__)
#if defined(__BMI2__)
    if (s == 2) {
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const uint32_t e = _pdep_u32((uint32_t)kv_kmask(m), 0x55555555u);
        return (kv_t)_mm512_permutex2var_ps(_mm512_maskz_loadu_ps((__mmask16)(e & 0xffffu), p), even,
                                            _mm512_maskz_loadu_ps((__mmask16)(e >> 16), p + 16));
    }
#endif
    return (kv_t)_mm512_mask_i32gather_ps(_mm512_setzero_ps(), kv_kmask(m), (__m512i)(kv_iota() * (int32_t)s), p, 4);
#elif defined(__AVX2__) && KUMIKO_VW == 8
    if (s == 2) {
        const __m256i odd0 = _mm256_set_epi32(0, -1, 0, -1, 0, -1, 0, -1);
        const __m256i lo = _mm256_and_si256(_mm256_permutevar8x32_epi32((__m256i)m, _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0)), odd0);
        const __m256i hi = _mm256_and_si256(_mm256_permutevar8x32_epi32((__m256i)m, _mm256_set_epi32(7, 7, 6, 6, 5, 5, 4, 4)), odd0);
        const __m256 a = _mm256_maskload_ps(p, lo), b = _mm256_maskload_ps(p + 8, hi);
        return (kv_t)_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    }
    return (kv_t)_mm256_mask_i32gather_ps(_mm256_setzero_ps(), p, (__m256i)(kv_iota() * (int32_t)s), (__m256)m, 4);
#else
    kv_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = m[i] ? p[i * s] : 0.0f;
    return r;
#endif
}

/* 16-bit and bool storage: lanes p[i * s] where m is set (s = 1: contiguous), converted as the full-vector
 * loads convert; stores write the lanes where m is set. */
#define KUMIKO_LOAD_SM(NAME, T, FULL)                                                                  \
    KUMIKO_INLINE kv_t NAME(const T* p, long long s, kvi_t m) {                                        \
        T t[KUMIKO_VW];                                                                                \
        for (int i = 0; i < KUMIKO_VW; i++) t[i] = m[i] ? p[i * s] : (T)0;                             \
        return FULL(t);                                                                                \
    }
KUMIKO_LOAD_SM(kv_load_f16_sm, uint16_t, kv_load_f16)
KUMIKO_LOAD_SM(kv_load_bf16_sm, uint16_t, kv_load_bf16)
KUMIKO_INLINE kvi_t kv_load_bool_sm(const unsigned char* p, long long s, kvi_t m) {
    kvi_t r;
    for (int i = 0; i < KUMIKO_VW; i++) r[i] = (m[i] && p[i * s]) ? -1 : 0;
    return r;
}
#define KUMIKO_STORE_MASK(NAME, T, V, FULL)                                                            \
    KUMIKO_INLINE void NAME(T* p, V v, kvi_t m) {                                                      \
        T t[KUMIKO_VW];                                                                                \
        FULL(t, v);                                                                                    \
        for (int i = 0; i < KUMIKO_VW; i++)                                                            \
            if (m[i]) p[i] = t[i];                                                                     \
    }
KUMIKO_STORE_MASK(kv_store_f16_mask, uint16_t, kv_t, kv_store_f16)
KUMIKO_STORE_MASK(kv_store_bf16_mask, uint16_t, kv_t, kv_store_bf16)
KUMIKO_STORE_MASK(kv_store_bool_mask, unsigned char, kvi_t, kv_store_bool)

#endif /* KUMIKO_CPU_H */
