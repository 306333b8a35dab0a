"""The CUDA driver API through cuda-bindings, as the ``cuda`` target uses it: one device, its primary
context, device memory, modules, launches, events, and every error mapped to a kumiko diagnostic.

cuda-bindings (the ``cuda`` extra: ``pip install -e '.[cuda]'`` in a checkout) is imported only when a
device is opened, so kumiko imports and the other targets work without it. Its calls return tuples
``(CUresult, value...)``; ``_ok`` turns a non-success result into a ``KumikoError``:

- no driver, no device, a driver too old: E1501 TargetUnavailable (the target cannot run here);
- ILLEGAL_ADDRESS, LAUNCH_FAILED, MISALIGNED_ADDRESS, ILLEGAL_INSTRUCTION, ASSERT...: E1704 KernelFailed with
  ``sticky=True`` (a kernel faulted; this process's context is unusable afterwards);
- LAUNCH_OUT_OF_RESOURCES, INVALID_VALUE at a launch, NOT_FOUND for a kernel: E1703 KernelLaunchInvalid;
- NO_BINARY_FOR_GPU, INVALID_IMAGE, INVALID_PTX...: E1701 KernelBuildFailed (the cubin does not fit the device);
- OUT_OF_MEMORY: E1704 KernelFailed (``details["cuda_error"]`` says which; there is no out-of-memory code yet).

The kernel's name is in ``at`` wherever the call concerns one kernel.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import numpy as np

from kumiko.diagnostics import KumikoError

#: errors after which the context is unusable: every later call of this process fails too
STICKY = frozenset({"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
                    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
                    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT",
                    "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_NVLINK_UNCORRECTABLE", "CUDA_ERROR_TENSOR_MEMORY_LEAK",
                    "CUDA_ERROR_CONTAINED", "CUDA_ERROR_UNKNOWN"})
LAUNCH_CONFIG = frozenset({"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_FOUND",
                           "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
                           "CUDA_ERROR_INVALID_CLUSTER_SIZE", "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"})
BAD_IMAGE = frozenset({"CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_PTX",
                       "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INVALID_SOURCE",
                       "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
                       "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"})
UNAVAILABLE = frozenset({"CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INVALID_DEVICE",
                         "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_DEINITIALIZED", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
                         "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "CUDA_ERROR_DEVICE_UNAVAILABLE",
                         "CUDA_ERROR_STUB_LIBRARY", "CUDA_ERROR_SYSTEM_NOT_READY", "CUDA_ERROR_OPERATING_SYSTEM",
                         "CUDA_ERROR_DEVICE_NOT_LICENSED"})
#: sizeof(CUtensorMap) (cuda.h: 64-byte aligned, opaque)
TENSOR_MAP_BYTES = 128
_EMU_HINT = "or run the same program on the CPU with --target cuda-emu"


def driver_module():
    """``cuda.bindings.driver``, or E1501 saying how to get it."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise KumikoError("E1501", at="target cuda", why=f"cuda-bindings is not installed ({e})",
                          suggestion="install the cuda extra from the kumiko checkout: pip install -e '.[cuda]' "
                                     "(cuda-bindings >= 12), on a machine with an NVIDIA GPU and driver, "
                                     f"{_EMU_HINT}.") from None
    return driver


def error_name(err: Any) -> str:
    """``CUDA_ERROR_ILLEGAL_ADDRESS`` for a CUresult (also for codes this cuda-bindings does not name)."""
    return str(getattr(err, "name", None) or f"CUresult {int(err)}")


def cuda_error(err: Any, call: str, at: str, **details: Any) -> KumikoError:
    """The diagnostic for a failed driver call (see the module docstring for the mapping)."""
    name = error_name(err)
    text = _error_string(err)
    why = f"{call} failed: {name}" + (f" ({text})" if text else "")
    details = {"cuda_error": name, **details}
    if name in UNAVAILABLE:
        return KumikoError("E1501", at=at, why=why, suggestion="Check that an NVIDIA GPU is visible (nvidia-smi, "
                           f"CUDA_VISIBLE_DEVICES) and the driver supports CUDA 12 or newer, {_EMU_HINT}.", **details)
    if name in BAD_IMAGE:
        return KumikoError("E1701", at=at, why=why, suggestion="The cubin does not fit this GPU: build for the "
                           "device's arch (the default picks it from the compute capability).", **details)
    if name == "CUDA_ERROR_OUT_OF_MEMORY":
        return KumikoError("E1704", at=at, why=why, suggestion="The GPU is out of memory: use smaller sizes, free "
                           "other programs' device memory, or run on a GPU with more memory.", **details)
    if name in STICKY:
        return KumikoError("E1704", at=at, why=why, sticky=True,
                           suggestion="A kernel faulted on the GPU; this process's CUDA context is unusable now "
                           "(restart it). Find the faulting thread with --target cuda-emu and emu='asan', or "
                           "compute-sanitizer; compile with sync_each=True to name the kernel exactly.", **details)
    if name in LAUNCH_CONFIG:
        return KumikoError("E1703", at=at, why=why, **details)
    return KumikoError("E1704", at=at, why=why, **details)


def _error_string(err: Any) -> str:
    try:
        from cuda.bindings import driver
        res, text = driver.cuGetErrorString(err)
        if int(res) == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001 - no driver library: the name alone must do
        pass
    return ""


def _ok(res: Any, call: str, at: str, **details: Any) -> Any:
    """The value(s) of a driver call's ``(CUresult, value...)`` tuple; raises its diagnostic on failure."""
    err, rest = (res[0], res[1:]) if isinstance(res, tuple) else (res, ())
    if int(err) != 0:
        raise cuda_error(err, call, at, **details)
    return rest[0] if len(rest) == 1 else rest if rest else None


# ------------------------------------------------------------------------------------------------
# arch selection

def arch_for_cc(major: int, minor: int) -> str:
    """The nvcc arch for a compute capability: sm_80 path code; 9.0 builds as sm_90a (Hopper)."""
    if major < 8:
        raise KumikoError("E1501", at="target cuda", why=f"compute capability {major}.{minor} is too old: the "
                          "generated kernels use cp.async, ldmatrix and bf16 mma.sync (sm_80 or newer)",
                          suggestion=f"Use an Ampere or newer GPU, {_EMU_HINT}.")
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def plan_arch_for(gpu_arch: str) -> str:
    """The plans' arch (``kumiko.plan.gpu``) for a cubin arch: ``sm90`` (the SM90 GEMM skeleton: TMA, mbarrier,
    wgmma, where TMA can read the operands) for ``sm_90a``, whose wgmma needs the arch-specific build; ``sm80``
    (the mma.sync skeleton) for every other arch."""
    return "sm90" if gpu_arch == "sm_90a" else "sm80"


def cubin_runs_on(arch: str, cc: tuple[int, int]) -> bool:
    """Whether SASS built for ``arch`` runs on a device of compute capability ``cc``: same major and a minor at
    least the arch's; an arch-specific build (``sm_90a``) only on exactly its capability."""
    digits = arch[3:].rstrip("af")
    major, minor = int(digits[:-1]), int(digits[-1])
    if arch.endswith(("a", "f")):
        return (major, minor) == tuple(cc) if arch.endswith("a") else (major == cc[0] and minor <= cc[1])
    return major == cc[0] and minor <= cc[1]


# ------------------------------------------------------------------------------------------------
# the device

class CudaDevice:
    """One GPU's primary context (shared with PyTorch and CuPy in the same process), opened once per ordinal."""

    _open: dict[int, "CudaDevice"] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, ordinal: int = 0) -> "CudaDevice":
        """The opened device, or E1501 (no cuda-bindings, no driver, no device, ordinal out of range)."""
        with cls._lock:
            if ordinal not in cls._open:
                cls._open[ordinal] = cls(ordinal)
            dev = cls._open[ordinal]
        dev.activate()
        return dev

    def __init__(self, ordinal: int):
        drv = self.drv = driver_module()
        try:
            res = drv.cuInit(0)
        except Exception as e:  # noqa: BLE001 - cuda-bindings raises when libcuda.so cannot be loaded
            raise KumikoError("E1501", at="target cuda", why=f"the NVIDIA driver cannot be loaded: {e}",
                              suggestion=f"Run on a machine with an NVIDIA GPU and driver, {_EMU_HINT}.") from None
        err = res[0] if isinstance(res, tuple) else res
        if error_name(err) == "CUDA_ERROR_NO_DEVICE":
            raise KumikoError("E1501", at="target cuda", why="no CUDA device found (cuInit: CUDA_ERROR_NO_DEVICE)",
                              suggestion=f"Check nvidia-smi and CUDA_VISIBLE_DEVICES, {_EMU_HINT}.")
        _ok(res, "cuInit", "target cuda")
        count = _ok(drv.cuDeviceGetCount(), "cuDeviceGetCount", "target cuda")
        if not 0 <= ordinal < count:
            raise KumikoError("E1501", at="target cuda", why=f"device {ordinal} asked for, {count} visible",
                              suggestion=f"Use device=0..{count - 1}." if count else f"No GPU is visible; {_EMU_HINT}.")
        self.ordinal = ordinal
        self.handle = _ok(drv.cuDeviceGet(ordinal), "cuDeviceGet", "target cuda")
        name = _ok(drv.cuDeviceGetName(256, self.handle), "cuDeviceGetName", "target cuda")
        self.name = (name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)).strip()
        self.cc = (self.attribute("COMPUTE_CAPABILITY_MAJOR"), self.attribute("COMPUTE_CAPABILITY_MINOR"))
        self.arch = arch_for_cc(*self.cc)
        self.sm_count = self.attribute("MULTIPROCESSOR_COUNT")
        self.smem_optin = self.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        self.total_mem = int(_ok(drv.cuDeviceTotalMem(self.handle), "cuDeviceTotalMem", "target cuda"))
        self.driver_version = int(_ok(drv.cuDriverGetVersion(), "cuDriverGetVersion", "target cuda"))
        self.ctx = _ok(drv.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain", "target cuda")
        self._stream = drv.CUstream(0)
        self._capture_stream: Any = None
        self._capture_lock = threading.Lock()
        self._tls = threading.local()            # .stream: the capture stream while this thread captures

    def attribute(self, name: str) -> int:
        attr = getattr(self.drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(_ok(self.drv.cuDeviceGetAttribute(attr, self.handle), "cuDeviceGetAttribute", "target cuda"))

    def activate(self) -> None:
        """Make the primary context current on this thread (another library may have changed it)."""
        _ok(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent", "target cuda")

    def describe(self) -> dict:
        return {"name": self.name, "ordinal": self.ordinal, "cc": f"{self.cc[0]}.{self.cc[1]}", "arch": self.arch,
                "sm_count": self.sm_count, "smem_optin": self.smem_optin, "total_mem": self.total_mem,
                "driver": f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"}

    # -- memory -----------------------------------------------------------------------------------
    def alloc(self, nbytes: int, what: str) -> int:
        ptr = _ok(self.drv.cuMemAlloc(max(int(nbytes), 256)), "cuMemAlloc", what, bytes=int(nbytes))
        return int(ptr)

    def free(self, ptr: int) -> None:
        _ok(self.drv.cuMemFree(ptr), "cuMemFree", "target cuda")

    def upload(self, ptr: int, arr: np.ndarray, what: str) -> None:
        if arr.nbytes:
            _ok(self.drv.cuMemcpyHtoD(ptr, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD", what)

    def download(self, arr: np.ndarray, ptr: int, what: str) -> None:
        if arr.nbytes:
            _ok(self.drv.cuMemcpyDtoH(arr.ctypes.data, ptr, arr.nbytes), "cuMemcpyDtoH", what)

    def fill(self, ptr: int, byte: int, nbytes: int, what: str) -> None:
        if nbytes:
            _ok(self.drv.cuMemsetD8(ptr, byte, nbytes), "cuMemsetD8", what)

    def encode_tensor_map(self, enc: Any, address: int, what: str) -> bytes:
        """``cuTensorMapEncodeTiled`` of a ``kernel.tensormap.TiledEncoding`` over the device array at ``address``:
        the 128 bytes of the ``CUtensorMap`` a kernel takes by value (``const __grid_constant__``)."""
        d = self.drv
        res = d.cuTensorMapEncodeTiled(
            d.CUtensorMapDataType(enc.data_type), enc.rank, int(address),
            [d.cuuint64_t(x) for x in enc.global_dim], [d.cuuint64_t(x) for x in enc.global_strides],
            [d.cuuint32_t(x) for x in enc.box_dim], [d.cuuint32_t(x) for x in enc.element_strides],
            d.CUtensorMapInterleave(enc.interleave), d.CUtensorMapSwizzle(enc.swizzle),
            d.CUtensorMapL2promotion(enc.l2_promotion), d.CUtensorMapFloatOOBfill(enc.oob_fill))
        tmap = _ok(res, "cuTensorMapEncodeTiled", what, dims=list(enc.global_dim), box=list(enc.box_dim),
                   strides=list(enc.global_strides), address=hex(int(address)))
        return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)

    # -- modules and launches ---------------------------------------------------------------------
    def load_module(self, image: bytes, what: str) -> Any:
        return _ok(self.drv.cuModuleLoadData(image), "cuModuleLoadData", what)

    def unload_module(self, module: Any) -> None:
        _ok(self.drv.cuModuleUnload(module), "cuModuleUnload", "target cuda")

    def function(self, module: Any, kernel: str) -> Any:
        return _ok(self.drv.cuModuleGetFunction(module, kernel.encode()), "cuModuleGetFunction", kernel)

    def set_dynamic_smem(self, fn: Any, kernel: str, nbytes: int) -> None:
        """Raise a kernel's dynamic shared memory limit (the default is 48 KiB)."""
        attr = self.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _ok(self.drv.cuFuncSetAttribute(fn, attr, int(nbytes)), "cuFuncSetAttribute", kernel, smem=int(nbytes))

    def launch(self, fn: Any, kernel: str, grid: tuple, block: tuple, smem: int, argv: Any) -> None:
        """``cuLaunchKernel`` on the default stream (on the capture stream inside ``capture``); ``argv`` is the ctypes
        ``void*[]`` of kernelParams."""
        stream = getattr(self._tls, "stream", None)
        stream = self._stream if stream is None else stream
        _ok(self.drv.cuLaunchKernel(fn, *grid, *block, int(smem), stream, ctypes.addressof(argv), 0),
            "cuLaunchKernel", kernel, grid=list(grid), block=list(block), smem=int(smem))

    # -- CUDA Graphs -------------------------------------------------------------------------------
    def capture(self, issue: Callable[[], Any], what: str) -> Any:
        """A CUDA Graph of the launches ``issue`` makes, instantiated (a ``CUgraphExec``).

        The launches are captured on a non-blocking stream of this device's own (capture is not allowed on the
        legacy default stream; the capture stream only records, the graph is replayed on the default stream), in
        thread-local mode so another thread's CUDA calls are not swept in. ``issue`` must only launch (no copy,
        no sync). The kernel parameters are copied into the graph: it replays the same pointers and sizes.
        """
        drv = self.drv
        with self._capture_lock:
            if self._capture_stream is None:
                self._capture_stream = _ok(drv.cuStreamCreate(int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)),
                                           "cuStreamCreate", what)
            stream = self._capture_stream
            mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            _ok(drv.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture", what)
            self._tls.stream = stream
            try:
                issue()
            except BaseException:
                res = drv.cuStreamEndCapture(stream)          # leave the stream usable; the partial graph goes
                if int(res[0]) == 0:
                    drv.cuGraphDestroy(res[1])
                raise
            finally:
                self._tls.stream = None
            graph = _ok(drv.cuStreamEndCapture(stream), "cuStreamEndCapture", what)
        try:
            return _ok(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate", what)
        finally:
            drv.cuGraphDestroy(graph)

    def graph_launch(self, exe: Any, what: str) -> None:
        """Replay an instantiated graph on the default stream (in order with copies, fills and launches there)."""
        _ok(self.drv.cuGraphLaunch(exe, self._stream), "cuGraphLaunch", what)

    def graph_destroy(self, exe: Any) -> None:
        _ok(self.drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy", "target cuda")

    def sync(self, what: str, **details: Any) -> None:
        """Wait for the device; a fault in a kernel launched since the last sync surfaces here."""
        _ok(self.drv.cuCtxSynchronize(), "cuCtxSynchronize", what, **details)

    # -- timing -----------------------------------------------------------------------------------
    def time_ms(self, fn: Callable[[], Any], reps: int = 10, warmup: int = 2) -> list[float]:
        """GPU time of ``fn`` (which enqueues work on the default stream) by CUDA events, per rep, after warm-ups."""
        drv = self.drv
        start = _ok(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate", "timing")
        end = _ok(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate", "timing")
        try:
            for _ in range(warmup):
                fn()
            self.sync("timing")
            out = []
            for _ in range(reps):
                _ok(drv.cuEventRecord(start, self._stream), "cuEventRecord", "timing")
                fn()
                _ok(drv.cuEventRecord(end, self._stream), "cuEventRecord", "timing")
                _ok(drv.cuEventSynchronize(end), "cuEventSynchronize", "timing")
                out.append(float(_ok(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime", "timing")))
            return out
        finally:
            drv.cuEventDestroy(start)
            drv.cuEventDestroy(end)

    def __repr__(self) -> str:
        return f"CudaDevice({self.ordinal}: {self.name}, sm_{self.cc[0]}{self.cc[1]})"


def device_available(ordinal: int = 0) -> tuple[bool, str]:
    """(True, description) when the cuda target can run here, else (False, the diagnostic's reason)."""
    try:
        dev = CudaDevice.get(ordinal)
    except KumikoError as e:
        return False, f"{e.code}: {e.why}"
    return True, f"{dev.name} (sm_{dev.cc[0]}{dev.cc[1]})"
