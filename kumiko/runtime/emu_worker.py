"""Calling an emulator-built kernel library: argument packing, and the out-of-process worker.

Two callers share this file. ``kumiko.runtime.emu`` imports it to launch kernels in-process. The
AddressSanitizer configuration cannot do that (an ASan-instrumented library needs the ASan runtime
loaded before anything else, and an ASan report ends the process), so ``emu.py`` runs this file as
a script in a child Python with ``LD_PRELOAD=libasan.so``: it copies each array into a buffer of
exactly its size (so the sanitizer's redzone starts at the first byte past the end, as with
``cudaMalloc``), launches, and copies the results back. The script imports only numpy and the
standard library, so the child starts fast and never imports the compiler.
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

#: dtypes a pointer parameter of each element code accepts (names as numpy spells them)
_PTR_DTYPES: dict[str, tuple[str, ...]] = {
    "f16": ("float16", "uint16"),
    "bf16": ("bfloat16", "uint16"),
    "f32": ("float32",),
    "f64": ("float64",),
    "i16": ("int16",),
    "u16": ("uint16", "int16", "float16", "bfloat16"),
    "i32": ("int32",),
    "u32": ("uint32", "int32"),
    "i64": ("int64",),
    "u64": ("uint64", "int64"),
    "bool": ("bool",),
}
#: the emulator's thread schedules, in the order of cuda_emu.h's ``Schedule`` enum
SCHEDULES = ("round_robin", "run_ahead", "reversed", "random")
#: numpy dtype of each scalar parameter code
_SCALAR_DTYPES = {
    "bool": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32",
    "u32": "uint32", "i64": "int64", "u64": "uint64", "f16": "float16", "f32": "float32", "f64": "float64",
}


class ArgError(Exception):
    """An argument does not fit the kernel's parameter (count, kind, dtype or writability)."""


def parse_signature(sig: str) -> list[str]:
    """``"cptr:f16,ptr:f32,i32"`` -> ``["cptr:f16", "ptr:f32", "i32"]`` (what KUMIKO_ENTRY exports)."""
    return [s for s in sig.split(",") if s]


def _bf16_bits(value: float) -> np.ndarray:
    """Round a float to bfloat16 (nearest even, NaN -> 0x7FFF) without needing ml_dtypes."""
    u = np.array(value, dtype=np.float32).view(np.uint32)
    if np.isnan(np.float32(value)):
        return np.array(0x7FFF, dtype=np.uint16)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def scalar_bytes(code: str, value: Any) -> bytes:
    """The bytes of a by-value kernel parameter: numpy casts, raw structs as given."""
    if code.startswith("raw"):
        size = int(code[3:])
        data = value.tobytes() if isinstance(value, np.ndarray | np.generic) else bytes(value)
        if len(data) != size:
            raise ArgError(f"needs {size} raw bytes, got {len(data)}")
        return data
    if code == "bf16":
        return _bf16_bits(float(value)).tobytes()
    if code not in _SCALAR_DTYPES:
        raise ArgError(f"unsupported parameter type {code}")
    if isinstance(value, np.ndarray) and value.ndim > 0:
        raise ArgError(f"is a by-value {code} parameter, got an array")
    if isinstance(value, float | np.floating) and code[0] in "iub":
        raise ArgError(f"is an integer ({code}) parameter, got {value!r}")
    return np.array(value).astype(_SCALAR_DTYPES[code]).tobytes()


def check_array(code: str, arr: np.ndarray) -> None:
    """A pointer parameter gets a C-contiguous array of a dtype that fits its element type."""
    const, elem = code.split(":", 1)
    if not arr.flags.c_contiguous:
        raise ArgError("needs a C-contiguous array (use np.ascontiguousarray)")
    if const == "ptr" and not arr.flags.writeable:
        raise ArgError("is a writable pointer, but the array is read-only")
    allowed = _PTR_DTYPES.get(elem)
    if allowed is not None and arr.dtype.name not in allowed:
        raise ArgError(f"points to {elem}, but the array has dtype {arr.dtype.name} (expected {' or '.join(allowed)})")


def value_buffer(data: bytes) -> Any:
    """A by-value parameter's bytes in a buffer of at least 16 bytes, aligned to 64 (a CUtensorMap is a
    128-byte struct aligned to 64, which the kernel's copy may load with aligned moves)."""
    raw = ctypes.create_string_buffer(max(16, len(data)) + 64)
    pad = (-ctypes.addressof(raw)) % 64
    ctypes.memmove(ctypes.addressof(raw) + pad, data, len(data))
    return (ctypes.c_char * max(16, len(data))).from_buffer(raw, pad)


def pack_args(signature: Sequence[str], args: Sequence[Any], pointers: Sequence[int | None]) -> tuple[Any, list]:
    """Build the ``void** args`` array (cuLaunchKernel's kernelParams) for a launch.

    ``pointers[i]`` is the device address to pass for array argument ``i`` (None for scalars): the
    array's own data in-process, a tightly allocated copy in the worker. Returns the ctypes array
    and the buffers it points into, which must stay alive for the launch.
    """
    if len(args) != len(signature):
        raise ArgError(f"the kernel takes {len(signature)} arguments ({','.join(signature)}), got {len(args)}")
    keep: list = []
    for i, (code, arg) in enumerate(zip(signature, args)):
        try:
            if code.startswith(("ptr:", "cptr:")):
                if arg is None:
                    keep.append(ctypes.c_void_p(0))
                elif isinstance(arg, np.ndarray):
                    check_array(code, arg)
                    keep.append(ctypes.c_void_p(pointers[i]))
                elif isinstance(arg, int) and not isinstance(arg, bool):
                    keep.append(ctypes.c_void_p(arg))
                else:
                    raise ArgError(f"is a pointer ({code}); pass a numpy array, an address or None")
            else:
                if isinstance(arg, np.ndarray) and arg.ndim > 0:
                    raise ArgError(f"is a by-value {code} parameter, got an array")
                keep.append(value_buffer(scalar_bytes(code, arg)))
        except ArgError as e:
            raise ArgError(f"argument {i} ({code}) {e}") from None
    argv = (ctypes.c_void_p * max(1, len(keep)))(*[ctypes.addressof(k) for k in keep])
    return argv, keep


def bind(lib: ctypes.CDLL, name: str) -> tuple[Any, list[str]]:
    """The launch function and parameter codes of kernel ``name`` in a loaded library."""
    try:
        launch = getattr(lib, f"kumiko_launch_{name}")
        sig_fn = getattr(lib, f"kumiko_signature_{name}")
    except AttributeError:
        raise ArgError(f"the library has no kernel {name!r} (is it wrapped in KUMIKO_ENTRY({name})?)") from None
    launch.argtypes = [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    sig_fn.restype = ctypes.c_char_p
    return launch, parse_signature(sig_fn().decode())


def configure(lib: ctypes.CDLL, cfg: dict[str, Any]) -> None:
    """Pass the run-time options of an EmuConfig (see cuda_emu.h kumiko_emu_configure)."""
    lib.kumiko_emu_configure.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_uint,
                                         ctypes.c_ulonglong]
    rc = lib.kumiko_emu_configure(int(cfg["cp_async"] == "eager"), SCHEDULES.index(cfg["schedule"]),
                                  int(cfg["poison_check"]), int(cfg["stack_bytes"]), int(cfg["max_smem"]),
                                  int(cfg.get("seed", 0)) & (2**64 - 1))
    if rc != 0:
        raise ArgError(f"the emulator library refused schedule {cfg['schedule']!r} (an older cuda_emu.h?)")


def call(lib: ctypes.CDLL, launch: Any, grid: Sequence[int], block: Sequence[int], smem: int,
         argv: Any) -> tuple[int, str, str]:
    """Launch; returns (rc, fault JSON or "", stats JSON)."""
    rc = launch(*grid, *block, smem, ctypes.cast(argv, ctypes.c_void_p), None)
    lib.kumiko_emu_last_error.restype = ctypes.c_char_p
    lib.kumiko_emu_last_stats.restype = ctypes.c_char_p
    return rc, lib.kumiko_emu_last_error().decode(), lib.kumiko_emu_last_stats().decode()


def _worker(req_dir: Path) -> None:
    """Run one launch described by ``req_dir/request.json``; write ``response.json`` and outputs."""
    req = json.loads((req_dir / "request.json").read_text())
    resp: dict[str, Any] = {"rc": None, "error": "", "stats": "", "arg_error": None, "signature": None}
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    lib = ctypes.CDLL(req["library"])
    buffers: list[tuple[int, np.ndarray, int]] = []
    try:
        configure(lib, req["config"])
        launch, sig = bind(lib, req["kernel"])
        resp["signature"] = sig
        if req.get("signature_only"):
            return
        args: list[Any] = []
        pointers: list[int | None] = []
        for i, a in enumerate(req["args"]):
            if a["kind"] == "array":
                arr = np.load(req_dir / f"arg{i}.npy")  # bfloat16 arrives as its uint16 bits
                p = ctypes.c_void_p()
                if libc.posix_memalign(ctypes.byref(p), 256, max(arr.nbytes, 1)) != 0:
                    raise MemoryError("posix_memalign failed")
                ctypes.memmove(p.value, arr.ctypes.data, arr.nbytes)
                buffers.append((i, arr, p.value))
                args.append(arr)
                pointers.append(p.value)
            elif a["kind"] == "null":
                args.append(None)
                pointers.append(None)
            else:
                args.append(a["value"])
                pointers.append(None)
        argv, keep = pack_args(sig, args, pointers)
        rc, err, stats = call(lib, launch, req["grid"], req["block"], req["smem"], argv)
        resp.update(rc=rc, error=err, stats=stats)
        for i, arr, ptr in buffers:
            if sig[i].startswith("ptr:"):
                ctypes.memmove(arr.ctypes.data, ptr, arr.nbytes)
                np.save(req_dir / f"out{i}.npy", arr)
    except ArgError as e:
        resp["arg_error"] = str(e)
    finally:
        for _, _, ptr in buffers:
            libc.free(ptr)
        (req_dir / "response.json").write_text(json.dumps(resp))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
