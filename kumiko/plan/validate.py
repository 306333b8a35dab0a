"""Checking a Plan against its region and the machine, with diagnostics (E1801 PlanMismatch).

A packed plan needs a contraction in the region, a ``register_block`` (MR, NR) whose NR is a whole number
of vectors, a ``cache_block`` (MC, NC, KC) of whole register blocks (MC % MR == 0, NC % NR == 0), and a
vector width the machine has; its ``k_blocks`` and ``bind.split`` must be rules the kernel knows
(``kumiko.plan.packed``, on any plan), and a plan that leaves them out gets ``"kc"`` and ``"m"``; a plan
that is not packed has neither (nothing reads them: a packed plan's file edited to another algorithm
keeps working), and the plan returned says so. A skinny plan needs a contraction and such a
``register_block``, but no ``cache_block`` (it runs all of K in one pass). A winograd plan needs a region that
is a 3x3 stride-1 convolution it computes (``kumiko.plan.winograd``: read off the region with the bound
params, ``constants``), a ``tile`` m of F(m x m, 3x3) it is built for that divides the output's rows and
columns, and a ``cache_block`` of (tile rows, whole NR panels of output channels, the input channels). Any
plan must be for this
machine's arch family (a CUDA plan cannot drive the CPU backend) and set only a CPU plan's fields
(``check_fields``).
"""
from __future__ import annotations

from kumiko.diagnostics import KumikoError
from kumiko.plan.choose import machine_arch, winograd_fit
from kumiko.plan.packed import K_BLOCKS, SPLITS
from kumiko.plan.plan import Plan, check_fields
from kumiko.plan.winograd import TRANSFORMS
from kumiko.region.analysis import analyze
from kumiko.region.ssa import Region


def validate(plan: Plan, region: Region, syms: tuple, features: dict, constants: frozenset = frozenset()) -> Plan:
    at = f"plan of {region.name}"
    arch, vw = machine_arch(features)
    if not plan.arch.startswith("cpu"):
        raise KumikoError("E1801", at=at, why=f"plan arch {plan.arch!r} is not a CPU arch (this machine: {arch})")
    check_fields(plan, at)
    if plan.vector_width > vw:
        raise KumikoError("E1801", at=at, why=f"vector width {plan.vector_width} exceeds this machine's {vw} floats",
                          suggestion=f"use a width of at most {vw} (arch {arch})")
    plan = _packed_rules(plan, at)
    if plan.algo not in ("packed", "skinny", "winograd"):
        return plan
    facts = analyze(region)
    if facts.contraction is None:
        raise KumikoError("E1801", at=at, why=f"a {plan.algo} plan needs a contraction (Reduce(sum) of a product) "
                          "and this region has none", suggestion="use algo_choice {\"region\": \"loops\"}")
    axis = plan.get("vectorize", "axis", None)
    if axis is not None and plan.lanes is None:
        raise KumikoError("E1801", at=at, why=f"vectorize.axis {axis!r}: a {plan.algo} plan's lanes hold the "
                          "contraction's M axes (\"m\") or its N axes (\"n\")",
                          suggestion='use "axis": "m" or "n", or leave it out for the region\'s own orientation')
    if plan.algo == "skinny":
        return _skinny(plan, at)
    if plan.algo == "winograd":
        return _winograd(plan, facts, vw, constants, at)
    if plan.register_block is None or plan.cache_block is None:
        raise KumikoError("E1801", at=at, why="a packed plan needs register_block {mr, nr} and cache_block "
                          "{mc, nc, kc}", suggestion=f'e.g. "register_block": {{"mr": 6, "nr": {2 * vw}}}, '
                          f'"cache_block": {{"mc": 120, "nc": {128 * vw}, "kc": 256}}')
    (mr, nr), (mc, nc, kc) = plan.register_block, plan.cache_block
    if mr < 1 or nr < 1 or nr % plan.vector_width:
        raise KumikoError("E1801", at=at, why=f"register_block mr={mr}, nr={nr}: both must be positive and nr a "
                          f"whole number of {plan.vector_width}-float vectors")
    if mc % mr or nc % nr or min(mc, nc, kc) < 1:
        raise KumikoError("E1801", at=at, why=f"cache_block mc={mc}, nc={nc} must be positive multiples of "
                          f"register_block mr={mr}, nr={nr} (and kc={kc} positive)",
                          suggestion=f"e.g. mc={mr * 20}, nc={nr * 64}")
    return plan


def _packed_rules(plan: Plan, at: str) -> Plan:
    """``k_blocks`` and ``bind.split``: known rules (E1801 otherwise); a packed plan that leaves them out gets
    the plain ones (``"kc"``, ``"m"``), a plan of another algorithm none (no kernel of its reads them)."""
    if plan.k_blocks is not None and plan.k_blocks not in K_BLOCKS:
        raise KumikoError("E1801", at=at, why=f"k_blocks {plan.k_blocks!r} is not one of {list(K_BLOCKS)}",
                          suggestion='"kc": blocks of at most cache_block.kc, "one": all of K at once, '
                          '"one_if_fits": all of K when the B panels fit in 2 MiB (tested at run time)')
    if plan.split is not None and plan.split not in SPLITS:
        raise KumikoError("E1801", at=at, why=f"bind.split {plan.split!r} is not one of {list(SPLITS)}",
                          suggestion='"m": threads split the rows, "n": the columns where that is as even, '
                          '"n_if_a_resident"/"n_if_small_a": "n" when A is at most 64 Ki/512 Ki floats')
    bind = {k: v for k, v in plan.bind if k != "split"}
    if plan.algo != "packed":
        return plan.with_(k_blocks=None, bind=bind) if plan.k_blocks or plan.split else plan
    if plan.k_blocks is None:
        plan = plan.with_(k_blocks="kc")
    if plan.split is None:
        plan = plan.with_(bind={**bind, "split": "m"})
    return plan


def _skinny(plan: Plan, at: str) -> Plan:
    """A skinny plan: a register_block whose NR is whole vectors, no cache_block (one pass over all of K)."""
    if plan.register_block is None or plan.cache_block is not None:
        raise KumikoError("E1801", at=at, why="a skinny plan needs register_block {mr, nr} and no cache_block",
                          suggestion=f'e.g. "register_block": {{"mr": 1, "nr": {8 * plan.vector_width}}}, '
                          '"cache_block": null')
    mr, nr = plan.register_block
    if mr < 1 or nr < 1 or nr % plan.vector_width:
        raise KumikoError("E1801", at=at, why=f"register_block mr={mr}, nr={nr}: both must be positive and nr a "
                          f"whole number of {plan.vector_width}-float vectors")
    return plan


def _winograd(plan: Plan, facts, vw: int, constants: frozenset, at: str) -> Plan:
    """A Winograd plan: the region a 3x3 stride-1 convolution it computes (``kumiko.plan.winograd``), the
    packed path's micro-tile, and blocks of whole tile rows and whole NR panels of output channels."""
    fit = winograd_fit(facts.contraction, facts, vw, constants, plan.lanes)
    if fit is None:
        raise KumikoError("E1801", at=at, why="a winograd plan needs a 3x3 convolution of stride 1 and dilation 1 "
                          "whose pixels (even rows and columns, channels-last, whole vectors of channels) are the "
                          "contraction's A side and whose weights are bound (pre-packed), with a pointwise epilogue",
                          suggestion='use algo_choice {"contraction": "packed"}')
    if plan.register_block is None or plan.cache_block is None:
        raise KumikoError("E1801", at=at, why="a winograd plan needs register_block {mr, nr} and cache_block "
                          "{mc: tile rows per block, nc: output channels per block, kc: the input channels}",
                          suggestion=f'e.g. "register_block": {{"mr": 6, "nr": {2 * vw}}}, "cache_block": '
                          f'{{"mc": 3, "nc": {8 * vw}, "kc": {fit[0].c}}}')
    (mr, nr), (mc, nc, kc) = plan.register_block, plan.cache_block
    m = plan.get("algo_choice", "tile", 2)
    g = fit[0]
    if m not in TRANSFORMS or g.image_rows % m or g.cols % m:
        raise KumikoError("E1801", at=at, why=f"algo_choice tile {m!r}: F(m x m, 3x3) is built for m in "
                          f"{sorted(TRANSFORMS)}, dividing the output's {g.image_rows} rows and {g.cols} columns",
                          suggestion='use "tile": 2 (even sizes) or 4 (multiples of 4)')
    if mr < 1 or nr < 1 or nr % plan.vector_width or mc < 1 or nc < 1 or nc % nr or kc != fit[0].c:
        raise KumikoError("E1801", at=at, why=f"register_block mr={mr}, nr={nr}, cache_block mc={mc}, nc={nc}, "
                          f"kc={kc}: nr whole vectors, mc >= 1 tile rows, nc a positive multiple of nr and kc the "
                          f"input channels ({fit[0].c})")
    return plan
