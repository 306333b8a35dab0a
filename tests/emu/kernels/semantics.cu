// Semantics fixtures: cp.async visibility and zero-fill, shared-memory poisoning per block, and the
// fp16/bf16 conversions (tests/emu/test_semantics.py).
#include "kumiko_cuda.cuh"

// 16 threads, each owning 16 bytes (4 floats) of two regions of s[128].
// Group 0: a full 16-byte copy of g[4t..4t+3] into s[4t..]; group 1: a 6-byte copy of g[64+4t..] into
// s[64+4t..] (1.5 floats, the rest zero-filled).  out[k][t][0..3] (bits) is read:
//   k=0: region 0 before any wait          (deferred: poison, eager: data)
//   k=1: region 0 after wait<1>            (data)
//   k=2: region 1 after wait<1>            (deferred: poison, eager: data)
//   k=3: region 1 after wait<0>            (6 bytes of data, then zeros)
//   k=4: region 2 after a src_bytes=0 copy + wait_all  (all zero)
extern "C" __global__ void cp_async_groups(const float* g, uint32_t* out) {
  __shared__ __align__(16) float s[192];
  const unsigned t = threadIdx.x;
  auto dump = [&](int k, int base) {
    for (int i = 0; i < 4; ++i) out[(k * 16 + t) * 4 + i] = __float_as_uint(s[base + 4 * t + i]);
  };
  cp_async_16(&s[4 * t], &g[4 * t], 16);
  cp_async_commit();
  cp_async_16(&s[64 + 4 * t], &g[64 + 4 * t], 6);
  cp_async_commit();
  dump(0, 0);
  cp_async_wait<1>();
  dump(1, 0);
  dump(2, 64);
  cp_async_wait<0>();
  dump(3, 64);
  cp_async_16(&s[128 + 4 * t], g, 0);  // predicated off: reads nothing, writes 16 zero bytes
  cp_async_wait_all();
  dump(4, 128);
}
KUMIKO_ENTRY(cp_async_groups)

// Shared memory is poisoned for every block: each block reads its static and dynamic shared memory
// before writing it, then writes its block id (which the next block must not see).
extern "C" __global__ void smem_poison(uint32_t* out) {
  __shared__ uint32_t st[32];
  extern __shared__ __align__(16) uint32_t dyn[];
  const unsigned t = threadIdx.x, b = blockIdx.x;
  out[(b * 2 + 0) * 32 + t] = st[t];
  out[(b * 2 + 1) * 32 + t] = dyn[t];
  __syncthreads();
  st[t] = b;
  dyn[t] = b;
}
KUMIKO_ENTRY(smem_poison)

// fp32 -> fp16 / bf16 -> fp32, elementwise (grid-stride).
extern "C" __global__ void convert(const float* x, unsigned short* h, unsigned short* bf, float* hf, float* bff,
                                   int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const __half a = __float2half(x[i]);
    const __nv_bfloat16 b = __float2bfloat16(x[i]);
    h[i] = __half_as_ushort(a);
    bf[i] = __bfloat16_as_ushort(b);
    hf[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(i & 0xffff)));
    bff[i] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(i & 0xffff)));
  }
}
KUMIKO_ENTRY(convert)

// exp2_ftz, the softmax's 2^x (ex2.approx.ftz.f32 on the GPU): its results below the smallest normal float are +0.
extern "C" __global__ void exp2_ftz_map(const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = exp2_ftz(x[i]);
}
KUMIKO_ENTRY(exp2_ftz_map)

// The order threads first run in: each writes the value of a counter it then increments (fibers switch
// only where they block, so the unguarded increment is exact). Then, for `bug` = 0, every warp reads the
// values the previous warp stored after a barrier; `bug` = 1 leaves the barrier out, which only a
// schedule that runs a higher-numbered warp before a lower-numbered one can see.
extern "C" __global__ void warp_order(const float* x, float* y, unsigned* order, unsigned* counter, int bug) {
  __shared__ float s[256];
  const unsigned t = threadIdx.x;
  order[t] = (*counter)++;
  s[t] = x[t];
  if (!bug) __syncthreads();
  y[t] = s[t >= 32 ? t - 32 : t];
}
KUMIKO_ENTRY(warp_order)
