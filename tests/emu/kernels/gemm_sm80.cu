// An SM80-style fp16 GEMM, C[M,N] = A[M,K] @ B[K,N] (row-major, fp32 accumulation, fp16 out), written
// with kumiko_cuda.cuh the way kumiko's code generator will write it (seed 001 §9.1):
//   cp.async multi-stage ring -> commit/wait -> ldmatrix -> mma.sync -> epilogue -> predicated st.global
// M is arbitrary; N and K must be multiples of 8 (16-byte rows for cp.async); tails are predicated.
//
// Built with -DGEMM_INJECT_BUGS, the kernel takes a `bug` number that switches on one of the seven
// bugs of the emulator feasibility study (tests/emu/test_gemm.py checks that some configuration
// catches each); without it the bug hooks compile away.
#include "kumiko_cuda.cuh"

#ifndef GEMM_BM
#define GEMM_BM 128
#endif
#ifndef GEMM_BN
#define GEMM_BN 128
#endif
#ifndef GEMM_BK
#define GEMM_BK 32
#endif
#ifndef GEMM_STAGES
#define GEMM_STAGES 3
#endif

constexpr int BM = GEMM_BM, BN = GEMM_BN, BK = GEMM_BK, STAGES = GEMM_STAGES;
constexpr int WARPS_M = 2, WARPS_N = 4, THREADS = WARPS_M * WARPS_N * 32;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
constexpr int MT = WM / 16, NT = WN / 8;              // mma tiles per warp
constexpr int A_LD = BK + 8, B_LD = BN + 8;           // +8 halfs: rows stay 16-byte aligned, banks rotate
constexpr int A_STAGE = BM * A_LD, B_STAGE = BK * B_LD;
static_assert(NT % 2 == 0, "B fragments are loaded two n8 tiles at a time");
static_assert((BM * BK / 8) % THREADS == 0 && (BK * BN / 8) % THREADS == 0, "whole 16-byte chunks per thread");

// The seven injected bugs (values of `bug`).
enum {
  BUG_NONE = 0,
  BUG_MISSING_WAIT = 1,                // no cp_async_wait before reading a stage
  BUG_WRONG_WAIT_DEPTH = 2,            // wait<STAGES> instead of wait<STAGES-1>: one group too few
  BUG_MISSING_TRAILING_BARRIER = 3,    // a stage is refilled while other warps still read it
  BUG_MISSING_ROW_PREDICATE = 4,       // A rows >= M are loaded
  BUG_MISSING_K_PREDICATE = 5,         // A columns / B rows >= K are loaded
  BUG_WRONG_LDMATRIX_ADDRESS = 6,      // A fragment rows from lane%8 instead of lane%16
  BUG_MISSING_EPILOGUE_COL_CHECK = 7,  // C columns >= N are stored
};
#ifdef GEMM_INJECT_BUGS
#define BUG(b) (bug == (b))
#else
#define BUG(b) false
#endif

// One BMxBK tile of A and one BKxBN tile of B into a stage, 16 bytes per cp.async; bytes outside the
// matrices are zero-filled (src_bytes = 0 for a chunk that is entirely outside).
__device__ __forceinline__ void load_tile(half* sA, half* sB, const half* A, const half* B, int M, int N, int K,
                                          int m0, int n0, int k0, int tid, int bug) {
  (void)bug;
#pragma unroll
  for (int i = 0; i < BM * BK / 8 / THREADS; ++i) {
    const int c = tid + i * THREADS;
    const int r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
    const int gm = m0 + r, gk = k0 + kc;
    const bool row_ok = BUG(BUG_MISSING_ROW_PREDICATE) || gm < M;
    const int k_left = BUG(BUG_MISSING_K_PREDICATE) ? 8 : K - gk;
    const int n = row_ok ? max(0, min(8, k_left)) : 0;
    cp_async_16(sA + r * A_LD + kc, n > 0 ? A + size_t(gm) * K + gk : A, n * 2);
  }
#pragma unroll
  for (int i = 0; i < BK * BN / 8 / THREADS; ++i) {
    const int c = tid + i * THREADS;
    const int r = c / (BN / 8), nc = (c % (BN / 8)) * 8;
    const int gk = k0 + r, gn = n0 + nc;
    const bool k_ok = BUG(BUG_MISSING_K_PREDICATE) || gk < K;
    const int n = k_ok ? max(0, min(8, N - gn)) : 0;
    cp_async_16(sB + r * B_LD + nc, n > 0 ? B + size_t(gk) * N + gn : B, n * 2);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    gemm_f16_sm80(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N, int K,
                  int bug) {
  (void)bug;
  extern __shared__ __align__(128) unsigned char smem[];
  half* sA = reinterpret_cast<half*>(smem);
  half* sB = sA + STAGES * A_STAGE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = (K + BK - 1) / BK;

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // Prologue: fill every stage; one commit group per stage, also when there is nothing to load, so
  // that "wait until STAGES-1 groups are pending" always means "tile kt has landed".
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    if (s < KT) load_tile(sA + s * A_STAGE, sB + s * B_STAGE, A, B, M, N, K, m0, n0, s * BK, tid, bug);
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    if (BUG(BUG_WRONG_WAIT_DEPTH)) cp_async_wait<STAGES>();
    else if (!BUG(BUG_MISSING_WAIT)) cp_async_wait<STAGES - 1>();
    __syncthreads();  // every thread's copies of tile kt are visible to every warp
    const half* a_s = sA + (kt % STAGES) * A_STAGE;
    const half* b_s = sB + (kt % STAGES) * B_STAGE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // x4 over a 16x16 block: lanes 0-15 give rows 0-15 at k, lanes 16-31 rows 0-15 at k+8
        // (matrices 0..3 = a0a1, a2a3, a4a5, a6a7 of the mma A fragment).
        const int row = wm * WM + mt * 16 + (BUG(BUG_WRONG_LDMATRIX_ADDRESS) ? (lane % 8) : (lane % 16));
        ldmatrix_x4(af[mt], a_s + row * A_LD + kk + (lane / 16) * 8);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        // x4.trans over a 16(k)x16(n) block of row-major B: matrices = (k0-7,n0-7), (k8-15,n0-7),
        // (k0-7,n8-15), (k8-15,n8-15) -> b0b1/b2b3 of n-tile 2np and of n-tile 2np+1.
        const int krow = kk + (lane % 8) + ((lane / 8) % 2) * 8;
        uint32_t r[4];
        ldmatrix_x4_trans(r, b_s + krow * B_LD + wn * WN + np * 16 + (lane / 16) * 8);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_m16n8k16_f16f32(acc[mt][nt], af[mt], bf[nt], acc[mt][nt]);
    }
    if (!BUG(BUG_MISSING_TRAILING_BARRIER)) __syncthreads();  // all warps are done with stage kt%STAGES
    const int next = kt + STAGES;
    if (next < KT) load_tile(sA + (kt % STAGES) * A_STAGE, sB + (kt % STAGES) * B_STAGE, A, B, M, N, K, m0, n0,
                             next * BK, tid, bug);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // Epilogue: c0,c1 at row g, c2,c3 at row g+8, columns 2t,2t+1 of each n8 tile; one 32-bit store
  // of two halves, predicated on the row and (N even) the column.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * WM + mt * 16 + g + 8 * h;
        const int col = n0 + wn * WN + nt * 8 + 2 * t;
        if (row < M && (BUG(BUG_MISSING_EPILOGUE_COL_CHECK) || col < N))
          *reinterpret_cast<uint32_t*>(C + size_t(row) * N + col) =
              pack_half2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
}
KUMIKO_ENTRY(gemm_f16_sm80)

