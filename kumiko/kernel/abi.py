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
class Pack:
    """Panels of a constant operand that a step reads in place: packed by the C function ``fn`` (same ABI and
    ``bufs`` as its step) into the buffer ``buffer`` of ``floats`` floats (an Expr over the size symbols),
    from the constant inputs ``sources``. The runtime packs once per set of sizes while the call passes the
    Executable's own arrays for every source, and again for a call that passes others. ``consts``: the
    integer constants ``fn`` reads from one more buffer after the step's (int64; ``lift_constants`` in
    ``kumiko.render.cpu_program``)."""
    fn: str
    buffer: str
    floats: object
    sources: tuple
    consts: tuple = ()


@dataclass(frozen=True)
class Step:
    """One call of a compiled program: the C function, the regions it runs (in order), and the names of
    the buffers it gets as ``bufs``, in ABI order (a pre-packed operand's panels last, see ``Pack``)."""
    fn: str
    regions: tuple
    buffers: tuple
    packs: tuple = ()         # Pack, ...: the steps's pre-packed operands, in the order of their buffers


def region_steps(program: Program, fn_names: Mapping[str, str], fused: tuple = ()) -> tuple[Step, ...]:
    """One step per region: its inputs then its outputs; or per group of regions in ``fused`` (tuples of region
    names that one kernel runs): their inputs and outputs but the buffers handed inside the group, which are never
    allocated."""
    groups = {g[0]: g for g in fused}
    inside = {n for g in fused for n in g[1:]}
    by_name = {r.name: r for r in program.regions}
    steps = []
    for r in program.regions:
        if r.name in inside:
            continue
        rs = [by_name[n] for n in groups.get(r.name, (r.name,))]
        made = {o.name for x in rs[:-1] for o in x.outputs}
        ins = [n for x in rs for n, _ in x.inputs if n not in made]
        steps.append(Step(fn_names[r.name], tuple(x.name for x in rs),
                          tuple(dict.fromkeys(ins)) + tuple(o.name for o in rs[-1].outputs)))
    return tuple(steps)


@dataclass(frozen=True)
class Launch:
    """One GPU kernel launch: grid extents as symbolic sizes (``ceil(extent / tile)`` each), block, dynamic
    shared memory, and where each parameter comes from: ("buf", name) | ("scratch", var) | ("sym", name) |
    ("status", name) | ("counter", var). The CUDA lowering makes them; the emulator's and the device's runners read
    them."""
    region: str
    kernel: str
    grid: tuple                     # ((extent, tile), ...) x, y, z
    block: int
    smem: int
    args: tuple
    scratch: tuple = ()             # (var, axes sizes) the launch needs
    regions: tuple = ()             # the regions one fused launch runs (attention's pair), when more than one
    #: SM90 kernels: ("tmap", i) arguments are tensor maps ``maps[i]`` = (TensorMapDesc, buffer name), encoded at the
    #: sizes ``map_sizes`` ((scalar, value), ...); ("int", value) arguments are int scalars
    maps: tuple = ()
    map_sizes: tuple = ()
    #: (extents, run): the launch runs only when whether every extent is a multiple of 8 (TMA's 16-byte rows of
    #: 16-bit elements) is ``run``; () always
    guard: tuple = ()
    #: a persistent kernel: CTAs a multiprocessor runs at once (0: one CTA per tile); it is launched with
    #: min(tiles, that x the device's SMs) CTAs in x, each striding over the tiles ``grid`` counts
    persistent: int = 0
    #: (var, sizes): int32 words the launch's kernel leaves zero (split-K's per-tile counters, ``gpu_ir.SplitK``); the
    #: runtime zeroes them once when it allocates them, like scratch keyed by region
    counters: tuple = ()

    def dims(self, env, sms: int) -> tuple[int, int, int]:
        """The grid at bound sizes on a device of ``sms`` multiprocessors."""
        from kumiko.symbolic import dim_eval
        grid = tuple(-(-dim_eval(e, env) // t) for e, t in self.grid)
        if not self.persistent:
            return grid
        tiles = grid[0] * grid[1] * grid[2]
        return (min(tiles, self.persistent * sms), 1, 1) if tiles else (0, 1, 1)

    def runs(self, env) -> bool:
        from kumiko.symbolic import dim_eval
        if not self.guard:
            return True
        extents, run = self.guard
        return all(dim_eval(e, env) % 8 == 0 for e in extents) == run

    def to_json(self) -> dict:
        out = {"region": self.region, "kernel": self.kernel, "grid": [[str(e), t] for e, t in self.grid],
               "block": self.block, "smem": self.smem, "args": [list(a) for a in self.args]}
        if self.regions:
            out["regions"] = list(self.regions)
        if self.guard:
            out["guard"] = {"multiples_of_8": [str(e) for e in self.guard[0]], "run": self.guard[1]}
        if self.persistent:
            out["persistent"] = {"ctas_per_sm": self.persistent}
        if self.counters:
            out["counters"] = [[v, [str(d) for d in sizes]] for v, sizes in self.counters]
        if self.maps:
            out["maps"] = [{"name": d.name, "buffer": buf, "box": list(d.box), "swizzle": d.swizzle}
                           for d, buf in self.maps]
        return out
