"""The ``cuda-emu`` target's runtime: the generated CUDA C run on the CPU through the CUDA emulator (g++),
launched kernel by kernel with the runtime's buffers.

``CompiledCuda`` is the cuda backend's artifact (``kumiko.backend.cuda``): the region Program, the plans,
the verified GPU IR, the ``.cu`` source and the launches, the emulator build made on the first call. The
same source is what a GPU gets (``cuda_program``), and ``nvcc_check`` compiles it with nvcc and feeds the
ptxas report back to the plans. ``kumiko.compile(g, "cuda-emu", emu="deferred" | "eager" | "asan")`` picks
the emulator configuration (docs/emulator.md: what each catches). Buffers - checked inputs, poisoned
outputs, the liveness-planned arena - come from ``CpuProgram``; scratch arrays for a contraction's
accumulator (the two-kernel regions) are allocated per run, NaN-poisoned.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.kernel.abi import Launch
from kumiko.kernel.loops import STATUS_BAD_INDEX
from kumiko.plan.gpu import check_resources
from kumiko.plan.plan import Plan
from kumiko.region.ssa import Program
from kumiko.runtime.arena import ALIGN
from kumiko.runtime.emu import CONFIGS, EmuConfig, EmuModule, build
from kumiko.runtime.program import CpuProgram, region_steps
from kumiko.runtime.tensormap import TensorMapArg
from kumiko.symbolic import dim_eval
from kumiko.util.files import safe_stem
from kumiko.util.log import enabled, log

#: the multiprocessors the emulator's launches assume: a persistent kernel gets this many CTAs (times its CTAs a
#: multiprocessor), few enough that each strides over several tiles at the tests' sizes
EMU_SMS = 2
#: ``emu=`` option -> emulator configuration
EMU_CONFIGS = {"deferred": CONFIGS["deferred+round_robin"], "eager": CONFIGS["eager+run_ahead"],
               "reversed": CONFIGS["eager+reversed"], "random": CONFIGS["deferred+random1"],
               "asan": CONFIGS["asan"]}


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
        """The emulator build for a configuration (the non-ASan ones share one library), run with the shared
        memory limit of the arch the plans were made for (sm_80's 163 KiB, sm_90's 227 KiB)."""
        cfg: EmuConfig = dataclasses.replace(EMU_CONFIGS[emu or self.emu], arch=self.arch)
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
        fused = tuple(ln.regions for ln in launches if ln.regions)       # a fused pair's P is never allocated
        self.setup(program, region_steps(program, {r.name: r.name for r in program.regions}, fused), poison)
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
            counters: dict[tuple[str, str], np.ndarray] = {}     # split-K's, zero (each launch leaves them so)
            status = np.zeros(1, np.int32)       # set by a kernel that met an out-of-range gather index
            timed = enabled(2)
            for ln in self.launches:
                for var, sizes in ln.scratch:
                    if (ln.region, var) not in scratch:
                        scratch[ln.region, var] = np.full(max(1, math.prod(dim_eval(s, env) for s in sizes)), np.nan,
                                               np.float32)
                for var, sizes in ln.counters:
                    if (ln.region, var) not in counters:
                        counters[ln.region, var] = np.zeros(max(1, math.prod(dim_eval(s, env) for s in sizes)),
                                                            np.int32)
                grid = ln.dims(env, EMU_SMS)
                if min(grid) == 0 or not ln.runs(env):
                    continue
                args = []
                ints = {n: dim_eval(e, env) for n, e in ln.map_sizes}     # an SM90 kernel's int scalars
                for kind, name in ln.args:
                    if kind == "buf":
                        args.append(bufs[name])
                    elif kind == "scratch":
                        args.append(scratch[ln.region, name])
                    elif kind == "status":
                        args.append(status)
                    elif kind == "counter":
                        args.append(counters[ln.region, name])
                    elif kind == "tmap":
                        desc, buf = ln.maps[name]
                        origin = desc.origin_bytes(ints) // bufs[buf].itemsize    # the map's first element
                        args.append(TensorMapArg(desc.encoding(ints), bufs[buf].reshape(-1)[origin:]))
                    elif kind == "int":
                        args.append(ints[name])
                    else:
                        args.append(np.int64(syms[name]))
                t0 = time.perf_counter()
                self.module.launch(ln.kernel, grid, ln.block, ln.smem, args)
                if timed:
                    log(2, f"cuda-emu {ln.kernel} grid {list(grid)} block {ln.block} smem {ln.smem}: "
                        f"{(time.perf_counter() - t0) * 1e3:.3f} ms")
            check_status(int(status[0]), self.program.name, env)
            for (region, var), words in counters.items():      # what the device's next launch would start from
                if words.any():
                    raise KumikoError("E1704", at=f"region {region}", why=f"the split-K counters {var} are not zero "
                                      f"after the launches ({int(np.count_nonzero(words))} of {words.size}): a tile's "
                                      "last CTA did not reset its counter, or not every split ran",
                                      suggestion="report this: it is a bug of the CUDA lowering")
        return {n: bufs[n] for n, _ in self.program.outputs}


__all__ = ["nvcc_check", "CompiledCuda", "GpuRunner", "Launch", "EMU_CONFIGS", "check_status"]
