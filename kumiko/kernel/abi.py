"""The ABI between generated kernels and the runtime: which size symbols a kernel receives and in what order,
and which buffers each call gets. The code generators (``render``) and the runtime both read it here, so
``syms[k]`` and ``bufs[k]`` mean the same on both sides.

Every kernel is ``int NAME(void** bufs, const long long* syms)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kumiko.region.ssa import Program
from kumiko.symbolic import Expr


def program_symbols(program: Program) -> tuple[str, ...]:
    """The size symbols a program's kernels receive, in ABI order (sorted by name).

    Every size symbol in any MemRef shape (program inputs, outputs, buffers, region inputs and outputs)
    and in any region's iteration sizes. The code generator and the runtime both use this function, so
    ``syms[k]`` means the same symbol on both sides.
    """
    names: set[str] = set()

    def add(d) -> None:
        if not isinstance(d, int):
            names.update(Expr.lift(d).symbols())

    for _, m in (*program.inputs, *program.outputs, *program.buffers):
        for d in m.shape:
            add(d)
    for r in program.regions:
        for _, m in r.inputs:
            for d in m.shape:
                add(d)
        for o in r.outputs:
            for d in o.memref.shape:
                add(d)
        for a in r.iters:
            add(a.size)
    return tuple(sorted(names))


@dataclass(frozen=True)
class Step:
    """One call of a compiled program: the C function, the regions it runs (in order), and the names of
    the buffers it gets as ``bufs``, in ABI order."""
    fn: str
    regions: tuple
    buffers: tuple


def region_steps(program: Program, fn_names: Mapping[str, str]) -> tuple[Step, ...]:
    """One step per region: its inputs then its outputs."""
    return tuple(Step(fn_names[r.name], (r.name,), tuple(n for n, _ in r.inputs) + tuple(o.name for o in r.outputs))
                 for r in program.regions)
