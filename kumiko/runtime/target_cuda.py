"""The ``cuda-emu`` target: regions -> GPU plans -> GPU dialect IR (verified) -> one ``.cu`` -> the CUDA
emulator (g++), launched kernel by kernel with the runtime's buffers.

``compile_cuda(tiny, arch)`` gives a ``CompiledCuda`` that keeps every intermediate (Program, plans, GPU
IR, source, launches) for dumps, tests and the nvcc build check (``nvcc_check``); the same source is what
a GPU gets. ``kumiko.compile(g, "cuda-emu", emu="deferred" | "eager" | "asan")`` picks the emulator
configuration (docs/emulator.md: what each catches). Buffers - checked inputs, poisoned outputs, the
liveness-planned arena - come from ``CpuProgram``; scratch arrays for a contraction's accumulator (the
two-kernel regions) are allocated per run, NaN-poisoned.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import MmaKernel, SimtKernel
from kumiko.kernel.gpu_mma import lower_mma
from kumiko.kernel.gpu_simt import lower_simt
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.kernel.loops import STATUS_BAD_INDEX
from kumiko.plan.gpu import check_resources, choose_gpu_plan, validate_gpu_plan
from kumiko.plan.plan import Plan
from kumiko.region import form_regions
from kumiko.region.ssa import Program
from kumiko.render.cuda import render_cuda
from kumiko.runtime.arena import ALIGN
from kumiko.runtime.emu import CONFIGS, EmuConfig, EmuModule, build
from kumiko.runtime.program import CpuProgram, program_symbols, region_steps
from kumiko.symbolic import dim_eval, prod
from kumiko.tiny.ir import TinyGraph
from kumiko.util.files import safe_stem
from kumiko.util.log import enabled, log, stage

#: ``emu=`` option -> emulator configuration
EMU_CONFIGS = {"deferred": CONFIGS["deferred+round_robin"], "eager": CONFIGS["eager+run_ahead"],
               "asan": CONFIGS["asan"]}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: grid extents as symbolic sizes (``ceil(extent / tile)`` each), block, dynamic
    shared memory, and where each parameter comes from: ("buf", name) | ("scratch", var) | ("sym", name)."""
    region: str
    kernel: str
    grid: tuple                     # ((extent, tile), ...) x, y, z
    block: int
    smem: int
    args: tuple
    scratch: tuple = ()             # (var, axes sizes) the launch needs

    def to_json(self) -> dict:
        return {"region": self.region, "kernel": self.kernel, "grid": [[str(e), t] for e, t in self.grid],
                "block": self.block, "smem": self.smem, "args": [list(a) for a in self.args]}


@dataclass
class CompiledCuda:
    program: Program
    plans: dict[str, Plan]
    kernels: list
    source: str
    launches: list[Launch]
    arch: str
    emu: str = "deferred"
    _modules: dict = field(default_factory=dict)

    def module(self, emu: str | None = None) -> EmuModule:
        """The emulator build for a configuration (the two non-ASan ones share one library)."""
        cfg: EmuConfig = EMU_CONFIGS[emu or self.emu]
        key = "asan" if cfg.sanitize == "address" else "plain"
        if key not in self._modules:
            self._modules[key] = build(self.source, cfg, name=safe_name(self.program.name))
        return self._modules[key].with_config(cfg)

    def runner(self, emu: str | None = None) -> "GpuRunner":
        return GpuRunner(self.program, self.module(emu), self.launches)

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        return self.runner()(inputs, env)


def safe_name(name: str) -> str:
    """The program name as a build and file name (``files.safe_stem``: a graph name is user text)."""
    return safe_stem(name)


def check_status(status: int, program: str, env: Mapping[str, int]) -> None:
    """The kernels' status word after a run: an out-of-range gather index is E1015, as on the CPU."""
    if status == STATUS_BAD_INDEX:
        raise KumikoError("E1015", at=f"program {program}", why="a gather index is out of range for the tensor "
                          "it reads", suggestion="Pass indices within the gathered axis.", sizes=dict(env))
    if status:
        raise KumikoError("E1704", at=f"program {program}", why=f"a kernel reported status {status}",
                          sizes=dict(env))


def _buf_args(region, lowered_params) -> tuple:
    names = [n for n, _ in region.inputs] + [o.name for o in region.outputs]
    out = []
    for p in lowered_params:
        if p.name.startswith("s_") and not p.pointer:
            out.append(("sym", p.name[2:]))
        elif p.name.startswith("a_"):
            out.append(("scratch", p.name))
        elif p.name == "kk_status":
            out.append(("status", p.name))
        else:
            out.append(("buf", names[int(p.name[1:])]))
    return tuple(out)


def lower_program(program: Program, plans: Mapping[str, Plan]) -> tuple[list, list[Launch]]:
    """Every region's kernel(s) in launch order: the MMA skeleton (verified) for an MMA plan, plus a SIMT
    kernel for what follows a contraction when that is not an epilogue; the SIMT skeleton otherwise."""
    syms = program_symbols(program)
    kernels, launches = [], []
    for k, r in enumerate(program.regions):
        name = f"kumiko_{k}_" + "".join(ch if ch.isalnum() else "_" for ch in r.name)
        plan = plans[r.name]
        if plan.algo == "mma":
            low = lower_mma(r, syms, name, plan)
            kern = verify_mma(low.kernel)
            c = low.contraction
            lo_sizes = {a.name: a.size for a in r.iters}
            for a in c.k_axes + (c.outer.axes if c.outer is not None else ()):
                lo_sizes[a.name] = a.size
            bm, bn, _ = kern.tile
            grid = ((prod([lo_sizes[a] for a in c.n_axes]), bn), (prod([lo_sizes[a] for a in c.m_axes]), bm),
                    (prod([lo_sizes[a] for a in c.batch]) if c.batch else 1, 1))
            scratch = ()
            if low.scratch is not None:
                var, _, axes = low.scratch
                scratch = ((var, tuple(lo_sizes[a] for a in axes)),)
            kernels.append(kern)
            launches.append(Launch(r.name, name, grid, kern.threads, kern.smem_bytes, _buf_args(r, kern.params),
                                   scratch))
            if low.scratch is not None:
                var, let, axes = low.scratch
                rest = lower_simt(r, syms, name + "_rest", {let: ("array", var, axes)}, threads=256,
                                  bind=plan.get("bind", "rest.point", "thread"))
                kernels.append(rest)
                launches.append(Launch(r.name, rest.name, ((_simt_extent(r, rest), rest.points_per_block), (1, 1),
                                                           (1, 1)), rest.threads, 0, _buf_args(r, rest.params),
                                       scratch))
            continue
        kern = lower_simt(r, syms, name, threads=plan.threads or 256, bind=plan.get("bind", "point", "thread"))
        kernels.append(kern)
        launches.append(Launch(r.name, name, ((_simt_extent(r, kern), kern.points_per_block), (1, 1), (1, 1)),
                               kern.threads, 0, _buf_args(r, kern.params)))
    return kernels, launches


def _simt_extent(region, kern: SimtKernel):
    """The number of points a SIMT kernel's threads cover (its outer axes), as a symbolic size."""
    sizes = {a.name: a.size for a in region.iters}
    return prod([sizes[a] for a in kern.outer]) if kern.outer else 1


def compile_cuda(tiny: TinyGraph, arch: str = "sm80", plans: Mapping[str, Plan] | None = None,
                 emu: str = "deferred") -> CompiledCuda:
    if emu not in EMU_CONFIGS:
        raise KumikoError("E1501", at="cuda-emu", why=f"unknown emulator configuration {emu!r}",
                          suggestion=f"use one of {sorted(EMU_CONFIGS)}")
    with stage("regions"):
        program = form_regions(tiny)
    with stage("plans"):
        syms = program_symbols(program)
        chosen = {r.name: choose_gpu_plan(r, arch, syms) for r in program.regions}
        for name, p in (plans or {}).items():
            region = next((r for r in program.regions if r.name == name), None)
            if region is None:
                raise KumikoError("E1801", at=f"plan of {name}", why=f"the program has no region {name!r}",
                                  suggestion=f"regions: {[r.name for r in program.regions]}")
            chosen[name] = validate_gpu_plan(p, region, syms)
    with stage("kernels (GPU IR, CUDA C)"):     # the emulator builds on the first call, the cuda target now
        kernels, launches = lower_program(program, chosen)
        source = render_cuda(kernels)
    return CompiledCuda(program, chosen, kernels, source, launches, arch, emu)


def nvcc_check(compiled: CompiledCuda, arch: str = "sm_80") -> dict:
    """Compile the program's source with nvcc for ``arch`` and feed the ptxas report back to the plans:
    a kernel that spills or overflows shared memory raises E1801. Returns {kernel: KernelResources}."""
    from kumiko.runtime.ptxas import nvcc_compile
    res = nvcc_compile(compiled.source, arch, name=safe_name(compiled.program.name))
    for launch in compiled.launches:
        r = res.resources.get(launch.kernel)
        if r is None:
            raise KumikoError("E1701", at=launch.kernel, why=f"ptxas reported nothing for {launch.kernel}")
        check_resources(compiled.plans[launch.region], launch.kernel, r, launch.smem, launch.region)
    return res


class GpuRunner(CpuProgram):
    """Runs the launches of a CompiledCuda on the emulator with CpuProgram's buffer handling."""

    def __init__(self, program: Program, module: EmuModule, launches: list[Launch], *, poison: bool | None = None):
        # CpuProgram's state without its C module: the buffer logic (checks, poison, arena) is shared
        self.module = module
        self.setup(program, region_steps(program, {r.name: r.name for r in program.regions}), poison)
        self.launches = launches

    def input_align(self, m, dt) -> int:
        """The emulated kernels take vector loads (16 bytes) from inputs: the MemRef's alignment."""
        return max(ALIGN, m.alignment)

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        syms = dict(zip(self.symbols, self.syms(env)))
        with self.call_state() as state:         # this call's own arena and pools (calls may run in threads)
            bufs = self.buffers(inputs, env, state)
            # a region's accumulator scratch, shared by its two launches; keyed by region too, since every
            # region names its own ``a_out`` (one array shared across regions overflowed in the larger one)
            scratch: dict[tuple[str, str], np.ndarray] = {}
            status = np.zeros(1, np.int32)       # set by a kernel that met an out-of-range gather index
            timed = enabled(2)
            for ln in self.launches:
                for var, sizes in ln.scratch:
                    if (ln.region, var) not in scratch:
                        scratch[ln.region, var] = np.full(max(1, math.prod(dim_eval(s, env) for s in sizes)), np.nan,
                                               np.float32)
                grid = tuple(-(-dim_eval(e, env) // t) for e, t in ln.grid)
                if min(grid) == 0:
                    continue
                args = []
                for kind, name in ln.args:
                    if kind == "buf":
                        args.append(bufs[name])
                    elif kind == "scratch":
                        args.append(scratch[ln.region, name])
                    elif kind == "status":
                        args.append(status)
                    else:
                        args.append(np.int64(syms[name]))
                t0 = time.perf_counter()
                self.module.launch(ln.kernel, grid, ln.block, ln.smem, args)
                if timed:
                    log(2, f"cuda-emu {ln.kernel} grid {list(grid)} block {ln.block} smem {ln.smem}: "
                        f"{(time.perf_counter() - t0) * 1e3:.3f} ms")
            check_status(int(status[0]), self.program.name, env)
        return {n: bufs[n] for n, _ in self.program.outputs}


def cuda_emu_target(tiny: TinyGraph, plans: Mapping[str, Plan] | None = None, emu: str = "deferred",
                    arch: str = "sm80", tune: bool = False, shapes: Mapping[str, int] | None = None) -> CompiledCuda:
    """The ``cuda-emu`` target's factory. ``shapes`` (the sizes to tune for) is accepted and unused: the GPU
    plans are chosen from the ptxas report, not timed; ``tune=True`` is refused rather than ignored."""
    refuse_tune("cuda-emu", tune)
    return compile_cuda(tiny, arch, plans, emu)


def refuse_tune(target: str, tune: bool) -> None:
    if tune:
        raise KumikoError("E1010", at="--tune", why=f"autotuning times plans on the CPU; the {target} target "
                          "chooses its plans from the ptxas register report", suggestion="drop --tune, or use "
                          "--target cpu")


__all__ = ["compile_cuda", "nvcc_check", "CompiledCuda", "GpuRunner", "Launch", "MmaKernel", "SimtKernel"]
