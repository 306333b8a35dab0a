// kumiko_cuda_sm90.cuh — the SM90 (Hopper, sm_90a) PTX behind kumiko_cuda.cuh's SM90 API, for nvcc and
// NVRTC.  Included by kumiko_cuda.cuh on the GPU path only (the emulator maps the same names to
// cuda_emu_sm90.h).  Device code for an arch below sm_90 sees none of it.
//
// API (all __device__; "warpgroup": all 128 threads of the warpgroup execute it, converged):
//   mbar_init(bar, count)                  mbarrier.init.shared::cta.b64
//   mbar_arrive(bar)                       mbarrier.arrive.shared::cta.b64
//   mbar_arrive_expect_tx(bar, bytes)      mbarrier.arrive.expect_tx.shared::cta.b64 (announce TMA bytes, arrive)
//   mbar_wait(bar, parity)                 mbarrier.try_wait.parity.shared::cta.b64 until the phase of that parity completed
//   fence_proxy_async()                    fence.proxy.async.shared::cta (threads' shared stores -> TMA / wgmma)
//   fence_mbarrier_init()                  fence.mbarrier_init.release.cluster
//   tma_load_Nd(dst, map, bar, c0..)       cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   tma_store_Nd(map, src, c0..)           cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group
//   bulk_commit(), bulk_wait<N>(), bulk_wait_read<N>()   cp.async.bulk.commit_group / wait_group[.read] N
//   wgmma_fence(), wgmma_commit(), wgmma_wait<N>()        warpgroup: wgmma.fence / commit_group / wait_group N
//   wgmma_fence_operand(d)                 keeps the compiler from moving accumulator accesses across wgmma
//   wgmma_ss<N, BF16, TRANS_B>(d, a_desc, b_desc, scale_d)   warpgroup: wgmma.mma_async m64nNk16, A and B in
//                                          shared memory (descriptors), fp32 accumulators d[N/2]; scale_d 0: D = A*B
//   wgmma_rs<N, BF16, TRANS_B>(d, a[4], b_desc, scale_d)      the same with A from registers
//   setmaxnreg_inc<N>(), setmaxnreg_dec<N>()                   warpgroup: setmaxnreg.{inc,dec}.sync.aligned.u32
//   smem_u32(p)                            the shared-window address of p (cvta.to.shared)
#ifndef KUMIKO_CUDA_SM90_CUH
#define KUMIKO_CUDA_SM90_CUH

#if defined(__CUDACC_RTC__)
typedef struct CUtensorMap_st { alignas(64) unsigned long long opaque[16]; } CUtensorMap;
#else
#include <cuda.h>
#endif

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_u32(const void* p) { return kumiko_smem_u32(p); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  const unsigned a = smem_u32(bar);
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
#define KUMIKO_TMA_MAP(m) "l"(reinterpret_cast<uint64_t>(m))
__device__ __forceinline__ void tma_load_1d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];\n"
               ::"r"(smem_u32(dst)), KUMIKO_TMA_MAP(m), "r"(smem_u32(bar)), "r"(c0) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
               "[%2];\n" ::"r"(smem_u32(dst)), KUMIKO_TMA_MAP(m), "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
               "%5}], [%2];\n" ::"r"(smem_u32(dst)), KUMIKO_TMA_MAP(m), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
               "%5, %6}], [%2];\n" ::"r"(smem_u32(dst)), KUMIKO_TMA_MAP(m), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_load_5d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2,
                                            int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
               "%5, %6, %7}], [%2];\n" ::"r"(smem_u32(dst)), KUMIKO_TMA_MAP(m), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3), "r"(c4) : "memory");
}
__device__ __forceinline__ void tma_store_1d(const CUtensorMap* m, const void* src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.tile.bulk_group [%0, {%2}], [%1];\n"
               ::KUMIKO_TMA_MAP(m), "r"(smem_u32(src)), "r"(c0) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* m, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n"
               ::KUMIKO_TMA_MAP(m), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* m, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               ::KUMIKO_TMA_MAP(m), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* m, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::KUMIKO_TMA_MAP(m), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* m, const void* src, int c0, int c1, int c2, int c3,
                                             int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
               ::KUMIKO_TMA_MAP(m), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
#undef KUMIKO_TMA_MAP
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int K>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} (PTX ISA "wgmma.mma_async"): d (N/2 fp32
// registers, "+f"), then a-desc or the four A registers, b-desc, the scale-d predicate (from scale_d != 0),
// imm-scale-a = imm-scale-b = 1, imm-trans-a = 0 (descriptor A is K-major), imm-trans-b = TRANS_B.  One
// specialisation per N = 8..256 (step 8): KUMIKO_WG_R<r> lists the r accumulator operands, KUMIKO_WG_S<r>
// their placeholders, the DEF line the placeholder numbers of the operands after them.
#define KUMIKO_WG_R4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define KUMIKO_WG_S4 "%0, %1, %2, %3"
#define KUMIKO_WG_R8 KUMIKO_WG_R4, "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define KUMIKO_WG_S8 KUMIKO_WG_S4 ", %4, %5, %6, %7"
#define KUMIKO_WG_R12 KUMIKO_WG_R8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
#define KUMIKO_WG_S12 KUMIKO_WG_S8 ", %8, %9, %10, %11"
#define KUMIKO_WG_R16 KUMIKO_WG_R12, "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define KUMIKO_WG_S16 KUMIKO_WG_S12 ", %12, %13, %14, %15"
#define KUMIKO_WG_R20 KUMIKO_WG_R16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define KUMIKO_WG_S20 KUMIKO_WG_S16 ", %16, %17, %18, %19"
#define KUMIKO_WG_R24 KUMIKO_WG_R20, "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define KUMIKO_WG_S24 KUMIKO_WG_S20 ", %20, %21, %22, %23"
#define KUMIKO_WG_R28 KUMIKO_WG_R24, "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
#define KUMIKO_WG_S28 KUMIKO_WG_S24 ", %24, %25, %26, %27"
#define KUMIKO_WG_R32 KUMIKO_WG_R28, "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KUMIKO_WG_S32 KUMIKO_WG_S28 ", %28, %29, %30, %31"
#define KUMIKO_WG_R36 KUMIKO_WG_R32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define KUMIKO_WG_S36 KUMIKO_WG_S32 ", %32, %33, %34, %35"
#define KUMIKO_WG_R40 KUMIKO_WG_R36, "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define KUMIKO_WG_S40 KUMIKO_WG_S36 ", %36, %37, %38, %39"
#define KUMIKO_WG_R44 KUMIKO_WG_R40, "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43])
#define KUMIKO_WG_S44 KUMIKO_WG_S40 ", %40, %41, %42, %43"
#define KUMIKO_WG_R48 KUMIKO_WG_R44, "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define KUMIKO_WG_S48 KUMIKO_WG_S44 ", %44, %45, %46, %47"
#define KUMIKO_WG_R52 KUMIKO_WG_R48, "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51])
#define KUMIKO_WG_S52 KUMIKO_WG_S48 ", %48, %49, %50, %51"
#define KUMIKO_WG_R56 KUMIKO_WG_R52, "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define KUMIKO_WG_S56 KUMIKO_WG_S52 ", %52, %53, %54, %55"
#define KUMIKO_WG_R60 KUMIKO_WG_R56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59])
#define KUMIKO_WG_S60 KUMIKO_WG_S56 ", %56, %57, %58, %59"
#define KUMIKO_WG_R64 KUMIKO_WG_R60, "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KUMIKO_WG_S64 KUMIKO_WG_S60 ", %60, %61, %62, %63"
#define KUMIKO_WG_R68 KUMIKO_WG_R64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
#define KUMIKO_WG_S68 KUMIKO_WG_S64 ", %64, %65, %66, %67"
#define KUMIKO_WG_R72 KUMIKO_WG_R68, "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#define KUMIKO_WG_S72 KUMIKO_WG_S68 ", %68, %69, %70, %71"
#define KUMIKO_WG_R76 KUMIKO_WG_R72, "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75])
#define KUMIKO_WG_S76 KUMIKO_WG_S72 ", %72, %73, %74, %75"
#define KUMIKO_WG_R80 KUMIKO_WG_R76, "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define KUMIKO_WG_S80 KUMIKO_WG_S76 ", %76, %77, %78, %79"
#define KUMIKO_WG_R84 KUMIKO_WG_R80, "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83])
#define KUMIKO_WG_S84 KUMIKO_WG_S80 ", %80, %81, %82, %83"
#define KUMIKO_WG_R88 KUMIKO_WG_R84, "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define KUMIKO_WG_S88 KUMIKO_WG_S84 ", %84, %85, %86, %87"
#define KUMIKO_WG_R92 KUMIKO_WG_R88, "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91])
#define KUMIKO_WG_S92 KUMIKO_WG_S88 ", %88, %89, %90, %91"
#define KUMIKO_WG_R96 KUMIKO_WG_R92, "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define KUMIKO_WG_S96 KUMIKO_WG_S92 ", %92, %93, %94, %95"
#define KUMIKO_WG_R100 KUMIKO_WG_R96, "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99])
#define KUMIKO_WG_S100 KUMIKO_WG_S96 ", %96, %97, %98, %99"
#define KUMIKO_WG_R104 KUMIKO_WG_R100, "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define KUMIKO_WG_S104 KUMIKO_WG_S100 ", %100, %101, %102, %103"
#define KUMIKO_WG_R108 KUMIKO_WG_R104, "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107])
#define KUMIKO_WG_S108 KUMIKO_WG_S104 ", %104, %105, %106, %107"
#define KUMIKO_WG_R112 KUMIKO_WG_R108, "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define KUMIKO_WG_S112 KUMIKO_WG_S108 ", %108, %109, %110, %111"
#define KUMIKO_WG_R116 KUMIKO_WG_R112, "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115])
#define KUMIKO_WG_S116 KUMIKO_WG_S112 ", %112, %113, %114, %115"
#define KUMIKO_WG_R120 KUMIKO_WG_R116, "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#define KUMIKO_WG_S120 KUMIKO_WG_S116 ", %116, %117, %118, %119"
#define KUMIKO_WG_R124 KUMIKO_WG_R120, "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
#define KUMIKO_WG_S124 KUMIKO_WG_S120 ", %120, %121, %122, %123"
#define KUMIKO_WG_R128 KUMIKO_WG_R124, "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define KUMIKO_WG_S128 KUMIKO_WG_S124 ", %124, %125, %126, %127"
#define KUMIKO_WG_SS_ASM(N, DT, R, IA, IB, IS, IT)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." DT \
               "." DT " {" KUMIKO_WG_S##R "}, %" #IA ", %" #IB ", p, 1, 1, 0, %" #IT ";\n}\n"                \
               : KUMIKO_WG_R##R : "l"(a), "l"(b), "r"(scale_d), "n"(TB))
#define KUMIKO_WG_RS_ASM(N, DT, R, I0, I1, I2, I3, IB, IS, IT)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." DT \
               "." DT " {" KUMIKO_WG_S##R "}, {%" #I0 ", %" #I1 ", %" #I2 ", %" #I3 "}, %" #IB ", p, 1, 1, %" #IT \
               ";\n}\n"                                                                                    \
               : KUMIKO_WG_R##R : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TB))
template <int N>
struct kumiko_wgmma;
#define KUMIKO_WG_DEF(N, R, I0, I1, I2, I3, I4, I5, I6)                                        \
  template <>                                                                                  \
  struct kumiko_wgmma<N> {                                                                     \
    template <bool BF16, int TB>                                                               \
    static __device__ __forceinline__ void ss(float* d, uint64_t a, uint64_t b, int scale_d) { \
      if constexpr (BF16) KUMIKO_WG_SS_ASM(N, "bf16", R, I0, I1, I2, I3);                      \
      else KUMIKO_WG_SS_ASM(N, "f16", R, I0, I1, I2, I3);                                      \
    }                                                                                          \
    template <bool BF16, int TB>                                                               \
    static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b, int scale_d) { \
      if constexpr (BF16) KUMIKO_WG_RS_ASM(N, "bf16", R, I0, I1, I2, I3, I4, I5, I6);          \
      else KUMIKO_WG_RS_ASM(N, "f16", R, I0, I1, I2, I3, I4, I5, I6);                          \
    }                                                                                          \
  };
KUMIKO_WG_DEF(8, 4, 4, 5, 6, 7, 8, 9, 10)
KUMIKO_WG_DEF(16, 8, 8, 9, 10, 11, 12, 13, 14)
KUMIKO_WG_DEF(24, 12, 12, 13, 14, 15, 16, 17, 18)
KUMIKO_WG_DEF(32, 16, 16, 17, 18, 19, 20, 21, 22)
KUMIKO_WG_DEF(40, 20, 20, 21, 22, 23, 24, 25, 26)
KUMIKO_WG_DEF(48, 24, 24, 25, 26, 27, 28, 29, 30)
KUMIKO_WG_DEF(56, 28, 28, 29, 30, 31, 32, 33, 34)
KUMIKO_WG_DEF(64, 32, 32, 33, 34, 35, 36, 37, 38)
KUMIKO_WG_DEF(72, 36, 36, 37, 38, 39, 40, 41, 42)
KUMIKO_WG_DEF(80, 40, 40, 41, 42, 43, 44, 45, 46)
KUMIKO_WG_DEF(88, 44, 44, 45, 46, 47, 48, 49, 50)
KUMIKO_WG_DEF(96, 48, 48, 49, 50, 51, 52, 53, 54)
KUMIKO_WG_DEF(104, 52, 52, 53, 54, 55, 56, 57, 58)
KUMIKO_WG_DEF(112, 56, 56, 57, 58, 59, 60, 61, 62)
KUMIKO_WG_DEF(120, 60, 60, 61, 62, 63, 64, 65, 66)
KUMIKO_WG_DEF(128, 64, 64, 65, 66, 67, 68, 69, 70)
KUMIKO_WG_DEF(136, 68, 68, 69, 70, 71, 72, 73, 74)
KUMIKO_WG_DEF(144, 72, 72, 73, 74, 75, 76, 77, 78)
KUMIKO_WG_DEF(152, 76, 76, 77, 78, 79, 80, 81, 82)
KUMIKO_WG_DEF(160, 80, 80, 81, 82, 83, 84, 85, 86)
KUMIKO_WG_DEF(168, 84, 84, 85, 86, 87, 88, 89, 90)
KUMIKO_WG_DEF(176, 88, 88, 89, 90, 91, 92, 93, 94)
KUMIKO_WG_DEF(184, 92, 92, 93, 94, 95, 96, 97, 98)
KUMIKO_WG_DEF(192, 96, 96, 97, 98, 99, 100, 101, 102)
KUMIKO_WG_DEF(200, 100, 100, 101, 102, 103, 104, 105, 106)
KUMIKO_WG_DEF(208, 104, 104, 105, 106, 107, 108, 109, 110)
KUMIKO_WG_DEF(216, 108, 108, 109, 110, 111, 112, 113, 114)
KUMIKO_WG_DEF(224, 112, 112, 113, 114, 115, 116, 117, 118)
KUMIKO_WG_DEF(232, 116, 116, 117, 118, 119, 120, 121, 122)
KUMIKO_WG_DEF(240, 120, 120, 121, 122, 123, 124, 125, 126)
KUMIKO_WG_DEF(248, 124, 124, 125, 126, 127, 128, 129, 130)
KUMIKO_WG_DEF(256, 128, 128, 129, 130, 131, 132, 133, 134)

template <int N, bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  kumiko_wgmma<N>::template ss<BF16, TRANS_B>(d, a_desc, b_desc, scale_d);
}
template <int N, bool BF16, int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  kumiko_wgmma<N>::template rs<BF16, TRANS_B>(d, a, b_desc, scale_d);
}
#endif  // sm_90+

#endif  // KUMIKO_CUDA_SM90_CUH
