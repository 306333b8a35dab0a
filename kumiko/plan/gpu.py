"""Plans for the GPU (sm80 / sm90): choosing, validating, and feeding the ptxas report back.

A region whose structure holds a contraction (``find_contraction``) with 16-bit operands gets the MMA
skeleton: CTA tile (BM, BN, BK), a 2- or 3-stage cp.async ring, a warp tile of m16n8k16 MMAs, 16-byte
(8-half) vector loads, tail predicates on M, N and K, the epilogue SRNF names, barrier model
``cp_async_group``. The tile follows the problem: BN = 32 when N is a constant <= 32 (an attention
head), else 64; BM = 64 (128 when M and N are constants of at least 128); BK = 32. Every other region
(elementwise, row softmax/layernorm, pooling, fp32 contractions) gets the SIMT skeleton.

``validate_gpu_plan`` rejects a plan that cannot be instantiated (E1801) and ``check_resources`` rejects
one whose nvcc build spills or overflows shared memory, with the numbers from ptxas.
"""
from __future__ import annotations

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_mma import mma_operand_dtype, probe
from kumiko.kernel.gpu_verify import MAX_REGISTERS, SMEM_LIMIT
from kumiko.plan.plan import Plan, make_plan
from kumiko.region.srnf import epilogue
from kumiko.region.ssa import Program, Region
from kumiko.runtime.ptxas import KernelResources
from kumiko.symbolic import prod

GPU_ARCHS = ("sm80", "sm90")


def _const(x) -> int | None:
    return x if isinstance(x, int) else None


def choose_gpu_plan(region: Region, arch: str, syms: tuple) -> Plan:
    if arch not in GPU_ARCHS:
        raise KumikoError("E1801", at=f"plan of {region.name}", why=f"{arch!r} is not a GPU arch {GPU_ARCHS}")
    lo, c = probe(region, syms)
    dt = mma_operand_dtype(lo, c) if c is not None else None
    if c is None or dt is None:
        why = "no contraction" if c is None else "fp32 operands (mma.sync takes fp16/bf16)"
        return make_plan(arch, algo_choice={"region": "simt"}, threads=256, bind={"point": "thread"},
                         epilogue=tuple(epilogue(region)), layout_hints={"why_simt": why})
    m = _const(prod([lo.sizes[a] if a in lo.sizes else 1 for a in c.m_axes]))
    n = _const(prod([lo.sizes[a] for a in c.n_axes]))
    bn = 32 if n is not None and n <= 32 else 64
    bm = 128 if (m or 0) >= 128 and (n or 0) >= 128 else 64
    if c.outer is not None:
        ws = prod([a.size for a in c.outer.axes])
        while bm % ws:
            bm *= 2
    wm, wn = min(bm, 32), min(bn, 32)
    stages = 3
    buffer = "reg" if c.pointwise else "smem" if c.outer is not None else "gmem"
    return make_plan(
        arch, tile=(bm, bn, 32), stages=stages, warp_tile=f"{wm}x{wn}",
        bind={"n.o": "block.x", "m.o": "block.y", "batch": "block.z", "m.i.o": "warp.y", "n.i.o": "warp.x"},
        cache=({"tensor": "x", "where": "smem", "at": "k.o", "stages": stages},
               {"tensor": "y", "where": "smem", "at": "k.o", "stages": stages}),
        vectorize={"axis": "k", "width": 8},
        predicate_tail=tuple(c.m_axes + c.n_axes + tuple(a.name for a in c.k_axes)),
        epilogue=tuple(epilogue(region)), layout_hints={"smem_pad": 8, "C_stride": "row"},
        algo_choice={"contraction": "mma"}, local_edges=({"from": c.let, "to": "epilogue", "buffer": buffer},),
        async_={"enable": True, "prefetch_depth": stages - 1, "epilogue_overlap": False},
        barrier_model="cp_async_group", threads=(bm // wm) * (bn // wn) * 32)


def validate_gpu_plan(plan: Plan, region: Region, syms: tuple) -> Plan:
    """E1801 unless the plan fits the region, the MMA shape and the arch's budget."""
    at = f"plan of {region.name}"
    if plan.arch not in GPU_ARCHS:
        raise KumikoError("E1801", at=at, why=f"plan arch {plan.arch!r} is not a GPU arch {GPU_ARCHS}")
    if plan.algo != "mma":
        return plan
    lo, c = probe(region, syms)
    if c is None or mma_operand_dtype(lo, c) is None:
        raise KumikoError("E1801", at=at, why="an MMA plan needs a contraction with fp16/bf16 operands",
                          suggestion='use algo_choice {"region": "simt"}')
    if len(plan.tile) != 3 or not plan.warp_tile or "x" not in str(plan.warp_tile):
        raise KumikoError("E1801", at=at, why="an MMA plan needs tile=(BM, BN, BK) and warp_tile 'WMxWN'")
    bm, bn, bk = plan.tile
    wm, wn = (int(x) for x in str(plan.warp_tile).split("x"))
    if bm % wm or bn % wn or wm % 16 or wn % 16 or bk % 16:
        raise KumikoError("E1801", at=at, why=f"tile {plan.tile} / warp tile {plan.warp_tile} do not divide into "
                          "m16n8k16 MMAs (warp tile multiples of 16x16, BK a multiple of 16)",
                          suggestion="e.g. tile (64, 64, 32) with warp_tile 32x32")
    if plan.stages not in (2, 3, 4):
        raise KumikoError("E1801", at=at, why=f"stages={plan.stages}: the cp.async ring has 2 to 4 stages")
    threads = (bm // wm) * (bn // wn) * 32
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


def check_resources(plan: Plan, kernel: str, res: KernelResources, dynamic_smem: int) -> None:
    """Seed 001 §11: a kernel that spills, or whose shared memory passes the arch limit, is rejected."""
    at = f"kernel {kernel} ({res.arch})"
    if res.spill_stores or res.spill_loads:
        raise KumikoError("E1801", at=at, why=f"ptxas spills {res.spill_stores} bytes stored / {res.spill_loads} bytes "
                          f"loaded with {res.registers} registers (plan tile {plan.tile}, warp tile {plan.warp_tile})",
                          suggestion="use a smaller warp tile or tile", hazard="spill", registers=res.registers)
    limit = SMEM_LIMIT.get(plan.arch, SMEM_LIMIT["sm80"])
    if res.smem + dynamic_smem > limit:
        raise KumikoError("E1801", at=at, why=f"{res.smem} bytes static + {dynamic_smem} dynamic shared memory exceed "
                          f"{plan.arch}'s {limit}", suggestion="use fewer stages or a smaller tile", hazard="smem")


def choose_gpu_plans(program: Program, arch: str, syms: tuple) -> dict[str, Plan]:
    return {r.name: choose_gpu_plan(r, arch, syms) for r in program.regions}
