// Fault fixtures: kernel `fault(which, ...)` misbehaves in the way `which` selects; the emulator must
// report each as E1702 with the kernel, block and thread (tests/emu/test_faults.py).
#include "kumiko_cuda.cuh"

extern "C" __global__ void fault(int which, const float* g, float* out) {
  __shared__ __align__(16) float s[64];
  __shared__ __align__(16) unsigned short tile[32][16];
  extern __shared__ __align__(16) unsigned char dyn[];
  const unsigned t = threadIdx.x, lane = t & 31;
  float v = float(t);
  switch (which) {
    case 1:  // cp.async destination not 16-byte aligned
      cp_async_16(&s[1], g, 16);
      break;
    case 2:  // deadlock: lane 0 waits in a shuffle, everyone else at the barrier
      if (t == 0) v = __shfl_sync(0xffffffffu, v, 1);
      else __syncthreads();
      break;
    case 3:  // ldmatrix row address not 16-byte aligned
      for (int i = 0; i < 16; ++i) tile[lane][i] = 0;
      __syncwarp();
      {
        uint32_t r[4];
        ldmatrix_x4(r, &tile[lane][lane == 5 ? 1 : 0]);
        v = float(r[0]);
      }
      break;
    case 4:  // ldmatrix of shared memory nobody wrote
      {
        uint32_t r[4];
        ldmatrix_x4(r, &tile[lane][0]);
        v = float(r[0]);
      }
      break;
    case 5:  // divergent warp collectives
      if (lane & 1) v = float(__ballot_sync(0xffffffffu, 1));
      else v = __shfl_xor_sync(0xffffffffu, v, 2);
      break;
    case 6:  // cp.async from shared memory
      cp_async_16(&s[0], &s[16], 16);
      break;
    case 7:  // cp.async past the dynamic shared memory the launch gave
      cp_async_16(dyn + 4096, g, 16);
      break;
    case 8:  // mma in a warp that is not whole (launched with 48 threads)
      {
        uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
        float c[4] = {0, 0, 0, 0}, d[4];
        mma_m16n8k16_f16f32(d, a, b, c);
        v = d[0];
      }
      break;
    case 9:  // a lane exits while the rest of its warp waits in a shuffle
      if (lane == 5) return;
      v = __shfl_xor_sync(0xffffffffu, v, 1);
      break;
    case 10:  // cp.async destination in global memory
      cp_async_16(out, g, 16);
      break;
    case 12:  // a plain store past the dynamic shared memory the launch gave
      reinterpret_cast<float*>(dyn)[1024 / 4 + t] = 1.0f;
      break;
    case 13:  // st.shared.v4 to an address that is not 16-byte aligned
      st_shared_16(&s[lane == 3 ? 2 : 0], 1u, 2u, 3u, 4u);
      break;
    case 14:  // st.shared.v4 to global memory
      st_shared_16(out, 1u, 2u, 3u, 4u);
      break;
    case 15:  // not a fault: each lane's 16-byte store lands, the first word at the lowest address
      if (t < 16) st_shared_16(&s[4 * t], 4 * t, 4 * t + 1, 4 * t + 2, 4 * t + 3);
      __syncthreads();
      v = float(reinterpret_cast<const uint32_t*>(s)[t]);
      break;
    case 16:  // src_bytes 0 (nothing read) from a source past the end of `g` (64 floats): a fault under ASan
      if (t == 0) cp_async_16(&s[0], g + 68, 0);
      break;
    case 17:  // src_bytes 0 from a source that is not 16-byte aligned
      if (t == 0) cp_async_16(&s[0], g + 1, 0);
      break;
    case 11:  // not a fault: threads that exited do not hold up __syncthreads
      if (t >= 32) return;
      __syncthreads();
      v = warp_sum_f32(v);
      break;
    default:
      v = warp_sum_f32(v);
      __syncthreads();
  }
  cp_async_wait_all();
  out[blockIdx.x * blockDim.x + t] = v;
}
KUMIKO_ENTRY(fault)
