// kumiko_cuda.cuh — every PTX instruction kumiko's generated CUDA code uses, behind small device
// functions, plus the launch ABI (KUMIKO_ENTRY).  Generated code calls only these names, so the
// same source runs on a GPU (nvcc / NVRTC: inline PTX below) and in the CUDA emulator
// (g++ -DKUMIKO_EMU: the names resolve to cuda_emu.h's implementations).  See docs/emulator.md.
//
// API (all __device__, per thread unless marked "warp": those must be reached by all 32 lanes):
//   cp_async_16(smem, gmem, src_bytes=16)   cp.async.cg 16 B; bytes past src_bytes are zero-filled,
//                                           src_bytes = 0 reads nothing (a predicated-off load)
//   cp_async_8 / cp_async_4(smem, gmem, src_bytes)   cp.async.ca 8 / 4 B, same zero-fill rule
//   cp_async_commit()                       cp.async.commit_group
//   cp_async_wait<N>()                      cp.async.wait_group N (all but the N newest groups done)
//   cp_async_wait_all()                     cp.async.wait_all
//   ldmatrix_x1/x2/x4[_trans](r, smem)      warp: ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
//   mma_m16n8k16_f16f32(d, a, b, c)         warp: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
//   mma_m16n8k16_bf16f32(d, a, b, c)        warp: same with .bf16 inputs
//   shfl_xor_f32 / shfl_sync_f32 / shfl_down_f32 / shfl_up_f32(v, lane, mask)   warp shuffles
//   warp_sum_f32 / warp_max_f32(v)          warp: butterfly reductions (every lane gets the result)
//   exp2_ftz(x)                             ex2.approx.ftz.f32 (a softmax's 2^x; subnormal results are 0)
//   pack_half2 / pack_bfloat162(lo, hi) -> uint32_t; unpack_half2 / unpack_bfloat162(u) -> float2
//   st_global_v2(p, lo, hi)                 one store of two adjacent uint16_t (b32) or floats (v2.f32)
//   ld_global_cg(p) -> float                ld.global.cg: another CTA's fenced store, read past L1
//   st_shared_16(smem, a, b, c, d)          st.shared.v4.b32: 16 bytes (a at the lowest address), 16-byte aligned
//   lane_id(), warp_id()
//   SM90 (sm_90a): mbarrier, TMA, bulk groups, fence.proxy.async, wgmma, setmaxnreg - the list is in
//   kumiko_cuda_sm90.cuh; wgmma_desc(smem, lbo, sbo, swizzle) builds a wgmma matrix descriptor.
// Fragment layouts are the PTX ISA's (see cuda_emu.h next to each emulation for the formulas).
#ifndef KUMIKO_CUDA_CUH
#define KUMIKO_CUDA_CUH

#if defined(KUMIKO_EMU)
// ---------------------------------------------------------------- the emulator (g++ -std=c++20)
#include "cuda_emu.h"
using emu::ptx::cp_async_16;
using emu::ptx::cp_async_8;
using emu::ptx::cp_async_4;
using emu::ptx::cp_async_commit;
using emu::ptx::cp_async_wait;
using emu::ptx::cp_async_wait_all;
using emu::ptx::ldmatrix_x1;
using emu::ptx::ldmatrix_x2;
using emu::ptx::ldmatrix_x4;
using emu::ptx::ldmatrix_x1_trans;
using emu::ptx::ldmatrix_x2_trans;
using emu::ptx::ldmatrix_x4_trans;
using emu::ptx::mma_m16n8k16_f16f32;
using emu::ptx::mma_m16n8k16_bf16f32;
using emu::ptx::lane_id;
using emu::ptx::st_shared_16;
// SM90 (kumiko_cuda_sm90.cuh has the API)
using emu::ptx::smem_u32;
using emu::ptx::mbar_init;
using emu::ptx::mbar_arrive;
using emu::ptx::mbar_arrive_expect_tx;
using emu::ptx::mbar_wait;
using emu::ptx::fence_proxy_async;
using emu::ptx::fence_mbarrier_init;
using emu::ptx::tma_load_1d;
using emu::ptx::tma_load_2d;
using emu::ptx::tma_load_3d;
using emu::ptx::tma_load_4d;
using emu::ptx::tma_load_5d;
using emu::ptx::tma_store_1d;
using emu::ptx::tma_store_2d;
using emu::ptx::tma_store_3d;
using emu::ptx::tma_store_4d;
using emu::ptx::tma_store_5d;
using emu::ptx::bulk_commit;
using emu::ptx::bulk_wait;
using emu::ptx::bulk_wait_read;
using emu::ptx::wgmma_fence;
using emu::ptx::wgmma_commit;
using emu::ptx::wgmma_wait;
using emu::ptx::wgmma_fence_operand;
using emu::ptx::wgmma_ss;
using emu::ptx::wgmma_rs;
using emu::ptx::setmaxnreg_inc;
using emu::ptx::setmaxnreg_dec;

#elif defined(__CUDACC__)
// ---------------------------------------------------------------- a GPU (nvcc or NVRTC, sm_80+)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if defined(__CUDACC_RTC__)
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif

__device__ __forceinline__ unsigned kumiko_smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// PTX ISA "cp.async": cp-size 16 must use .cg; src-size < cp-size zero-fills the rest.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kumiko_smem_u32(smem)), "l"(gmem),
               "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem, int src_bytes = 8) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(kumiko_smem_u32(smem)), "l"(gmem),
               "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes = 4) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(kumiko_smem_u32(smem)), "l"(gmem),
               "r"(src_bytes) : "memory");
}
// st.shared.v4.b32: four 32-bit words to 16-byte-aligned shared memory in one access (STS.128)
__device__ __forceinline__ void st_shared_16(void* smem, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(kumiko_smem_u32(smem)), "r"(a), "r"(b), "r"(c),
               "r"(d) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&d)[1], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(kumiko_smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&d)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(d[0]), "=r"(d[1])
               : "r"(kumiko_smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(kumiko_smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&d)[1], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(d[0])
               : "r"(kumiko_smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&d)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(d[0]), "=r"(d[1])
               : "r"(kumiko_smem_u32(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&d)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(kumiko_smem_u32(p)) : "memory");
}
__device__ __forceinline__ void mma_m16n8k16_f16f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                    const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_bf16f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                     const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}
#include "kumiko_cuda_sm90.cuh"
#else
#error "kumiko_cuda.cuh: compile with nvcc/NVRTC, or with g++ -DKUMIKO_EMU (the CUDA emulator)"
#endif

// ---------------------------------------------------------------- shared by both paths
#if !defined(KUMIKO_EMU)
// %laneid is the lane in the warp (linear thread index % 32, also for 2-D/3-D blocks).
__device__ __forceinline__ unsigned lane_id() {
  unsigned r;
  asm("mov.u32 %0, %%laneid;" : "=r"(r));
  return r;
}
#endif
// The warp's index in the block (not %warpid, which names a hardware slot and may change).
__device__ __forceinline__ unsigned warp_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5;
}
__device__ __forceinline__ float shfl_xor_f32(float v, int lane_mask, unsigned mask = 0xffffffffu) {
  return __shfl_xor_sync(mask, v, lane_mask);
}
__device__ __forceinline__ float shfl_sync_f32(float v, int src_lane, unsigned mask = 0xffffffffu) {
  return __shfl_sync(mask, v, src_lane);
}
__device__ __forceinline__ float shfl_down_f32(float v, unsigned delta, unsigned mask = 0xffffffffu) {
  return __shfl_down_sync(mask, v, delta);
}
__device__ __forceinline__ float shfl_up_f32(float v, unsigned delta, unsigned mask = 0xffffffffu) {
  return __shfl_up_sync(mask, v, delta);
}
// 2^x for a softmax: ex2.approx.ftz.f32 on the GPU (exp2f's non-ftz form wraps MUFU.EX2 in a range test and two
// multiplies for subnormal results); the emulator computes exp2f and flushes a subnormal result to +0 alike.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(KUMIKO_EMU)
  const float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.0f : r;
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}
__device__ __forceinline__ float warp_sum_f32(float v) {
  for (int o = 16; o > 0; o >>= 1) v += shfl_xor_f32(v, o);
  return v;
}
__device__ __forceinline__ float warp_max_f32(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, shfl_xor_f32(v, o));
  return v;
}
// Two floats -> one 32-bit register of two fp16 / bf16 (lo in bits 0-15), the mma operand format.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return static_cast<uint32_t>(__half_as_ushort(h.x)) | (static_cast<uint32_t>(__half_as_ushort(h.y)) << 16);
}
__device__ __forceinline__ uint32_t pack_bfloat162(float lo, float hi) {
  const __nv_bfloat16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(l)) | (static_cast<uint32_t>(__bfloat16_as_ushort(h)) << 16);
}
__device__ __forceinline__ float2 unpack_half2(uint32_t u) {
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(u >> 16))));
}
__device__ __forceinline__ float2 unpack_bfloat162(uint32_t u) {
  return make_float2(__bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(u & 0xffffu))),
                     __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(u >> 16))));
}
// st.global of two adjacent elements as one access (st.global.b32 for two 16-bit values, lo at the lower
// address; st.global.v2.f32 for two floats). p must be aligned to the pair (4 / 8 bytes): the caller checks.
__device__ __forceinline__ void st_global_v2(uint16_t* p, uint16_t lo, uint16_t hi) {
  const uint32_t v = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
#if defined(KUMIKO_EMU)
  __builtin_memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}
__device__ __forceinline__ void st_global_v2(float* p, float lo, float hi) {
#if defined(KUMIKO_EMU)
  const float v[2] = {lo, hi};
  __builtin_memcpy(p, v, 8);
#else
  *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
#endif
}
// ld.global.cg: a float another CTA stored (and fenced) in this launch, read from L2, past this SM's L1.
__device__ __forceinline__ float ld_global_cg(const float* p) {
#if defined(KUMIKO_EMU)
  return *p;
#else
  return __ldcg(p);
#endif
}

#if defined(KUMIKO_EMU) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// A wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 the start address >> 4, 16-29 the
// leading dimension byte offset >> 4, 32-45 the stride dimension byte offset >> 4, 49-51 the matrix base offset
// (0: operands start at the swizzle pattern's repeat), 62-63 the swizzle (0 none, 1 128B, 2 64B, 3 32B).
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, unsigned lbo, unsigned sbo, unsigned swizzle) {
  return uint64_t((smem_u32(smem) & 0x3FFFFu) >> 4) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(swizzle & 3u) << 62);
}
#endif

// ---------------------------------------------------------------- the launch ABI
// A generated .cu defines each kernel as `extern "C" __global__ void NAME(params...)` (parameters:
// pointers or trivially copyable scalars) and follows it with `KUMIKO_ENTRY(NAME)`, which exports
//   extern "C" int kumiko_launch_NAME(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
//                                     unsigned bz, unsigned smem_bytes, void** args, void* stream);
//   extern "C" const char* kumiko_signature_NAME(void);   // e.g. "cptr:f16,cptr:f16,ptr:f16,i32"
// args[i] points at the value of parameter i (cuLaunchKernel's kernelParams).  The launch returns 0,
// or on the emulator 1 (fault in the kernel) / 2 (invalid launch) with the details in
// kumiko_emu_last_error(); on a GPU the cudaError_t.  Under NVRTC the kernels are found by their
// extern "C" names and launched with cuLaunchKernel, so KUMIKO_ENTRY expands to nothing.
#if !defined(__CUDACC_RTC__)
#include <cstring>
#include <type_traits>
namespace kumiko_abi {
template <class T>
constexpr const char* scalar_code() {
  using U = typename std::remove_cv<T>::type;
  if constexpr (std::is_same<U, bool>::value) return "bool";
  else if constexpr (std::is_same<U, __half>::value) return "f16";
  else if constexpr (std::is_same<U, __nv_bfloat16>::value) return "bf16";
  else if constexpr (std::is_same<U, float>::value) return "f32";
  else if constexpr (std::is_same<U, double>::value) return "f64";
  else if constexpr (std::is_void<U>::value) return "void";
  else if constexpr (std::is_integral<U>::value) {
    constexpr bool s = std::is_signed<U>::value;
    if constexpr (sizeof(U) == 1) return s ? "i8" : "u8";
    else if constexpr (sizeof(U) == 2) return s ? "i16" : "u16";
    else if constexpr (sizeof(U) == 4) return s ? "i32" : "u32";
    else return s ? "i64" : "u64";
  } else return nullptr;
}
template <class T>
inline void append_code(char* buf) {
  if (buf[0]) std::strcat(buf, ",");
  const char* code = nullptr;
  size_t size = 0;
  if constexpr (std::is_pointer<T>::value) {
    using E = typename std::remove_pointer<T>::type;
    std::strcat(buf, std::is_const<E>::value ? "cptr:" : "ptr:");
    code = scalar_code<E>();
    if constexpr (!std::is_void<E>::value) size = sizeof(E);
  } else {
    code = scalar_code<T>();
    size = sizeof(T);
  }
  if (code) std::strcat(buf, code);
  else {
    char raw[32];
    std::strcpy(raw, "raw");
    char digits[24];
    int n = 0;
    do { digits[n++] = char('0' + size % 10); size /= 10; } while (size);
    char* p = raw + 3;
    while (n) *p++ = digits[--n];
    *p = 0;
    std::strcat(buf, raw);
  }
}
template <class... P>
inline const char* signature(void (*)(P...)) {
  static char buf[64 + 24 * sizeof...(P)] = {0};
  if (!buf[0]) (append_code<P>(buf), ...);
  return buf;
}
}  // namespace kumiko_abi
#endif

#if defined(KUMIKO_EMU)
#define KUMIKO_ENTRY(NAME)                                                                         \
  extern "C" __attribute__((visibility("default"))) int kumiko_launch_##NAME(                     \
      unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, \
      void** args, void* stream) {                                                                 \
    (void)stream;                                                                                  \
    return ::emu::launch(#NAME, &NAME, dim3(gx, gy, gz), dim3(bx, by, bz), smem, args);            \
  }                                                                                                \
  extern "C" __attribute__((visibility("default"))) const char* kumiko_signature_##NAME(void) {    \
    return ::kumiko_abi::signature(&NAME);                                                         \
  }
#elif defined(__CUDACC_RTC__)
#define KUMIKO_ENTRY(NAME)
#else
#define KUMIKO_ENTRY(NAME)                                                                         \
  extern "C" int kumiko_launch_##NAME(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                                      unsigned bz, unsigned smem, void** args, void* stream) {     \
    if (smem > 0u) { /* the default limit is 48 KiB less the kernel's static shared memory */    \
      cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(&NAME),                   \
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); \
      if (e != cudaSuccess) return int(e);                                                         \
    }                                                                                              \
    return int(cudaLaunchKernel(reinterpret_cast<const void*>(&NAME), dim3(gx, gy, gz), dim3(bx, by, bz), \
                                args, size_t(smem), static_cast<cudaStream_t>(stream)));           \
  }                                                                                                \
  extern "C" const char* kumiko_signature_##NAME(void) { return ::kumiko_abi::signature(&NAME); }
#endif

#endif  // KUMIKO_CUDA_CUH
