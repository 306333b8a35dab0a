"""kumiko_cpu.h: every helper generated kernels use, checked against numpy / ml_dtypes bit for bit where
the result is exact (conversions, tails, integer division) and to an ulp bound where it is not (exp2).

Each check runs for five builds of the header: the host's widest ISA (-march=native), the same without
F16C (the scalar fp16 conversion path), plain x86-64 (SSE2: 4-wide vectors, no FMA, no masked loads), AVX2
(8-wide, the path an AVX-512 host's native build skips) and AVX-512 (16-wide, mask registers; only
compiled where the CPU lacks AVX-512).
"""
import math
import platform

import ml_dtypes
import numpy as np
import pytest

from kumiko.runtime.cpu import DEFAULT_FLAGS, build_c, cpu_features

SOURCE = r"""
#include <fenv.h>
#include "kumiko_cpu.h"

KUMIKO_KERNEL vw(void** b, const long long* s) { (void)s; ((long long*)b[0])[0] = KUMIKO_VW; return 0; }

KUMIKO_KERNEL h2f(void** b, const long long* s) {
    const uint16_t* in = b[0]; float* out = b[1];
    for (long long i = 0; i < s[0]; i++) out[i] = kumiko_f16_to_f32(in[i]);
    return 0;
}
KUMIKO_KERNEL f2h(void** b, const long long* s) {
    const float* in = b[0]; uint16_t* out = b[1];
    for (long long i = 0; i < s[0]; i++) out[i] = kumiko_f32_to_f16(in[i]);
    return 0;
}
KUMIKO_KERNEL f2b(void** b, const long long* s) {
    const float* in = b[0]; uint16_t* out = b[1];
    for (long long i = 0; i < s[0]; i++) out[i] = kumiko_f32_to_bf16(in[i]);
    return 0;
}
KUMIKO_KERNEL b2f(void** b, const long long* s) {
    const uint16_t* in = b[0]; float* out = b[1];
    for (long long i = 0; i < s[0]; i++) out[i] = kumiko_bf16_to_f32(in[i]);
    return 0;
}
/* vector conversions: n is a multiple of KUMIKO_VW */
KUMIKO_KERNEL vconv(void** b, const long long* s) {
    const uint16_t* h = b[0]; const uint16_t* bf = b[1]; const float* f = b[2];
    float* h_out = b[3]; float* bf_out = b[4]; uint16_t* f_h = b[5]; uint16_t* f_bf = b[6];
    for (long long i = 0; i < s[0]; i += KUMIKO_VW) {
        kv_store(h_out + i, kv_load_f16(h + i));
        kv_store(bf_out + i, kv_load_bf16(bf + i));
        kv_store_f16(f_h + i, kv_load(f + i));
        kv_store_bf16(f_bf + i, kv_load(f + i));
    }
    return 0;
}
/* heap scratch: out[0..] = alignment and reuse facts of kumiko_tmp_alloc / kumiko_tmp_free */
KUMIKO_KERNEL tmpcache(void** b, const long long* s) {
    long long* out = b[0]; (void)s;
    char* a = kumiko_tmp_alloc(1000);
    memset(a, 1, 1000);
    out[0] = (long long)((uintptr_t)a % 64);
    kumiko_tmp_free(a);
    out[1] = kumiko_tmp_alloc(900) == (void*)a;            /* a freed block that fits is reused */
    char* c = kumiko_tmp_alloc(5000);                        /* too big for it: a new block */
    out[2] = c != a && (uintptr_t)c % 64 == 0;
    kumiko_tmp_free(a);
    kumiko_tmp_free(c);
    char* d = kumiko_tmp_alloc(4000);                        /* first fit among the kept */
    out[3] = d == c;
    char* big = kumiko_tmp_alloc(((size_t)1 << 20) + 64);    /* past KUMIKO_TMP_MAX: freed, not kept */
    memset(big, 2, 64);
    kumiko_tmp_free(big);
    char* e = kumiko_tmp_alloc(((size_t)1 << 20) + 64);
    out[4] = e != 0;
    kumiko_tmp_free(e);
    kumiko_tmp_free(d);
    kumiko_tmp_free(0);                                      /* free(NULL) semantics */
    return 0;
}
/* a function's vector body and vector tail into y, its scalar twin into z (they must agree bit for bit) */
#define KUMIKO_TEST_VS(name, vf, sf) \
KUMIKO_KERNEL name(void** b, const long long* s) { \
    const float* x = b[0]; float* y = b[1]; float* z = b[2]; \
    long long n = s[0], i = 0; \
    for (; i + KUMIKO_VW <= n; i += KUMIKO_VW) kv_store(y + i, vf(kv_load(x + i))); \
    if (i < n) kv_store_partial(y + i, vf(kv_loadu_partial(x + i, (int)(n - i))), (int)(n - i)); \
    for (i = 0; i < n; i++) z[i] = sf(x[i]); \
    return 0; \
}
KUMIKO_TEST_VS(exp2v, kv_exp2, kumiko_exp2)
KUMIKO_TEST_VS(erfv, kv_erf, kumiko_erff)
KUMIKO_TEST_VS(exp2le0v, kv_exp2_le0, kumiko_exp2_le0)
/* exp2 of dead lanes (x <= -150: a masked score's -inf) and of the smallest live ones, vector and scalar:
 * out[0] = 1 when computing the dead ones raised the underflow flag (an assist per vector on Intel cores) */
KUMIKO_KERNEL exp2uf(void** b, const long long* s) {
    const float* x = b[0]; float* y = b[1]; long long* out = b[2];
    feclearexcept(FE_ALL_EXCEPT);
    for (long long i = 0; i + KUMIKO_VW <= s[0]; i += KUMIKO_VW) kv_store(y + i, kv_exp2(kv_load(x + i)));
    for (long long i = 0; i < s[0]; i++) y[s[0] + i] = kumiko_exp2(x[i]);
    out[0] = fetestexcept(FE_UNDERFLOW) != 0;
    return 0;
}
/* row reductions with tails: out[r] = (sum, max, min) of row r of an R x C matrix, and y = relu(x) + 1 */
KUMIKO_KERNEL rows(void** b, const long long* s) {
    const float* x = b[0]; float* out = b[1]; float* y = b[2];
    long long R = s[0], C = s[1];
    for (long long r = 0; r < R; r++) {
        const float* row = x + r * C;
        kv_t acc = kv_zero(), mx = kv_broadcast(-INFINITY), mn = kv_broadcast(INFINITY);
        long long c = 0;
        for (; c + KUMIKO_VW <= C; c += KUMIKO_VW) {
            kv_t v = kv_load(row + c);
            acc = kv_fma(v, kv_broadcast(1.0f), acc);
            mx = kv_max(mx, v);
            mn = kv_min(mn, v);
            kv_store(y + r * C + c, kv_max(kv_zero(), v) + 1.0f);
        }
        if (c < C) {
            int n = (int)(C - c);
            kvi_t m = kv_tail_mask(n);
            kv_t v = kv_loadu_partial(row + c, n);
            acc = acc + v;
            mx = kv_max(mx, kv_select(m, v, kv_broadcast(-INFINITY)));
            mn = kv_min(mn, kv_select(m, v, kv_broadcast(INFINITY)));
            kv_store_partial(y + r * C + c, kv_max(kv_zero(), v) + 1.0f, n);
        }
        out[3 * r] = kv_hsum(acc); out[3 * r + 1] = kv_hmax(mx); out[3 * r + 2] = kv_hmin(mn);
    }
    return 0;
}
KUMIKO_KERNEL ints(void** b, const long long* s) {
    const long long* a = b[0]; long long* out = b[1];
    long long q = s[1];
    for (long long i = 0; i < s[0]; i++) {
        out[3 * i] = kumiko_floordiv(a[i], q); out[3 * i + 1] = kumiko_mod(a[i], q);
        out[3 * i + 2] = kumiko_ceildiv(a[i], q);
    }
    return 0;
}
/* helpers of generated loop nests. vround: n a multiple of KUMIKO_VW; the scalar twins alongside */
KUMIKO_KERNEL vround(void** b, const long long* s) {
    const float* x = b[0]; float* h = b[1]; float* bf = b[2]; float* hs = b[3]; float* bfs = b[4];
    for (long long i = 0; i < s[0]; i += KUMIKO_VW) {
        kv_store(h + i, kv_round_f16(kv_load(x + i)));
        kv_store(bf + i, kv_round_bf16(kv_load(x + i)));
    }
    for (long long i = 0; i < s[0]; i++) {
        hs[i] = kumiko_f16_to_f32(kumiko_f32_to_f16(x[i]));
        bfs[i] = kumiko_bf16_to_f32(kumiko_f32_to_bf16(x[i]));
    }
    return 0;
}
/* lane-wise NaN max/min and powf of two vectors; n a multiple of KUMIKO_VW */
KUMIKO_KERNEL vnanmax(void** b, const long long* s) {
    const float* x = b[0]; const float* y = b[1]; float* mx = b[2]; float* mn = b[3]; float* pw = b[4];
    for (long long i = 0; i < s[0]; i += KUMIKO_VW) {
        kv_t a = kv_load(x + i), c = kv_load(y + i);
        kv_store(mx + i, kv_maxnan(a, c));
        kv_store(mn + i, kv_minnan(a, c));
        kv_store(pw + i, kv_map2(powf, a, c));
    }
    return 0;
}
/* row max/min as the loop nest emits them: kv_max/kv_min accumulators, NaN lanes in a mask, a scalar tail */
KUMIKO_KERNEL rows_nan(void** b, const long long* s) {
    const float* x = b[0]; float* out = b[1];
    long long R = s[0], C = s[1];
    for (long long r = 0; r < R; r++) {
        const float* row = x + r * C;
        kv_t mx = kv_broadcast(-INFINITY), mn = kv_broadcast(INFINITY);
        kvi_t nan = kv_mask_broadcast(0);
        float smx = -INFINITY, smn = INFINITY;
        long long c = 0;
        for (; c < C - (KUMIKO_VW - 1); c += KUMIKO_VW) {
            kv_t v = kv_load(row + c);
            nan = nan | (v != v);
            mx = kv_max(mx, v);
            mn = kv_min(mn, v);
        }
        for (; c < C; c++) {
            smx = (smx > row[c] || smx != smx) ? smx : row[c];
            smn = (smn < row[c] || smn != smn) ? smn : row[c];
        }
        float hx = kv_hmax_nan(mx, nan), hn = kv_hmin_nan(mn, nan);
        out[2 * r] = (smx > hx || smx != smx) ? smx : hx;
        out[2 * r + 1] = (smn < hn || smn != smn) ? smn : hn;
    }
    return 0;
}
/* masks: affine lanes for (c, k) pairs, bool loads/stores, broadcast, any */
KUMIKO_KERNEL masks(void** b, const long long* s) {
    const long long* ck = b[0]; int32_t* ge = b[1]; int32_t* eq = b[2];
    const unsigned char* bl = b[3]; unsigned char* bl_out = b[4]; int32_t* misc = b[5];
    for (long long i = 0; i < s[0]; i++) {
        kvi_t g = kv_affine_ge(ck[2 * i], ck[2 * i + 1]), e = kv_affine_eq(ck[2 * i], ck[2 * i + 1]);
        memcpy(ge + i * KUMIKO_VW, &g, sizeof g);
        memcpy(eq + i * KUMIKO_VW, &e, sizeof e);
    }
    for (long long i = 0; i < s[1]; i += KUMIKO_VW) {
        kvi_t m = kv_load_bool(bl + i);
        misc[4 + i / KUMIKO_VW] = kv_any(m);
        kv_store_bool(bl_out + i, ~m);
    }
    kvi_t t = kv_mask_broadcast(5), f = kv_mask_broadcast(0);
    misc[0] = t[0]; misc[1] = t[KUMIKO_VW - 1]; misc[2] = f[0]; misc[3] = kv_any(f);
    return 0;
}
/* a stage's row dealt into phases: s = (n, lo, sc, f), dst holds f rows of sc floats */
KUMIKO_KERNEL phases(void** b, const long long* s) {
    kumiko_phase_row((float*)b[1], s[2], (const float*)b[0], s[0], s[1], s[2], (int)s[3]);
    return 0;
}
KUMIKO_KERNEL misc(void** b, const long long* s) {
    (void)s;
    float* out = b[0];
    kv_t v = kv_broadcast(-0.0f);
    kv_store(out, v);                                      /* -0.0 survives a broadcast */
    kv_store(out + KUMIKO_VW, kv_sqrt(kv_broadcast(2.0f)));
    kv_store(out + 2 * KUMIKO_VW, kv_map(log2f, kv_broadcast(8.0f)));
    kv_store(out + 3 * KUMIKO_VW, kv_max(kv_zero(), kv_broadcast(NAN)));  /* NaN propagates from b */
    return 0;
}
"""

X86 = platform.machine() in ("x86_64", "AMD64")
VARIANTS = {"native": (), "no-f16c": ("-mno-f16c",), "x86-64": ("-march=x86-64",),
            "avx2": ("-march=haswell",), "avx512": ("-march=skylake-avx512",)}
WIDTH = {"x86-64": 4, "avx2": 8, "avx512": 16}


@pytest.fixture(scope="module", params=list(VARIANTS))
def mod(request):
    if not X86 and request.param != "native":
        pytest.skip("x86-specific ISA variant")
    extra = VARIANTS[request.param]
    flags = [f for f in DEFAULT_FLAGS if not (extra and extra[0].startswith("-march") and f.startswith("-march"))]
    m = build_c(SOURCE, flags=flags + list(extra) + ["-Wall", "-Wextra", "-Werror"], name=f"hdr_{request.param}")
    if request.param == "avx512" and not cpu_features()["avx512f"]:
        pytest.skip("the AVX-512 build compiled; this CPU cannot run it")
    if request.param == "avx2" and not cpu_features()["avx2"]:
        pytest.skip("the AVX2 build compiled; this CPU cannot run it")
    m.variant = request.param
    return m


def _run(mod, name, arrays, syms):
    assert mod.fn(name)(arrays, syms) == 0


def test_vector_width(mod):
    out = np.zeros(1, np.int64)
    _run(mod, "vw", [out], [])
    want = WIDTH.get(mod.variant, cpu_features()["vector_width_f32"])
    assert out[0] == want


def _all_halves() -> np.ndarray:
    return np.arange(65536, dtype=np.uint32).astype(np.uint16)


def test_f16_to_f32_all_values(mod):
    h = _all_halves()
    out = np.empty(h.size, np.float32)
    _run(mod, "h2f", [h, out], [h.size])
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(out[nan]).all()


def _hard_floats() -> np.ndarray:
    """Every rounding boundary of fp16 and bf16 (+-1 ulp of fp32), specials, and random values."""
    mids = (_all_halves().view(np.float16).astype(np.float32).view(np.uint32).astype(np.int64) + (1 << 12))
    bmids = (np.arange(65536, dtype=np.int64) << 16) + (1 << 15)
    around = np.concatenate([mids + d for d in (-1, 0, 1)] + [bmids + d for d in (-1, 0, 1)])
    around = around[(around >= 0) & (around < 1 << 32)].astype(np.uint32).view(np.float32)
    rng = np.random.default_rng(0)
    rand = (rng.standard_normal(20000) * 2.0 ** rng.integers(-30, 20, 20000)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 1e-8, 2.0 ** -25,
                        2.0 ** -24, 3e38, -3.4e38, 5.96e-8, 6.1e-5], np.float32)
    return np.concatenate([around, rand, special]).astype(np.float32)


def _same_bits_or_nan(got_u16: np.ndarray, want: np.ndarray) -> None:
    wb = want.view(np.uint16)
    with np.errstate(invalid="ignore"):       # signalling NaN patterns are part of the sweep
        nan = np.isnan(want.astype(np.float32))
    bad = ~nan & (got_u16 != wb)
    assert not bad.any(), f"first mismatch at {np.flatnonzero(bad)[:5]}: {got_u16[bad][:5]} vs {wb[bad][:5]}"
    # NaN stays NaN (quieted): exponent all ones, mantissa non-zero, in the right bit positions
    with np.errstate(invalid="ignore"):
        assert np.isnan(got_u16[nan].view(want.dtype).astype(np.float32)).all()


def test_f32_to_f16_rounding(mod):
    x = _hard_floats()
    out = np.empty(x.size, np.uint16)
    _run(mod, "f2h", [x, out], [x.size])
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    _same_bits_or_nan(out, want)


def test_bf16_round_trip(mod):
    x = _hard_floats()
    out = np.empty(x.size, np.uint16)
    _run(mod, "f2b", [x, out], [x.size])
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
    _same_bits_or_nan(out, want)
    b = _all_halves()
    back = np.empty(b.size, np.float32)
    _run(mod, "b2f", [b, back], [b.size])
    assert np.array_equal(back.view(np.uint32), b.astype(np.uint32) << 16)


def test_vector_conversions(mod):
    x = _hard_floats()
    n = x.size - x.size % 64
    x = np.ascontiguousarray(x[:n])
    h = _all_halves()[:n].copy() if n <= 65536 else np.resize(_all_halves(), n)
    bf = np.resize(_all_halves(), n)
    outs = [np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, np.uint16), np.empty(n, np.uint16)]
    _run(mod, "vconv", [h, bf, x, *outs], [n])
    with np.errstate(invalid="ignore"):
        want_h = h.view(np.float16).astype(np.float32)
    ok = np.isnan(want_h) & np.isnan(outs[0]) | (outs[0].view(np.uint32) == want_h.view(np.uint32))
    assert ok.all()
    assert np.array_equal(outs[1].view(np.uint32), bf.astype(np.uint32) << 16)
    with np.errstate(over="ignore", invalid="ignore"):
        want_f16, want_bf16 = x.astype(np.float16), x.astype(ml_dtypes.bfloat16)
    _same_bits_or_nan(outs[2], want_f16)
    _same_bits_or_nan(outs[3], want_bf16)


def _ulp_error(got: np.ndarray, want64: np.ndarray) -> np.ndarray:
    want32 = want64.astype(np.float32)
    ulp = np.spacing(np.abs(want32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want64) / np.maximum(ulp, np.float64(2.0) ** -149)


def test_heap_scratch_is_aligned_and_reused(mod):
    out = np.full(5, -1, np.int64)
    _run(mod, "tmpcache", [out], [])
    assert out.tolist() == [0, 1, 1, 1, 1]


def test_exp2_of_dead_lanes_is_zero_without_an_underflow(mod):
    """Lanes at or below -150 are 0 without computing an underflowing product (which takes a microcode assist
    per vector on Intel cores); the check can fail: a live lane near -150 does raise the flag."""
    dead = np.array([-np.inf, -150.0, -151.0, -1e30, -200.0, -np.inf, -150.0, -3e38] * 2, np.float32)
    y, flag = np.full(2 * dead.size, 7.0, np.float32), np.full(1, -1, np.int64)
    _run(mod, "exp2uf", [dead, y, flag], [dead.size])
    assert (y == 0).all() and not np.signbit(y).any() and flag[0] == 0
    live = np.full(16, -149.3, np.float32)
    _run(mod, "exp2uf", [live, np.full(32, 7.0, np.float32), flag], [live.size])
    assert flag[0] == 1


def test_exp2_accuracy_and_tail_agreement(mod):
    rng = np.random.default_rng(1)
    x = np.concatenate([[np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 0.5, -0.5, 127.99, 128.0, -126.0, -149.0,
                         -150.0, -151.0, 1e-30], rng.uniform(-160, 130, 30000), rng.uniform(-1, 1, 30000),
                        np.linspace(-150, 128, 20001)]).astype(np.float32)
    x = x[: x.size - x.size % 16 + 3]      # the vector loop ends in a partial tail
    y, z = np.full(x.size, 7.0, np.float32), np.full(x.size, 7.0, np.float32)
    _run(mod, "exp2v", [x, y, z], [x.size])
    assert np.array_equal(y.view(np.uint32), z.view(np.uint32)), "vector and scalar exp2 must agree bit for bit"
    want = np.exp2(x.astype(np.float64))
    finite = np.isfinite(x) & (x < 128)
    assert (y[np.isfinite(x) & (x >= 128)] == np.inf).all()
    err = _ulp_error(y[finite], want[finite])
    assert err.max() <= 2.0, f"max {err.max():.2f} ulp at x={x[finite][err.argmax()]}"
    assert y[x == np.inf][0] == np.inf and y[x == -np.inf][0] == 0.0
    assert np.isnan(y[np.isnan(x)]).all()
    assert y[x == np.float32(128.0)][0] == np.inf


def test_exp2_le0_is_normal_and_accurate(mod):
    """erf's 2^q for q <= 0: within 2 ulp of 2^q down to -126, 2^-126 (normal, no underflow) below it, 1 at
    0, NaN kept, and the vector lanes equal to the scalar twin bit for bit."""
    rng = np.random.default_rng(3)
    x = np.concatenate([[0.0, -0.0, -0.5, -126.0, -126.4, -126.6, -127.0, -149.0, -1e30, -np.inf, np.nan],
                        rng.uniform(-126, 0, 30000), rng.uniform(-30, 0, 30000)]).astype(np.float32)
    x = x[: x.size - x.size % 16 + 7]
    y, z = np.full(x.size, 7.0, np.float32), np.full(x.size, 7.0, np.float32)
    _run(mod, "exp2le0v", [x, y, z], [x.size])
    assert np.array_equal(y.view(np.uint32), z.view(np.uint32)), "vector and scalar must agree bit for bit"
    live = x >= -126
    err = _ulp_error(y[live], np.exp2(x[live].astype(np.float64)))
    assert err.max() <= 2.0, f"max {err.max():.2f} ulp at x={x[live][err.argmax()]}"
    assert (y[x < -126] == np.float32(2.0 ** -126)).all() and y[x == 0][0] == 1.0
    assert np.isnan(y[np.isnan(x)]).all()


def test_erf_accuracy_and_tail_agreement(mod):
    """kv_erf / kumiko_erff: within 3 ulp of the float64 erf everywhere (tiny, split point, tails, +-inf),
    NaN kept, odd, and the vector lanes equal to the scalar twin bit for bit."""
    rng = np.random.default_rng(2)
    x = np.concatenate([[np.inf, -np.inf, np.nan, 0.0, -0.0, 0.921875, -0.921875, np.nextafter(0.921875, 1),
                         4.0, -4.0, 3.99, 1e-30, -1e-38, 1e-45, 2.5, 30.0],
                        rng.uniform(-6, 6, 40000), rng.standard_normal(20000) * 1e-3,
                        np.linspace(0.8, 1.1, 20001), 10.0 ** rng.uniform(-37, 0.6, 20000)]).astype(np.float32)
    x = x[: x.size - x.size % 16 + 5]      # the vector loop ends in a partial tail
    y, z = np.full(x.size, 7.0, np.float32), np.full(x.size, 7.0, np.float32)
    _run(mod, "erfv", [x, y, z], [x.size])
    assert np.array_equal(y.view(np.uint32), z.view(np.uint32)), "vector and scalar erf must agree bit for bit"
    fin = np.isfinite(x)
    want = np.array([math.erf(v) for v in x[fin].astype(np.float64)])
    err = _ulp_error(y[fin], want)
    assert err.max() <= 3.0, f"max {err.max():.2f} ulp at x={x[fin][err.argmax()]}"
    assert y[x == np.inf][0] == 1.0 and y[x == -np.inf][0] == -1.0 and np.isnan(y[np.isnan(x)]).all()
    assert np.signbit(y[(x == 0) & np.signbit(x)]).all()          # erf(-0) = -0


@pytest.mark.parametrize("cols", [1, 3, 8, 16, 37])
def test_tails_and_horizontal_reductions(mod, cols):
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    out = np.zeros((5, 3), np.float32)
    y = np.full((5, cols + 1), 99.0, np.float32)[:, :cols].copy()
    guard = np.full(64, 123.0, np.float32)
    buf = np.concatenate([x.ravel(), guard])             # reading past the row end would see 123
    _run(mod, "rows", [buf, out, y], [5, cols])
    np.testing.assert_allclose(out[:, 0], x.sum(1), rtol=1e-5, atol=1e-5)
    assert np.array_equal(out[:, 1], x.max(1)) and np.array_equal(out[:, 2], x.min(1))
    np.testing.assert_array_equal(y, np.maximum(x, 0) + 1)


def test_partial_store_writes_nothing_past_n(mod):
    x = np.arange(40, dtype=np.float32)
    buf = np.concatenate([x[:3], np.full(61, -5.0, np.float32)])
    out = np.zeros(3, np.float32)
    y = np.full(64, -7.0, np.float32)
    _run(mod, "rows", [buf, out, y], [1, 3])
    assert (y[3:] == -7.0).all()


def test_integer_helpers(mod):
    a = np.arange(-20, 21, dtype=np.int64)
    out = np.zeros((a.size, 3), np.int64)
    _run(mod, "ints", [a, out], [a.size, 4])
    np.testing.assert_array_equal(out[:, 0], a // 4)
    np.testing.assert_array_equal(out[:, 1], a % 4)
    np.testing.assert_array_equal(out[:, 2], -((-a) // 4))


def test_broadcast_sqrt_map_and_nan_max(mod):
    vw = WIDTH.get(mod.variant, cpu_features()["vector_width_f32"])
    out = np.zeros(4 * vw, np.float32)
    _run(mod, "misc", [out], [])
    assert np.signbit(out[:vw]).all() and (out[:vw] == 0).all()
    assert (out[vw:2 * vw] == np.sqrt(np.float32(2))).all()
    assert (out[2 * vw:3 * vw] == 3.0).all()
    assert np.isnan(out[3 * vw:]).all()


# helpers of generated loop nests (kumiko/kernel/lower_cpu.py, lower_vec.py) -------------------------------

def test_vector_rounding_casts_match_the_scalar_ones(mod):
    x = _hard_floats()
    n = x.size - x.size % 64
    x = np.ascontiguousarray(x[:n])
    h, bf, hs, bfs = (np.empty(n, np.float32) for _ in range(4))
    _run(mod, "vround", [x, h, bf, hs, bfs], [n])
    with np.errstate(over="ignore", invalid="ignore"):
        want_h = x.astype(np.float16).astype(np.float32)
        want_b = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    for got, scalar, want in ((h, hs, want_h), (bf, bfs, want_b)):
        nan = np.isnan(want)
        assert np.isnan(got[nan]).all() and np.isnan(scalar[nan]).all()
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
        assert np.array_equal(scalar[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_nan_max_min_and_pow_lanes(mod):
    rng = np.random.default_rng(7)
    n = 64 * 8
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x[::7] = np.nan
    y[::5] = np.nan
    x[3::11] = np.inf
    y[4::13] = -np.inf
    x[1], y[1] = 0.0, -0.0
    y[2] = x[2]
    mx, mn, pw = (np.empty(n, np.float32) for _ in range(3))
    _run(mod, "vnanmax", [x, y, mx, mn, pw], [n])
    with np.errstate(invalid="ignore"):
        want_mx = np.where((x > y) | np.isnan(x), x, y)        # kk_maxf: (a > b || a != a) ? a : b
        want_mn = np.where((x < y) | np.isnan(x), x, y)
        want_pw = np.power(np.abs(x), y)
    assert np.array_equal(mx.view(np.uint32)[~np.isnan(want_mx)], want_mx.view(np.uint32)[~np.isnan(want_mx)])
    assert np.array_equal(np.isnan(mx), np.isnan(np.maximum(x, y)))
    assert np.array_equal(mn.view(np.uint32)[~np.isnan(want_mn)], want_mn.view(np.uint32)[~np.isnan(want_mn)])
    assert np.array_equal(np.isnan(mn), np.isnan(np.minimum(x, y)))
    pos = x >= 0
    np.testing.assert_allclose(pw[pos], want_pw[pos], rtol=1e-6)


@pytest.mark.parametrize("cols", [1, 7, 9, 16, 37])
def test_nan_tracking_row_max_min(mod, cols):
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    x[1, 0] = np.nan
    x[2, cols - 1] = np.nan
    x[3, cols // 2] = np.nan
    x[4, 0] = np.inf
    x[5, :] = -np.inf
    out = np.zeros((6, 2), np.float32)
    _run(mod, "rows_nan", [x, out], [6, cols])
    want = np.stack([x.max(1), x.min(1)], 1)
    assert np.array_equal(np.isnan(out), np.isnan(want))
    assert np.array_equal(out[~np.isnan(want)], want[~np.isnan(want)])


def test_masks_affine_lanes_and_bools(mod):
    vw = WIDTH.get(mod.variant, cpu_features()["vector_width_f32"])
    pairs = [(c, k) for c in range(-40, 41, 3) for k in (-3, -1, 0, 1, 2)]
    pairs += [(c, k) for c in (10 ** 12, -10 ** 12, 2 ** 31, -2 ** 31 - 5, 2 ** 28 + 3) for k in (-7, 1, 5)]
    ck = np.array(pairs, np.int64)
    ge = np.zeros((len(pairs), vw), np.int32)
    eq = np.zeros((len(pairs), vw), np.int32)
    bl = np.random.default_rng(2).random(8 * vw) < 0.3
    bl[:vw] = False
    bl_out = np.zeros(8 * vw, np.bool_)
    misc = np.zeros(4 + 8, np.int32)
    _run(mod, "masks", [ck, ge, eq, bl.view(np.uint8), bl_out.view(np.uint8), misc], [len(pairs), 8 * vw])
    lanes = ck[:, :1] + ck[:, 1:] * np.arange(vw)
    assert np.array_equal(ge, -(lanes >= 0).astype(np.int32))
    assert np.array_equal(eq, -(lanes == 0).astype(np.int32))
    assert np.array_equal(bl_out, ~bl)
    assert list(misc[:4]) == [-1, -1, 0, 0]
    assert list(misc[4:]) == [int(bl[i * vw:(i + 1) * vw].any()) for i in range(8)]


@pytest.mark.parametrize("n, lo, f", [(224, 1, 2), (224, 3, 2), (56, 1, 2), (57, 0, 2), (7, 1, 2), (100, 2, 3),
                                      (33, 0, 1), (64, 5, 4), (1, 1, 2)])
def test_phase_rows_deal_a_row_into_its_phases(mod, n, lo, f):
    """kumiko_phase_row: dst[ph][q] = src[q * f + ph - lo] inside the source, 0 around it (a stride-f conv's
    stage row), for pads in front and behind, rows shorter than a vector, and the AVX-512 and AVX2 two-phase
    paths."""
    src = np.random.default_rng(n + lo).standard_normal(n).astype(np.float32)
    sc = (n + 2 * lo + f - 1) // f
    dst = np.full((f, sc), np.nan, np.float32)
    _run(mod, "phases", [src, dst], [n, lo, sc, f])
    padded = np.zeros(sc * f, np.float32)
    padded[lo:lo + n] = src[:max(0, min(n, sc * f - lo))]
    np.testing.assert_array_equal(dst, padded.reshape(sc, f).T)
