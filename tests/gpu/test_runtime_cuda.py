"""The ``cuda`` target's host side, tested without a GPU.

What needs no device is exercised for real here: the diagnostics when there is no cuda-bindings, driver or
device (never a traceback), the CUresult -> diagnostic mapping, arch selection, kernelParams packing
(checked against the parameter codes the emulator build of the same source exports), and the whole
``CudaProgram`` run - device buffers, arena offsets, scratch, poisoning, grids, packed parameters - with
the CUDA emulator's launch entry points (which take cuLaunchKernel's kernelParams) standing in for
cuLaunchKernel and host memory for device memory. tests/gpu/test_runtime_gpu.py runs the same on a GPU.
"""
from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.kernel.tensormap import TiledEncoding
from kumiko.pipeline import compile_cuda
from kumiko.runtime import cuda_driver, emu, emu_worker
from kumiko.runtime.cuda_driver import CudaDevice, arch_for_cc, cubin_runs_on, cuda_error, device_available
from kumiko.runtime.cuda_program import (
    POISON_BYTE,
    CudaProgram,
    launch_dims,
    launch_params,
    pack_params,
    param_ctype,
)
from kumiko.runtime.ptxas import nvcc_path
from kumiko.runtime.tensormap import emu_encode
from kumiko.symbolic import dim_eval

from .conftest import EXAMPLES, STEMS, graph, rel_l2

HAVE_GPU, GPU_REASON = device_available()
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")


def _bindings():
    return pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")


# ------------------------------------------------------------------------------------------------
# no device: a diagnostic, never a traceback

@pytest.mark.skipif(HAVE_GPU, reason=f"a GPU is present ({GPU_REASON}); test_runtime_gpu.py covers it")
def test_cuda_target_without_a_device_is_a_diagnostic(capsys):
    from kumiko.cli import main
    with pytest.raises(KumikoError) as e:
        kumiko.compile(graph("gemm_bias_relu", "fp16"), "cuda")
    assert e.value.code == "E1501" and "cuda-emu" in e.value.suggestion
    assert main(["run", str(EXAMPLES / "gemm_bias_relu.json"), "--target", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "E1501" in err and "Traceback" not in err


def test_missing_cuda_bindings_is_a_diagnostic(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)       # `from cuda.bindings import driver` fails
    monkeypatch.setattr(CudaDevice, "_open", {})
    with pytest.raises(KumikoError) as e:
        CudaDevice.get(0)
    assert e.value.code == "E1501" and "cuda-bindings is not installed" in e.value.why
    assert "pip install -e '.[cuda]'" in e.value.suggestion      # the extra from a checkout (not on PyPI)
    ok, why = device_available()
    assert not ok and "cuda-bindings" in why


def test_cli_lists_cuda_as_a_target(capsys):
    from kumiko.cli import main
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "cuda" in out and "cuda: planned" not in out


# ------------------------------------------------------------------------------------------------
# errors, arch selection

def test_cuda_errors_map_to_diagnostics():
    drv = _bindings()
    R = drv.CUresult
    cases = {"CUDA_ERROR_ILLEGAL_ADDRESS": ("E1704", True), "CUDA_ERROR_LAUNCH_FAILED": ("E1704", True),
             "CUDA_ERROR_MISALIGNED_ADDRESS": ("E1704", True), "CUDA_ERROR_OUT_OF_MEMORY": ("E1704", False),
             "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": ("E1703", False), "CUDA_ERROR_INVALID_VALUE": ("E1703", False),
             "CUDA_ERROR_NO_BINARY_FOR_GPU": ("E1701", False), "CUDA_ERROR_INVALID_IMAGE": ("E1701", False),
             "CUDA_ERROR_NO_DEVICE": ("E1501", False), "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": ("E1501", False)}
    for name, (code, sticky) in cases.items():
        d = cuda_error(getattr(R, name), "cuLaunchKernel", "kernel kumiko_0_k_C2", grid=[1, 1, 1])
        assert d.code == code, name
        assert d.at == "kernel kumiko_0_k_C2" and name in d.why and d.details["cuda_error"] == name
        assert bool(d.details.get("sticky")) is sticky, name
        assert "kumiko_0_k_C2" in d.render()
    with pytest.raises(KumikoError) as e:
        cuda_driver._ok((R.CUDA_ERROR_OUT_OF_MEMORY, 0), "cuMemAlloc", "output C2", bytes=1 << 40)
    assert e.value.code == "E1704" and e.value.details["bytes"] == 1 << 40
    assert cuda_driver._ok((R.CUDA_SUCCESS, 7), "x", "y") == 7
    assert cuda_driver._ok((R.CUDA_SUCCESS,), "x", "y") is None


def test_arch_from_compute_capability():
    assert arch_for_cc(8, 0) == "sm_80" and arch_for_cc(8, 6) == "sm_86" and arch_for_cc(8, 9) == "sm_89"
    assert arch_for_cc(9, 0) == "sm_90a" and arch_for_cc(10, 0) == "sm_100" and arch_for_cc(12, 0) == "sm_120"
    with pytest.raises(KumikoError) as e:
        arch_for_cc(7, 5)
    assert e.value.code == "E1501" and "sm_80" in e.value.why
    assert cubin_runs_on("sm_80", (8, 0)) and cubin_runs_on("sm_80", (8, 6)) and not cubin_runs_on("sm_86", (8, 0))
    assert cubin_runs_on("sm_90a", (9, 0)) and not cubin_runs_on("sm_80", (9, 0))
    assert not cubin_runs_on("sm_90a", (10, 0))


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present: test_runtime_gpu.py makes these calls for real")
def test_driver_calls_marshal_their_arguments():
    """Every driver call CudaDevice makes gets arguments cuda-bindings accepts: without a driver each call gets
    as far as loading libcuda (cuda-bindings converts arguments first, so a wrong type is a TypeError)."""
    drv = _bindings()
    dev = object.__new__(CudaDevice)      # no device here: only the argument conversion is exercised
    dev.drv, dev.handle, dev.ctx, dev._stream = drv, drv.CUdevice(0), drv.CUcontext(), drv.CUstream(0)
    dev._capture_stream, dev._capture_lock, dev._tls = None, threading.Lock(), threading.local()

    def capture_on(stream):
        dev._capture_stream = stream
        return dev.capture(lambda: None, "g")
    arr = np.zeros(64, np.float16)
    from kumiko.kernel.gpu_ir import Param
    argv, _ = pack_params((Param("y", "float"), Param("n", "long long", pointer=False)), [0x1000, 7])
    calls = [lambda: dev.attribute("COMPUTE_CAPABILITY_MAJOR"), dev.activate, lambda: dev.alloc(100, "x"),
             lambda: dev.free(0x1000), lambda: dev.upload(0x1000, arr, "x"), lambda: dev.download(arr, 0x1000, "x"),
             lambda: dev.fill(0x1000, POISON_BYTE, 128, "x"), lambda: dev.load_module(b"\x7fELF", "m"),
             lambda: dev.function(drv.CUmodule(), "kumiko_k"), lambda: dev.unload_module(drv.CUmodule()),
             lambda: dev.set_dynamic_smem(drv.CUfunction(), "k", 100000),
             lambda: dev.encode_tensor_map(TiledEncoding.for_array((100, 136), "fp16", (64, 64), "128B"), 0x1000, "m"),
             lambda: dev.launch(drv.CUfunction(), "k", (2, 1, 1), (128, 1, 1), 0, argv), lambda: dev.sync("k"),
             lambda: dev.time_ms(lambda: None, reps=1, warmup=0), lambda: capture_on(None),
             lambda: capture_on(drv.CUstream()), lambda: dev.graph_launch(drv.CUgraphExec(), "g"),
             lambda: dev.graph_destroy(drv.CUgraphExec())]
    for call in calls:
        with pytest.raises(Exception) as e:
            call()
        assert type(e.value).__name__ == "DynamicLibNotFoundError" or "driver" in str(e.value) \
            or "libcuda" in str(e.value), repr(e.value)


# ------------------------------------------------------------------------------------------------
# kernel parameters

_CODE_BYTES = {"i64": 8, "u64": 8, "i32": 4, "u32": 4, "f32": 4, "f64": 8, "bool": 1}


@needs_gxx
@pytest.mark.parametrize("stem", ["gemm_bias_relu", "attention_causal"])
def test_params_match_the_exported_signature(gpu_cache, stem):
    """Each packed slot has the size of the parameter the compiled kernel declares (KUMIKO_ENTRY's codes)."""
    c = compile_cuda(graph(stem, "fp16").tiny)
    mod = c.module("deferred")
    for k in c.kernels:
        sig = mod.signature(k.name)
        assert len(sig) == len(k.params), (k.name, sig)
        for code, p in zip(sig, k.params):
            want = 8 if code.startswith(("ptr:", "cptr:")) else _CODE_BYTES[code]
            assert ctypes.sizeof(param_ctype(p)) == want, (k.name, p, code)


def test_pack_params_bytes():
    from kumiko.kernel.gpu_ir import Param
    params = (Param("b0", "uint16_t", True, True), Param("x", "float"), Param("s_M", "long long", pointer=False),
              Param("n", "int", pointer=False), Param("f", "float", pointer=False))
    argv, keep = pack_params(params, [0x7F00DEADBEEF00, 0x1000, 1 << 40, -3, 0.5])
    def at(i, ct):
        return ct.from_address(argv[i]).value
    assert at(0, ctypes.c_uint64) == 0x7F00DEADBEEF00 and at(1, ctypes.c_uint64) == 0x1000
    assert at(2, ctypes.c_longlong) == 1 << 40 and at(3, ctypes.c_int) == -3 and at(4, ctypes.c_float) == 0.5
    with pytest.raises(KumikoError) as e:
        pack_params(params, [1, 2])
    assert e.value.code == "E1703"
    with pytest.raises(KumikoError) as e:
        param_ctype(Param("q", "__half2", pointer=False))
    assert e.value.code == "E1703"


def test_launch_dims_and_limits():
    c = compile_cuda(graph("gemm_bias_relu", "fp16").tiny)
    ln = c.launches[0]
    bm, bn, _ = next(iter(c.plans.values())).tile
    grid, block = launch_dims(ln, {"M": 2 * bm + 2, "N": bn + 1, "K": 7})
    assert grid == (2, 3, 1) and block == (ln.block, 1, 1)
    with pytest.raises(KumikoError) as e:
        launch_dims(ln, {"M": bm * 70000, "N": bn, "K": 8})       # grid.y past 65535
    assert e.value.code == "E1703"


# ------------------------------------------------------------------------------------------------
# CudaProgram through the emulator's kernelParams entry points

class EmuLaunches:
    """Host memory and the emulator's ``kumiko_launch_NAME(..., void** kernelParams, ...)``: the parts of
    CudaDevice that CudaProgram calls, so its buffers, offsets, poisoning and packed parameters run for real."""

    smem_optin = emu.SMEM_LIMIT["sm80"]
    sm_count = 2

    def __init__(self, module: emu.EmuModule):
        self.module, self.lib = module, module._load()
        self.mem: dict[int, np.ndarray] = {}
        self.launched: list[str] = []
        self.maps: list = []                  # (encoding, address) of every tensor map encoded
        self.uploads: list[str] = []          # what each host-to-device copy was for
        self.capturing: list | None = None
        self.graphs: list[list] = []          # live captured graphs (each a list of launch arguments)

    def functions(self, kernels):
        return {k: emu_worker.bind(self.lib, k)[0] for k in kernels}

    def alloc(self, nbytes, what):
        raw = np.empty(max(nbytes, 1) + 256, np.uint8)
        ptr = raw.ctypes.data + (-raw.ctypes.data) % 256
        self.mem[ptr] = raw
        return ptr

    def free(self, ptr):
        del self.mem[ptr]

    def upload(self, ptr, arr, what):
        self.uploads.append(what)
        ctypes.memmove(ptr, arr.ctypes.data, arr.nbytes)

    def download(self, arr, ptr, what):
        ctypes.memmove(arr.ctypes.data, ptr, arr.nbytes)

    def fill(self, ptr, byte, nbytes, what):
        ctypes.memset(ptr, byte, nbytes)

    def set_dynamic_smem(self, fn, kernel, nbytes):
        pass

    def encode_tensor_map(self, enc, address, what):
        self.maps.append((enc, address))
        return emu_encode(self.lib, enc, address)

    def launch(self, fn, kernel, grid, block, smem, argv):
        if self.capturing is not None:
            self.capturing.append((fn, kernel, grid, block, smem, argv))
            return
        self._run(fn, kernel, grid, block, smem, argv)

    def _run(self, fn, kernel, grid, block, smem, argv):
        emu_worker.configure(self.lib, self.module.config.runtime_options())
        rc, err, _ = emu_worker.call(self.lib, fn, grid, block, smem, argv)
        if rc:
            raise emu._fault(err, self.module, kernel) if err else KumikoError("E1702", at=kernel, why=f"rc {rc}")
        self.launched.append(kernel)

    def sync(self, what, **details):
        assert self.capturing is None, "no sync while capturing"

    def capture(self, issue, what):
        """As CudaDevice.capture: the launches are recorded, not run."""
        self.capturing = []
        try:
            issue()
        finally:
            graph, self.capturing = self.capturing, None
        self.graphs.append(graph)
        return graph

    def graph_launch(self, graph, what):
        assert any(g is graph for g in self.graphs), "a destroyed graph is never launched"
        for launch in graph:
            self._run(*launch)

    def graph_destroy(self, graph):
        self.graphs.remove(graph)


def _emu_program(stem: str, dtype: str = "fp16", **kw) -> tuple[CudaProgram, EmuLaunches]:
    c = compile_cuda(graph(stem, dtype).tiny)
    be = EmuLaunches(c.module("deferred"))
    return CudaProgram(c, be, be.functions({ln.kernel for ln in c.launches}), **kw), be


@needs_gxx
@pytest.mark.parametrize("stem", STEMS)
def test_cuda_program_runs_the_examples_through_kernel_params(gpu_cache, stem):
    prog, be = _emu_program(stem)
    g = graph(stem, "fp16")
    ref = kumiko.compile(g, "eval")
    for seed, shapes in ((1, None), (2, {k: v + 5 for k, v in g.symbols.items()})):
        ins = ref.random_inputs(seed, shapes)
        env = ref.bind(ins, None)
        out = prog(ins, env)
        want = ref(**ins)
        errs = {k: rel_l2(out[k], want[k]) for k in want}
        assert all(e < 1e-2 for e in errs.values()), (stem, shapes, errs)
    assert be.launched and len(prog._bound) == 2
    if stem == "attention_causal":          # the fused pair: its deferred P has no device memory
        p = prog.program.regions[0].outputs[0].name
        assert all(p not in b.ptrs for b in prog._bound.values())
    prog.release()
    assert not be.mem, "every allocation is freed"


@needs_gxx
def test_cuda_program_launches_the_sm90_gemm_with_tensor_maps(gpu_cache):
    """An sm90 plan's launch through kernelParams: each tensor map encoded over its buffer's device address at the
    bound sizes, the int scalars, the buffers; the SM80 kernel where TMA's 16-byte rows do not hold (its guard)."""
    a, b = Tensor.input("A", ("M", "K"), dtype="fp16"), Tensor.input("B", ("K", "N"), dtype="fp16")
    g = (a @ b + Tensor.input("bias", ("N",), dtype="fp16")).relu().graph("y", name="gemm_bias_relu_sm90")
    c = compile_cuda(g, arch="sm90")
    sm90, sm80 = (ln.kernel for ln in c.launches)
    assert len(launch_params(c.kernels[0])) == len(c.launches[0].args) and c.launches[0].maps
    be = EmuLaunches(c.module("deferred"))
    be.smem_optin = emu.SMEM_LIMIT["sm90"]          # a Hopper: the large plan's 4 stages of 128x256 tiles
    prog = CudaProgram(c, be, be.functions({ln.kernel for ln in c.launches}))
    ref = kumiko.compile(g, "eval")
    for shapes, runs in (({"M": 100, "K": 136, "N": 72}, sm90), ({"M": 70, "K": 60, "N": 50}, sm80)):
        ins = ref.random_inputs(3, shapes)
        be.launched.clear()
        out = prog(ins, ref.bind(ins, None))
        assert be.launched == [runs]
        assert rel_l2(out["y"], ref(**ins)["y"]) < 2e-3, shapes
    b0 = next(iter(prog._bound.values()))
    assert {addr for _, addr in be.maps} == {b0.ptrs["A"], b0.ptrs["B"]}
    assert {enc.global_dim for enc, _ in be.maps} == {(136, 100), (72, 136)}
    prog.release()
    assert not be.mem


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_plan_arch_follows_the_cubin_arch(gpu_cache):
    """Without a device: an sm_90a cubin gets sm90 plans (the SM90 kernel and its guarded SM80 twin), any other
    arch sm80 ones; ``arch`` overrides, and sm90 plans for another cubin arch are E1501."""
    g = (Tensor.input("A", ("M", "K"), dtype="fp16") @ Tensor.input("B", ("K", "N"), dtype="fp16")).graph("y")
    hopper = kumiko.compile(g, "cuda", gpu_arch="sm_90a")
    assert hopper._run.plan_arch == "sm90" and hopper._run.gpu_arch == "sm_90a"
    assert [type(k).__name__ for k in hopper._run.kernels] == ["Sm90Kernel", "MmaKernel"]
    assert kumiko.compile(g, "cuda", gpu_arch="sm_90a", arch="sm80")._run.plan_arch == "sm80"
    assert kumiko.compile(g, "cuda", gpu_arch="sm_80")._run.plan_arch == "sm80"
    for kw in ({"gpu_arch": "sm_80", "arch": "sm90"}, {"gpu_arch": "sm_90a", "arch": "sm70"}):
        with pytest.raises(KumikoError) as e:
            kumiko.compile(g, "cuda", **kw)
        assert e.value.code == "E1501", kw


@needs_gxx
def test_bound_constants_stay_on_the_device_between_calls(gpu_cache):
    """The Executable's params (read-only arrays of its own, passed as themselves) are copied to a Bound's buffers
    once; data inputs every call; a caller's own array for a param's name is copied too."""
    a, w = Tensor.input("A", ("M", 64), dtype="fp16"), Tensor.input("W", (64, 48), dtype="fp16", role="param")
    g = (a @ w).graph("y", name="linear")
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(1, {"M": 40})
    weight = ins["W"].copy()
    weight.setflags(write=False)
    c = compile_cuda(g)
    be = EmuLaunches(c.module("deferred"))
    prog = CudaProgram(c, be, be.functions({ln.kernel for ln in c.launches}), constants={"W": weight})
    for seed in (1, 2, 3):
        x = ref.random_inputs(seed, {"M": 40})["A"]
        out = prog({"A": x, "W": weight}, {"M": 40})
        assert rel_l2(out["y"], ref(A=x, W=weight)["y"]) < 2e-3
    assert be.uploads == ["input A", "input W", "input A", "input A"]
    other = ref.random_inputs(9, {"M": 40})["W"]              # not the bound array: copied
    out = prog({"A": x, "W": other}, {"M": 40})
    assert be.uploads[-2:] == ["input A", "input W"] and rel_l2(out["y"], ref(A=x, W=other)["y"]) < 2e-3
    out = prog({"A": x, "W": weight}, {"M": 40})              # the device buffer holds `other` now
    assert be.uploads[-1] == "input W" and rel_l2(out["y"], ref(A=x, W=weight)["y"]) < 2e-3
    prog.release()


@needs_gxx
def test_cuda_program_poisons_and_reuses_buffers(gpu_cache):
    prog, be = _emu_program("attention_row_softmax")
    g = graph("attention_row_softmax", "fp16")
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(0)
    env = ref.bind(ins, None)
    b = prog.bind(env)
    assert prog.bind(env) is b and [w for _, _, w in b.poison] == ["output P", "scratch a_v_n9"]
    prog.upload(b, ins)
    prog.fill_poison(b)
    before = prog.download(b)["P"]
    assert (before.view(np.uint16) == POISON_BYTE * 0x101).all(), "outputs are 0xFF before the kernels run"
    prog.enqueue(b)
    prog.wait(b)
    assert np.isfinite(prog.download(b)["P"].astype(np.float32)).all()
    n_alloc = len(be.mem)
    prog(ins, env)                                 # same sizes: same buffers
    assert len(be.mem) == n_alloc
    with pytest.raises(KumikoError) as e:
        prog({k: v for k, v in ins.items() if k != "Q"}, env)
    assert e.value.code == "E1015"
    with pytest.raises(KumikoError) as e:
        prog({**ins, "Q": ins["Q"].astype(np.float32)}, env)
    assert e.value.code == "E1015"
    prog.release()


@needs_gxx
def test_cuda_program_replays_a_captured_graph(gpu_cache, monkeypatch):
    """graph=True: the launches of one set of sizes are captured once, replayed by every later run (new inputs,
    same buffers), one graph per bound size set, destroyed with its buffers; sync_each launches one by one."""
    stem = "attention_row_softmax"
    prog, be = _emu_program(stem, graph=True)
    g = graph(stem, "fp16")
    ref = kumiko.compile(g, "eval")
    kernels = [ln.kernel for ln in prog.compiled.launches]
    assert len(kernels) > 1
    for seed, shapes in ((1, None), (2, None), (3, {k: v + 5 for k, v in g.symbols.items()}), (4, None)):
        ins = ref.random_inputs(seed, shapes)
        out = prog(ins, ref.bind(ins, None))
        want = ref(**ins)
        assert all(rel_l2(out[k], want[k]) < 1e-2 for k in want), (seed, shapes)
    assert len(be.graphs) == 2 and all(len(gr) == len(kernels) for gr in be.graphs), "one capture per size set"
    assert be.launched == kernels * 4, "every run replays every kernel once, in order"
    assert all(b.graph is not None for b in prog._bound.values())
    prog.release()
    assert not be.graphs and not be.mem, "graphs are destroyed with their buffers"

    prog, be = _emu_program(stem, graph=True, sync_each=True)
    ins = ref.random_inputs(5)
    prog(ins, ref.bind(ins, None))
    assert not be.graphs and be.launched == kernels, "sync_each: launched one by one, no capture"
    prog.release()

    prog, be = _emu_program(stem, graph=True)
    monkeypatch.setattr(be, "launch", lambda *a: (_ for _ in ()).throw(KumikoError("E1703", at="k", why="bad")))
    with pytest.raises(KumikoError) as e:
        prog(ins, ref.bind(ins, None))
    assert e.value.code == "E1703" and be.capturing is None and not be.graphs, "a failed capture leaves nothing"
    prog.release()


@needs_gxx
@pytest.mark.parametrize("replay", [False, True])
def test_cuda_program_split_k_counters_stay_zero_between_calls(gpu_cache, monkeypatch, replay):
    """Split-K through CudaProgram: the per-tile counters are allocated zeroed once per bound sizes (not poisoned,
    not zeroed again) and every call's launches, one by one or replayed as a graph, leave them zero, so the next
    call sums right; the ring of 48 KiB or more gets the dynamic shared memory opt-in (the kernel's static flag word
    puts it past the default limit)."""
    a = Tensor.input("A", (70, 600), dtype="fp16")
    b = Tensor.input("B", (600, 72), dtype="fp16")
    g = ((a @ b) + Tensor.input("bias", (72,), dtype="fp16")).relu().graph("y", name="split")
    prog0 = compile_cuda(g.tiny)
    plans = {k: p.with_(split_k=5, tile=(128, 64, 32), stages=4, threads=256) for k, p in prog0.plans.items()}
    c = compile_cuda(g.tiny, plans=plans)
    assert any(ln.counters for ln in c.launches)
    be = EmuLaunches(c.module("deferred"))
    raised = []
    monkeypatch.setattr(be, "set_dynamic_smem", lambda fn, kernel, nbytes: raised.append(nbytes))
    prog = CudaProgram(c, be, be.functions({ln.kernel for ln in c.launches}), graph=replay)
    assert raised == [c.launches[0].smem] and raised[0] > 0
    ref = kumiko.compile(g, "eval")
    for seed in range(3):
        ins = ref.random_inputs(seed)
        out = prog(ins, ref.bind(ins, None))
        assert rel_l2(out["y"], ref(**ins)["y"]) < 2e-3, seed
        (bound,) = prog._bound.values()
        (key,) = [k for k in bound.ptrs if k.startswith("counter:")]
        n = math.prod(dim_eval(d, bound.env) for d in c.launches[0].counters[0][1])
        words = np.zeros(n, np.int32)
        be.download(words, bound.ptrs[key], "counters")
        assert not words.any(), (seed, words)
    prog.release()


@needs_gxx
def test_cuda_program_fp32_and_zero_sizes(gpu_cache):
    prog, _ = _emu_program("gemm_bias_relu", "fp32")
    g = graph("gemm_bias_relu", "fp32")
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(3, {"M": 37, "N": 19, "K": 11})
    out = prog(ins, ref.bind(ins, None))
    assert rel_l2(out["C2"], ref(**ins)["C2"]) < 1e-5
    ins = ref.random_inputs(3, {"M": 0, "N": 19, "K": 11})
    assert prog(ins, ref.bind(ins, None))["C2"].shape == (0, 19)
    prog.release()


def test_smem_over_the_device_limit_is_rejected():
    c = compile_cuda(graph("gemm_bias_relu", "fp16").tiny)

    class Tiny:
        smem_optin = 16 * 1024

    with pytest.raises(KumikoError) as e:
        CudaProgram(c, Tiny(), {ln.kernel: None for ln in c.launches})
    assert e.value.code == "E1801" and e.value.details["hazard"] == "smem"


@pytest.fixture
def bench_gpu():
    """bench/bench_gpu.py as a module (it is a script, not part of the package), unloaded afterwards."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("kumiko_bench_gpu", EXAMPLES.parent / "bench" / "bench_gpu.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)
        sys.modules.pop("kumiko_bench_cpu", None)


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present: bench/bench_gpu.py measures there")
def test_gpu_bench_exits_cleanly_without_a_gpu(bench_gpu, tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    assert bench_gpu.main(["--results", str(results)]) == 0
    assert "no GPU" in capsys.readouterr().out and not results.exists()


def test_gpu_bench_measures_the_other_workloads_when_one_fails(bench_gpu, tmp_path, monkeypatch, capsys):
    """A workload whose compile or run raises a diagnostic is reported and the rest are still measured and
    recorded (exit 2); a sticky fault (the CUDA context is gone) stops the run. The device is faked."""
    mod = bench_gpu
    ran = []

    def fake(wl, args, dev, torch):
        ran.append(wl.key)
        if wl.key in fail:
            raise KumikoError("E1704", at=wl.key, why="boom", sticky=fail[wl.key])
        return [mod.Row(wl.key, "kumiko[cuda]", 1.0, 1.0, tflops=1.0)]

    machine = {k: "-" for k in ("gpu", "cc", "sm_count", "memory_gib", "driver_cuda", "nvcc", "python", "numpy",
                                 "torch", "kumiko_commit")}
    monkeypatch.setattr(mod, "device_available", lambda: (True, "fake"))
    monkeypatch.setattr(mod.CudaDevice, "get", staticmethod(lambda ordinal=0: None))
    monkeypatch.setattr(mod, "machine", lambda dev, torch: machine)
    monkeypatch.setattr(mod, "bench_workload", fake)
    keys = list(mod.WORKLOADS)
    results = tmp_path / "RESULTS.md"
    fail = {keys[1]: False}
    assert mod.main(["--no-torch", "--results", str(results)]) == 2
    assert ran == keys and f"failed: {keys[1]}" in capsys.readouterr().err
    table = results.read_text()
    assert all(f"| {k} |" in table for k in keys if k != keys[1]) and f"| {keys[1]} |" not in table
    ran.clear()
    fail = {keys[1]: True}
    assert mod.main(["--no-torch", "--no-append"]) == 2 and ran == keys[:2]


def test_gpu_session_script_runs_every_phase_without_a_gpu(tmp_path):
    """bench/gpu_session.sh: each phase writes its log into $OUT (here: the bench says there is no GPU);
    an unknown phase is a usage error."""
    script = EXAMPLES.parent / "bench" / "gpu_session.sh"
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(script), "bench"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing measured" in (tmp_path / "bench.log").read_text() and (tmp_path / "device.txt").exists()
    if importlib.util.find_spec("torch") is not None:         # the networks' definitions need torch
        r = subprocess.run(["bash", str(script), "nets"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "no GPU" in (tmp_path / "nets.log").read_text(), r.stdout + r.stderr
    r = subprocess.run(["bash", str(script), "nonsense"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "usage" in r.stderr


def test_gpu_bench_tile_specs(bench_gpu):
    mod = bench_gpu
    assert mod.parse_tile("128x256x32/64x64/3") == {"tile": (128, 256, 32), "warp_tile": "64x64", "stages": 3,
                                                    "threads": 256}
    assert mod.parse_args(["--tiles", "64x64x32/32x32/3,128x128x32/64x64/4"]).tiles == [
        "64x64x32/32x32/3", "128x128x32/64x64/4"]
    assert mod.parse_args(["--cuda-graph"]).cuda_graph and not mod.parse_args([]).cuda_graph
    plan = compile_cuda(graph("gemm_bias_relu", "fp16").tiny).plans["k_C2"]
    p = mod.apply_tile(plan, "64x64x32/32x32/3/g4/trailing")
    assert (p.tile, p.warp_tile, p.stages, p.threads) == ((64, 64, 32), "32x32", 3, 128)
    assert dict(p.layout_hints) == {"group_m": 4}
    assert p.get("async_", "release") == "trailing" and p.get("async_", "prefetch_depth") == 2
    assert mod.parse_tile("128x128x32/64x64/4/registers")["release"] == "registers"
    assert mod.apply_tile(plan, "64x64x32/32x32/3/s8").split_k == 8
    assert mod.apply_tile(plan.with_(split_k=4), "64x64x32/32x32/3").split_k == 4      # kept without /s
    for bad in ("128x128/64x64/4", "128x128x32/64x64", "axbxc/1x1/2", "128x128x32/64x64/4/q3"):
        with pytest.raises(SystemExit, match="--tiles"):
            mod.parse_tile(bad)


def test_gpu_bench_sm90_and_attention_specs(bench_gpu):
    """--tiles wg:BMxBN/S[/fN][/p][/sN] sets an sm90 plan's tile, ring, wgmma groups in flight, persistence and split;
    at:BMxBN the streaming attention plan's tile; --archs lists plan archs. Each result is a plan the cuda
    backend validates and builds (sm_90a, no device)."""
    mod = bench_gpu
    assert mod.parse_wgmma_tile("wg:128x256/3/f0/p") == {"bm": 128, "bn": 256, "stages": 3, "in_flight": 0,
                                                         "persistent": True, "split": 1}
    assert mod.parse_wgmma_tile("wg:64x64/8/s3")["split"] == 3
    assert mod.parse_attention_tile("at:128x64") == (128, 64, True)
    assert mod.parse_attention_tile("at:128x128/nopp") == (128, 128, False)
    assert mod.parse_args(["--archs", "sm90,sm80", "--tiles", "wg:64x64/2,at:64x128"]).archs == ["sm90", "sm80"]
    for bad in ("wg:128/3", "wg:128x256/3/q", "at:128", "at:128x64/pp"):
        with pytest.raises(SystemExit, match="--tiles"):
            mod.parse_args(["--tiles", bad])
    g = (Tensor.input("A", (300, 136), dtype="fp16") @ Tensor.input("B", (136, 264), dtype="fp16")).graph("y")
    (name, plan), = compile_cuda(g, "sm90").plans.items()
    p = mod.apply_tile(plan, "wg:128x256/3/f0/p")
    assert (p.tile, p.stages, p.threads, p.warp_tile) == ((128, 256, 64), 3, 384, "64x256")
    assert p.get("async_", "wgmma_in_flight") == 0 and p.get("async_", "epilogue_overlap") is True
    assert compile_cuda(g, "sm90", plans={name: p}).launches[0].persistent == 1
    split = compile_cuda(g, "sm90", plans={name: mod.apply_tile(plan, "wg:64x64/6/s2")})
    assert split.plans[name].split_k == 2 and split.launches[0].counters
    att = graph("attention_causal", "fp16")
    chosen = compile_cuda(att.tiny).plans
    plans = {n: mod.apply_tile(q, "at:128x64") if q.algo == "streaming_softmax" else q for n, q in chosen.items()}
    assert {q.tile for q in compile_cuda(att.tiny, plans=plans).plans.values() if q.algo == "streaming_softmax"} \
        == {(128, 64, 16)}
    att90 = (Tensor.input("Q", ("B", "S", 64), dtype="fp16")
             .scaled_dot_product_attention(*(Tensor.input(n, ("B", "S", 64), dtype="fp16") for n in "KV")).graph("y"))
    chosen = compile_cuda(att90, "sm90").plans
    plans = {n: mod.apply_tile(q, "at:128x128/nopp") if q.algo == "streaming_softmax" else q
             for n, q in chosen.items()}
    k = compile_cuda(att90, "sm90", plans=plans).kernels[0]
    assert k.threads == 384 and "kk_turn" not in {b.name for b in k.bars}
    assert "kk_turn" in {b.name for b in compile_cuda(att90, "sm90").kernels[0].bars}


@needs_gxx
@pytest.mark.parametrize("key", ["softmax-8192", "layernorm-8192"])
def test_gpu_bench_row_workloads_match_torch_on_the_emulator(bench_gpu, gpu_cache, key):
    """The bench's memory-bound row workloads: their graphs take the warp-per-row SIMT kernel, and at the quick
    sizes the emulated kernel matches the evaluator and (where torch is installed) the bench's own torch
    reference on the CPU, within the bench's limit."""
    wl = bench_gpu.WORKLOADS[key]
    g = wl.graph(wl.quick)
    c = compile_cuda(g.tiny)
    assert [p.get("bind", "point") for p in c.plans.values()] == ["warp"]
    ins = kumiko.compile(g, "eval").random_inputs(0, wl.quick)
    ref = kumiko.compile(g, "eval")
    out = c.runner("deferred")(ins, ref.bind(ins, None))["y"]
    assert rel_l2(out, ref(**ins)["y"]) < 1e-3 and wl.flops(wl.quick) > 0
    try:
        import torch
    except ImportError:
        return
    want = wl.torch(torch, {k: torch.from_numpy(v) for k, v in ins.items()}, wl.quick).float().numpy()
    assert rel_l2(out, want) < bench_gpu.REL_L2_LIMIT


@needs_gxx
@pytest.mark.parametrize("key", ["conv3x3-s4b1", "linear-128"])
def test_gpu_bench_batch_one_workloads_match_on_the_emulator(bench_gpu, gpu_cache, key):
    """The bench's constant-size workloads (a batch-1 ResNet conv + bias + ReLU, a 128-token projection): at the
    quick sizes (one or two output tiles) the sm80 chooser splits their K, and the emulated kernels match the
    evaluator."""
    wl = bench_gpu.WORKLOADS[key]
    g = wl.graph(wl.quick)
    c = compile_cuda(g.tiny)
    assert any(p.split_k > 1 for p in c.plans.values())
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(1)
    out = c.runner("deferred")(ins, ref.bind(ins, None))["y"]
    assert rel_l2(out, ref(**ins)["y"]) < bench_gpu.REL_L2_LIMIT and wl.flops(wl.quick) > 0


@needs_gxx
def test_gpu_bench_conv_workload_matches_on_the_emulator(bench_gpu, gpu_cache):
    """The bench's implicit-GEMM workload: an MMA kernel whose im2col operand is gathered by rows; at the quick
    sizes (M, K not tile multiples) the emulated kernels match the evaluator and, where torch is installed, the
    bench's torch reference on the CPU."""
    wl = bench_gpu.WORKLOADS["conv3x3"]
    g = wl.graph(wl.quick)
    c = compile_cuda(g.tiny)
    assert [p.algo for p in c.plans.values()] == ["mma"] and "x gathered by rows" in c.source
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(1, wl.quick)
    out = c.runner("deferred")(ins, ref.bind(ins, None))["y"]
    assert rel_l2(out, ref(**ins)["y"]) < bench_gpu.REL_L2_LIMIT and wl.flops(wl.quick) > 0
    try:
        import torch
    except ImportError:
        return
    want = wl.torch(torch, {k: torch.from_numpy(v).float() for k, v in ins.items()}, wl.quick).numpy()
    assert rel_l2(out, want) < bench_gpu.REL_L2_LIMIT


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present: bench/models_gpu.py measures there")
def test_models_gpu_exits_cleanly_without_a_gpu(tmp_path, capsys):
    """bench/models_gpu.py (the networks on the cuda target against PyTorch) says there is no GPU, writes
    nothing and exits 0 (it needs torch for the networks' definitions)."""
    pytest.importorskip("torch")
    import importlib.util
    spec = importlib.util.spec_from_file_location("kumiko_models_gpu", EXAMPLES.parent / "bench" / "models_gpu.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)      # (its dataclass looks itself up)
    try:
        spec.loader.exec_module(mod)
        results = tmp_path / "RESULTS.md"
        assert mod.main(["--results", str(results), "--models", "resnet50"]) == 0
        assert "no GPU" in capsys.readouterr().out and not results.exists()
    finally:
        del sys.modules[spec.name]
