"""The ``cpu`` target: regions -> plans -> loop nests -> C (one translation unit per distinct kernel) ->
gcc, in parallel, each object cached -> one library -> ctypes -> CpuProgram.

``CompiledCpu`` keeps every intermediate (the region Program, the plans, the C source) so dumps, tests
and ``kumiko explain`` can show what runs. ``source`` is the whole program as one translation unit (each
distinct kernel once); the library is built from the same kernels split into units (``build_units``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.plan.choose import choose_plans
from kumiko.plan.cost import machine_from_features
from kumiko.plan.plan import Plan
from kumiko.plan.tune import cached_winner, median_time
from kumiko.plan.tune import tune as tune_plans
from kumiko.plan.validate import validate
from kumiko.region import form_regions
from kumiko.region.ssa import Program
from kumiko.render.cpu_program import render_cpu_source
from kumiko.runtime.cpu import CModule, build_units, compiler_version, cpu_features, load_library
from kumiko.runtime.program import CpuProgram, program_symbols
from kumiko.tiny.evaluate import bind_symbols
from kumiko.tiny.inputs import random_inputs
from kumiko.tiny.ir import TinyGraph
from kumiko.util.log import stage


@dataclass
class CompiledCpu:
    program: Program
    plans: dict[str, Plan]
    source: str
    module: CModule
    runner: CpuProgram

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        return self.runner(inputs, env)


def _build(tiny: TinyGraph, program: Program, plans: dict[str, Plan],
           constants: Mapping[str, np.ndarray] | None = None) -> CompiledCpu:
    constants = dict(constants or {})
    with stage("render C"):
        c = render_cpu_source(program, plans, constants=frozenset(constants))
    with stage(f"gcc ({len(c.units)} units)"):
        module = build_units(c.units, name=tiny.name, aliases=c.aliases, prefix=c.prefix)
    return CompiledCpu(program, plans, c.source, module, CpuProgram(program, module, c.names, steps=c.steps,
                                                                    constants=constants))


def machine_key() -> tuple:
    """What a saved library needs of the machine that loads it: the ISA it was built for (-march=native)."""
    feats = cpu_features()
    return tuple(sorted((k, v) for k, v in feats.items() if k not in ("model", "cores")))


def save_state(c: CompiledCpu) -> dict:
    """What ``restore`` needs to run ``c`` again in another process without compiling: the region Program,
    the plans, the source, the steps and the library's bytes, with the machine they were built for."""
    return {"program": c.program, "plans": c.plans, "source": c.source, "steps": c.runner.steps,
            "library": c.module.path.read_bytes(), "machine": machine_key()}


def restore(state: dict, constants: Mapping[str, np.ndarray] | None = None) -> CompiledCpu | None:
    """A CompiledCpu from ``save_state``'s record, its library loaded as it is; None when this machine's ISA
    differs from the one it was built for (the caller compiles again)."""
    if state.get("machine") != machine_key():
        return None
    program, steps = state["program"], tuple(state["steps"])
    module = load_library(state["library"], name=program.name)
    names = {r: st.fn for st in steps for r in st.regions}
    runner = CpuProgram(program, module, names, steps=steps, constants=constants)
    return CompiledCpu(program, dict(state["plans"]), state["source"], module, runner)


def compile_cpu(tiny: TinyGraph, plans: Mapping[str, Plan] | None = None, features: dict | None = None,
                tune: bool = False, shapes: Mapping[str, int] | None = None,
                constants: Mapping[str, np.ndarray] | None = None) -> CompiledCpu:
    """Regions -> plans (a tuned winner from the cache when there is one) -> C -> module.

    ``tune=True`` times the candidate plans of each region on random inputs at the graph's sizes
    (its ``symbols`` defaults, overridden by ``shapes``) and caches the winners. ``constants``: inputs bound
    once (read-only arrays the caller passes as themselves): their contraction panels are packed once."""
    with stage("regions"):
        program = form_regions(tiny)
    with stage("plans"):
        chosen = _plans(tiny, program, plans, features or cpu_features(), tune, shapes)
    with stage("build (C, gcc)"):
        return _build(tiny, program, chosen, constants)


def _plans(tiny: TinyGraph, program: Program, plans: Mapping[str, Plan] | None, feats: dict, tune: bool,
           shapes: Mapping[str, int] | None) -> dict[str, Plan]:
    """``compile_cpu``'s plan of each region: the chooser's, a cached tuned winner, the caller's, or tuned."""
    chosen = dict(choose_plans(program, program_symbols(program), feats))
    env = {**tiny.symbols, **(shapes or {})}
    compiler = compiler_version()
    syms = program_symbols(program)
    machine = machine_from_features(feats)
    for r in program.regions:
        hit = cached_winner(r, chosen[r.name], env, machine, compiler)
        if hit is not None:
            try:
                chosen[r.name] = validate(hit, r, syms, feats)
            except KumikoError:
                pass          # a stale cached plan (another machine, an older compiler): keep the default
    for name, p in (plans or {}).items():
        region = next((r for r in program.regions if r.name == name), None)
        if region is None:
            raise KumikoError("E1801", at=f"plan of {name}", why=f"the program has no region {name!r}",
                              suggestion=f"regions: {[r.name for r in program.regions]}")
        chosen[name] = validate(p, region, syms, feats)
    if tune:
        def time_plans(trial: dict[str, Plan]) -> float:
            built = _build(tiny, program, trial)
            ins = random_inputs(tiny, 0, shapes)
            bound = bind_symbols(tiny, ins, shapes)
            return median_time(lambda: built(ins, bound))
        chosen = tune_plans(program, chosen, env, feats, compiler, time_plans)
    return chosen


def cpu_target(tiny: TinyGraph, plans: Mapping[str, Plan] | None = None, tune: bool = False,
               shapes: Mapping[str, int] | None = None,
               constants: Mapping[str, np.ndarray] | None = None) -> CompiledCpu:
    """The ``cpu`` target's factory (``kumiko.compiler``'s target table names it; ``compile`` passes the
    Executable's bound params as ``constants``)."""
    return compile_cpu(tiny, plans, tune=tune, shapes=shapes, constants=constants)
