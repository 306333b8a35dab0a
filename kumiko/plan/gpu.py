"""Plans for the GPU (sm80 / sm90): choosing, validating, and feeding the ptxas report back.

A region whose structure holds a contraction (``find_contraction``) with 16-bit operands gets the MMA
skeleton: CTA tile (BM, BN, BK), a 2- to 4-stage cp.async ring, a warp tile of m16n8k16 MMAs, 16-byte
(8-half) vector loads, tail predicates on M, N and K, the epilogue SRNF names, barrier model
``cp_async_group`` with one barrier per K tile: ``async.release = "registers"`` double-buffers the warp
fragments (k16 step j + 1 is loaded while step j's MMAs run; the barrier sits after a tile's last
ldmatrix, so it frees that tile's stage and makes the next tile visible, whose first fragments load
while the last step's MMAs run), ``"merged"`` is the same ring with one set of fragments (the barrier at
the top of the iteration), ``"trailing"`` adds a second barrier after the MMAs and keeps one more tile
in flight. The large plan's 64x64 warp tiles take "merged" (128 accumulators leave no room for a second
set of fragments), the small plan's 32x32 ones "registers". The tile
follows the problem: one large enough for about two 128x128 CTAs per SM (or of unknown M/N) gets
128x128x32 with 64x64 warp tiles and 4 stages; otherwise BN = 32 when N is a constant <= 32 (an
attention head), else 64, BM = 64 (128 when M and N are constants of at least 128), BK = 32, 32x32
warp tiles and 3 stages; a window reduction after the contraction takes the smallest tile that holds a window
(``_window_tile``). Few output tiles over a long K, sizes known, get split-K (``split_k_for``). Every other region
(elementwise, row softmax/layernorm, pooling, fp32 contractions) gets the SIMT skeleton, its blocks down to one warp
when its points are few (``simt_threads``).

``validate_gpu_plan`` rejects a plan that cannot be instantiated (E1801), ``check_resources`` one whose
nvcc build spills or overflows shared memory, with the numbers from ptxas; for a plan the chooser made,
the ``cuda`` target then builds ``fallback_gpu_plan``'s next plan down instead.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kumiko.diagnostics import KumikoError
from kumiko.plan.gpu_sm90 import FILL_CTAS, choose_sm90_plan, sm90_operands, split_k_for, validate_sm90_plan
from kumiko.plan.plan import GPU_ARCHS, SMEM_LIMIT, Plan, check_fields, make_plan
from kumiko.region.analysis import Contraction, RegionFacts, analyze, row_axes
from kumiko.region.srnf import children, epilogue
from kumiko.region.ssa import Read, Reduce, Region, RExpr
from kumiko.symbolic import Expr, prod

SIMT_BINDINGS = ("thread", "warp")
#: the register file limit per thread: what a plan must fit, what the GPU IR verifier checks
MAX_REGISTERS = 255
#: lanes of a warp (the SIMT warp binding's stride)
WARP = 32
#: the operand dtypes mma.sync takes
MMA_DTYPES = ("fp16", "bf16")
#: plan async.release: how a K loop iteration of the MMA skeleton frees the stage it read (``kumiko.kernel.gpu_mma``)
RELEASES = ("trailing", "merged", "registers")


def ring_release(plan: Plan) -> str:
    """The plan's ring schedule (``async.release``); a plan without one has the two-barrier ring."""
    return plan.get("async_", "release", "trailing")


def mma_operand_dtype(facts: RegionFacts, c: Contraction) -> str | None:
    """The 16-bit dtype both operands of ``c`` have (the MMA path's requirement), else None."""
    tx, ty = facts.dtype_of(c.x), facts.dtype_of(c.y)
    if tx is None or ty is None or tx is not ty or tx.name not in MMA_DTYPES:
        return None
    return tx.name


def _top_reduces(e: RExpr):
    """The reductions in ``e`` that no other reduction encloses."""
    if isinstance(e, Reduce):
        yield e
        return
    for c in children(e):
        yield from _top_reduces(c)


def _last_indices(e: RExpr, varying: frozenset | None = None):
    """The fastest-varying index of every Read in ``e``, when it is one bare axis (else None); with ``varying``,
    of the Reads whose index uses one of those axes only (one that does not is read once per point)."""
    if isinstance(e, Read) and (varying is None or any(
            sym in varying for i in e.index for sym in Expr.lift(i).symbols())):
        yield None if e.flat or not e.index else Expr.lift(e.index[-1]).as_symbol()
    for c in children(e):
        yield from _last_indices(c, varying)


def _reduce_axes(e: RExpr) -> frozenset:
    """The axes of every reduction in ``e``, nested ones included."""
    own = frozenset(a.name for a in e.axes) if isinstance(e, Reduce) else frozenset()
    return own.union(*(_reduce_axes(c) for c in children(e)))


def simt_binding(region: Region, precomputed=()) -> str:
    """Whether a SIMT point (row) binds to a ``"warp"`` or a ``"thread"``, from the access maps: a warp when
    its lanes would read memory in order - the rows (inner axes) include the fastest-varying iter (a softmax
    or layernorm over the last axis), or the region reduces along the fastest index of what it reads and
    reads nothing along its last outer iter (a row sum; a GEMM's B is read along N, which threads of
    adjacent points read in order) - and the rows are not constantly shorter than a warp. Otherwise adjacent
    threads take adjacent points, which is then the coalesced order."""
    inner, outer = row_axes(region, precomputed)
    iters = [a.name for a in region.iters]
    if inner and iters[-1] in inner:
        n = prod([a.size for a in region.iters if a.name in inner])
        return "thread" if isinstance(n, int) and n < WARP else "warp"
    along, across = [], False
    for let in region.lets:
        if let.name in precomputed:
            continue
        for r in _top_reduces(let.expr):
            axes = {a.name for a in r.axes}
            lasts = set(_last_indices(r.body))
            if lasts & axes:
                along.append(prod([a.size for a in r.axes]))
            # along the last outer iter, as the reduction runs (a bias read once per point does not count)
            across |= bool(outer) and outer[-1] in set(_last_indices(r.body, _reduce_axes(r)))
    if not along or across:
        return "thread"
    return "thread" if all(isinstance(n, int) and n < WARP for n in along) else "warp"


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one function (entry kernels and device functions alike)."""

    name: str
    arch: str = ""
    entry: bool = False
    registers: int = 0
    barriers: int = 0
    smem: int = 0                 # static shared memory bytes (dynamic smem is a launch parameter)
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    cmem: dict[int, int] = field(default_factory=dict)  # constant bank -> bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mma_threads(tile: tuple, warp_tile: str) -> int:
    """Threads of an MMA plan's CTA: one warp per warp tile of the CTA tile (what the kernel launches)."""
    wm, wn = (int(x) for x in str(warp_tile).split("x"))
    return (tile[0] // wm) * (tile[1] // wn) * 32


def _const(x) -> int | None:
    return x if isinstance(x, int) else None


#: 128x128 CTAs enough for about 1.5 per SM on an H100 (132 SMs), nearly two on an A100 (108)
BIG_TILE_CTAS = 192


#: the large plan's CTA rasterisation: 8 M tiles walk N together, so at 8192^3 the ~264 CTAs resident on
#: an H100 read 8 row blocks of A and ~33 column blocks of B instead of ~4 of A and all 64 of B (B is
#: 128 MB, more than L2)
GROUP_M = 8


def _fills_gpu(m: int | None, n: int | None, batch: int | None) -> bool:
    """Whether 128x128 tiles still keep every SM busy (``BIG_TILE_CTAS``). Unknown (symbolic) sizes count as large: a
    small problem then runs on fewer CTAs (its tails are predicated), a large one at full speed."""
    if n is not None and n <= 64:
        return False
    tiles = [None if x is None else -(-x // 128) for x in (m, n)] + [batch]
    if any(t is None for t in tiles):
        return True
    return tiles[0] * tiles[1] * tiles[2] >= BIG_TILE_CTAS


def simt_threads(points, bind: str) -> int:
    """A SIMT kernel's threads a block for ``points`` points (an int when known) bound to a ``"warp"`` or a
    ``"thread"`` each: 256, less (down to one warp) while its blocks would not reach FILL_CTAS SMs. A
    LayerNorm over BERT's 128 rows, a warp a row, ran as 16 blocks of 8 warps (13.6 us on an H100)."""
    if not isinstance(points, int) or points <= 0:
        return 256
    per = WARP if bind == "warp" else 1
    want = -(-points // FILL_CTAS) * per
    return min(256, max(WARP, -(-want // WARP) * WARP))


#: the largest M tile the MMA skeleton takes to hold whole windows of a reduction after the contraction
MAX_WINDOW_BM = 256


def _window_tile(c, bm: int) -> int | None:
    """The smallest M tile ``bm * 2^i`` up to MAX_WINDOW_BM that holds whole windows of ``c.outer`` (the window
    reduction after the contraction: a tile's rows must cover its windows): one they divide, else the smallest
    that holds one (a 7x7 global pool's 49 rows in a 64-row tile: consecutive tiles then start a whole number
    of windows apart, ``MmaKernel.m_rows``); None when the window is larger than MAX_WINDOW_BM rows."""
    ws = _const(prod([a.size for a in c.outer.axes]))
    if ws is None:
        return None
    t = bm
    while t <= MAX_WINDOW_BM:
        if t % ws == 0:
            return t
        t *= 2
    while bm < ws:
        bm *= 2
    return bm if bm <= MAX_WINDOW_BM else None


def choose_gpu_plan(region: Region, arch: str, syms: tuple) -> Plan:
    if arch not in GPU_ARCHS:
        raise KumikoError("E1801", at=f"plan of {region.name}", why=f"{arch!r} is not a GPU arch {GPU_ARCHS}")
    facts = analyze(region)
    c = facts.contraction
    if arch == "sm90":          # the SM90 GEMM skeleton where TMA can read the operands, else the SM80 one's plan
        g = sm90_operands(region, facts, c)
        if g is not None:
            plan = choose_sm90_plan(region, g, c)
            if not c.pointwise:         # the accumulator to scratch, the rest on the SIMT kernel (a warp a row)
                plan = plan.with_(bind={**dict(plan.bind), "rest.point": simt_binding(region, (c.let,))})
            return plan
        arch = "sm80"
    dt = mma_operand_dtype(facts, c) if c is not None else None
    if c is None or dt is None or (c.outer is not None and _window_tile(c, 64) is None):
        # (a window reduction after the contraction whose window is longer than MAX_WINDOW_BM rows runs on the SIMT
        # kernel)
        point = simt_binding(region)
        points = prod([facts.sizes[a] for a in row_axes(region)[1]])
        return make_plan(arch, algo_choice={"region": "simt"}, threads=simt_threads(points, point),
                         bind={"point": point}, epilogue=tuple(epilogue(region)))
    sizes = facts.sizes
    m = _const(prod([sizes[a] if a in sizes else 1 for a in c.m_axes]))
    n = _const(prod([sizes[a] for a in c.n_axes]))
    batch = _const(prod([sizes[a] for a in c.batch])) if c.batch else 1
    if _fills_gpu(m, n, batch) and c.outer is None:
        # a large problem: 128x128 CTA tiles of 64x64 warp tiles (32 MMAs per k16 step for 8 ldmatrix.x4,
        # twice the 32x32 warp tile's ratio), 4 warps and a 4-stage ring (76 KB), so two CTAs share an SM
        # and one's barriers hide behind the other's MMAs
        bm, bn, wm, wn, stages = 128, 128, 64, 64, 4
        group_m = GROUP_M
        # 128 accumulators a thread: double-buffered fragments (64 more registers) put ptxas at 254-255
        # registers, spilling with a scratch epilogue (attention's QK^T); one set of fragments keeps 232-246
        release = "merged"
    else:
        bn = 32 if n is not None and n <= 32 else 64
        bm = 128 if (m or 0) >= 128 and (n or 0) >= 128 else 64
        if c.outer is not None:
            bm = _window_tile(c, bm)
        # (a 256-row window tile takes 64-row warp tiles: eight warps, not sixteen, which the rings' chunks divide)
        wm, wn, stages = min(bm, 32) if bm <= 128 else 64, min(bn, 32), 3
        group_m = 1
        release = "registers"           # 32 accumulators: room for two sets of fragments (~124 registers)
    buffer = "reg" if c.pointwise else "smem" if c.outer is not None else "gmem"
    kk = _const(prod([a.size for a in c.k_axes]))
    tiles = None if m is None or n is None or batch is None else -(-m // bm) * -(-n // bn) * batch
    split = 1 if c.outer is not None else split_k_for(tiles, kk, 32)
    bind = {"n.o": "block.x", "m.o": "block.y", "batch": "block.z", "m.i.o": "warp.y", "n.i.o": "warp.x"}
    if buffer == "gmem":                # the SIMT kernel for the rest: a thread or a warp per row
        bind["rest.point"] = simt_binding(region, (c.let,))
    return make_plan(
        arch, tile=(bm, bn, 32), stages=stages, warp_tile=f"{wm}x{wn}", bind=bind,
        cache=({"tensor": "x", "where": "smem", "at": "k.o", "stages": stages},
               {"tensor": "y", "where": "smem", "at": "k.o", "stages": stages}),
        vectorize={"axis": "k", "width": 8},
        predicate_tail=tuple(c.m_axes + c.n_axes + tuple(a.name for a in c.k_axes)),
        epilogue=tuple(epilogue(region)), layout_hints={"group_m": group_m},
        algo_choice={"contraction": "mma"}, local_edges=({"from": c.let, "to": "epilogue", "buffer": buffer},),
        async_={"enable": True, "prefetch_depth": stages - 1, "epilogue_overlap": False, "release": release},
        barrier_model="cp_async_group", threads=mma_threads((bm, bn), f"{wm}x{wn}"), split_k=split)


# -- the attention pair's plans (made by kernel.attention_pair.pair_attention) ------------------------------
#: the producer plan's algo (``algo_choice.contraction``) and the consumer's (``algo_choice.region``)
STREAMING = "streaming_softmax"
FUSED = "fused"
#: query rows per warp of the fused attention kernel (one m16 MMA row block)
WARP_ROWS = 16


def validate_attention_plan(plan: Plan, at: str) -> Plan:
    """E1801 unless a streaming plan's tile, stages and threads fit the kernel (a fused consumer's plan has none)."""
    if plan.algo == FUSED:
        return plan
    bm, bn, bk = (tuple(plan.tile) + (0, 0, 0))[:3]
    if plan.barrier_model == "mbarrier":            # the SM90 kernel (kernel.gpu_attention_sm90)
        if plan.arch != "sm90" or bm not in (64, 128) or bn % 16 or not 16 <= bn <= 256 or bk != 64 or \
                not 2 <= plan.stages <= 4 or plan.threads not in (0, 128 * (1 + bm // 64)):
            raise KumikoError("E1801", at=at, why=f"an SM90 {STREAMING} plan (barrier_model mbarrier) has tile "
                              "[BM, BN, 64] with BM 64 or 128 (a consumer warpgroup per 64 rows), BN a multiple of 16 "
                              f"up to 256, 2 to 4 stages and a producer warpgroup; got arch {plan.arch}, tile "
                              f"{list(plan.tile)}, {plan.stages} stages, {plan.threads} threads",
                              suggestion="tile [128, 128, 64], 2 stages, 384 threads, arch sm90")
        return plan
    if bm % WARP_ROWS or not 1 <= bm // WARP_ROWS <= 8 or bn % 16 or not 16 <= bn <= 128 or bk != 16 or \
            plan.stages != 2 or plan.threads not in (0, bm // WARP_ROWS * 32):
        raise KumikoError("E1801", at=at, why=f"a {STREAMING} plan has tile [BM, BN, 16] with BM a multiple of "
                          f"{WARP_ROWS} (a warp each, up to 8), BN a multiple of 16 up to 128, 2 stages and a warp "
                          f"per {WARP_ROWS} rows; got tile {list(plan.tile)}, {plan.stages} stages, {plan.threads} "
                          "threads", suggestion="tile [64, 64, 16], 2 stages, 128 threads")
    return plan


def validate_gpu_plan(plan: Plan, region: Region, syms: tuple) -> Plan:
    """E1801 unless the plan fits the region, the MMA shape and the arch's budget."""
    at = f"plan of {region.name}"
    if plan.arch not in GPU_ARCHS:
        raise KumikoError("E1801", at=at, why=f"plan arch {plan.arch!r} is not a GPU arch {GPU_ARCHS}")
    check_fields(plan, at)
    for key in ("point", "rest.point"):
        point = plan.get("bind", key, "thread")
        if point not in SIMT_BINDINGS or (point == "warp" and (plan.threads or 256) % 32):
            raise KumikoError("E1801", at=at, why=f"bind.{key}={point!r}: a SIMT point binds to one of "
                              f"{SIMT_BINDINGS} (a warp needs a multiple of 32 threads)")
    if plan.algo in (STREAMING, FUSED):             # the attention pair's plans (kernel.gpu_attention)
        return validate_attention_plan(plan, at)
    if plan.algo == "wgmma":
        return validate_sm90_plan(plan, region, analyze(region), SMEM_LIMIT["sm90"])
    if plan.algo != "mma":
        return plan
    facts = analyze(region)
    c = facts.contraction
    if c is None or mma_operand_dtype(facts, c) is None:
        raise KumikoError("E1801", at=at, why="an MMA plan needs a contraction with fp16/bf16 operands",
                          suggestion='use algo_choice {"region": "simt"}')
    if len(plan.tile) != 3 or not plan.warp_tile or "x" not in str(plan.warp_tile):
        raise KumikoError("E1801", at=at, why="an MMA plan needs a CTA tile [BM, BN, BK] and a warp_tile 'WMxWN'")
    bm, bn, bk = plan.tile
    wm, wn = (int(x) for x in str(plan.warp_tile).split("x"))
    if bm % wm or bn % wn or wm % 16 or wn % 16 or bk % 16:
        raise KumikoError("E1801", at=at, why=f"tile {list(plan.tile)} / warp_tile {plan.warp_tile} do not divide into "
                          "m16n8k16 MMAs (warp tile multiples of 16x16, BK a multiple of 16)",
                          suggestion="e.g. tile [64, 64, 32] with warp_tile 32x32")
    if plan.stages not in (2, 3, 4):
        raise KumikoError("E1801", at=at, why=f"stages={plan.stages}: the cp.async ring has 2 to 4 stages")
    release = ring_release(plan)
    if release not in RELEASES:
        raise KumikoError("E1801", at=at, why=f"async.release {release!r} is not one of {RELEASES}")
    if release == "registers" and bk % 32:
        raise KumikoError("E1801", at=at, why=f"async.release 'registers' alternates two fragment buffers over the "
                          f"k16 steps of a tile: BK={bk} must be a multiple of 32", suggestion="use BK 32 or 64")
    if type(plan.split_k) is not int or not 1 <= plan.split_k <= 64 or (plan.split_k > 1 and c.outer is not None):
        raise KumikoError("E1801", at=at, why=f"split_k={plan.split_k!r}: 1 to 64 CTAs an output tile, and 1 when a "
                          "window reduction follows the contraction (its epilogue reads the tile from shared memory)",
                          suggestion="split_k 1")
    group_m = plan.get("layout_hints", "group_m", 1)
    if not isinstance(group_m, int) or not 1 <= group_m <= 64:
        raise KumikoError("E1801", at=at, why=f"layout_hints.group_m={group_m!r}: CTA runs are 1 to 64 M tiles")
    threads = mma_threads(plan.tile, plan.warp_tile)
    if plan.threads not in (0, threads):
        raise KumikoError("E1801", at=at, why=f"threads={plan.threads}: a {plan.warp_tile} warp tile of a "
                          f"{bm}x{bn} CTA tile runs {threads} threads (a warp per warp tile)",
                          suggestion=f"threads {threads} (or 0)")
    if threads > 1024 or (bm * bk // 8) % threads or (bn * bk // 8) % threads:
        raise KumikoError("E1801", at=at, why=f"{threads} threads cannot split the {bm}x{bk} and {bn}x{bk} tiles into "
                          "whole 16-byte chunks each", suggestion="use a larger warp tile or BK")
    smem = 2 * plan.stages * (bm + bn) * (bk + 8) + 16 * bk * plan.stages
    if smem > SMEM_LIMIT[plan.arch]:
        raise KumikoError("E1801", at=at, why=f"the ring needs about {smem} bytes of shared memory, {plan.arch} has "
                          f"{SMEM_LIMIT[plan.arch]}", suggestion="use fewer stages or a smaller tile")
    regs = (wm // 16) * (wn // 8) * 4 + 40
    if regs > MAX_REGISTERS:
        raise KumikoError("E1801", at=at, why=f"a {plan.warp_tile} warp tile needs about {regs} registers a thread",
                          suggestion="use a smaller warp tile")
    return plan


def describe_gpu_plan(plan: Plan) -> str:
    """One line for reports (CLI, bench), after the plan's algo: an MMA plan's tile, warp tile, stages, CTA
    runs and ring schedule (and its SIMT rest's binding), or a SIMT plan's binding."""
    if plan.algo in (STREAMING, FUSED):             # the attention pair (kernel.gpu_attention)
        other = dict(plan.local_edges[0]).get("to", "?") if plan.local_edges else "?"
        how = (f"TMA + wgmma, {plan.threads // 128 - 1} consumer warpgroups, " if plan.barrier_model == "mbarrier"
               else "")
        return (f"tile {'x'.join(map(str, plan.tile))} {how}{plan.stages} stages, online softmax, P @ V of {other} "
                "fused" if plan.algo == STREAMING else f"fused into {other}'s kernel")
    if plan.algo == "wgmma":
        return (f"tile {'x'.join(map(str, plan.tile))} TMA + wgmma, {plan.threads // 128 - 1} consumer warpgroups, "
                f"{plan.stages} stages")
    if plan.algo != "mma":
        return f"a {plan.get('bind', 'point', 'thread')} per point"
    out = (f"tile {'x'.join(map(str, plan.tile))} warps {plan.warp_tile} {plan.stages} stages "
           f"g{plan.get('layout_hints', 'group_m', 1)} {ring_release(plan)}")
    if plan.split_k > 1:
        out += f" split K x{plan.split_k}"
    rest = plan.get("bind", "rest.point")
    return out + (f", then SIMT: a {rest} per point" if rest else "")


def describe_plan(plan: Plan) -> str:
    """One line for any plan, CPU or GPU (``kumiko compile``'s report, ``KUMIKO_DEBUG=3``): algo, arch and
    vector width, then a packed CPU contraction's register and cache blocks or ``describe_gpu_plan``. It
    lives here, not in ``plan.py``, because the GPU half needs this module."""
    extra = ""
    if plan.algo == "packed" and plan.register_block is not None and plan.cache_block is not None:
        extra = (f" register block {'x'.join(map(str, plan.register_block))}"
                 f" cache block {'x'.join(map(str, plan.cache_block))}")
    if plan.arch in GPU_ARCHS:
        extra = " " + describe_gpu_plan(plan)
    return f"{plan.algo} ({plan.arch}, vector width {plan.vector_width}){extra}"


#: the ring schedule to step down to when ptxas rejects one: fewer values live across the K loop each time
RELEASE_FALLBACK = {"registers": "merged", "merged": "trailing"}


def fallback_gpu_plan(plan: Plan, gpu_arch: str, hazard: str) -> Plan | None:
    """The next plan to try when ptxas rejects a chosen MMA plan (a spill, too much shared memory): the
    next ring schedule down first (``RELEASE_FALLBACK``: fragments no longer double-buffered, then the
    two-barrier ring, which keeps fewer values live across the K loop's branches), then the small tile
    (64 x <= 64, 32x32 warps, 3 stages). None when nothing smaller is left. Why is recorded in the new
    plan's ``ptxas_fallback`` (the hazard, the GPU arch, how many steps down from the chooser's plan), so
    dumps say why the plan is not the chooser's."""
    if plan.algo != "mma":
        return None                     # (a wgmma plan has no smaller form yet)
    record = {"gpu_arch": gpu_arch, "hazard": hazard, "steps": int(plan.get("ptxas_fallback", "steps", 0)) + 1}
    asy = dict(plan.async_)
    release = ring_release(plan)
    if release != "trailing":
        return plan.with_(async_={**asy, "release": RELEASE_FALLBACK[release]}, ptxas_fallback=record)
    bm, bn, bk = plan.tile
    small = (64 if bm % 64 == 0 else bm, min(bn, 64), 32)
    if (small, plan.warp_tile, plan.stages) == (plan.tile, "32x32", 3):
        return None
    warp = f"{min(small[0], 32)}x{min(small[1], 32)}"
    return plan.with_(tile=small, warp_tile=warp, stages=3, threads=mma_threads(small, warp),
                      async_={**asy, "prefetch_depth": 2}, ptxas_fallback=record)


def check_resources(plan: Plan, kernel: str, res: KernelResources, dynamic_smem: int,
                    region: str | None = None) -> None:
    """Seed 001 §11: a kernel that spills, or whose shared memory passes the arch limit, is rejected
    (``details["region"]``: the region whose plan it was, when given)."""
    at = f"kernel {kernel} ({res.arch})"
    if res.spill_stores or res.spill_loads:
        raise KumikoError("E1801", at=at, why=f"ptxas spills {res.spill_stores} bytes stored / {res.spill_loads} bytes "
                          f"loaded with {res.registers} registers (plan tile {list(plan.tile)}, warp_tile "
                          f"{plan.warp_tile})", suggestion="use a smaller warp_tile or tile", hazard="spill",
                          registers=res.registers, region=region)
    limit = SMEM_LIMIT.get(plan.arch, SMEM_LIMIT["sm80"])
    if res.smem + dynamic_smem > limit:
        raise KumikoError("E1801", at=at, why=f"{res.smem} bytes static + {dynamic_smem} dynamic shared memory exceed "
                          f"{plan.arch}'s {limit}", suggestion="use fewer stages or a smaller tile", hazard="smem",
                          region=region)
