"""Choosing a Plan for each region of a Program on the CPU.

The machine decides the vector width (AVX-512: 16 floats, AVX2: 8, else 4 with SSE/NEON vectors) and from it
the register micro-tile: MR x NR with NR = 2 vectors and MR as large as the vector registers allow (MR*2
accumulators + 2 B vectors + 1 broadcast <= the register count), or (not on AVX2, whose fast tile is 6 x 16)
two thirds of that when a row count known at compile time would otherwise be padded by more than 2%, or a
divisor of it (a conv's 7x7 pixels: 7 x 64) when that pads too (``micro_tile``). Which operand the lanes hold
follows the region (``orient``), unless the other side pads the tiles less and is a constant
(``_orientation``). Cache blocks follow the usual analysis for a 32 KiB L1 / >= 512 KiB L2: a KC x NR panel of
B stays in L1 (KC = 256), an MC x KC block of A in L2 (MC a multiple of MR near 120), NC large. These are
upper bounds: the kernel evens the blocks out at run time (equal K blocks, the rows of each thread in equal
MR-multiples, N blocks of whole window groups when a pooling window is fused). A region whose structure is a
contraction (found by the region analysis, ``kumiko.region.analysis.find_contraction``, never by op name) gets
the packed algorithm; every other region the generic loop nest with its outer loops in parallel. A packed plan
also says how the kernel blocks K (``k_blocks``) and which axis its threads split (``bind.split``), from the
sizes and which operands read only ``constants`` (pre-packed): ``kumiko.plan.packed``."""
from __future__ import annotations

from typing import Mapping

from kumiko.plan.packed import IN_PLACE_PANEL_BYTES, k_blocks_rule, n_block_padded, prepackable, split_rule
from kumiko.plan.plan import CacheBlock, Plan, RegisterBlock, make_plan
from kumiko.plan.winograd import Geometry, winograd_blocks, winograd_geometry, winograd_tile
from kumiko.region.analysis import Contraction, RegionFacts, analyze
from kumiko.region.operands import Orientation, lane_rows, orient, phase_count, stage_bounds, steps_last_dim
from kumiko.region.srnf import epilogue
from kumiko.region.ssa import Program, Region
from kumiko.symbolic import Expr, dim_eval, least, prod


def machine_arch(features: dict) -> tuple[str, int]:
    vw = int(features.get("vector_width_f32", 4))
    return ("cpu-avx512" if vw == 16 else "cpu-avx2" if vw == 8 else "cpu-scalar"), vw


#: padding of the A side's rows to a multiple of MR that a micro-tile's extra rows are worth (beyond it, a
#: smaller MR that wastes less wins: a 64-row conv weight on 12-row tiles computes 72 rows). Not on AVX2:
#: its 16 registers leave 6 x 16 as the one tile that runs at speed. On a 2-core Zen 3, 6 x 16 ran
#: 0.72-0.79 of 4 x 24's time on 128-row (BERT's Linears: 3% padding), 64-row, 49-row (10% padding) and
#: 196-row GEMMs (in-process A/B); a Zen 1 had once run 64 rows 3% faster as 4 x 24.
MAX_PAD = 0.02


def _balance(units: int, threads: int) -> float:
    """The share of ``threads`` busy when they split ``units`` equal pieces of work (whole pieces each)."""
    return units / (threads * -(-units // threads)) if units > 0 else 1.0


def micro_tile(vw: int, rows: int | None = None, cols: int | None = None, threads: int = 1) -> tuple[int, int]:
    """(MR, NR) for ``rows`` rows on the A side (None: not known when compiling). NR is 2 vectors; MR the
    largest the registers allow (12 with 32 vector registers, 6 with 16) unless, off AVX2, that pads a known
    row count by more than MAX_PAD, when the candidate (that one or two thirds of it) padding least is taken. A
    smaller MR keeps the accumulator budget (MR x 2 vectors): NR grows to as many vectors as fit in it
    (8 rows x 3 vectors on AVX-512), so each k still issues as many multiply-adds per load, which matters
    where B's loads are unaligned (a staged operand read in place).

    Among divisor tiles of equal padding, ``threads`` (the cores the kernel splits its row tiles or its
    panels over) prefers the width whose panels split evenly when the row tiles do not.

    ``cols`` (the B side's extent, when known) of 3 or 4 vectors takes one panel that wide with the same
    accumulator budget (6 x 64 on AVX-512 for a 64-wide output): each A element is loaded once instead of
    once per 2-vector panel, and 4 B vectors + 6 broadcasts feed 24 multiply-adds (12 x 32: 2 + 12)."""
    regs = 32 if vw == 16 else 16
    nr = 2 * vw
    mr = 12 if vw == 16 else min(14, (regs - 3) // 2)
    if cols is not None and nr < cols <= 4 * vw:
        nv = -(-cols // vw)
        m = 2 * mr // nv
        if m * nv + nv + 1 <= regs:
            if rows and (-rows % m) / rows > MAX_PAD and rows % (m - 1) == 0:    # one row fewer pads nothing
                m -= 1                                                              # (49 rows: 7 x 48)
            return m, nv * vw
    if rows is None or rows <= 0 or vw == 8:
        return mr, nr
    cands = (mr, mr * 2 // 3)

    def pad(m: int) -> float:
        return (-rows % m) / rows
    if pad(mr) <= MAX_PAD:
        return mr, nr
    m = min(cands, key=lambda m: (pad(m), -m))
    if pad(m) > MAX_PAD and vw == 16:
        # a divisor of the rows (6 to 14) with up to 28 accumulators: 7 x 4 or 14 x 2 vectors for a conv's
        # 7x7 or 14x14 pixels (49 rows on 8-row tiles computed 56; 7 x 64 ran up to 1.12x faster than 7 x 48
        # for 7x7 convs on the 2-core EPYC, though its 28 + 4 + 1 vectors are one more than the registers)
        exact = [d for d in range(mr + 2, mr // 2 - 1, -1) if rows % d == 0]
        if exact:
            d = exact[0]
            nvs = range(min(4, (2 * mr + 4) // d), 1, -1)       # the widest that pads ``cols`` least

            def cost(v: int) -> float:
                """Padded vectors, over the busy share of the threads splitting the rows' tiles or the
                columns' panels, whichever splits more evenly (960 -> 320 at 7x7 on 2 threads: 7 row tiles
                or 5 panels of 64 leave a thread idle a seventh or a sixth of the time; 10 of 32 none)."""
                units = -(-cols // (v * vw))
                return units * v / max(_balance(rows // d, threads), _balance(units, threads))
            nv = nvs[0] if cols is None else min(nvs, key=cost)
            return d, vw * nv
    return m, vw * max(2, 2 * mr // m)


def tile_efficiency(tile: tuple[int, int], rows: int, cols: int) -> float:
    """The share of an MR x NR tiling's multiply-adds that land on the ``rows`` x ``cols`` output."""
    mr, nr = tile
    return rows / (-(-rows // mr) * mr) * cols / (-(-cols // nr) * nr)


def _extent(c: Contraction, facts: RegionFacts, axes) -> int | None:
    """The product of ``axes``' sizes when it is a compile-time constant (the M side holds the outer window
    axes, which the region reduces over)."""
    sizes = {**facts.sizes, **{a.name: a.size for a in (c.outer.axes if c.outer is not None else ())}}
    n = 1
    for a in axes:
        v = Expr.lift(sizes[a]).as_int()
        if v is None:
            return None
        n *= v
    return n


def _panel_extents(c: Contraction, facts: RegionFacts, o: Orientation) -> tuple[int | None, int | None]:
    """How many rows the packed A panels hold and how wide the B side is (the M and N axes, swapped when
    the operands swap), each when it is a compile-time constant."""
    a_axes, b_axes = (c.n_axes, c.m_axes) if o.swapped else (c.m_axes, c.n_axes)
    return _extent(c, facts, a_axes), _extent(c, facts, b_axes)


#: the most A-side rows a skinny contraction (GEMV, skinny GEMM) has: past it, the packed path's 12 x 32 tiles
MAX_SKINNY_ROWS = 16


def skinny_tile(vw: int, rows: int | None, cols: int | None, cores: int = 2) -> tuple[int, int] | None:
    """(MR, NR) of the skinny path for ``rows`` A-side rows (known when compiling), or None where it does
    not apply. MR is the row count itself (nothing padded); NR as many vectors (at most 8) as the registers
    hold beside the MR x NR accumulators, the B vectors and a broadcast, and few enough that every thread
    gets at least two panels of a ``cols``-wide B side. Where the registers hold fewer than two vectors of
    NR (past 14 rows on AVX-512, 6 on AVX2) the packed path's tiles win: on the 2-core EPYC (Zen 5) one
    thread ran 16 x 768 x 3072 in 0.34 ms as 16 x 16 skinny tiles, 0.32 ms packed (12 rows: 0.25 skinny,
    0.28 packed)."""
    if rows is None or not 1 <= rows <= MAX_SKINNY_ROWS:
        return None
    regs = 32 if vw == 16 else 16
    nv = min(8, (regs - 1) // (rows + 1))
    if nv < 2:
        return None
    if cols is not None:
        nv = min(nv, max(1, cols // (vw * 2 * max(1, cores))))
    return rows, nv * vw


def _skinny(c: Contraction, facts: RegionFacts, o: Orientation, vw: int, cores: int) -> tuple[int, int] | None:
    """The skinny tile when the region's contraction is one: few rows on the A side, no fused window, the
    operands in their own orientation, and a B side without guards (a padded conv window keeps the packed
    path, which reads it from a stage)."""
    if c.outer is not None or o.swapped or (o.b_table is not None and o.b_table.guards):
        return None
    return skinny_tile(vw, *_panel_extents(c, facts, o), cores)


def _known(e) -> int | None:
    return Expr.lift(e).as_int()


def _packed_rules(c: Contraction, facts: RegionFacts, o: Orientation, mr: int, nr: int, nc: int,
                  constants: frozenset) -> tuple[str, str, int | None]:
    """(``k_blocks``, ``bind.split``, K when known) of a packed plan: the kernel's K blocking and thread split
    (``kumiko.plan.packed``) for the operands that read only ``constants`` and the sizes known here."""
    pre = {key for key, e in (("a", o.a), ("b", o.b)) if prepackable(key, e, c, nc, nr, constants)}
    k = _known(prod([a.size for a in c.k_axes])) if c.k_axes else 1
    m, n = _extent(c, facts, o.a_rows), _extent(c, facts, o.b_rows)
    group = None
    if c.outer is not None:        # N blocks hold whole window groups: the N axes from the first window axis in
        wset = {a.name for a in c.outer.axes}
        group = _extent(c, facts, o.b_rows[min(i for i, a in enumerate(o.b_rows) if a in wset):])
    ncp = None if n is None or (c.outer is not None and group is None) else n_block_padded(n, nc, nr, group)
    mp = None if m is None else (m + mr - 1) // mr * mr
    m_least = least(prod([Expr.lift(facts.sizes[a]) for a in o.a_rows])) if m is None else None
    return k_blocks_rule("a" in pre, ncp, k), split_rule("b" in pre, mp, k, n, m_least), k


#: how much more of the multiply-adds must land on the output before the operands swap sides
FLIP_GAIN = 1.05


def _orientation(c: Contraction, facts: RegionFacts, o: Orientation, vw: int, constants: frozenset,
                 threads: int = 1) -> tuple[Orientation, tuple[int, int]]:
    """The operands' sides and the micro-tile. The vector lanes take the operand whose rows are
    contiguous (``orient``: a conv's pixels), unless its row count pads the tiles badly (a 7x7 conv's 49
    pixels on 16-lane vectors: 4 vectors for 49 lanes) while the other side's would not (its output
    channels, a multiple of 16) and that side is a constant (its panels pre-packed, whatever its layout):
    then the channels go to the lanes and the pixels to the tile's rows (7 x 64 tiles; the stores run down
    the output's columns). On the 2-core EPYC, one process, alternating: ResNet-50's 1x1 2048 -> 512 and
    3x3 512 -> 512 convs at 7x7 0.81 and 0.88 of the time, 1024 -> 256 at 14x14 0.93. Pixels read in place
    with a short K stay on the lanes whatever the tiles pad (``_b_panel_in_l1``)."""
    rows, cols = _panel_extents(c, facts, o)
    tile = micro_tile(vw, rows, cols, threads)
    if c.outer is not None or rows is None or cols is None:
        return o, tile
    o2 = orient(c, facts.memrefs, facts.sizes, "n" if o.swapped else "m")
    tile2 = micro_tile(vw, cols, rows, threads)
    if not prepackable("b", o2.b, c, 2048 // tile2[1] * tile2[1], tile2[1], constants):
        return o, tile
    gain = tile_efficiency(tile2, cols, rows) / tile_efficiency(tile, rows, cols)
    if (gain > FLIP_GAIN and not _b_panel_in_l1(c, facts, o, tile)) or (
            gain >= 1 and _a_stage_pays(o, o2, tile, tile2, facts)):
        return o2, tile2
    return o, tile


def _b_panel_in_l1(c: Contraction, facts: RegionFacts, o: Orientation, tile: tuple[int, int]) -> bool:
    """Whether ``o`` reads its B operand in place (a conv's pixels along the lanes, from the source or a
    padded, phased stage: nothing packed per call) with the panel of all of K small enough for L1. Then the
    operands keep their sides whatever the tiles pad: on the 2-core EPYC, one process, alternating, packing
    the pixels as A panels instead (channels on the lanes) took 2.2-2.4x the time for MobileNetV2's first
    conv (3 -> 32, stride 2, K 27), 1.07-1.5x for its 1x1 convs 32 -> 16 at 112x112, 192 -> 32 at 28x28 and
    96 -> 576 at 14x14, 1.05-1.07x for 256 -> 1024 at 14x14 and 160 -> 960 at 7x7; past the L1 (1024 -> 256
    and 576 -> 160, K 1024 and 576), the packed side ran 0.79-0.83 of the time (0.83-0.90 once the in-place
    panels were read in K blocks that fit L1). MobileNetV2 as a whole: 0.85 of the time."""
    b = o.b_table
    if b is None or stage_bounds(b) is None or not lane_rows(o.b_rows, b, facts.sizes):
        return False
    k = Expr.lift(prod([Expr.lift(a.size) for a in c.k_axes])).as_int() if c.k_axes else 1
    return k is not None and k * tile[1] * 4 <= IN_PLACE_PANEL_BYTES


def _a_stage_pays(o: Orientation, o2: Orientation, tile: tuple, tile2: tuple, facts: RegionFacts) -> bool:
    """A padded conv whose output rows are shorter than a B panel (NR - 1: 28 pixels on 48 lanes) packs
    im2col panels on the lanes side, while on the A side its pixels are read from the padded stage when the
    rows are at least MR - 1 long (``kumiko.kernel.contract``, unit stride, no phases): 3x3 convs at 28x28
    with bound weights ran 0.78-0.90 of the time that way (at 56x56, where the B side's stage reads the
    rows in place, 1.06)."""
    b, a2 = o.b_table, o2.a_table
    if b is None or a2 is None or not b.guards or stage_bounds(b) is None or stage_bounds(a2) is None:
        return False
    w = _known(facts.sizes[o.b_rows[-1]]) if o.b_rows else None
    unit = steps_last_dim(o2.a_rows, a2.dims, 1) and all(phase_count(rest, rp, o2.a_rows) == 1
                                                         for (rest, rp, _), _ in a2.dims)
    return w is not None and unit and tile2[0] - 1 <= w < tile[1] - 1


def winograd_fit(c: Contraction, facts: RegionFacts, vw: int, constants: frozenset, lanes: str | None = None
                 ) -> tuple[Geometry, str] | None:
    """(the geometry, the lanes' side) when ``c`` is a convolution Winograd's F(m x m, 3x3) computes with its
    pixels on the A side and its constant weights pre-packed on the B side (``kumiko.plan.winograd``);
    ``lanes``: only that side's orientation (a plan's ``vectorize.axis``)."""
    _, nr = micro_tile(vw)
    for side in ((lanes,) if lanes else ("n", "m")):
        o = orient(c, facts.memrefs, facts.sizes, side)
        pre_b = prepackable("b", o.b, c, nr, nr, constants)
        g = winograd_geometry(c, o, facts.sizes, vw, pre_b)
        if g is not None:
            return g, side
    return None


def _winograd(region: Region, c: Contraction, facts: RegionFacts, arch: str, vw: int, constants: frozenset,
              cores: int) -> Plan | None:
    """The Winograd plan where the region is a 3x3 stride-1 convolution for which it pays (``kumiko.plan.winograd``):
    ``algo_choice.tile`` is m of F(m x m, 3x3), ``cache_block`` holds its blocks (tile rows, output channels; KC
    all of C), ``register_block`` the packed path's micro-tile."""
    fit = winograd_fit(c, facts, vw, constants)
    mr, nr = micro_tile(vw)
    m = winograd_tile(fit[0], nr) if fit is not None else None
    if m is None:
        return None
    g, lanes = fit
    tr, ncols = winograd_blocks(g, mr, nr, cores, m)
    return make_plan(arch, algo_choice={"contraction": "winograd", "tile": m}, register_block=RegisterBlock(mr, nr),
                     cache_block=CacheBlock(tr, ncols, g.c), vectorize={"width": vw, "axis": lanes},
                     bind={"m.o": "omp"},
                     cache=({"tensor": "x", "where": "stage", "at": "m.o"},
                            {"tensor": "y", "where": "prepack", "at": "load"}),
                     predicate_tail=tuple(c.n_axes), epilogue=tuple(epilogue(region)),
                     local_edges=({"from": c.let, "to": "epilogue", "buffer": "scratch"},))


def _hinted(sizes: dict, hints: Mapping[str, int] | None) -> dict:
    """``sizes`` with each symbolic size evaluated at the graph's example sizes (``Program.symbols``) where they
    give it a value: for a choice of speed only (which side takes the vector lanes), which the kernel keeps
    right at every size."""
    if not hints:
        return sizes
    out = {}
    for a, s in sizes.items():
        e = Expr.lift(s)
        out[a] = dim_eval(e, hints) if e.as_int() is None and e.symbols() <= hints.keys() else s
    return out


def choose_plan(region: Region, syms: tuple, features: dict, constants: frozenset = frozenset(),
                hints: Mapping[str, int] | None = None) -> Plan:
    """The region's plan on this machine; ``constants``: the inputs bound once (their operands pre-packed);
    ``hints``: the graph's example sizes of its symbols (``Program.symbols``). A strided conv's pixels take
    the vector lanes (read in place from a phased stage) when there are at least ``MIN_PHASED_ROWS`` of them
    (``kumiko.region.operands.lane_rows``); with symbolic sizes, at the example sizes: ResNet-50's stem
    compiled for any image size (7x7 stride 2, 3 -> 64, 224 -> 112) ran 1.8x torch's time with the pixels
    packed as A panels, 1.05x read in place (2-core Zen 3)."""
    arch, vw = machine_arch(features)
    facts = analyze(region)
    c = facts.contraction
    if c is None:
        return make_plan(arch, algo_choice={"region": "loops"}, vectorize={"width": vw},
                         bind={"outer": "omp"}, epilogue=tuple(epilogue(region)))
    o = orient(c, facts.memrefs, _hinted(facts.sizes, hints))
    lanes = "m" if o.swapped else "n"          # the plan says which side the vector lanes hold
    cores = int(features.get("cores", 2) or 2)
    sk = _skinny(c, facts, o, vw, cores)
    if sk is not None:
        return make_plan(arch, algo_choice={"contraction": "skinny"}, register_block=RegisterBlock(*sk),
                         vectorize={"width": vw, "axis": lanes}, bind={"n.o": "omp"},
                         cache=({"tensor": "x", "where": "pack", "at": "b"},
                                {"tensor": "y", "where": "pack", "at": "n.o"}),
                         predicate_tail=tuple(c.n_axes), epilogue=tuple(epilogue(region)),
                         local_edges=({"from": c.let, "to": "epilogue",
                                       "buffer": "reg" if c.pointwise else "scratch"},))
    wino = _winograd(region, c, facts, arch, vw, constants, cores)
    if wino is not None:
        return wino
    o, (mr, nr) = _orientation(c, facts, o, vw, constants, cores)
    lanes = "m" if o.swapped else "n"
    mc, nc = max(mr, 120 // mr * mr), 2048 // nr * nr
    k_blocks, split, k = _packed_rules(c, facts, o, mr, nr, nc, constants)
    kc = max(1, k) if k_blocks == "one" else 256       # one K block: KC is all of K
    return make_plan(arch, algo_choice={"contraction": "packed"}, register_block=RegisterBlock(mr, nr),
                     cache_block=CacheBlock(mc, nc, kc), k_blocks=k_blocks, vectorize={"width": vw, "axis": lanes},
                     bind={"m.o": "omp", "n.o(pack)": "omp", "split": split},
                     cache=({"tensor": "x", "where": "pack", "at": "k.o"},
                            {"tensor": "y", "where": "pack", "at": "k.o"}),
                     predicate_tail=tuple(c.m_axes + c.n_axes), epilogue=tuple(epilogue(region)),
                     local_edges=({"from": c.let, "to": "epilogue", "buffer": "reg" if c.pointwise else "scratch"},))


def choose_plans(program: Program, syms: tuple, features: dict, constants: frozenset = frozenset()
                 ) -> dict[str, Plan]:
    return {r.name: choose_plan(r, syms, features, constants, program.symbols) for r in program.regions}
