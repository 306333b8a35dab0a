"""The GPU dialect IR (seed 001 §9): the one MMA skeleton with explicit async tokens, and the SIMT kernel.

An ``MmaKernel`` is the SM80 skeleton ``cp.async -> commit/wait -> ldmatrix -> mma.sync -> epilogue ->
st.global`` written as data: a prologue that fills the shared-memory ring, a K loop whose body waits for
a tile's load token, computes on it and refills a released stage (the stage read in the previous
iteration, released by this iteration's one barrier, or the stage just read, released by a second,
trailing barrier; or, with fragments double-buffered in registers, the stage of the previous tile,
released by a barrier placed after that tile's last ldmatrix), and an epilogue on the accumulator with
predicated stores. Every knob the Plan injects (tile, stages, warp tile, operand layouts, tail
predicates, the epilogue, the ring schedule) is a field or a statement here, so the verifier
(``gpu_verify``) checks the schedule as written and the bug-injection tests mutate these records, never
the renderer or the emulator.

Tokens (seed 001 §9.2): a ``LoadTile`` produces a ``TokLoad`` for the tile it issues, ``CommitGroup``
closes a cp.async group, ``WaitGroup(pending=n)`` consumes the tokens of every group but the n newest,
``Compute`` (or the ``LoadFrag`` / ``MmaFrag`` steps it splits into) consumes the tile's ``TokLoad`` tokens
and produces ``TokCompute``, the ``Epilogue`` consumes ``TokCompute`` and produces ``TokEpilogue``, which
the ``StGlobal`` consumes. Tile references are relative to the K-loop variable (``TileRef(offset,
in_loop)``): tile ``kt + offset`` inside the loop, tile ``offset`` in the prologue; a tile always lives in
stage ``tile % stages``.

Element computations (an operand gathered through its index map and pad Select, the region's epilogue)
are CPU loop-IR statements (``kumiko.kernel.loops``) built by the region expression emitter; the CUDA
renderer prints them unchanged inside the skeleton.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Union

TOKEN_KINDS = ("TokLoad", "TokCompute", "TokEpilogue")


@dataclass(frozen=True)
class Token:
    name: str
    kind: str                       # one of TOKEN_KINDS


@dataclass(frozen=True)
class TileRef:
    """K tile ``kt + offset`` inside the K loop, or tile ``offset`` outside it (the prologue)."""
    offset: int
    in_loop: bool = True

    def at(self, kt: int) -> int:
        return kt + self.offset if self.in_loop else self.offset

    def c(self) -> str:
        return f"(kt + {self.offset})" if self.in_loop else str(self.offset)

    @property
    def may_be_first(self) -> bool:
        """Whether this can be K tile 0, the one that holds K's partial tile (the K tiles are laid out so
        that the partial one comes first: tile t covers K indices [t * BK - kk_kd, (t + 1) * BK - kk_kd))."""
        return self.offset <= 0 if self.in_loop else self.offset == 0


@dataclass(frozen=True)
class SmemRing:
    """A shared-memory ring of ``stages`` tiles of 16-bit elements, ``rows x (cols + pad)`` each.

    ``layout`` says what rows and columns are: ``sk`` (rows: the operand's M or N, columns: K, K
    contiguous) or ``ks`` (rows: K, columns: N contiguous; read with ``ldmatrix.trans``)."""
    name: str
    operand: str                    # "x" (M side, the mma A operand) or "y" (N side, B)
    layout: str                     # "sk" | "ks"
    rows: int
    cols: int
    pad: int
    stages: int

    @property
    def ld(self) -> int:
        return self.cols + self.pad

    @property
    def stage_elems(self) -> int:
        return self.rows * self.ld

    @property
    def nbytes(self) -> int:
        return 2 * self.stages * self.stage_elems


@dataclass(frozen=True)
class VecAccess:
    """The cp.async path of an operand: a plain row-major tile of a MemRef whose rows are 16-byte aligned
    when ``aligned`` (a C condition on the sizes, checked at run time) holds. ``offset`` is the element
    offset of the chunk's first element once the chunk's axes are declared (``decl_s``, ``decl_k``);
    ``s_step`` and ``k_step`` the element distances between consecutive (flattened) M/N and K indices.
    The access is affine in both, so a thread's chunk addresses are one base pointer computed before the
    K loop plus constant multiples of the ring row's stride, advanced by ``k0 * k_step`` per tile."""
    buf: str
    aligned: str
    offset: str
    s_step: str = "1"
    k_step: str = "1"


@dataclass(frozen=True)
class GatherTable:
    """The gather of an operand in table form (``region.operands.table_form``: ``guards ? value(src[off]) : 0``
    with the offset and every guard a row part plus a K part): per K tile each warp writes the K parts of its
    run of columns into its own shared-memory table (one column a lane, ``cols``), and each element is then
    ``src[base + row offset + col 0]`` under one compare per guard against a bound the thread computed once for
    its row, in 32-bit arithmetic: no division, no 64-bit index math per element (an implicit GEMM's im2col
    costs a table read, a few compares and the load). The kernel takes this path when ``fits`` holds (every
    row and column value within +-2^30, so their sums fit an int), else its 64-bit gather."""
    buf: str                        # the source's C name
    ctype: str                      # its element C type
    base: str                       # C, 64-bit: the offset's part over neither rows nor K (batch axes, sizes)
    row_off: str                    # C: the offset's row part (the operand's s axes)
    cols: tuple                     # C: each table column's value at a K index (K axes declared); col 0: offset
    guards: tuple                   # (op "ge" | "le" | "eq", column, C row bound): valid iff col op bound
    row_ok: str                     # C: the guards with no K part (the row's own)
    fits: str                       # C condition: int32 index arithmetic is exact
    raw: bool                       # the element's 16 bits are the MMA operand's (stored as loaded)
    value: tuple = ()               # loops.Stmt: ``kk_v`` (float) from ``kk_ld`` (the loaded element), when not raw
    ld_decl: str = ""               # C declaration of ``kk_ld`` from index ``kk_ix``, when not raw

    @property
    def width(self) -> int:
        """Ints per table entry: the columns padded to whole int4 vectors."""
        return -(-len(self.cols) // 4) * 4


@dataclass(frozen=True)
class OperandLoad:
    """How one operand's tile is filled: ``vec`` (cp.async, 16 bytes a chunk, zero-fill through
    src-size) when present and its rows are aligned, else the guarded scalar ``gather`` (the operand's
    expression evaluated at each (s, k) point, pad Selects as zero-fill) stored as ``kk_v``."""
    operand: str
    ring: str
    s_extent: str                   # C expression: rows of the operand (M or N, flattened)
    k_extent: str                   # C expression: K (flattened)
    decl_s: tuple                   # loops.Stmt: declare the operand's s axes from ``kk_s<operand>``
    decl_k: tuple                   # loops.Stmt: declare the K axes from ``kk_gk``
    gather: tuple                   # loops.Stmt computing the value ``kk_v`` (float) at the point
    vec: VecAccess | None = None
    run_k: tuple = ()               # loops.Stmt: the K axes from ``kk_gk`` as mutable counters ...
    advance_k: str = ""             # ... and the C statement that moves them to the next K index
    table: GatherTable | None = None   # the gather's table form (used when the rows allow, ``MmaKernel.table_run``)


@dataclass(frozen=True)
class LoadTile:
    """Issue the loads of tile ``tile`` of both operands into stage ``tile % stages`` (skipped past K)."""
    tile: TileRef
    out_token: Token
    pred_rows: bool = True          # rows past M / N are zero-filled (False: a bug, for tests)
    pred_k: bool = True             # K indices before 0 (K tile 0's) are zero-filled (False: a bug, for tests)


@dataclass(frozen=True)
class CommitGroup:
    pass


@dataclass(frozen=True)
class WaitGroup:
    """``cp.async.wait_group pending``: every group but the ``pending`` newest has landed."""
    pending: int
    tokens: tuple = ()              # the TokLoad tokens this wait is meant to deliver (for reports)


@dataclass(frozen=True)
class Barrier:
    why: str                        # "landed" (copies visible to every warp) | "release" (stage free) |
                                    # "landed+release" (both: the one barrier of the merged schedule) | "epilogue"


@dataclass(frozen=True)
class LdMatrix:
    """``ldmatrix.x4`` of one operand's warp fragment; ``row_lanes`` lanes give distinct row addresses
    (16 for the x4 layout: a wrong value is a bug kind the emulator must catch)."""
    operand: str
    trans: bool
    row_lanes: int = 16


@dataclass(frozen=True)
class Mma:
    dtype: str                      # "fp16" | "bf16" inputs, fp32 accumulate
    shape: str = "m16n8k16"


@dataclass(frozen=True)
class Compute:
    """The warp tile's MMAs over tile ``tile``: ldmatrix both fragments and mma.sync, BK/16 times."""
    tile: TileRef
    in_tokens: tuple
    out_token: Token
    lda: LdMatrix
    ldb: LdMatrix
    mma: Mma


@dataclass(frozen=True)
class LoadFrag:
    """ldmatrix both operands' warp fragments of k16 step ``kstep`` of tile ``tile`` into register buffer ``buf``
    (0 or 1), skipped past K. With ``MmaFrag`` it splits a ``Compute`` so fragments are double-buffered: step
    j + 1 loads while step j's MMAs run, and the next tile's step 0 loads right after the barrier that
    releases this tile's stage (``async.release = "registers"``)."""
    tile: TileRef
    kstep: int
    buf: int
    in_tokens: tuple
    lda: LdMatrix
    ldb: LdMatrix


@dataclass(frozen=True)
class MmaFrag:
    """The warp tile's mma.sync on the fragments in register buffer ``buf`` (one k16 step)."""
    buf: int
    out_token: Token
    mma: Mma


@dataclass(frozen=True)
class KLoop:
    var: str
    body: tuple


@dataclass(frozen=True)
class Epilogue:
    """The region's ops after the contraction, applied to the accumulator fragments in registers
    (``mode="fragment"``) or, for a window reduction over M rows that different lanes hold, to the
    accumulator staged through shared memory (``mode="smem_window"``, window of ``window`` rows)."""
    ops: tuple                      # op names, from SRNF's epilogue(region) (for dumps)
    in_token: Token
    out_token: Token
    mode: str                       # "fragment" | "smem_window"
    window: int = 1
    code: tuple = ()                # loops.Stmt per output element: the accumulator is ``kk_acc``
    window_code: tuple = ()         # smem_window: loops.Stmt giving ``kk_f`` = f(kk_acc) for one window row
    window_op: str = "max"
    window_init: str = "0.0f"
    overlap: bool = False           # async.epilogue_overlap (independent of the ring: no drain needed)


@dataclass(frozen=True)
class StGlobal:
    """Predicated store of the epilogue's value(s): rows < M, columns < N."""
    in_token: Token
    pred_rows: bool = True
    pred_cols: bool = True
    width: int = 1


@dataclass(frozen=True)
class SplitK:
    """Split-K (``Plan.split_k``): an output tile's K tiles are divided among ``splits`` CTAs (grid z = batch x
    splits; split ``blockIdx.z % splits`` runs K tiles ``[split * per, (split + 1) * per)``, ``per`` = the tiles
    over ``splits`` rounded up, so only split 0 holds K's partial tile). After its K loop each CTA writes its fp32
    accumulators to its slab of ``workspace`` (BM x BN floats per tile and split), fences, and counts itself in the
    tile's ``counters`` word; the last to arrive adds every split's slab, its own from registers, in split order
    (so the sum does not depend on which arrives last), sets the word back to 0 for the next launch and runs the
    epilogue; the others exit. The counters are zero before a program's first launch (the runtime allocates them
    so) and each launch leaves them zero."""
    splits: int
    workspace: str                  # Param: float*, splits x BM x BN per output tile
    counters: str                   # Param: int*, one per output tile


GpuStmt = Union[LoadTile, CommitGroup, WaitGroup, Barrier, Compute, LoadFrag, MmaFrag, KLoop, Epilogue, StGlobal]


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str                      # element type of a pointer ("uint16_t", "float") or a scalar type
    pointer: bool = True
    const: bool = False


@dataclass(frozen=True)
class MmaKernel:
    name: str
    arch: str
    params: tuple                   # Param, ...
    tile: tuple                     # (BM, BN, BK)
    warps: tuple                    # (WARPS_M, WARPS_N)
    stages: int
    rings: tuple                    # SmemRing for x, y
    loads: tuple                    # OperandLoad for x, y
    prologue: tuple                 # GpuStmt
    loop: KLoop
    drain: tuple                    # GpuStmt after the loop (WaitGroup(0) ...)
    epilogue: Epilogue
    store: StGlobal
    setup: tuple = ()               # loops.Stmt: extents (kk_M, kk_N, kk_K) and the batch axes
    decl_m: tuple = ()              # loops.Stmt: declare the M axes from ``kk_gm``
    decl_n: tuple = ()              # loops.Stmt: declare the N axes from ``kk_gn``
    notes: tuple = ()
    regs_budget: int = 255
    group_m: int = 1                # CTA rasterisation: runs of group_m M tiles walk N together (L2 reuse)
    gather_check: bool = False      # a data-dependent index is checked: ``kk_bad`` -> ``*kk_status`` (gpu_simt)
    split: SplitK | None = None     # K divided among CTAs (the epilogue runs in the last of a tile's CTAs)
    m_step: int = 0                 # rows between consecutive M tiles when not BM: a window epilogue whose windows
                                    # do not divide BM starts each tile at a whole window (``m_rows``)

    @property
    def threads(self) -> int:
        return self.warps[0] * self.warps[1] * 32

    @property
    def m_rows(self) -> int:
        """The M rows one CTA's output covers: BM, or a whole number of windows below it (``m_step``)."""
        return self.m_step or self.tile[0]

    @property
    def warp_tile(self) -> tuple:
        return self.tile[0] // self.warps[0], self.tile[1] // self.warps[1]

    def row_run(self, ld: OperandLoad) -> int | None:
        """The columns a thread fills when operand ``ld``'s gather goes by rows: its ring's rows are its M/N
        (``sk``) and the threads split into an equal number per row, each with a run of the row's K columns;
        None otherwise (then the gather spreads the tile's elements over the threads)."""
        ring = next(r for r in self.rings if r.operand == ld.operand)
        if ring.layout != "sk" or self.threads % ring.rows or ring.cols % (self.threads // ring.rows):
            return None
        return ring.cols // (self.threads // ring.rows)

    def table_run(self, ld: OperandLoad) -> int | None:
        """The row run of an operand gathered through its table (``GatherTable``): the lanes of a warp share
        their columns (whole warps per column run), else None."""
        run = self.row_run(ld) if ld.table is not None else None
        ring = next(r for r in self.rings if r.operand == ld.operand)
        return run if run is not None and ring.rows % 32 == 0 else None

    def table_offsets(self) -> tuple[dict, int]:
        """(operand -> (byte offset of its warps' gather tables in shared memory, ints per warp), the bytes
        of the rings and tables): the tables follow the rings."""
        out, at = {}, sum(r.nbytes for r in self.rings)
        for ld in self.loads:
            run = self.table_run(ld)
            if run is not None:
                out[ld.operand] = (at, run * ld.table.width)
                at += 4 * (self.threads // 32) * run * ld.table.width
        return out, at

    @property
    def smem_bytes(self) -> int:
        ring = self.table_offsets()[1]
        if self.epilogue.mode == "smem_window":
            ring = max(ring, 4 * self.tile[0] * (self.tile[1] + 4))
        return ring

    @property
    def fragment_sets(self) -> int:
        """Sets of warp fragments held at once: 2 when double-buffered in registers (``LoadFrag``), else 1."""
        return 2 if any(isinstance(s, LoadFrag) for s in self.loop.body) else 1

    def estimated_registers(self) -> int:
        """Accumulators + the k16 steps of fragments held at once + ~40 for addresses and the epilogue
        (ptxas decides; its report is checked after the build)."""
        wm, wn = self.warp_tile
        mt, nt = wm // 16, wn // 8
        return mt * nt * 4 + self.fragment_sets * (mt * 4 + nt * 2) + 40


@dataclass(frozen=True)
class SimtKernel:
    """One thread (``warp``: one warp, its lanes striding over the row) per point of the ``outer`` axes (the
    iters no let reduces over); ``body`` is loop-IR code per point, looping over the inner axes itself."""
    name: str
    params: tuple
    total: str                      # C expression: number of points
    decl: tuple                     # loops.Stmt: the point's axes from ``kk_p``
    body: tuple
    threads: int = 256
    notes: tuple = ()
    outer: tuple = ()               # the axes one thread's point spans (the grid covers their product)
    warp: bool = False
    gather_check: bool = False      # a data-dependent index is checked: ``kk_bad`` -> ``*kk_status`` (gpu_simt)

    @property
    def points_per_block(self) -> int:
        return self.threads // 32 if self.warp else self.threads


def ir_json(obj: Any) -> Any:
    """The GPU IR as JSON data: each record is ``{"kind": its class, field: value...}`` (the element code it
    carries included, as loop-IR records with C expression strings), tuples are lists, symbolic sizes strings.
    The ``gpu_ir`` dump stage (``kumiko dump --stage gpu_ir``) writes it."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {"kind": type(obj).__name__, **{f.name: ir_json(getattr(obj, f.name)) for f in fields(obj)}}
    if isinstance(obj, (list, tuple)):
        return [ir_json(x) for x in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
