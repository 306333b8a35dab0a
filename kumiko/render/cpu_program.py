"""One C translation unit for a whole Program: every region's kernel, with the vector types and the
micro-kernels its plans need. Deterministic: the same program and plans give byte-identical source.

A region whose deferred output feeds the next region's contraction row by row is run together with it
in one kernel (``kumiko.kernel.stream``); the returned ``Step``s say which function runs which regions
with which buffers."""
from __future__ import annotations

from kumiko.kernel.abi import Step, program_symbols
from kumiko.kernel.contract import lower_contraction_region
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.kernel.micro import micro_kernel, stage_micro_kernel, vector_types
from kumiko.kernel.stream import find_pipe, lower_pipe, pipe_buffers
from kumiko.plan.plan import Plan
from kumiko.region.ssa import Program
from kumiko.render.c import render_program


def kernel_name(program: Program, k: int) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in program.regions[k].name)
    return f"kumiko_{k}_{safe}"


def render_cpu_program(program: Program, plans: dict[str, Plan], fuse: bool = True
                       ) -> tuple[str, dict[str, str], tuple, tuple[Step, ...]]:
    """(C source, region name -> C function name, the syms order, the calls in execution order)."""
    syms = program_symbols(program)
    kernels, names, micros, rows_micros, stage_micros, steps = [], {}, set(), set(), set(), []
    vw = 4
    fused_into: set = set()
    for k, r in enumerate(program.regions):
        if r.name in fused_into:
            continue
        name = kernel_name(program, k)
        plan = plans[r.name]
        pipe = find_pipe(program, k, syms, plans) if fuse else None
        if pipe is not None:
            r1 = program.regions[k + 1]
            name = f"{name}__{kernel_name(program, k + 1).split('_', 2)[2]}"
            cname = {n: f"b{i}" for i, n in enumerate(pipe_buffers(pipe))}
            plan1 = plans[r1.name]
            kernels.append(lower_pipe(pipe, plan, plan1, syms, name, cname, r.notes + r1.notes))
            micros.add((plan.micro[0], plan.micro[1], plan.vector_width))
            rows_micros.add((plan1.micro[0], plan1.micro[1], plan1.vector_width))
            vw = plan.vector_width
            names[r.name] = names[r1.name] = name
            fused_into.add(r1.name)
            steps.append(Step(name, (r.name, r1.name), pipe_buffers(pipe)))
            continue
        names[r.name] = name
        steps.append(Step(name, (r.name,), tuple(n for n, _ in r.inputs) + tuple(o.name for o in r.outputs)))
        lo = CpuLowering(r, syms, name)
        kern = None
        if plan.algo == "packed":
            kern = lower_contraction_region(lo, plan)
            if kern is not None:
                micros.add((plan.micro[0], plan.micro[1], plan.vector_width))
                if lo.staged:
                    stage_micros.add((plan.micro[0], plan.micro[1], plan.vector_width))
                vw = plan.vector_width
        if kern is None:
            kern = CpuLowering(r, syms, name).lower()
        kernels.append(kern)
    kernels_c = [micro_kernel(*m) for m in sorted(micros)]
    kernels_c += [micro_kernel(*m, a_rows=True) for m in sorted(rows_micros)]
    kernels_c += [stage_micro_kernel(*m) for m in sorted(stage_micros)]
    extra = vector_types(vw) + "\n".join(kernels_c) if micros else ""
    return render_program(kernels, extra), names, syms, tuple(steps)
