"""The ``cpu`` backend: plans (the chooser's, a cached tuned winner, the caller's, or tuned) -> loop nests and
contraction kernels -> C (one translation unit per distinct kernel) -> gcc, in parallel, each object cached
-> one library -> ctypes -> ``CpuProgram``.

``tune=True`` times the candidate plans of each region on random inputs at the graph's sizes (its
``symbols`` defaults, overridden by ``shapes``) and caches the winners. The Executable's bound params
(``comp.constants``: read-only arrays the caller passes as themselves) have their contraction panels packed
once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kumiko.backend import Backend, Options, override_plans
from kumiko.diagnostics import KumikoError
from kumiko.plan.choose import choose_plans
from kumiko.plan.cost import machine_from_features
from kumiko.plan.plan import Plan
from kumiko.plan.tune import cached_winner, median_time
from kumiko.plan.tune import tune as tune_plans
from kumiko.plan.validate import validate
from kumiko.region.form import GLOBAL_POOL_POINTS
from kumiko.region.ssa import Program
from kumiko.render.c import render_unit
from kumiko.render.cpu_program import CpuKernels, CpuSource, lower_cpu_kernels, render_cpu_kernels
from kumiko.runtime.cpu import UNIT_FLAGS, build_units, compiler_version, cpu_features, start_precompiled
from kumiko.runtime.cpu_artifact import CompiledCpu
from kumiko.runtime.program import CpuProgram, program_symbols
from kumiko.tiny.evaluate import bind_symbols
from kumiko.tiny.inputs import random_inputs
from kumiko.tiny.ir import TinyGraph
from kumiko.util.log import stage

#: how many reductions (contractions, softmax rows, pools) a program has at least for its compile to begin the
#: precompiled header before its Python stages (``CpuBackend.prepare``)
PCH_EARLY_REDUCES = 16


#: the ``layout`` option's values: ``auto`` (channels-last activations between a CNN's convolutions,
#: ``kumiko.frontend.layout``), ``as_given`` (the graph's own layouts)
LAYOUTS = ("auto", "as_given")


@dataclass(frozen=True)
class CpuOptions(Options):
    """The ``cpu`` target's options: ``Options``' and ``layout`` (``LAYOUTS``)."""
    layout: str = "auto"


class CpuBackend(Backend):
    name = "cpu"
    Options = CpuOptions       # plans, tune, shapes, layout
    notes = {"kernel": "loop nests", "source": "C", "binary": "gcc"}

    def channels_last(self, options: CpuOptions) -> bool:
        """Channels-last activations between a CNN's convolutions under ``layout="auto"``."""
        if options.layout not in LAYOUTS:
            raise KumikoError("E1010", at="compile (target cpu)", why=f"layout={options.layout!r} is not a layout "
                              "the cpu target knows", suggestion=f"use one of: {', '.join(LAYOUTS)}")
        return options.layout == "auto"

    def formation(self) -> dict:
        """R-pool on: a conv pooled whole over fewer than ``GLOBAL_POOL_POINTS`` pixels runs apart from its pool
        (fused, the pixels were the micro-kernel's lanes, 49 of 64); group axes split (a grouped conv runs as a
        group-batched GEMM: ``kumiko.region.groups``)."""
        return {"pool_points": GLOBAL_POOL_POINTS, "group_axes": True}

    def prepare(self, comp) -> None:
        """A program of at least ``PCH_EARLY_REDUCES`` reductions (a network: units enough for the build to
        want a precompiled header) has it begun now, beside the Python stages (``start_precompiled``); a
        small one does not spend a core on it."""
        tiny = comp.tiny if comp.tiny is not None else comp.frontend.tiny if comp.frontend is not None else None
        if tiny is not None and sum(n.uop == "REDUCE" for n in tiny.nodes.values()) >= PCH_EARLY_REDUCES:
            start_precompiled(render_unit([]), name=tiny.name)

    def choose_plans(self, comp) -> dict[str, Plan]:
        feats = cpu_features()
        return choose_cpu_plans(comp.tiny, comp.region, comp.options.plans, feats, comp.options.tune,
                                comp.options.shapes, frozenset(comp.constants or {}))

    def lower(self, comp) -> CpuKernels:
        return lower_cpu_kernels(comp.region, comp.plan, constants=frozenset(comp.constants or {}))

    def render(self, comp) -> CpuSource:
        return render_cpu_kernels(comp.kernel)

    def build(self, comp) -> CompiledCpu:
        return build_cpu(comp.tiny.name, comp.region, comp.plan, comp.source, comp.constants)

    def source_files(self, comp) -> dict[tuple, str | bytes]:
        return {("c",): comp.source.source}


def build_cpu(name: str, program: Program, plans: dict[str, Plan], c: CpuSource,
              constants: Mapping | None = None) -> CompiledCpu:
    """The library of ``c``'s units (cached per object) and the CpuProgram that runs it."""
    constants = dict(constants or {})
    with stage(f"gcc ({len(c.units)} units)"):
        module = build_units(c.units, name=name, aliases=c.aliases, prefix=c.prefix,
                             unit_extra=[UNIT_FLAGS.get(k, ()) for k in c.unit_kinds] if c.unit_kinds else None)
    return CompiledCpu(program, plans, c.source, module, CpuProgram(program, module, c.names, steps=c.steps,
                                                                    constants=constants))


def choose_cpu_plans(tiny: TinyGraph, program: Program, plans: Mapping[str, Plan] | None, feats: dict,
                     tune: bool = False, shapes: Mapping[str, int] | None = None,
                     constants: frozenset = frozenset()) -> dict[str, Plan]:
    """The plan of each region: the chooser's, a cached tuned winner, the caller's (validated), or tuned.
    ``constants``: the bound params (the chooser's plans say how their pre-packed operands run)."""
    syms = program_symbols(program)
    chosen = dict(choose_plans(program, syms, feats, constants))
    env = {**tiny.symbols, **(shapes or {})}
    compiler = compiler_version()
    machine = machine_from_features(feats)
    for r in program.regions:
        hit = cached_winner(r, chosen[r.name], env, machine, compiler)
        if hit is not None:
            try:
                chosen[r.name] = validate(hit, r, syms, feats, constants)
            except KumikoError:
                pass          # a stale cached plan (another machine, an older compiler): keep the default
    chosen = override_plans(program, chosen, plans, lambda p, r: validate(p, r, syms, feats, constants))
    if tune:
        def time_plans(trial: dict[str, Plan]) -> float:
            source = render_cpu_kernels(lower_cpu_kernels(program, trial))
            built = build_cpu(tiny.name, program, trial, source)
            ins = random_inputs(tiny, 0, shapes)
            bound = bind_symbols(tiny, ins, shapes)
            return median_time(lambda: built(ins, bound))
        chosen = tune_plans(program, chosen, env, feats, compiler, time_plans)
    return chosen
