"""Render the fused streaming attention kernel (``kumiko.kernel.gpu_attention.AttentionKernel``) as CUDA C.

One CTA: BM query rows of one batch point, a warp per 16 rows. A lane holds rows ``g`` and ``g + 8`` of its
warp's rows (g = lane / 4) and, of each n8 tile, columns 2t and 2t + 1 (t = lane % 4): the row max and
sum are a lane's own values combined over the quad (``shfl_xor`` 1 and 2); the sum stays per lane until
the end (every lane of a quad rescales by the same factor). Statements print in the IR's order; the element
code (score, epilogue) is loop IR printed by the C renderer.
"""
from __future__ import annotations

from kumiko.kernel.gpu_attention import AttentionKernel, LoadBlock, LoadQFrag, OnlineSoftmax, PvMma, ScoreMma
from kumiko.render.cuda_common import close_kernel, code, open_cta_kernel, pipeline_stmts


class _AttentionRenderer:
    def __init__(self, k: AttentionKernel):
        self.k = k
        self.bm, self.bn, _ = k.tile
        self.d, self.dv = k.head
        self.rings = {r.name: r for r in k.rings}
        self.loads = {ld.ring: ld for ld in k.loads}
        dt = next(s.mma.dtype for s in k.loop.body if isinstance(s, ScoreMma))
        self.mma = "mma_m16n8k16_bf16f32" if dt == "bf16" else "mma_m16n8k16_f16f32"
        self.pack = "pack_bfloat162" if dt == "bf16" else "pack_half2"

    def stage(self, ring: str, tile: str) -> str:
        r = self.rings[ring]
        return f"{r.name} + ({tile} % {r.stages}) * {r.stage_elems}" if r.stages > 1 else r.name

    def load_block(self, s: LoadBlock, pad: str) -> list[str]:
        """The ring's 16-byte chunks of block ``s.tile``: rows past the extent get src-size 0 and, as the PTX
        ISA asks for a valid source all the same, the operand's base address."""
        r, ld = self.rings[s.ring], self.loads[s.ring]
        cpr = r.cols // 8
        row0 = "m0" if s.ring == "sQ" else f"(long long){s.tile.c()} * {self.bn}"
        ok = f"kk_row < {ld.extent}" if s.pred_rows else "true"
        head = f"if ({s.tile.c()} < KT) {{" if s.ring != "sQ" else "{"
        return [f"{pad}{head}  // {s.out_token.kind} {s.out_token.name}[{s.tile.c()}]",
                f"{pad}  uint16_t* const kk_d = {self.stage(s.ring, s.tile.c())};",
                f"{pad}  const long long kk_r0 = {row0};",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int kk_i = 0; kk_i < {r.rows * cpr // self.k.threads}; ++kk_i) {{",
                f"{pad}    const int kk_c = tid + kk_i * {self.k.threads}, kk_r = kk_c / {cpr}, "
                f"kk_cc = (kk_c % {cpr}) * 8;",
                f"{pad}    const long long kk_row = kk_r0 + kk_r;",
                f"{pad}    const bool kk_ok = {ok};",
                f"{pad}    cp_async_16(kk_d + kk_r * {r.ld} + kk_cc, kk_ok ? kk_p{s.ring} + kk_row * {ld.row_step} + "
                f"kk_cc : kk_p{s.ring}, kk_ok ? 16 : 0);",
                f"{pad}  }}",
                f"{pad}}}"]

    def q_frag(self, s: LoadQFrag, pad: str) -> list[str]:
        r = self.rings["sQ"]
        return [f"{pad}// consumes {', '.join(t.name for t in s.in_tokens)}: the warp's Q fragments, once",
                f"{pad}#pragma unroll",
                f"{pad}for (int kk = 0; kk < {self.d // 16}; ++kk)",
                f"{pad}  ldmatrix_x4(kk_qf[kk], sQ + (warp * 16 + lane % {s.lda.row_lanes}) * {r.ld} + kk * 16 + "
                "(lane / 16) * 8);"]

    def score_mma(self, s: ScoreMma, pad: str) -> list[str]:
        """S = Q K^T: K's block is [keys][D] (an n8 tile's B fragment is 8 keys x k16), read by ldmatrix.x4: matrices
        (keys 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) of a 16-key pair of n8 tiles."""
        r = self.rings["sK"]
        return [f"{pad}{{  // consumes {s.in_tokens[0].name}[{s.tile.c()}], produces {s.out_token.name}",
                f"{pad}  const uint16_t* const kk_b = {self.stage('sK', s.tile.c())};",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int nt = 0; nt < {self.bn // 8}; ++nt)",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int e = 0; e < 4; ++e) kk_s[nt][e] = 0.0f;",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int kk = 0; kk < {self.d // 16}; ++kk)",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int np = 0; np < {self.bn // 16}; ++np) {{",
                f"{pad}      uint32_t kk_r4[4];",
                f"{pad}      ldmatrix_x4(kk_r4, kk_b + (np * 16 + (lane % {s.ldb.row_lanes // 2}) + (lane / 16) * 8) * "
                f"{r.ld} + kk * 16 + ((lane / 8) % 2) * 8);",
                f"{pad}      const uint32_t kk_b0[2] = {{kk_r4[0], kk_r4[1]}}, kk_b1[2] = {{kk_r4[2], kk_r4[3]}};",
                f"{pad}      {self.mma}(kk_s[2 * np], kk_qf[kk], kk_b0, kk_s[2 * np]);",
                f"{pad}      {self.mma}(kk_s[2 * np + 1], kk_qf[kk], kk_b1, kk_s[2 * np + 1]);",
                f"{pad}    }}",
                f"{pad}}}"]

    def softmax(self, s: OnlineSoftmax, pad: str) -> list[str]:
        """The region's score code on each S element (columns past N: -inf), then per row r (g, g + 8): the new
        max over the block and the quad, the rescale of O and the sum, P = exp2(k2 z - k2 m) in place of S."""
        k, k2 = self.k, f"{self.k.k2!r}f"
        conds = "kk_gm < kk_M && kk_gn < kk_N" if s.mask_tail else "kk_gm < kk_M"
        out = [f"{pad}{{  // consumes {s.in_token.name}, produces {s.out_token.name}: online softmax",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int nt = 0; nt < {self.bn // 8}; ++nt)",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int e = 0; e < 4; ++e) {{",
                f"{pad}      const long long kk_gm = m0 + warp * 16 + g + 8 * (e >> 1);",
                f"{pad}      const long long kk_gn = (long long)kt * {self.bn} + nt * 8 + 2 * t + (e & 1);",
                f"{pad}      float kk_z = -INFINITY;",
                f"{pad}      if ({conds}) {{"]
        ind = len(pad) // 2 + 4
        out += code(k.decl_score, ind)
        out.append(f"{pad}        const float kk_acc = kk_s[nt][e];")
        out += code(k.score, ind)
        out += [f"{pad}      }}",
                f"{pad}      kk_s[nt][e] = kk_z;",
                f"{pad}    }}",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int r = 0; r < 2; ++r) {{",
                f"{pad}    float kk_mn = kk_mx[r];",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int nt = 0; nt < {self.bn // 8}; ++nt) "
                "kk_mn = fmaxf(kk_mn, fmaxf(kk_s[nt][2 * r], kk_s[nt][2 * r + 1]));",
                f"{pad}    kk_mn = fmaxf(kk_mn, shfl_xor_f32(kk_mn, 1));",
                f"{pad}    kk_mn = fmaxf(kk_mn, shfl_xor_f32(kk_mn, 2));",
                f"{pad}    // a row with no unmasked column yet subtracts 0: exp2(-inf) = 0, never -inf - -inf",
                f"{pad}    const float kk_ms = kk_mn == -INFINITY ? 0.0f : kk_mn * {k2};"]
        if s.rescale:
            out += [f"{pad}    const float kk_al = exp2_ftz(kk_mx[r] * {k2} - kk_ms);  // the old max's scale",
                    f"{pad}    kk_l[r] *= kk_al;",
                    f"{pad}    #pragma unroll",
                    f"{pad}    for (int dt = 0; dt < {self.dv // 8}; ++dt) {{ kk_o[dt][2 * r] *= kk_al; "
                    "kk_o[dt][2 * r + 1] *= kk_al; }"]
        out += [f"{pad}    kk_mx[r] = kk_mn;",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int nt = 0; nt < {self.bn // 8}; ++nt)",
                f"{pad}      #pragma unroll",
                f"{pad}      for (int h = 0; h < 2; ++h) {{",
                f"{pad}        const float kk_p = exp2_ftz(fmaf(kk_s[nt][2 * r + h], {k2}, -kk_ms));",
                f"{pad}        kk_s[nt][2 * r + h] = kk_p;",
                f"{pad}        kk_l[r] += kk_p;",
                f"{pad}      }}",
                f"{pad}  }}",
                f"{pad}}}"]
        return out

    def pv_mma(self, s: PvMma, pad: str) -> list[str]:
        """O += P V: the S accumulators of n8 tiles 2kk, 2kk + 1 are the A fragment of k16 step kk (registers: row g
        cols 2t.., row g + 8, row g cols + 8, row g + 8 cols + 8); V's block is [keys][DV], read transposed."""
        r = self.rings["sV"]
        return [f"{pad}{{  // consumes {', '.join(t.name for t in s.in_tokens)}[{s.tile.c()}], produces "
                f"{s.out_token.name}",
                f"{pad}  const uint16_t* const kk_b = {self.stage('sV', s.tile.c())};",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int kk = 0; kk < {self.bn // 16}; ++kk) {{",
                f"{pad}    const uint32_t kk_a[4] = {{{self.pack}(kk_s[2 * kk][0], kk_s[2 * kk][1]), "
                f"{self.pack}(kk_s[2 * kk][2], kk_s[2 * kk][3]),",
                f"{pad}                              {self.pack}(kk_s[2 * kk + 1][0], kk_s[2 * kk + 1][1]), "
                f"{self.pack}(kk_s[2 * kk + 1][2], kk_s[2 * kk + 1][3])}};",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int dp = 0; dp < {self.dv // 16}; ++dp) {{",
                f"{pad}      uint32_t kk_r4[4];",
                f"{pad}      ldmatrix_x4_trans(kk_r4, kk_b + (kk * 16 + lane % {s.ldb.row_lanes}) * {r.ld} + dp * 16 + "
                "(lane / 16) * 8);",
                f"{pad}      const uint32_t kk_b0[2] = {{kk_r4[0], kk_r4[1]}}, kk_b1[2] = {{kk_r4[2], kk_r4[3]}};",
                f"{pad}      {self.mma}(kk_o[2 * dp], kk_a, kk_b0, kk_o[2 * dp]);",
                f"{pad}      {self.mma}(kk_o[2 * dp + 1], kk_a, kk_b1, kk_o[2 * dp + 1]);",
                f"{pad}    }}",
                f"{pad}  }}",
                f"{pad}}}"]

    def stmts(self, body, pad: str) -> list[str]:
        return pipeline_stmts(body, pad, self.stmt)

    def stmt(self, s, pad: str) -> list[str]:
        if isinstance(s, LoadBlock):
            return self.load_block(s, pad)
        if isinstance(s, LoadQFrag):
            return self.q_frag(s, pad)
        if isinstance(s, ScoreMma):
            return self.score_mma(s, pad)
        if isinstance(s, OnlineSoftmax):
            return self.softmax(s, pad)
        if isinstance(s, PvMma):
            return self.pv_mma(s, pad)
        raise TypeError(s)

    def epilogue(self) -> list[str]:
        """O / l (the quad's partial sums added) through the consumer's epilogue, rows past M not stored."""
        k, e, st = self.k, self.k.epilogue, self.k.store
        cond = "kk_gm < kk_M" if st.pred_rows else "true"
        out = [f"  {{  // epilogue {list(e.ops)}: consumes {e.in_token.name}, produces {e.out_token.name}; "
               f"st.global consumes {st.in_token.name}",
               "  float kk_ls[2];",
               "  #pragma unroll",
               "  for (int r = 0; r < 2; ++r) {",
               "    kk_ls[r] = kk_l[r] + shfl_xor_f32(kk_l[r], 1);",
               "    kk_ls[r] += shfl_xor_f32(kk_ls[r], 2);",
               "  }"]
        out += code(k.batch1, 1)
        out += ["  #pragma unroll", f"  for (int dt = 0; dt < {self.dv // 8}; ++dt)",
                "    #pragma unroll", "    for (int e = 0; e < 4; ++e) {",
                "      const long long kk_gm = m0 + warp * 16 + g + 8 * (e >> 1);",
                "      const long long kk_gn = dt * 8 + 2 * t + (e & 1);",
                f"      if ({cond}) {{"]
        out += code(k.decl_out, 4)
        out.append("        const float kk_acc = kk_o[dt][e] / kk_ls[e >> 1];")
        out += code(e.code, 4)
        out += ["      }", "    }", "  }"]
        return out

    def render(self) -> str:
        k = self.k
        rq, rk, rv = (self.rings[n] for n in ("sQ", "sK", "sV"))
        out = [f"// {n}" for n in k.notes]
        out += [f"// plan: BM {self.bm}, BN {self.bn}, D {self.d}, DV {self.dv}, {k.threads // 32} warps, K and V "
                f"double-buffered, smem {k.smem_bytes} B",
                *open_cta_kernel(k),
                "  uint16_t* const sQ = reinterpret_cast<uint16_t*>(kk_smem);",
                f"  uint16_t* const sK = sQ + {rq.stages * rq.stage_elems};",
                f"  uint16_t* const sV = sK + {rk.stages * rk.stage_elems};",
                "  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;"]
        out += code(k.setup, 1)
        out.append(f"  const long long m0 = (long long)blockIdx.x * {self.bm};")
        if k.bound:
            out += ["  // key blocks past the last column any of the block's rows sees through the guards: not loaded",
                    f"  const long long kk_mhi = (m0 + {self.bm} < kk_M ? m0 + {self.bm} : kk_M) - 1;",
                    f"  long long kk_nend = {k.bound};",
                    "  kk_nend = kk_nend > kk_N ? kk_N : kk_nend < 0 ? 0 : kk_nend;"]
        else:
            out.append("  const long long kk_nend = kk_N;")
        out.append(f"  const int KT = (int)((kk_nend + {self.bn - 1}) / {self.bn});")
        for ld in k.loads:
            scope = ["  {"] + code(k.batch1, 2) if ld.ring == "sV" else ["  {"]
            out += [f"  const uint16_t* kk_p{ld.ring};"] + scope + [f"    kk_p{ld.ring} = {ld.base};", "  }"]
        out += [f"  uint32_t kk_qf[{self.d // 16}][4];  // the warp's Q fragments",
                f"  float kk_s[{self.bn // 8}][4];     // S, then P, of one key block",
                f"  float kk_o[{self.dv // 8}][4];     // the running output",
                "  #pragma unroll",
                f"  for (int dt = 0; dt < {self.dv // 8}; ++dt)",
                "    #pragma unroll",
                "    for (int e = 0; e < 4; ++e) kk_o[dt][e] = 0.0f;",
                "  float kk_mx[2] = {-INFINITY, -INFINITY}, kk_l[2] = {0.0f, 0.0f};  // rows g, g + 8: max, sum"]
        for part in (k.prologue, (k.loop,), k.drain):
            out += self.stmts(part, "  ")
        out += self.epilogue()
        out += close_kernel(k)
        return "\n".join(out)


def render_attention(k: AttentionKernel) -> str:
    return _AttentionRenderer(k).render()
