"""The CUDA backends: ``cuda-emu`` (the generated CUDA C on the CPU through the emulator) and ``cuda`` (the
same source on a real GPU). They choose, lower and render alike - GPU plans, verified GPU dialect IR, one
``.cu`` and its launch list - and differ only in ``build`` and ``runner``: the emulator program (built with
g++ on the first call) or an nvcc cubin whose ptxas report is fed back to the plans (a chosen plan that
spills gets the next one down, ``replan``) and the device's ``CudaProgram``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from kumiko import knobs
from kumiko.backend import Backend, Options, override_plans, refuse_tune
from kumiko.diagnostics import KumikoError
from kumiko.kernel.abi import Launch, program_symbols
from kumiko.kernel.attention_pair import find_attention_pair, pair_attention
from kumiko.kernel.gpu_attention import lower_attention, pair_buffers
from kumiko.kernel.gpu_attention_sm90 import lower_attention_sm90
from kumiko.kernel.gpu_ir import SimtKernel, ir_json
from kumiko.kernel.gpu_mma import lower_mma
from kumiko.kernel.gpu_simt import lower_simt
from kumiko.kernel.gpu_sm90_gemm import lower_sm90_gemm, scalar_sizes
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.kernel.gpu_verify_attention import verify_attention
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from kumiko.plan.gpu import FUSED, STREAMING, choose_gpu_plan, fallback_gpu_plan, simt_threads, validate_gpu_plan
from kumiko.plan.plan import GPU_ARCHS, Plan
from kumiko.region.ssa import Program
from kumiko.render.cuda import render_cuda
from kumiko.runtime.emu_program import EMU_CONFIGS, CompiledCuda, safe_name
from kumiko.symbolic import Expr, prod
from kumiko.util.log import stage


@dataclass(frozen=True)
class CudaEmuOptions(Options):
    """``plans`` (``Options``; ``tune`` is refused: GPU plans come from the ptxas report, not timings;
    ``shapes`` is accepted and unused), ``emu``: the emulator configuration, ``arch``: the plans' arch."""
    emu: str = "deferred"
    arch: str = "sm80"

    def __post_init__(self):
        refuse_tune("cuda-emu", self.tune)
        if self.emu not in EMU_CONFIGS:
            raise KumikoError("E1501", at="cuda-emu", why=f"unknown emulator configuration {self.emu!r}",
                              suggestion=f"use one of {sorted(EMU_CONFIGS)}")


@dataclass(frozen=True)
class CudaOptions(Options):
    """``plans`` (as for cuda-emu), ``device`` (ordinal), ``gpu_arch`` (None: the device's, opened now; an arch
    such as ``sm_90a`` builds without a device), ``arch`` (the plans' arch; None: ``sm90`` for ``sm_90a``, else
    ``sm80``; ``sm80`` on Hopper keeps the mma.sync skeleton), ``poison``, ``sync_each``, ``cuda_graph`` (None:
    ``KUMIKO_CUDA_GRAPH``): see ``kumiko.runtime.cuda_program``."""
    device: int = 0
    gpu_arch: str | None = None
    arch: str | None = None
    poison: bool | None = None
    sync_each: bool = False
    cuda_graph: bool | None = None

    def __post_init__(self):
        refuse_tune("cuda", self.tune)
        if self.arch not in (None, *GPU_ARCHS):
            raise KumikoError("E1501", at="cuda", why=f"unknown plan arch {self.arch!r}",
                              suggestion=f"use one of {list(GPU_ARCHS)}, or leave it out")


@dataclass(frozen=True)
class GpuKernels:
    """The kernel stage of the CUDA backends: every kernel's GPU IR and the launches, in launch order."""
    kernels: list
    launches: list[Launch]


class CudaEmuBackend(Backend):
    name = "cuda-emu"
    Options = CudaEmuOptions
    notes = {"kernel": "GPU IR", "source": "CUDA C", "binary": "emulator, built on the first call"}

    def plan_arch(self, comp) -> str:
        return comp.options.arch

    def choose_plans(self, comp) -> dict[str, Plan]:
        program, arch = comp.region, self.plan_arch(comp)
        syms = program_symbols(program)
        chosen = {r.name: choose_gpu_plan(r, arch, syms) for r in program.regions}
        plans = override_plans(program, chosen, comp.options.plans, lambda p, r: validate_gpu_plan(p, r, syms))
        # an attention region pair (scores -> streaming softmax -> P @ V) whose plans are the chooser's runs fused
        return pair_attention(program, plans, arch, given=set(comp.options.plans or {}))

    def lower(self, comp) -> GpuKernels:
        return GpuKernels(*lower_program(comp.region, comp.plan))

    def render(self, comp) -> str:
        return render_cuda(comp.kernel.kernels)

    def compiled(self, comp) -> CompiledCuda:
        k = comp.kernel
        return CompiledCuda(comp.region, comp.plan, k.kernels, comp.source, k.launches, self.plan_arch(comp),
                            getattr(comp.options, "emu", "deferred"))

    def build(self, comp) -> Any:
        return self.compiled(comp)          # the emulator library is built on the first call

    def kernel_json(self, comp) -> dict:
        """The ``gpu_ir`` dump: every kernel's GPU IR under the chosen plans, and the launches."""
        return {"program": comp.region.name, "arch": self.plan_arch(comp),
                "kernels": [ir_json(k) for k in comp.kernel.kernels],
                "launches": [ln.to_json() for ln in comp.kernel.launches]}

    def source_files(self, comp) -> dict[tuple, str | bytes]:
        return {("cu",): comp.source}


@dataclass(frozen=True)
class GpuMachine:
    """What the cuda backend compiles for: the device (None when ``gpu_arch`` was given), the cubin's arch
    and the plans' arch."""
    device: Any
    gpu_arch: str
    plan_arch: str


class CudaBackend(CudaEmuBackend):
    name = "cuda"
    Options = CudaOptions
    notes = {"kernel": "GPU IR", "source": "CUDA C", "binary": "nvcc cubin"}

    def machine(self, comp) -> GpuMachine:
        """The device (opened now when no ``gpu_arch`` is given: E1501 without one) and the archs, once."""
        if comp.machine is None:
            from kumiko.runtime.cubin import check_arch
            from kumiko.runtime.cuda_driver import CudaDevice, plan_arch_for
            dev, gpu_arch = None, comp.options.gpu_arch
            if gpu_arch is None:
                dev = CudaDevice.get(comp.options.device)
                gpu_arch = dev.arch
            check_arch(gpu_arch)
            plan_arch = comp.options.arch or plan_arch_for(gpu_arch)
            if plan_arch == "sm90" and gpu_arch != "sm_90a":
                raise KumikoError("E1501", at="cuda", why=f"sm90 plans (wgmma, TMA) need an sm_90a cubin, not "
                                  f"{gpu_arch}", suggestion="use arch='sm80' on this GPU")
            comp.machine = GpuMachine(dev, gpu_arch, plan_arch)
        return comp.machine

    def plan_arch(self, comp) -> str:
        return self.machine(comp).plan_arch

    def build(self, comp) -> Any:
        from kumiko.runtime.cubin import build_cubin
        from kumiko.runtime.cuda_program import CompiledCudaGpu, check_cubin
        m, o = self.machine(comp), comp.options
        compiled = self.compiled(comp)
        with stage(f"nvcc ({m.gpu_arch} cubin)"):
            cubin = build_cubin(comp.source, m.gpu_arch, name=safe_name(comp.region.name))
        check_cubin(compiled, cubin, m.device.smem_optin if m.device is not None else None)
        graph = knobs.cuda_graph() if o.cuda_graph is None else bool(o.cuda_graph)
        return CompiledCudaGpu(compiled, cubin, device=m.device, ordinal=o.device, poison=o.poison,
                               sync_each=o.sync_each, cuda_graph=graph, constants=comp.constants)

    def replan(self, comp, error: KumikoError) -> dict[str, Plan] | None:
        """A plan the chooser made (never one the caller gave) that ptxas rejects gets the next plan down."""
        region = error.details.get("region")
        if error.code != "E1801" or region is None or region in (comp.options.plans or {}):
            return None
        nxt = fallback_gpu_plan(comp.plan[region], self.machine(comp).gpu_arch,
                                error.details.get("hazard", "resources"))
        if nxt is None:
            return None
        r = next(r for r in comp.region.regions if r.name == region)
        return {**comp.plan, region: validate_gpu_plan(nxt, r, program_symbols(comp.region))}

    def source_files(self, comp) -> dict[tuple, str | bytes]:
        cubin = comp.binary.cubin if comp.binary is not None else None
        return {("cu",): comp.source, **({(cubin.arch, "cubin"): cubin.data} if cubin is not None else {})}


def _buf_args(region, lowered_params, split=None) -> tuple:
    """The launch's arguments for a kernel's parameters: the region's buffers (``b<i>``), its size symbols
    (``s_``), scratch arrays (``a_``), the status word, and a split-K kernel's (``split``, gpu_ir.SplitK)
    workspace (scratch) and per-tile counters (zero between launches)."""
    names = [n for n, _ in region.inputs] + [o.name for o in region.outputs]
    out = []
    for p in lowered_params:
        if p.name.startswith("s_") and not p.pointer:
            out.append(("sym", p.name[2:]))
        elif p.name.startswith("a_") or (split is not None and p.name == split.workspace):
            out.append(("scratch", p.name))
        elif p.name == "kk_status":
            out.append(("status", p.name))
        elif split is not None and p.name == split.counters:
            out.append(("counter", p.name))
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
        if plan.algo in (STREAMING, FUSED):
            if plan.algo == STREAMING:
                kern, launch = _lower_pair(program, k, plans, syms, name)
                kernels.append(kern)
                launches.append(launch)
            continue
        _lower_region(r, syms, name, plan, kernels, launches)
    return kernels, launches


def _lower_pair(program: Program, k: int, plans: Mapping[str, Plan], syms: tuple, name: str):
    """The fused streaming attention kernel of regions ``k`` and ``k + 1`` and its one launch (grid: query blocks x
    batch points); E1801 when the plans pair regions that are not an attention pair."""
    r0 = program.regions[k]
    pair = find_attention_pair(program, k)
    nxt = plans[program.regions[k + 1].name] if k + 1 < len(program.regions) else None
    if pair is None or nxt is None or nxt.algo != FUSED:
        raise KumikoError("E1801", at=f"plan of {r0.name}", why=f"a {STREAMING} plan needs an attention region pair "
                          "(scores -> streaming softmax -> P @ V) whose consumer's plan is "
                          f'{{"region": "{FUSED}"}}', suggestion="let the chooser plan both regions")
    names = pair_buffers(pair)
    plan = plans[r0.name]
    c0, sizes = pair.c0, {a.name: a.size for a in r0.iters}
    grid = ((prod([sizes[a] for a in c0.m_axes]), plan.tile[0]),
            (prod([sizes[a] for a in c0.batch]) if c0.batch else 1, 1), (1, 1))
    args = tuple(("buf", n) for n in names) + tuple(("sym", s) for s in syms)
    regions = (r0.name, program.regions[k + 1].name)
    if plan.barrier_model == "mbarrier":            # the SM90 kernel: TMA maps over Q, K, V
        low = lower_attention_sm90(pair, plan, syms, name, names)
        kern = verify_sm90(low.kernel)
        return kern, Launch(r0.name, name, grid, kern.threads, kern.smem_bytes,
                            tuple(("tmap", i) for i in range(len(kern.maps))) + args,
                            maps=tuple(zip(kern.maps, low.map_bufs)), map_sizes=low.map_sizes, regions=regions)
    kern = verify_attention(lower_attention(program, pair, plan, syms, name, names))
    return kern, Launch(r0.name, name, grid, kern.threads, kern.smem_bytes, args, regions=regions)


def _lower_region(r, syms: tuple, name: str, plan: Plan, kernels: list, launches: list) -> None:
    """Append the region's kernel(s) and launches under ``plan``."""
    if plan.algo == "wgmma":        # the SM90 GEMM skeleton (kernel/gpu_sm90_gemm)
        _sm90_launch(r, syms, name, plan, kernels, launches)
        return
    if plan.algo == "mma":
        low = lower_mma(r, syms, name, plan)
        kern = verify_mma(low.kernel)
        c = low.contraction
        lo_sizes = {a.name: a.size for a in r.iters}
        for a in c.k_axes + (c.outer.axes if c.outer is not None else ()):
            lo_sizes[a.name] = a.size
        bm, bn, _ = kern.tile
        splits = kern.split.splits if kern.split else 1
        n, m = prod([lo_sizes[a] for a in c.n_axes]), prod([lo_sizes[a] for a in c.m_axes])
        batch = prod([lo_sizes[a] for a in c.batch]) if c.batch else 1
        grid = ((n, bn), (m, kern.m_rows), (batch * splits, 1))
        scratch = ()
        if low.scratch is not None:
            var, _, axes = low.scratch
            scratch = ((var, tuple(lo_sizes[a] for a in axes)),)
        counters = ()
        if kern.split:                  # a slab of BM x BN floats per output tile and split, a counter per tile
            tiles = (Expr.lift(n).ceildiv(bn), Expr.lift(m).ceildiv(bm), batch)
            scratch += ((kern.split.workspace, tiles + (splits * bm * bn,)),)
            counters = ((kern.split.counters, tiles),)
        kernels.append(kern)
        launches.append(Launch(r.name, name, grid, kern.threads, kern.smem_bytes,
                               _buf_args(r, kern.params, kern.split), scratch, counters=counters))
        if low.scratch is not None:
            _simt_rest(r, syms, name, plan, low.scratch, kernels, launches, scratch[:1])
        return
    kern = lower_simt(r, syms, name, threads=plan.threads or 256, bind=plan.get("bind", "point", "thread"))
    kernels.append(kern)
    launches.append(Launch(r.name, name, ((_simt_extent(r, kern), kern.points_per_block), (1, 1), (1, 1)),
                           kern.threads, 0, _buf_args(r, kern.params)))


def _simt_rest(r, syms: tuple, name: str, plan: Plan, acc: tuple, kernels: list, launches: list, scratch: tuple,
               guard: tuple = ()) -> None:
    """The SIMT kernel for what follows a contraction whose accumulator went to scratch ``acc`` (var, let, axes),
    and its launch (under the contraction's launch ``guard``)."""
    var, let, axes = acc
    point = plan.get("bind", "rest.point", "thread")
    rest = lower_simt(r, syms, name + "_rest", {let: ("array", var, axes)}, threads=256, bind=point)
    rest = replace(rest, threads=simt_threads(_simt_extent(r, rest), point))
    kernels.append(rest)
    launches.append(Launch(r.name, rest.name, ((_simt_extent(r, rest), rest.points_per_block), (1, 1), (1, 1)),
                           rest.threads, 0, _buf_args(r, rest.params), scratch, guard=guard))


def _sm90_launch(region, syms: tuple, name: str, plan: Plan, kernels: list, launches: list) -> None:
    """The SM90 GEMM kernel (verified) and its launch: the tensor maps, the int scalars, the region's buffers. When
    TMA's 16-byte rows depend on sizes known at run time only (``Sm90Gemm.align``), the region's SM80 kernel is built
    too, and the launches say which of the two runs (``Launch.guard``)."""
    low = lower_sm90_gemm(region, syms, name, plan)
    kern = verify_sm90(low.kernel)
    g, (bm, bn, _) = low.gemm, plan.tile
    sizes = scalar_sizes(g)
    args = (tuple(("tmap", i) for i in range(len(kern.maps))) + tuple(("int", n) for n, _ in sizes)
            + _buf_args(region, kern.params, low.split))
    maps = tuple((m, buf) for m, buf in zip(kern.maps, low.map_bufs))
    guard = (g.align, True) if g.align else ()
    kernels.append(kern)
    persistent = 1 if plan.get("async_", "epilogue_overlap", False) else 0    # one CTA an SM (__launch_bounds__)
    sizes_of = {a.name: a.size for a in region.iters}
    acc = () if low.scratch is None else ((low.scratch[0], tuple(sizes_of[a] for a in low.scratch[2])),)
    splits, counters, scratch = 1, (), acc
    if low.split is not None:       # a slab of BM x BN floats per output tile and split, a word per tile's thread
        splits = low.split.splits
        tiles = (Expr.lift(g.n).ceildiv(bn), Expr.lift(g.m).ceildiv(bm), g.batch)
        scratch += ((low.split.workspace, tiles + (splits * bm * bn,)),)
        counters = ((low.split.counters, tiles + (bm // 64 * 128,)),)      # a word per consumer thread
    z = g.batch if splits == 1 else Expr.lift(g.batch) * splits
    launches.append(Launch(region.name, name, ((g.n, bn), (g.m, bm), (z, 1)), kern.threads, kern.smem_bytes,
                           args, scratch, maps=maps, map_sizes=sizes, guard=guard, persistent=persistent,
                           counters=counters))
    if low.scratch is not None:         # the rest of the region on the SIMT kernel, from the accumulator's scratch
        _simt_rest(region, syms, name, plan, low.scratch, kernels, launches, acc, guard)
    if g.align:
        k0, l0 = len(kernels), len(launches)
        _lower_region(region, syms, name + "_sm80", choose_gpu_plan(region, "sm80", syms), kernels, launches)
        launches[l0:] = [replace(ln, guard=(g.align, False)) for ln in launches[l0:]]
        assert len(kernels) > k0


def _simt_extent(region, kern: SimtKernel):
    """The number of points a SIMT kernel's threads cover (its outer axes), as a symbolic size."""
    sizes = {a.name: a.size for a in region.iters}
    return prod([sizes[a] for a in kern.outer]) if kern.outer else 1
