// wgmma with A from registers and B through a no-swizzle descriptor, K-major or MN-major (tests/emu/test_sm90.py).
// One warpgroup computes D (64 x N, fp32) = A (64 x 16) * B (16 x N): every thread builds its A registers from
// global memory in the m64nNk16 A fragment layout (per warp the mma.m16n8k16 A layout: a0 = row g, k 2q and 2q+1;
// a1 = row g + 8; a2, a3 = the same with k + 8; two 16-bit values a register, the lower k in the low half), puts
// B in shared memory in the canonical no-swizzle layout (core matrices of 8 x 16 bytes; LBO = 128 bytes between the
// two k halves, SBO = 256 bytes between groups of 8 N), and stores its D fragment (row 16w + g + 8 * ((v >> 1) & 1),
// column 8 * (v >> 2) + 2q + (v & 1)) to global memory.  TB = 0: B given as Bt (N x 16, K-major, element (n, k) at
// byte (n / 8) * 256 + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2); TB = 1: B given as K x N, MN-major (element
// (n, k) at byte (n / 8) * 256 + (k / 8) * 128 + (k % 8) * 16 + (n % 8) * 2).
#include "kumiko_cuda.cuh"

template <int N, int TB>
__device__ __forceinline__ void wgmma_rs_body(const uint16_t* a, const uint16_t* b, float* d) {
  __shared__ __align__(1024) uint16_t sb[16 * N];
  const int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, q = l % 4;
  for (int i = t; i < 16 * N; i += 128) {
    const int n = i / 16, k = i % 16;
    const int off = (n / 8) * 256 + (k / 8) * 128 + (TB ? (k % 8) * 16 + (n % 8) * 2 : (n % 8) * 16 + (k % 8) * 2);
    sb[off / 2] = TB ? b[k * N + n] : b[n * 16 + k];
  }
  fence_proxy_async();
  __syncthreads();
  const int r0 = 16 * w + g, r1 = r0 + 8;
  uint32_t af[4];
  af[0] = a[r0 * 16 + 2 * q] | (uint32_t(a[r0 * 16 + 2 * q + 1]) << 16);
  af[1] = a[r1 * 16 + 2 * q] | (uint32_t(a[r1 * 16 + 2 * q + 1]) << 16);
  af[2] = a[r0 * 16 + 2 * q + 8] | (uint32_t(a[r0 * 16 + 2 * q + 9]) << 16);
  af[3] = a[r1 * 16 + 2 * q + 8] | (uint32_t(a[r1 * 16 + 2 * q + 9]) << 16);
  float acc[N / 2];
  wgmma_fence_operand(acc);
  wgmma_fence();
  wgmma_rs<N, false, TB>(acc, af, wgmma_desc(sb, 128, 256, 0), 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
  for (int v = 0; v < N / 2; ++v) d[(16 * w + g + 8 * ((v >> 1) & 1)) * N + 8 * (v >> 2) + 2 * q + (v & 1)] = acc[v];
}

extern "C" __global__ void __launch_bounds__(128, 1) wgmma_rs_k64(const uint16_t* a, const uint16_t* b, float* d) {
  wgmma_rs_body<64, 0>(a, b, d);
}
KUMIKO_ENTRY(wgmma_rs_k64)
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_rs_mn64(const uint16_t* a, const uint16_t* b, float* d) {
  wgmma_rs_body<64, 1>(a, b, d);
}
KUMIKO_ENTRY(wgmma_rs_mn64)
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_rs_k24(const uint16_t* a, const uint16_t* b, float* d) {
  wgmma_rs_body<24, 0>(a, b, d);
}
KUMIKO_ENTRY(wgmma_rs_k24)
