"""The cost model and candidate plans (seed 001 §11), for the CPU.

``estimate(region, plan, env)`` is the roofline ``max(FLOPs / peak, bytes / bandwidth)`` plus penalties,
with FLOPs and bytes derived from the region itself: every arithmetic node counts once per point of
the iteration space it is evaluated at (reductions included), and bytes are the compulsory traffic of
the region's MemRefs (inputs read once, outputs written once) plus, for the packed contraction, the
re-reads the blocking implies (A re-read per N block, B per M block). Penalties: a micro-tile that
wastes lanes at the edges (padding fraction), and the uneven share of the busiest thread (the kernel
splits whole MR row panels or NR column panels between threads, whichever is more even).

``candidates(plan)`` varies the cache blocks of a packed plan (10-20 points), pruned by the STOP
conditions: the A block must fit in ~80% of L2, a B panel in ~80% of L1; a plan of one K block
(``k_blocks`` "one") varies into KC-sized blocks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kumiko.plan.plan import CacheBlock, Plan
from kumiko.region.srnf import children
from kumiko.region.ssa import Binary, Cast, Reduce, Region, RExpr, Select, Unary
from kumiko.symbolic import dim_eval


@dataclass(frozen=True)
class Machine:
    """Peak numbers of a CPU; ``measured`` ones come from ``kumiko bench`` style probes when known."""
    cores: int = 2
    vector_width: int = 8
    fma_per_cycle: int = 2
    ghz: float = 3.0
    bandwidth_gbs: float = 20.0
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024

    @property
    def peak_gflops(self) -> float:
        return self.cores * self.vector_width * 2 * self.fma_per_cycle * self.ghz


def machine_from_features(features: dict) -> Machine:
    return Machine(cores=int(features.get("cores", 1) or 1), vector_width=int(features.get("vector_width_f32", 4)))


def _points(axes, env) -> int:
    return math.prod(dim_eval(a.size, env) for a in axes) if axes else 1


def flops(region: Region, env: dict) -> int:
    """Arithmetic operations the region performs (a multiply-add in a reduction counts 2)."""
    iters = _points(region.iters, env)

    def count(e: RExpr, scale: int) -> int:
        if isinstance(e, Reduce):
            scale *= _points(e.axes, env)
            own = scale
        else:       # one operation per point for arithmetic; movement, reads and constants are free
            own = scale if isinstance(e, (Unary, Cast, Binary, Select)) else 0
        return own + sum(count(k, scale) for k in children(e))
    return sum(count(let.expr, iters) for let in region.lets)


def compulsory_bytes(region: Region, env: dict) -> int:
    total = 0
    for _, m in region.inputs:
        total += math.prod(dim_eval(d, env) for d in m.shape) * m.dtype.itemsize
    for o in region.outputs:
        total += math.prod(dim_eval(d, env) for d in o.memref.shape) * o.memref.dtype.itemsize
    return total


@dataclass(frozen=True)
class Estimate:
    seconds: float
    flops: int
    bytes: int
    penalty: float

    def to_json(self) -> dict:
        return {"est_ms": round(self.seconds * 1e3, 4), "flops": self.flops, "bytes": self.bytes,
                "penalty": round(self.penalty, 4)}


def estimate(region: Region, plan: Plan, env: dict, m: Machine, mnk: tuple | None = None) -> Estimate:
    f = flops(region, env)
    b = compulsory_bytes(region, env)
    penalty = 0.0
    eff = 0.15 if plan.algo == "loops" else 0.85        # generic loops rarely reach SIMD peak
    if plan.algo == "packed" and mnk is not None:
        mm, nn, kk = mnk
        mc, nc, kc = plan.cache_block
        mr, nr = plan.register_block
        b += 4 * (mm * kk * max(1, math.ceil(nn / nc)) + kk * nn * max(1, math.ceil(mm / mc)))
        waste = (math.ceil(mm / mr) * mr * math.ceil(nn / nr) * nr) / max(1, mm * nn) - 1
        # the kernel splits the rows (whole MR panels) or the NR panels between threads, whichever is more even
        imbalance = min(_uneven(math.ceil(mm / mr), m.cores), _uneven(math.ceil(nn / nr), m.cores))
        penalty = waste + imbalance
    t = max(f / (m.peak_gflops * 1e9 * eff), b / (m.bandwidth_gbs * 1e9)) * (1 + penalty)
    return Estimate(t, f, b, penalty)


def _uneven(units: int, cores: int) -> float:
    """How much longer than an even share the busiest of ``cores`` threads works on ``units`` equal units."""
    return (math.ceil(units / cores) * cores) / units - 1 if units else 0.0


def candidates(plan: Plan, m: Machine) -> list[Plan]:
    """Cache-block variants of a packed plan, pruned by the STOP conditions; the chosen one first."""
    if plan.algo != "packed":
        return [plan]
    mr, nr = plan.register_block
    out = [plan]
    for kc in (128, 192, 256, 384, 512):
        for mult in (8, 12, 16, 24):
            mc = mr * mult
            for nc in (nr * 64, nr * 128):
                if mc * kc * 4 > 0.8 * m.l2_bytes or kc * nr * 4 > 0.8 * m.l1_bytes:
                    continue                                  # STOP: blocks spill out of the caches
                # a plan of one K block varies into KC blocks (its KC is all of K, and "one" reads no KC)
                p = replace(plan, cache_block=CacheBlock(mc, nc, kc),
                            k_blocks="kc" if plan.k_blocks == "one" else plan.k_blocks)
                if p not in out:
                    out.append(p)
    return out[:20]
