"""Checking a Plan against its region and the machine, with diagnostics (E1801 PlanMismatch).

A packed plan needs a contraction in the region, a micro-tile whose NR is a whole number of vectors,
cache blocks that are whole micro-tiles (MC % MR == 0, NC % NR == 0), and a vector width the machine
has; any plan must be for this machine's arch family (a CUDA plan cannot drive the CPU backend).
"""
from __future__ import annotations

from kumiko.diagnostics import KumikoError
from kumiko.plan.choose import machine_arch
from kumiko.plan.plan import Plan
from kumiko.region.analysis import analyze
from kumiko.region.ssa import Region


def validate(plan: Plan, region: Region, syms: tuple, features: dict) -> Plan:
    at = f"plan of {region.name}"
    arch, vw = machine_arch(features)
    if not plan.arch.startswith("cpu"):
        raise KumikoError("E1801", at=at, why=f"plan arch {plan.arch!r} is not a CPU arch (this machine: {arch})")
    if plan.vector_width > vw:
        raise KumikoError("E1801", at=at, why=f"vector width {plan.vector_width} exceeds this machine's {vw} floats",
                          suggestion=f"use a width of at most {vw} (arch {arch})")
    if plan.algo != "packed":
        return plan
    if analyze(region).contraction is None:
        raise KumikoError("E1801", at=at, why="a packed plan needs a contraction (Reduce(sum) of a product) and "
                          "this region has none", suggestion="use algo_choice {\"region\": \"loops\"}")
    if len(plan.micro) != 2 or len(plan.tile) != 3:
        raise KumikoError("E1801", at=at, why="a packed plan needs micro=(MR, NR) and tile=(MC, NC, KC)")
    (mr, nr), (mc, nc, kc) = plan.micro, plan.tile
    if nr % plan.vector_width:
        raise KumikoError("E1801", at=at, why=f"NR={nr} is not a whole number of {plan.vector_width}-float vectors")
    if mc % mr or nc % nr or min(mr, nr, mc, nc, kc) < 1:
        raise KumikoError("E1801", at=at, why=f"blocks MC={mc}, NC={nc} must be positive multiples of MR={mr}, "
                          f"NR={nr}", suggestion=f"e.g. MC={mr * 20}, NC={nr * 64}")
    return plan
