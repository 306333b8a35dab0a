// cuda_emu_sm90_api.h — the SM90 names kumiko_cuda.cuh maps to in the emulator, and the emulator's
// cuTensorMapEncodeTiled.  Included by cuda_emu_sm90.h only.
#ifndef KUMIKO_CUDA_EMU_SM90_API_H
#define KUMIKO_CUDA_EMU_SM90_API_H
// ------------------------------------------------------------------------------------------------
// The PTX-level names behind kumiko_cuda.cuh's SM90 API (see that header for the contract)
// ------------------------------------------------------------------------------------------------
namespace emu {
namespace ptx {
using SL = std::source_location;
inline unsigned smem_u32(const void* p) { return sm90::smem_addr(p); }
inline void mbar_init(uint64_t* bar, unsigned count, SL loc = SL::current()) { sm90::mbar_init(bar, count, loc); }
inline void mbar_arrive(uint64_t* bar, SL loc = SL::current()) { sm90::mbar_arrive(bar, 0, loc); }
inline void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes, SL loc = SL::current()) {
  sm90::mbar_arrive(bar, bytes, loc);
}
inline void mbar_wait(uint64_t* bar, unsigned parity, SL loc = SL::current()) { sm90::mbar_wait(bar, parity, loc); }
inline void fence_proxy_async() { sm90::fence_proxy_async(); }
inline void fence_mbarrier_init() { cur("fence.mbarrier_init"); }
inline void tma_load_1d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, SL loc = SL::current()) {
  const int c[1] = {c0};
  sm90::tma_load(1, dst, m, bar, c, loc);
}
inline void tma_load_2d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, SL loc = SL::current()) {
  const int c[2] = {c0, c1};
  sm90::tma_load(2, dst, m, bar, c, loc);
}
inline void tma_load_3d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2, SL loc = SL::current()) {
  const int c[3] = {c0, c1, c2};
  sm90::tma_load(3, dst, m, bar, c, loc);
}
inline void tma_load_4d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2, int c3,
                        SL loc = SL::current()) {
  const int c[4] = {c0, c1, c2, c3};
  sm90::tma_load(4, dst, m, bar, c, loc);
}
inline void tma_load_5d(void* dst, const CUtensorMap* m, uint64_t* bar, int c0, int c1, int c2, int c3, int c4,
                        SL loc = SL::current()) {
  const int c[5] = {c0, c1, c2, c3, c4};
  sm90::tma_load(5, dst, m, bar, c, loc);
}
inline void tma_store_1d(const CUtensorMap* m, const void* src, int c0, SL loc = SL::current()) {
  const int c[1] = {c0};
  sm90::tma_store(1, m, src, c, loc);
}
inline void tma_store_2d(const CUtensorMap* m, const void* src, int c0, int c1, SL loc = SL::current()) {
  const int c[2] = {c0, c1};
  sm90::tma_store(2, m, src, c, loc);
}
inline void tma_store_3d(const CUtensorMap* m, const void* src, int c0, int c1, int c2, SL loc = SL::current()) {
  const int c[3] = {c0, c1, c2};
  sm90::tma_store(3, m, src, c, loc);
}
inline void tma_store_4d(const CUtensorMap* m, const void* src, int c0, int c1, int c2, int c3, SL loc = SL::current()) {
  const int c[4] = {c0, c1, c2, c3};
  sm90::tma_store(4, m, src, c, loc);
}
inline void tma_store_5d(const CUtensorMap* m, const void* src, int c0, int c1, int c2, int c3, int c4,
                         SL loc = SL::current()) {
  const int c[5] = {c0, c1, c2, c3, c4};
  sm90::tma_store(5, m, src, c, loc);
}
inline void bulk_commit() { sm90::bulk_commit(); }
template <int N>
inline void bulk_wait() { sm90::bulk_wait(N); }
template <int N>
inline void bulk_wait_read() { sm90::bulk_wait(N); }  // the store is performed when its source may be reused
inline void wgmma_fence() { sm90::wgmma_fence(); }
inline void wgmma_commit() { sm90::wgmma_commit(); }
template <int N>
inline void wgmma_wait(SL loc = SL::current()) { sm90::wgmma_wait(N, loc); }
template <int K>
inline void wgmma_fence_operand(float (&)[K]) {}
template <int N, bool BF16, int TRANS_B>
inline void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d, SL loc = SL::current()) {
  sm90::mma_async<N>(d, nullptr, a_desc, b_desc, scale_d != 0, BF16, TRANS_B != 0, loc);
}
template <int N, bool BF16, int TRANS_B>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d, SL loc = SL::current()) {
  sm90::mma_async<N>(d, a, 0, b_desc, scale_d != 0, BF16, TRANS_B != 0, loc);
}
template <int N>
inline void setmaxnreg_inc(SL loc = SL::current()) { sm90::setmaxnreg(true, N, loc); }
template <int N>
inline void setmaxnreg_dec(SL loc = SL::current()) { sm90::setmaxnreg(false, N, loc); }
}  // namespace ptx
}  // namespace emu

// cuTensorMapEncodeTiled for the emulator: the same arguments (enum values as in cuda.h), the same
// checks (cuda.h's documentation of cuTensorMapEncodeTiled); returns 0 (CUDA_SUCCESS) or 1
// (CUDA_ERROR_INVALID_VALUE) with the reason in kumiko_emu_tensor_map_error().  Not emulated (refused):
// interleaved layouts, element strides other than 1, the 128B_ATOM swizzles, packed types.
inline std::string& kumiko_emu_tmap_error() { static std::string e; return e; }
extern "C" __attribute__((visibility("default"), used)) inline const char* kumiko_emu_tensor_map_error(void) {
  return kumiko_emu_tmap_error().c_str();
}
extern "C" __attribute__((visibility("default"), used)) inline int kumiko_emu_tensor_map_encode_tiled(
    void* out, int dtype, unsigned rank, void* address, const uint64_t* dims, const uint64_t* strides,
    const uint32_t* box, const uint32_t* estrides, int interleave, int swizzle, int l2, int oob) {
  auto bad = [](const std::string& why) { kumiko_emu_tmap_error() = why; return 1; };
  static const int esize[13] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  if (!out || reinterpret_cast<uintptr_t>(out) % 64) return bad("tensorMap address must be aligned to 64 bytes");
  if (dtype < 0 || dtype > 12) return bad(emu::fmt("tensorDataType %d is not emulated (0..12)", dtype));
  if (rank < 1 || rank > 5) return bad(emu::fmt("tensorRank %u is not in [1, 5]", rank));
  if (reinterpret_cast<uintptr_t>(address) % 16) return bad("globalAddress must be 16-byte aligned");
  if (interleave != 0) return bad("interleaved layouts are not emulated");
  if (swizzle < 0 || swizzle > 3) return bad(emu::fmt("swizzle %d is not emulated (NONE, 32B, 64B, 128B)", swizzle));
  if (l2 < 0 || l2 > 3) return bad(emu::fmt("l2Promotion %d is not a CUtensorMapL2promotion", l2));
  const bool is_float = dtype >= 6;  // FLOAT16 .. TFLOAT32_FTZ
  if (oob < 0 || oob > 1 || (oob == 1 && !is_float))
    return bad(emu::fmt("oobFill %d: NAN_REQUEST_ZERO_FMA needs a floating-point type", oob));
  CUtensorMap m{};
  m.magic = emu::sm90::kTensorMapMagic;
  m.rank = uint8_t(rank);
  m.dtype = uint8_t(dtype);
  m.esize = uint8_t(esize[dtype]);
  m.swizzle = uint8_t(swizzle);
  m.oob = uint8_t(oob);
  m.address = reinterpret_cast<uintptr_t>(address);
  for (unsigned d = 0; d < 5; ++d) { m.box[d] = 1; m.estrides[d] = 1; m.dims[d] = 1; }
  m.strides[0] = m.esize;
  for (unsigned d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (1ull << 32)) return bad(emu::fmt("globalDim[%u] = %llu is not in [1, 2^32]", d,
                                                                    (unsigned long long)dims[d]));
    if (dims[d] == (1ull << 32)) return bad("globalDim of 2^32 is not emulated");
    m.dims[d] = uint32_t(dims[d]);
    if (box[d] == 0 || box[d] > 256) return bad(emu::fmt("boxDim[%u] = %u is not in [1, 256]", d, box[d]));
    m.box[d] = uint16_t(box[d]);
    if (estrides[d] == 0 || estrides[d] > 8) return bad(emu::fmt("elementStrides[%u] = %u is not in [1, 8]", d, estrides[d]));
    if (estrides[d] != 1 && d > 0) return bad("elementStrides other than 1 are not emulated");
    if (d + 1 < rank) {
      if (strides[d] % 16 || strides[d] >= (1ull << 40))
        return bad(emu::fmt("globalStrides[%u] = %llu must be a multiple of 16 below 2^40", d,
                            (unsigned long long)strides[d]));
      m.strides[d + 1] = strides[d];
    }
  }
  const unsigned inner = unsigned(box[0]) * unsigned(m.esize);
  if (inner % 16) return bad(emu::fmt("boxDim[0] * element size = %u bytes is not a multiple of 16", inner));
  if (swizzle && inner > (16u << swizzle))
    return bad(emu::fmt("the box's inner dimension (%u bytes) exceeds the %u-byte swizzle span", inner, 16u << swizzle));
  std::memcpy(out, &m, sizeof m);
  kumiko_emu_tmap_error().clear();
  return 0;
}
#endif  // KUMIKO_CUDA_EMU_SM90_API_H
