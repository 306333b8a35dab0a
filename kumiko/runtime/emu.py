"""The CUDA emulator runner (target ``cuda-emu``): build generated CUDA C with g++, run it on the CPU.

A machine without a GPU still tests the GPU path for real: the same ``.cu`` source the GPU gets is
compiled unchanged by ``g++ -std=c++20 -DKUMIKO_EMU`` against ``kumiko/include/cuda_emu.h`` (CUDA
threads as fibers, warp collectives from the PTX ISA fragment layouts, poisoned shared memory,
cp.async in deferred or eager mode) and launched through the ABI that ``KUMIKO_ENTRY`` exports.
See docs/emulator.md for the contract and for what each configuration catches.

    mod = build(source, EmuConfig(cp_async="eager", schedule="run_ahead"))
    mod.launch("gemm", grid=(2, 2), block=256, smem=56832, args=[a, b, c, m, n, k])

Builds are content-addressed (source, headers, flags, compiler version) in ``knobs.cache_dir()/emu``
and committed with ``os.replace``, so a concurrent or failed build never leaves a half-written
library. Faults the emulator detects come back as ``KumikoError`` E1702 with kernel, block and
thread; a bad launch or argument list as E1703; a failed build as E1701.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.plan.gpu import SMEM_LIMIT  # the shared memory of the GPU the emulation stands in for
from kumiko.runtime import emu_worker
from kumiko.runtime.pch import emulator_header
from kumiko.runtime.tensormap import TensorMapArg, emu_encode
from kumiko.runtime.toolchain import build_dir, check_source_kept, clean_stale, run_tool
from kumiko.util.files import cache_root, clear_path, file_error, write_file
from kumiko.util.log import log

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"
_HEADERS = ("cuda_emu.h", "cuda_emu_sm90.h", "cuda_emu_sm90_api.h", "cuda_emu_sm90_wgmma.h", "kumiko_cuda.cuh",
            "kumiko_cuda_sm90.cuh")
_ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:allocator_may_return_null=1"
_WORKER_TIMEOUT_S = 600


@dataclass(frozen=True)
class EmuConfig:
    """How to build and run an emulated kernel.

    ``cp_async``: "deferred" copies land only at the matching wait_group (a read before it sees the
    0xFF poison), "eager" copies at issue (a stage overwritten before every warp finished reading it
    shows up). ``schedule``: "round_robin" runs each thread until it blocks; "run_ahead" lets warp 0
    run to the next block barrier before any other warp moves (exposes missing trailing barriers);
    "reversed" is its mirror image (the last warp first and ahead, threads queued in descending order:
    a higher-numbered warp reading what a lower one has not written yet shows up); "random" picks a
    ready thread at random from ``seed`` (mixed with the block index), one more order per seed.
    ``sanitize="address"`` builds with AddressSanitizer and launches in a child process (an ASan
    report ends that process, not yours): out-of-bounds global accesses are reported exactly.
    ``poison_check`` makes ldmatrix fault on never-written shared memory instead of returning NaNs.
    """

    cp_async: str = "deferred"
    schedule: str = "round_robin"
    sanitize: str = "none"
    poison_check: bool = True
    arch: str = "sm90"
    opt_level: int | None = None
    stack_kib: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, allowed in (("cp_async", ("deferred", "eager")), ("schedule", emu_worker.SCHEDULES),
                              ("sanitize", ("none", "address")), ("arch", tuple(SMEM_LIMIT))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"EmuConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @property
    def label(self) -> str:
        """A short name for reports: ``deferred+round_robin``, ``eager+run_ahead+asan``."""
        order = f"{self.schedule}{self.seed}" if self.schedule == "random" else self.schedule
        return f"{self.cp_async}+{order}" + ("+asan" if self.sanitize == "address" else "")

    def compile_flags(self) -> list[str]:
        """The g++ flags that depend on this config (the build-cache key includes them)."""
        asan = self.sanitize == "address"
        opt = self.opt_level if self.opt_level is not None else 1
        flags = [f"-O{opt}"]
        if asan:
            flags += ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
        return flags

    def runtime_options(self) -> dict[str, Any]:
        """Options passed at launch time (one build serves every cp_async/schedule choice)."""
        return {"cp_async": self.cp_async, "schedule": self.schedule, "poison_check": self.poison_check,
                "stack_bytes": self.stack_kib * 1024, "max_smem": SMEM_LIMIT[self.arch], "seed": self.seed}


#: the configurations the end-to-end emulator tests run in; together they caught every bug injected
#: in the feasibility study and since (docs/emulator.md has the table). The warp-0-first schedules
#: never see a higher-numbered warp read before a lower-numbered one wrote: the reversed and the
#: seeded random orders do.
CONFIGS: dict[str, EmuConfig] = {
    "deferred+round_robin": EmuConfig(cp_async="deferred", schedule="round_robin"),
    "eager+run_ahead": EmuConfig(cp_async="eager", schedule="run_ahead"),
    "eager+reversed": EmuConfig(cp_async="eager", schedule="reversed"),
    "deferred+random1": EmuConfig(cp_async="deferred", schedule="random", seed=1),
    "asan": EmuConfig(sanitize="address"),
}

#: flags every emulator build gets; -fno-strict-aliasing because CUDA code type-puns freely (nvcc
#: tolerates it, g++ -O2 would not); hidden visibility and no STB_GNU_UNIQUE keep two kernel
#: libraries in one process from sharing the emulator's state
_BASE_FLAGS = ["-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-fno-gnu-unique", "-fno-strict-aliasing",
               "-DKUMIKO_EMU", "-pthread"]


@dataclass(frozen=True)
class LaunchResult:
    """What a launch reports: wall and CPU time and the emulator's counters (blocks, context switches...).

    ``cpu_seconds`` is this process's CPU time for an in-process launch (steadier than wall time on
    a loaded machine) and None for a launch in the ASan worker, whose ``seconds`` include its start.
    """

    seconds: float
    stats: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float | None = None


@functools.lru_cache(maxsize=4)
def _compiler_id(cxx: str) -> str:
    try:
        r = run_tool([cxx, "--version"], at=cxx)
    except OSError as e:
        raise KumikoError("E1701", at=cxx, why=f"g++ cannot be run: {e}",
                          suggestion="Install g++ 12 or newer (C++20).") from None
    if r.returncode != 0:
        raise KumikoError("E1701", at=cxx, why=f"{cxx} --version failed (exit {r.returncode}): "
                          + _first_error(r.stderr), suggestion="Install g++ 12 or newer (C++20).")
    return r.stdout.splitlines()[0] if r.stdout else cxx


def _find_cxx() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        raise KumikoError("E1701", at="g++", why="g++ is not on PATH; the CUDA emulator needs it",
                          suggestion="Install g++ 12 or newer (C++20).")
    return cxx


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", src, flags=re.S)


_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\b[^;{}]*?\b([A-Za-z_]\w*)\s*\[\s*\]\s*;")
_ENTRY = re.compile(r"\bKUMIKO_ENTRY\s*\(\s*([A-Za-z_]\w*)\s*\)")


def dynamic_shared_names(source: str) -> list[str]:
    """Names declared ``extern __shared__ T name[];`` (each gets a definition in a second unit)."""
    return sorted(set(_EXTERN_SHARED.findall(_strip_comments(source))))


def entry_names(source: str) -> list[str]:
    """Kernels the source exports with ``KUMIKO_ENTRY(name)``."""
    return list(dict.fromkeys(_ENTRY.findall(_strip_comments(source))))


def _dynamic_smem_unit(names: Sequence[str]) -> str:
    """The second translation unit: one thread_local array per `extern __shared__` name.

    `extern __shared__ T x[];` compiles to `extern thread_local T x[];`, a reference the kernel's own
    unit cannot define without a type clash; this unit defines it (as bytes, sized for the largest
    launch) and lists the arrays so the emulator can poison them and bound-check dynamic smem.
    """
    lines = ["// Generated by kumiko.runtime.emu: storage for the kernel's `extern __shared__` arrays.",
             "#include <cstddef>", "#ifndef KUMIKO_EMU_MAX_DYNAMIC_SMEM",
             f"#define KUMIKO_EMU_MAX_DYNAMIC_SMEM {max(SMEM_LIMIT.values())}", "#endif"]
    lines += [f"alignas(1024) thread_local unsigned char {n}[KUMIKO_EMU_MAX_DYNAMIC_SMEM];" for n in names]
    lines.append('extern "C" void kumiko_emu_dynamic_smem(void (*cb)(void*, std::size_t)) {')
    lines += [f"  cb({n}, sizeof {n});" for n in names]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _define_flags(defines: Mapping[str, Any] | None) -> list[str]:
    out = []
    for k, v in sorted((defines or {}).items()):
        out.append(f"-D{k}" if v is None or v is True else f"-D{k}={v}")
    return out


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line:
            return line.strip()
    lines = [x for x in log.splitlines() if x.strip()]
    return lines[0].strip() if lines else "the compiler failed without a message"


_build_lock = threading.Lock()
#: one lock per loaded library: configure + launch + read the fault record is one step (EmuModules
#: made by with_config share the library and its emulator state)
_launch_locks: dict[str, threading.Lock] = {}
#: one lock per library being built: threads of one process that need the same library build it once (two
#: builds at once would each clear the name the other is writing)
_compile_locks: dict[str, threading.Lock] = {}


def _lock_for(path: Path, table: dict[str, threading.Lock] = _launch_locks) -> threading.Lock:
    with _build_lock:
        return table.setdefault(str(path), threading.Lock())


def build(source: str, config: EmuConfig | None = None, *, name: str = "kernel",
          defines: Mapping[str, Any] | None = None, extra_flags: Sequence[str] = ()) -> EmuModule:
    """Compile a CUDA source for the emulator and return the loaded module.

    The library lives at ``cache_dir()/emu/<name>-<hash>.so`` with its sources in the directory of
    the same name (reports point into them). The hash covers the source, both headers, the flags and
    the compiler version, so an edit anywhere rebuilds and nothing stale is ever loaded.
    """
    config = config or EmuConfig()
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"build name {name!r} must be a plain file name")
    cxx = _find_cxx()
    dyn = dynamic_shared_names(source)
    flags = _BASE_FLAGS + config.compile_flags() + _define_flags(defines) + list(extra_flags)
    # the precompiled emulator header leaves the build's own macros out: one header serves every kernel of a
    # config (g++ reads the text instead when one of those macros is one the header tests)
    header_flags = _BASE_FLAGS + config.compile_flags() + list(extra_flags)
    headers = hashlib.sha256()          # the headers, read once: the library's key and the precompiled one's
    for hdr in _HEADERS:
        headers.update(hdr.encode() + b"\0" + (INCLUDE_DIR / hdr).read_bytes() + b"\0")
    h = hashlib.sha256()
    for part in (source, _dynamic_smem_unit(dyn) if dyn else "", " ".join(flags), _compiler_id(cxx),
                 headers.hexdigest()):
        h.update(part.encode())
        h.update(b"\0")
    key = f"{name}-{h.hexdigest()[:20]}"
    root = cache_root("emu")           # KUMIKO_CACHE=0 or an unwritable cache: this process's temporary one
    lib = root / f"{key}.so"
    srcdir = root / key
    what = "cache hit"
    with _lock_for(lib, _compile_locks):
        if not lib.is_file():
            clear_path(lib)            # a directory squatting the library's name
            t0 = time.perf_counter()
            _compile(cxx, flags, header_flags, headers.hexdigest(), source, dyn, name, srcdir, lib)
            what = f"compiled in {(time.perf_counter() - t0) * 1e3:.0f} ms"
    log(2, f"build_emu {name} ({config.label}): {what}: {lib}")
    return EmuModule(lib, config, name=name, source_path=srcdir / f"{name}.cu", kernels=entry_names(source))


def _run_cxx(cmd: list[str], cxx: str, name: str) -> subprocess.CompletedProcess:
    try:
        return run_tool(cmd, at=name)
    except OSError as e:
        raise KumikoError("E1701", at=name, why=f"cannot run {cxx}: {e}",
                          suggestion="Install g++ 12 or newer (C++20).") from None


def _compile(cxx: str, flags: list[str], header_flags: list[str], headers: str, source: str, dyn: list[str],
             name: str, srcdir: Path, lib: Path) -> None:
    """Compile into a temp file and publish it with os.replace; on failure (a timeout included) remove every
    trace. The sources stay in the cache beside the library (reports point into them). ``header_flags``: those
    of the precompiled ``cuda_emu.h`` the unit includes (``kumiko.runtime.pch``)."""
    clean_stale(lib.parent)
    if not srcdir.is_dir() and (srcdir.exists() or srcdir.is_symlink()):
        clear_path(srcdir)             # a file squatting the sources' directory name
    src = srcdir / f"{name}.cu"
    write_file(src, source, "the emulator source")
    main = srcdir / "main.cpp"  # the kernel unit: the emulator first, then the source unchanged
    write_file(main, f'#include "cuda_emu.h"\n#include "{src.name}"\n', "the emulator source")
    units = ["-x", "c++", str(main)]
    if dyn:
        write_file(srcdir / "dynamic_smem.cpp", _dynamic_smem_unit(dyn), "the emulator source")
        units += ["-x", "c++", str(srcdir / "dynamic_smem.cpp")]
    try:
        fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=f".{lib.name}.", suffix=".tmp")
    except OSError as e:
        raise file_error(lib.parent, e, "write into the emulator cache") from None
    os.close(fd)
    try:
        with build_dir("emu") as scratch:      # the precompiled emulator header, first on the include path
            pre = ["-I", scratch] if emulator_header(cxx, header_flags, _compiler_id(cxx), INCLUDE_DIR / "cuda_emu.h",
                                                     headers, lib.parent, Path(scratch)) else []
            cmd = [cxx, *flags, *pre, "-I", str(INCLUDE_DIR), "-I", str(srcdir), *units, "-o", tmp]
            proc = _run_cxx(cmd, cxx, name)
        if proc.returncode != 0:
            check_source_kept(src, cmd)
            log = proc.stderr[-8000:]
            raise KumikoError("E1701", at=name, why=f"g++ could not build the emulator library: {_first_error(log)}",
                              command=" ".join(cmd), log=log)
        try:
            os.replace(tmp, lib)
        except OSError as e:
            raise file_error(lib, e, "publish the emulator library") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if not lib.exists():
            shutil.rmtree(srcdir, ignore_errors=True)
        raise


def _norm3(v: int | Sequence[int], what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int | np.integer) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int | np.integer) for x in t):
        raise KumikoError("E1703", at=what, why=f"{what} must be an int or 1-3 ints, got {v!r}")
    t = tuple(int(x) for x in t) + (1,) * (3 - len(t))
    if any(x < 0 or x >= 2**32 for x in t):
        raise KumikoError("E1703", at=what, why=f"{what} {t} has a dimension outside [0, 2^32)")
    return t  # type: ignore[return-value]


def _fault(err_json: str, module: EmuModule, kernel: str) -> KumikoError:
    e = json.loads(err_json)
    if e["kind"] == "launch_config":
        return KumikoError("E1703", at=kernel, why=e["message"], library=str(module.path))
    at = kernel
    if e.get("block") is not None:
        at += " block ({},{},{})".format(*e["block"])
    if e.get("thread") is not None:
        at += " thread ({},{},{})".format(*e["thread"])
    details = {"fault": e["kind"], "kernel": kernel, "block": e.get("block"), "thread": e.get("thread")}
    if e.get("where"):
        details["where"] = e["where"]
    return KumikoError("E1702", at=at, why=e["message"], config=module.config.label, **details)


_ASAN_ERROR = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_ASAN_ACCESS = re.compile(r"^(READ|WRITE) of size (\d+)", re.M)
_ASAN_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ in (.+?) (/\S+?:\d+)(?::\d+)?$", re.M)
_EMU_WHO = re.compile(r"kumiko-emu: AddressSanitizer fault in kernel (\S+), block \((\d+),(\d+),(\d+)\), "
                      r"thread \((\d+),(\d+),(\d+)\)")


def asan_fault(stderr: str, kernel: str, config_label: str) -> KumikoError:
    """Turn an AddressSanitizer report into E1702: what, where in the kernel source, which thread."""
    m = _ASAN_ERROR.search(stderr)
    kind = m.group(1) if m else "error"
    access = _ASAN_ACCESS.search(stderr)
    frame = next((f for f in _ASAN_FRAME.finditer(stderr)
                  if not f.group(2).split(":")[0].endswith(("cuda_emu.h", "kumiko_cuda.cuh"))), None)
    why = f"AddressSanitizer: {kind}"
    if access:
        why += f" ({access.group(1)} of {access.group(2)} bytes)"
    details: dict[str, Any] = {"fault": f"asan:{kind}", "kernel": kernel}
    if frame:
        why += f" at {frame.group(2)} in {frame.group(1)}"
        details["where"] = frame.group(2)
    at = kernel
    who = _EMU_WHO.search(stderr)
    if who:
        details["block"] = [int(x) for x in who.group(2, 3, 4)]
        details["thread"] = [int(x) for x in who.group(5, 6, 7)]
        at += " block ({},{},{}) thread ({},{},{})".format(*details["block"], *details["thread"])
    start = stderr.find("=================================================================")
    details["report"] = stderr[start if start >= 0 else 0:][:6000]
    return KumikoError("E1702", at=at, why=why, config=config_label, **details)


class _Guarded:
    """An in-process copy of an array argument between two poisoned guard zones.

    In-process launches cannot afford AddressSanitizer, but a kernel that stores past the end of
    an output (a missing epilogue predicate) must not corrupt Python's heap, and should be caught.
    So each array is copied into a buffer with 0xFF-filled zones before and after it (reads there
    see NaN, like unwritten shared memory) and the zones are checked after the launch. Data starts
    256-byte aligned, as cudaMalloc's does.
    """

    GUARD = 0xFE
    FRONT = 4096
    TAIL = 64 * 1024

    def __init__(self, arr: np.ndarray):
        self.arr = arr
        self.nbytes = arr.nbytes
        self.raw = np.full(self.FRONT + self.nbytes + self.TAIL + 256, self.GUARD, dtype=np.uint8)
        self.start = (-self.raw.ctypes.data) % 256 + self.FRONT
        if self.nbytes:
            self.raw[self.start:self.start + self.nbytes] = arr.reshape(-1).view(np.uint8)
        self.address = self.raw.ctypes.data + self.start

    def damage(self) -> str:
        """'' if both guard zones are intact, else where the first foreign bytes are."""
        before = np.flatnonzero(self.raw[:self.start] != self.GUARD)
        after = np.flatnonzero(self.raw[self.start + self.nbytes:] != self.GUARD)
        parts = []
        if before.size:
            parts.append(f"{self.start - int(before[0])} bytes before its start")
        if after.size:
            parts.append(f"{int(after[-1]) + 1} bytes past its end (first at +{int(after[0])})")
        return ", ".join(parts)

    def copy_back(self) -> None:
        if self.nbytes:
            self.arr.reshape(-1).view(np.uint8)[:] = self.raw[self.start:self.start + self.nbytes]


class EmuModule:
    """A built emulator library: launch its kernels with numpy arrays (changed in place)."""

    def __init__(self, path: Path, config: EmuConfig, *, name: str, source_path: Path, kernels: list[str]):
        self.path = path
        self.config = config
        self.name = name
        self.source_path = source_path
        self.kernels = kernels
        self._lib: ctypes.CDLL | None = None
        self._bound: dict[str, tuple[Any, list[str]]] = {}
        self._sigs: dict[str, list[str]] = {}

    def with_config(self, config: EmuConfig) -> EmuModule:
        """The same library run with other run-time options (cp_async, schedule, poison_check...).

        cp.async mode and scheduling are launch-time switches, so one build serves both non-ASan
        configurations; a config that needs other compile flags (sanitize, opt_level) needs build().
        """
        if config.compile_flags() != self.config.compile_flags():
            raise ValueError(f"{config.label} needs a different build than {self.config.label}; call build()")
        return EmuModule(self.path, config, name=self.name, source_path=self.source_path, kernels=self.kernels)

    @property
    def isolated(self) -> bool:
        """ASan libraries run in a child process (see emu_worker)."""
        return self.config.sanitize == "address"

    def _load(self) -> ctypes.CDLL:
        if self._lib is None:
            self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
        return self._lib

    def signature(self, kernel: str) -> list[str]:
        """Parameter codes as KUMIKO_ENTRY exports them, e.g. ``["cptr:f16", "ptr:f32", "i32"]``."""
        if kernel not in self._sigs:
            if self.isolated:
                self._sigs[kernel] = self._run_worker(kernel, (1, 1, 1), (1, 1, 1), 0, [], signature_only=True)[1]
            else:
                self._sigs[kernel] = self._bind(kernel)[1]
        return self._sigs[kernel]

    def _bind(self, kernel: str) -> tuple[Any, list[str]]:
        if kernel not in self._bound:
            try:
                self._bound[kernel] = emu_worker.bind(self._load(), kernel)
            except emu_worker.ArgError as e:
                raise KumikoError("E1703", at=kernel, why=str(e), library=str(self.path)) from None
        return self._bound[kernel]

    def launch(self, kernel: str, grid: int | Sequence[int], block: int | Sequence[int], smem: int = 0,
               args: Sequence[Any] = ()) -> LaunchResult:
        """Run ``kernel<<<grid, block, smem>>>(args...)``; arrays for non-const pointers are updated.

        Raises E1702 for a fault the emulator (or AddressSanitizer) detected, E1703 for a launch the
        GPU would refuse or arguments that do not match the kernel's signature.
        """
        g, b = _norm3(grid, "grid"), _norm3(block, "block")
        if not 0 <= int(smem) < 2**32:
            raise KumikoError("E1703", at=kernel, why=f"shared memory size {smem} out of range")
        maps = [a for a in args if isinstance(a, TensorMapArg)]
        if self.isolated:
            if maps:
                raise KumikoError("E1703", at=kernel, why="tensor map arguments are not supported in the ASan worker "
                                  "yet", config=self.config.label)
            t0 = time.perf_counter()
            rc, _, err, stats = self._run_worker(kernel, g, b, int(smem), list(args))
            return self._finish(kernel, rc, err, stats, time.perf_counter() - t0)
        launch, sig = self._bind(kernel)
        lib = self._load()
        guarded = [_Guarded(a) if isinstance(a, np.ndarray) and a.flags.c_contiguous else None for a in args]
        map_guards = [_Guarded(np.ascontiguousarray(m.array)) for m in maps]  # the TMA unit's view of each array
        slot = {id(m): i for i, m in enumerate(maps)}     # by identity: two maps may encode alike (equal boxes)
        args = [emu_encode(lib, a.encoding, map_guards[slot[id(a)]].address) if isinstance(a, TensorMapArg) else a
                for a in args]
        try:  # (a non-contiguous array gets no guard: pack_args rejects it)
            argv, keep = emu_worker.pack_args(sig, list(args), [x.address if x else None for x in guarded])
        except emu_worker.ArgError as e:
            raise KumikoError("E1703", at=kernel, why=str(e), signature=",".join(sig)) from None
        with _lock_for(self.path):
            emu_worker.configure(lib, self.config.runtime_options())
            t0, c0 = time.perf_counter(), time.process_time()
            rc, err, stats = emu_worker.call(lib, launch, g, b, int(smem), argv)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        del keep
        result = self._finish(kernel, rc, err, stats, seconds, cpu)
        for i, (x, code) in enumerate(zip(guarded, sig)):
            if x is None:
                continue
            damage = x.damage()
            if damage:
                raise KumikoError("E1702", at=kernel, why=f"the kernel wrote outside argument {i} ({code}, "
                                  f"{x.nbytes} bytes): {damage}", config=self.config.label,
                                  fault="out_of_bounds_write", kernel=kernel)
            if code.startswith("ptr:"):
                x.copy_back()
        for m, x in zip(maps, map_guards):  # TMA stores write through the map
            damage = x.damage()
            if damage:
                raise KumikoError("E1702", at=kernel, why=f"the kernel wrote outside a tensor map's array: {damage}",
                                  config=self.config.label, fault="out_of_bounds_write", kernel=kernel)
            if m.array.flags.writeable and m.array.flags.c_contiguous:
                x.arr = m.array
                x.copy_back()
        return result

    def _finish(self, kernel: str, rc: int, err: str, stats: str, seconds: float,
                cpu: float | None = None) -> LaunchResult:
        if rc != 0:
            if err:
                raise _fault(err, self, kernel)
            raise KumikoError("E1702", at=kernel, why=f"the launch returned {rc} without a fault record")
        return LaunchResult(seconds, json.loads(stats) if stats else {}, cpu)

    def _run_worker(self, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                    args: list[Any], signature_only: bool = False) -> tuple[int, list[str], str, str]:
        """One launch in a child Python with the ASan runtime preloaded; copies outputs back."""
        with build_dir("emu-run") as d:
            req_dir = Path(d)
            spec: list[dict[str, Any]] = []
            for i, a in enumerate(args):
                if isinstance(a, np.ndarray):
                    data = a.view(np.uint16) if a.dtype.name == "bfloat16" else a
                    np.save(req_dir / f"arg{i}.npy", data, allow_pickle=False)
                    spec.append({"kind": "array"})
                elif a is None:
                    spec.append({"kind": "null"})
                else:
                    value = a.item() if isinstance(a, np.generic) else a
                    if isinstance(value, bytes):
                        value = list(value)
                    spec.append({"kind": "scalar", "value": value})
            req = {"library": str(self.path), "kernel": kernel, "grid": grid, "block": block, "smem": smem,
                   "config": self.config.runtime_options(), "args": spec, "signature_only": signature_only}
            (req_dir / "request.json").write_text(json.dumps(req))
            env = dict(os.environ)
            env["LD_PRELOAD"] = _asan_runtime()
            env["ASAN_OPTIONS"] = _ASAN_OPTIONS
            try:
                proc = subprocess.run([sys.executable, emu_worker.__file__, str(req_dir)], env=env,
                                      capture_output=True, text=True, timeout=_WORKER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise KumikoError("E1702", at=kernel, why=f"the emulated launch ran longer than {_WORKER_TIMEOUT_S} s "
                                  "(an endless loop in the kernel?)", config=self.config.label) from None
            resp_file = req_dir / "response.json"
            if proc.returncode != 0 or not resp_file.exists():
                if "AddressSanitizer" in proc.stderr:
                    raise asan_fault(proc.stderr, kernel, self.config.label)
                raise KumikoError("E1702", at=kernel, why=f"the emulator process died (exit status {proc.returncode})",
                                  config=self.config.label, log=proc.stderr[-4000:])
            resp = json.loads(resp_file.read_text())
            if resp["arg_error"]:
                raise KumikoError("E1703", at=kernel, why=resp["arg_error"],
                                  signature=",".join(resp["signature"] or []))
            for i, a in enumerate(args):
                out = req_dir / f"out{i}.npy"
                if isinstance(a, np.ndarray) and out.exists():
                    target = a.view(np.uint16) if a.dtype.name == "bfloat16" else a
                    np.copyto(target, np.load(out))
            return resp["rc"] if resp["rc"] is not None else 0, resp["signature"] or [], resp["error"], resp["stats"]

    def __repr__(self) -> str:
        return f"EmuModule({self.name!r}, {self.config.label}, kernels={self.kernels})"


@functools.lru_cache(maxsize=1)
def _asan_runtime() -> str:
    """LD_PRELOAD for the worker: g++'s libasan.so first (the instrumented library needs its runtime
    loaded before anything else), then libstdc++ (ASan resolves the real __cxa_throw when it starts;
    Python does not link libstdc++, and without it the emulator's fault unwinding would abort)."""
    libs = []
    for lib in ("libasan.so", "libstdc++.so.6"):
        out = run_tool([_find_cxx(), f"-print-file-name={lib}"], at=lib).stdout.strip()
        if not out or not Path(out).exists():
            raise KumikoError("E1701", at=lib, why=f"g++ has no {lib} for the AddressSanitizer configuration",
                              suggestion="Install libasan and libstdc++ for your g++ (e.g. libgcc-12-dev).")
        libs.append(str(Path(out).resolve()))
    return ":".join(libs)
