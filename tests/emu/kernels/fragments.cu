// Fragment-layout fixtures: each kernel builds or dumps register fragments with the formulas of the
// PTX ISA, written out here independently of the emulator, so a wrong layout in either one (or on a
// GPU) fails the numpy comparison in tests/emu/test_fragments.py.
#include "kumiko_cuda.cuh"

__device__ __forceinline__ uint32_t pack_raw(unsigned short lo, unsigned short hi) {
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// One mma.m16n8k16: D = A (16x16, row-major) * B (16x8, row-major K x N) + C (16x8 fp32).
// PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type", g = lane>>2, t = lane%4:
// register r of A holds a_{2r}, a_{2r+1}: row g + 8*(r&1), columns 2t + 8*(r>>1) + {0,1};
// register r of B holds b_{2r}, b_{2r+1}: rows (k) 2t + 8r + {0,1}, column (n) g;
// c_i sits at row g + 8*(i>=2), column 2t + (i&1).
template <bool BF16>
__device__ __forceinline__ void mma_once(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
  const unsigned l = threadIdx.x, g = l >> 2, t = l & 3;
  uint32_t a[4], b[2];
  float c[4], d[4];
  for (int r = 0; r < 4; ++r) {
    const unsigned row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
    a[r] = pack_raw(A[row * 16 + col], A[row * 16 + col + 1]);
  }
  for (int r = 0; r < 2; ++r) {
    const unsigned k = 2 * t + 8 * r;
    b[r] = pack_raw(B[k * 8 + g], B[(k + 1) * 8 + g]);
  }
  for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  if (BF16) mma_m16n8k16_bf16f32(d, a, b, c);
  else mma_m16n8k16_f16f32(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}

extern "C" __global__ void mma_f16(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
  mma_once<false>(A, B, C, D);
}
KUMIKO_ENTRY(mma_f16)

extern "C" __global__ void mma_bf16(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
  mma_once<true>(A, B, C, D);
}
KUMIKO_ENTRY(mma_bf16)

// ldmatrix: the source tile goes to static shared memory; lane l points at row rows[l], column
// cols[l] (0 or 8) of it.  out[v][lane][0..3] = the registers of variant v:
// x1, x2, x4, x1.trans, x2.trans, x4.trans.
extern "C" __global__ void ldmatrix_dump(const unsigned short* src, const int* rows, const int* cols, uint32_t* out) {
  __shared__ __align__(16) unsigned short tile[32][16];
  const unsigned l = threadIdx.x;
  for (int i = 0; i < 16; ++i) tile[l][i] = src[l * 16 + i];
  __syncthreads();
  const void* p = &tile[rows[l]][cols[l]];
  uint32_t r1[1], r2[2], r4[4];
  uint32_t* o = out + l * 4;
  ldmatrix_x1(r1, p);
  o[0] = r1[0];
  ldmatrix_x2(r2, p);
  o += 128;
  o[0] = r2[0]; o[1] = r2[1];
  ldmatrix_x4(r4, p);
  o += 128;
  for (int i = 0; i < 4; ++i) o[i] = r4[i];
  ldmatrix_x1_trans(r1, p);
  o += 128;
  o[0] = r1[0];
  ldmatrix_x2_trans(r2, p);
  o += 128;
  o[0] = r2[0]; o[1] = r2[1];
  ldmatrix_x4_trans(r4, p);
  o += 128;
  for (int i = 0; i < 4; ++i) o[i] = r4[i];
}
KUMIKO_ENTRY(ldmatrix_dump)

// Warp shuffles and votes on v = x[lane]; out[k*32 + lane] per operation k (see the test).
extern "C" __global__ void warp_ops(const float* x, float* out, unsigned* votes) {
  const unsigned l = lane_id();
  const float v = x[l];
  out[0 * 32 + l] = warp_sum_f32(v);
  out[1 * 32 + l] = warp_max_f32(v);
  out[2 * 32 + l] = shfl_sync_f32(v, 7);
  out[3 * 32 + l] = shfl_down_f32(v, 3);
  out[4 * 32 + l] = shfl_up_f32(v, 5);
  out[5 * 32 + l] = shfl_xor_f32(v, 9);
  out[6 * 32 + l] = __shfl_xor_sync(0xffffffffu, v, 4, 8);   // width 8: stays in the segment
  out[7 * 32 + l] = __shfl_down_sync(0xffffffffu, v, 2, 16);
  votes[l] = __ballot_sync(0xffffffffu, v > 0.0f);
  // half the warp shuffles among itself while the other half does the same: two disjoint groups
  const unsigned half_mask = l < 16 ? 0x0000ffffu : 0xffff0000u;
  out[8 * 32 + l] = __shfl_xor_sync(half_mask, v, 1);
}
KUMIKO_ENTRY(warp_ops)

// Block barrier: tree reduction of 256 values in static shared memory, plus __syncthreads_count.
extern "C" __global__ void block_sum(const float* x, float* out, int* count) {
  __shared__ float s[256];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned w = 128; w > 0; w >>= 1) {
    if (t < w) s[t] += s[t + w];
    __syncthreads();
  }
  const int c = __syncthreads_count(x[blockIdx.x * 256 + t] > 0.0f);
  if (t == 0) {
    out[blockIdx.x] = s[0];
    count[blockIdx.x] = c;
  }
}
KUMIKO_ENTRY(block_sum)

// lane_id()/warp_id() follow the linear thread index, also in 2-D blocks; a shuffle across a 2-D
// block exchanges with the lane of the linear index.
extern "C" __global__ void lane_ids(uint32_t* out) {
  const unsigned linear = threadIdx.x + blockDim.x * threadIdx.y;
  const unsigned from = __shfl_xor_sync(0xffffffffu, linear, 1);
  out[linear] = lane_id() | (warp_id() << 8) | (from << 16);
}
KUMIKO_ENTRY(lane_ids)
