"""The ``cuda`` target's runtime: the generated CUDA C on a real NVIDIA GPU through cuda-bindings' driver API.

The cuda backend (``kumiko.backend.cuda``) lowers exactly as for cuda-emu (plans, verified GPU IR, one
``.cu``, the launch list with grid/block/dynamic shared memory and where every parameter comes from), so the
GPU runs the source the emulator tests. Only the build and the launch differ:

1. ``cubin.build_cubin``: nvcc for the device's arch (``cuda_driver.arch_for_cc``: ``sm_80``-path code,
   ``sm_90a`` on Hopper), cached on disk; the ptxas report is fed back to the plans (``check_cubin``: a
   kernel that spills or whose shared memory passes the plan's or the device's limit raises E1801);
2. ``CudaProgram``: device buffers for the signature's inputs and outputs, one arena allocation for the
   Program's intermediates (``arena.plan_arena``), fp32 scratch for the two-kernel regions; outputs, arena
   and scratch poisoned with 0xFF bytes (NaN in every float dtype) before each run unless
   ``KUMIKO_SPEC=0``; ``cuLaunchKernel`` per launch with kernelParams packed from each kernel's ``Param``
   list (``pack_params``: 8-byte device pointers, scalars in their C type; an SM90 kernel's tensor maps,
   encoded by ``cuTensorMapEncodeTiled`` over the device buffers, and its int scalars first); one
   ``cuCtxSynchronize``. The Executable's params are copied to a set of buffers once (``Bound.resident``).

``kumiko.compile(g, "cuda", device=0, gpu_arch=None, sync_each=False, cuda_graph=None)``: with ``gpu_arch``
given the cubin is built without opening a device (the device is opened at the first call); ``sync_each``
waits after every launch, so a fault names its kernel exactly (also on with ``KUMIKO_DEBUG>=2``, which
prints each launch's time); ``cuda_graph`` (default: ``KUMIKO_CUDA_GRAPH=1`` in the environment) captures
the launches for each set of sizes once as a CUDA Graph and replays it (one driver call a run instead of
one per kernel). Without cuda-bindings, a driver or a device, compiling for ``cuda`` raises E1501.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.kernel.abi import Launch
from kumiko.plan.gpu import check_resources
from kumiko.region.ssa import MemRef
from kumiko.runtime.arena import plan_arena
from kumiko.runtime.cubin import Cubin, build_cubin, invalidate
from kumiko.runtime.cuda_driver import BAD_IMAGE, CudaDevice, cubin_runs_on
from kumiko.runtime.emu_program import CompiledCuda, check_status, safe_name
from kumiko.runtime.emu_worker import value_buffer
from kumiko.runtime.program import program_symbols
from kumiko.symbolic import dim_eval
from kumiko.tiny.inputs import check_array
from kumiko.util.log import enabled, log

POISON_BYTE = 0xFF
#: the launch limits every sm_80+ GPU has (cuLaunchKernel refuses more)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_THREADS = 1024
#: by-value parameter C types the renderer emits -> ctypes
SCALAR_CTYPES: dict[str, type] = {
    "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong, "long": ctypes.c_long,
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint, "short": ctypes.c_short,
    "float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool, "size_t": ctypes.c_size_t,
    "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
}


# ------------------------------------------------------------------------------------------------
# kernel parameters

def param_ctype(param) -> type:
    """The ctypes type of one kernel parameter as the generated signature declares it (a ``gpu_ir.Param``)."""
    if param.pointer:
        return ctypes.c_uint64                   # a device pointer: 8 bytes on every CUDA platform
    ct = SCALAR_CTYPES.get(" ".join(str(param.ctype).replace("const", " ").split()))
    if ct is None:
        raise KumikoError("E1703", at=param.name, why=f"by-value parameter type {param.ctype!r} has no ctypes mapping",
                          suggestion="A code generator change added a parameter type: add it to SCALAR_CTYPES.")
    return ct


#: launch-signature entries that are not a ``gpu_ir.Param``: an SM90 kernel's ``CUtensorMap`` (128 bytes by value,
#: encoded at bind time) and its int scalars, which come before its buffers
TMAP, INT = "tmap", "int"


def launch_params(kernel) -> list:
    """Every parameter of a kernel in launch order: ``TMAP`` per tensor map, ``INT`` per int scalar (SM90 kernels),
    then its ``gpu_ir.Param`` list."""
    return [TMAP] * len(getattr(kernel, "maps", ())) + [INT] * len(getattr(kernel, "scalars", ())) + list(kernel.params)


def pack_params(params: Sequence, values: Sequence[Any]) -> tuple[Any, list]:
    """cuLaunchKernel's ``kernelParams``: a ``void*[]`` whose entry i points at parameter i's value.

    ``params`` as ``launch_params`` gives them: a ``TMAP`` value is the map's 128 bytes (copied into a 64-byte
    aligned buffer), an ``INT`` an int. Returns the array and the ctypes values it points into; both must stay
    alive until the launch has been issued (the driver copies the values at launch time).
    """
    if len(params) != len(values):
        raise KumikoError("E1703", at="kernel parameters", why=f"{len(values)} values for {len(params)} parameters")
    keep = [value_buffer(v) if p == TMAP else ctypes.c_int(int(v)) if p == INT
            else param_ctype(p)(int(v) if p.pointer else v) for p, v in zip(params, values)]
    argv = (ctypes.c_void_p * max(1, len(keep)))(*[ctypes.addressof(k) for k in keep])
    return argv, keep


def launch_dims(ln: Launch, env: Mapping[str, int], sms: int = 1) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block of a launch for bound sizes on a device of ``sms`` multiprocessors (a persistent kernel's
    grid depends on it); E1703 past the hardware limits."""
    grid = ln.dims(env, sms)
    block = (int(ln.block), 1, 1)
    if any(g > m for g, m in zip(grid, MAX_GRID)) or not 0 < block[0] <= MAX_THREADS:
        raise KumikoError("E1703", at=ln.kernel, why=f"grid {list(grid)} / block {list(block)} exceed the GPU's "
                          f"limits (grid {list(MAX_GRID)}, {MAX_THREADS} threads)", sizes=dict(env),
                          suggestion="These sizes need a plan that maps more work to one block; use smaller sizes.")
    return grid, block


# ------------------------------------------------------------------------------------------------
# resources: the ptxas report fed back to the plans

def check_cubin(compiled: CompiledCuda, cubin: Cubin, smem_limit: int | None = None) -> None:
    """Every launched kernel is in the ptxas report, spills nothing and fits shared memory (the plan's arch
    limit, and ``smem_limit``, the device's opt-in maximum, when given); E1801 otherwise."""
    for ln in compiled.launches:
        res = cubin.resources.get(ln.kernel)
        if res is None:
            raise KumikoError("E1701", at=ln.kernel, why=f"ptxas reported nothing for {ln.kernel} ({cubin.arch})",
                              cubin=str(cubin.path))
        check_resources(compiled.plans[ln.region], ln.kernel, res, ln.smem, ln.region)
        if smem_limit is not None and res.smem + ln.smem > smem_limit:
            raise KumikoError("E1801", at=f"kernel {ln.kernel} ({cubin.arch})", hazard="smem", region=ln.region,
                              why=f"{res.smem} bytes static + {ln.smem} dynamic shared memory exceed this device's "
                              f"{smem_limit} bytes per block", suggestion="use fewer stages or a smaller tile")


# ------------------------------------------------------------------------------------------------
# running a compiled program


def _scratch_key(ln, var: str) -> str:
    """A region's accumulator scratch, shared by its two launches and by nothing else: every region names its
    own (``a_out``), so a key without the region handed a later, larger contraction an earlier one's array."""
    return f"scratch:{ln.region}:{var}"


def _counter_key(ln, var: str) -> str:
    """A region's split-K counters (``Launch.counters``)."""
    return f"counter:{ln.region}:{var}"


class Backend(Protocol):
    """What CudaProgram needs from a device: ``CudaDevice`` implements it."""

    smem_optin: int
    sm_count: int

    def alloc(self, nbytes: int, what: str) -> int: ...
    def free(self, ptr: int) -> None: ...
    def upload(self, ptr: int, arr: np.ndarray, what: str) -> None: ...
    def download(self, arr: np.ndarray, ptr: int, what: str) -> None: ...
    def fill(self, ptr: int, byte: int, nbytes: int, what: str) -> None: ...
    def set_dynamic_smem(self, fn: Any, kernel: str, nbytes: int) -> None: ...
    def encode_tensor_map(self, enc: Any, address: int, what: str) -> bytes: ...
    def launch(self, fn: Any, kernel: str, grid: tuple, block: tuple, smem: int, argv: Any) -> None: ...
    def capture(self, issue: Any, what: str) -> Any: ...
    def graph_launch(self, exe: Any, what: str) -> None: ...
    def graph_destroy(self, exe: Any) -> None: ...
    def sync(self, what: str, **details: Any) -> None: ...


@dataclass
class BoundLaunch:
    kernel: str
    fn: Any
    grid: tuple
    block: tuple
    smem: int
    argv: Any
    keep: list


@dataclass
class Bound:
    """Device buffers and packed launches for one set of symbol values (reused while the sizes stay)."""
    env: dict
    ptrs: dict[str, int] = field(default_factory=dict)          # buffer name / scratch var -> device address
    allocations: list[tuple[int, int, str]] = field(default_factory=list)   # (address, bytes, what)
    poison: list[tuple[int, int, str]] = field(default_factory=list)        # outputs, arena, scratch
    outputs: dict[str, tuple[tuple, np.dtype]] = field(default_factory=dict)
    launches: list[BoundLaunch] = field(default_factory=list)
    graph: Any = None                  # the launches captured as a CUDA Graph (``cuda_graph``), on first enqueue
    resident: dict = field(default_factory=dict)   # constant name -> the array its device buffer holds


def _nbytes(m: MemRef, env: Mapping[str, int]) -> tuple[tuple, int]:
    shape = tuple(dim_eval(d, env) for d in m.shape)
    return shape, math.prod(shape) * np.dtype(m.dtype.np).itemsize


class CudaProgram:
    """The launches of a CompiledCuda on a backend; call it like the evaluator: ``(inputs, env) -> outputs``.

    Thread-safe by a lock around each call: a ``Bound`` (the device buffers for one set of sizes: inputs,
    outputs, arena, scratch) is shared by every call at those sizes and freed when evicted, so two calls at
    once would overwrite each other's buffers or free the other's. The calls share one GPU and one stream,
    so serialising them costs little."""

    #: bound sizes kept at once (each holds device memory)
    KEEP_BOUND = 2

    def __init__(self, compiled: CompiledCuda, backend: Backend, functions: Mapping[str, Any], *,
                 poison: bool | None = None, sync_each: bool = False, graph: bool = False,
                 constants: Mapping[str, np.ndarray] | None = None):
        self.compiled, self.program, self.backend = compiled, compiled.program, backend
        # the Executable's bound params (read-only arrays of its own): a call that passes one of them as itself
        # finds it on the device already, once a Bound has it (``upload``)
        self.constants = {k: v for k, v in (constants or {}).items() if not v.flags.writeable}
        self.poison, self.sync_each, self.graph = poison, sync_each, graph
        self.symbols = program_symbols(self.program)
        # the intermediates some launch passes: a buffer handed inside one fused launch (attention's P) gets none
        used = {name for ln in compiled.launches for kind, name in ln.args if kind == "buf"}
        self._launched = dataclasses.replace(self.program, buffers=tuple(b for b in self.program.buffers
                                                                          if b[0] in used))
        self.params = {k.name: launch_params(k) for k in compiled.kernels}
        missing = [ln.kernel for ln in compiled.launches if ln.kernel not in functions or ln.kernel not in self.params]
        if missing:
            raise KumikoError("E1703", at=f"program {self.program.name}",
                              why=f"no loaded function for kernels {missing}")
        self.functions = dict(functions)
        for ln in compiled.launches:
            if len(ln.args) != len(self.params[ln.kernel]):
                raise KumikoError("E1703", at=ln.kernel, why=f"the launch passes {len(ln.args)} arguments, the kernel "
                                  f"takes {len(self.params[ln.kernel])}")
            for (kind, name), p in zip(ln.args, self.params[ln.kernel]):
                if isinstance(p, str):
                    fits, what = kind == p, p
                else:
                    fits, what = (kind in ("buf", "scratch", "status", "counter")) == bool(p.pointer), \
                        f"{p.name} ({p.ctype}{'*' if p.pointer else ''})"
                if not fits:
                    raise KumikoError("E1703", at=ln.kernel, why=f"argument {kind} {name!r} does not fit parameter "
                                      f"{what}")
        smem: dict[str, int] = {}
        for ln in compiled.launches:
            smem[ln.kernel] = max(smem.get(ln.kernel, 0), ln.smem)
        for kernel, nbytes in smem.items():
            if nbytes > backend.smem_optin:
                raise KumikoError("E1801", at=f"kernel {kernel}", hazard="smem", why=f"{nbytes} bytes of dynamic "
                                  f"shared memory, the device allows {backend.smem_optin} per block",
                                  suggestion="use fewer stages or a smaller tile")
            if nbytes:
                # the default limit is 48 KiB less the kernel's static shared memory (split-K's flag word): a 48 KiB
                # ring failed to launch (ResNet-50 on an H100), so every kernel with a ring states its own
                backend.set_dynamic_smem(self.functions[kernel], kernel, nbytes)
        self._bound: OrderedDict[tuple, Bound] = OrderedDict()
        self._call_lock = threading.Lock()

    # -- buffers ----------------------------------------------------------------------------------
    def syms(self, env: Mapping[str, int]) -> dict[str, int]:
        try:
            return {s: int(env[s]) for s in self.symbols}
        except KeyError as e:
            raise KumikoError("E1014", at=f"program {self.program.name}", why=f"size symbol {e.args[0]} has no "
                              "value", suggestion="Bind it through an input's shape (or give it in env).") from None

    def bind(self, env: Mapping[str, int]) -> Bound:
        """Device buffers and packed launches for these sizes (cached; the oldest set is freed past KEEP_BOUND)."""
        syms = self.syms(env)
        key = tuple(syms.values())
        if key in self._bound:
            self._bound.move_to_end(key)
            return self._bound[key]
        while len(self._bound) >= self.KEEP_BOUND:
            self._free(self._bound.popitem(last=False)[1])
        b = Bound(env=dict(env))
        try:
            self._allocate(b, env)
            for ln in self.compiled.launches:
                grid, block = launch_dims(ln, env, self.backend.sm_count)
                if min(grid) == 0 or not ln.runs(env):
                    continue                       # nothing to compute at these sizes, or the other kernel's sizes
                ints = {n: dim_eval(e, env) for n, e in ln.map_sizes}      # an SM90 kernel's int scalars
                try:
                    values = [self._map(ln, name, ints, b) if kind == TMAP else ints[name] if kind == INT
                              else b.ptrs[name] if kind == "buf" else b.ptrs[_scratch_key(ln, name)]
                              if kind == "scratch" else b.ptrs["status:"] if kind == "status"
                              else b.ptrs[_counter_key(ln, name)] if kind == "counter" else syms[name]
                              for kind, name in ln.args]
                except KeyError as e:
                    raise KumikoError("E1703", at=ln.kernel, why=f"argument {e.args[0]!r} is neither a program "
                                      "input, output, intermediate nor scratch buffer") from None
                argv, keep = pack_params(self.params[ln.kernel], values)
                b.launches.append(BoundLaunch(ln.kernel, self.functions[ln.kernel], grid, block, ln.smem, argv, keep))
        except BaseException:
            self._free(b)
            raise
        self._bound[key] = b
        return b

    def _map(self, ln: Launch, i: int, ints: Mapping[str, int], b: Bound) -> bytes:
        """Tensor map ``i`` of an SM90 launch at these sizes over its buffer's device address."""
        desc, buf = ln.maps[i]
        return self.backend.encode_tensor_map(desc.encoding(ints), b.ptrs[buf] + desc.origin_bytes(ints),
                                              f"{ln.kernel} tensor map {desc.name}")

    def _allocate(self, b: Bound, env: Mapping[str, int]) -> None:
        def alloc(name: str, nbytes: int, what: str) -> int:
            ptr = self.backend.alloc(nbytes, what)
            b.allocations.append((ptr, nbytes, what))
            b.ptrs[name] = ptr
            return ptr

        for name, m in self.program.inputs:
            alloc(name, _nbytes(m, env)[1], f"input {name}")
        for name, m in self.program.outputs:
            if name in b.ptrs:                     # an output that is also an input: the kernel never writes it
                continue
            shape, nbytes = _nbytes(m, env)
            b.poison.append((alloc(name, nbytes, f"output {name}"), nbytes, f"output {name}"))
            b.outputs[name] = (shape, np.dtype(m.dtype.np))
        plan = plan_arena(self._launched, env)
        if plan.slots:
            base = alloc("arena:", plan.size, "intermediate buffers")
            b.poison.append((base, plan.size, "intermediate buffers"))
            for s in plan.slots:
                b.ptrs[s.name] = base + s.offset
        if any(kind == "status" for ln in self.compiled.launches for kind, _ in ln.args):
            alloc("status:", 4, "the kernels' status word")       # zeroed before each run (fill_poison)
        for ln in self.compiled.launches:
            for var, sizes in ln.scratch:
                if _scratch_key(ln, var) not in b.ptrs:
                    nbytes = max(1, math.prod(dim_eval(s, env) for s in sizes)) * 4
                    b.poison.append((alloc(_scratch_key(ln, var), nbytes, f"scratch {var}"), nbytes,
                                     f"scratch {var}"))
            for var, sizes in ln.counters:         # zeroed once: each launch leaves its counters zero
                if _counter_key(ln, var) not in b.ptrs:
                    nbytes = max(1, math.prod(dim_eval(s, env) for s in sizes)) * 4
                    self.backend.fill(alloc(_counter_key(ln, var), nbytes, f"counters {var}"), 0, nbytes,
                                      f"counters {var}")

    def _free(self, b: Bound) -> None:
        if b.graph is not None:
            try:
                self.backend.graph_destroy(b.graph)
            except KumikoError:
                pass                               # a sticky context error: the graph goes with the context
            b.graph = None
        for ptr, _, _ in b.allocations:
            try:
                self.backend.free(ptr)
            except KumikoError:
                pass                               # a sticky context error: the memory goes with the context
        b.allocations.clear()
        b.launches.clear()

    def release(self) -> None:
        """Free every device buffer this program holds."""
        while self._bound:
            self._free(self._bound.popitem()[1])

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone
            pass

    # -- one run ----------------------------------------------------------------------------------
    def upload(self, b: Bound, inputs: Mapping[str, np.ndarray]) -> None:
        missing = [n for n, _ in self.program.inputs if n not in inputs]
        if missing:
            raise KumikoError("E1015", at="inputs", why=f"missing {missing}",
                              expected=[n for n, _ in self.program.inputs])
        for name, m in self.program.inputs:
            given = inputs[name]
            if b.resident.get(name) is given:
                continue                           # a bound constant, uploaded to these buffers before
            arr = check_input(name, m, given, b.env)
            self.backend.upload(b.ptrs[name], arr, f"input {name}")
            if self.constants.get(name) is given:
                b.resident[name] = given
            else:
                b.resident.pop(name, None)         # the buffer holds the caller's array now

    def fill_poison(self, b: Bound) -> None:
        for ptr, nbytes, what in b.poison:
            self.backend.fill(ptr, POISON_BYTE, nbytes, what)

    def check_status(self, b: Bound) -> None:
        """A gather index out of range in any kernel of the run: E1015 (``emu_program.check_status``)."""
        if "status:" in b.ptrs:
            word = np.zeros(1, np.int32)
            self.backend.download(word, b.ptrs["status:"], "the kernels' status word")
            check_status(int(word[0]), self.program.name, b.env)

    def enqueue(self, b: Bound) -> None:
        """Issue every launch (no wait). With ``sync_each``, wait after each so a fault names its kernel.

        With ``graph`` the launches are captured once per bound sizes (the first enqueue) and every enqueue
        replays the CUDA Graph: one driver call for the whole program. ``sync_each`` and ``KUMIKO_DEBUG>=2``
        (per-launch times) launch one by one instead."""
        timed = enabled(2)
        if self.graph and b.launches and not (self.sync_each or timed):
            what = f"program {self.program.name}"
            if b.graph is None:
                b.graph = self.backend.capture(lambda: self._issue(b), what)
            self.backend.graph_launch(b.graph, what)
            return
        self._issue(b, sync=self.sync_each or timed, timed=timed)

    def _issue(self, b: Bound, sync: bool = False, timed: bool = False) -> None:
        for ln in b.launches:
            t0 = time.perf_counter()
            self.backend.launch(ln.fn, ln.kernel, ln.grid, ln.block, ln.smem, ln.argv)
            if sync:
                self.backend.sync(f"kernel {ln.kernel}", grid=list(ln.grid), block=list(ln.block), sizes=b.env)
            if timed:
                log(2, f"cuda {ln.kernel} grid {list(ln.grid)} block {ln.block[0]} smem {ln.smem}: "
                    f"{(time.perf_counter() - t0) * 1e3:.3f} ms")

    def wait(self, b: Bound) -> None:
        kernels = [ln.kernel for ln in b.launches]
        at = f"kernel {kernels[0]}" if len(kernels) == 1 else f"one of the kernels {kernels}"
        self.backend.sync(at, kernels=kernels, sizes=b.env)

    def download(self, b: Bound) -> dict[str, np.ndarray]:
        out = {}
        for name, (shape, dt) in b.outputs.items():
            arr = np.empty(shape, dt)
            self.backend.download(arr, b.ptrs[name], f"output {name}")
            out[name] = arr
        return out

    def do_poison(self) -> bool:
        return self.poison if self.poison is not None else knobs.spec() >= 1

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        with self._call_lock:                      # see the class docstring
            b = self.bind(env)
            self.upload(b, inputs)
            if self.do_poison():
                self.fill_poison(b)
            if "status:" in b.ptrs:
                self.backend.fill(b.ptrs["status:"], 0, 4, "the kernels' status word")
            self.enqueue(b)
            self.wait(b)
            self.check_status(b)
            return self.download(b)


def check_input(name: str, m: MemRef, arr: Any, env: Mapping[str, int]) -> np.ndarray:
    """An input as the kernels read it: the MemRef's dtype (fp16/bf16 also as raw uint16) and shape, C-contiguous."""
    want = tuple(dim_eval(d, env) for d in m.shape)
    return np.ascontiguousarray(check_array(name, m.dtype, arr, want, m.shape, raw16=True))


# ------------------------------------------------------------------------------------------------
# the target

class CompiledCudaGpu:
    """A program compiled for the ``cuda`` target: the cuda-emu lowering, a cubin, and (lazily) the device."""

    def __init__(self, compiled: CompiledCuda, cubin: Cubin, *, device: CudaDevice | None = None, ordinal: int = 0,
                 poison: bool | None = None, sync_each: bool = False, cuda_graph: bool = False,
                 extra_flags: Sequence[str] = (), constants: Mapping[str, np.ndarray] | None = None):
        self.compiled, self.cubin = compiled, cubin
        self.constants = dict(constants or {})
        self.ordinal, self.device = ordinal, device
        self.poison, self.sync_each, self.cuda_graph = poison, sync_each, cuda_graph
        self.extra_flags = tuple(extra_flags)
        self._program: CudaProgram | None = None
        self._module: Any = None
        self._open_lock = threading.Lock()     # the first calls of several threads open the device once

    # what dumps, the CLI and the tests read (as on CompiledCuda)
    source = property(lambda self: self.compiled.source)
    plans = property(lambda self: self.compiled.plans)
    kernels = property(lambda self: self.compiled.kernels)
    launches = property(lambda self: self.compiled.launches)
    program = property(lambda self: self.compiled.program)
    gpu_arch = property(lambda self: self.cubin.arch)
    plan_arch = property(lambda self: self.compiled.arch)

    def runner(self) -> CudaProgram:
        """The CudaProgram on the device: opened, the cubin checked against it and loaded, on first use;
        made current in the calling thread (a CUDA context is current per thread)."""
        with self._open_lock:
            return self._open()

    def _open(self) -> CudaProgram:
        """``runner``'s work, under its lock."""
        if self._program is None:
            dev = self.device or CudaDevice.get(self.ordinal)
            self.device = dev
            if not cubin_runs_on(self.cubin.arch, dev.cc):
                raise KumikoError("E1501", at="target cuda", why=f"the program was built for {self.cubin.arch}, "
                                  f"device {dev.ordinal} ({dev.name}) is sm_{dev.cc[0]}{dev.cc[1]}",
                                  suggestion=f"Compile with gpu_arch={dev.arch!r} (or leave gpu_arch out).")
            check_cubin(self.compiled, self.cubin, dev.smem_optin)
            self._module = self._load(dev)
            fns = {ln.kernel: dev.function(self._module, ln.kernel) for ln in self.compiled.launches}
            self._program = CudaProgram(self.compiled, dev, fns, constants=self.constants, poison=self.poison,
                                        sync_each=self.sync_each, graph=self.cuda_graph)
        else:
            self.device.activate()
        return self._program

    def _load(self, dev: CudaDevice) -> Any:
        """Load the cubin; one the driver refuses as an image is dropped from the cache and rebuilt once."""
        try:
            return dev.load_module(self.cubin.data, f"program {self.compiled.program.name}")
        except KumikoError as e:
            if e.details.get("cuda_error") not in BAD_IMAGE or not self.cubin.cached:
                raise
        invalidate(self.cubin)
        self.cubin = build_cubin(self.compiled.source, self.cubin.arch, name=safe_name(self.compiled.program.name),
                                 extra_flags=self.extra_flags)
        return dev.load_module(self.cubin.data, f"program {self.compiled.program.name}")

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        return self.runner()(inputs, env)


__all__ = ["CompiledCudaGpu", "CudaProgram", "check_cubin", "pack_params", "param_ctype",
           "launch_dims", "check_input"]
