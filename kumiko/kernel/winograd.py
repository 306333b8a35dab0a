"""The Winograd path of the CPU contraction: a 3x3, stride-1 convolution as F(m x m, 3x3) (m = 2 or 4), chosen by
the plan (``algo_choice {"contraction": "winograd", "tile": m}``, ``kumiko.plan.winograd``) from the region's
read maps.

The region is the packed path's (``kumiko.kernel.contract``): the same A side (the output pixels, read from
the padded stage of the input, channels-last), the same pre-packed B side (the weights), the same C scratch
(pixels x output channels) and the same epilogue over its rows (bias, activation, residual, cast). Only the
product that fills a block of C differs. A block is ``cache_block.mc`` tile rows (each tile m x m output
pixels, so m output rows per tile row: the block's pixels are consecutive rows of C) times
``cache_block.nc`` output channels. With n = m + 2, for a block, each thread

1. transforms every tile's n x n input patch (read from the stage at the tile's top-left pixel's offset,
   the stage's row and column strides apart) into ``V[xi][tile][C]`` (``micro.winograd_helpers``, generated
   from the transform matrices);
2. runs the n^2 GEMMs ``X[xi] = V[xi] (tiles x C) @ U[xi] (C x columns)`` with the packed path's row-major-A
   micro-kernel (MR tiles x NR channels, all of C at once);
3. transforms each tile's n^2 products back into its m x m pixels, into the C scratch, and runs the epilogue
   on the block's rows of C.

The threads take the blocks as they come (``kk_take``, each its own share first). The transformed filter
``U[xi][panel][C][NR]`` is the constant pool's: the weights' pre-packed panels (the packed path's layout,
packed into a temporary) transformed once, ``U = G g G^T`` in double precision, when the weights are bound.
"""
from __future__ import annotations

from kumiko.kernel.contract import _MACS_PER_THREAD, DEAL_COUNTERS, ContractionLowering, next_block
from kumiko.kernel.loops import Comment, Decl, For, Raw
from kumiko.kernel.micro import micro_name, winograd_name
from kumiko.plan.winograd import TRANSFORMS, winograd_geometry
from kumiko.region.operands import Orientation
from kumiko.symbolic import Expr


class WinogradLowering(ContractionLowering):
    """Emits a contraction as Winograd F(m x m, 3x3) (module docstring) into a region kernel."""

    def __init__(self, lo, c, plan, constants: frozenset = frozenset()):
        super().__init__(lo, c, plan, constants)
        self.geom = winograd_geometry(c, self._orientation(), lo.sizes, self.vw, "b" in self.pre)
        if self.geom is None or self.astage is None or self.astage.rdim is None:
            raise ValueError(f"{lo.r.name}: not a convolution Winograd F(m x m, 3x3) computes (validate the plan)")

    def _orientation(self) -> Orientation:
        return Orientation(self.a.expr, self.a.rows, self.a.table, self.b.expr, self.b.rows, self.b.table,
                           self.swapped)

    @property
    def m(self) -> int:
        """The output tile: F(m x m, 3x3)."""
        return int(self.plan.get("algo_choice", "tile", 2))

    # the transformed weights ----------------------------------------------------------------------------
    def prepack_floats(self, key: str) -> Expr:
        g, nr, n = self.geom, self.nr, self.m + 2
        return Expr.lift(n * n * ((g.n + nr - 1) // nr) * nr * g.c)

    def prepack(self, key: str, dst: str | None = None) -> list:
        """Pack the weights' panels (panel q of all of K at ``q*NR*K``) into a temporary, then transform each
        (panel, input channel, lane)'s 3x3 filter into ``U[xi][q][ci][lane]``."""
        g, nr, c = self.geom, self.nr, self.c
        names = [a.name for a in c.k_axes]
        sizes = [int(Expr.lift(a.size).as_int()) for a in c.k_axes]
        stride = {a: 1 for a in names}
        for i in range(len(names) - 2, -1, -1):
            stride[names[i]] = stride[names[i + 1]] * sizes[i + 1]
        npan = (g.n + nr - 1) // nr
        kk = 9 * g.c
        n = self.m + 2
        gm = TRANSFORMS[self.m][1]
        gtext = ", ".join("{" + ", ".join(repr(float(v)) for v in row) + "}" for row in gm)
        body = [Raw(f"float* kk_wt = (float*)kumiko_tmp_alloc(sizeof(float) * (size_t){npan * nr * kk});")]
        body += super().prepack(key, "kk_wt")
        body.append(Raw(
            "{\n"
            f"  static const double kk_G[{n}][3] = {{{gtext}}};\n"
            f"  float* KUMIKO_RESTRICT kk_u = (float*){self.pre['b']};\n"
            "  #pragma omp parallel for\n"
            f"  for (long long kk_q = 0; kk_q < {npan}; ++kk_q)\n"
            f"    for (long long kk_ci = 0; kk_ci < {g.c}; ++kk_ci)\n"
            f"      for (int kk_j = 0; kk_j < {nr}; ++kk_j) {{\n"
            f"        double kk_t[{n}][3];\n"
            f"        for (int kk_i = 0; kk_i < {n}; ++kk_i)\n"
            "          for (int kk_b = 0; kk_b < 3; ++kk_b) {\n"
            "            double kk_s = 0;\n"
            "            for (int kk_a = 0; kk_a < 3; ++kk_a)\n"
            f"              kk_s += kk_G[kk_i][kk_a] * kk_wt[kk_q*{nr * kk} + (kk_ci*{stride[g.ci]} + "
            f"kk_a*{stride[g.kh]} + kk_b*{stride[g.kw]})*{nr} + kk_j];\n"
            "            kk_t[kk_i][kk_b] = kk_s;\n"
            "          }\n"
            f"        for (int kk_i = 0; kk_i < {n}; ++kk_i)\n"
            f"          for (int kk_l = 0; kk_l < {n}; ++kk_l) {{\n"
            "            double kk_s = 0;\n"
            "            for (int kk_b = 0; kk_b < 3; ++kk_b) kk_s += kk_t[kk_i][kk_b] * kk_G[kk_l][kk_b];\n"
            f"            kk_u[(((kk_i*{n} + kk_l)*{npan} + kk_q)*{g.c} + kk_ci)*{nr} + kk_j] = (float)kk_s;\n"
            "          }\n"
            "      }\n"
            "}\n"
            "kumiko_tmp_free(kk_wt);"))
        return body

    # the kernel -----------------------------------------------------------------------------------------
    def emit(self, epilogue, fuse: bool = False) -> list:     # (its epilogue follows the inverse transform)
        c, lo, A, g = self.c, self.lo, self.a, self.geom
        mr, nr, vw, m = self.mr, self.nr, self.vw, self.m
        n = m + 2
        nn = n * n
        tr, ncols = self.plan.cache_block.mc, self.plan.cache_block.nc
        astg = self.astage
        npan = (g.n + nr - 1) // nr
        tw = g.cols // m
        ntp = (tr * tw + mr - 1) // mr * mr
        s: list = [Comment(f"Winograd F({m}x{m}, 3x3) contraction {c.let}: M {list(A.rows)} ({g.rows} x {g.cols} "
                           f"pixels, {g.rows // m} x {tw} tiles, a padded stage read in place), N {list(self.b.rows)} "
                           f"({g.n}, the transformed weights pre-packed), K {[a.name for a in c.k_axes]} "
                           f"({g.c} channels x 3 x 3); {nn} GEMMs a block of {tr} tile rows x {ncols} channels, "
                           f"micro {mr}x{nr} (A rows)"),
                   *self._size_decls()]
        s += lo.unit_decls(c)
        al, fills = self._tables(A, astg.columns())
        s += al + astg.decls(always=True)
        fills = fills + astg.fill()
        s += [Decl("const long long", "kk_ncp", f"(kk_N + {nr - 1}) / {nr} * {nr}"),
              Decl("const long long", "kk_ldc", "kk_ncp % 1024 == 0 ? kk_ncp + 16 : kk_ncp"),
              Decl("const long long", "kk_work", f"kk_M * kk_N * (kk_K > 0 ? kk_K : 1) / {_MACS_PER_THREAD}"),
              Decl("const long long", "kk_T", "omp_get_max_threads() < 1 + kk_work ? omp_get_max_threads() : "
                   "1 + kk_work"),
              Decl("const long long", "kk_npart", f"(kk_N + {ncols - 1}) / {ncols}"),
              # tile rows of all images: counted at run time (the batch may be symbolic)
              Decl("const long long", "kk_trows", f"kk_M / {g.cols * m}"),
              Decl("const long long", "kk_nmbk", f"(kk_trows + {tr - 1}) / {tr} * kk_npart"),
              Raw("float* kk_C = (float*)kk_scratch(0, sizeof(float) * (size_t)(kk_Mp * kk_ldc));"),
              Raw(DEAL_COUNTERS)]
        par: list = [Decl("const int", "kk_t", "omp_get_thread_num()"),
                     Decl("const int", "kk_nt", "omp_get_num_threads()"),
                     *fills, Raw("#pragma omp barrier"),
                     # the stage (or the source itself, unpadded) holds every patch; without memory for it, stop
                     Raw("if (!kk_stg) __builtin_trap();"),
                     Decl("const long long", "kk_b", "0"), *self._batch_parts(A), astg.base(),
                     Decl("float* KUMIKO_RESTRICT", "kk_V",
                          f"(float*)kk_scratch(4, sizeof(float) * (size_t){nn * ntp * g.c})"),
                     Decl("float* KUMIKO_RESTRICT", "kk_X",
                          f"(float*)kk_scratch(1, sizeof(float) * (size_t){nn * ntp * ncols})"),
                     Decl("int", "kk_vic", "kk_t")]
        deal = "for (long long kk_bi = 0;;) {\nlong long kk_blk;\n" + next_block("kk_nt > 1")
        # a tile's top-left output pixel: row m*R of all images' rows, column m*tc (the C scratch's row)
        pix = f"{m} * kk_R * {g.cols} + {m} * kk_tc"
        where = (Decl("const long long", "kk_R", f"kk_R0 + kk_u / {tw}"),
                 Decl("const long long", "kk_tc", f"kk_u % {tw}"))
        block = [
            Decl("const long long", "kk_R0", f"kk_blk / kk_npart * {tr}"),
            Decl("const long long", "kk_R1", f"kk_R0 + {tr} < kk_trows ? kk_R0 + {tr} : kk_trows"),
            Decl("const long long", "kk_wn", f"(kk_R1 - kk_R0) * {tw}"),
            Decl("const long long", "kk_wp", f"(kk_wn + {mr - 1}) / {mr} * {mr}"),
            Decl("const long long", "kk_jc", f"kk_blk % kk_npart * {ncols}"),
            Decl("const long long", "kk_ncur", f"kk_N - kk_jc < {ncols} ? kk_N - kk_jc : {ncols}"),
            Decl("const long long", "kk_np", f"(kk_ncur + {nr - 1}) / {nr}"),
            Decl("const long long", "kk_ldx", f"kk_np * {nr}"),
            Comment(f"1. each tile's {n}x{n} input patch to V[xi][tile][C] (the tiles past the block's: zeros)"),
            For("kk_u", "0", "kk_wn", where + (
                Raw(f"{winograd_name('in', m, vw)}(kk_S + kk_asb + kk_akso[0] + kk_arso[{pix}], kk_sst{g.dh}, "
                    f"kk_sst{g.dw}, {g.c}, kk_V + kk_u * {g.c}, kk_wp * {g.c});"),)),
            Raw(f"if (kk_wp > kk_wn)\n  for (int kk_xi = 0; kk_xi < {nn}; ++kk_xi)\n"
                f"    memset(kk_V + (kk_xi * kk_wp + kk_wn) * {g.c}, 0, sizeof(float) * (size_t)((kk_wp - kk_wn) * "
                f"{g.c}));"),
            Comment(f"2. the {nn} GEMMs X[xi] = V[xi] @ U[xi], all of C at once"),
            For("kk_xi", "0", str(nn), (For("kk_q", "0", "kk_np", (For("kk_i", "0", "kk_wp", (Raw(
                f"{micro_name(mr, nr, vw, a_rows=True)}({g.c}, kk_V + (kk_xi * kk_wp + kk_i) * {g.c}, {g.c}, "
                f"{self.pre['b']} + ((kk_xi * {npan} + kk_jc / {nr} + kk_q) * {g.c}) * {nr}, "
                f"kk_X + (kk_xi * kk_wp + kk_i) * kk_ldx + kk_q * {nr}, kk_ldx, 0);"),), step=str(mr)),)),)),
            Comment(f"3. each tile's products to its {m}x{m} pixels in C, then the epilogue on the block's rows"),
            For("kk_u", "0", "kk_wn", where + (
                Raw(f"{winograd_name('out', m, vw)}(kk_X + kk_u * kk_ldx, kk_wp * kk_ldx, kk_ldx, "
                    f"kk_C + ({pix}) * kk_ldc + kk_jc, {g.cols} * kk_ldc, kk_ldc);"),)),
            Decl("float*", "kk_Ct", "kk_C + kk_jc"),
            *self._epi_pointwise(epilogue, f"{m} * kk_R0 * {g.cols}", f"{m} * kk_R1 * {g.cols}", "0", "kk_ncur"),
        ]
        par += [Raw(deal), *block, Raw("}")]
        s += [Raw("#pragma omp parallel num_threads(kk_T)\n{"), *par, Raw("}"),
              Raw("kk_scratch_trim(0); kk_scratch_trim(1); kk_scratch_trim(2); kk_scratch_trim(4); "
                  "kk_scratch_trim(10);")]
        return s
