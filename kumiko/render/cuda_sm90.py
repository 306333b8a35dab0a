"""Render an SM90 GPU IR kernel (``kernel/gpu_ir_sm90.Sm90Kernel``) as CUDA C over kumiko_cuda.cuh's SM90 API.

One spelling per statement, PTX only through the header's functions (mbar_*, tma_*, bulk_*, wgmma_*,
setmaxnreg_*), so the same text builds with nvcc for sm_90a and with g++ for the emulator. Tensor maps are
``const __grid_constant__ CUtensorMap`` parameters (the host encodes them: ``runtime/tensormap``), the
shared-memory buffers live in one dynamic array aligned to 1024 bytes (the 128-byte swizzle's repeat),
mbarriers in static shared memory. Deterministic: the same IR gives byte-identical source.
"""
from __future__ import annotations

import re

from kumiko.kernel.gpu_ir_sm90 import (
    DESC_SWIZZLE,
    AccToSmem,
    BarRef,
    BulkCommit,
    BulkWait,
    Elect,
    FenceMbarInit,
    FenceProxyAsync,
    For,
    FragEpilogue,
    If,
    Let,
    MatDesc,
    MbarArrive,
    MbarArriveTx,
    MbarInit,
    MbarWait,
    RescalePack,
    Role,
    Roles,
    SetMaxNReg,
    Sm90Kernel,
    SmemRef,
    SoftmaxInit,
    SoftmaxStep,
    SplitKSum,
    SyncThreads,
    TmaLoad,
    TmaStore,
    WgmmaCommit,
    WgmmaFence,
    WgmmaMma,
    WgmmaWait,
)
from kumiko.render.cuda_common import close_kernel, code, cuda_params


class _Sm90Renderer:
    def __init__(self, k: Sm90Kernel):
        self.k = k
        self.role_first = 0              # thread 0 of the enclosing role (Elect)

    def ref(self, r: SmemRef) -> str:
        b = self.k.buf(r.buf)
        extra = f" + {r.offset}" if r.offset else ""
        return f"(kk_smem + {b.offset} + {r.stage.c()} * {b.stage_bytes}{extra})"

    @staticmethod
    def bar(r: BarRef) -> str:
        return f"&{r.name}[{r.index.c()}]"

    def desc(self, d: MatDesc) -> str:
        return f"wgmma_desc({self.ref(d.ref)} + {d.k_bytes.c()}, {d.lbo}, {d.sbo}, {DESC_SWIZZLE[d.swizzle]})"

    def fence_operands(self, pad: str, names=None) -> list[str]:
        return [f"{pad}wgmma_fence_operand({name});" for name, _ in self.k.accs if names is None or name in names]

    def stmt(self, s, pad: str) -> list[str]:
        k = self.k
        if isinstance(s, MbarInit):
            return [f"{pad}mbar_init({self.bar(s.bar)}, {s.count});"]
        if isinstance(s, MbarArrive):
            return [f"{pad}mbar_arrive({self.bar(s.bar)});"]
        if isinstance(s, MbarArriveTx):
            return [f"{pad}mbar_arrive_expect_tx({self.bar(s.bar)}, {s.bytes});"]
        if isinstance(s, MbarWait):
            return [f"{pad}mbar_wait({self.bar(s.bar)}, {s.parity.c()});"]
        if isinstance(s, TmaLoad):
            cs = ", ".join(c.c() for c in s.coords)
            return [f"{pad}tma_load_{len(s.coords)}d({self.ref(s.dst)}, &{s.map}, {self.bar(s.bar)}, {cs});"]
        if isinstance(s, TmaStore):
            cs = ", ".join(c.c() for c in s.coords)
            return [f"{pad}tma_store_{len(s.coords)}d(&{s.map}, {self.ref(s.src)}, {cs});"]
        if isinstance(s, BulkCommit):
            return [f"{pad}bulk_commit();"]
        if isinstance(s, BulkWait):
            return [f"{pad}bulk_wait{'_read' if s.read else ''}<{s.pending}>();"]
        if isinstance(s, FenceProxyAsync):
            return [f"{pad}fence_proxy_async();"]
        if isinstance(s, FenceMbarInit):
            return [f"{pad}fence_mbarrier_init();"]
        if isinstance(s, SyncThreads):
            return [f"{pad}__syncthreads();"]
        if isinstance(s, WgmmaFence):
            return self.fence_operands(pad) + [f"{pad}wgmma_fence();"]
        if isinstance(s, WgmmaMma):
            bf16 = "true" if s.dtype == "bf16" else "false"
            tb = int(s.b.major == "MN")
            if isinstance(s.a, MatDesc):
                return [f"{pad}wgmma_ss<{s.n}, {bf16}, {tb}>({s.acc}, {self.desc(s.a)}, {self.desc(s.b)}, "
                        f"{s.scale_d.c()});"]
            a = s.a if s.a_row is None else f"{s.a}[{s.a_row.c()}]"
            return [f"{pad}wgmma_rs<{s.n}, {bf16}, {tb}>({s.acc}, {a}, {self.desc(s.b)}, {s.scale_d.c()});"]
        if isinstance(s, WgmmaCommit):
            return [f"{pad}wgmma_commit();"]
        if isinstance(s, WgmmaWait):
            return [f"{pad}wgmma_wait<{s.pending}>();"] + self.fence_operands(pad, s.retired)
        if isinstance(s, AccToSmem):
            n = dict(k.accs)[s.acc]
            return [f"{pad}{{  // {s.acc} (m64n{n} D fragment) -> shared memory, fp32 row-major",
                    f"{pad}  float* const kk_c = reinterpret_cast<float*>({self.ref(s.dst)});",
                    f"{pad}  const int kk_l = threadIdx.x % 32, kk_w = (threadIdx.x / 32) % 4;",
                    f"{pad}#pragma unroll",
                    f"{pad}  for (int kk_v = 0; kk_v < {n // 2}; ++kk_v)",
                    f"{pad}    kk_c[(16 * kk_w + kk_l / 4 + 8 * ((kk_v >> 1) & 1)) * {s.ld} + 8 * (kk_v >> 2) + "
                    f"2 * (kk_l % 4) + (kk_v & 1)] = {s.acc}[kk_v];",
                    f"{pad}}}"]
        if isinstance(s, FragEpilogue):
            n = dict(k.accs)[s.acc]
            acc = f"{s.acc}[kk_v]"
            head = [f"{pad}{{  // epilogue on {s.acc} (m64n{n} D fragment): predicated stores",
                    f"{pad}  const int kk_l = threadIdx.x % 32, kk_w = (threadIdx.x / 32) % 4;"]
            head += code(s.setup, len(pad) // 2 + 1)
            if s.row_div:           # the quad's partial row sums added: each lane holds a quarter of its rows' columns
                acc = f"{acc} / kk_rs[(kk_v >> 1) & 1]"
                head += [f"{pad}  float kk_rs[2];",
                         f"{pad}#pragma unroll",
                         f"{pad}  for (int kk_r = 0; kk_r < 2; ++kk_r) {{",
                         f"{pad}    kk_rs[kk_r] = {s.row_div}[kk_r] + shfl_xor_f32({s.row_div}[kk_r], 1);",
                         f"{pad}    kk_rs[kk_r] += shfl_xor_f32(kk_rs[kk_r], 2);",
                         f"{pad}  }}"]
            return (head + [
                     f"{pad}#pragma unroll",
                     f"{pad}  for (int kk_v = 0; kk_v < {n // 2}; ++kk_v) {{",
                     f"{pad}    const long long kk_gm = (long long){s.row0.c()} + 16 * kk_w + kk_l / 4 + "
                     "8 * ((kk_v >> 1) & 1);",
                     f"{pad}    const long long kk_gn = (long long){s.col0.c()} + 8 * (kk_v >> 2) + 2 * (kk_l % 4) + "
                     "(kk_v & 1);",
                     f"{pad}    if (kk_gm < kk_M && kk_gn < {s.cols}) {{"]
                    + code(s.decls, len(pad) // 2 + 3) + [f"{pad}      const float kk_acc = {acc};"]
                    + code(s.code, len(pad) // 2 + 3) + [f"{pad}    }}", f"{pad}  }}", f"{pad}}}"])
        if isinstance(s, SplitKSum):
            return self.split_sum(s, pad)
        if isinstance(s, SoftmaxInit):
            n = dict(k.accs)[s.acc]
            return [f"{pad}// the online softmax's row state (rows g, g + 8 of the warp): max, sum, rescale factor",
                    f"{pad}float kk_mx[2] = {{-INFINITY, -INFINITY}}, kk_sum[2] = {{0.0f, 0.0f}}, kk_al[2];",
                    f"{pad}#pragma unroll",
                    f"{pad}for (int kk_v = 0; kk_v < {n // 2}; ++kk_v) {s.acc}[kk_v] = 0.0f;"]
        if isinstance(s, SoftmaxStep):
            return self.softmax(s, pad)
        if isinstance(s, RescalePack):
            n, nv = dict(k.accs)[s.acc], dict(k.accs)[s.out]
            pack = "pack_bfloat162" if s.dtype == "bf16" else "pack_half2"
            return [f"{pad}{{  // {s.out} *= the rows' rescale; P ({s.acc}) to 16-bit A fragments {s.regs}",
                    f"{pad}#pragma unroll",
                    f"{pad}  for (int kk_v = 0; kk_v < {nv // 2}; ++kk_v) {s.out}[kk_v] *= kk_al[(kk_v >> 1) & 1];",
                    f"{pad}#pragma unroll",
                    f"{pad}  for (int kk_j = 0; kk_j < {n // 16}; ++kk_j)",
                    f"{pad}#pragma unroll",
                    f"{pad}    for (int kk_i = 0; kk_i < 4; ++kk_i)",
                    f"{pad}      {s.regs}[kk_j][kk_i] = {pack}({s.acc}[8 * kk_j + 2 * kk_i], "
                    f"{s.acc}[8 * kk_j + 2 * kk_i + 1]);",
                    f"{pad}}}"]
        if isinstance(s, SetMaxNReg):
            return [f"{pad}setmaxnreg_{'inc' if s.inc else 'dec'}<{s.regs}>();"]
        if isinstance(s, For):
            head = [f"{pad}#pragma unroll"] if s.unroll else []
            return head + [f"{pad}for (int {s.var} = {s.start.c()}; {s.var} < {s.stop.c()}; ++{s.var}) {{",
                           *self.stmts(s.body, pad + "  "), f"{pad}}}"]
        if isinstance(s, If):
            return [f"{pad}if ({s.cond.c()}) {{", *self.stmts(s.body, pad + "  "), f"{pad}}}"]
        if isinstance(s, Let):
            return [f"{pad}const int {s.var} = {s.value.c()};"]
        if isinstance(s, Elect):
            return [f"{pad}if (threadIdx.x == {self.role_first}) {{", *self.stmts(s.body, pad + "  "), f"{pad}}}"]
        if isinstance(s, Roles):
            out = []
            for i, r in enumerate(s.roles):
                self.role_first = 128 * r.first
                cond = f"kk_wg >= {r.first} && kk_wg < {r.first + r.count}"
                out += [f"{pad}{'} else ' if i else ''}if ({cond}) {{  // role {r.name}",
                        *self.decls(_uses(r.body), pad + "  "), *self.stmts(r.body, pad + "  ")]
            self.role_first = 0
            return out + [f"{pad}}}"]
        raise TypeError(f"not an SM90 GPU IR statement: {type(s).__name__}")

    def split_sum(self, s: SplitKSum, pad: str) -> list[str]:
        """``SplitKSum``: this split's slab (a thread's element v at float v x 128 + its index in the warpgroup, so a
        warp's stores are coalesced), the thread's counter, and in the last thread to arrive the sum and the body."""
        n = dict(self.k.accs)[s.acc]
        slab = 64 * n                                   # floats of one consumer's share of a tile and split
        return [f"{pad}{{  // split-K: {s.acc}'s partial sums to split {s.split.c()}'s slab; the tile's last "
                "thread to arrive adds every split's",
                f"{pad}  const int kk_t = threadIdx.x % 128;",
                f"{pad}  const long long kk_sk = (long long)({s.tile.c()});",
                f"{pad}  float* const kk_wt = {s.workspace} + (kk_sk * {s.splits * s.parts} + {s.part}) * {slab}LL "
                "+ kk_t;  // split j's slab: + j x parts x slab",
                f"{pad}  float* const kk_mine = kk_wt + (long long)({s.split.c()}) * {s.parts * slab};",
                f"{pad}  const bool kk_live = {s.live.c()};",
                f"{pad}#pragma unroll",
                f"{pad}  for (int kk_v = 0; kk_v < {n // 2}; ++kk_v) kk_mine[kk_v * 128] = kk_live ? {s.acc}[kk_v] "
                ": 0.0f;",
                f"{pad}  __threadfence();  // the slab is visible device-wide before the count",
                f"{pad}  int* const kk_cw = {s.counters} + (kk_sk * {s.parts} + {s.part}) * 128 + kk_t;",
                f"{pad}  if (atomicAdd(kk_cw, 1) == {s.splits - 1}) {{",
                f"{pad}    __threadfence();  // every split's slab, read past L1",
                f"{pad}#pragma unroll",
                f"{pad}    for (int kk_v = 0; kk_v < {n // 2}; ++kk_v) {s.acc}[kk_v] = 0.0f;",
                f"{pad}#pragma unroll 1",
                f"{pad}    for (int kk_s = 0; kk_s < {s.splits}; ++kk_s) {{",
                f"{pad}      const float* const kk_p = kk_wt + (long long)kk_s * {s.parts * slab};",
                f"{pad}#pragma unroll",
                f"{pad}      for (int kk_v = 0; kk_v < {n // 2}; ++kk_v)",
                f"{pad}        {s.acc}[kk_v] += ld_global_cg(kk_p + kk_v * 128);",
                f"{pad}    }}",
                f"{pad}    *kk_cw = 0;  // zero again for the next launch",
                *self.stmts(s.body, pad + "    "),
                f"{pad}  }}",
                f"{pad}}}"]

    def softmax(self, s: SoftmaxStep, pad: str) -> list[str]:
        """The score code at each element of the block (element v: row 16w + l/4 + 8((v >> 1) & 1), column
        8(v >> 2) + 2(l % 4) + (v & 1)), then per row r of the lane (elements 4j + 2r + h): the new max over the block
        and the quad (``shfl_xor`` 1, 2), the rescale factor, P in place of S and the sum."""
        n, k2 = dict(self.k.accs)[s.acc], f"{s.k2!r}f"
        ind = len(pad) // 2
        out = [f"{pad}{{  // online softmax of {s.acc}'s key block",
               f"{pad}  const int kk_l = threadIdx.x % 32, kk_w = (threadIdx.x / 32) % 4;",
               f"{pad}  // a block inside M and N runs the score code without the per-element bounds test",
               f"{pad}  const bool kk_inside = (long long){s.row0.c()} + 64 <= kk_M && "
               f"(long long){s.col0.c()} + {n} <= kk_N;"]
        # (head, declarations, code): the guards' selects dropped where they admit the whole block, the block
        # inside M and N, the tail
        paths = [("if (kk_inside) {", s.decls, s.code), ("} else {", s.decls, s.code)]
        if s.inside:
            corners = {"kk_r0": f"(long long){s.row0.c()}", "kk_r1": f"(long long){s.row0.c()} + 63",
                       "kk_c0": f"(long long){s.col0.c()}", "kk_c1": f"(long long){s.col0.c()} + {n - 1}"}
            out += [f"{pad}  const long long {c} = {v};" for c, v in corners.items()
                    if re.search(rf"\b{c}\b", s.inside)]
            out.append(f"{pad}  // the guards hold on every element of the block: the score code without them")
            paths[:1] = [(f"if (kk_inside && {s.inside}) {{", s.free_decls, s.free_code),
                         ("} else if (kk_inside) {", s.decls, s.code)]
        for head, decls, body in paths:
            inside = head != "} else {"
            out += [f"{pad}  {head}",
                    f"{pad}#pragma unroll",
                    f"{pad}  for (int kk_v = 0; kk_v < {n // 2}; ++kk_v) {{"]
            if decls or not inside:       # (the score code may not use the element's row and column)
                out += [f"{pad}    const long long kk_gm = (long long){s.row0.c()} + 16 * kk_w + kk_l / 4 + "
                        "8 * ((kk_v >> 1) & 1);",
                        f"{pad}    const long long kk_gn = (long long){s.col0.c()} + 8 * (kk_v >> 2) + "
                        "2 * (kk_l % 4) + (kk_v & 1);"]
            out += [f"{pad}    float kk_z = -INFINITY;",
                    f"{pad}    {'{' if inside else 'if (kk_gm < kk_M && kk_gn < kk_N) {'}"]
            out += code(decls, ind + 3)
            out.append(f"{pad}      const float kk_acc = {s.acc}[kk_v];")
            out += code(body, ind + 3)
            out += [f"{pad}    }}",
                    f"{pad}    {s.acc}[kk_v] = kk_z;",
                    f"{pad}  }}"]
        out += [f"{pad}  }}",
                f"{pad}#pragma unroll",
                f"{pad}  for (int kk_r = 0; kk_r < 2; ++kk_r) {{",
                f"{pad}    float kk_mn = kk_mx[kk_r];",
                f"{pad}#pragma unroll",
                f"{pad}    for (int kk_j = 0; kk_j < {n // 8}; ++kk_j)",
                f"{pad}      kk_mn = fmaxf(kk_mn, fmaxf({s.acc}[4 * kk_j + 2 * kk_r], "
                f"{s.acc}[4 * kk_j + 2 * kk_r + 1]));",
                f"{pad}    kk_mn = fmaxf(kk_mn, shfl_xor_f32(kk_mn, 1));",
                f"{pad}    kk_mn = fmaxf(kk_mn, shfl_xor_f32(kk_mn, 2));",
                f"{pad}    // a row with no unmasked column yet subtracts 0: exp2(-inf) = 0, never -inf - -inf",
                f"{pad}    const float kk_ms = kk_mn == -INFINITY ? 0.0f : kk_mn * {k2};",
                (f"{pad}    kk_al[kk_r] = exp2_ftz(kk_mx[kk_r] * {k2} - kk_ms);  // the old max's scale" if s.rescale
                 else f"{pad}    kk_al[kk_r] = 1.0f;"),
                f"{pad}    kk_sum[kk_r] *= kk_al[kk_r];",
                f"{pad}    kk_mx[kk_r] = kk_mn;",
                f"{pad}#pragma unroll",
                f"{pad}    for (int kk_j = 0; kk_j < {n // 8}; ++kk_j)",
                f"{pad}#pragma unroll",
                f"{pad}      for (int kk_h = 0; kk_h < 2; ++kk_h) {{",
                f"{pad}        const float kk_p = exp2_ftz(fmaf({s.acc}[4 * kk_j + 2 * kk_r + kk_h], {k2}, -kk_ms));",
                f"{pad}        {s.acc}[4 * kk_j + 2 * kk_r + kk_h] = kk_p;",
                f"{pad}        kk_sum[kk_r] += kk_p;",
                f"{pad}      }}",
                f"{pad}  }}",
                f"{pad}}}"]
        return out

    def decls(self, names: set, pad: str) -> list[str]:
        """The accumulators and register arrays among ``names``, declared where they are used: inside a role, so
        they are not live in the other roles (after a producer's setmaxnreg.dec, a live accumulator spills)."""
        return ([f"{pad}float {name}[{n // 2}];" for name, n in self.k.accs if name in names] +
                [f"{pad}uint32_t {name}{_dims(n)};" for name, n in self.k.regs if name in names])

    def stmts(self, body, pad: str) -> list[str]:
        return [line for s in body for line in self.stmt(s, pad)]

    def render(self) -> str:
        k = self.k
        params = [f"const __grid_constant__ CUtensorMap {m.name}" for m in k.maps] + [f"int {s}" for s in k.scalars]
        if k.params:
            params.append(cuda_params(k.params))
        out = [f"// {n}" for n in k.notes]
        out += [f"extern \"C\" __global__ void __launch_bounds__({k.threads}, 1) {k.name}({', '.join(params)}) {{",
                "  extern __shared__ __align__(1024) unsigned char kk_smem[];"]
        out += [f"  __shared__ __align__(8) uint64_t {b.name}[{b.n}];" for b in k.bars]
        roles = [s for s in k.body if isinstance(s, Roles)]
        in_roles = _uses(tuple(r for s in roles for r in s.roles))
        out += self.decls({name for name, _ in k.accs + k.regs} - in_roles, "  ")
        if roles:
            out.append("  const int kk_wg = threadIdx.x / 128;")
        out += code(k.setup, 1)
        out += self.stmts(k.body, "  ")
        out += close_kernel(k)
        return "\n".join(out)


def _uses(body) -> set:
    """Names of the accumulators and A-register arrays the statements (nested ones too) use."""
    out: set = set()
    for s in body:
        if isinstance(s, WgmmaMma):
            out |= {s.acc} | ({s.a} if isinstance(s.a, str) else set())
        elif isinstance(s, (AccToSmem, FragEpilogue, SoftmaxInit, SoftmaxStep)):
            out.add(s.acc)
        elif isinstance(s, SplitKSum):
            out |= {s.acc} | _uses(s.body)
        elif isinstance(s, RescalePack):
            out |= {s.out, s.acc, s.regs}
        elif isinstance(s, (For, If, Elect, Role)):
            out |= _uses(s.body)
        elif isinstance(s, Roles):
            out |= _uses(s.roles)
    return out


def _dims(n) -> str:
    """``[n]``, or ``[a][b]`` for a register array of dims (a, b)."""
    return "".join(f"[{d}]" for d in (n if isinstance(n, tuple) else (n,)))


def render_sm90(k: Sm90Kernel) -> str:
    """The kernel as CUDA C (``extern "C" __global__`` + ``KUMIKO_ENTRY``)."""
    return _Sm90Renderer(k).render()
