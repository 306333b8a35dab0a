"""The skinny contraction path: a contraction whose A side has few rows (GEMV and skinny GEMM: a
transformer decoding one token, a classifier head at batch 1), chosen by the plan
(``algo_choice {"contraction": "skinny"}``, ``kumiko.plan.choose.skinny_tile``) from the region's sizes.

Such a contraction is bound by reading B (the weights) once, not by multiply-adds, so the kernel is
built around streaming B: the N columns are cut into panels of NR columns (NR = several vectors, as
many as the registers hold next to MR x NR accumulators, MR = the A side's row count), and the threads
split the (batch point, panel) units evenly - each thread a contiguous range of panels, every thread
busy at batch 1. For each unit the micro-kernel (the packed path's ``micro_kernel(MR, NR)``) runs over
all of K in one pass: A is one [K][MR] panel, packed once per batch point by each thread (M x K floats:
small), B the panel's NR x K values, contiguous. A constant B (a bound weight) is pre-packed once into
exactly these panels (``kumiko.kernel.contract.Prepack``: panel p at ``p*NR*K``), so the kernel streams
the weights in the order they lie in memory, each element read once per call. Any other B whose panel
is NR consecutive fp32 elements at K offsets one stride apart (a row-major [K, N] weight passed as an
input, checked at run time from the index tables) is read in place (``micro_kernel(..., b_ld=True)``);
the rest (the last, partial panel; weights used transposed; a cast) is packed panel by panel into a
per-thread buffer that stays in L2 and is read right after. The accumulator tile
(MR x NR) goes through a per-thread scratch to the region's epilogue (bias, activation, residual, cast),
which runs on the panel's columns as on the packed path's blocks.
"""
from __future__ import annotations

from kumiko.kernel.contract import ContractionLowering
from kumiko.kernel.loops import Comment, Decl, If, Raw
from kumiko.kernel.micro import micro_name
from kumiko.region.operands import unit_rows


class SkinnyLowering(ContractionLowering):
    """Emits a skinny contraction (module docstring) into a region kernel."""

    def __init__(self, lo, c, plan, constants: frozenset = frozenset()):
        super().__init__(lo, c, plan, constants)
        self.stage = None         # B is read from its panels (pre-packed or packed per panel), never staged
        t = self.b.table          # B read in place where a panel's rows are consecutive fp32 elements
        self.in_place = ("b" not in self.pre and t is not None and not t.guards and t.identity
                         and unit_rows(self.b.rows, t))
        lo.b_ld = lo.b_ld or self.in_place

    def emit(self, epilogue, fuse: bool = False) -> list:     # (its epilogue runs after the units: no tile epilogue)
        c, lo, A, B = self.c, self.lo, self.a, self.b
        mr, nr = self.mr, self.nr
        k_axes = tuple(a.name for a in c.k_axes)
        lo.ty.add_axes(c.k_axes)
        pre_a, pre_b = "a" in self.pre, "b" in self.pre
        s: list = [Comment(f"skinny contraction {c.let}: batch {list(c.batch)}, M {list(A.rows)} "
                           f"({'pre-packed' if pre_a else 'packed per batch point'}), N {list(B.rows)} "
                           f"({'pre-packed panels' if pre_b else 'packed per panel'}), K {list(k_axes)}; "
                           f"micro {mr}x{nr} over all of K, threads split the panels"),
                   *self._size_decls()]
        s += lo.unit_decls(c)
        s += [Decl("const long long", "kk_np", f"(kk_N + {nr - 1}) / {nr}"),
              Decl("const long long", "kk_U", "kk_B * kk_np"),
              Decl("const long long", "kk_ldc", str(nr)),
              # threads: at most one per _MACS_PER_THREAD multiply-adds (as the packed path), and per unit
              Decl("const long long", "kk_work", f"kk_B * kk_M * kk_N * (kk_K > 0 ? kk_K : 1) / {1 << 17}"),
              Decl("long long", "kk_T", "omp_get_max_threads() < 1 + kk_work ? omp_get_max_threads() : 1 + kk_work"),
              Raw("if (kk_T > kk_U) kk_T = kk_U > 0 ? kk_U : 1;")]
        fills: list = []
        for sd in (A, B):
            if sd.table is not None and sd.key not in self.pre:
                al, fi = self._tables(sd)
                s += al
                fills += fi
        par: list = [Decl("const int", "kk_t", "omp_get_thread_num()"),
                     Decl("const int", "kk_nt", "omp_get_num_threads()")]
        if fills:
            par += fills + [Raw("#pragma omp barrier")]
        if self.in_place:     # the K offsets one stride apart: rows kk_ldb elements apart
            par += [Decl("const long long", "kk_ldb", "kk_K > 1 ? kk_bko[1] - kk_bko[0] : 0"),
                    Decl("int", "kk_bin", "1"),
                    Raw("for (long long kk_k = 1; kk_k < kk_K; ++kk_k)\n"
                        "  kk_bin &= kk_bko[kk_k] == kk_bko[0] + kk_k * kk_ldb;")]
        par += [Decl("const long long", "kk_u0", "kk_t * kk_U / kk_nt"),
                Decl("const long long", "kk_u1", "(kk_t + 1) * kk_U / kk_nt"),
                Decl("float* KUMIKO_RESTRICT", "kk_Ct", f"(float*)kk_scratch(0, sizeof(float) * {mr * nr})"),
                Decl("const float* KUMIKO_RESTRICT", "kk_Ap", self.pre["a"]) if pre_a else
                Decl("float* KUMIKO_RESTRICT", "kk_Ap",
                     f"(float*)kk_scratch(4, sizeof(float) * (size_t)({mr} * kk_K))"),
                *([] if pre_b else [Decl("float* KUMIKO_RESTRICT", "kk_Bc",
                                         f"(float*)kk_scratch(1, sizeof(float) * (size_t)({nr} * kk_K))")]),
                Decl("long long", "kk_bl", "-1"),
                Decl("const long long", "kk_pc", "0"), Decl("const long long", "kk_kcb", "kk_K")]
        unit: list = [Decl("const long long", "kk_b", "kk_u / kk_np"),
                      Decl("const long long", "kk_jc", f"kk_u % kk_np * {nr}"),
                      Decl("const long long", "kk_ncur", f"kk_N - kk_jc < {nr} ? kk_N - kk_jc : {nr}")]
        self.decompose("kk_b", c.batch, unit)
        for sd in (A, B):
            if sd.table is not None and sd.key not in self.pre:
                unit += self._batch_parts(sd)
        if not pre_a:
            unit.append(If("kk_b != kk_bl", (*self._pack(A, "0", "1", "0", "kk_M", "kk_Ap"), Raw("kk_bl = kk_b;"))))
        b_at = f"{self.pre['b']} + kk_jc * kk_K" if pre_b else "kk_Bc"
        call = Raw(f"{micro_name(mr, nr, self.vw)}(kk_K, kk_Ap, {b_at}, kk_Ct, kk_ldc, 0);")
        if self.in_place:     # a whole panel of consecutive rows: read in place, else packed
            src = f"{lo.cname[B.table.tensor]} + kk_bbo + kk_bro[kk_jc] + kk_bko[0]"
            unit += [Decl("int", "kk_dir", f"kk_bin && kk_ncur == {nr}"),
                     Raw(f"for (int kk_r = 1; kk_r < {nr} && kk_dir; ++kk_r) kk_dir = kk_bro[kk_jc + kk_r] == "
                         "kk_bro[kk_jc] + kk_r;"),
                     If("kk_dir", (Raw(f"{micro_name(mr, nr, self.vw, b_ld=True)}(kk_K, kk_Ap, {src}, kk_ldb, "
                                       "kk_Ct, kk_ldc, 0);"),),
                        (*self._pack(B, "0", "1", "kk_jc", "kk_N", "kk_Bc"), call))]
        else:
            unit += [*(self._pack(B, "0", "1", "kk_jc", "kk_N", "kk_Bc") if not pre_b else []), call]
        unit += self._epi_pointwise(epilogue, "0", "kk_M", "0", "kk_ncur")
        par.append(Raw("for (long long kk_u = kk_u0; kk_u < kk_u1; ++kk_u) {"))
        par += unit
        par.append(Raw("}"))
        par.append(Raw("(void)kk_bl; (void)kk_pc; (void)kk_kcb; kk_scratch_trim(1); kk_scratch_trim(4);"))
        s += [Raw("#pragma omp parallel num_threads(kk_T)\n{"), *par, Raw("}"),
              Raw("kk_scratch_trim(2); kk_scratch_trim(3);")]
        return s
