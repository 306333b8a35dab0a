"""The ``cpu`` target's artifact: the region Program, the plans, the C source, the loaded library and the
``CpuProgram`` that runs it (``CompiledCpu``, made by ``kumiko.backend.cpu``), and what ``Executable.save``
keeps of it (``save_state``) and loads again without compiling (``restore``, on a machine of the same ISA).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from kumiko.plan.plan import Plan
from kumiko.region.ssa import Program
from kumiko.runtime.cpu import CModule, cpu_features, load_library
from kumiko.runtime.program import CpuProgram


@dataclass
class CompiledCpu:
    program: Program
    plans: dict[str, Plan]
    source: str
    module: CModule
    runner: CpuProgram

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        return self.runner(inputs, env)


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
