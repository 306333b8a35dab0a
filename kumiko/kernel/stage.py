"""The staged B operand of the packed contraction path (``kumiko.kernel.contract``): read B in place
from a zero-padded copy of its source instead of packing panels.

When every guard of the B operand is a bound of one of its source's dimensions (``region.operands.stage_bounds``:
a convolution's padding), a padded copy of the source - the stage, each dimension widened by the
farthest its index reaches below 0 or past its end, the border zero - makes every read valid: the
element behind a failed guard is a border zero. A stage offset is affine in the rows and in K again
(``row part + K part``: table columns ``kk_brso``, ``kk_bkso``), so panel lane j at k is
``stage[base + kk_brso[row j] + kk_bkso[k]]``: when a panel's rows
are one run of consecutive offsets, or two (a row of pixels that wraps past the pad columns), the
micro-kernel loads them straight from the stage (``micro.stage_micro_kernel``). No panel is packed,
so no element is copied nine times (im2col) or tested per k. A strided operand's dimension is split
into phase planes (``Stage``), which makes a strided convolution's pixels consecutive in the stage too.

Per call the threads fill the stage together (row by row of its innermost dimension: zeros, a copy,
zeros). Per N block every panel's runs are checked from the row table; a block with a panel of three or
more runs (rows shorter than a panel) packs its panels as before. The stage holds the whole operand
(its size is checked against the source's, a bounded overhead); it lives in ``kk_scratch`` slot 10.

The A side can have a stage too (``key="a"``, padding only): a padded conv whose pixels are the tile's
rows (its channels in the lanes) broadcasts each row from the stage (``micro.astage_micro_kernel``; a panel
of MR rows one or two runs, ``a_check``) instead of packing im2col panels.

An operand with neither guards nor phases (a 1x1 convolution's pixels, a GEMM's row-major B) is its own
stage (``in_place``): the micro-kernel reads the source where it lies and nothing is copied. The source
has no zero slack behind its end, so a panel shorter than NR (the block's last) is packed as before
(``kk_nfull``: the panels read in place). Packing B costs one copy of K x N floats a call, against
2 x M FLOPs per element of compute: a 1x1 conv with few output channels (MobileNetV2's 192 -> 32 at
28x28) spent a third of its time in that copy.
"""
from __future__ import annotations

from kumiko.kernel import cexpr as C
from kumiko.kernel.loops import Decl, For, If, Raw
from kumiko.region.operands import phase_count, row_dim, steps_last_dim
from kumiko.symbolic import Expr, Sym

#: the most A rows (M) for which B is read in place: each panel is read once per MR rows, strided rows
#: costing more than a packed panel's once M is large (GEMM 2048^3: 1.03-1.10x slower in place, 2048 x 1024
#: x 1024 1.04x; 512^3 even). K rows a multiple of 1 KiB apart (a B of 1024 columns, a 112x112 image) share
#: few cache sets, yet read in place they ran 1.06-1.33x faster than packed in one phase of the 2-core EPYC
#: (256 x 1024 x 512, 128 x 1024 x 1024, MobileNetV2's 32 -> 16 1x1 conv at 112x112) and 1.04x slower in
#: another: no rule for them.
IN_PLACE_ROWS = 512
#: the most B columns for which an unpadded A side (a 1x1 conv's pixels with its channels in the lanes) is
#: read in place: 960 -> 160, 576 -> 96 and 1024 -> 256 1x1 convs at 7x7 and 14x14 ran 0.91-0.96 of the time
#: in place, 320 -> 1280 and 2048 -> 512 at 7x7 1.035 and 1.16
IN_PLACE_COLS = 256
#: the most A panels whose runs a thread keeps on its stack (16 bytes each: 128 KiB); more are packed
A_CHECK_PANELS = 8192


def span(e: Expr, sizes: dict, axes: set) -> tuple[str, str] | None:
    """(lowest, highest) value of an affine ``e`` as C text, its ``axes`` ranging over ``[0, size)``
    and every other symbol fixed; None when an axis occurs other than as ``coef * axis``."""
    lo, hi = [str(e.const)], [str(e.const)]
    for mono, coef in e.terms:
        names = set()
        for a in mono:
            names |= {a.name} if isinstance(a, Sym) else set(a.num.symbols())
        if not names & axes:
            term = C.index(Expr({mono: coef}), set())
            lo.append(term)
            hi.append(term)
            continue
        if len(mono) != 1 or not isinstance(mono[0], Sym):
            return None
        far = f"{coef}LL * ({C.index(sizes[mono[0].name], set())} - 1)"
        (hi if coef > 0 else lo).append(far)
    return f"({' + '.join(lo)})", f"({' + '.join(hi)})"


class Stage:
    """The stage of one table-form B side: its C declarations, table columns, fill and per-block check.

    A source dimension that a row axis steps through with stride f > 1 (a strided convolution's rows and
    columns) is split into f phases: padded index j lives at phase ``j % f``, coarse index ``j / f``, the
    phase planes outside the coarse dimensions. A read ``f*a + t`` (``t`` from K and constants) is then
    phase ``t % f`` at coarse ``a + t / f``: consecutive rows are consecutive stage elements again, so the
    micro-kernel reads them in place instead of a packing gather every f-th element (the space-to-depth
    view of a strided convolution). The phase and the coarse step of ``t`` go into the K column."""

    def __init__(self, dims: tuple, rows: tuple, k_axes: tuple, batch: tuple, sizes: dict, src: str, nr: int,
                 guarded: bool = True, key: str = "b"):
        self.key = key          # the side it feeds: "b" (the lanes) or "a" (the broadcast rows; ``a_check``)
        self.dims, self.rows, self.k_axes, self.batch = dims, rows, k_axes, batch
        self.src, self.nr, self.D, self.sizes = src, nr, len(dims), sizes
        self.spans = []
        for (rest, rp, kp), _ in dims:
            parts = (span(rest, sizes, set(batch)), span(rp, sizes, set(rows)), span(kp, sizes, set(k_axes)))
            self.spans.append(parts if all(p is not None for p in parts) else None)
        #: on the A side the rows may step a dimension other than the last (a channels-last conv's pixels step
        #: its W dimension by the stride, each pixel's channels inside): (that stage dimension, the step), the
        #: rows then ``kk_asu`` (the step times its stride) elements apart, no phases; else None
        moved = row_dim(rows, dims) if key == "a" else None
        self.rdim = moved if moved is not None and moved[0] != len(dims) - 1 else None
        self.f = tuple(1 if self.rdim is not None else phase_count(rest, rp, rows) for (rest, rp, _), _ in dims)
        self.split = any(f > 1 for f in self.f)
        self.ok = all(s is not None for s in self.spans)
        # the innermost row axis steps through the stage one element at a time (a split dimension's coarse
        # index moves by one per row), or one unit (``rdim``)
        self.unit = self.rdim is not None or steps_last_dim(rows, dims, self.f[-1])
        #: the source is the stage: no pads (no guards) and no phases
        self.in_place = not guarded and not self.split

    def _row_coef(self, i: int, a: str) -> int:
        """How far the stage's dimension i moves per step of row axis ``a`` (a split one: its coarse index)."""
        return self.dims[i][0][1].coeff(a) // self.f[i]

    def _extent(self, i: int) -> str:
        """Dimension i's extent as the fill walks it: the padded size, or the phases times the coarse size."""
        return f"{self.f[i]} * kk_sc{i}" if self.f[i] > 1 else f"kk_sn{i}"

    def decls(self, always: bool = False) -> list:
        """Pads, extents and strides of the stage, whether to use it (``kk_stg``) and its buffer. ``always``: use
        it whatever the rows' runs, the columns or its size (a kernel that reads nothing else: Winograd's)."""
        out: list = []
        for i, ((_, n), sp) in enumerate(zip(self.dims, self.spans)):
            lo = " + ".join(s[0] for s in sp)
            hi = " + ".join(s[1] for s in sp)
            size = C.index(n, set())
            out += [Decl("const long long", f"kk_spl{i}", f"-({lo}) > 0 ? -({lo}) : 0"),
                    Decl("const long long", f"kk_sph{i}", f"({hi}) - ({size} - 1) > 0 ? ({hi}) - ({size} - 1) : 0"),
                    Decl("const long long", f"kk_sn{i}", f"{size} + kk_spl{i} + kk_sph{i}")]
            if self.f[i] > 1:
                out.append(Decl("const long long", f"kk_sc{i}", f"(kk_sn{i} + {self.f[i] - 1}) / {self.f[i]}"))
        # layout: the dimensions before the first split one, every split one's phases, then the rest (a
        # split one by its coarse index)
        first = next((i for i, f in enumerate(self.f) if f > 1), self.D)
        order = ([(f"kk_sst{i}", f"kk_sn{i}") for i in range(first)] +
                 [(f"kk_sps{i}", str(self.f[i])) for i in range(first, self.D) if self.f[i] > 1] +
                 [(f"kk_sst{i}", f"kk_sc{i}" if self.f[i] > 1 else f"kk_sn{i}") for i in range(first, self.D)])
        out.append(Decl("const long long", order[-1][0], "1"))
        for (name, _), (inner, extent) in zip(reversed(order[:-1]), reversed(order[1:])):
            out.append(Decl("const long long", name, f"{inner} * {extent}"))
        # how many rows in a row are consecutive in the stage, from the innermost row axis out: a panel
        # is at most two runs when that is at least NR - 1
        # (in units of the rows' step: kk_asu elements apart where they step another dimension than the last)
        unit = "" if self.rdim is None else " * kk_asu"
        out += [Decl("long long", "kk_srun", "1"), Decl("int", "kk_sgo", "1")]
        if self.rdim is not None:
            out.append(Decl("const long long", "kk_asu", f"{self.rdim[1]}LL * kk_sst{self.rdim[0]}"))
        for a in reversed(self.rows):
            stride = " + ".join(f"{self._row_coef(i, a)}LL * kk_sst{i}" for i in range(self.D)
                                if self._row_coef(i, a)) or "0"
            out.append(Raw(f"if (kk_sgo && ({stride}) == kk_srun{unit}) kk_srun *= "
                           f"{C.index(self.sizes[a], set())}; else kk_sgo = 0;"))
        if self.in_place:       # the source itself, when its reads need no pad (they cannot, unguarded)
            flat = " && ".join(f"kk_spl{i} == 0 && kk_sph{i} == 0" for i in range(self.D))
            # B: few A rows re-read each panel; A: few B columns re-read each A panel, and whole panels of MR
            # rows (nothing read past the source's end); A rows that step another dimension (a channels-last
            # conv's pixels, a row-major GEMM A) may end in a short panel, which reads rows of the panel before
            # it (``a_check``). Past IN_PLACE_COLS columns the packed panels' reuse pays for their copy (a
            # GEMM 1024^3 with bound weights ran 1.12x in place, BERT's shapes 1.03-1.06x)
            rule = (f"kk_M <= {IN_PLACE_ROWS}" if self.key == "b" else f"kk_N <= {IN_PLACE_COLS}"
                    if self.rdim is not None else f"kk_N <= {IN_PLACE_COLS} && kk_M % {self.nr} == 0")
            use = "1" if always else f"kk_srun >= {self.nr - 1} && {flat} && {rule}"
            return out + [Decl("const int", "kk_stgw", use),
                          Decl("float*", "kk_S", f"kk_stgw ? (float*){self.src} : 0"),
                          Decl("const int", "kk_stg", "kk_stgw")]
        src_n = " * ".join(f"({C.index(n, set())})" for _, n in self.dims)
        out += [Decl("const long long", "kk_ssz", f"{order[0][0]} * {order[0][1]}"),
                # the stage at most twice the source (plus a little): the pads are borders, not blow-ups
                Decl("const int", "kk_stgw", "1" if always else
                     f"kk_srun >= {self.nr - 1} && kk_ssz <= 2 * ({src_n}) + 65536"),
                Decl("float*", "kk_S", f"kk_stgw ? (float*)kk_scratch(10, sizeof(float) * (size_t)(kk_ssz + "
                     f"{4 * self.nr})) : 0"),
                Decl("const int", "kk_stg", "kk_stgw && kk_S != 0")]     # no memory for it: pack as before
        return out

    def columns(self) -> tuple:
        """The stage offset as an extra table column: (name, row part, K part)."""
        rows_part, k_part = [], []
        for i, ((rest, rp, kp), _) in enumerate(self.dims):
            f = self.f[i]
            if f == 1:
                rows_part.append(f"({C.index(rp, set(self.rows))}) * kk_sst{i}")
                k_part.append(f"({C.index(kp, set(self.k_axes))}) * kk_sst{i}")
                continue
            (mono, _), = rp.terms
            rows_part.append(f"({C.index(Expr({mono: 1}), set(self.rows))}) * kk_sst{i}")
            t = f"({C.index(kp + rest, set(self.k_axes))} + kk_spl{i})"     # >= 0: the padded index less f*row
            k_part.append(f"{t} / {f} * kk_sst{i} + {t} % {f} * kk_sps{i}")
        return (("so", " + ".join(rows_part), " + ".join(k_part)),)

    def base(self) -> Decl:
        """The stage offset of the batch point (``kk_b`` decomposed): the rest parts plus the low pads (a
        split dimension's are in its K column)."""
        terms = " + ".join(f"({C.index(p[0], set(self.batch))} + kk_spl{i}) * kk_sst{i}"
                           for i, (p, _) in enumerate(self.dims) if self.f[i] == 1) or "0"
        return Decl("const long long", f"kk_{self.key}sb", f"kk_stg ? {terms} : 0")

    def _at(self, i: int, j: str) -> str:
        """The stage offset of padded index ``j`` of dimension i."""
        f = self.f[i]
        return f"({j}) % {f} * kk_sps{i} + ({j}) / {f} * kk_sst{i}" if f > 1 else f"({j}) * kk_sst{i}"

    def _walk(self, upto: int) -> tuple:
        """The fill's walk over the stage's rows of dimensions [0, upto): the index declarations of row
        ``kk_sr`` (padded ``kk_j{i}``, source ``kk_e{i}``), whether it is inside the source, its source
        address, the row count and its stage offset."""
        idx: list = []
        rest = "kk_sr"
        for i in reversed(range(upto)):
            idx.append(Decl("const long long", f"kk_j{i}", f"({rest}) % ({self._extent(i)})" if i else rest))
            idx.append(Decl("const long long", f"kk_e{i}", f"kk_j{i} - kk_spl{i}"))
            rest = f"({rest}) / ({self._extent(i)})"
        inside = " && ".join(f"kk_e{i} >= 0 && kk_e{i} < {C.index(self.dims[i][1], set())}" for i in range(upto)) or "1"
        src_off, stride = [], "1"
        for i in reversed(range(self.D)):
            if i < upto:
                src_off.append(f"kk_e{i} * ({stride})")
            stride = f"{stride} * ({C.index(self.dims[i][1], set())})"
        src = f"{self.src} + {' + '.join(src_off) or '0'}"
        rows = " * ".join(f"({self._extent(i)})" for i in range(upto)) or "1"
        dst = " + ".join(self._at(i, f"kk_j{i}") for i in range(upto)) or "0"
        return idx, inside, src, rows, dst

    @staticmethod
    def _rows_loop(rows: str, body: tuple) -> tuple:
        """The threads' shares of ``rows`` rows, each ``body``."""
        return (Decl("const long long", "kk_srn", rows),
                For("kk_sr", "kk_t * kk_srn / kk_nt", "(kk_t + 1) * kk_srn / kk_nt", body))

    def fill(self) -> list:
        """The threads fill the stage together, one innermost row each at a time, and its slack (nothing
        to fill in place)."""
        if self.in_place:
            return []
        last = self.D - 1
        n_last = C.index(self.dims[last][1], set())
        idx, inside, src, rows, dst = self._walk(last)
        if self.f[last] == 1:
            row = (Decl("float* KUMIKO_RESTRICT", "kk_sd", f"kk_S + {dst}"),
                   If(inside, (Raw(f"memset(kk_sd, 0, sizeof(float) * kk_spl{last});\n"
                                   f"memcpy(kk_sd + kk_spl{last}, {src}, sizeof(float) * {n_last});\n"
                                   f"memset(kk_sd + kk_spl{last} + {n_last}, 0, sizeof(float) * kk_sph{last});"),),
                      (Raw(f"memset(kk_sd, 0, sizeof(float) * kk_sn{last});"),)))
        else:       # deinterleave the row into its phases, zeros outside the source
            f = self.f[last]
            row = (Decl("float* KUMIKO_RESTRICT", "kk_sd", f"kk_S + {dst}"),
                   If(inside, (Raw(f"kumiko_phase_row(kk_sd, kk_sps{last}, {src}, {n_last}, kk_spl{last}, "
                                   f"kk_sc{last}, {f});"),),
                      (For("kk_ph", "0", str(f), (
                          Raw(f"memset(kk_sd + kk_ph * kk_sps{last}, 0, sizeof(float) * kk_sc{last});"),)),)))
        loop = self._rows_loop(rows, (*idx, *row))
        if self.rdim is not None and self.D >= 3:
            # channels-last: the channels (the last dimension) unpadded, a row of W pixels is one copy (a copy
            # per pixel was 256 bytes each for 64 channels)
            loop = (If(f"kk_spl{last} == 0 && kk_sph{last} == 0", self._fill_rows(), loop),)
        return [If("kk_stg", (
            *loop,
            If("kk_t == 0", (Raw(f"memset(kk_S + kk_ssz, 0, sizeof(float) * {4 * self.nr});"),)),))]

    def _fill_rows(self) -> tuple:
        """The fill when the last dimension has no pad (no phases either: ``rdim``): the last two dimensions
        as one row each (a channels-last image row, its pads whole pixels)."""
        w, c = self.D - 2, self.D - 1
        idx, inside, src, rows, dst = self._walk(w)
        n_w, n_c = C.index(self.dims[w][1], set()), C.index(self.dims[c][1], set())
        lo, hi = f"kk_spl{w} * kk_sn{c}", f"kk_sph{w} * kk_sn{c}"
        row = (Decl("float* KUMIKO_RESTRICT", "kk_sd", f"kk_S + {dst}"),
               If(inside, (Raw(f"memset(kk_sd, 0, sizeof(float) * {lo});\n"
                               f"memcpy(kk_sd + {lo}, {src}, sizeof(float) * {n_w} * {n_c});\n"
                               f"memset(kk_sd + {lo} + {n_w} * {n_c}, 0, sizeof(float) * {hi});"),),
                  (Raw(f"memset(kk_sd, 0, sizeof(float) * kk_sn{w} * kk_sn{c});"),)))
        return self._rows_loop(rows, (*idx, *row))

    def block_check(self) -> list:
        """Per N block: each panel's first-run length ``kk_ps`` and second-run distance ``kk_pd`` from the
        row table; ``kk_dir`` stays set when every panel is at most two runs with the second after. Read in
        place, the panels from ``kk_nfull`` on (a last one shorter than NR) are packed."""
        nr = self.nr
        full = [Decl("const long long", "kk_nfull", f"kk_ncur / {nr}")] if self.in_place else []
        last = "kk_nfull" if self.in_place else "kk_np"
        return [Raw("long long kk_ps[kk_np > 0 ? kk_np : 1], kk_pd[kk_np > 0 ? kk_np : 1];"),
                Decl("int", "kk_dir", "kk_stg"), *full,
                Raw(_panel_runs(nr, "kk_dir", last, "kk_brso + kk_jc", "kk_ncur", "kk_ps", "kk_pd") +
                    "#ifdef KUMIKO_TRACE_STAGE\n"
                    f"if (kk_dir{' && kk_nfull > 0' if self.in_place else ''}) "
                    "__atomic_fetch_add(&kk_stage_blocks, 1, __ATOMIC_RELAXED);\n"
                    "#endif")]

    def a_check(self, mr: int) -> list:
        """A side: per panel of MR rows (all of M, once a call), its first-run length ``kk_aps`` (MR: one run)
        and second-run distance ``kk_apd`` from the row table; ``kk_adir`` stays set when every panel is at
        most two runs with the second after, else the A panels are packed as before. Rows past M read the
        stage's zero slack (their accumulators are not stored). The tables are on each thread's stack: past
        ``A_CHECK_PANELS`` panels the A side is packed."""
        return [Decl("const long long", "kk_anp", f"kk_Mp / {mr}"),
                Raw(f"long long kk_aps[kk_anp > 0 && kk_anp <= {A_CHECK_PANELS} ? kk_anp : 1], "
                    f"kk_apd[kk_anp > 0 && kk_anp <= {A_CHECK_PANELS} ? kk_anp : 1];"),
                Decl("int", "kk_adir", f"kk_stg && kk_anp <= {A_CHECK_PANELS}"),
                Raw(_panel_runs(mr, "kk_adir", "kk_anp", "kk_arso", "kk_M", "kk_aps", "kk_apd",
                                "" if self.rdim is None else "kk_asu") +
                    "#ifdef KUMIKO_TRACE_STAGE\n"
                    "if (kk_adir && kk_t == 0) __atomic_fetch_add(&kk_stage_blocks, 1, __ATOMIC_RELAXED);\n"
                    "#endif")]


def _panel_runs(r: int, flag: str, panels: str, offsets: str, rows: str, first: str, apart: str,
                unit: str = "") -> str:
    """C text: for each of ``panels`` panels of ``r`` rows (of ``rows``) whose stage offsets start at
    ``offsets``, the length of the first run of consecutive offsets (``first``; ``r`` when one run) and the
    second run's distance (``apart``); ``flag`` is cleared when a panel is three runs or more, or its second
    run lies before the first.

    With a ``unit`` (C: the rows' step, an A side whose rows step another dimension than the last) rows are
    consecutive ``unit`` elements apart, and a short last panel of one run (the rows past ``rows``) reads its
    missing rows from the panel before it (``apart`` = -r units): nothing past the source's end is read, as
    the rows are not stored."""
    u = f" * {unit}" if unit else ""
    # with a unit: a short last panel of one run borrows the panel before (a negative distance), so only
    # those conditions differ
    short = (f"  {flag} &= kk_d >= 0 && (kk_nv == {r} || (kk_s == kk_nv && kk_q > 0));\n"
             f"  if (kk_nv < {r}) kk_d = -{r}{u};\n"
             f"  {first}[kk_q] = kk_s < {r} ? kk_s : {r};\n") if unit else (
             f"  {flag} &= kk_d >= 0;\n"
             f"  {first}[kk_q] = kk_s < kk_nv ? kk_s : {r};\n")
    return (f"for (long long kk_q = 0; {flag} && kk_q < {panels}; ++kk_q) {{\n"
            f"  const long long* kk_so = {offsets} + kk_q*{r};\n"
            f"  const long long kk_nv = {rows} - kk_q*{r} < {r} ? {rows} - kk_q*{r} : {r};\n"
            "  long long kk_s = 1;\n"
            f"  while (kk_s < kk_nv && kk_so[kk_s] == kk_so[0] + kk_s{u}) ++kk_s;\n"
            f"  long long kk_d = kk_s < kk_nv ? kk_so[kk_s] - kk_so[0] - kk_s{u} : 0;\n"
            "  for (long long kk_r = kk_s; kk_r < kk_nv; ++kk_r)\n"
            f"    {flag} &= kk_so[kk_r] == kk_so[0] + kk_d + kk_r{u};\n"
            f"{short}"
            f"  {apart}[kk_q] = kk_d;\n"
            "}\n")
