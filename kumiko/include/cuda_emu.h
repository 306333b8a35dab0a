// cuda_emu.h — kumiko's CUDA emulator: compile a CUDA source unchanged with
//     g++ -std=c++20 -DKUMIKO_EMU -include cuda_emu.h -x c++ kernel.cu
// and run it on the CPU with CUDA semantics.  See docs/emulator.md.
//
// How it works, in one paragraph.  Every CUDA thread of a block is a fiber (its own stack, switched
// cooperatively on one OS thread); blocks run one after another.  A fiber runs until it blocks in a
// block barrier (__syncthreads) or a warp collective (shfl, ballot, ldmatrix, mma.sync), then the
// scheduler picks the next ready fiber (round-robin; "run-ahead": warp 0 first; "reversed": the last
// warp first and threads in descending order; "random": a seeded random ready fiber).  Warp
// collectives work by each lane depositing its operands in the warp's slots; the last lane to arrive
// computes every lane's result from the PTX ISA fragment layouts and wakes the others.  If no fiber
// is ready but some have not finished, the block is deadlocked and the launch reports who waits
// where.  Shared memory is the module's thread-local storage (`__shared__` is `thread_local`, which
// is the one storage class that also works after `extern`), poisoned with 0xFF at the start of every
// block.  cp.async either copies at once ("eager") or only at the matching wait_group ("deferred").
// Faults (misaligned address, poisoned read, divergent collective, deadlock, bad launch) unwind
// every fiber with a C++ exception and come back from the launch as a structured error.
#ifndef KUMIKO_CUDA_EMU_H
#define KUMIKO_CUDA_EMU_H

#if defined(__CUDACC__)
#error "cuda_emu.h is for g++ builds of CUDA sources; nvcc uses the CUDA headers"
#endif
#if __cplusplus < 202002L
#error "cuda_emu.h needs C++20 (g++ -std=c++20)"
#endif

#include <algorithm>
#include <cstdarg>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define KUMIKO_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__) || defined(KUMIKO_EMU_UCONTEXT)
#define KUMIKO_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#define KUMIKO_EMU_ABI_VERSION 2
// Largest dynamic shared memory a launch may ask for (sm_90: 227 KiB); the runner defines each
// `extern __shared__` array with this many bytes.
#ifndef KUMIKO_EMU_MAX_DYNAMIC_SMEM
#define KUMIKO_EMU_MAX_DYNAMIC_SMEM 232448
#endif

// ------------------------------------------------------------------------------------------------
// 1. CUDA keywords
// ------------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __grid_constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// `thread_local` is the only storage class that is valid both in `__shared__ T x[N];` at block scope
// (it implies static storage) and in `extern __shared__ T x[];`.  All fibers of a block run on one
// OS thread, so a thread_local is shared by exactly the threads of the running block.
#define __shared__ thread_local

// ------------------------------------------------------------------------------------------------
// 2. Vector types (CUDA's alignments)
// ------------------------------------------------------------------------------------------------
#define KUMIKO_EMU_VEC2(T, N, A)                                                                   \
  struct __attribute__((aligned(A))) N { T x, y; };                                                \
  inline constexpr N make_##N(T x, T y) { return N{x, y}; }
#define KUMIKO_EMU_VEC3(T, N)                                                                      \
  struct N { T x, y, z; };                                                                         \
  inline constexpr N make_##N(T x, T y, T z) { return N{x, y, z}; }
#define KUMIKO_EMU_VEC4(T, N, A)                                                                   \
  struct __attribute__((aligned(A))) N { T x, y, z, w; };                                          \
  inline constexpr N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }
KUMIKO_EMU_VEC2(char, char2, 2)
KUMIKO_EMU_VEC4(char, char4, 4)
KUMIKO_EMU_VEC2(unsigned char, uchar2, 2)
KUMIKO_EMU_VEC4(unsigned char, uchar4, 4)
KUMIKO_EMU_VEC2(short, short2, 4)
KUMIKO_EMU_VEC4(short, short4, 8)
KUMIKO_EMU_VEC2(unsigned short, ushort2, 4)
KUMIKO_EMU_VEC4(unsigned short, ushort4, 8)
KUMIKO_EMU_VEC2(int, int2, 8)
KUMIKO_EMU_VEC3(int, int3)
KUMIKO_EMU_VEC4(int, int4, 16)
KUMIKO_EMU_VEC2(unsigned int, uint2, 8)
KUMIKO_EMU_VEC3(unsigned int, uint3)
KUMIKO_EMU_VEC4(unsigned int, uint4, 16)
KUMIKO_EMU_VEC2(float, float2, 8)
KUMIKO_EMU_VEC3(float, float3)
KUMIKO_EMU_VEC4(float, float4, 16)
KUMIKO_EMU_VEC2(double, double2, 16)
KUMIKO_EMU_VEC2(long long, longlong2, 16)
KUMIKO_EMU_VEC2(unsigned long long, ulonglong2, 16)
#undef KUMIKO_EMU_VEC2
#undef KUMIKO_EMU_VEC3
#undef KUMIKO_EMU_VEC4

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ------------------------------------------------------------------------------------------------
// 3. fp16 / bf16 storage types.  Conversions round to nearest even; NaN converts to the canonical
//    NaN 0x7FFF like CUDA's __float2half / __float2bfloat16; overflow gives inf.
// ------------------------------------------------------------------------------------------------
namespace emu {
// cuda_emu_sm90.h: a float converted by kernel code carries the wgmma accumulator poison (a fault)
inline void acc_poison_seen(uint32_t bits);
namespace fp {
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) { acc_poison_seen(x); return 0x7fffu; }  // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // >= 65520 rounds to inf (and inf)
  if (ax >= 0x38800000u) {                                // normal half: rebias 127 -> 15
    const uint32_t v = ax - 0x38000000u;
    uint32_t r = v >> 13;
    const uint32_t rem = v & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent: fine
    return uint16_t(sign | r);
  }
  if (ax <= 0x33000000u) return uint16_t(sign);           // <= 2^-25 rounds to (signed) zero
  const uint32_t e = ax >> 23;                            // subnormal half: units of 2^-24
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;                        // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    e = 1;
    while (!(m & 0x400u)) { m <<= 1; --e; }
    m &= 0x3ffu;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) { acc_poison_seen(x); return 0x7fffu; }  // NaN
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }
}  // namespace fp
}  // namespace emu

struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

struct __attribute__((aligned(2))) __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(const __half_raw& r) : __x(r.x) {}
  __half(float f) : __x(emu::fp::f32_to_f16(f)) {}
  __half(double d) : __x(emu::fp::f32_to_f16(static_cast<float>(d))) {}
  __half(int i) : __x(emu::fp::f32_to_f16(static_cast<float>(i))) {}
  __half(unsigned int i) : __x(emu::fp::f32_to_f16(static_cast<float>(i))) {}
  operator float() const { return emu::fp::f16_to_f32(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};
typedef __half half;

struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(emu::fp::f32_to_bf16(f)) {}
  __nv_bfloat16(double d) : __x(emu::fp::f32_to_bf16(static_cast<float>(d))) {}
  __nv_bfloat16(int i) : __x(emu::fp::f32_to_bf16(static_cast<float>(i))) {}
  __nv_bfloat16(unsigned int i) : __x(emu::fp::f32_to_bf16(static_cast<float>(i))) {}
  operator float() const { return emu::fp::bf16_to_f32(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
typedef __nv_bfloat16 nv_bfloat16;

struct __attribute__((aligned(4))) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half a, __half b) : x(a), y(b) {}
};
typedef __half2 half2;
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __nv_bfloat162 nv_bfloat162;

inline __half __float2half(float f) { return __half_raw{emu::fp::f32_to_f16(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return emu::fp::f16_to_f32(h.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16_raw{emu::fp::f32_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return emu::fp::bf16_to_f32(b.__x); }
inline __half2 __floats2half2_rn(float lo, float hi) { return __half2(__float2half(lo), __float2half(hi)); }
inline __half2 __float2half2_rn(float f) { return __half2(__float2half(f), __float2half(f)); }
inline __half2 __halves2half2(__half lo, __half hi) { return __half2(lo, hi); }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162(__float2bfloat16(lo), __float2bfloat16(hi));
}
inline float2 __bfloat1622float2(__nv_bfloat162 b) { return float2{__bfloat162float(b.x), __bfloat162float(b.y)}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline bool __hisnan(__half h) { return (h.__x & 0x7fffu) > 0x7c00u; }
inline bool __hisinf(__half h) { return (h.__x & 0x7fffu) == 0x7c00u; }

// Arithmetic in fp32, rounded back once (what sm_80 does for a single fp16 op).
#define KUMIKO_EMU_HALF_OPS(H, CVT)                                                                \
  inline H operator+(const H& a, const H& b) { return CVT(float(a) + float(b)); }                  \
  inline H operator-(const H& a, const H& b) { return CVT(float(a) - float(b)); }                  \
  inline H operator*(const H& a, const H& b) { return CVT(float(a) * float(b)); }                  \
  inline H operator/(const H& a, const H& b) { return CVT(float(a) / float(b)); }                  \
  inline H operator-(const H& a) { H r = a; r.__x ^= 0x8000u; return r; }                         \
  inline H& operator+=(H& a, const H& b) { return a = a + b; }                                     \
  inline H& operator-=(H& a, const H& b) { return a = a - b; }                                     \
  inline H& operator*=(H& a, const H& b) { return a = a * b; }                                     \
  inline H& operator/=(H& a, const H& b) { return a = a / b; }                                     \
  inline bool operator==(const H& a, const H& b) { return float(a) == float(b); }                  \
  inline bool operator!=(const H& a, const H& b) { return float(a) != float(b); }                  \
  inline bool operator<(const H& a, const H& b) { return float(a) < float(b); }                    \
  inline bool operator>(const H& a, const H& b) { return float(a) > float(b); }                    \
  inline bool operator<=(const H& a, const H& b) { return float(a) <= float(b); }                  \
  inline bool operator>=(const H& a, const H& b) { return float(a) >= float(b); }                  \
  inline H __hadd(H a, H b) { return a + b; }                                                      \
  inline H __hsub(H a, H b) { return a - b; }                                                      \
  inline H __hmul(H a, H b) { return a * b; }                                                      \
  inline H __hdiv(H a, H b) { return a / b; }                                                      \
  inline H __hneg(H a) { return -a; }                                                              \
  inline H __hfma(H a, H b, H c) { return CVT(std::fma(float(a), float(b), float(c))); }           \
  inline H __hmax(H a, H b) { return CVT(std::fmax(float(a), float(b))); }                         \
  inline H __hmin(H a, H b) { return CVT(std::fmin(float(a), float(b))); }                         \
  inline bool __hlt(H a, H b) { return a < b; }                                                    \
  inline bool __hgt(H a, H b) { return a > b; }                                                    \
  inline bool __heq(H a, H b) { return a == b; }
KUMIKO_EMU_HALF_OPS(__half, __float2half)
KUMIKO_EMU_HALF_OPS(__nv_bfloat16, __float2bfloat16)
#undef KUMIKO_EMU_HALF_OPS

// ------------------------------------------------------------------------------------------------
// 4. Device math and bit intrinsics
// ------------------------------------------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }
inline int __mul24(int a, int b) { return a * b; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) { using C = std::common_type_t<A, B>; return C(a) < C(b) ? C(a) : C(b); }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) { using C = std::common_type_t<A, B>; return C(a) < C(b) ? C(b) : C(a); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}
#if defined(__x86_64__)
inline long long clock64() { return static_cast<long long>(__builtin_ia32_rdtsc()); }
#else
inline long long clock64() { return 0; }
#endif

// Atomics: fibers of a block share one OS thread, but builtins keep these right under any runner.
#define KUMIKO_EMU_ATOMIC_INT(T)                                                                   \
  inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }             \
  inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }             \
  inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }             \
  inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }               \
  inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }             \
  inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }           \
  inline T atomicCAS(T* p, T cmp, T v) {                                                           \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
    return cmp;                                                                                    \
  }                                                                                                \
  inline T atomicMax(T* p, T v) {                                                                  \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                  \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
    return old;                                                                                    \
  }                                                                                                \
  inline T atomicMin(T* p, T v) {                                                                  \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                  \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
    return old;                                                                                    \
  }
KUMIKO_EMU_ATOMIC_INT(int)
KUMIKO_EMU_ATOMIC_INT(unsigned int)
KUMIKO_EMU_ATOMIC_INT(unsigned long long)
#undef KUMIKO_EMU_ATOMIC_INT
inline float atomicAdd(float* p, float v) {
  float old = *p;
  for (;;) {
    const float want = old + v;
    if (__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return old;
  }
}
inline double atomicAdd(double* p, double v) {
  double old = *p;
  for (;;) {
    const double want = old + v;
    if (__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return old;
  }
}

// ------------------------------------------------------------------------------------------------
// 5. The runtime: fibers, blocks, scheduler, faults
// ------------------------------------------------------------------------------------------------
extern "C" void kumiko_emu_ctx_switch(void** save_sp, void* load_sp);
extern "C" void kumiko_emu_ctx_trampoline();
// Defined by the runner's second translation unit when the kernel uses `extern __shared__`: calls
// `cb(array, bytes)` for each dynamic shared array (they live in the same TLS block).
extern "C" __attribute__((weak)) void kumiko_emu_dynamic_smem(void (*cb)(void* p, size_t n));

namespace emu __attribute__((visibility("hidden"))) {

enum class CpAsyncMode : int { deferred = 0, eager = 1 };
// round_robin: threads in index order, each until it blocks; run_ahead: warp 0 first, to its next block
// point; reversed: the mirror image (the last warp first and ahead, threads in descending order), so a
// higher-numbered warp reads before a lower-numbered one wrote; random: a seeded random ready thread.
enum class Schedule : int { round_robin = 0, run_ahead = 1, reversed = 2, random = 3 };

struct Config {
  CpAsyncMode cp_async = CpAsyncMode::deferred;
  Schedule schedule = Schedule::round_robin;
  bool poison_check = true;            // ldmatrix reading 0xFFFF (never-written shared memory) faults
#if defined(KUMIKO_EMU_ASAN)
  size_t stack_bytes = 1u << 20;       // ASan frames are much larger
#else
  size_t stack_bytes = 256u << 10;
#endif
  unsigned max_smem = 232448;          // sm_90: 227 KiB per block (sm_80: 166912)
  unsigned long long seed = 0;         // Schedule::random: the order's seed (mixed with the block index)
};

enum class Op : uint8_t { none, syncthreads, syncwarp, shfl_idx, shfl_xor, shfl_up, shfl_down, ballot,
                          ldmatrix, mma, mbar_wait, wgmma, setmaxnreg };

inline const char* op_name(Op op, int variant = 0) {
  switch (op) {
    case Op::syncthreads: return "__syncthreads";
    case Op::syncwarp: return "__syncwarp";
    case Op::shfl_idx: return "__shfl_sync";
    case Op::shfl_xor: return "__shfl_xor_sync";
    case Op::shfl_up: return "__shfl_up_sync";
    case Op::shfl_down: return "__shfl_down_sync";
    case Op::ballot: return "__ballot_sync";
    case Op::ldmatrix: {
      static const char* names[] = {"ldmatrix_x1", "ldmatrix_x2", "?", "ldmatrix_x4",
                                    "ldmatrix_x1_trans", "ldmatrix_x2_trans", "?", "ldmatrix_x4_trans"};
      return names[variant & 7];
    }
    case Op::mma: return variant ? "mma_m16n8k16_bf16f32" : "mma_m16n8k16_f16f32";
    case Op::mbar_wait: return "mbar_wait (mbarrier.try_wait.parity)";
    case Op::wgmma: return "wgmma.mma_async (warpgroup)";
    case Op::setmaxnreg: return "setmaxnreg.inc";
    default: return "?";
  }
}

struct Abort {};  // thrown through kernel code to unwind a fiber after a fault

struct CpRec {
  unsigned char* dst;
  unsigned size;
  unsigned char data[16];
};

struct Fiber {
  void* sp = nullptr;
#if defined(KUMIKO_EMU_USE_UCONTEXT)
  ucontext_t uc;
#endif
  char* stack = nullptr;  // usable stack [stack, stack + stack_size); a PROT_NONE guard page below
  size_t stack_size = 0;
  void* asan_fake = nullptr;
  uint3 tid{};
  unsigned linear = 0, warp = 0, lane = 0;
  enum : uint8_t { Ready, Waiting, Done } state = Ready;
  bool started = false;
  Op wait_op = Op::none;
  int wait_variant = 0;
  std::source_location wait_loc;
  // cp.async: records of this thread; cp_groups holds the end index of each committed group
  std::vector<CpRec> cp;
  std::vector<size_t> cp_groups;
  size_t cp_head = 0, cp_group_head = 0;
};

struct LaneIO {
  uint32_t in[12];
  const void* ptr;
  int arg, width;
  uint32_t out[4];
};

struct WarpGroup {
  unsigned mask = 0, arrived = 0;
  Op op = Op::none;
  int variant = 0;
  std::source_location loc;
};

struct Warp {
  unsigned exist = 0, exited = 0;
  std::vector<WarpGroup> groups;  // pending collectives (disjoint masks)
  LaneIO io[32];
};

struct Ring {  // FIFO of fiber indices; each fiber is queued at most once
  std::vector<unsigned> buf;
  size_t head = 0, count = 0;
  void reset(size_t cap) { buf.assign(cap ? cap : 1, 0); head = count = 0; }
  void push(unsigned v) { buf[(head + count++) % buf.size()] = v; }
  bool pop(unsigned& v) {
    if (!count) return false;
    v = buf[head]; head = (head + 1) % buf.size(); --count;
    return true;
  }
  bool pop_at(size_t k, unsigned& v) {  // the k-th queued (k < count); the head takes its place
    if (!count) return false;
    std::swap(buf[(head + k) % buf.size()], buf[head]);
    return pop(v);
  }
};

struct FaultInfo {
  bool set = false;
  std::string kind, message, where;
  bool has_block = false, has_thread = false;
  uint3 block{}, thread{};
};

struct Stats {
  unsigned long long blocks = 0, threads = 0, switches = 0, collectives = 0, barriers = 0;
};

struct Runtime {
  std::mutex launch_mu;  // one launch at a time per module: shared memory is this thread's TLS
  Config cfg;
  FaultInfo fault;
  Stats stats;
  std::string error_json, stats_json;
  // current launch
  const char* kernel = "";
  void (*invoke)(void*) = nullptr;
  void* invoke_ctx = nullptr;
  dim3 grid, block;
  uint3 block_idx{};
  unsigned smem_bytes = 0;
  // current block
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  unsigned nthreads = 0, live = 0, done = 0;
  unsigned bar_arrived = 0, bar_count = 0, bar_or = 0, bar_and = 1, bar_result_count = 0, bar_result_or = 0,
           bar_result_and = 1;
  Ring ready0, ready;
  unsigned long long rng = 0;  // Schedule::random's state (splitmix64), reseeded per block
  bool aborting = false;
  // shared memory = this module's TLS block on the launching thread
  unsigned char* sh_lo = nullptr;
  unsigned char* sh_hi = nullptr;
  struct Region { unsigned char* p; size_t n; };
  std::vector<Region> dyn;
  size_t static_smem = 0;
  // scheduler context
  void* sched_sp = nullptr;
#if defined(KUMIKO_EMU_USE_UCONTEXT)
  ucontext_t sched_uc;
#endif
  void* sched_fake = nullptr;
  const void* main_stack = nullptr;
  size_t main_stack_size = 0;
};

inline Runtime rt;
inline Fiber* g_cur = nullptr;       // the running fiber (null in the scheduler)
inline thread_local char tls_anchor;  // forces this module's TLS block to exist on the launching thread

// -- formatting helpers ------------------------------------------------------------------------
inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}
inline std::string where(const std::source_location& loc) {
  const char* file = loc.file_name();
  if (!file || !*file) return "";
  return fmt("%s:%u", file, unsigned(loc.line()));
}
inline std::string dim_str(uint3 d) { return fmt("(%u,%u,%u)", d.x, d.y, d.z); }
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if ((unsigned char)c < 0x20) o += fmt("\\u%04x", c);
        else o += c;
    }
  }
  return o;
}
inline std::string ranges(const std::vector<unsigned>& v) {  // "0-31,64,70-71"
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += (j == i) ? fmt("%u", v[i]) : fmt("%u-%u", v[i], v[j]);
    i = j + 1;
  }
  return s;
}

// -- faults ------------------------------------------------------------------------------------
inline void record_fault(const char* kind, const std::string& msg, const Fiber* who,
                         const std::source_location* loc) {
  if (rt.fault.set) return;  // the first fault is the one worth reading
  rt.fault.set = true;
  rt.fault.kind = kind;
  rt.fault.message = msg;
  rt.fault.where = loc ? where(*loc) : "";
  rt.fault.has_block = true;
  rt.fault.block = rt.block_idx;
  rt.fault.has_thread = who != nullptr;
  if (who) rt.fault.thread = who->tid;
}
// Called on a fiber: record, then unwind this fiber; the scheduler unwinds the others.
[[noreturn]] inline void raise_fault(const char* kind, const std::string& msg, const Fiber* who,
                                     const std::source_location& loc) {
  record_fault(kind, msg, who, &loc);
  throw Abort{};
}
inline Fiber* cur(const char* what) {
  if (!g_cur) {
    std::fprintf(stderr, "kumiko-emu: %s called outside a kernel launch\n", what);
    std::abort();
  }
  return g_cur;
}

// -- shared memory -----------------------------------------------------------------------------
inline bool in_shared(const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  return c >= rt.sh_lo && c + n <= rt.sh_hi;
}
// "dynamic shared memory byte 1024" / "static shared memory byte 64": where a shared address points.
inline std::string smem_where(const void* p) {
  auto* c = static_cast<const unsigned char*>(p);
  for (const auto& d : rt.dyn)
    if (c >= d.p && c < d.p + d.n) return fmt("dynamic shared memory byte %zu", size_t(c - d.p));
  return fmt("static shared memory byte %zu", size_t(c - rt.sh_lo));
}
// Checks that [p, p+n) is shared memory of this block and aligned to `align`; names the culprit.
inline void check_shared(const void* p, size_t n, size_t align, const char* what, const Fiber* who,
                         const std::source_location& loc) {
  if (!in_shared(p, n))
    raise_fault("not_shared_memory", fmt("%s: address %p is not in shared memory", what, p), who, loc);
  if (reinterpret_cast<uintptr_t>(p) % align)
    raise_fault("misaligned", fmt("%s: shared address %p (%s) is not %zu-byte aligned", what, p,
                                  smem_where(p).c_str(), align), who, loc);
  for (const auto& d : rt.dyn) {
    auto* c = static_cast<const unsigned char*>(p);
    if (c >= d.p && c < d.p + d.n && c + n > d.p + rt.smem_bytes)
      raise_fault("dynamic_smem_overflow",
                  fmt("%s: bytes [%zu, %zu) of dynamic shared memory, but the launch gave %u bytes", what,
                      size_t(c - d.p), size_t(c - d.p) + n, rt.smem_bytes), who, loc);
  }
}

// -- TLS block discovery -----------------------------------------------------------------------
inline int find_tls_cb(struct dl_phdr_info* info, size_t, void* data) {
  auto* base = static_cast<const void*>(data);
  if (reinterpret_cast<const void*>(info->dlpi_addr) != base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_TLS && info->dlpi_tls_data) {
      rt.sh_lo = static_cast<unsigned char*>(info->dlpi_tls_data);
      rt.sh_hi = rt.sh_lo + info->dlpi_phdr[i].p_memsz;
    }
  }
  return 1;
}
__attribute__((noinline)) inline void locate_shared_memory() {
  *static_cast<volatile char*>(&tls_anchor) = 0;  // allocate the block on this thread
  Dl_info di;
  rt.sh_lo = rt.sh_hi = nullptr;
  if (dladdr(reinterpret_cast<void*>(&locate_shared_memory), &di) && di.dli_fbase)
    dl_iterate_phdr(find_tls_cb, di.dli_fbase);
  rt.dyn.clear();
  if (kumiko_emu_dynamic_smem)
    kumiko_emu_dynamic_smem([](void* p, size_t n) { rt.dyn.push_back({static_cast<unsigned char*>(p), n}); });
  size_t dyn_total = 0;
  for (const auto& d : rt.dyn) dyn_total += d.n;
  const size_t total = size_t(rt.sh_hi - rt.sh_lo);
  rt.static_smem = total > dyn_total + 1 ? total - dyn_total - 1 : 0;  // approximate: TLS padding
}
// 0xFF everywhere (an fp16/fp32 NaN), except the unused tail of the dynamic arrays.
inline void poison_shared() {
  if (!rt.sh_lo) return;
  std::vector<Runtime::Region> holes;
  for (const auto& d : rt.dyn) holes.push_back({d.p + rt.smem_bytes, d.n - rt.smem_bytes});
  std::sort(holes.begin(), holes.end(), [](auto& a, auto& b) { return a.p < b.p; });
  unsigned char* p = rt.sh_lo;
  for (const auto& h : holes) {
    if (h.p > p) std::memset(p, 0xFF, size_t(h.p - p));
    p = std::max(p, h.p + h.n);
  }
  if (rt.sh_hi > p) std::memset(p, 0xFF, size_t(rt.sh_hi - p));
}

// -- fibers ------------------------------------------------------------------------------------
inline void fiber_entry(Fiber* f);

// Every fiber's stack back to the OS once a launch is done. Kept across launches, the stacks of every
// emulator module loaded in a process (two mappings per thread of the largest block each ran) reached the
// kernel's mapping limit after a few hundred modules: "mmap fiber stack: Cannot allocate memory".
inline void release_stacks() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  for (Fiber& f : rt.fibers) {
    if (f.stack) munmap(f.stack - page, f.stack_size + page);
    f.stack = nullptr;
    f.stack_size = 0;
  }
}

inline void alloc_stack(Fiber& f, size_t bytes) {
  if (f.stack && f.stack_size == bytes) return;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  if (f.stack) munmap(f.stack - page, f.stack_size + page);
  void* m = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { std::perror("kumiko-emu: mmap fiber stack"); std::abort(); }
  mprotect(m, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  f.stack = static_cast<char*>(m) + page;
  f.stack_size = bytes;
}

#if defined(KUMIKO_EMU_USE_UCONTEXT)
inline void uc_entry(unsigned hi, unsigned lo) {
  fiber_entry(reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
#endif

inline void init_context(Fiber& f) {
#if defined(KUMIKO_EMU_USE_UCONTEXT)
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = f.stack_size;
  f.uc.uc_link = nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(&f);
  makecontext(&f.uc, reinterpret_cast<void (*)()>(uc_entry), 2, unsigned(p >> 32), unsigned(p));
#else
  // Initial frame popped by kumiko_emu_ctx_switch (low to high): x87 control word, mxcsr, r15, r14,
  // r13 (entry), r12 (fiber), rbx, rbp (0: ends frame-pointer walks), return -> trampoline.
  auto top = (reinterpret_cast<uintptr_t>(f.stack + f.stack_size) & ~uintptr_t(15)) - 16;
  auto* s = reinterpret_cast<uint64_t*>(top);
  s[-1] = reinterpret_cast<uint64_t>(&kumiko_emu_ctx_trampoline);
  s[-2] = 0;                                              // rbp
  s[-3] = 0;                                              // rbx
  s[-4] = reinterpret_cast<uint64_t>(&f);                 // r12
  s[-5] = reinterpret_cast<uint64_t>(&fiber_entry);       // r13
  s[-6] = 0;                                              // r14
  s[-7] = 0;                                              // r15
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  s[-9] = fpucw;
  s[-8] = mxcsr;
  f.sp = &s[-9];
#endif
}

// Switch from `from` (null: the scheduler) to `to` (null: the scheduler).  `from_dies` tells ASan
// to drop the fake stack of a fiber that will never run again.
inline void switch_to(Fiber* from, Fiber* to, bool from_dies = false) {
  g_cur = to;
  if (to) to->started = true;
  ++rt.stats.switches;
  void** fake = from ? &from->asan_fake : &rt.sched_fake;
#if defined(KUMIKO_EMU_ASAN)
  __sanitizer_start_switch_fiber(from_dies ? nullptr : fake, to ? to->stack : rt.main_stack,
                                 to ? to->stack_size : rt.main_stack_size);
#else
  (void)fake;
  (void)from_dies;
#endif
#if defined(KUMIKO_EMU_USE_UCONTEXT)
  swapcontext(from ? &from->uc : &rt.sched_uc, to ? &to->uc : &rt.sched_uc);
#else
  kumiko_emu_ctx_switch(from ? &from->sp : &rt.sched_sp, to ? to->sp : rt.sched_sp);
#endif
#if defined(KUMIKO_EMU_ASAN)
  __sanitizer_finish_switch_fiber(*fake, nullptr, nullptr);
#endif
}

inline void push_ready(Fiber& f) {
  f.state = Fiber::Ready;
  const bool ahead = (rt.cfg.schedule == Schedule::run_ahead && f.warp == 0) ||
                     (rt.cfg.schedule == Schedule::reversed && f.warp == (rt.nthreads - 1) / 32);
  if (ahead) rt.ready0.push(f.linear);
  else rt.ready.push(f.linear);
}
inline unsigned long long next_random() {  // splitmix64
  unsigned long long z = (rt.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline Fiber* pop_ready() {
  unsigned i;
  if (rt.ready0.pop(i)) return &rt.fibers[i];
  if (rt.cfg.schedule == Schedule::random && rt.ready.count > 1) {
    if (rt.ready.pop_at(size_t(next_random() % rt.ready.count), i)) return &rt.fibers[i];
  } else if (rt.ready.pop(i)) {
    return &rt.fibers[i];
  }
  return nullptr;
}
// Thread k of n in the order wake-ups are queued: descending for Schedule::reversed, else ascending.
inline unsigned wake_order(unsigned k, unsigned n) {
  return rt.cfg.schedule == Schedule::reversed ? n - 1 - k : k;
}

// The current fiber waits (its state is already set); run someone else.
inline void block_here(Fiber* f, Op op, int variant, const std::source_location& loc) {
  f->state = Fiber::Waiting;
  f->wait_op = op;
  f->wait_variant = variant;
  f->wait_loc = loc;
  switch_to(f, pop_ready());
  if (rt.aborting && std::uncaught_exceptions() == 0) throw Abort{};
}

inline void release_barrier();
inline void lane_exited(Fiber* f);
// SM90 state (cuda_emu_sm90.h): reset per block, deferred TMA landing, exit and deadlock checks
inline void sm90_reset_block();
inline bool sm90_progress();
inline void sm90_block_done();
inline std::string sm90_deadlock_detail();

[[noreturn]] inline void fiber_finish(Fiber* f) {
  f->state = Fiber::Done;
  ++rt.done;
  --rt.live;
  if (!rt.aborting && !rt.fault.set) {
    lane_exited(f);
    if (rt.bar_arrived && rt.bar_arrived == rt.live) release_barrier();
  }
  Fiber* next = (rt.aborting || rt.fault.set) ? nullptr : pop_ready();
  switch_to(f, next, /*from_dies=*/true);
  __builtin_unreachable();
}

inline void fiber_entry(Fiber* f) {
#if defined(KUMIKO_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  try {
    rt.invoke(rt.invoke_ctx);
  } catch (const Abort&) {
  } catch (const std::exception& e) {
    record_fault("exception", fmt("C++ exception escaped the kernel: %s", e.what()), f, nullptr);
  } catch (...) {
    record_fault("exception", "C++ exception escaped the kernel", f, nullptr);
  }
  fiber_finish(f);
}

// -- block barrier -----------------------------------------------------------------------------
inline void release_barrier() {
  rt.bar_result_count = rt.bar_count;
  rt.bar_result_or = rt.bar_or;
  rt.bar_result_and = rt.bar_and;
  rt.bar_arrived = rt.bar_count = rt.bar_or = 0;
  rt.bar_and = 1;
  ++rt.stats.barriers;
  for (unsigned k = 0; k < rt.nthreads; ++k) {
    Fiber& f = rt.fibers[wake_order(k, rt.nthreads)];
    if (f.state == Fiber::Waiting && f.wait_op == Op::syncthreads) push_ready(f);
  }
}

// __syncthreads and its reductions: completes when every live (not exited) thread has arrived.
inline void syncthreads(int pred, const std::source_location& loc) {
  Fiber* f = cur("__syncthreads");
  if (rt.aborting) return;
  __asm__ volatile("" ::: "memory");
  ++rt.bar_arrived;
  rt.bar_count += pred ? 1u : 0u;
  rt.bar_or |= pred ? 1u : 0u;
  rt.bar_and &= pred ? 1u : 0u;
  if (rt.bar_arrived == rt.live) release_barrier();
  else block_here(f, Op::syncthreads, 0, loc);
  __asm__ volatile("" ::: "memory");
}

// -- warp collectives --------------------------------------------------------------------------
inline void lane_exited(Fiber* f) {
  Warp& w = rt.warps[f->warp];
  w.exited |= 1u << f->lane;
  for (const auto& g : w.groups)
    if (g.mask & (1u << f->lane)) {
      record_fault("warp_collective",
                   fmt("lane %u of warp %u exited while lanes 0x%08x wait for it in %s", f->lane, f->warp,
                       g.arrived, op_name(g.op, g.variant)), f, &g.loc);
      return;
    }
}

// Each lane deposits its operands in w.io[lane] before calling; the last lane of `mask` to arrive
// runs `compute` (which fills w.io[l].out for every lane l of the mask) and wakes the others.
template <class F>
inline Warp& collective(Fiber* f, Op op, int variant, unsigned mask, bool whole_warp,
                        const std::source_location& loc, F&& compute) {
  Warp& w = rt.warps[f->warp];
  const unsigned bit = 1u << f->lane;
  const char* name = op_name(op, variant);
  if (whole_warp && w.exist != 0xffffffffu)
    raise_fault("partial_warp",
                fmt("%s needs all 32 lanes, but warp %u has lanes 0x%08x (blockDim not a multiple of 32)", name,
                    f->warp, w.exist), f, loc);
  if (!(mask & bit))
    raise_fault("warp_collective", fmt("%s called by lane %u, which is not in its mask 0x%08x", name, f->lane, mask),
                f, loc);
  if (mask & ~w.exist)
    raise_fault("warp_collective", fmt("%s mask 0x%08x names lanes that do not exist (warp %u has 0x%08x)", name,
                                       mask, f->warp, w.exist), f, loc);
  if (mask & w.exited)
    raise_fault("warp_collective", fmt("%s mask 0x%08x names lanes that exited (0x%08x)", name, mask,
                                       mask & w.exited), f, loc);
  WarpGroup* g = nullptr;
  for (auto& x : w.groups)
    if (x.mask & mask) { g = &x; break; }
  if (g && (g->mask != mask || g->op != op || g->variant != variant))
    raise_fault("divergent_collective",
                fmt("lane %u of warp %u reached %s (mask 0x%08x, %s) while lanes 0x%08x wait in %s (mask 0x%08x, %s)",
                    f->lane, f->warp, name, mask, where(loc).c_str(), g->arrived, op_name(g->op, g->variant), g->mask,
                    where(g->loc).c_str()), f, loc);
  if (!g) {
    w.groups.push_back(WarpGroup{mask, 0, op, variant, loc});
    g = &w.groups.back();
  }
  g->arrived |= bit;
  if (g->arrived != mask) {
    block_here(f, op, variant, loc);
    return w;
  }
  w.groups.erase(w.groups.begin() + (g - w.groups.data()));
  ++rt.stats.collectives;
  compute(w, mask);
  for (unsigned k = 0; k < 32; ++k) {
    const unsigned l = wake_order(k, 32);
    if ((mask & (1u << l)) && l != f->lane) push_ready(rt.fibers[f->warp * 32 + l]);
  }
  return w;
}

inline Fiber* lane_fiber(const Fiber* f, unsigned lane) { return &rt.fibers[f->warp * 32 + lane]; }

template <class T>
inline T shfl(Op op, unsigned mask, T var, int arg, int width, const std::source_location& loc) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type larger than 8 bytes");
  Fiber* f = cur(op_name(op));
  if (width <= 0 || width > 32 || (width & (width - 1)))
    raise_fault("warp_collective", fmt("%s width %d is not a power of two <= 32", op_name(op), width), f, loc);
  Warp& w0 = rt.warps[f->warp];
  std::memcpy(w0.io[f->lane].in, &var, sizeof(T));
  w0.io[f->lane].arg = arg;
  w0.io[f->lane].width = width;
  Warp& w = collective(f, op, 0, mask, false, loc, [&](Warp& w, unsigned m) {
    for (unsigned l = 0; l < 32; ++l) {
      if (!(m & (1u << l))) continue;
      const int a = w.io[l].arg, wd = w.io[l].width;
      const unsigned seg = l & ~unsigned(wd - 1), end = seg + unsigned(wd);
      unsigned src = l;
      switch (op) {
        case Op::shfl_idx: src = seg + (unsigned(a) & unsigned(wd - 1)); break;
        case Op::shfl_xor: src = l ^ unsigned(a); if (src >= end) src = l; break;
        case Op::shfl_up: src = (int(l) - a >= int(seg)) ? l - unsigned(a) : l; break;
        case Op::shfl_down: src = (l + unsigned(a) < end) ? l + unsigned(a) : l; break;
        default: break;
      }
      if (src > 31 || !(m & (1u << src)))
        raise_fault("warp_collective", fmt("%s: lane %u reads lane %u, which is not in the mask 0x%08x",
                                           op_name(op), l, src, m), lane_fiber(f, l), loc);
      std::memcpy(w.io[l].out, w.io[src].in, 8);
    }
  });
  T r;
  std::memcpy(&r, w.io[f->lane].out, sizeof(T));
  return r;
}

inline unsigned ballot(unsigned mask, int pred, const std::source_location& loc) {
  Fiber* f = cur("__ballot_sync");
  rt.warps[f->warp].io[f->lane].arg = pred != 0;
  Warp& w = collective(f, Op::ballot, 0, mask, false, loc, [&](Warp& w, unsigned m) {
    unsigned b = 0;
    for (unsigned l = 0; l < 32; ++l)
      if ((m & (1u << l)) && w.io[l].arg) b |= 1u << l;
    for (unsigned l = 0; l < 32; ++l)
      if (m & (1u << l)) w.io[l].out[0] = b;
  });
  return w.io[f->lane].out[0];
}

inline void syncwarp(unsigned mask, const std::source_location& loc) {
  Fiber* f = cur("__syncwarp");
  __asm__ volatile("" ::: "memory");
  collective(f, Op::syncwarp, 0, mask, false, loc, [](Warp&, unsigned) {});
  __asm__ volatile("" ::: "memory");
}

// -- cp.async (PTX ISA 9.7.9.25.3: cp.async / commit_group / wait_group) -------------------------
// Writes become visible to the issuing thread only at its wait_group; "deferred" mode copies them
// exactly then (so a read before the wait sees poison), "eager" mode copies at issue (so a missing
// barrier before a stage is overwritten shows up).  The source is read at issue in both modes, so
// AddressSanitizer points at the cp.async that reads out of bounds.
inline void land_group(Fiber* f) {
  const size_t end = f->cp_groups[f->cp_group_head++];
  for (size_t i = f->cp_head; i < end; ++i) std::memcpy(f->cp[i].dst, f->cp[i].data, f->cp[i].size);
  f->cp_head = end;
  if (f->cp_group_head == f->cp_groups.size() && f->cp_head == f->cp.size()) {
    f->cp.clear();
    f->cp_groups.clear();
    f->cp_head = f->cp_group_head = 0;
  }
}

inline void cp_async(unsigned cp_size, void* dst, const void* src, int src_bytes, const std::source_location& loc) {
  Fiber* f = cur("cp.async");
  if (rt.aborting) return;
  const char* name = cp_size == 16 ? "cp_async_16" : cp_size == 8 ? "cp_async_8" : "cp_async_4";
  check_shared(dst, cp_size, cp_size, fmt("%s destination", name).c_str(), f, loc);
  if (src_bytes < 0 || unsigned(src_bytes) > cp_size)
    raise_fault("cp_async", fmt("%s: src_bytes %d is not in [0, %u]", name, src_bytes, cp_size), f, loc);
  // The source must be a valid, aligned global address even when src_bytes is 0 (nothing is read then):
  // alignment and "not shared memory" are checked always; under ASan (the strict build) a source in no
  // live allocation is a fault too.
  if (reinterpret_cast<uintptr_t>(src) % cp_size)
    raise_fault("misaligned", fmt("%s: global source %p is not %u-byte aligned", name, src, cp_size), f, loc);
  if (in_shared(src, 1))
    raise_fault("cp_async", fmt("%s: source %p is shared memory, not global", name, src), f, loc);
#if defined(KUMIKO_EMU_ASAN)
  if (src_bytes == 0 && __asan_region_is_poisoned(const_cast<void*>(src), cp_size))
    raise_fault("cp_async", fmt("%s: src_bytes 0 with source %p outside any live allocation (the address "
                                "must be valid even when nothing is read)", name, src), f, loc);
#endif
  CpRec r;
  r.dst = static_cast<unsigned char*>(dst);
  r.size = cp_size;
  if (src_bytes > 0) std::memcpy(r.data, src, size_t(src_bytes));  // zero-fill the rest (src-size)
  std::memset(r.data + src_bytes, 0, cp_size - unsigned(src_bytes));
  if (rt.cfg.cp_async == CpAsyncMode::eager) std::memcpy(r.dst, r.data, cp_size);
  else f->cp.push_back(r);
}
inline void cp_async_commit() {
  Fiber* f = cur("cp.async.commit_group");
  if (rt.aborting) return;
  f->cp_groups.push_back(f->cp.size());  // an empty group is a group too
}
inline void cp_async_wait(int n) {
  Fiber* f = cur("cp.async.wait_group");
  if (rt.aborting) return;
  while (f->cp_groups.size() - f->cp_group_head > size_t(n)) land_group(f);
  __asm__ volatile("" ::: "memory");
}

// -- ldmatrix (PTX ISA 9.7.14.5.15 / 9.7.15.5.15, Figure "ldmatrix fragment layout for one 8x8
// matrix with 16-bit elements") ------------------------------------------------------------------
// Lanes 8i..8i+7 give the row addresses of matrix i (16 bytes each, 16-byte aligned).  Lane l
// receives, in register i, row l/4 elements 2(l%4) and 2(l%4)+1 of matrix i (low half first);
// with .trans, the matrix is read column-major: elements [2(l%4)][l/4] and [2(l%4)+1][l/4].
template <int NUM, bool TRANS>
inline void ldmatrix(uint32_t* d, const void* p, const std::source_location& loc) {
  static_assert(NUM == 1 || NUM == 2 || NUM == 4, "ldmatrix .num is x1, x2 or x4");
  const int variant = (NUM - 1) | (TRANS ? 4 : 0);
  Fiber* f = cur(op_name(Op::ldmatrix, variant));
  rt.warps[f->warp].io[f->lane].ptr = p;
  Warp& w = collective(f, Op::ldmatrix, variant, 0xffffffffu, true, loc, [&](Warp& w, unsigned) {
    uint16_t rows[NUM][8][8];
    for (int m = 0; m < NUM; ++m)
      for (int r = 0; r < 8; ++r) {
        const unsigned src_lane = unsigned(m * 8 + r);
        const void* a = w.io[src_lane].ptr;
        const char* name = op_name(Op::ldmatrix, variant);
        check_shared(a, 16, 16, fmt("%s row address of lane %u", name, src_lane).c_str(),
                     lane_fiber(f, src_lane), loc);
        std::memcpy(rows[m][r], a, 16);
        if (rt.cfg.poison_check)
          for (int e = 0; e < 8; ++e)
            if (rows[m][r][e] == 0xFFFFu)
              raise_fault("poisoned_read",
                          fmt("%s read never-written shared memory (0xFFFF poison) at %s (row address of "
                              "lane %u): a cp.async not yet waited for, a missing barrier, or an unfilled tile",
                              name, smem_where(static_cast<const unsigned char*>(a) + 2 * e).c_str(), src_lane),
                          lane_fiber(f, src_lane), loc);
      }
    for (unsigned l = 0; l < 32; ++l)
      for (int m = 0; m < NUM; ++m) {
        const unsigned r = l / 4, c = 2 * (l % 4);
        const uint16_t lo = TRANS ? rows[m][c][r] : rows[m][r][c];
        const uint16_t hi = TRANS ? rows[m][c + 1][r] : rows[m][r][c + 1];
        w.io[l].out[m] = uint32_t(lo) | (uint32_t(hi) << 16);
      }
  });
  for (int m = 0; m < NUM; ++m) d[m] = w.io[f->lane].out[m];
}

// -- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 -----------------------------
// PTX ISA 9.7.14.5.8 / 9.7.15.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type",
// with g = laneid >> 2, t = laneid % 4:
//   A (16x16, a0..a7 in 4 regs, low half first): row g for a0,a1,a4,a5, g+8 otherwise;
//                                                 col 2t+(i&1), +8 for i >= 4
//   B (16x8,  b0..b3 in 2 regs): row (k) 2t+(i&1), +8 for i >= 2; col (n) g
//   C/D (16x8, c0..c3 fp32):     row g, +8 for i >= 2; col 2t+(i&1)
// Products of two fp16/bf16 values are exact in double, so D is computed in double and rounded
// to fp32 once: deterministic and at least as accurate as the tensor core.
template <bool BF16>
inline void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                         const std::source_location& loc) {
  Fiber* f = cur(op_name(Op::mma, BF16));
  LaneIO& io = rt.warps[f->warp].io[f->lane];
  for (int i = 0; i < 4; ++i) io.in[i] = a[i];
  io.in[4] = b[0];
  io.in[5] = b[1];
  std::memcpy(&io.in[6], c, 16);
  Warp& w = collective(f, Op::mma, BF16, 0xffffffffu, true, loc, [&](Warp& w, unsigned) {
    auto dec = [](uint32_t reg, int hi) {
      const uint16_t h = uint16_t(hi ? reg >> 16 : reg & 0xffffu);
      return double(BF16 ? emu::fp::bf16_to_f32(h) : emu::fp::f16_to_f32(h));
    };
    double A[16][16], B[16][8], C[16][8];
    for (unsigned l = 0; l < 32; ++l) {
      const unsigned g = l >> 2, t = l & 3;
      const LaneIO& x = w.io[l];
      for (unsigned i = 0; i < 8; ++i) {
        const unsigned row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
        const unsigned col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        A[row][col] = dec(x.in[i / 2], int(i & 1));
      }
      for (unsigned i = 0; i < 4; ++i) {
        const unsigned k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
        B[k][g] = dec(x.in[4 + i / 2], int(i & 1));
      }
      for (unsigned i = 0; i < 4; ++i) {
        float cv;
        std::memcpy(&cv, &x.in[6 + i], 4);
        C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = cv;
      }
    }
    for (unsigned l = 0; l < 32; ++l) {
      const unsigned g = l >> 2, t = l & 3;
      for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        double s = 0.0;
        for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
        const float v = float(s + C[row][col]);
        std::memcpy(&w.io[l].out[i], &v, 4);
      }
    }
  });
  std::memcpy(d, w.io[f->lane].out, 16);
}

// -- launch ------------------------------------------------------------------------------------
inline void reset_block(uint3 bidx) {
  rt.block_idx = bidx;
  const unsigned n = rt.block.x * rt.block.y * rt.block.z;
  rt.nthreads = rt.live = n;
  rt.done = 0;
  rt.bar_arrived = rt.bar_count = rt.bar_or = 0;
  rt.bar_and = 1;
  rt.aborting = false;
  if (rt.fibers.size() < n) rt.fibers.resize(n);
  const unsigned nwarps = (n + 31) / 32;
  if (rt.warps.size() < nwarps) rt.warps.resize(nwarps);
  for (unsigned i = 0; i < nwarps; ++i) {
    Warp& w = rt.warps[i];
    const unsigned lanes = std::min(32u, n - i * 32);
    w.exist = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    w.exited = 0;
    w.groups.clear();
  }
  rt.ready0.reset(n);
  rt.ready.reset(n);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = rt.fibers[i];
    alloc_stack(f, rt.cfg.stack_bytes);
    f.linear = i;
    f.tid = uint3{i % rt.block.x, (i / rt.block.x) % rt.block.y, i / (rt.block.x * rt.block.y)};
    f.warp = i / 32;
    f.lane = i % 32;
    f.started = false;
    f.wait_op = Op::none;
    f.asan_fake = nullptr;
    f.cp.clear();
    f.cp_groups.clear();
    f.cp_head = f.cp_group_head = 0;
    init_context(f);
  }
  const unsigned long long block_linear = bidx.x + 0x10000ull * (bidx.y + 0x10000ull * bidx.z);
  rt.rng = rt.cfg.seed ^ (block_linear * 0xd1b54a32d192ed03ull);
  for (unsigned k = 0; k < n; ++k) push_ready(rt.fibers[wake_order(k, n)]);
  poison_shared();
  sm90_reset_block();
}

inline void deadlock_report() {
  // Group waiting threads by what they wait in and where.
  struct Key { Op op; int variant; std::string at; std::vector<unsigned> threads; };
  std::vector<Key> keys;
  std::vector<unsigned> exited;
  for (unsigned i = 0; i < rt.nthreads; ++i) {
    Fiber& f = rt.fibers[i];
    if (f.state == Fiber::Done) { exited.push_back(i); continue; }
    std::string at = where(f.wait_loc);
    auto it = std::find_if(keys.begin(), keys.end(), [&](const Key& k) {
      return k.op == f.wait_op && k.variant == f.wait_variant && k.at == at;
    });
    if (it == keys.end()) keys.push_back(Key{f.wait_op, f.wait_variant, at, {i}});
    else it->threads.push_back(i);
  }
  std::string msg = fmt("deadlock in block %s: no thread can make progress;", dim_str(rt.block_idx).c_str());
  for (const auto& k : keys)
    msg += fmt(" threads %s wait in %s%s%s;", ranges(k.threads).c_str(), op_name(k.op, k.variant),
               k.at.empty() ? "" : " at ", k.at.c_str());
  if (!exited.empty()) msg += fmt(" threads %s exited;", ranges(exited).c_str());
  for (unsigned wi = 0; wi < (rt.nthreads + 31) / 32; ++wi)
    for (const auto& g : rt.warps[wi].groups)
      msg += fmt(" warp %u: %s (mask 0x%08x) misses lanes 0x%08x;", wi, op_name(g.op, g.variant), g.mask,
                 g.mask & ~g.arrived);
  msg += sm90_deadlock_detail();
  msg.pop_back();
  record_fault("deadlock", msg, nullptr, nullptr);
}

inline void abort_block() {
  rt.aborting = true;
  for (unsigned i = 0; i < rt.nthreads; ++i) {
    Fiber& f = rt.fibers[i];
    if (f.state == Fiber::Done) continue;
    if (!f.started) { f.state = Fiber::Done; continue; }
    switch_to(nullptr, &f);  // it throws Abort where it waits, unwinds, and comes back
  }
  rt.aborting = false;
}

// The bytes of each dynamic shared array past the launch's size stay 0xFF (set once per launch;
// under ASan they are poisoned instead, which reports the access itself): a change means a plain
// store went past the dynamic shared memory the launch asked for.
inline void check_dynamic_tail() {
#if !defined(KUMIKO_EMU_ASAN)
  for (const auto& d : rt.dyn) {
    size_t i = rt.smem_bytes;
    for (uint64_t w; i + 8 <= d.n; i += 8) {
      std::memcpy(&w, d.p + i, 8);
      if (w != ~uint64_t(0)) break;
    }
    while (i < d.n && d.p[i] == 0xFF) ++i;
    if (i == d.n) continue;
    size_t j = d.n;
    while (j > i && d.p[j - 1] == 0xFF) --j;
    record_fault("dynamic_smem_overflow",
                 fmt("a thread of block %s stored to bytes [%zu, %zu) of dynamic shared memory, past the %u bytes "
                     "the launch gave", dim_str(rt.block_idx).c_str(), i, j, rt.smem_bytes), nullptr, nullptr);
    return;
  }
#endif
}

inline bool run_block(uint3 bidx) {
  reset_block(bidx);
  ++rt.stats.blocks;
  rt.stats.threads += rt.nthreads;
  for (;;) {
    Fiber* next = pop_ready();
    if (!next && !rt.fault.set && sm90_progress()) continue;  // deferred TMA loads land when nothing can run
    if (!next || rt.fault.set) break;
    switch_to(nullptr, next);
  }
  if (!rt.fault.set && rt.done != rt.nthreads) deadlock_report();
  if (!rt.fault.set) sm90_block_done();
  if (!rt.fault.set) check_dynamic_tail();
  if (rt.fault.set) {
    abort_block();
    return false;
  }
  return true;
}

inline void set_error_json() {
  const FaultInfo& e = rt.fault;
  std::string s = "{\"kind\":\"" + json_escape(e.kind) + "\",\"kernel\":\"" + json_escape(rt.kernel) + "\"";
  s += e.has_block ? fmt(",\"block\":[%u,%u,%u]", e.block.x, e.block.y, e.block.z) : ",\"block\":null";
  s += e.has_thread ? fmt(",\"thread\":[%u,%u,%u]", e.thread.x, e.thread.y, e.thread.z) : ",\"thread\":null";
  s += ",\"where\":\"" + json_escape(e.where) + "\",\"message\":\"" + json_escape(e.message) + "\"}";
  rt.error_json = s;
}

inline int launch_erased(const char* name, dim3 grid, dim3 block, unsigned smem, size_t nargs, void** args,
                         void (*invoke)(void*), void* ctx) {
  std::lock_guard<std::mutex> lock(rt.launch_mu);
  rt.fault = FaultInfo{};
  rt.error_json.clear();
  rt.stats = Stats{};
  rt.kernel = name;
  rt.grid = grid;
  rt.block = block;
  rt.smem_bytes = smem;
  rt.invoke = invoke;
  rt.invoke_ctx = ctx;
  locate_shared_memory();
  auto bad = [&](const std::string& why) {
    rt.fault.set = true;
    rt.fault.kind = "launch_config";
    rt.fault.message = why;
    set_error_json();
    return 2;
  };
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    return bad(fmt("grid %s: every dimension must be >= 1 (x < 2^31, y and z <= 65535)", dim_str(grid).c_str()));
  if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 || nthreads > 1024)
    return bad(fmt("block %s: at most 1024 threads (x, y <= 1024, z <= 64), each dimension >= 1",
                   dim_str(block).c_str()));
  if (nargs && !args) return bad("kernel has parameters but args is null");
  if (smem > KUMIKO_EMU_MAX_DYNAMIC_SMEM || size_t(smem) + rt.static_smem > rt.cfg.max_smem)
    return bad(fmt("shared memory: %u dynamic + ~%zu static bytes exceeds the per-block limit of %u bytes", smem,
                   rt.static_smem, rt.cfg.max_smem));
#if defined(KUMIKO_EMU_ASAN)
  for (const auto& d : rt.dyn) __asan_poison_memory_region(d.p + smem, d.n - smem);
#else
  for (const auto& d : rt.dyn) std::memset(d.p + smem, 0xFF, d.n - smem);
#endif
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr;
    size_t size;
    pthread_attr_getstack(&attr, &addr, &size);
    rt.main_stack = addr;
    rt.main_stack_size = size;
    pthread_attr_destroy(&attr);
  }
  bool ok = true;
  for (unsigned z = 0; z < grid.z && ok; ++z)
    for (unsigned y = 0; y < grid.y && ok; ++y)
      for (unsigned x = 0; x < grid.x && ok; ++x) ok = run_block(uint3{x, y, z});
  g_cur = nullptr;
  release_stacks();
#if defined(KUMIKO_EMU_ASAN)
  for (const auto& d : rt.dyn) __asan_unpoison_memory_region(d.p, d.n);
#endif
  rt.stats_json = fmt("{\"blocks\":%llu,\"threads\":%llu,\"switches\":%llu,\"collectives\":%llu,\"barriers\":%llu}",
                      rt.stats.blocks, rt.stats.threads, rt.stats.switches, rt.stats.collectives, rt.stats.barriers);
  if (!ok) { set_error_json(); return 1; }
  return 0;
}

template <class... P, size_t... I>
inline void call_kernel(void (*k)(P...), void** args, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<P>*>(args[I])...);  // each thread gets its own copy
}

// Runs kernel `k` over the grid; args[i] points at the value of parameter i (cuLaunchKernel's
// kernelParams convention).  Returns 0, 1 (a fault in the kernel) or 2 (invalid launch).
template <class... P>
inline int launch(const char* name, void (*k)(P...), dim3 grid, dim3 block, unsigned smem, void** args) {
  struct Ctx { void (*k)(P...); void** args; } ctx{k, args};
  return launch_erased(name, grid, block, smem, sizeof...(P), args,
                       [](void* c) {
                         auto* x = static_cast<Ctx*>(c);
                         call_kernel(x->k, x->args, std::index_sequence_for<P...>{});
                       },
                       &ctx);
}

#if defined(KUMIKO_EMU_ASAN)
// When AddressSanitizer reports, say which CUDA thread was running before the process dies.
inline void asan_death_callback() {
  if (g_cur)
    std::fprintf(stderr, "kumiko-emu: AddressSanitizer fault in kernel %s, block %s, thread %s\n", rt.kernel,
                 dim_str(rt.block_idx).c_str(), dim_str(g_cur->tid).c_str());
}
__attribute__((constructor)) inline void install_asan_callback() {
  __sanitizer_set_death_callback(asan_death_callback);
}
#endif

}  // namespace emu

// The x86-64 context switch: callee-saved registers, mxcsr and the x87 control word (SysV ABI).
#if !defined(KUMIKO_EMU_USE_UCONTEXT)
__asm__(R"(
  .text
  .p2align 4
  .weak kumiko_emu_ctx_switch
  .hidden kumiko_emu_ctx_switch
  .type kumiko_emu_ctx_switch, @function
kumiko_emu_ctx_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size kumiko_emu_ctx_switch, .-kumiko_emu_ctx_switch

  .p2align 4
  .weak kumiko_emu_ctx_trampoline
  .hidden kumiko_emu_ctx_trampoline
  .type kumiko_emu_ctx_trampoline, @function
kumiko_emu_ctx_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size kumiko_emu_ctx_trampoline, .-kumiko_emu_ctx_trampoline
)");
#endif

#include "cuda_emu_sm90.h"

// ------------------------------------------------------------------------------------------------
// 6. CUDA built-ins seen by kernel code
// ------------------------------------------------------------------------------------------------
#define threadIdx (static_cast<const uint3&>(::emu::g_cur->tid))
#define blockIdx (static_cast<const uint3&>(::emu::rt.block_idx))
#define blockDim (static_cast<const dim3&>(::emu::rt.block))
#define gridDim (static_cast<const dim3&>(::emu::rt.grid))
constexpr int warpSize = 32;

inline void __syncthreads(std::source_location loc = std::source_location::current()) { emu::syncthreads(1, loc); }
inline int __syncthreads_count(int pred, std::source_location loc = std::source_location::current()) {
  emu::syncthreads(pred, loc);
  return int(emu::rt.bar_result_count);
}
inline int __syncthreads_or(int pred, std::source_location loc = std::source_location::current()) {
  emu::syncthreads(pred, loc);
  return int(emu::rt.bar_result_or);
}
inline int __syncthreads_and(int pred, std::source_location loc = std::source_location::current()) {
  emu::syncthreads(pred, loc);
  return int(emu::rt.bar_result_and);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location loc = std::source_location::current()) {
  emu::syncwarp(mask, loc);
}
inline unsigned __activemask() {
  emu::Fiber* f = emu::cur("__activemask");
  const emu::Warp& w = emu::rt.warps[f->warp];
  return w.exist & ~w.exited;
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src, int width = 32,
                     std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::Op::shfl_idx, mask, var, src, width, loc);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::Op::shfl_xor, mask, var, lane_mask, width, loc);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::Op::shfl_up, mask, var, int(delta), width, loc);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::Op::shfl_down, mask, var, int(delta), width, loc);
}
inline unsigned __ballot_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return emu::ballot(mask, pred, loc);
}
inline int __any_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return emu::ballot(mask, pred, loc) != 0;
}
inline int __all_sync(unsigned mask, int pred, std::source_location loc = std::source_location::current()) {
  return emu::ballot(mask, pred, loc) == mask;
}

// ------------------------------------------------------------------------------------------------
// 7. The PTX-level operations behind kumiko_cuda.cuh's names (see that header for the contract)
// ------------------------------------------------------------------------------------------------
namespace emu {
namespace ptx {
using SL = std::source_location;
inline void cp_async_16(void* smem, const void* gmem, int src_bytes = 16, SL loc = SL::current()) {
  emu::cp_async(16, smem, gmem, src_bytes, loc);
}
inline void cp_async_8(void* smem, const void* gmem, int src_bytes = 8, SL loc = SL::current()) {
  emu::cp_async(8, smem, gmem, src_bytes, loc);
}
inline void cp_async_4(void* smem, const void* gmem, int src_bytes = 4, SL loc = SL::current()) {
  emu::cp_async(4, smem, gmem, src_bytes, loc);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group N needs N >= 0");
  emu::cp_async_wait(N);
}
inline void cp_async_wait_all() {
  emu::cp_async_commit();
  emu::cp_async_wait(0);
}
inline void ldmatrix_x1(uint32_t (&d)[1], const void* p, SL loc = SL::current()) { emu::ldmatrix<1, false>(d, p, loc); }
inline void ldmatrix_x2(uint32_t (&d)[2], const void* p, SL loc = SL::current()) { emu::ldmatrix<2, false>(d, p, loc); }
inline void ldmatrix_x4(uint32_t (&d)[4], const void* p, SL loc = SL::current()) { emu::ldmatrix<4, false>(d, p, loc); }
inline void ldmatrix_x1_trans(uint32_t (&d)[1], const void* p, SL loc = SL::current()) {
  emu::ldmatrix<1, true>(d, p, loc);
}
inline void ldmatrix_x2_trans(uint32_t (&d)[2], const void* p, SL loc = SL::current()) {
  emu::ldmatrix<2, true>(d, p, loc);
}
inline void ldmatrix_x4_trans(uint32_t (&d)[4], const void* p, SL loc = SL::current()) {
  emu::ldmatrix<4, true>(d, p, loc);
}
inline void mma_m16n8k16_f16f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                                SL loc = SL::current()) {
  emu::mma_m16n8k16<false>(d, a, b, c, loc);
}
inline void mma_m16n8k16_bf16f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                                 SL loc = SL::current()) {
  emu::mma_m16n8k16<true>(d, a, b, c, loc);
}
inline unsigned lane_id() { return emu::cur("lane_id")->lane; }  // %laneid
// st.shared.v4.b32: the destination must be this block's shared memory, 16-byte aligned
inline void st_shared_16(void* smem, uint32_t a, uint32_t b, uint32_t c, uint32_t d, SL loc = SL::current()) {
  Fiber* f = emu::cur("st.shared.v4.b32");
  if (emu::rt.aborting) return;
  emu::check_shared(smem, 16, 16, "st_shared_16 destination", f, loc);
  const uint32_t v[4] = {a, b, c, d};
  std::memcpy(smem, v, 16);
}
}  // namespace ptx
}  // namespace emu

// ------------------------------------------------------------------------------------------------
// 8. The C ABI the Python runner (kumiko/runtime/emu.py) calls
// ------------------------------------------------------------------------------------------------
extern "C" __attribute__((visibility("default"), used)) inline int kumiko_emu_abi_version(void) {
  return KUMIKO_EMU_ABI_VERSION;
}
// cp_async: 0 deferred, 1 eager; schedule: 0 round-robin, 1 run-ahead, 2 reversed, 3 random (seeded by
// `seed`); stack_bytes/max_smem: 0 keeps. Returns -1 for an unknown schedule.
extern "C" __attribute__((visibility("default"), used)) inline int kumiko_emu_configure(
    int cp_async, int schedule, int poison_check, unsigned long long stack_bytes, unsigned max_smem,
    unsigned long long seed) {
  std::lock_guard<std::mutex> lock(emu::rt.launch_mu);
  if (schedule < 0 || schedule > 3) return -1;
  emu::rt.cfg.cp_async = cp_async ? emu::CpAsyncMode::eager : emu::CpAsyncMode::deferred;
  emu::rt.cfg.schedule = emu::Schedule(schedule);
  emu::rt.cfg.seed = seed;
  emu::rt.cfg.poison_check = poison_check != 0;
  if (stack_bytes) emu::rt.cfg.stack_bytes = size_t(stack_bytes);
  if (max_smem) emu::rt.cfg.max_smem = max_smem;
  return 0;
}
// JSON of the last launch's fault ({"kind","kernel","block","thread","where","message"}), or "".
extern "C" __attribute__((visibility("default"), used)) inline const char* kumiko_emu_last_error(void) {
  return emu::rt.error_json.c_str();
}
// JSON counters of the last launch (blocks, threads, context switches, collectives, barriers).
extern "C" __attribute__((visibility("default"), used)) inline const char* kumiko_emu_last_stats(void) {
  return emu::rt.stats_json.c_str();
}

#endif  // KUMIKO_CUDA_EMU_H
