// cuda_emu_sm90_wgmma.h — wgmma.mma_async in the emulator: matrix descriptors, the m64nNk16 fragment layouts,
// the warpgroup rendezvous, in-flight (poisoned) accumulators, commit and wait groups.  Included by
// cuda_emu_sm90.h only (it uses that file's state).
#ifndef KUMIKO_CUDA_EMU_SM90_WGMMA_H
#define KUMIKO_CUDA_EMU_SM90_WGMMA_H
namespace emu __attribute__((visibility("hidden"))) {
namespace sm90 {

// -- wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate") --------------------
// Matrix descriptor ("Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading
// dimension byte offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 matrix base offset,
// 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B).  Canonical layouts ("Shared Memory Matrix Layout",
// T = 8 16-bit elements = 16 bytes, S = swizzle span): K-major, no swizzle ((8,m),(T,2k)):((1T,SBO),(1,LBO));
// K-major swizzled ((8,m),(T,2k)):((S/2,SBO),(1,T)) (rows S bytes apart; LBO unused for k16);
// MN-major, no swizzle ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); MN-major swizzled
// ((T,S/16,m),(8,k)):((1,T,LBO),(S/2,SBO)).  The swizzle XOR is applied to the resulting address.
struct Desc { uint32_t start, lbo, sbo, base, swz; };
inline Desc decode(uint64_t d) {
  return Desc{uint32_t(d & 0x3fffu) << 4, uint32_t((d >> 16) & 0x3fffu) << 4, uint32_t((d >> 32) & 0x3fffu) << 4,
              uint32_t((d >> 49) & 7u), uint32_t(d >> 62)};
}
inline unsigned desc_tma_mode(uint32_t swz) {  // descriptor code -> swizzle_addr mode
  static const unsigned m[4] = {0, 3, 2, 1};
  return m[swz & 3];
}
// The shared address of element (mn, k) (k < 16) of a 16-bit operand.
inline uint32_t desc_addr(const Desc& d, bool mn_major, unsigned mn, unsigned k) {
  const unsigned mode = desc_tma_mode(d.swz);
  const uint32_t span = mode ? (16u << mode) : 0;  // 32, 64, 128 bytes
  uint32_t a;
  if (!mn_major) {
    a = d.start + (mn / 8) * d.sbo + (k / 8) * (span ? 16u : d.lbo) + (mn % 8) * (span ? span : 16u) + (k % 8) * 2;
  } else if (!span) {
    a = d.start + (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
  } else {
    const unsigned w = span / 16;  // 16-byte chunks per row
    a = d.start + (mn % 8) * 2 + ((mn / 8) % w) * 16 + (mn / (8 * w)) * d.lbo + (k % 8) * span + (k / 8) * d.sbo;
  }
  return swizzle_addr(a, mode);
}
inline double read16(uint32_t a, bool bf16, const char* what, const Fiber* f, const std::source_location& loc) {
  if (a + 2 > uint32_t(rt.sh_hi - rt.sh_lo))
    raise_fault("wgmma", fmt("%s: descriptor address 0x%x is past shared memory", what, a), f, loc);
  uint16_t v;
  std::memcpy(&v, smem_ptr(a), 2);
  if (rt.cfg.poison_check && v == 0xFFFFu)
    raise_fault("poisoned_read", fmt("%s read never-written shared memory (0xFFFF poison) at %s: a TMA load no "
                                     "mbarrier wait ordered, or an unfilled tile", what, smem_where(smem_ptr(a)).c_str()),
                f, loc);
  check_async_read(a, 2, what, f, loc);
  return bf16 ? fp::bf16_to_f32(v) : fp::f16_to_f32(v);
}
inline void compute(WgOp& op, const Fiber* f);
inline const float* c_of(WgOp& op, unsigned t, const Fiber* f) {
  if (op.chain[t]) {
    compute(*op.chain[t], f);
    return op.chain[t]->result.data() + size_t(t) * (op.n / 2);
  }
  return op.c.data() + size_t(t) * (op.n / 2);
}
// D fragment of m64nNk16 ("Register Fragments ... wgmma .m64nNk16", the accumulator D): warp w of the
// warpgroup holds rows 16w..16w+15; lane l, register v: row 16w + l/4 + 8*((v>>1)&1), column
// 8*(v>>2) + 2*(l%4) + (v&1).  A from registers: per warp the mma.m16n8k16 A layout (a0,a1: row g,
// k 2t..2t+1; a2,a3: row g+8; a4..a7: the same with k + 8), two 16-bit values a register, low first.
inline void compute(WgOp& op, const Fiber* f) {
  if (op.computed) return;
  const char* what = op.bf16 ? "wgmma.mma_async (bf16)" : "wgmma.mma_async (f16)";
  const Desc db = decode(op.b_desc), da = decode(op.a_desc);
  if (db.base || (!op.a_regs && da.base))
    raise_fault("wgmma", fmt("%s: matrix base offset (descriptor bits 49-51) is not emulated", what), f, op.loc);
  std::vector<double> A(64 * 16), B(16 * size_t(op.n));
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned k = 0; k < 16; ++k) {
      if (op.a_regs) {
        const unsigned w = r / 16, g = r % 8, hi_r = (r % 16) / 8, t = (k % 8) / 2, hi_k = k / 8;
        const unsigned i = (k & 1) + 2 * hi_r + 4 * hi_k, lane = g * 4 + t;
        const uint32_t reg = op.a[w * 32 + lane][i / 2];
        const uint16_t v = uint16_t(i & 1 ? reg >> 16 : reg & 0xffffu);
        A[r * 16 + k] = op.bf16 ? fp::bf16_to_f32(v) : fp::f16_to_f32(v);
      } else {
        A[r * 16 + k] = read16(desc_addr(da, false, r, k), op.bf16, what, f, op.loc);
      }
    }
  for (unsigned k = 0; k < 16; ++k)
    for (unsigned nn = 0; nn < unsigned(op.n); ++nn)
      B[k * op.n + nn] = read16(desc_addr(db, op.trans_b, nn, k), op.bf16, what, f, op.loc);
  const unsigned per = unsigned(op.n) / 2;
  op.result.assign(128 * size_t(per), 0.0f);
  for (unsigned t = 0; t < 128; ++t) {
    const float* c = op.scale_d ? c_of(op, t, f) : nullptr;
    const unsigned w = t / 32, l = t % 32;
    for (unsigned v = 0; v < per; ++v) {
      const unsigned row = 16 * w + l / 4 + 8 * ((v >> 1) & 1), col = 8 * (v >> 2) + 2 * (l % 4) + (v & 1);
      double s = c ? double(c[v]) : 0.0;
      for (unsigned k = 0; k < 16; ++k) s += A[row * 16 + k] * B[k * op.n + col];
      op.result[size_t(t) * per + v] = float(s);
    }
  }
  op.computed = true;
}
inline float poison_f() { return fp::bits_f32(kAccPoison); }

template <int N>
inline void mma_async(float* d, const uint32_t* a_regs, uint64_t a_desc, uint64_t b_desc, int scale_d, bool bf16,
                      bool trans_b, const std::source_location& loc) {
  static_assert(N >= 8 && N <= 256 && N % 8 == 0, "wgmma m64nNk16: N is 8..256 in steps of 8");
  Fiber* f = cur("wgmma.mma_async");
  if (rt.aborting) return;
  const unsigned wg = f->linear / 128, t = f->linear % 128;
  if ((wg + 1) * 128 > rt.nthreads)
    raise_fault("wgmma", fmt("wgmma.mma_async by thread %u: warpgroup %u is not 128 threads", f->linear, wg), f, loc);
  ThreadState& me = ts(f);
  bool in_flight = false;
  for (auto& g : me.wg_groups) for (WgOp* o : g) in_flight |= o->d[t] == d;
  for (WgOp* o : me.wg_open) in_flight |= o->d[t] == d;
  if (!in_flight && !me.wg_fenced)
    raise_fault("wgmma_fence", "wgmma.mma_async on accumulator registers with no wgmma.fence since they were last "
                "accessed (PTX ISA: wgmma.fence must order register accesses before wgmma.mma_async)", f, loc);
  WgRendezvous& r = st.rv[wg];
  if (r.arrived && (r.n != N || r.bf16 != bf16 || r.a_regs != (a_regs != nullptr) || r.trans_b != trans_b ||
                    r.a_desc != a_desc || r.b_desc != b_desc || r.scale_d != scale_d))
    raise_fault("wgmma", fmt("threads of warpgroup %u reach different wgmma.mma_async (N %d vs %d, descriptors "
                             "0x%llx/0x%llx vs 0x%llx/0x%llx, scale-d %d vs %d; the other at %s)", wg, N, r.n,
                             (unsigned long long)a_desc, (unsigned long long)b_desc, (unsigned long long)r.a_desc,
                             (unsigned long long)r.b_desc, scale_d, r.scale_d, where(r.loc).c_str()), f, loc);
  if (!r.arrived) {
    r.n = N; r.bf16 = bf16; r.a_regs = a_regs != nullptr; r.trans_b = trans_b;
    r.a_desc = a_desc; r.b_desc = b_desc; r.scale_d = scale_d; r.loc = loc;
  }
  r.d[t] = d;
  if (a_regs) std::memcpy(r.a[t], a_regs, 16);
  if (++r.arrived < 128) {
    block_here(f, Op::wgmma, 0, loc);
    return;
  }
  // the last of the 128 threads: issue the op for the warpgroup
  auto op = std::make_unique<WgOp>();
  op->n = N; op->bf16 = bf16; op->a_regs = r.a_regs; op->trans_b = trans_b;
  op->a_desc = a_desc; op->b_desc = b_desc; op->scale_d = scale_d; op->wg = wg; op->loc = loc;
  op->c.assign(128 * size_t(N / 2), 0.0f);
  for (unsigned u = 0; u < 128; ++u) {
    op->d[u] = r.d[u];
    std::memcpy(op->a[u], r.a[u], 16);
    ThreadState& o = st.th[wg * 128 + u];
    WgOp* prev = nullptr;
    for (auto& g : o.wg_groups) for (WgOp* x : g) if (x->d[u] == r.d[u]) prev = x;
    for (WgOp* x : o.wg_open) if (x->d[u] == r.d[u]) prev = x;
    op->chain[u] = prev;
    if (!prev) std::memcpy(op->c.data() + size_t(u) * (N / 2), r.d[u], sizeof(float) * (N / 2));
    for (int v = 0; v < N / 2; ++v) r.d[u][v] = poison_f();
    o.wg_open.push_back(op.get());
  }
  WgOp* raw = op.get();
  st.ops.push_back(std::move(op));
  r = WgRendezvous{};
  ++rt.stats.collectives;
  (void)raw;
  for (unsigned k = 0; k < 128; ++k) {
    const unsigned u = wake_order(k, 128);
    if (u != t) push_ready(rt.fibers[wg * 128 + u]);
  }
}
inline void wgmma_fence() {
  Fiber* f = cur("wgmma.fence");
  if (!rt.aborting) ts(f).wg_fenced = true;
}
inline void wgmma_commit() {
  Fiber* f = cur("wgmma.commit_group");
  if (rt.aborting) return;
  ts(f).wg_groups.push_back(std::move(ts(f).wg_open));
  ts(f).wg_open.clear();
}
inline void wgmma_wait(int n, const std::source_location& loc) {
  Fiber* f = cur("wgmma.wait_group");
  if (rt.aborting) return;
  ThreadState& me = ts(f);
  const unsigned t = f->linear % 128;
  // A scheduling point: other threads (a producer warpgroup) run before the product is computed, so a stage
  // released or refilled too early is what this retire reads.
  if (me.wg_groups.size() > size_t(n)) yield_here(f);
  while (me.wg_groups.size() > size_t(n)) {
    const auto& group = me.wg_groups.front();
    for (size_t oi = 0; oi < group.size(); ++oi) {
      WgOp* op = group[oi];
      compute(*op, f);
      bool newer = false;  // a later op (retired now or still in flight) continues these accumulators
      for (size_t j = oi + 1; j < group.size(); ++j) newer |= group[j]->d[t] == op->d[t];
      for (size_t gi = 1; gi < me.wg_groups.size(); ++gi) for (WgOp* x : me.wg_groups[gi]) newer |= x->d[t] == op->d[t];
      for (WgOp* x : me.wg_open) newer |= x->d[t] == op->d[t];
      if (newer) continue;
      float* d = op->d[t];
      for (int v = 0; v < op->n / 2; ++v)
        if (fp::f32_bits(d[v]) != kAccPoison)
          raise_fault("wgmma", fmt("accumulator register %d was written while its wgmma.mma_async was in flight "
                                   "(between mma_async and the wait_group that retires it)", v), f, loc);
      std::memcpy(d, op->result.data() + size_t(t) * (op->n / 2), sizeof(float) * (op->n / 2));
    }
    me.wg_groups.erase(me.wg_groups.begin());
  }
  me.wg_fenced = false;
  __asm__ volatile("" ::: "memory");
}

}  // namespace sm90
}  // namespace emu
#endif  // KUMIKO_CUDA_EMU_SM90_WGMMA_H
