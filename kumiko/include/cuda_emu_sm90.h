// cuda_emu_sm90.h — the SM90 (Hopper) asynchronous operations of kumiko's CUDA emulator: mbarrier,
// TMA (cp.async.bulk.tensor tiled loads and stores, bulk groups), fence.proxy.async, wgmma and
// setmaxnreg.  Included by cuda_emu.h (never on its own); see docs/emulator.md, "SM90".
//
// Model, in one paragraph.  An mbarrier lives in a side table keyed by its shared address (the 8
// bytes in shared memory are not used): expected arrivals, pending arrivals, transaction bytes, the
// number of completed phases.  A TMA load reads global memory when it is issued and lands in shared
// memory either at once ("eager", the cp_async=eager configuration) or as late as possible
// ("deferred"): only when no thread of the block can run, which is also when its complete_tx
// reaches the barrier - so a read that no mbarrier wait ordered sees the 0xFF poison.  A wait that
// can never complete is a deadlock naming the barrier, its phase, the missing arrivals and bytes.
// Shared memory has a second view, the async proxy's: a copy of the generic view taken at each
// fence.proxy.async (and written by TMA loads); a TMA store or wgmma that reads bytes on which the
// two views differ read memory threads wrote after the last fence (fault "async_proxy_fence").
// wgmma.mma_async is a warpgroup rendezvous (128 threads); the result is computed at the first wait_group
// that retires it, after letting the other threads run (shared memory released or refilled before that
// gives wrong data, as on hardware); until a thread's wait_group retires it, its accumulator registers
// hold a poison NaN (payload 0x7FDEAD00) that faults where it is converted or stored by TMA.
// wgmma itself is in cuda_emu_sm90_wgmma.h.
#ifndef KUMIKO_CUDA_EMU_SM90_H
#define KUMIKO_CUDA_EMU_SM90_H


// The tensor map: cuTensorMapEncodeTiled's arguments as the emulator's TMA unit reads them (on a GPU
// an opaque 128-byte, 64-byte aligned object; the emulator fills it with kumiko_emu_tensor_map_encode_tiled).
struct alignas(64) CUtensorMap {
  uint32_t magic;                 // kTensorMapMagic once encoded
  uint8_t rank, dtype, esize, swizzle, oob, pad0_[3];
  uint32_t pad1_;
  uint64_t address;               // byte 16
  uint32_t dims[5];
  uint32_t pad2_;
  uint64_t strides[5];            // byte 48; bytes, strides[0] = element size
  uint16_t box[5];
  uint8_t estrides[5];
  uint8_t tail_[25];
};
static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is 128 bytes");

namespace emu __attribute__((visibility("hidden"))) {
namespace sm90 {

constexpr uint32_t kTensorMapMagic = 0x544d4150u;  // "TMAP"
constexpr uint32_t kAccPoison = 0x7FDEAD00u;        // a quiet NaN with a payload arithmetic keeps

struct Mbar {
  int expected = 0, pending = 0;
  long long tx = 0, expect_bytes = 0, delivered = 0;  // this phase: outstanding, announced, delivered
  unsigned phase = 0;                                  // completed phases
  std::source_location init_loc;
};
struct TmaLand {                   // a deferred TMA load: bytes already read from global memory
  uint32_t dst, bar;               // shared addresses
  std::vector<std::pair<uint32_t, std::vector<unsigned char>>> runs;  // (shared address, bytes)
  unsigned bytes;
};
struct BulkStore {                 // a TMA store: performed at the wait_group that retires its group
  CUtensorMap map;
  uint32_t src;
  int coords[5];
  std::source_location loc;
};
struct WgOp;
struct ThreadState {
  std::vector<std::vector<BulkStore>> bulk_groups;    // committed, not yet waited for
  std::vector<BulkStore> bulk_open;
  std::vector<std::vector<WgOp*>> wg_groups;          // committed wgmma groups
  std::vector<WgOp*> wg_open;
  bool wg_fenced = false;
  unsigned nreg_calls = 0;
  uint32_t wait_bar = 0;
  unsigned wait_parity = 0;
};
struct WgOp {                      // one wgmma.mma_async of a warpgroup
  int n = 0;
  bool bf16 = false, a_regs = false, trans_b = false, computed = false;
  uint64_t a_desc = 0, b_desc = 0;
  int scale_d = 1;
  unsigned wg = 0;
  float* d[128] = {};
  uint32_t a[128][4] = {};
  WgOp* chain[128] = {};           // the in-flight op each thread's accumulators continue
  std::vector<float> c, result;    // [thread][N/2]
  std::source_location loc;
};
struct WgRendezvous {
  unsigned arrived = 0;
  int n = -1;
  bool bf16 = false, a_regs = false, trans_b = false;
  uint64_t a_desc = 0, b_desc = 0;
  int scale_d = 0;
  float* d[128] = {};
  uint32_t a[128][4] = {};
  std::source_location loc;
};
struct WarpRegs { unsigned regs = 0, calls = 0; bool busy = false; };

struct State {
  std::vector<std::pair<uint32_t, Mbar>> bars;
  std::vector<TmaLand> landing;
  std::vector<unsigned char> async_view;   // the async proxy's view of [sh_lo, sh_hi), made at the first use
  bool view_ready = false;
  std::vector<ThreadState> th;
  std::vector<WgRendezvous> rv;
  std::vector<std::unique_ptr<WgOp>> ops;
  std::vector<WarpRegs> warp_regs;
  long long reg_pool = 0;
};
inline State st;

inline uint32_t smem_addr(const void* p) { return uint32_t(static_cast<const unsigned char*>(p) - rt.sh_lo); }
inline unsigned char* smem_ptr(uint32_t a) { return rt.sh_lo + a; }
inline ThreadState& ts(const Fiber* f) { return st.th[f->linear]; }
inline std::string bar_name(uint32_t a) { return smem_where(smem_ptr(a)); }

inline void reset_block() {
  st.bars.clear();
  st.landing.clear();
  st.th.assign(rt.nthreads, ThreadState{});
  st.rv.assign((rt.nthreads + 127) / 128, WgRendezvous{});
  st.ops.clear();
  const unsigned nwarps = (rt.nthreads + 31) / 32;
  // The registers a thread starts with: what ptxas gives a kernel of this many threads at one block
  // per SM (65536 / threads, a multiple of 8, at most 256); setmaxnreg moves them between warps.
  const unsigned per_thread = std::min(256u, (65536u / std::max(1u, rt.nthreads)) & ~7u);
  st.warp_regs.assign(nwarps, WarpRegs{per_thread, 0, false});
  st.reg_pool = 65536 - 32ll * per_thread * nwarps;
  st.view_ready = false;
}
// The threads' view of shared memory -> the async proxy's, except the dynamic arrays' bytes past the launch's
// size (never used; under ASan they are poisoned and must not be read).
inline void sync_view() {
  if (!rt.sh_lo) return;
  if (st.async_view.size() != size_t(rt.sh_hi - rt.sh_lo)) st.async_view.assign(size_t(rt.sh_hi - rt.sh_lo), 0xFF);
  unsigned char* p = rt.sh_lo;
  std::vector<Runtime::Region> holes;
  for (const auto& d : rt.dyn) holes.push_back({d.p + rt.smem_bytes, d.n - rt.smem_bytes});
  std::sort(holes.begin(), holes.end(), [](auto& a, auto& b) { return a.p < b.p; });
  for (const auto& h : holes) {
    if (h.p > p) std::memcpy(st.async_view.data() + (p - rt.sh_lo), p, size_t(h.p - p));
    p = std::max(p, h.p + h.n);
  }
  if (rt.sh_hi > p) std::memcpy(st.async_view.data() + (p - rt.sh_lo), p, size_t(rt.sh_hi - p));
  st.view_ready = true;
}
// Made at a block's first SM90 access (SM80 kernels never pay for it): the async proxy has seen nothing but
// the 0xFF every block starts with.
inline unsigned char* view() {
  if (!st.view_ready) {
    st.async_view.assign(size_t(rt.sh_hi - rt.sh_lo), 0xFF);
    st.view_ready = true;
  }
  return st.async_view.data();
}

// Let the other ready threads run first (this one stays ready).
inline void yield_here(Fiber* f) {
  push_ready(*f);
  Fiber* next = pop_ready();
  if (next == f) return;
  switch_to(f, next);
  if (rt.aborting && std::uncaught_exceptions() == 0) throw Abort{};
}
inline Mbar* find_bar(uint32_t a) {
  for (auto& b : st.bars)
    if (b.first == a) return &b.second;
  return nullptr;
}
inline Mbar& bar_at(const void* p, const char* what, Fiber* f, const std::source_location& loc) {
  check_shared(p, 8, 8, what, f, loc);
  Mbar* b = find_bar(smem_addr(p));
  if (!b) raise_fault("mbarrier", fmt("%s: no mbarrier was initialised at %s", what, smem_where(p).c_str()), f, loc);
  return *b;
}
inline void wake_bar_waiters(uint32_t a) {
  for (unsigned k = 0; k < rt.nthreads; ++k) {
    Fiber& g = rt.fibers[wake_order(k, rt.nthreads)];
    if (g.state == Fiber::Waiting && g.wait_op == Op::mbar_wait && st.th[g.linear].wait_bar == a) push_ready(g);
  }
}
// A phase completes when every expected arrival came and no transaction bytes are outstanding
// (PTX ISA "Phase Completion of the mbarrier object").
inline void maybe_complete(uint32_t a, Mbar& b) {
  if (b.pending != 0 || b.tx != 0) return;
  ++b.phase;
  b.pending = b.expected;
  b.expect_bytes = b.delivered = 0;
  wake_bar_waiters(a);
}
inline void complete_tx(uint32_t a, long long bytes) {
  Mbar* b = find_bar(a);
  if (!b) return;  // a fault was recorded at issue
  b->tx -= bytes;
  b->delivered += bytes;
  maybe_complete(a, *b);
}

inline void mbar_init(void* p, unsigned count, const std::source_location& loc) {
  Fiber* f = cur("mbarrier.init");
  if (rt.aborting) return;
  check_shared(p, 8, 8, "mbarrier.init", f, loc);
  if (count < 1 || count > (1u << 20) - 1)
    raise_fault("mbarrier", fmt("mbarrier.init count %u is not in [1, 2^20 - 1]", count), f, loc);
  const uint32_t a = smem_addr(p);
  Mbar m;
  m.expected = m.pending = int(count);
  m.init_loc = loc;
  if (Mbar* b = find_bar(a)) *b = m;
  else st.bars.push_back({a, m});
}
inline void mbar_arrive(void* p, unsigned tx_bytes, const std::source_location& loc) {
  Fiber* f = cur("mbarrier.arrive");
  if (rt.aborting) return;
  Mbar& b = bar_at(p, tx_bytes ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive", f, loc);
  b.tx += tx_bytes;
  b.expect_bytes += tx_bytes;
  if (--b.pending < 0)
    raise_fault("mbarrier", fmt("mbarrier at %s: more arrivals than its count %d in phase %u",
                                smem_where(p).c_str(), b.expected, b.phase), f, loc);
  maybe_complete(smem_addr(p), b);
}
// mbarrier.try_wait.parity in a loop: returns once the phase of parity `parity` has completed, i.e. the
// barrier's current (incomplete) phase has the other parity (PTX ISA "mbarrier.test_wait/try_wait").
inline void mbar_wait(void* p, unsigned parity, const std::source_location& loc) {
  Fiber* f = cur("mbarrier.try_wait.parity");
  if (rt.aborting) return;
  Mbar& b0 = bar_at(p, "mbarrier.try_wait.parity", f, loc);
  (void)b0;
  const uint32_t a = smem_addr(p);
  for (;;) {
    Mbar& b = *find_bar(a);
    if ((b.phase & 1u) != (parity & 1u)) break;
    st.th[f->linear].wait_bar = a;
    st.th[f->linear].wait_parity = parity & 1u;
    block_here(f, Op::mbar_wait, 0, loc);
  }
  __asm__ volatile("" ::: "memory");
}

// -- TMA (PTX ISA "cp.async.bulk.tensor"; CUDA programming guide "Tensor Memory Accelerator") ----
// The box is laid out in shared memory row-major (dimension 0 fastest, box[0] * esize bytes a row);
// with swizzle the 16-byte chunk index inside each span is XORed with the address bits above the
// 128-byte line: bits [4,7) ^= bits [7,10) for 128B, [4,6) ^= [7,9) for 64B, bit 4 ^= bit 7 for 32B
// (cute Swizzle<3,4,3>, <2,4,3>, <1,4,3>).  The pattern follows the shared address, so a box not
// aligned to the pattern's repeat (1024/512/256 bytes) gets a shifted pattern, as on hardware.
inline uint32_t swizzle_addr(uint32_t a, unsigned mode) {  // mode: 0 none, 1 32B, 2 64B, 3 128B
  static const uint32_t mask[4] = {0, 1, 3, 7};
  return a ^ (((a >> 7) & mask[mode & 3]) << 4);
}
inline const CUtensorMap& check_map(const CUtensorMap* m, const char* what, Fiber* f, const std::source_location& loc) {
  if (!m || m->magic != kTensorMapMagic)
    raise_fault("tma", fmt("%s: the tensor map was not encoded (kumiko_emu_tensor_map_encode_tiled)", what), f, loc);
  return *m;
}
// Visits every box element: fn(shared byte offset in the box (unswizzled), global byte offset, in bounds).
template <class F>
inline void box_walk(const CUtensorMap& m, const int* c, F&& fn) {
  unsigned idx[5] = {0, 0, 0, 0, 0};
  const unsigned total = unsigned(m.box[0]) * m.box[1] * m.box[2] * m.box[3] * m.box[4];
  for (unsigned lin = 0; lin < total; ++lin) {
    bool in = true;
    long long goff = 0;
    for (int d = 0; d < m.rank; ++d) {
      const long long g = (long long)c[d] + idx[d];
      in = in && g >= 0 && g < (long long)m.dims[d];
      goff += g * (long long)m.strides[d];
    }
    fn(lin * m.esize, goff, in);
    for (int d = 0; d < 5; ++d) {
      if (++idx[d] < m.box[d]) break;
      idx[d] = 0;
    }
  }
}
inline void write_both(uint32_t a, const unsigned char* src, size_t n) {
  std::memcpy(smem_ptr(a), src, n);
  std::memcpy(view() + a, src, n);
}
inline void land(const TmaLand& t) {
  for (const auto& r : t.runs) write_both(r.first, r.second.data(), r.second.size());
  complete_tx(t.bar, t.bytes);
}
// The bytes of a TMA's box; the instruction's rank must be the tensor map's.
inline unsigned tma_box_bytes(int rank, const CUtensorMap& m, const Fiber* f, const std::source_location& loc) {
  if (m.rank != rank)
    raise_fault("tma", fmt("cp.async.bulk.tensor.%dd with a rank-%d tensor map", rank, m.rank), f, loc);
  return unsigned(m.box[0]) * m.box[1] * m.box[2] * m.box[3] * m.box[4] * m.esize;
}
inline void tma_load(int rank, void* dst, const CUtensorMap* map, void* bar, const int* c, const std::source_location& loc) {
  Fiber* f = cur("cp.async.bulk.tensor (load)");
  if (rt.aborting) return;
  const CUtensorMap& m = check_map(map, "cp.async.bulk.tensor load", f, loc);
  const unsigned bytes = tma_box_bytes(rank, m, f, loc);
  check_shared(dst, bytes, 128, "cp.async.bulk.tensor destination", f, loc);
  bar_at(bar, "cp.async.bulk.tensor mbarrier", f, loc);
  TmaLand t{smem_addr(dst), smem_addr(bar), {}, bytes};
  const auto* g = reinterpret_cast<const unsigned char*>(uintptr_t(m.address));
  box_walk(m, c, [&](unsigned off, long long goff, bool in) {
    std::vector<unsigned char> v(m.esize, 0);
    if (in) std::memcpy(v.data(), g + goff, m.esize);
    else if (m.oob) {  // CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA: the type's canonical NaN
      const uint32_t nan32 = 0x7fffffffu;
      const uint16_t nan16 = 0x7fffu;
      std::memcpy(v.data(), m.esize == 4 ? static_cast<const void*>(&nan32) : &nan16, m.esize == 4 ? 4 : 2);
    }
    const uint32_t a = swizzle_addr(t.dst + off, m.swizzle);
    if (!t.runs.empty() && t.runs.back().first + t.runs.back().second.size() == a)
      t.runs.back().second.insert(t.runs.back().second.end(), v.begin(), v.end());
    else t.runs.push_back({a, std::move(v)});
  });
  if (rt.cfg.cp_async == CpAsyncMode::eager) land(t);
  else st.landing.push_back(std::move(t));
}
// Called by the scheduler when no thread can run: deferred TMA loads complete now.
inline bool progress() {
  if (st.landing.empty()) return false;
  std::vector<TmaLand> l;
  l.swap(st.landing);
  for (const auto& t : l) land(t);
  return true;
}

inline void check_async_read(uint32_t a, size_t n, const char* what, const Fiber* f, const std::source_location& loc) {
  const unsigned char* g = smem_ptr(a);
  const unsigned char* v = view() + a;
  if (std::memcmp(g, v, n) == 0) return;
  size_t i = 0;
  while (g[i] == v[i]) ++i;
  raise_fault("async_proxy_fence",
              fmt("%s reads %s, which a thread wrote after the last fence.proxy.async (the async proxy may "
                  "see the old bytes)", what, smem_where(g + i).c_str()), f, loc);
}
inline void check_acc_poison_bits(uint32_t bits, const char* what, const Fiber* f, const std::source_location* loc) {
  if ((bits & 0x7fffffffu) != kAccPoison) return;
  record_fault("poisoned_read", fmt("%s: a wgmma accumulator read before wgmma.wait_group retired its group "
                                    "(poison 0x%08x)", what, bits), f, loc);
  throw Abort{};
}
inline void perform_store(const BulkStore& s, const Fiber* f) {
  const CUtensorMap& m = s.map;
  auto* g = reinterpret_cast<unsigned char*>(uintptr_t(m.address));
  box_walk(m, s.coords, [&](unsigned off, long long goff, bool in) {
    const unsigned char* p = smem_ptr(swizzle_addr(s.src + off, m.swizzle));
    if (m.esize == 4) {
      uint32_t bits;
      std::memcpy(&bits, p, 4);
      check_acc_poison_bits(bits, "cp.async.bulk.tensor store", f, &s.loc);
    }
    if (in) std::memcpy(g + goff, p, m.esize);  // out-of-bounds elements are not written
  });
}
inline void tma_store(int rank, const CUtensorMap* map, const void* src, const int* c, const std::source_location& loc) {
  Fiber* f = cur("cp.async.bulk.tensor (store)");
  if (rt.aborting) return;
  const CUtensorMap& m = check_map(map, "cp.async.bulk.tensor store", f, loc);
  const unsigned bytes = tma_box_bytes(rank, m, f, loc);
  check_shared(src, bytes, 128, "cp.async.bulk.tensor source", f, loc);
  check_async_read(smem_addr(src), bytes, "cp.async.bulk.tensor store", f, loc);
  BulkStore s{m, smem_addr(src), {0, 0, 0, 0, 0}, loc};
  for (int d = 0; d < rank; ++d) s.coords[d] = c[d];
  if (rt.cfg.cp_async == CpAsyncMode::eager) perform_store(s, f);
  else ts(f).bulk_open.push_back(s);
}
inline void bulk_commit() {
  Fiber* f = cur("cp.async.bulk.commit_group");
  if (rt.aborting) return;
  ts(f).bulk_groups.push_back(std::move(ts(f).bulk_open));
  ts(f).bulk_open.clear();
}
inline void bulk_wait(int n) {
  Fiber* f = cur("cp.async.bulk.wait_group");
  if (rt.aborting) return;
  auto& gs = ts(f).bulk_groups;
  while (gs.size() > size_t(n)) {
    for (const auto& s : gs.front()) perform_store(s, f);
    gs.erase(gs.begin());
  }
  __asm__ volatile("" ::: "memory");
}
inline void fence_proxy_async() {
  cur("fence.proxy.async");
  if (rt.aborting) return;
  sync_view();
}

}  // namespace sm90
}  // namespace emu
#include "cuda_emu_sm90_wgmma.h"
namespace emu __attribute__((visibility("hidden"))) {
namespace sm90 {

// -- setmaxnreg (PTX ISA "setmaxnreg"): per warp, from a pool of 64K registers per block ----------
inline void setmaxnreg(bool inc, unsigned n, const std::source_location& loc) {
  Fiber* f = cur(inc ? "setmaxnreg.inc" : "setmaxnreg.dec");
  if (rt.aborting) return;
  if (n < 24 || n > 256 || n % 8)
    raise_fault("setmaxnreg", fmt("setmaxnreg %u: the count must be a multiple of 8 in [24, 256]", n), f, loc);
  WarpRegs& w = st.warp_regs[f->warp];
  ThreadState& me = ts(f);
  const unsigned call = me.nreg_calls++;
  if (call < w.calls) return;  // another lane of this warp applied it
  if (w.busy) {                // another lane of this warp is waiting for the registers: wait with it
    while (call >= w.calls) block_here(f, Op::setmaxnreg, 0, loc);
    return;
  }
  if (inc ? n < w.regs : n > w.regs)
    raise_fault("setmaxnreg", fmt("setmaxnreg.%s %u in warp %u, which holds %u registers per thread", inc ? "inc" : "dec",
                                  n, f->warp, w.regs), f, loc);
  const long long delta = 32ll * (static_cast<long long>(n) - static_cast<long long>(w.regs));
  w.busy = true;
  while (inc && st.reg_pool < delta) block_here(f, Op::setmaxnreg, 0, loc);  // until another warp releases
  st.reg_pool -= delta;
  w.regs = n;
  w.calls = call + 1;
  w.busy = false;
  for (unsigned k = 0; k < rt.nthreads; ++k) {  // the warp's other lanes, and warps waiting for registers
    Fiber& g = rt.fibers[wake_order(k, rt.nthreads)];
    if (g.state == Fiber::Waiting && g.wait_op == Op::setmaxnreg) push_ready(g);
  }
}

// At the end of a block (so a poisoned accumulator read elsewhere is reported first): work a thread left behind.
inline void block_done() {
  for (unsigned i = 0; i < rt.nthreads; ++i) {
    const ThreadState& me = st.th[i];
    const Fiber* f = &rt.fibers[i];
    if (!me.wg_groups.empty() || !me.wg_open.empty()) {
      record_fault("wgmma", fmt("thread %u exited with %zu wgmma group(s) never retired by wgmma.wait_group", i,
                                me.wg_groups.size() + !me.wg_open.empty()), f, nullptr);
      return;
    }
    if (!me.bulk_groups.empty() || !me.bulk_open.empty()) {
      record_fault("bulk_async", fmt("thread %u exited with %zu TMA store group(s) not waited for "
                                     "(cp.async.bulk.wait_group)", i, me.bulk_groups.size() + !me.bulk_open.empty()),
                   f, nullptr);
      return;
    }
  }
}
inline std::string deadlock_detail() {
  std::string s;
  std::vector<uint32_t> seen;
  for (unsigned i = 0; i < rt.nthreads; ++i) {
    const Fiber& g = rt.fibers[i];
    if (g.state != Fiber::Waiting || g.wait_op != Op::mbar_wait) continue;
    const uint32_t a = st.th[i].wait_bar;
    if (std::find(seen.begin(), seen.end(), a) != seen.end()) continue;
    seen.push_back(a);
    const Mbar& b = *find_bar(a);
    s += fmt(" mbarrier at %s (count %d, initialised at %s): waited for with parity %u in phase %u, %d of %d arrivals "
             "missing, %lld transaction bytes outstanding (expect_tx announced %lld, TMA delivered %lld);",
             bar_name(a).c_str(), b.expected, where(b.init_loc).c_str(), st.th[i].wait_parity, b.phase, b.pending,
             b.expected, b.tx, b.expect_bytes, b.delivered);
  }
  for (unsigned i = 0; i < rt.nthreads; ++i)
    if (rt.fibers[i].state == Fiber::Waiting && rt.fibers[i].wait_op == Op::setmaxnreg) {
      s += fmt(" setmaxnreg.inc waits for registers no warp releases (%lld free in the block);", st.reg_pool);
      break;
    }
  return s;
}

}  // namespace sm90

inline void sm90_reset_block() { sm90::reset_block(); }
inline bool sm90_progress() { return sm90::progress(); }
inline void sm90_block_done() { sm90::block_done(); }
inline std::string sm90_deadlock_detail() { return sm90::deadlock_detail(); }
inline void acc_poison_seen(uint32_t bits) {
  if (g_cur && (bits & 0x7fffffffu) == sm90::kAccPoison) sm90::check_acc_poison_bits(bits, "conversion", g_cur, nullptr);
}

}  // namespace emu

#include "cuda_emu_sm90_api.h"
#endif  // KUMIKO_CUDA_EMU_SM90_H
