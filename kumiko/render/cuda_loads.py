"""The SM80 MMA skeleton's operand loads as CUDA C: how the GPU IR's ``LoadTile`` fills an operand's shared-memory
ring stage - 16-byte cp.async copies for aligned operands (``OperandLoad.vec``), gathers by rows (``MmaKernel.row_run``)
or through per-warp K tables (``GatherTable``), and the scalar gather through the operand's index map otherwise - with
the per-thread chunk and row state set up once before the K loop. ``render.cuda``'s MMA renderer inherits it."""
from __future__ import annotations

from kumiko.kernel import cexpr
from kumiko.kernel.gpu_ir import Compute, LoadTile, MmaFrag, MmaKernel, OperandLoad
from kumiko.render.cuda_common import code


class LoadRenderer:
    """Renders the GPU IR's operand loads of an ``MmaKernel``: cp.async copies, row gathers, gather tables and
    element gathers into shared memory, and the chunk / gather setup before the K loop. Holds the state the loads
    need (tile, rings, the gather's conversion, split-K's tile offsets); ``render.cuda``'s ``_MmaRenderer`` adds
    the MMA, the epilogue and the main loop."""

    def __init__(self, k: MmaKernel):
        self.k = k
        self.bm, self.bn, self.bk = k.tile
        self.rings = {r.operand: r for r in k.rings}
        dt = next(s.mma.dtype for s in k.loop.body if isinstance(s, (Compute, MmaFrag)))
        self.cvt = cexpr.HALF[dt][1]      # the gather's float -> the MMA's 16-bit type
        # split-K: loop tiles are this CTA's (``KT`` of them from K tile ``kk_t0``); only split 0 holds K's partial
        # tile, so the copies' K-before-0 test reads ``kk_kd0`` (0 for the other splits)
        self.t0 = "kk_t0 + " if k.split else ""
        self.kd = "kk_kd0" if k.split else "kk_kd"

    def load_operand(self, ld: OperandLoad, s: LoadTile, pad: str, aligned: bool) -> list[str]:
        """One operand's copy of K tile ``s.tile`` into its ring stage: 16-byte cp.async chunks in the loop
        version for aligned operands (``aligned``), else the scalar gather through the index map."""
        k, ring = self.k, self.rings[ld.operand]
        head = [f"{pad}{{",
                f"{pad}  uint16_t* const kk_d{ld.operand} = {ring.name} + ({s.tile.c()} % {k.stages}) * "
                f"{ring.stage_elems};"]
        if not self.gathered(ld, aligned):
            body = self.copies(ld, s, pad + "  ")
        elif self.tabled(ld, aligned):
            body = self.gather_table(ld, s, pad + "  ")
        elif self.row_run(ld) is not None:
            body = self.gather_rows(ld, s, pad + "  ")
        else:
            body = self.gather(ld, s, pad + "  ")
        return head + body + [f"{pad}}}"]

    def copies(self, ld: OperandLoad, s: LoadTile, ind: str) -> list[str]:
        """The thread's 16-byte chunks of the tile. The contiguous extent is a multiple of 8 (``vec.aligned``)
        and chunks start at multiples of 8, so a chunk is wholly inside or wholly outside: 16 bytes or none,
        never a partial src-size (which costs ptxas address arithmetic per copy). A chunk of none reads
        nothing, but its address is the operand's base all the same (the chunk's own may lie outside the
        operand, and the PTX ISA asks for a valid, aligned source). Only K tile 0 can hold K indices outside
        [0, K) (before 0: ``kk_kd`` of them), so the K loop's copies test the loop-invariant row bounds alone."""
        o, ring = ld.operand, self.rings[ld.operand]
        sk = ring.layout == "sk"
        ch, _, rows = self.chunks(ld)
        first = s.pred_k and s.tile.may_be_first        # K's partial tile: indices before 0 are zero-filled
        if sk:      # rows are the operand's M/N (rows left below chunk 0: kk_l), columns K (one per thread)
            conds = [f"kk_l{o} > kk_i * {rows}"] if s.pred_rows else []
            conds += [f"kk_c0{o} >= {self.kd}"] if first else []
            count = f"({' && '.join(conds)}) ? 8 : 0" if conds else "8"
        else:       # rows are K, columns the operand's N (the chunk's valid halves: kk_l)
            full = f"kk_l{o}" if s.pred_rows else "8"
            count = f"kk_r >= {self.kd} ? {full} : 0" if first else full
        return [f"{ind}const uint16_t* const kk_src = kk_p{o} + (long long){s.tile.c()} * kk_ks{o};",
                f"{ind}#pragma unroll",
                f"{ind}for (int kk_i = 0; kk_i < {ch}; ++kk_i) {{",
                f"{ind}  const int kk_r = kk_r0{o} + kk_i * {rows}, kk_cc = kk_c0{o};",
                f"{ind}  const int kk_n = {count};",
                f"{ind}  cp_async_16(kk_d{o} + kk_r * {ring.ld} + kk_cc, kk_n ? kk_src + kk_i * kk_q{o} : "
                f"(const uint16_t*){ld.vec.buf}, kk_n * 2);",
                f"{ind}}}"]

    @staticmethod
    def gathered(ld: OperandLoad, aligned: bool) -> bool:
        """Whether the loop version (``aligned``: every vector operand 16-byte aligned) gathers operand ``ld``
        (it has no cp.async access, or this is the unaligned version) instead of copying it."""
        return ld.vec is None or not aligned

    def row_run(self, ld: OperandLoad) -> int | None:
        """The columns a thread fills when ``ld``'s gather goes by rows (``MmaKernel.row_run``), else None
        (then ``gather`` spreads the tile's elements over the threads)."""
        return self.k.row_run(ld)

    def tabled(self, ld: OperandLoad, fast: bool) -> bool:
        """Whether the loop version (``fast``: vector operands aligned, table gathers' int32 arithmetic exact)
        gathers ``ld`` through its per-warp K tables (``GatherTable``)."""
        return fast and self.gathered(ld, fast) and self.k.table_run(ld) is not None

    def gather_setup(self, pad: str, aligned: bool) -> list[str]:
        """Before the prologue of a loop version: for each operand it gathers by rows, the thread's tile row
        ``kk_grX`` and first column ``kk_gcX``, the row's index ``kk_sX``, its bound ``kk_inX`` and the
        operand's M/N indices decomposed from it - once, not per element and K tile (for an implicit GEMM's
        im2col that is three 64-bit divisions by run-time sizes an element)."""
        out = []
        for ld in self.k.loads:
            run = self.row_run(ld) if self.gathered(ld, aligned) else None
            if run is None:
                continue
            o, rows = ld.operand, self.rings[ld.operand].rows
            out += [f"{pad}const int kk_gr{o} = tid % {rows}, kk_gc{o} = tid / {rows} * {run};  "
                    f"// {o} gathered by rows: the thread's row of the tile and first column",
                    f"{pad}const long long kk_s{o} = {'m0' if o == 'x' else 'n0'} + kk_gr{o};",
                    f"{pad}const bool kk_in{o} = kk_s{o} < {ld.s_extent};"]
            out += code(ld.decl_s, len(pad) // 2)
            if self.tabled(ld, aligned):
                out += self.table_setup(ld, pad)
        return out

    def table_setup(self, ld: OperandLoad, pad: str) -> list[str]:
        """The row's part of a table gather, once: the base pointer, the row's offset and guard bounds (ints),
        whether the row is in range and passes its own guards, and the warp's table in shared memory."""
        o, t = ld.operand, ld.table
        at, per_warp = self.k.table_offsets()[0][o]
        out = [f"{pad}const {t.ctype}* kk_gb{o} = {t.buf} + ({t.base}) + ({t.row_off});  "
               f"// {o} through per-warp K tables: the row's element at K part 0",
               # opaque to ptxas, which would otherwise re-form the pointer from the parameter at every load
               "#ifndef KUMIKO_EMU", f"{pad}asm(\"\" : \"+l\"(kk_gb{o}));", "#endif"]
        out += [f"{pad}const int kk_L{o}{j} = (int)({bound});" for j, (_, _, bound) in enumerate(t.guards)]
        out += [f"{pad}const bool kk_ok{o} = kk_in{o} && ({t.row_ok});",
                f"{pad}int* const kk_t{o} = reinterpret_cast<int*>(kk_smem + {at}) + warp * {per_warp};"]
        return out

    def gather_table(self, ld: OperandLoad, s: LoadTile, ind: str) -> list[str]:
        """The thread's run of its row through the warp's K table: the warp's lanes write the K parts of the
        tile's columns (one column a lane), then each element is a table read, one compare per guard and the
        load, all in 32 bits; every load of a group of up to 32 columns issues before their shared stores."""
        o, ring, t = ld.operand, self.rings[ld.operand], ld.table
        run, w = self.k.table_run(ld), t.width
        first = s.pred_k and s.tile.may_be_first
        cols = "; ".join(f"kk_t{o}[kk_c * {w} + {i}] = (int)({c})" for i, c in enumerate(t.cols))
        out = [f"{ind}uint16_t* const kk_row = kk_d{o} + kk_gr{o} * {ring.ld} + kk_gc{o};",
               f"{ind}__syncwarp();  // the warp's reads of its previous table are done",
               f"{ind}for (int kk_c = lane; kk_c < {run}; kk_c += 32) {{",
               f"{ind}  const long long kk_gk = kk_k0 + kk_gc{o} + kk_c < 0 ? 0 : kk_k0 + kk_gc{o} + kk_c;"]
        out += code(ld.decl_k, len(ind) // 2 + 1)
        out += [f"{ind}  {cols};", f"{ind}}}", f"{ind}__syncwarp();  // the table is visible to the warp's lanes"]
        group = min(run, 32)
        vec = group % 8 == 0
        field = "xyzw"
        conds = [f"kk_ok{o}"] if s.pred_rows else []
        conds += [f"kk_c{i // 4}.{field[i % 4]} {'>=' if op == 'ge' else '<=' if op == 'le' else '=='} kk_L{o}{j}"
                  for j, (op, i, _) in enumerate(t.guards)]
        if first:
            conds.append(f"kk_k0 + kk_gc{o} + kk_j + kk_e >= 0")
        ix = "kk_c0.x"
        out += [f"{ind}#pragma unroll", f"{ind}for (int kk_j = 0; kk_j < {run}; kk_j += {group}) {{",
                f"{ind}  uint16_t kk_h[{group}];", f"{ind}  #pragma unroll",
                f"{ind}  for (int kk_e = 0; kk_e < {group}; ++kk_e) {{"]
        out += [f"{ind}    const int4 kk_c{q} = *reinterpret_cast<const int4*>(kk_t{o} + (kk_j + kk_e) * {w} + "
                f"{4 * q});" for q in range(w // 4)]
        if t.raw:
            out += [f"{ind}    uint16_t kk_u = 0;",
                    f"{ind}    if ({' && '.join(conds) or 'true'}) kk_u = __ldg(kk_gb{o} + {ix});",
                    f"{ind}    kk_h[kk_e] = kk_u;"]
        else:
            out += [f"{ind}    float kk_v = 0.0f;",
                    f"{ind}    if ({' && '.join(conds) or 'true'}) {{",
                    f"{ind}      const int kk_ix = {ix};",
                    f"{ind}      {t.ld_decl}"]
            out += code(t.value, len(ind) // 2 + 3)
            out += [f"{ind}    }}", f"{ind}    kk_h[kk_e] = {self.cvt}(kk_v);"]
        out.append(f"{ind}  }}")
        if vec:
            words = ", ".join(f"kk_h[kk_e + {2 * w_}] | (uint32_t)kk_h[kk_e + {2 * w_ + 1}] << 16" for w_ in range(4))
            out += [f"{ind}  #pragma unroll", f"{ind}  for (int kk_e = 0; kk_e < {group}; kk_e += 8)",
                    f"{ind}    st_shared_16(kk_row + kk_j + kk_e, {words});"]
        else:
            out += [f"{ind}  #pragma unroll", f"{ind}  for (int kk_e = 0; kk_e < {group}; ++kk_e) "
                    "kk_row[kk_j + kk_e] = kk_h[kk_e];"]
        out.append(f"{ind}}}")
        return out

    def gather_rows(self, ld: OperandLoad, s: LoadTile, ind: str) -> list[str]:
        """The thread's run of its row's columns through the operand's index map, zero outside it; eight
        columns are packed into one 16-byte shared store when the run allows (8 consecutive rows of a
        padded ring row stride fall in distinct banks)."""
        o, ring = ld.operand, self.rings[ld.operand]
        run = self.row_run(ld)
        first = s.pred_k and s.tile.may_be_first
        conds = ([f"kk_in{o}"] if s.pred_rows else []) + (["kk_gk >= 0"] if first else [])
        vec = run % 8 == 0
        col = "kk_j + kk_e" if vec else "kk_j"
        # past K's partial tile every column of the run is a K index >= 0: its K axes are decomposed once,
        # then advanced as a counter (a few instructions a column, where a 64-bit division by a constant
        # costs about 25); on tile 0 each column is decomposed, as negative indices are skipped
        counter = not first and bool(ld.advance_k)
        out = [f"{ind}uint16_t* const kk_row = kk_d{o} + kk_gr{o} * {ring.ld} + kk_gc{o};"]
        if counter:
            out.append(f"{ind}const long long kk_gk = kk_k0 + kk_gc{o};")
            out += code(ld.run_k, len(ind) // 2)
        out.append(f"{ind}for (int kk_j = 0; kk_j < {run}; kk_j += {8 if vec else 1}) {{")
        if vec:
            out += [f"{ind}  uint16_t kk_h[8];", f"{ind}  #pragma unroll",
                    f"{ind}  for (int kk_e = 0; kk_e < 8; ++kk_e) {{"]
        else:
            out.append(f"{ind}  {{")
        if not counter:
            out.append(f"{ind}    const long long kk_gk = kk_k0 + kk_gc{o} + {col};")
        out += [f"{ind}    float kk_v = 0.0f;",
                f"{ind}    if ({' && '.join(conds) or 'true'}) {{"]
        out += code((() if counter else ld.decl_k) + ld.gather, len(ind) // 2 + 3)
        out.append(f"{ind}    }}")
        if counter:
            out.append(f"{ind}    {ld.advance_k}")
        if vec:
            words = ", ".join(f"kk_h[{2 * w}] | (uint32_t)kk_h[{2 * w + 1}] << 16" for w in range(4))
            out += [f"{ind}    kk_h[kk_e] = {self.cvt}(kk_v);", f"{ind}  }}",
                    f"{ind}  st_shared_16(kk_row + kk_j, {words});", f"{ind}}}"]
        else:
            out += [f"{ind}    kk_row[kk_j] = {self.cvt}(kk_v);", f"{ind}  }}", f"{ind}}}"]
        return out

    def gather(self, ld: OperandLoad, s: LoadTile, ind: str) -> list[str]:
        """Element by element through the operand's index map, zero outside it (any alignment): the tile's
        elements in turn over the threads."""
        k, ring, o = self.k, self.rings[ld.operand], ld.operand
        s0 = "m0" if o == "x" else "n0"
        sk = ring.layout == "sk"
        gs = f"{s0} + {'kk_r' if sk else 'kk_cc'}"
        gk = f"kk_k0 + {'kk_cc' if sk else 'kk_r'}"
        first = s.pred_k and s.tile.may_be_first
        conds = ([f"kk_s{o} < {ld.s_extent}"] if s.pred_rows else []) + (["kk_gk >= 0"] if first else [])
        out = [f"{ind}for (int kk_i = tid; kk_i < {ring.rows * ring.cols}; kk_i += {k.threads}) {{",
               f"{ind}  const int kk_r = kk_i / {ring.cols}, kk_cc = kk_i % {ring.cols};",
               f"{ind}  const long long kk_s{o} = {gs}, kk_gk = {gk};",
               f"{ind}  float kk_v = 0.0f;",
               f"{ind}  if ({' && '.join(conds) or 'true'}) {{"]
        out += code(ld.decl_s + ld.decl_k + ld.gather, len(ind) // 2 + 2)
        out += [f"{ind}  }}", f"{ind}  kk_d{ld.operand}[kk_r * {ring.ld} + kk_cc] = {self.cvt}(kk_v);", f"{ind}}}"]
        return out

    def chunks(self, ld: OperandLoad) -> tuple[int, int, int]:
        """(chunks a thread copies per tile, 16-byte chunks per ring row, ring rows between its chunks):
        chunk ``kk_i`` of thread ``tid`` is chunk ``tid + kk_i * threads`` of the tile, so (threads being a
        multiple of a row's chunks, checked by the verifier) it sits ``kk_i * rows`` rows below chunk 0."""
        ring = self.rings[ld.operand]
        cpr = ring.cols // 8
        return ring.rows * cpr // self.k.threads, cpr, self.k.threads // cpr

    def chunk_setup(self, ld: OperandLoad) -> list[str]:
        """Before the K loop: the thread's first cp.async chunk (ring row ``kk_r0X``, column ``kk_c0X``), its
        tile-0 source address ``kk_pX`` (the operand's index map at K = -kk_kd, where tile 0 starts), the
        address step ``kk_qX`` between its chunks, ``kk_ksX`` between K tiles, and the loop-invariant bound
        ``kk_lX``: rows of M/N left below chunk 0, clamped to the tile (``sk``), or the chunk's valid halves,
        8 or 0 (``ks``: all chunks share the column). Addresses are formed for every chunk; only the loads'
        predicates decide what is read."""
        o, sk, vec = ld.operand, self.rings[ld.operand].layout == "sk", ld.vec
        s0 = "m0" if o == "x" else "n0"
        _, cpr, rows = self.chunks(ld)
        cap = self.bm if o == "x" else self.bn
        bound = (f"const int kk_l{o} = (int)max(0LL, min({ld.s_extent} - kk_gs{o}, {cap}LL));" if sk
                 else f"const int kk_l{o} = {ld.s_extent} > kk_gs{o} ? 8 : 0;  // whole chunks (vec.aligned)")
        out = [f"  const int kk_r0{o} = tid / {cpr}, kk_c0{o} = (tid % {cpr}) * 8;",
               f"  const long long kk_q{o} = (long long){rows} * {vec.s_step if sk else vec.k_step};",
               f"  const long long kk_ks{o} = (long long){self.bk} * {vec.k_step};  // one K tile",
               f"  const uint16_t* kk_p{o};",
               f"  const long long kk_gs{o} = {s0} + {f'kk_r0{o}' if sk else f'kk_c0{o}'};",
               f"  {bound}",
               "  {",
               f"    const long long kk_s{o} = kk_gs{o}, kk_gk = {f'kk_c0{o}' if sk else f'kk_r0{o}'}"
               f"{f' + (long long)kk_t0 * {self.bk}' if self.k.split else ''} - kk_kd;"]
        out += code(ld.decl_s + ld.decl_k, 2)
        out += [f"    kk_p{o} = {vec.buf} + {vec.offset};", "  }"]
        return out

    def load_tile(self, s: LoadTile, pad: str, aligned: bool) -> list[str]:
        out = [f"{pad}if ({s.tile.c()} < KT) {{  // {s.out_token.kind} {s.out_token.name}[{s.tile.c()}]"]
        if any(self.gathered(ld, aligned) for ld in self.k.loads):      # a gather's K index
            tile = f"({self.t0}{s.tile.c()})" if self.k.split else s.tile.c()
            out.append(f"{pad}  const long long kk_k0 = (long long){tile} * {self.bk} - kk_kd;")
        for ld in self.k.loads:
            out += self.load_operand(ld, s, pad + "  ", aligned)
        out.append(f"{pad}}}")
        return out
