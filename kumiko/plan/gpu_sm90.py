"""SM90 plans: the warp-specialised TMA + mbarrier + wgmma GEMM skeleton (issue 24, ``kernel/gpu_sm90_gemm``).

A region gets it (arch ``sm90``, ``algo_choice {"contraction": "wgmma"}``) when its contraction is a plain or batched
GEMM whose operands TMA can describe: one M, one N and one K axis, no window reduction after it (a pointwise epilogue
runs on the accumulator; any other rest - a LayerNorm over N - gets the accumulator in an fp32 scratch and a SIMT
kernel, as on the SM80 skeleton), fp16/bf16 operands that are each a Read of a row-major input whose trailing indices
are (M, K) for x and (K, N) or (N, K) for y, bare, over the whole extents, and whose leading indices are the batch
axes in order (after leading dimensions of size 1 read at index 0, which drop out: an ONNX batch of one); the
contiguous extent a constant multiple of 8 elements (TMA's 16-byte strides) - or symbolic, when the launch checks it
and runs an SM80 kernel of the region instead when it does not hold. ``sm90_operands`` says how (or None), the chooser
and the lowering both read it. Everything else keeps the SM80 skeleton (an ``sm80`` plan runs on an H100 too).

The plan (``choose_sm90_plan``): tile [BM, 64 <= BN <= 256 (step 64), 64]; 128x256, 4 stages and persistent
(``async_.epilogue_overlap``, without batch axes) for a large or symbolic GEMM; else BM = 128 (two consumer
warpgroups of 64 rows) when M is at least 128, else 64 (one), BN = 64 for N <= 64, else 128, both halved to 64
while the sizes give fewer CTAs than ``FILL_CTAS``; split-K (``split_k_for``, at least ``SM90_MIN_SPLIT_TILES`` K
tiles a split) when the tiles still fill at most half the GPU over a long K; a ring of 4 stages, or, when the grid
is one wave (a CTA an SM whatever its shared memory), as many as the CTA's K tiles, up to 8 and what shared memory
holds (at 128 tokens BERT-base ran 0.84 -> 0.76 ms, GPT-2 0.69 -> 0.63 as CUDA Graphs on an H100); threads 128 a
warpgroup, the producer's included; ``warp_tile`` "64xBN" (a consumer's tile); barrier model ``mbarrier``.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.plan.plan import SMEM_LIMIT, Plan, make_plan
from kumiko.region.analysis import Contraction, RegionFacts
from kumiko.region.srnf import epilogue
from kumiko.region.ssa import Read, Region
from kumiko.symbolic import Expr, prod

SM90_BK = 64
SM90_STAGES = tuple(range(2, 9))
#: setmaxnreg: the producer gives registers back, the consumers take them (by consumer count: 40 + 2 x 232 a thread
#: for three warpgroups fits the SM's 65536; with two, a consumer starts at 256 already)
PRODUCER_REGS, CONSUMER_REGS = 40, {1: 256, 2: 232}


@dataclass(frozen=True)
class TmaOperand:
    """How TMA reads one operand: the input buffer, its rows and contiguous extents, ``major`` "K" (K contiguous)
    or "MN" (y only: N contiguous), and whether its leading index is the batch."""
    buf: str
    cols: object                    # the contiguous extent (an int or a symbolic size)
    major: str
    batched: bool
    head: int = 0                   # x only: K is (heads, head) with head = ``head`` contiguous (``_head_operand``)


@dataclass(frozen=True)
class Sm90Gemm:
    """The operands and the sizes (ints or symbolic); ``align``: the symbolic contiguous extents that must be
    multiples of 8 at run time (else the launch runs the SM80 kernel built beside it)."""
    x: TmaOperand
    y: TmaOperand
    m: object
    n: object
    k: object
    batch: object
    dtype: str
    align: tuple = ()


def _operand(region: Region, e, s_axis: str, k_axis: str, batch: tuple, allow_mn: bool,
             sizes: dict) -> TmaOperand | None:
    if not isinstance(e, Read) or e.flat:
        return None
    mem = dict(region.inputs).get(e.tensor)
    if mem is None or mem.dtype.name not in ("fp16", "bf16"):
        return None
    if len(mem.shape) != len(e.index):
        return None
    # leading dimensions of size 1 read at index 0 (an ONNX batch of one) drop out of the map
    keep = [i for i, (d, x) in enumerate(zip(mem.shape, e.index))
            if not (Expr.lift(d).as_int() == 1 and Expr.lift(x).as_int() == 0)]
    keep = list(range(min(keep, default=len(e.index)), len(e.index)))
    idx = [Expr.lift(e.index[i]).as_symbol() for i in keep]
    shape = [mem.shape[i] for i in keep]
    if len(idx) < 2:
        return None
    lead, last = idx[:-2], idx[-2:]
    if lead and tuple(lead) != tuple(batch):
        return None
    if last == [s_axis, k_axis]:
        major = "K"
    elif last == [k_axis, s_axis] and allow_mn:
        major = "MN"
    else:
        return None
    if any(Expr.lift(d) != Expr.lift(sizes[a]) for d, a in zip(shape, idx)):
        return None                         # a view of part of the buffer: its rows are not the map's
    cols = Expr.lift(shape[-1])
    if cols.as_int() is not None and cols.as_int() % 8:
        return None                         # TMA's global strides are multiples of 16 bytes
    return TmaOperand(e.tensor, shape[-1], major, bool(lead))


def _head_operand(region: Region, e, s_axis: str, k_axis: str, sizes: dict) -> TmaOperand | None:
    """x read as ``buf[..., k // D, m, k % D]`` over a ``[..., H, M, D]`` input with H x D = K and D a multiple of
    SM90_BK (leading dimensions of size 1 at index 0 dropped): the heads of attention's output merged into a
    projection's rows (BERT's and GPT-2's attention output projections). A 3-D map (D, M, H) loads K tile ``kt`` as
    head ``kt // (D / 64)``, columns ``kt % (D / 64) * 64``."""
    if not isinstance(e, Read) or e.flat:
        return None
    mem = dict(region.inputs).get(e.tensor)
    if mem is None or mem.dtype.name not in ("fp16", "bf16") or len(mem.shape) != len(e.index) or len(e.index) < 3:
        return None
    lead = list(zip(mem.shape[:-3], e.index[:-3]))
    if any(Expr.lift(d).as_int() != 1 or Expr.lift(x).as_int() != 0 for d, x in lead):
        return None
    h, m, d = (Expr.lift(x) for x in mem.shape[-3:])
    dh = d.as_int()
    if not dh or dh % SM90_BK:
        return None
    k = Expr.sym(k_axis)
    want = (k.floordiv(dh), Expr.sym(s_axis), k - k.floordiv(dh) * dh)
    if tuple(Expr.lift(x) for x in e.index[-3:]) != want:
        return None
    if m != Expr.lift(sizes[s_axis]) or h * dh != Expr.lift(sizes[k_axis]):
        return None
    return TmaOperand(e.tensor, dh, "K", False, dh)


def sm90_operands(region: Region, facts: RegionFacts, c: Contraction | None) -> Sm90Gemm | None:
    """How the SM90 GEMM skeleton reads ``c``'s operands, or None when it does not apply (module docstring)."""
    if c is None or c.outer is not None:
        return None
    if len(c.m_axes) != 1 or len(c.n_axes) != 1 or len(c.k_axes) != 1:
        return None
    tx, ty = facts.dtype_of(c.x), facts.dtype_of(c.y)
    if tx is None or tx is not ty or tx.name not in ("fp16", "bf16"):
        return None
    sizes = {**facts.sizes, c.k_axes[0].name: c.k_axes[0].size}
    dims = [sizes[a] for a in (c.m_axes[0], c.n_axes[0], c.k_axes[0].name)]
    x = _operand(region, c.x, c.m_axes[0], c.k_axes[0].name, c.batch, False, sizes)
    if x is None and not c.batch:
        x = _head_operand(region, c.x, c.m_axes[0], c.k_axes[0].name, sizes)
    y = _operand(region, c.y, c.n_axes[0], c.k_axes[0].name, c.batch, True, sizes)
    if x is None or y is None:
        return None
    align = tuple(dict.fromkeys(o.cols for o in (x, y) if Expr.lift(o.cols).as_int() is None))
    return Sm90Gemm(x, y, *dims, prod([sizes[a] for a in c.batch]) if c.batch else 1, tx.name, align)


#: CTAs that fill a Hopper GPU once (an H100 SXM or H200 has 132 SMs, one 128x128 CTA each)
FILL_CTAS = 132

#: split-K (``Plan.split_k``): a problem of known sizes whose output tiles are at most half FILL_CTAS (the SMs of an
#: H100 or H200) splits its K tiles among up to MAX_SPLIT_K CTAs a tile, toward FILL_CTAS CTAs, each over at least
#: MIN_SPLIT_TILES K tiles (ResNet-50's last convs at batch 1: 8 output tiles over K = 4608); ``KUMIKO_SPLIT_K`` lowers
#: the cap
MAX_SPLIT_K = 16
MIN_SPLIT_TILES = 4


#: the SM90 skeleton's least K tiles a split: on an H100 a 128 x 3072 -> 768 projection (24 tiles of 64x64) ran
#: 0.017 ms split 3 ways (16 K tiles a split), 0.020 unsplit, 0.020 split 4 ways and 0.022 6 ways; 128 x 768 -> 768
#: ran fastest unsplit (bench/RESULTS.md, 2026-11-26 17:32)
SM90_MIN_SPLIT_TILES = 16


def split_k_for(tiles: int | None, k: int | None, bk: int, min_tiles: int = MIN_SPLIT_TILES) -> int:
    """The chooser's K split for ``tiles`` output tiles (batch included) over K = ``k`` in BK-wide K tiles, each
    split over at least ``min_tiles`` of them (1: none)."""
    if tiles is None or k is None or 2 * tiles > FILL_CTAS:
        return 1
    return max(1, min(-(-FILL_CTAS // tiles), -(-k // bk) // min_tiles, knobs.split_k(MAX_SPLIT_K)))




def choose_sm90_plan(region: Region, g: Sm90Gemm, c: Contraction) -> Plan:
    """A large GEMM (sizes unknown, or at least FILL_CTAS tiles of 128x256): 128x256 tiles, 4 stages, persistent
    when it has no batch axes - the fastest of the sweep on an H200 (fp16 4096^3 592 TFLOP/s against 521 for
    128x128, 8192^3 669 against 553; bench/RESULTS.md). Otherwise 128x128 tiles (two consumer warpgroups),
    halved - N first, then M - while the sizes give fewer CTAs than the GPU has SMs: a transformer's projection at
    128 tokens (128 x 768) gets 24 CTAs of 64x64, not 6, and still too few CTAs over a long K split it
    (``split_k_for`` with SM90_MIN_SPLIT_TILES: BERT's FFN output projection, 128 x 3072 -> 768, runs 3 CTAs a tile
    of 16 K tiles each)."""
    m, n = Expr.lift(g.m).as_int(), Expr.lift(g.n).as_int()
    b = Expr.lift(g.batch).as_int()
    known = None not in (m, n, b)

    def ctas(bm: int, bn: int) -> int:
        return -(-m // bm) * -(-n // bn) * b
    if not known or (n >= 256 and ctas(128, 256) >= FILL_CTAS):
        plan = sm90_plan(region, c, 128, 256, 4)
        persistent = not c.batch
        return plan.with_(async_={**dict(plan.async_), "epilogue_overlap": persistent}) if persistent else plan
    bm = 64 if m < 128 else 128
    bn = 64 if n <= 64 else 128
    while ctas(bm, bn) < FILL_CTAS and (bm, bn) != (64, 64):
        bn, bm = (64, bm) if bn > 64 else (bn, 64)
    k = Expr.lift(g.k).as_int()
    split = split_k_for(ctas(bm, bn), k, SM90_BK, SM90_MIN_SPLIT_TILES)
    stages = 4
    if k is not None and ctas(bm, bn) * split <= FILL_CTAS:
        # one wave: a CTA a SM whatever its shared memory, so the ring takes as many of the CTA's K tiles as fit
        kt = -(-k // SM90_BK)
        per = -(-kt // split)
        stages = max(4, min(SM90_STAGES[-1], per, SMEM_LIMIT["sm90"] // ((bm + bn) * SM90_BK * 2)))
    return sm90_plan(region, c, bm, bn, stages).with_(split_k=split)


def sm90_plan(region: Region, c: Contraction, bm: int, bn: int, stages: int) -> Plan:
    return make_plan(
        "sm90", tile=(bm, bn, SM90_BK), stages=stages, warp_tile=f"64x{bn}",
        bind={"n.o": "block.x", "m.o": "block.y", "batch": "block.z", "m.i.o": "warpgroup"},
        cache=({"tensor": "x", "where": "smem", "at": "k.o", "stages": stages},
               {"tensor": "y", "where": "smem", "at": "k.o", "stages": stages}),
        predicate_tail=tuple(c.m_axes + c.n_axes), epilogue=tuple(epilogue(region)),
        algo_choice={"contraction": "wgmma"},
        local_edges=({"from": c.let, "to": "epilogue", "buffer": "reg" if c.pointwise else "gmem"},),
        async_={"enable": True, "prefetch_depth": stages, "epilogue_overlap": False, "producer": "tma",
                "wgmma_in_flight": 1},
        barrier_model="mbarrier", threads=128 * (1 + bm // 64))


def validate_sm90_plan(plan: Plan, region: Region, facts: RegionFacts, smem_limit: int) -> Plan:
    """E1801 unless the wgmma plan fits the region (``sm90_operands``) and the skeleton's shapes."""
    at = f"plan of {region.name}"
    if plan.arch != "sm90":
        raise KumikoError("E1801", at=at, why=f"a wgmma plan needs arch sm90, not {plan.arch!r}")
    if sm90_operands(region, facts, facts.contraction) is None:
        raise KumikoError("E1801", at=at, why="the SM90 GEMM skeleton needs one M, N and K axis, a pointwise "
                          "epilogue and fp16/bf16 row-major operands TMA can describe (rows a "
                          "multiple of 16 bytes)", suggestion='use algo_choice {"contraction": "mma"}')
    if len(plan.tile) != 3:
        raise KumikoError("E1801", at=at, why="a wgmma plan needs a CTA tile [BM, BN, 64]")
    bm, bn, bk = plan.tile
    if bm not in (64, 128) or bn not in (64, 128, 192, 256) or bk != SM90_BK:
        raise KumikoError("E1801", at=at, why=f"tile {list(plan.tile)}: the SM90 skeleton takes BM 64 or 128 (64 "
                          "rows a consumer warpgroup), BN 64..256 in steps of 64 and BK 64",
                          suggestion="e.g. tile [128, 128, 64]")
    if plan.get("async_", "wgmma_in_flight", 1) not in (0, 1):
        raise KumikoError("E1801", at=at, why=f"async_.wgmma_in_flight={plan.get('async_', 'wgmma_in_flight')!r}: "
                          "the consumers keep 0 or 1 wgmma groups pending past each k tile's wait",
                          suggestion="1 (the default) or 0")
    if plan.get("async_", "epilogue_overlap", False) not in (False, True):
        raise KumikoError("E1801", at=at, why=f"async_.epilogue_overlap={plan.get('async_', 'epilogue_overlap')!r}: "
                          "true (a persistent kernel: CTAs stride over the tiles, the producer loads the next tile "
                          "while the consumers store this one) or false (a CTA a tile)", suggestion="true or false")
    split = plan.split_k
    if type(split) is not int or not 1 <= split <= 64 or (split > 1 and plan.get("async_", "epilogue_overlap", False)):
        raise KumikoError("E1801", at=at, why=f"split_k={split!r}: 1 to 64 CTAs an output tile, and 1 for a persistent "
                          "plan (async.epilogue_overlap)", suggestion="split_k 1")
    if plan.stages not in SM90_STAGES:
        raise KumikoError("E1801", at=at, why=f"stages={plan.stages}: the mbarrier ring has 2 to 8 stages")
    threads = 128 * (1 + bm // 64)
    if plan.threads not in (0, threads):
        raise KumikoError("E1801", at=at, why=f"threads={plan.threads}: a {bm}-row tile runs {threads} threads (a "
                          "producer warpgroup and one consumer warpgroup per 64 rows)", suggestion=f"threads {threads}")
    smem = plan.stages * (bm + bn) * bk * 2
    if smem > smem_limit:
        raise KumikoError("E1801", at=at, why=f"the ring needs {smem} bytes of shared memory, sm90 has {smem_limit}",
                          suggestion="use fewer stages or a smaller tile")
    return plan
