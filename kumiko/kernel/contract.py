"""The packed contraction path: a top-level ``Reduce(sum, K, mul(x, y))`` of a region runs as a
BLIS-style blocked GEMM with packed panels and a register-blocked micro-kernel whose shape comes from
the Plan (``register_block`` (MR, NR), ``vectorize.width``, ``cache_block`` (MC, NC, KC)).

Nothing here knows op names. The contraction and the roles of its axes are the region's own facts
(``kumiko.region.analysis.find_contraction``: output axes that only ``x`` reads are M, those only ``y``
reads are N, those both read are batch, and the reduce axes are K), and so is the operands' orientation
(``kumiko.region.operands``).

The code lives in three modules: this one drives the kernel (blocks, thread splits, epilogues);
``kumiko.kernel.pack`` packs the operands' panels (index tables);
``kumiko.kernel.micro`` generates the micro-kernels and the C helpers they need (``kk_scratch``,
``kk_pack_rows8``); ``kumiko.kernel.stage`` reads a zero-padded B operand in place instead of packing it.

Parallelism. One ``omp parallel`` region; the tables are filled cooperatively. The threads split the
work one of three ways, chosen at run time from the thread count: whole batch points each (private
buffers, no barrier); a range of N each (private buffers, no barrier: when rows split unevenly, or
where the plan's ``bind.split`` says N: when A is small enough to be packed once per batch point and
kept for every K, or is at most 2 MiB under pre-packed weights); or a range of M rows each, in blocks of
at most MC rows, sharing each (N block, K block) of packed B that they pack together into one of two
buffers (one barrier per K block). Under a pre-packed B (the weights), where the plan splits M, there is
nothing to pack together: the M blocks come outermost, each all of K and its epilogue on one thread, and the
threads take them as they come (``_dealt_blocks``: each its own share first, then what is left of the
others'), not in fixed shares. K blocks are as the plan's ``k_blocks`` says: of equal size (at
most KC), or one block of all of K (the chooser's when A is pre-packed and B's panels for all of K fit in
L2: the weights then stream front to back, once), or that tested at run time when the sizes are
symbolic (``kumiko.plan.packed``). The
accumulator lives in a C scratch (row stride padded off multiples of 4 KiB) across K blocks; the
micro-kernel zeroes its accumulators, prefetches its C tile and adds it at the end. After the last K
block the rest of the region (the epilogue: bias, activation, cast; SRNF R3) runs on each thread's rows
of the block, along runs of the innermost N axis (``omp simd``), with counters instead of divisions; a
fused window reduction runs over the block's rows and their window groups, right after the block (each
thread on its own rows). Scratch buffers are kept per thread between calls (``kk_scratch``): fresh pages
each call cost more than packing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Assign, Block, Comment, Decl, For, If, Kernel, Param, Raw, Scratch, Store
from kumiko.kernel.lower_cpu import CpuLowering, parallelize
from kumiko.kernel.lower_vec import NotVector, VectorCtx
from kumiko.kernel.micro import astage_micro_name, micro_name, stage_micro_name
from kumiko.kernel.pack import PanelPacking, Side, advance_counter, panel_sides
from kumiko.kernel.stage import Stage
from kumiko.plan.packed import (
    A_RESIDENT_FLOATS,
    IN_PLACE_PANEL_BYTES,
    ONE_K_BLOCK_FLOATS,
    SPLIT_LIMITS,
    prepackable,
    read_tensors,
)
from kumiko.plan.plan import Plan
from kumiko.region.analysis import Contraction
from kumiko.region.operands import stage_bounds
from kumiko.region.srnf import children
from kumiko.region.ssa import Binary, BroadcastInDim, Cast, Const, Read, Ref, RExpr, Unary, VType
from kumiko.symbolic import Expr, prod

_MACS_PER_THREAD = 1 << 17   # the least work (multiply-adds) worth another thread of a contraction
DYN_BLOCKS = 4               # M blocks per thread, at least, when the threads deal them (MC permitting)
#: ... where the pre-packed B of an N block is at most this many floats: each M block streams all of it (GPT-2,
#: when its 128-row GEMMs were dealt, 1.6-7 MiB of weights, ran 1.07x the time in 8 blocks of 18 rows, not 2 of 66)
DYN_B_FLOATS = 1 << 16
#: the most floats of B panels (an N block's, one K block) for which tiles walk row tiles outermost
ROWS_OUTER_B_FLOATS = 1 << 16
#: unary functions an epilogue on the accumulators leaves to the block's pass: a polynomial each, their code
#: written out for every vector of the tile (BERT's FFN1 with erf-GELU, 128 x 768 x 3072, ran 1.12x the time;
#: as one loop over the tile's vectors, 1.02x, no gain over the pass)
HEAVY_UNARY = frozenset({"exp2", "log2", "erf"})


#: the per-thread counters ``kk_take`` deals blocks from (``kk_T`` threads, a cache line apart), zeroed
DEAL_COUNTERS = ("long long kk_cnt[8 * kk_T];\n"
                 "for (long long kk_x = 0; kk_x < 8 * kk_T; ++kk_x) kk_cnt[kk_x] = 0;")


def next_block(dyn: str) -> str:
    """C that sets ``kk_blk`` to the next of ``kk_nmbk`` blocks inside a ``for (kk_bi = 0;;)`` loop (breaking
    when none is left): taken as they come (``kk_take``) where ``dyn`` holds, else the thread's next in order."""
    return (f"if ({dyn}) {{\n"
            "  kk_blk = kk_take(kk_cnt, kk_t, kk_nt, kk_nmbk, &kk_vic);\n"
            "  if (kk_blk < 0) break;\n"
            "#ifdef KUMIKO_TRACE_STAGE\n  __atomic_fetch_add(&kk_dealt, 1, __ATOMIC_RELAXED);\n#endif\n"
            "} else {\n  if (kk_bi >= kk_nmbk) break;\n  kk_blk = kk_bi++;\n}")


def _split(flat: str, names: tuple, sizes: list, out: list) -> None:
    """``long long name = ...`` for each of ``names`` from a row-major flat index over ``sizes``."""
    rest = flat
    for k, (a, sz) in enumerate(zip(reversed(names), reversed(sizes))):
        if k == len(names) - 1:
            out.append(Decl("long long", a, rest))
        else:
            out.append(Decl("long long", a, f"({rest}) % {sz}"))
            rest = f"({rest}) / {sz}"


class ContractionLowering(PanelPacking):
    """Emits the blocked contraction into a region kernel (in front of the epilogue or generic rest)."""

    #: C for the output row the C scratch's first row holds (the epilogues and micro-kernels index it from there)
    c_row0 = "0"

    def __init__(self, lo: CpuLowering, c: Contraction, plan: Plan, constants: frozenset = frozenset()):
        self.lo, self.c, self.plan = lo, c, plan
        self.mr, self.nr = plan.register_block
        self.vw = plan.vector_width
        self.mc, self.nc, self.kc = plan.cache_block or (self.mr, self.nr, 0)    # a skinny plan has none
        extra = c.k_axes + (c.outer.axes if c.outer is not None else ())
        for a in extra:
            lo.sizes[a.name] = a.size
        self.a, self.b, self.swapped = panel_sides(c, lo.memrefs, self.mr, self.nr, lo.sizes,
                                                    plan.lanes)
        #: side key -> the C name of its pre-packed panels (a constant operand packed once, not per call)
        self.pre = {sd.key: f"kk_pk{sd.key}" for sd in (self.a, self.b) if self._prepackable(sd, constants)}
        self.stage = None        # B read in place from a padded copy of its source (kumiko.kernel.stage)
        dims = stage_bounds(self.b.table)
        if "b" in self.pre:
            dims = None
        if dims is not None:
            st = Stage(dims, self.b.rows, tuple(a.name for a in c.k_axes), c.batch, lo.sizes,
                       lo.cname[self.b.table.tensor], self.nr, bool(self.b.table.guards))
            # consecutive rows are consecutive stage elements; a copy where it replaces the guards (padding)
            # or a strided gather (phases), else the source itself
            self.stage = st if st.ok and st.unit else None
        #: A read in place from a padded copy of its source, or from the source itself: the pixels on the A
        #: side (channels in the lanes) of a padded conv, no im2col panels packed (kumiko.kernel.stage
        #: ``a_check``; 3x3 convs at 14x14 and 7x7 with bound weights ran 0.86-0.95 of the time with it,
        #: ResNet-50 b1 0.977-0.985), or of a 1x1 conv (IN_PLACE_COLS)
        self.astage = None
        adims = stage_bounds(self.a.table) if self.stage is None and "a" not in self.pre else None
        if adims is not None and self.a.table.tensor not in lo.cname:
            adims = None            # a row pipe's P: held in the pipe's panels, not a buffer
        if adims is not None:
            st = Stage(adims, self.a.rows, tuple(a.name for a in c.k_axes), c.batch, lo.sizes,
                       lo.cname[self.a.table.tensor], self.mr, bool(self.a.table.guards), key="a")
            # phase planes on the A side ran 1.15-1.95x slower than packing (stride-2 convs to 14x14, 7x7)
            self.astage = st if st.ok and st.unit and not st.split else None
        #: the rows of M's last tile when MR does not divide M (known when compiling), else 0: that tile runs
        #: a micro-kernel of those rows alone (``micro_kernel``'s rows), not MR rows of which some are padding
        #: (M = 49, a 7x7 conv's pixels: 9 tiles of 6 rows had been 54 rows' work; 128: 132)
        m = prod([lo.sizes[a] for a in self.a.rows])
        self.m_tail = m % self.mr if isinstance(m, int) else 0

    def size(self, axes) -> str:
        return C.index(prod([self.lo.sizes[a] for a in axes]) if axes else 1, set())

    def decompose(self, flat: str, axes: tuple, out: list) -> None:
        """``long long a = ...`` for each axis from a row-major flat index over ``axes``."""
        _split(flat, axes, [C.index(self.lo.sizes[a], set()) for a in axes], out)

    # constant operands ----------------------------------------------------------------------------------
    def _prepackable(self, sd: Side, constants: frozenset) -> bool:
        """Are ``sd``'s panels packed once (``prepack``) and read in place (``kumiko.plan.packed.prepackable``)?"""
        return prepackable(sd.key, sd.expr, self.c, self.nc, self.nr, constants)

    def _size_decls(self) -> list:
        c, mr = self.c, self.mr
        return [Decl("const long long", "kk_B", self.size(c.batch)),
                Decl("const long long", "kk_M", self.size(self.a.rows)),
                Decl("const long long", "kk_N", self.size(self.b.rows)),
                Decl("const long long", "kk_K", self.size(tuple(a.name for a in c.k_axes))),
                Decl("const long long", "kk_Mp", f"(kk_M + {mr - 1}) / {mr} * {mr}")]

    def prepack_floats(self, key: str) -> Expr:
        """The size of side ``key``'s pre-packed panels in floats: whole panels of R rows, each all of K."""
        sd = self.a if key == "a" else self.b
        rows = prod([self.lo.sizes[a] for a in sd.rows]) if sd.rows else Expr.lift(1)
        k = prod([a.size for a in self.c.k_axes]) if self.c.k_axes else Expr.lift(1)
        return (Expr.lift(rows) + (sd.r - 1)) // sd.r * sd.r * k

    def prepack(self, key: str, dst: str | None = None) -> list:
        """The body of side ``key``'s packing function: panel q of all rows at all of K, at
        ``kk_pk + q*R*K`` (the layout the kernel's resident A panels have; at ``dst`` instead when given),
        the panels split among threads."""
        sd = self.a if key == "a" else self.b
        s = self._size_decls()
        par: list = [Decl("const int", "kk_t", "omp_get_thread_num()"),
                     Decl("const int", "kk_nt", "omp_get_num_threads()")]
        if sd.table is not None:
            al, fi = self._tables(sd)
            s += al
            par += fi + [Raw("#pragma omp barrier")] + self._batch_parts(sd)
        par += [Decl("const long long", "kk_pc", "0"), Decl("const long long", "kk_kcb", "kk_K"),
                Decl("const long long", "kk_npn", f"({sd.count} + {sd.r - 1}) / {sd.r}"),
                *self._pack(sd, "kk_t * kk_npn / kk_nt", "(kk_t + 1) * kk_npn / kk_nt", "0", sd.count,
                            dst or f"(float*){self.pre[key]}")]
        return s + [Raw("#pragma omp parallel\n{"), *par, Raw("}"),
                    Raw("kk_scratch_trim(2); kk_scratch_trim(3);")]

    # epilogues ------------------------------------------------------------------------------------------
    def _runs(self, rows: tuple, m: int, start: str, counter: str) -> tuple:
        """How an epilogue walks ``rows`` in runs of the innermost axis (its trailing ``m`` axes merged into one
        row-major span): that axis, the outer ones, their sizes (C) and the declarations that split ``start``
        into the outer counters and ``counter``, the position inside the run."""
        lo = self.lo
        last, outer = rows[-1], rows[:-m]
        sizes = [C.index(lo.sizes[a], set()) for a in outer] + [
            C.index(lo.sizes[last], set()) if m == 1 else f"({self.size(rows[-m:])})"]
        decls: list = [Decl("const long long", a, "0") for a in rows[-m:-1]]
        _split(start, outer + (counter,), sizes, decls)
        return last, outer, sizes, decls

    def _epilogue_body(self, epilogue) -> tuple[tuple, bool]:
        """The epilogue's statements and whether they vectorise (no gather among them)."""
        lo = self.lo
        g0, lo.uses_gather = lo.uses_gather, False
        body = tuple(epilogue())
        simd = not lo.uses_gather
        lo.uses_gather = lo.uses_gather or g0
        return body, simd

    def _epi_pointwise(self, epilogue, r0: str, r1: str, c0: str, c1: str) -> list:
        """``epilogue()`` at rows [r0, r1) x columns [c0, c1) of the block: runs of the innermost N axis
        (``omp simd``), the other axes advanced by counters. Trailing N axes that the epilogue and the
        output only see as one row-major span (``_merged_cols``: a conv's 7x7 pixels) are one run."""
        A, B = self.a, self.b
        dm: list = []
        self.decompose("kk_ii", A.rows, dm)
        last, outer, sizes, dn = self._runs(B.rows, self._merged_cols(), f"kk_jc + {c0}", "kk_nl")
        body, simd = self._epilogue_body(epilogue)
        s_last = sizes[-1]
        carry = "kk_nl = 0;" if not outer else "kk_nl = 0; " + advance_counter(outer, tuple(sizes[:-1]))
        return [For("kk_ii", r0, r1, tuple(dm) + tuple(dn) + (
            Decl("long long", "kk_j", c0),
            Raw(f"while (kk_j < {c1}) {{"),
            Decl("const long long", "kk_run", f"{c1} - kk_j < {s_last} - kk_nl ? {c1} - kk_j : {s_last} - kk_nl"),
            Decl("const float* KUMIKO_RESTRICT", "kk_cr", f"kk_Ct + (kk_ii - {self.c_row0})*kk_ldc + kk_j"),
            For(last, "kk_nl", "kk_nl + kk_run", (Decl("float", "kk_acc", f"kk_cr[{last} - kk_nl]"),) + body,
                vector=int(simd)),
            Raw(f"kk_j += kk_run; kk_nl += kk_run;\nif (kk_nl == {s_last}) {{ {carry} }}\n}}")))]

    def _epi_transposed(self, epilogue, r0: str, r1: str, c0: str, c1: str) -> list:
        """``_epi_pointwise`` for an output whose innermost axis is an M axis (a strided conv's pixels, its
        channels on the N side): columns outermost, runs of the innermost M axis inside, so the stores are
        contiguous (rows outermost stored each row's columns a channel plane apart: 64 planes of 49 KiB
        fell into a few L1 sets, 3-11 ms of ResNet-50's 7x7 stem on one thread). The C tile is read down
        its columns, from L1."""
        A, B = self.a, self.b
        dn: list = []
        self.decompose("kk_jc + kk_jj", B.rows, dn)
        last, outer, sizes, dm = self._runs(A.rows, self._merged_cols(A.rows), r0, "kk_ml")
        body, simd = self._epilogue_body(epilogue)
        s_last = sizes[-1]
        carry = "kk_ml = 0;" if not outer else "kk_ml = 0; " + advance_counter(outer, tuple(sizes[:-1]))
        # the run's column first into a contiguous buffer (a run is at most one M block: MC + MR rows), so
        # the epilogue loop reads contiguously and vectorises (read down the column in place, gcc kept it
        # scalar with a branch per clamp: 1.8 ms for MobileNetV2's first conv)
        return [For("kk_jj", c0, c1, tuple(dn) + tuple(dm) + (
            Raw(f"KUMIKO_ALIGN(64) float kk_col[{self.mc + self.mr}];"),
            Decl("long long", "kk_i", r0),
            Raw(f"while (kk_i < {r1}) {{"),
            Decl("const long long", "kk_run", f"{r1} - kk_i < {s_last} - kk_ml ? {r1} - kk_i : {s_last} - kk_ml"),
            Decl("const float* KUMIKO_RESTRICT", "kk_cr", f"kk_Ct + (kk_i - {self.c_row0})*kk_ldc + kk_jj"),
            Raw("for (long long kk_r = 0; kk_r < kk_run; ++kk_r) kk_col[kk_r] = kk_cr[kk_r*kk_ldc];"),
            For(last, "kk_ml", "kk_ml + kk_run", (Decl("float", "kk_acc", f"kk_col[{last} - kk_ml]"),) + body,
                vector=int(simd)),
            Raw(f"kk_i += kk_run; kk_ml += kk_run;\nif (kk_ml == {s_last}) {{ {carry} }}\n}}")))]

    def _merged_cols(self, rows: tuple | None = None) -> int:
        """How many trailing axes of ``rows`` (the N axes by default) the pointwise epilogue can run as one
        flat axis (1: none): they are the region's trailing iterators, every output's trailing dimensions, and
        every read of the epilogue that uses them indexes its trailing dimensions (of the same sizes) with
        exactly them. Then the first of them are 0 and the last runs over the span: the offsets are the same."""
        lo = self.lo
        rows = self.b.rows if rows is None else rows
        iters = [a.name for a in lo.r.iters]
        rest = [x.expr for x in lo.r.lets if x.name != self.c.let]
        for m in range(len(rows), 1, -1):
            span = rows[-m:]
            sizes = tuple(Expr.lift(lo.sizes[a]) for a in span)
            if iters[-m:] != list(span) or any(tuple(lo.memrefs[y.to].shape[-m:]) != sizes for y in lo.r.yields):
                continue
            if all(_flat_span(e, span, sizes, lo.memrefs) for e in rest):
                return m
        return 1

    def _epi_window(self, epilogue, r0: str, r1: str) -> list:
        """Rows [r0, r1) of the block, each its window groups (G consecutive columns each): reduce each window
        of ``f(acc)`` with the outer op, then the epilogue. It runs right after the block's last micro-kernels,
        on the thread's own rows of a C tile still in cache (no barrier). When the windows are the trailing
        axes of a group and everything ``f`` reads sees them as one row-major span (a global pool of a conv's
        7x7 pixels), a window is one flat run; a sum over a whole group (no other axis in it) is one vector
        reduction per window (``omp simd reduction``: a scalar sum of 49 columns was a chain of dependent
        adds, 0.1 ms of ResNet-50's 2048 channels)."""
        c, lo, A, B = self.c, self.lo, self.a, self.b
        wset = [a.name for a in c.outer.axes]
        first = min(B.rows.index(w) for w in wset)
        prefix, suffix = B.rows[:first], B.rows[first:]
        nonw = tuple(a for a in suffix if a not in wset)
        wins = tuple(a for a in suffix if a in wset)
        flat = not nonw and len(wins) > 1 and _flat_span(
            c.f, wins, tuple(Expr.lift(lo.sizes[a]) for a in wins), lo.memrefs)
        col, stride = Expr.lift(0), Expr.lift(1)
        for a in reversed(suffix):
            col = col + Expr.sym(a) * stride
            stride = stride * lo.sizes[a]
        lo.storage["__acc"] = ("scalar", "kk_w")
        lo.ty.lets["__acc"] = VType(dtypes.fp32, ())
        saved = list(lo.red_axes)
        lo.red_axes = list(wset)
        fv_stmts: list = []
        fbody, fsimd = self._epilogue_body(lambda: [Decl("float", "kk_fv", lo.expr(c.f, fv_stmts, c.outer.dtype))])
        lo.red_axes = saved
        ct = C.COMPUTE[c.outer.dtype.name]
        upd = {"sum": "kk_acc + kk_fv", "max": C.binary("max", "kk_acc", "kk_fv", ct),
               "min": C.binary("min", "kk_acc", "kk_fv", ct)}[c.outer.op]
        dm: list = []
        self.decompose("kk_m", A.rows, dm)
        dp: list = []
        self.decompose("kk_jc / kk_G + kk_g", prefix, dp)
        de: list = []
        self.decompose("kk_e", nonw, de)
        ws = int(prod([lo.sizes[a] for a in wins]))
        dw: list = [Decl("const long long", a, "0") for a in wins[:-1]] if flat else []
        wvar = wins[-1] if flat else "kk_wi"
        if not flat:
            self.decompose("kk_wi", wins, dw)
        wred = c.outer.op == "sum" and not nonw and fsimd      # one vector reduction per window
        step = (Decl("float", "kk_w", f"kk_cg[{C.index(col, set(suffix))}]"),) + tuple(fv_stmts) + fbody + (
            Assign("kk_acc", upd),)
        win = For(wvar, "0", str(ws), (() if flat else tuple(dw)) + step)
        body, simd = self._epilogue_body(epilogue)
        return [For("kk_m", r0, r1, tuple(dm) + (
            For("kk_g", "0", "kk_ngr", tuple(dp) + (
                Decl("const float* KUMIKO_RESTRICT", "kk_cg", f"kk_Ct + (kk_m - {self.c_row0})*kk_ldc + kk_g*kk_G"),
                For("kk_e", "0", self.size(nonw), tuple(de) + (
                    Decl(ct, "kk_acc", C.literal(c.outer.init, c.outer.dtype)),
                    *(dw if flat else ()),
                    *([Raw("#pragma omp simd reduction(+:kk_acc)")] if wred else []), win) + body,
                    vector=int(simd and not wred)),)),))]

    def _tile_epilogue(self) -> dict | None:
        """The epilogue on the micro-kernel's accumulators, in registers: {rows: the statements for a tile of
        that many rows} (MR, and M's last tile's rows), or None where it does not apply.

        K is one block (``_one_k_block``), so each tile's accumulators hold its whole sums: they go straight
        into the rest of the region, KUMIKO_VW points at a time (``lower_vec``'s vector emitter, the innermost
        N axis in the lanes), and into the output: no C tile stored and loaded again, no second pass over the
        block (where the header's KUMIKO_VW is the plan's width; else both, chosen by the preprocessor). The
        code is written out for each row and vector of the tile (as one loop over them, the accumulators went
        through memory: 1x1 convs ran 1.13-1.54x the time), the accumulators kept in registers.

        It applies where the output's innermost axis is the N side's last (the lanes), the N axes are one flat
        span to every access of the epilogue (``_merged_cols``) of a size NR divides (every panel whole), and
        every value of the epilogue has a vector form (no gather, guard or reduction the vector emitter
        refuses) and is cheap (no ``HEAVY_UNARY``). Else the C tile and the block's epilogue pass
        (``_epi_pointwise``) as before.

        On a 2-core Zen 3 (in-process A/Bs against the pass): 1x1 convs with K of 16, 24 and 64 ran 0.77-0.93
        of the time, K of 128 and 256 0.92-0.95; MobileNetV2 0.923, BERT 0.977, ResNet-50 0.998. Where K is
        several blocks it paid nothing (1x1 convs with K of 512-2048 within 1%; BERT's 128 x 768 x 768 and
        128 x 3072 x 768 GEMMs 1.000 and 1.020) and cost gcc time (each tile then needs the C-tile kernel for
        the earlier blocks beside the inlined one for the last: ResNet-50 compiled 1.6-2.7 s longer cold).
        """
        lo, c, A, B = self.lo, self.c, self.a, self.b
        lane = B.rows[-1] if B.rows else None
        n = self._known(B.rows) if B.rows else None
        if (c.outer is not None or not c.pointwise or lane is None or lo.r.iters[-1].name != lane or n is None
                or not self._one_k_block()
                or n % self.nr or self._merged_cols() != len(B.rows) or self.vw != self.plan.vector_width
                or any(_heavy(x.expr) for x in lo.r.lets if x.name != c.let)):
            return None
        nv, vw = self.nr // self.vw, self.vw
        m_known = self._known(A.rows) is not None
        try:    # the same statements at every point of the tile: only its axes' declarations differ
            point = tuple(self._vector_point(lane, "kk_av"))
        except NotVector:
            return None
        code: dict = {}
        for rows in {self.mr, self.m_tail or self.mr}:
            tile = []
            for i in range(rows):
                dm: list = []
                self.decompose(f"kk_ic + kk_ir + {i}", A.rows, dm)
                vecs = []
                for v in range(nv):
                    dn = [Decl("const long long", a, "0") for a in B.rows[:-1]]
                    dn.append(Decl("const long long", lane, f"kk_jc + kk_jr*{self.nr} + {v * vw}"))
                    vecs.append(Block(tuple(dn) + (Decl("const kv_t", "kk_av", f"(kv_t)kk_o[{i * nv + v}]"),) + point))
                row = Block(tuple(dm) + tuple(vecs))
                # M not known when compiling: the last tile may hold padding rows (no tail kernel)
                tile.append(row if m_known else If(f"kk_ic + kk_ir + {i} < kk_M", (row,)))
            code[rows] = tile
        return code

    def _known(self, axes) -> int | None:
        """The extent of ``axes`` when it is known when compiling."""
        return Expr.lift(prod([self.lo.sizes[a] for a in axes])).as_int()

    def _l1k(self) -> int:
        """K rows of a B panel read from the stage that fit L1 (``kk_kl1``: its K blocks)."""
        if self.stage is not None and not self.stage.in_place:
            # a padded stage's rows start anywhere, so a row of NR floats shorter than two cache lines spans two:
            # count it as 128 bytes (AVX2's 16 lanes: K blocks of 128 rows, not 256; 3x3 convs 64 -> 64 at 56x56
            # and 128 -> 128 at 28x28 ran 0.955-0.966 of the time in in-process A/Bs on a 2-core Zen 3; a 1x1
            # conv's panels read in place from their source keep the 256: MobileNetV2 ran 1.017x with 128)
            return max(8, IN_PLACE_PANEL_BYTES // max(4 * self.nr, 128))
        return max(8, IN_PLACE_PANEL_BYTES // (4 * self.nr))

    def _one_k_block(self) -> bool:
        """Is all of K one step of the K loop on every path (known when compiling)? K known and one block under
        the plan's ``k_blocks`` (at most KC, or one block by rule) and, where B is read from a stage, one of the
        blocks that fit L1 its panels step through K in (``kk_kl1``)."""
        k = self._known([a.name for a in self.c.k_axes])
        if k is None or (self.stage is not None and k > self._l1k()):
            return False
        rule = self.plan.k_blocks or "kc"
        if rule == "one" or k <= self.kc:
            return True
        n = self._known(self.b.rows)
        ncp = -(-min(n, self.nc) // self.nr) * self.nr if n is not None else None
        return rule == "one_if_fits" and ncp is not None and ncp * k <= ONE_K_BLOCK_FLOATS

    def _rows_outer(self) -> bool:
        """Do the tiles walk row tiles outermost (``emit``)? Where K is one block (at most KC) and the N
        block's B panels for it fit in L2 (``ROWS_OUTER_B_FLOATS``; known when compiling): each row tile
        then reads all of them (a 7x7 conv's 512 -> 2048, 4 MiB of panels, ran 1.05x the time)."""
        k, n = self._known([a.name for a in self.c.k_axes]), self._known(self.b.rows)
        return k is not None and n is not None and k <= self.kc and k * min(n, self.nc) <= ROWS_OUTER_B_FLOATS

    def _vector_point(self, lane: str, acc: str) -> list:
        """The region's other lets and its store at KUMIKO_VW points of ``lane``, the accumulators in the
        vector ``acc`` (raises NotVector where some value has no vector form)."""
        lo, c = self.lo, self.c

        def emit() -> list:
            lo.storage = {c.let: ("scalar", acc)}
            lo.red_axes = []
            out: list = []
            for let in lo.r.lets:
                if let.name != c.let:
                    lo.storage[let.name] = ("scalar", f"v_{let.name}")
                    out += lo.let_stmts(let)
            return out + lo.vstore(Ref(lo.r.yields[0].src))
        return lo._vemit(VectorCtx(lane, vlets={c.let: ("f", acc)}), emit)

    # the plan's rules (kumiko.plan.packed) ------------------------------------------------------------------
    def _k_blocks(self, kc: int) -> str:
        """C for the number of K blocks (``kk_nkb``) under the plan's ``k_blocks``."""
        blocks = f"kk_K > 0 ? (kk_K + {kc - 1}) / {kc} : 1"
        rule = self.plan.k_blocks or "kc"
        if rule == "one":
            return "1"
        return f"kk_ncp * kk_K <= {ONE_K_BLOCK_FLOATS} ? 1 : {blocks}" if rule == "one_if_fits" else blocks

    def _split_n(self) -> str:
        """C that ORs into the N split's test under the plan's ``bind.split``: N where it splits about as
        evenly as M (``"n"``), that when A is at most the rule's floats (run time), or nothing (``"m"``)."""
        rule, even = self.plan.split or "m", "kk_wn * 10 <= kk_wm * 11"
        if rule == "m":
            return ""
        if rule == "n":
            return f" || {even}"
        return f" || (kk_Mp * kk_K <= {SPLIT_LIMITS[rule]} && {even})"

    @staticmethod
    def _dealt_blocks(block: list, epi_code: list) -> list:
        """Under pre-packed B where the plan splits M: the M blocks outermost, each all of K and then its
        epilogue, so a block is one thread's from start to end (no barrier between K blocks). In mode 0 the
        threads take the blocks as they come (``kk_dyn``, ``kk_take``: a thread's own share of the blocks first,
        so it keeps the rows, and the caches, a fixed split would give it; then the rest of the others' shares),
        in each batch point and N block (which every thread walks alike, with barriers between them: the
        counters are reset there); else each thread walks its own range in order. A thread's C scratch holds the
        rows of the block it works on (``c_row0``). ``block``: the M block's size,
        then its K block's work."""
        return [Decl("const long long", "kk_nmbk", "(kk_m1 - kk_m0 + kk_mblk - 1) / kk_mblk"),
                Raw("for (long long kk_bi = 0;;) {"), Raw("long long kk_blk;"), Raw(next_block("kk_dyn")),
                Decl("const long long", "kk_ic", "kk_m0 + kk_blk * kk_mblk"), block[0],
                Raw("for (long long kk_pc = 0; kk_pc < kk_K || kk_pc == 0; kk_pc += kk_kstep) {"),
                Decl("const long long", "kk_kcb", "kk_K - kk_pc < kk_kstep ? kk_K - kk_pc : kk_kstep"),
                *block[1:], Raw("}"), *epi_code, Raw("}"),
                # the next batch point or N block deals its blocks afresh: all threads done with this one first,
                # then each resets its own counter before any thread takes from it
                Raw("if (kk_dyn && (kk_jc + kk_nc < kk_n1 || kk_b + 1 < kk_b1)) {\n#pragma omp barrier\n"
                    "kk_cnt[8 * kk_t] = 0; kk_vic = kk_t;\n#pragma omp barrier\n}")]

    # the kernel -----------------------------------------------------------------------------------------
    def emit(self, epilogue, fuse: bool = False) -> list:  # noqa: C901
        """The whole contraction as statements; ``epilogue()`` returns the per-element work (the current
        point's axes are declared; the accumulator value is the C variable ``kk_acc``). ``fuse``: it is the
        region's pointwise rest, which may run on the accumulators (``_tile_epilogue``)."""
        c, lo, A, B = self.c, self.lo, self.a, self.b
        mr, nr, mc, nc, kc = self.mr, self.nr, self.mc, self.nc, self.kc
        l1k = self._l1k()
        k_axes = tuple(a.name for a in c.k_axes)
        lo.ty.add_axes(c.k_axes + (c.outer.axes if c.outer is not None else ()))
        win = c.outer is not None

        def how(sd: Side) -> str:
            if sd is A and self.astage is not None:
                return "a padded stage read in place, else index tables"
            if sd is B and self.stage is not None:
                return ("read in place from its source, else index tables" if self.stage.in_place else
                        "a padded stage read in place, else index tables")
            return "index tables" if sd.table is not None else "per element"
        s: list = [Comment(f"contraction {c.let}: batch {list(c.batch)}, M {list(A.rows)} ({how(A)}), "
                           f"N {list(B.rows)} ({how(B)}), K {list(k_axes)}; micro {mr}x{nr}, "
                           f"blocks MC<={mc} NC<={nc} KC<={kc}"),
                   *self._size_decls()]
        # a size-1 iter that no operand reads is none of batch, M or N: it is 0 wherever the epilogue uses it
        s += lo.unit_decls(c)
        if win:       # N blocks and thread ranges hold whole window groups (the N axes from the first window axis in)
            first = min(B.rows.index(a.name) for a in c.outer.axes)
            s += [Decl("const long long", "kk_G", f"{self.size(B.rows[first:])} > 0 ? {self.size(B.rows[first:])} : 1"),
                  Decl("const long long", "kk_nc0", f"kk_G * ({nc} / kk_G > 0 ? {nc} / kk_G : 1)"),
                  Decl("const long long", "kk_nc", "kk_nc0 < kk_N ? kk_nc0 : kk_N"),
                  Decl("const long long", "kk_un", "kk_G")]
        else:
            s += [Decl("const long long", "kk_nc", f"kk_N < {nc} ? kk_N : {nc}"),
                  Decl("const long long", "kk_un", str(nr))]
        s += [Decl("const long long", "kk_nun", "(kk_N + kk_un - 1) / kk_un"),
              Decl("const long long", "kk_ncp", f"(kk_nc + {nr - 1}) / {nr} * {nr}"),
              Decl("const long long", "kk_ldc", "kk_ncp % 1024 == 0 ? kk_ncp + 16 : kk_ncp"),
              # the plan's k_blocks: K blocks of equal size, at most KC, or one block of all of K (the
              # chooser's under a pre-packed A when the B panels of all of K fit in L2: each A panel then
              # streams once, front to back, and the C tile stays in registers for all of K)
              Decl("const long long", "kk_nkb", self._k_blocks(kc)),
              Decl("const long long", "kk_kc", "kk_K > 0 ? (kk_K + kk_nkb - 1) / kk_nkb : 1"),
              Decl("const long long", "kk_bsz", "kk_ncp * kk_kc"),
              # a panel read in place from a stage (K rows of NR lanes, each its own cache lines): K blocks of
              # equal size whose panel fits L1 beside the A panel (``IN_PLACE_PANEL_BYTES``), else every M panel
              # reloads it from L2
              Decl("const long long", "kk_kl1n", f"kk_K > {l1k} ? (kk_K + {l1k - 1}) / {l1k} : 1"),
              Decl("const long long", "kk_kl1", "kk_K > 0 ? (kk_K + kk_kl1n - 1) / kk_kl1n : 1"),
              # threads: at most one per _MACS_PER_THREAD multiply-adds (a small contraction does not wake
              # threads it cannot use: in a process whose other thread pools are busy, waking one costs more)
              Decl("const long long", "kk_work", f"kk_B * kk_M * kk_N * (kk_K > 0 ? kk_K : 1) / {_MACS_PER_THREAD}"),
              Decl("const long long", "kk_T", "omp_get_max_threads() < 1 + kk_work ? omp_get_max_threads() : "
                   "1 + kk_work"),
              # the most rows x columns one thread computes when threads split M, or N
              Decl("const long long", "kk_wm", f"(kk_Mp / {mr} + kk_T - 1) / kk_T * {mr} * kk_N"),
              Decl("const long long", "kk_wn", "(kk_nun + kk_T - 1) / kk_T * kk_un * kk_Mp"),
              # 2: whole batch points per thread; 1: a range of N per thread (when M splits unevenly, or
              # as the plan's bind.split says); both with private buffers and no barrier. 0: a range of M
              # rows of every block, whose B panels the threads pack together (a barrier per K block)
              Decl("const int", "kk_mode", "kk_T > 1 && kk_B > 1 && (kk_B % kk_T == 0 || kk_B >= 4 * kk_T) ? 2 : "
                   f"kk_T > 1 && (kk_wm * 20 > kk_wn * 21{self._split_n()}) ? 1 : 0"),
              Decl("const long long", "kk_nbuf", "kk_mode ? kk_T : 1")]
        fills: list = []
        stg, astg = self.stage, self.astage
        lo.m_tail = self.m_tail   # the program needs the tail micro-kernels of these rows
        pre_a, pre_b = "a" in self.pre, "b" in self.pre
        for sd in (A, B):
            if sd.table is not None and sd.key not in self.pre:
                extra = (stg.columns() if stg is not None and sd is B else
                         astg.columns() if astg is not None and sd is A else ())
                al, fi = self._tables(sd, extra)
                s += al
                fills += fi
        if stg is not None:
            s += stg.decls()
            fills += stg.fill()
            lo.staged = True      # the program needs the stage micro-kernel
        if astg is not None:
            s += astg.decls()
            fills += astg.fill()
            lo.a_staged = "u" if astg.rdim is not None else True    # and the A-stage one (rows a unit apart)
        # under pre-packed B where the plan splits M (``dyn``, ``_dealt_blocks``) each M block is one thread's
        # from its first K block to its epilogue: the thread's C rows are the block's alone (at most MC + MR), so
        # the tile stays in L1/L2 between the micro-kernels and the epilogue (C rows of all of M, 4.7 MiB for
        # MobileNetV2's 16 -> 96 conv at 112x112, went out to L3 and back)
        dyn = pre_b and (self.plan.split or "m") == "m"
        c_rows = f"{mc + mr}" if dyn else "kk_Mp"
        self.c_row0 = "kk_ic" if dyn else "0"
        s.append(Raw("float* kk_Bp = (float*)kk_scratch(1, sizeof(float) * (size_t)(kk_nbuf * 2 * kk_bsz));\n"
                     f"float* kk_C = (float*)kk_scratch(0, sizeof(float) * (size_t)({'kk_T' if dyn else 'kk_nbuf'} "
                     f"* {c_rows} * kk_ldc));"))
        par: list = [Decl("const int", "kk_t", "omp_get_thread_num()"),
                     Decl("const int", "kk_nt", "omp_get_num_threads()")]
        if fills:
            par += fills + [Raw("#pragma omp barrier")]
        if astg is not None:
            par += astg.a_check(mr)
        # under pre-packed B the threads of mode 0 take M blocks as they come (kk_dyn, ``_dealt_blocks``), not a
        # fixed share each: no thread waits at the end for one that ran slower (an interrupt, a busy sibling
        # core, another pool in the process). Where the plan splits M: the M blocks then come outside the K
        # blocks, and each streams all of B (a split of N keeps the K blocks outside: BERT's 128 x 768 x 3072
        # GEMM, each thread's share of B 4.7 MiB, ran 1.13x the time with its two M blocks outside)
        shared = "kk_mode || kk_dyn" if dyn else "kk_mode"
        if dyn:
            par.append(Decl("const int", "kk_dyn", "kk_mode == 0 && kk_nt > 1"))
        par += [
            Decl("const long long", "kk_m0", f"{shared} ? 0 : kk_t * (kk_Mp / {mr}) / kk_nt * {mr}"),
            Decl("const long long", "kk_m1", f"{shared} ? kk_Mp : (kk_t + 1) * (kk_Mp / {mr}) / kk_nt * {mr}"),
            Decl("const long long", "kk_n0", "kk_mode == 1 ? kk_t * kk_nun / kk_nt * kk_un : 0"),
            Decl("const long long", "kk_n1x", "kk_mode == 1 ? (kk_t + 1) * kk_nun / kk_nt * kk_un : kk_N"),
            Decl("const long long", "kk_n1", "kk_n1x < kk_N ? kk_n1x : kk_N"),
            Decl("const long long", "kk_b0", "kk_mode == 2 ? kk_t * kk_B / kk_nt : 0"),
            Decl("const long long", "kk_b1", "kk_mode == 2 ? (kk_t + 1) * kk_B / kk_nt : kk_B"),
            # this thread's rows in blocks of at most MC, as even as MR allows; all of them packed once per
            # batch point (for every K) when that fits in L2
            Decl("const long long", "kk_nmb", f"(kk_m1 - kk_m0 + {mc - 1}) / {mc}"),
            Decl("const long long", "kk_mblk0" if dyn else "kk_mblk",
                 f"kk_nmb > 0 ? ((kk_m1 - kk_m0 + kk_nmb - 1) / kk_nmb + {mr - 1}) / {mr} * {mr} : {mr}"),
            # dealt blocks: DYN_BLOCKS a thread at least, where MC allows and B is small (DYN_B_FLOATS)
            *([Decl("const long long", "kk_mblkd", f"(kk_Mp / ({DYN_BLOCKS} * kk_nt) + {mr - 1}) / {mr} * {mr}"),
               Decl("const long long", "kk_mblk", f"!kk_dyn || kk_K * kk_ncp > {DYN_B_FLOATS} ? kk_mblk0 : "
                    f"kk_mblkd < {mr} ? {mr} : kk_mblkd < kk_mblk0 ? kk_mblkd : kk_mblk0")] if dyn else []),
            # pre-packed A: every panel resident, for all of K (the layout the resident path packs)
            Decl("const int", "kk_ares", "1" if pre_a else
                 f"{'!kk_dyn && ' if dyn else ''}(kk_m1 - kk_m0) * kk_K <= {A_RESIDENT_FLOATS}"),
            Decl("const float* KUMIKO_RESTRICT", "kk_Ap", f"{self.pre['a']} + kk_m0 * kk_K") if pre_a else
            Decl("float* KUMIKO_RESTRICT", "kk_Ap", "(float*)kk_scratch(4, sizeof(float) * (size_t)(kk_ares ? "
                 f"(kk_m1 - kk_m0) * kk_K : {mc} * kk_kc))"),
            Decl("float*", "kk_Bt", "kk_Bp + (kk_mode ? kk_t : 0) * 2 * kk_bsz"),
            Decl("float*", "kk_Ct", f"kk_C + kk_t * {c_rows} * kk_ldc" if dyn else
                 "kk_C + (kk_mode ? kk_t : 0) * kk_Mp * kk_ldc"),
            Decl("long long", "kk_it", "0"),
            *([Decl("int", "kk_vic", "kk_t")] if dyn else [])]
        bdec: list = []
        self.decompose("kk_b", c.batch, bdec)
        for sd in (A, B):
            if sd.table is not None and sd.key not in self.pre:
                bdec += self._batch_parts(sd)
        if stg is not None:
            bdec.append(stg.base())
        if astg is not None:
            bdec.append(astg.base())
        no_astage = " && !kk_adir" if astg is not None else ""     # A panels are packed only off the A stage
        in_place = stg is not None and stg.in_place
        one_k_a = astg is not None and astg.rdim is not None and not astg.in_place and pre_b
        # the panels read in place are not packed, a short last one is: one packing, from the first panel
        # not read in place (two copies of the packing code had been a fifth of the unit's gcc time)
        q0 = "(kk_dir && kk_nfull > kk_q0 ? kk_nfull : kk_q0)" if in_place else "kk_q0"
        pack_b = [] if pre_b else self._pack(B, q0, "kk_q1", "kk_jc", "kk_jc + kk_ncur", "kk_Bc")
        # A panels: the M block's rows at the K block, or, resident (kk_ares), at all of K when the block is first
        # visited (its first N block and K block) into the thread's panels for all its rows; one packing code
        # for both (it had been two copies of the packing text, each of them gcc time)
        pack_a = [] if pre_a else [
            Decl("const long long", "kk_pcb", "kk_pc"), Decl("const long long", "kk_kcbb", "kk_kcb"),
            Block((Decl("const long long", "kk_pc", "kk_ares ? 0 : kk_pcb"),
                   Decl("const long long", "kk_kcb", "kk_ares ? kk_K : kk_kcbb"),
                   *self._pack(A, "0", f"kk_mcb / {mr}", "kk_ic", "kk_M",
                               "(kk_ares ? kk_Ap + (kk_ic - kk_m0) * kk_K : kk_Ap)")))]
        # pre-packed B: panel p of all of K at p*NR*K (kk_jc is a multiple of NR: NC and the N splits are)
        b_at = (f"{self.pre['b']} + (kk_jc + kk_jr*{nr})*kk_K + kk_pc*{nr}" if pre_b else
                f"kk_Bc + kk_jr*{nr}*kk_kcb")
        c_at = f"kk_Ct + (kk_ic + kk_ir - {self.c_row0})*kk_ldc + kk_jr*{nr}, kk_ldc, kk_pc > 0);"   # C and acc

        def tile(rows: int | None, out: bool = False):
            """The micro-kernel call of one MR x NR tile, of its first ``rows`` rows only when given; ``out``:
            its sums into ``kk_o`` (no C tile: K is one block), then the epilogue on them (``_tile_epilogue``)."""
            to = "kk_o);" if out else c_at
            call = Raw(f"{micro_name(mr, nr, self.vw, rows=rows, out=out)}(kk_kcb, kk_Ac + kk_ir*kk_lda, {b_at}, {to}")
            if stg is not None:     # B from the stage: the panel's first row's offset, the K offsets, its two runs
                call = If("kk_dir && kk_jr < kk_nfull" if in_place else "kk_dir", (Raw(
                    f"{stage_micro_name(mr, nr, self.vw, rows, out)}(kk_kcb, kk_Ac + kk_ir*kk_lda, "
                    f"kk_S + kk_bsb + kk_brso[kk_jc + kk_jr*{nr}], kk_bkso + kk_pc, kk_ps[kk_jr], kk_pd[kk_jr], "
                    f"{to}"),), (call,))
            if astg is not None:    # A from its stage: the panel's first row's offset, the K offsets, its two runs
                call = If("kk_adir", (Raw(
                    f"{astage_micro_name(mr, nr, self.vw, astg.rdim is not None, rows, out)}(kk_kcb, "
                    f"kk_S + kk_asb + kk_arso[kk_ic + kk_ir], kk_akso + kk_pc, kk_aps[(kk_ic + kk_ir) / {mr}], "
                    f"kk_apd[(kk_ic + kk_ir) / {mr}], {'kk_asu, ' if astg.rdim is not None else ''}{b_at}, "
                    f"{to}"),), (call,))
            if not out:
                return call
            rows_ = rows or mr
            return Block((Raw(f"kk_vf kk_o[{rows_ * (nr // self.vw)}];"), call, *fz[rows_]))

        def either(rows: int | None):
            """The tile with its epilogue on the accumulators where the header's KUMIKO_VW is the plan's width,
            else into C (the block's epilogue pass follows)."""
            if not fz:
                return tile(rows)
            return Block((Raw(f"#if KUMIKO_VW == {self.vw}"), tile(rows, True), Raw("#else"), tile(rows),
                          Raw("#endif")))
        fz = self._tile_epilogue() if fuse else None
        lo.tile_epilogue = lo.tile_epilogue or fz is not None
        call = either(None)
        if self.m_tail:         # the last tile of M: its rows alone, not MR (``micro.micro_kernel``'s rows)
            call = If(f"kk_ic + kk_ir + {mr} <= kk_M", (call,), (either(self.m_tail),))
        micro = For("kk_jr", "0", "kk_np", (For("kk_ir", "0", "kk_mcb", (call,), step=str(mr)),))
        if fz and self._rows_outer():
            # the epilogue on the accumulators reads and writes each row of the tile: row tiles outermost, each
            # across every panel, so the residual and output rows stream in order (panels outermost, each row
            # tile's 64 bytes a row apart: 1x1 convs 64 -> 256 at 56x56 with a residual ran 0.93 of the time)
            micro = For("kk_ir", "0", "kk_mcb", (For("kk_jr", "0", "kk_np", (call,)),), step=str(mr))
        block = [Decl("const long long", "kk_mcb", "kk_m1 - kk_ic < kk_mblk ? kk_m1 - kk_ic : kk_mblk"),
                 *([] if pre_a else [If(f"(!kk_ares || (kk_pc == 0 && kk_jc == kk_n0)){no_astage}", tuple(pack_a))]),
                 Decl("const float*", "kk_Ac", f"kk_ares ? kk_Ap + (kk_ic - kk_m0) * kk_K + kk_pc * {mr} : kk_Ap"),
                 Decl("const long long", "kk_lda", "kk_ares ? kk_K : kk_kcb"),
                 micro]
        rows_end = "(kk_ic + kk_mcb < kk_M ? kk_ic + kk_mcb : kk_M)"
        if win:
            epi_code = self._epi_window(epilogue, "kk_ic", rows_end)
        else:
            # the output's innermost axis on the M side: the epilogue runs down the columns
            epi = self._epi_transposed if lo.r.iters[-1].name in A.rows[-1:] else self._epi_pointwise
            epi_code = epi(epilogue, "kk_ic", rows_end, "0", "kk_ncur")
        if fz:      # the tiles ran the epilogue on their accumulators: no pass over the block
            epi_code = [Raw(f"#if KUMIKO_VW != {self.vw}"), *epi_code, Raw("#endif")]
        if not dyn:
            block.append(If("kk_last", tuple(epi_code)))
        # the threads of mode 0 share the B panels they pack: none to share when B is pre-packed (each thread's A
        # panels, C rows and stage reads are its own)
        barrier = [] if pre_b else [Raw("if (kk_mode == 0) {\n#pragma omp barrier\n}")]
        kblock = [Decl("const long long", "kk_kcb", "kk_K - kk_pc < kk_kstep ? kk_K - kk_pc : kk_kstep"),
                  Decl("float* KUMIKO_RESTRICT", "kk_Bc", "kk_Bt + (kk_it++ & 1) * kk_bsz"),
                  Decl("const int", "kk_last", "kk_pc + kk_kcb >= kk_K"),
                  *([If("!kk_dir", tuple(pack_b))] if stg is not None and not in_place else pack_b), *barrier,
                  For("kk_ic", "kk_m0", "kk_m1", tuple(block), step="kk_mblk")]
        jblock = [Decl("const long long", "kk_ncur", "kk_n1 - kk_jc < kk_nc ? kk_n1 - kk_jc : kk_nc"),
                  Decl("const long long", "kk_np", f"(kk_ncur + {nr - 1}) / {nr}"),
                  *([Decl("const long long", "kk_ngr", "kk_ncur / kk_G")] if win else []),
                  Decl("const long long", "kk_q0", "kk_mode ? 0 : kk_t * kk_np / kk_nt"),
                  Decl("const long long", "kk_q1", "kk_mode ? kk_np : (kk_t + 1) * kk_np / kk_nt"),
                  # B from the stage (kk_dir) with A resident: K blocks whose panel fits L1 (kk_kl1; one block of
                  # all of K reloaded the panel from L2 for every M panel: 3x3 convs at 56x56 and 28x28 ran
                  # 0.90-0.95 of the time with K in blocks of at most 256 on AVX2)
                  *(stg.block_check() if stg is not None else []),
                  # (read in place, a short last panel is packed: for all of K only where that fits)
                  # (a channels-last conv's padded A stage under pre-packed weights: all of K in one block, the C
                  # tile kept in registers for it; 3x3 convs 0.82-0.97 of the time on a 2-core Zen 3, a 1x1's in
                  # place A with K 1024 1.13, so not there)
                  Decl("const long long", "kk_kstep",
                       "kk_dir && kk_ares && kk_K > 0 && (kk_nfull == kk_np || kk_K <= kk_kc) ? kk_kl1 : kk_kc"
                       if in_place else "kk_dir && kk_ares && kk_K > 0 ? kk_kl1 : kk_kc" if stg is not None
                       else "kk_adir && kk_K > 0 ? kk_K : kk_kc" if one_k_a else "kk_kc"),
                  *(self._dealt_blocks(block, epi_code) if dyn else [
                      Raw("for (long long kk_pc = 0; kk_pc < kk_K || kk_pc == 0; kk_pc += kk_kstep) {"), *kblock,
                      Raw("}")])]
        par.append(For("kk_b", "kk_b0", "kk_b1", tuple(bdec) + (
            For("kk_jc", "kk_n0", "kk_n1", tuple(jblock), step="kk_nc"),)))
        par.append(Raw("kk_scratch_trim(4);"))
        # the units each thread has taken from its share, one cache line apart (kk_take)
        s += [*([Raw(DEAL_COUNTERS)] if dyn else []),
              Raw("#pragma omp parallel num_threads(kk_T)\n{"), *par, Raw("}"),
              Raw("kk_scratch_trim(0); kk_scratch_trim(1); kk_scratch_trim(2); kk_scratch_trim(3);" +
                  (" kk_scratch_trim(10);" if (self.stage is not None and not self.stage.in_place) or
                   self.astage is not None else ""))]
        return s


def pointwise_epilogue(lo: CpuLowering, c: Contraction) -> list:
    """The region's other lets and its store at one point, with the accumulator in the C scalar ``kk_acc``
    (the point's axes are declared by the caller)."""
    return lo.point_code(c.let, "kk_acc")


@dataclass(frozen=True)
class Prepack:
    """A constant operand's panels, packed once by their own function and read in place by the kernel.

    ``kernel`` takes the region kernel's buffers (inputs, outputs, then the packed panels of each pre-packed
    side, ``a`` before ``b``) and writes the panels of side ``key``; ``floats`` is their size over the size
    symbols; ``sources`` the constant inputs they are packed from (the runtime packs again when a call
    passes other arrays for them)."""
    key: str
    kernel: Kernel
    floats: Expr
    sources: tuple


def lower_contraction_kernels(lo: CpuLowering, plan: Plan, constants: frozenset = frozenset(),
                              lowering: type | None = None) -> tuple[Kernel, tuple[Prepack, ...]] | None:
    """The region as contraction (+ in-tile epilogue, or + generic rest over a scratch accumulator), with
    the operands that read only ``constants`` (inputs bound once, the weights) packed by functions of their
    own: (the kernel, its Prepacks); None when the region holds no contraction. ``lowering``: another
    ContractionLowering class (the skinny path, ``kumiko.kernel.skinny``)."""
    c = lo.facts.contraction
    if c is None:
        return None
    cl = (lowering or ContractionLowering)(lo, c, plan, constants)
    kern = _contraction_kernel(lo, c, cl)
    packs = []
    for key in sorted(cl.pre):
        sd = cl.a if key == "a" else cl.b
        reads = tuple(sorted(read_tensors(sd.expr)))
        pk = dataclasses.replace(kern, name=f"{kern.name}__pack_{key}", body=tuple(cl.prepack(key)),
                                 params=tuple(dataclasses.replace(p, const=False) if p.name == cl.pre[key] else p
                                              for p in kern.params),
                                 notes=(f"packs the {key.upper()} panels of {lo.r.name} from {', '.join(reads)} "
                                        "once: a constant operand",), gather_check=False, no_loop_vectorize=False)
        packs.append(Prepack(key, pk, cl.prepack_floats(key), reads))
    return kern, tuple(packs)


def _heavy(e: RExpr) -> bool:
    """Does ``e`` compute a function of ``HEAVY_UNARY``?"""
    return (isinstance(e, Unary) and e.fn in HEAVY_UNARY) or any(_heavy(k) for k in children(e))


def _flat_span(e: RExpr, span: tuple, sizes: tuple, memrefs: dict) -> bool:
    """Does ``e`` see the axes ``span`` only as the trailing index of reads whose trailing dimensions have
    ``sizes`` (and through pointwise ops)? Anything else that could use them (a guard, a gather) says no."""
    if isinstance(e, (Const, Ref)):
        return True
    if isinstance(e, Read):
        m, names = len(span), set(span)
        if not any(x.symbols() & names for x in e.index):
            return True
        return (not e.flat and len(e.index) >= m and tuple(e.index[-m:]) == tuple(Expr.sym(a) for a in span)
                and tuple(memrefs[e.tensor].shape[-m:]) == sizes
                and not any(x.symbols() & names for x in e.index[:-m]))
    if isinstance(e, (Unary, Binary, Cast, BroadcastInDim)):
        return all(_flat_span(k, span, sizes, memrefs) for k in children(e))
    return False


def _contraction_kernel(lo: CpuLowering, c: Contraction, cl: ContractionLowering) -> Kernel:
    extra = tuple(Param(cl.pre[k], "float", True) for k in sorted(cl.pre))
    if c.pointwise:
        body = cl.emit(lambda: pointwise_epilogue(lo, c), fuse=True)
        return _kernel(lo, body, extra)
    # 2-phase: accumulator into a full scratch array over its axes, then the generic nest for the rest
    axes = lo.types[c.let].axes
    scratch = "a_" + c.let
    size = C.index(prod([lo.sizes[a] for a in axes]), set())

    def to_scratch() -> list:
        off = C.offset(tuple(Expr.sym(a) for a in axes), tuple(lo.sizes[a] for a in axes), set(axes))
        return [Store(scratch, off, "kk_acc")]
    # a Scratch, not Raw text: its name (made from the let's) is then one the canonical form renames, so the
    # same kernel in each of BERT-base's 12 layers is one function (it had been 12 units of gcc, 0.5 s each)
    body = [Scratch("float", scratch, size)] + cl.emit(to_scratch)
    rest = [x for x in lo.r.lets if x.name != c.let]
    lo.r = dataclasses.replace(lo.r, lets=tuple(rest))
    tree = lo.schedule()
    lo.plan_storage(tree)
    lo.storage[c.let] = ("array", scratch, axes)
    lo.red_axes = []
    body += [parallelize(s) for s in lo.emit_items(tree, ())]     # the Scratch is freed at the body's end
    return _kernel(lo, body, extra)


def _kernel(lo: CpuLowering, body: list, extra: tuple = ()) -> Kernel:
    params = tuple(Param(lo.cname[n], C.STORAGE[m.dtype.name], n in dict(lo.r.inputs))
                   for n, m in lo.memrefs.items()) + extra
    return Kernel(lo.name, params, lo.syms, tuple(body), lo.r.notes, gather_check=lo.uses_gather,
                  no_loop_vectorize=lo.reversed_reduce)
