"""One C translation unit for a whole Program: every region's kernel, with the vector types and the
micro-kernels its plans need. Deterministic: the same program and plans give byte-identical source."""
from __future__ import annotations

from kumiko.kernel.contract import lower_contraction_region, micro_kernel, vector_types
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.plan.plan import Plan
from kumiko.region.ssa import Program
from kumiko.render.c import render_program
from kumiko.runtime.program import program_symbols


def kernel_name(program: Program, k: int) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in program.regions[k].name)
    return f"kumiko_{k}_{safe}"


def render_cpu_program(program: Program, plans: dict[str, Plan]) -> tuple[str, dict[str, str], tuple]:
    """(C source, region name -> C function name, the syms order)."""
    syms = program_symbols(program)
    kernels, names, micros = [], {}, set()
    vw = 4
    for k, r in enumerate(program.regions):
        name = kernel_name(program, k)
        names[r.name] = name
        plan = plans[r.name]
        lo = CpuLowering(r, syms, name)
        kern = None
        if plan.algo == "packed":
            kern = lower_contraction_region(lo, plan)
            if kern is not None:
                micros.add((plan.micro[0], plan.micro[1], plan.vector_width))
                vw = plan.vector_width
        if kern is None:
            kern = CpuLowering(r, syms, name).lower()
        kernels.append(kern)
    extra = vector_types(vw) + "\n".join(micro_kernel(*m) for m in sorted(micros)) if micros else ""
    return render_program(kernels, extra), names, syms
