"""Operand packing of the packed contraction path (``kumiko.kernel.contract``): the index tables and the
C that packs A and B panels for the micro-kernel. Which operand goes into which panels, in which row
order, and which operands have a table form is the region's business (``kumiko.region.operands``).

Packing through index tables. A table-form operand is packed from tables computed once per call:
a row offset and a row guard value per row, a K offset and K guard value per K index, a scalar per
batch point. The row tables are filled with counters (no division per row). A panel (MR or NR rows)
is classified once per K block: its rows are one contiguous run, two runs (a row of pixels that wraps),
or apart; each guard's extremes over its rows and over the block's K decide whether every row is
valid at every k. Then: one copy of R floats per k (a run), or 8 x 8 transposes (rows apart, K
consecutive: a row-major A); otherwise per k a copy, zeros, or a per-row mask from the guards (AVX2
masked loads of the runs or a masked gather; scalar code without AVX2). Rows 2 elements apart (a stride-2
conv's pixels) get one more case: a chunk of 8 rows (16 with AVX-512) that is one run of stride 2 is
deinterleaved from two loads of the floats it spans, masked to the valid rows where the guards leave some
out. An operand without a table form is packed by the generic expression emitter per element.

``PanelPacking`` is the packing half of ``contract.ContractionLowering`` (a mixin); ``_PackText`` writes
the C text of the table path.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Block, Decl, For, If, Raw, Store
from kumiko.region.analysis import Contraction
from kumiko.region.operands import TableForm, orient, row_step
from kumiko.region.ssa import RExpr, VType


@dataclass(frozen=True)
class Side:
    key: str              # "a": packed into A panels (the M side), "b": into B panels (the N side)
    expr: RExpr
    rows: tuple           # row axes, outermost first: a packed row is the row-major flat index over them
    r: int                # panel width (MR or NR)
    table: TableForm | None  # None: packed by the generic emitter, element by element
    count: str            # the C variable holding the number of rows


def panel_sides(c: Contraction, memrefs: dict, mr: int, nr: int, sizes: dict,
                lanes: str | None = None) -> tuple[Side, Side, bool]:
    """(A side, B side, swapped): the operands' orientation (``kumiko.region.operands.orient``, with the
    plan's ``lanes`` choice) as the panels of MR and NR rows the kernel packs."""
    o = orient(c, memrefs, sizes, lanes)
    return Side("a", o.a, o.a_rows, mr, o.a_table, "kk_M"), Side("b", o.b, o.b_rows, nr, o.b_table, "kk_N"), o.swapped


def advance_counter(names: tuple, sizes: tuple) -> str:
    """Advance a row-major counter over ``names`` by one (the outermost never wraps)."""
    text = f"++{names[0]};"
    for n, s in zip(names[1:], sizes[1:]):
        text = f"if (++{n} == {s}) {{ {n} = 0; {text} }}"
    return text


_BIG = "(1LL << 62)"       # beyond any index: the starting point of the panel's guard extremes
_SMALL = "(1LL << 30)"     # guard values within this use 32-bit vector compares


def _ld8(arr: str, c0: int) -> str:
    return f"_mm256_load_si256((const __m256i*)({arr} + {c0}))"


class _PackText:
    """The C text that packs panels of one table-form operand (``PanelPacking._pack_table``).

    Per K block: whether the K offsets are consecutive, and each guard's extremes over K. Per panel: the
    rows' offsets relative to the first (one contiguous run, two runs, or a gather), each guard's
    threshold per row and its extremes over the panel. Then, when every row is valid at every k of the
    block, one copy per k (a run) or 8 x 8 transposes (rows apart, K consecutive); else per k: a copy
    (every row valid), zeros (none), or a per-row mask - AVX2 masked loads of the runs or a masked
    gather, a scalar loop without AVX2 or past 32-bit guard values."""

    def __init__(self, sd: Side, src: str, at_run: tuple, at_rel: tuple, at_k: tuple, step: int | None = None):
        self.t, self.R, self.p, self.src = sd.table, sd.r, f"kk_{sd.key}", src
        self.G = len(self.t.guards)
        self.RV = (self.R + 7) // 8 * 8
        self.vec = self.t.identity              # fp32 elements as they are: vector copies apply
        # consecutive rows 2 elements apart (a stride-2 conv's pixels): only then can a chunk of rows be one
        # run of stride 2, so only then is the code that copies such chunks emitted (gcc's time for it is
        # wasted elsewhere: emitted for every panel, it made ResNet-50's units take 1.1-1.2x the gcc time)
        self.s2 = self.vec and step == 2
        self.at_run, self.at_rel, self.at_k = at_run, at_rel, at_k   # (decl of kk_ld, value) at an index

    def block(self, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        p, G = self.p, self.G
        L = ["{", "int kk_kcontig = kk_kcb > 0;     /* the K offsets of the block are consecutive */",
             f"for (long long kk_k = kk_pc; kk_k < kk_pc + kk_kcb; ++kk_k) "
             f"kk_kcontig &= {p}ko[kk_k] == {p}ko[kk_pc] + (kk_k - kk_pc);"]
        L += [f"long long kk_kmin{j} = {_BIG}, kk_kmax{j} = -{_BIG};" for j in range(G)]
        if G:     # the extremes of each guard's K part over the K block
            L += ["for (long long kk_k = kk_pc; kk_k < kk_pc + kk_kcb; ++kk_k) {"]
            L += [f"  kk_kmin{j} = {p}kg{j}[kk_k] < kk_kmin{j} ? {p}kg{j}[kk_k] : kk_kmin{j}; "
                  f"kk_kmax{j} = {p}kg{j}[kk_k] > kk_kmax{j} ? {p}kg{j}[kk_k] : kk_kmax{j};" for j in range(G)]
            L += ["}"]
        L += [f"for (long long kk_q = {q0}; kk_q < {q1}; ++kk_q) {{", *self.panel(rowbase, limit, dst),
              *self.whole_block(), *self.per_k(), "}", "}"]
        return L

    def panel(self, rowbase: str, limit: str, dst: str) -> list:
        R, RV, p = self.R, self.RV, self.p
        L = [f"  const long long kk_r0 = {rowbase} + kk_q*{R};",
             f"  const long long kk_nv = {limit} - kk_r0 < {R} ? ({limit} - kk_r0 > 0 ? {limit} - kk_r0 : 0) : {R};",
             f"  float* KUMIKO_RESTRICT kk_d = {dst} + kk_q*{R}*kk_kcb;",
             f"  const long long* kk_ro = {p}ro + kk_r0;",
             f"  const long long kk_base = {p}bo + kk_ro[0];",
             f"  long long kk_rel[{R}];",
             f"  for (int kk_r = 0; kk_r < {R}; ++kk_r) kk_rel[kk_r] = kk_r < kk_nv ? kk_ro[kk_r] - kk_ro[0] : 0;",
             "  /* the rows: one contiguous run (1), two runs [0, kk_s) and [kk_s, kk_nv) (2), or apart (3) */",
             "  long long kk_s = 0;",
             "  while (kk_s < kk_nv && kk_rel[kk_s] == kk_s) ++kk_s;",
             "  const long long kk_d2 = kk_s < kk_nv ? kk_rel[kk_s] - kk_s : 0;",
             "  int kk_runs = kk_s == kk_nv ? 1 : 2;",
             "  for (long long kk_r = kk_s; kk_r < kk_nv; ++kk_r) if (kk_rel[kk_r] != kk_d2 + kk_r) kk_runs = 3;"]
        for j in range(self.G):     # row r is valid at k when the K part (+ batch part) reaches kk_t[r]
            L += [f"  long long kk_t{j}[{R}], kk_hi{j} = -{_BIG}, kk_lo{j} = {_BIG};",
                  f"  for (int kk_r = 0; kk_r < kk_nv; ++kk_r) {{ kk_t{j}[kk_r] = -{p}rg{j}[kk_r0 + kk_r]; "
                  f"kk_hi{j} = kk_t{j}[kk_r] > kk_hi{j} ? kk_t{j}[kk_r] : kk_hi{j}; "
                  f"kk_lo{j} = kk_t{j}[kk_r] < kk_lo{j} ? kk_t{j}[kk_r] : kk_lo{j}; }}"]
        if self.vec:
            L += ["#if defined(__AVX2__)",
                  f"  KUMIKO_ALIGN(32) int kk_l1[{RV}], kk_l2[{RV}], kk_ri[{RV}];",
                  "  int kk_small = 1;",
                  f"  for (int kk_r = 0; kk_r < {RV}; ++kk_r) {{",
                  "    kk_l1[kk_r] = kk_r < kk_s && kk_r < kk_nv ? -1 : 0;",
                  "    kk_l2[kk_r] = kk_r >= kk_s && kk_r < kk_nv ? -1 : 0;",
                  "    kk_ri[kk_r] = kk_r < kk_nv ? (int)kk_rel[kk_r] : 0;",
                  "    kk_small &= kk_r >= kk_nv || (kk_rel[kk_r] > -2147483647LL && kk_rel[kk_r] < 2147483647LL);",
                  "  }"]
            for j in range(self.G):
                L += [f"  KUMIKO_ALIGN(32) int kk_i{j}[{RV}];",
                      f"  for (int kk_r = 0; kk_r < {RV}; ++kk_r) {{",
                      f"    kk_i{j}[kk_r] = kk_r < kk_nv ? (int)kk_t{j}[kk_r] : 0;",
                      f"    kk_small &= kk_r >= kk_nv || (kk_t{j}[kk_r] > -{_SMALL} && kk_t{j}[kk_r] < {_SMALL});",
                      "  }"]
            L.append("#endif")
            # chunks of rows that are one run of stride 2 (a stride-2 conv's pixels): 16 rows with AVX-512
            # (``kk_s2``), 8 with AVX2 (``kk_s8``, the last one as short as the panel's rows leave)
            if not self.s2:
                return L
            if R >= 16:
                L += ["#if defined(__AVX512F__)", *self._s2_flags("kk_s2", 16, R // 16), "#endif"]
            L += ["#if defined(__AVX2__)", *self._s2_flags("kk_s8", 8, len(self._chunks8())), "#endif"]
        return L

    def _chunks8(self) -> list:
        """(first row, rows) of the panel's 8-row chunks (AVX2): the last one as short as the rows leave."""
        return [(c0, min(8, self.R - c0)) for c0 in range(0, self.R, 8)]

    def _s2_flags(self, name: str, w: int, n: int) -> list:
        """``name[c]``: chunk c's rows (``w`` a chunk, fewer in a short last one, at least 2) are rows of the
        panel and one run of stride 2; ``name`` + ``any``: some chunk is."""
        return [f"  int {name}[{n}], {name}any = 0;",
                f"  for (int kk_c = 0; kk_c < {n}; ++kk_c) {{",
                f"    const int kk_w = {self.R} - {w} * kk_c < {w} ? {self.R} - {w} * kk_c : {w};",
                f"    int kk_ok = kk_w >= 2 && {w} * kk_c + kk_w <= kk_nv;",
                "    for (int kk_r = 1; kk_ok && kk_r < kk_w; ++kk_r) "
                f"kk_ok = kk_rel[{w} * kk_c + kk_r] == kk_rel[{w} * kk_c] + 2 * kk_r;",
                f"    {name}[kk_c] = kk_ok;",
                f"    {name}any |= kk_ok;",
                "  }"]

    def whole_block(self) -> list:
        """Every row valid at every k of the K block: copies without tests."""
        R, p, src = self.R, self.p, self.src
        conds = [f"kk_nv == {R}"] + [f"kk_kmin{j} + {p}bg{j} >= kk_hi{j}" if op == "ge" else
                                     f"kk_kmin{j} + {p}bg{j} == kk_hi{j} && kk_kmax{j} + {p}bg{j} == kk_lo{j}"
                                     for j, (op, _) in enumerate(self.t.guards)]
        if self.vec:
            copy = f"memcpy(kk_d + kk_p*{R}, {src} + kk_base + {p}ko[kk_pc + kk_p], sizeof(float) * {R});"
        else:
            ld, v = self.at_k
            copy = f"for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld} kk_d[kk_p*{R} + kk_r] = {v}; }}"
        L = [f"  const int kk_allfull = {' && '.join(conds)};",
             "  if (kk_runs == 1 && kk_allfull) {",
             f"    for (long long kk_p = 0; kk_p < kk_kcb; ++kk_p) {copy}",
             "    continue;",
             "  }"]
        if self.vec:
            L += ["#if defined(__AVX__)",
                  "  if (kk_kcontig && kk_allfull) {",
                  f"    const float* kk_rp[{self.RV}];",
                  f"    for (int kk_r = 0; kk_r < {self.RV}; ++kk_r) "
                  f"kk_rp[kk_r] = {src} + kk_base + {p}ko[kk_pc] + kk_rel[kk_r < {R} ? kk_r : 0];"]
            for c0 in reversed(range(0, R, 8)):     # a short last chunk first: its spill is overwritten
                L.append(f"    kk_pack_rows8(kk_d + {c0}, {R}, kk_rp + {c0}, {min(8, R - c0)}, kk_kcb);")
            L += ["    continue;", "  }", "#endif"]
        return L

    def per_k(self) -> list:
        R, p, G, src = self.R, self.p, self.G, self.src
        gk = [f"kk_g{j}" for j in range(G)]
        L = ["  for (long long kk_p = 0; kk_p < kk_kcb; ++kk_p) {",
             "    const long long kk_k = kk_pc + kk_p;",
             f"    const long long kk_o = kk_base + {p}ko[kk_k];",
             f"    float* KUMIKO_RESTRICT kk_dp = kk_d + kk_p*{R};"]
        L += [f"    const long long {gk[j]} = {p}kg{j}[kk_k] + {p}bg{j};" for j in range(G)]
        full, empty, row = [f"kk_nv == {R}"], ["kk_nv == 0"], ["kk_r < kk_nv"]
        for j, (op, _) in enumerate(self.t.guards):
            if op == "ge":
                full.append(f"{gk[j]} >= kk_hi{j}")
                empty.append(f"{gk[j]} < kk_lo{j}")
                row.append(f"{gk[j]} >= kk_t{j}[kk_r]")
            else:
                full.append(f"{gk[j]} == kk_hi{j} && {gk[j]} == kk_lo{j}")
                empty.append(f"{gk[j]} < kk_lo{j} || {gk[j]} > kk_hi{j}")
                row.append(f"{gk[j]} == kk_t{j}[kk_r]")
        (ld_c, v_c), (ld_g, v_g) = self.at_run, self.at_rel
        if self.vec:
            copy = f"memcpy(kk_dp, {src} + kk_o, sizeof(float) * {R});"
            runs2 = [f"      if (kk_runs == 2) {{ memcpy(kk_dp, {src} + kk_o, sizeof(float) * kk_s); "
                     f"memcpy(kk_dp + kk_s, {src} + kk_o + kk_d2 + kk_s, sizeof(float) * ({R} - kk_s)); }}",
                     "      else"]
        else:
            copy = f"for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld_c} kk_dp[kk_r] = {v_c}; }}"
            runs2 = []
        L += [f"    if ({' && '.join(full)}) {{",
              f"      if (kk_runs == 1) {{ {copy} }}",
              "      else {", *runs2, *self.stride2(),
              f"      for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ {ld_g} kk_dp[kk_r] = {v_g}; }}",
              "      }"]
        if G:
            L += [f"    }} else if ({' || '.join(empty)}) {{",
                  f"      memset(kk_dp, 0, sizeof(float) * {R});"]
        L += ["    } else {", *self.masked(gk),
              f"      for (int kk_r = 0; kk_r < {R}; ++kk_r) {{ float kk_v = 0.0f; "
              f"if ({' && '.join(row)}) {{ {ld_g} kk_v = {v_g}; }} kk_dp[kk_r] = kk_v; }}",
              "    }", "  }"]
        return L

    def stride2(self) -> list:
        """Every row valid and some chunks one run of stride 2 (a stride-2 conv's pixels in the lanes): those
        chunks deinterleaved from two loads, the others a float at a time. AVX-512 (``kk_s2``): 16-row chunks,
        a load and a masked load of the 31 floats the run spans, one permute. AVX2 (``kk_s8``): 8-row chunks
        (a 6-row A panel is one short chunk), ``_deinterleave8``. A 3x3 stride-2 conv 128 -> 128 from 56x56 had
        spent a quarter of its time packing such panels a float at a time (0.918 of the time with the AVX-512
        copy)."""
        R, src = self.R, self.src
        if not self.s2:
            return []
        ld_g, v_g = self.at_rel
        one = f"{{ {ld_g} kk_dp[kk_r] = {v_g}; }}"
        L = []
        if R >= 16:
            L += ["#if defined(__AVX512F__)", "      if (kk_s2any) {",
                  "        const __m512i kk_ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, "
                  "28, 30);"]
            for c in range(R // 16):
                c0 = 16 * c
                L += [f"        if (kk_s2[{c}]) {{",
                      f"          const float* kk_sp = {src} + kk_o + kk_rel[{c0}];",
                      f"          _mm512_storeu_ps(kk_dp + {c0}, _mm512_permutex2var_ps(_mm512_loadu_ps(kk_sp), kk_ev, "
                      "_mm512_maskz_loadu_ps((__mmask16)0x7FFF, kk_sp + 16)));",
                      f"        }} else for (int kk_r = {c0}; kk_r < {c0 + 16}; ++kk_r) {one}"]
            if R % 16:
                L.append(f"        for (int kk_r = {R - R % 16}; kk_r < {R}; ++kk_r) {one}")
            L += ["      } else", "#elif defined(__AVX2__)"]
        else:
            L.append("#if defined(__AVX2__)")
        L.append("      if (kk_s8any) {")
        for c, (c0, w) in enumerate(self._chunks8()):
            lo, hi = _span_masks(w)
            L += [f"        if (kk_s8[{c}]) {{",
                  f"          const __m256 kk_v = {_deinterleave8(f'{src} + kk_o + kk_rel[{c0}]', lo, hi)};",
                  f"          {_store_lanes(c0, w)}",
                  f"        }} else for (int kk_r = {c0}; kk_r < {c0 + w}; ++kk_r) {one}"]
        L += ["#ifdef KUMIKO_TRACE_STAGE",
              "        __atomic_fetch_add(&kk_pack_s2, 1, __ATOMIC_RELAXED);",
              "#endif"]
        return L + ["      } else", "#endif"]

    def masked(self, gk: list) -> list:
        """Some rows valid: the lanes' mask from the guards, then masked loads of the runs, or of a stride-2
        run's span (``kk_s8``: the row mask spread over the run's even floats, ``_deinterleave8``), or a
        gather (rows apart otherwise)."""
        if not self.vec:
            return []
        src = self.src
        L = ["#if defined(__AVX2__)", "      if (kk_small) {"]
        for j in range(self.G):
            L.append(f"        const __m256i kk_gv{j} = _mm256_set1_epi32((int)({gk[j]} < -{_SMALL} ? "
                     f"-{_SMALL} : {gk[j]} > {_SMALL} ? {_SMALL} : {gk[j]}));")
        for c, (c0, w) in enumerate(self._chunks8()):
            l1, l2 = _ld8("kk_l1", c0), _ld8("kk_l2", c0)
            L.append(f"        {{ __m256i kk_m = _mm256_or_si256({l1}, {l2}); __m256 kk_v;")
            for j, (op, _) in enumerate(self.t.guards):
                if op == "ge":
                    L.append(f"          kk_m = _mm256_andnot_si256(_mm256_cmpgt_epi32({_ld8(f'kk_i{j}', c0)}, "
                             f"kk_gv{j}), kk_m);")
                else:
                    L.append(f"          kk_m = _mm256_and_si256(_mm256_cmpeq_epi32({_ld8(f'kk_i{j}', c0)}, "
                             f"kk_gv{j}), kk_m);")
            if self.s2:
                spread = [f"_mm256_and_si256(_mm256_permutevar8x32_epi32(kk_m, _mm256_setr_epi32({lanes})), "
                          "_mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0))"
                          for lanes in ("0, 0, 1, 1, 2, 2, 3, 3", "4, 4, 5, 5, 6, 6, 7, 7")]
                L += [f"          if (kk_runs == 3 && kk_s8[{c}]) {{    /* row r at float 2r of the span */",
                      f"            kk_v = {_deinterleave8(f'{src} + kk_o + kk_rel[{c0}]', *spread)};",
                      "#ifdef KUMIKO_TRACE_STAGE",
                      "            __atomic_fetch_add(&kk_pack_s2m, 1, __ATOMIC_RELAXED);",
                      "#endif",
                      "          } else"]
            L += ["          if (kk_runs == 3)",
                  f"            kk_v = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), {src} + kk_o, "
                  f"{_ld8('kk_ri', c0)}, _mm256_castsi256_ps(kk_m), 4);",
                  "          else {",
                  f"            kk_v = _mm256_maskload_ps({src} + kk_o + {c0}, _mm256_and_si256(kk_m, {l1}));",
                  "            if (kk_runs == 2)",
                  f"              kk_v = _mm256_or_ps(kk_v, _mm256_maskload_ps({src} + kk_o + kk_d2 + {c0}, "
                  f"_mm256_and_si256(kk_m, {l2})));",
                  "          }",
                  f"          {_store_lanes(c0, w)} }}"]
        return L + ["      } else", "#endif"]


def _lanes8(n: int) -> str:
    """The AVX2 mask of the first ``n`` of 8 lanes (none for n <= 0, all for n >= 8)."""
    n = max(0, min(8, n))
    return "_mm256_setr_epi32(" + ", ".join(["-1"] * n + ["0"] * (8 - n)) + ")"


def _span_masks(w: int) -> tuple[str | None, str | None]:
    """The masks of the two 8-float loads over the 2w - 1 floats a stride-2 run of ``w`` rows spans (None: a
    plain load, no mask; the second load's "0 lanes" mask is a zero vector)."""
    span = 2 * w - 1
    return (None if span >= 8 else _lanes8(span)), (None if span >= 16 else _lanes8(span - 8))


def _deinterleave8(sp: str, lo: str | None, hi: str | None) -> str:
    """The even floats of ``sp[0..15]`` as one AVX2 vector, loaded under the masks ``lo`` (floats 0-7) and
    ``hi`` (8-15; None: unmasked): the shuffle gives [0 2 8 10 | 4 6 12 14], the permute of its 64-bit pairs
    0 2 1 3 puts them in order. Masked-off floats read as 0 and are not touched in memory."""
    ld_lo = f"_mm256_loadu_ps({sp})" if lo is None else f"_mm256_maskload_ps({sp}, {lo})"
    ld_hi = f"_mm256_loadu_ps({sp} + 8)" if hi is None else f"_mm256_maskload_ps({sp} + 8, {hi})"
    return (f"_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps({ld_lo}, {ld_hi}, 0x88)), "
            "0xD8))")


def _store_lanes(c0: int, w: int) -> str:
    """Store the first ``w`` lanes of ``kk_v`` at ``kk_dp + c0``, nothing past them."""
    if w == 8:
        return f"_mm256_storeu_ps(kk_dp + {c0}, kk_v);"
    if w == 6:
        return (f"_mm_storeu_ps(kk_dp + {c0}, _mm256_castps256_ps128(kk_v)); "
                f"_mm_storel_pi((__m64*)(kk_dp + {c0 + 4}), _mm256_extractf128_ps(kk_v, 1));")
    return (f"KUMIKO_ALIGN(32) float kk_tmp[8]; _mm256_store_ps(kk_tmp, kk_v); "
            f"memcpy(kk_dp + {c0}, kk_tmp, sizeof(float) * {w});")


class PanelPacking:
    """The packing half of ``ContractionLowering`` (a mixin): the operands' element values, the index
    tables and the panels of A and B. It uses the lowering's ``lo`` (the region's ``CpuLowering``), ``c``
    (the ``Contraction``) and ``decompose``."""

    def operand(self, e: RExpr, out: list) -> str:
        lo = self.lo
        saved = list(lo.red_axes)
        lo.red_axes = [a.name for a in self.c.k_axes + (self.c.outer.axes if self.c.outer is not None else ())]
        v = lo.expr(e, out)
        t = lo.dt(e)
        lo.red_axes = saved
        return v if t is None or t.name == "fp32" else f"(float)({v})"

    # tables ---------------------------------------------------------------------------------------------
    def _tables(self, sd: Side, extra: tuple = ()) -> tuple[list, list]:
        """(allocation, cooperative fill) of a side's index tables: the offset, each guard's value and the
        ``extra`` columns ((name, row part, K part): C text over the axes)."""
        t, p = sd.table, f"kk_{sd.key}"
        g = len(t.guards)
        n = 1 + g + len(extra)
        names = [("o", 0)] + [(f"g{j}", j + 1) for j in range(g)]
        names += [(nm, 1 + g + j) for j, (nm, _, _) in enumerate(extra)]
        alloc = [Raw(f"long long* {p}tab = (long long*)kk_scratch({2 if sd.key == 'a' else 3}, sizeof(long long) * "
                     f"(size_t)(({sd.count} + {sd.r}) * {n} + kk_K * {n}));")]
        for nm, j in names:
            alloc.append(Decl("long long* KUMIKO_RESTRICT", f"{p}r{nm}", f"{p}tab + {j} * ({sd.count} + {sd.r})"))
        for nm, j in names:
            alloc.append(Decl("long long* KUMIKO_RESTRICT", f"{p}k{nm}", f"{p}tab + {n} * ({sd.count} + {sd.r}) + "
                              f"{j} * kk_K"))
        exprs = [t.off] + [gd for _, gd in t.guards]
        fill: list = []
        k_axes = tuple(a.name for a in self.c.k_axes)
        for side, axes, count, part in (("r", sd.rows, sd.count, 1), ("k", k_axes, "kk_K", 2)):
            var = f"kk_f{side}"
            body: list = [Store(f"{p}{side}{nm}", var, C.index(e[part], set(axes))) for (nm, _), e in zip(names, exprs)]
            body += [Store(f"{p}{side}{nm}", var, (rc, kc)[part - 1]) for nm, rc, kc in extra]
            sizes = tuple(C.index(self.lo.sizes[a], set()) for a in axes)
            dec: list = []
            self.decompose(f"{var}0", axes, dec)
            fill.append(Block((Decl("const long long", f"{var}0", f"kk_t * {count} / kk_nt"),
                               Decl("const long long", f"{var}1", f"(kk_t + 1) * {count} / kk_nt"),
                               If(f"{var}0 < {var}1", (*dec, For(var, f"{var}0", f"{var}1", tuple(body) + (
                                   Raw(advance_counter(axes, sizes)),)))))))
        fill.append(If("kk_t == 0", (For("kk_fr", sd.count, f"{sd.count} + {sd.r}", tuple(
            Store(f"{p}r{nm}", "kk_fr", "0") for nm, _ in names)),)))
        return alloc, fill

    def _batch_parts(self, sd: Side) -> list:
        t, p = sd.table, f"kk_{sd.key}"
        scope = set(self.c.batch)
        out = [Decl("const long long", f"{p}bo", C.index(t.off[0], scope))]
        out += [Decl("const long long", f"{p}bg{j}", C.index(g[0], scope)) for j, (_, g) in enumerate(t.guards)]
        return out

    # packing --------------------------------------------------------------------------------------------
    def _pack(self, sd: Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        """Pack panels [q0, q1) of ``sd``'s rows from ``rowbase`` (rows >= ``limit`` are zero) at
        K in [kk_pc, kk_pc + kk_kcb) into ``dst`` (panel q at ``dst + q*R*kk_kcb``, layout [p][R])."""
        if sd.table is None:
            return self._pack_expr(sd, q0, q1, rowbase, limit, dst)
        return [Raw(self._pack_table(sd, q0, q1, rowbase, limit, dst))]

    def _pack_expr(self, sd: Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> list:
        R = sd.r
        rows: list = []
        self.decompose("kk_r0 + kk_i", sd.rows, rows)
        ks: list = []
        self.decompose("kk_pc + kk_p", tuple(a.name for a in self.c.k_axes), ks)
        v = self.operand(sd.expr, vb := [])
        return [For("kk_q", q0, q1, (
            Decl("const long long", "kk_r0", f"{rowbase} + kk_q*{R}"),
            Decl("float* KUMIKO_RESTRICT", "kk_d", f"{dst} + kk_q*{R}*kk_kcb"),
            For("kk_i", "0", str(R), (
                If(f"kk_r0 + kk_i < {limit}",
                   tuple(rows) + (For("kk_p", "0", "kk_kcb", tuple(ks) + tuple(vb) + (
                       Store("kk_d", f"kk_p*{R} + kk_i", v),)),),
                   (For("kk_p", "0", "kk_kcb", (Store("kk_d", f"kk_p*{R} + kk_i", "0.0f"),)),)),)),))]

    def _value(self, sd: Side, idx: str) -> tuple[str, str]:
        """(declaration of kk_ld, the packed float value) of the element at ``src[idx]``."""
        lo, t = self.lo, sd.table
        ct = C.COMPUTE[t.dtype.name]
        decl = f"const {ct} kk_ld = {C.load(lo.cname[t.tensor], idx, t.dtype)};"
        lo.storage["__ld"] = ("scalar", "kk_ld")
        lo.ty.lets["__ld"] = VType(t.dtype, ())
        out: list = []
        v = lo.expr(t.value, out)
        assert not out, "table-form values are expressions"
        dt = lo.dt(t.value)
        return decl, (v if dt is None or dt.name == "fp32" else f"(float)({v})")

    def _pack_table(self, sd: Side, q0: str, q1: str, rowbase: str, limit: str, dst: str) -> str:
        """C text packing panels [q0, q1) from the index tables (see the module docstring)."""
        at_k = f"kk_base + kk_{sd.key}ko[kk_pc + kk_p] + kk_r"
        pk = _PackText(sd, self.lo.cname[sd.table.tensor], self._value(sd, "kk_o + kk_r"),
                       self._value(sd, "kk_o + kk_rel[kk_r]"), self._value(sd, at_k),
                       row_step(sd.rows, sd.table, self.lo.sizes))
        return "\n".join(pk.block(q0, q1, rowbase, limit, dst))
