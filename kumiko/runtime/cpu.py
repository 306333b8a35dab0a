"""Build generated C into a shared library, cache it on disk by content, load it with ctypes.

A compiled program is one C translation unit; every region is a function with the kernel ABI
``int NAME(void** bufs, const long long* syms)`` (see docs/runtime.md). ``build_c`` compiles it with
gcc into ``<cache>/cpu/<sha256>.so``, keyed by everything that changes the machine code: the source,
the flags, the compiler's version, the headers the source includes and (for ``-march=native``) the
host's ISA. A second build of the same source compiles nothing.

Why the cache is paranoid: a half-written or truncated ``.so`` can be dlopen'ed and then crash the
process with SIGBUS on first touch. So an entry is written atomically (compiled to a temporary name in
the cache directory, then ``os.replace``), a JSON sidecar records its SHA-256 and size, and a load
checks both before dlopen; an entry that fails either check (or dlopen) is rebuilt, not trusted.
"""
from __future__ import annotations

import atexit
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kumiko import knobs
from kumiko.diagnostics import KumikoError

CC = "gcc"
INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11",
                                  "-ffp-contract=fast")
#: how many builds compiled, were served from the disk cache, or from the modules already loaded here
STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "rebuilt_corrupt": 0}

_LOADED: dict[tuple[str, str], "CModule"] = {}   # (cache root, key) -> module loaded in this process
_TEMP_CACHE: list[Path] = []


# ------------------------------------------------------------------------------------------------
# the host

@functools.lru_cache(maxsize=None)
def cpu_features() -> dict:
    """The ISA of this machine, detected at run time (CI's machines differ from a laptop's).

    From ``/proc/cpuinfo``'s flags; where that is missing (not Linux), from the macros that
    ``gcc -march=native`` defines, which is also what generated code is compiled for.
    """
    flags: set[str] = set()
    model, source = "", "/proc/cpuinfo"
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("flags", "Features") and not flags:
                flags = set(value.split())
            elif key in ("model name", "Processor") and not model:
                model = value.strip()
    except OSError:
        pass
    if not flags:
        source = "gcc -march=native"
        macros = native_macros()
        flags = {name for name, macro in (("avx512f", "__AVX512F__"), ("avx2", "__AVX2__"), ("avx", "__AVX__"),
                                          ("fma", "__FMA__"), ("f16c", "__F16C__"), ("sse2", "__SSE2__"),
                                          ("asimd", "__ARM_NEON"))
                 if macro in macros}
    feats = {k: k in flags for k in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "avx", "fma", "f16c")}
    feats["neon"] = "asimd" in flags or "neon" in flags
    feats["vector_width_f32"] = 16 if feats["avx512f"] else 8 if feats["avx"] else 4
    feats["model"] = model or _uname_machine()
    feats["cores"] = os.cpu_count() or 1
    feats["source"] = source
    return feats


def _uname_machine() -> str:
    return os.uname().machine if hasattr(os, "uname") else "unknown"


@functools.lru_cache(maxsize=None)
def native_macros() -> frozenset[str]:
    """The ISA macros ``gcc -march=native`` defines (what ``KUMIKO_VW`` in kumiko_cpu.h will see)."""
    try:
        out = subprocess.run([CC, "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True,
                             text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(m.group(1) for m in re.finditer(r"#define (\w+)", out))


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """``gcc --version``'s first line and the target triple: part of every cache key."""
    try:
        ver = subprocess.run([CC, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
        triple = subprocess.run([CC, "-dumpmachine"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KumikoError("E1701", at=CC, why=f"the C compiler cannot be run: {e}",
                          suggestion="Install gcc (Debian: apt-get install gcc).") from None
    return (ver.splitlines() or [""])[0].strip() + " " + triple.strip()


# ------------------------------------------------------------------------------------------------
# modules

@dataclass
class CModule:
    """A loaded shared library. ``fn(name)`` gives a kernel callable: ``f(arrays, syms) -> int``."""
    path: Path
    key: str
    lib: ctypes.CDLL
    cached: bool            # True when this build compiled nothing (disk or memory hit)
    compile_s: float = 0.0

    def fn(self, name: str) -> Callable[[Sequence[np.ndarray], Sequence[int]], int]:
        try:
            cfn = getattr(self.lib, name)
        except AttributeError:
            raise KumikoError("E1703", at=f"{self.path.name}", why=f"the module defines no function {name!r}",
                              suggestion="Check the kernel names the generated source exports.") from None
        cfn.restype = ctypes.c_int
        cfn.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong))
        return _KernelFn(name, cfn)


class _KernelFn:
    """Calls one ABI function; ctypes releases the GIL for the call, so OpenMP threads run freely."""

    def __init__(self, name: str, cfn):
        self.name, self._cfn = name, cfn

    def pointers(self, arrays: Sequence[np.ndarray], syms: Sequence[int]):
        """The ABI's argument arrays; build them once when calling in a loop (the bench does)."""
        for k, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError(f"{self.name}: buffer {k} is not C-contiguous")
        bufs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        sym_arr = (ctypes.c_longlong * max(1, len(syms)))(*[int(s) for s in syms])
        return bufs, sym_arr

    def call_pointers(self, bufs, sym_arr) -> int:
        return int(self._cfn(bufs, sym_arr))

    def __call__(self, arrays: Sequence[np.ndarray], syms: Sequence[int]) -> int:
        return self.call_pointers(*self.pointers(arrays, syms))


# ------------------------------------------------------------------------------------------------
# building and the cache

def cache_root(kind: str = "cpu") -> Path:
    """``<KUMIKO_CACHE>/<kind>`` (``cpu`` shared objects, ``cubin`` GPU images); with the cache off
    (``KUMIKO_CACHE=0``), under a per-process temporary directory."""
    base = knobs.cache_dir()
    if base is None:
        if not _TEMP_CACHE:
            tmp = Path(tempfile.mkdtemp(prefix="kumiko-cache-"))
            _TEMP_CACHE.append(tmp)
            atexit.register(shutil.rmtree, tmp, True)
        base = _TEMP_CACHE[0]
    return base / kind


def header_digest(source: str) -> str:
    """The headers of kumiko/include the source names: editing kumiko_cpu.h (or kumiko_cuda.cuh, which
    holds the PTX) must invalidate old builds."""
    h = hashlib.sha256()
    for p in sorted(INCLUDE_DIR.iterdir()) if INCLUDE_DIR.is_dir() else ():
        if p.is_file() and p.name in source:
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str, flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler_version(), header_digest(source)):
        h.update(part.encode())
        h.update(b"\x00\x01")
    if any(f.startswith(("-march=native", "-mtune=native", "-mcpu=native")) for f in flags):
        h.update(" ".join(sorted(native_macros())).encode())   # a shared cache across different hosts stays right
    return h.hexdigest()


def build_c(source: str, *, flags: Sequence[str] | None = None, extra_flags: Sequence[str] = (),
            name: str = "kumiko") -> CModule:
    """Compile ``source`` (one C translation unit) and load it; reuse the cached build when there is one.

    ``flags`` replaces ``DEFAULT_FLAGS``; ``extra_flags`` are appended (e.g. ``-mno-f16c`` in tests).
    ``-I kumiko/include`` is always added. A compile error raises E1701 KernelBuildFailed with the
    compiler's first error lines and leaves nothing in the cache.
    """
    all_flags = tuple(DEFAULT_FLAGS if flags is None else flags) + tuple(extra_flags)
    key = cache_key(source, all_flags)
    root = cache_root()
    mod = _LOADED.get((str(root), key))
    if mod is not None:
        STATS["memory_hits"] += 1
        return CModule(mod.path, key, mod.lib, cached=True)
    so, meta = root / f"{key}.so", root / f"{key}.json"
    lib = _load_entry(so, meta)
    cached, compile_s = lib is not None, 0.0
    if lib is None:
        compile_s = _compile(source, all_flags, name, root, so, meta)
        lib = _dlopen(so)
        if lib is None:
            raise KumikoError("E1701", at=name, why=f"the freshly built {so.name} cannot be loaded")
    else:
        STATS["disk_hits"] += 1
    mod = CModule(so, key, lib, cached=cached, compile_s=compile_s)
    _LOADED[(str(root), key)] = mod
    if knobs.debug() >= 2:
        what = "cache hit" if cached else f"compiled in {compile_s * 1e3:.0f} ms"
        print(f"kumiko: build_c {name}: {what}: {so}", file=sys.stderr)
    if knobs.debug() >= 4 and not cached:
        print(source, file=sys.stderr)
    return mod


def forget_loaded() -> None:
    """Drop the in-process module table, so the next build goes to the disk cache (tests use it)."""
    _LOADED.clear()


def _load_entry(so: Path, meta: Path) -> ctypes.CDLL | None:
    """A cache entry, if it is whole: the sidecar's digest matches the file and dlopen accepts it."""
    if not so.exists():
        return None
    try:
        info = json.loads(meta.read_text())
        data = so.read_bytes()
        ok = len(data) == info["size"] and hashlib.sha256(data).hexdigest() == info["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    lib = _dlopen(so) if ok else None
    if lib is None:
        STATS["rebuilt_corrupt"] += 1
        for p in (so, meta):
            try:
                p.unlink()
            except OSError:
                pass
    return lib


def _dlopen(path: Path) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError:
        return None


def _compile(source: str, flags: Sequence[str], name: str, root: Path, so: Path, meta: Path) -> float:
    root.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "kumiko"
    fd, tmp_so = tempfile.mkstemp(dir=root, prefix=f".{so.stem}.", suffix=".so.tmp")
    os.close(fd)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="kumiko-build-") as work:
            src = Path(work) / f"{stem}.c"
            src.write_text(source)
            cmd = [CC, *flags, f"-I{INCLUDE_DIR}", str(src), "-o", tmp_so]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, check=False)
            except OSError as e:
                raise KumikoError("E1701", at=name, why=f"cannot run {CC}: {e}",
                                  suggestion="Install gcc (Debian: apt-get install gcc).") from None
            if r.returncode != 0:
                kept = Path(tempfile.gettempdir()) / f"kumiko-failed-{stem}-{so.stem[:12]}.c"   # not in the cache
                kept.write_text(source)
                raise KumikoError("E1701", at=name, why=f"{CC} failed (exit {r.returncode}):\n"
                                  + _first_errors(r.stderr.replace(str(src), src.name)),
                                  suggestion="The generated C does not compile: a code generator bug. The source is "
                                  "kept at the path below; report it with the graph.", source=str(kept),
                                  command=" ".join(cmd))
        STATS["compiles"] += 1
        data = Path(tmp_so).read_bytes()
        info = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "name": name,
                "flags": list(flags), "compiler": compiler_version()}
        _atomic_text(so.with_suffix(".c"), source)   # kept beside the build, for reading and debugging
        _atomic_text(meta, json.dumps(info, indent=1))
        os.replace(tmp_so, so)                       # last: a visible .so always has its sidecar
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    return time.perf_counter() - t0


def _atomic_text(path: Path, text: str) -> None:
    from kumiko.util import atomic_write
    atomic_write(path, text)


def _first_errors(stderr: str, n: int = 12) -> str:
    """The compiler's first error lines (errors first, then whatever context follows them)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    first = next((k for k, ln in enumerate(lines) if "error" in ln), 0)
    return "\n".join("  " + ln for ln in lines[first:first + n])
