"""Build generated C into a shared library, cache it on disk by content, load it with ctypes.

A compiled program is one C translation unit; every region is a function with the kernel ABI
``int NAME(void** bufs, const long long* syms)`` (see docs/runtime.md). ``build_c`` compiles it with
gcc into ``<cache>/cpu/<sha256>.so``, keyed by everything that changes the machine code: the source,
the flags, the compiler's version, the headers the source includes and (for ``-march=native``) the
host's ISA. A second build of the same source compiles nothing.

Why the cache is paranoid: a half-written or truncated ``.so`` can be dlopen'ed and then crash the
process with SIGBUS on first touch. So gcc writes into a scratch directory and the entry is published
atomically (a temporary name in the cache directory, then ``os.replace``), a JSON sidecar records its
SHA-256 and size, and a load checks both before dlopen; an entry that fails either check (or dlopen) is
rebuilt, not trusted. gcc runs within ``KUMIKO_BUILD_TIMEOUT`` (E1706; ``toolchain.run_tool``).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.runtime.toolchain import build_dir, check_source_kept, clean_stale, run_tool
from kumiko.util.files import cache_root, clear_path, file_error, forget_roots, publish_entry, safe_stem
from kumiko.util.log import log

CC = "gcc"
INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11",
                                  "-ffp-contract=fast")
#: how many builds compiled, were served from the disk cache, or from the modules already loaded here
STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "rebuilt_corrupt": 0}

_LOADED: dict[tuple[str, str], "CModule"] = {}   # (cache root, key) -> module loaded in this process


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
        out = run_tool([CC, "-march=native", "-dM", "-E", "-x", "c", "-"], at=CC, input="").stdout
    except OSError:
        return frozenset()          # no gcc: cpu_features falls back on nothing; a build says what is missing
    return frozenset(m.group(1) for m in re.finditer(r"#define (\w+)", out))


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """``gcc --version``'s first line and the target triple: part of every cache key."""
    try:
        ver = run_tool([CC, "--version"], at=CC).stdout
        triple = run_tool([CC, "-dumpmachine"], at=CC).stdout
    except OSError as e:
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
        if lib is None and not so.is_file():
            raise KumikoError("E1502", at=str(so), why="the library just built vanished from the cache before it "
                              "could be loaded (was the cache directory deleted during the build?)",
                              suggestion="Run again; do not delete the cache while kumiko builds.")
        if lib is None:
            raise KumikoError("E1701", at=name, why=f"the freshly built {so.name} cannot be loaded")
    else:
        STATS["disk_hits"] += 1
    mod = CModule(so, key, lib, cached=cached, compile_s=compile_s)
    _LOADED[(str(root), key)] = mod
    log(2, f"build_c {name}: {'cache hit' if cached else f'compiled in {compile_s * 1e3:.0f} ms'}: {so}")
    return mod


def forget_loaded() -> None:
    """Drop the in-process module table, so the next build goes to the disk cache, and check the cache
    directory again (tests use it)."""
    _LOADED.clear()
    forget_roots()


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
            clear_path(p)       # a file, or a directory squatting the entry's name
    return lib


def _dlopen(path: Path) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError:
        return None


def _compile(source: str, flags: Sequence[str], name: str, root: Path, so: Path, meta: Path) -> float:
    """gcc into a scratch directory, then the entry published into the cache: the source, the sidecar, and
    last the library (a visible ``.so`` always has its sidecar). Nothing of a failed or killed build lands in
    the cache, and a cache directory deleted during the build is simply made again."""
    clean_stale(root)
    stem = safe_stem(name, "kumiko")
    t0 = time.perf_counter()
    with build_dir("build") as work:
        src, out = Path(work) / f"{stem}.c", Path(work) / f"{stem}.so"
        src.write_text(source)
        cmd = [CC, *flags, f"-I{INCLUDE_DIR}", str(src), "-o", str(out)]
        try:
            r = run_tool(cmd, at=name, cwd=work)
        except OSError as e:
            raise KumikoError("E1701", at=name, why=f"cannot run {CC}: {e}",
                              suggestion="Install gcc (Debian: apt-get install gcc).") from None
        if r.returncode != 0:
            check_source_kept(src, cmd)
            kept = Path(tempfile.gettempdir()) / f"kumiko-failed-{stem}-{so.stem[:12]}.c"   # not in the cache
            kept.write_text(source)
            raise KumikoError("E1701", at=name, why=f"{CC} failed (exit {r.returncode}):\n"
                              + _first_errors(r.stderr.replace(str(src), src.name)),
                              suggestion="The generated C does not compile: a code generator bug. The source is "
                              "kept at the path below; report it with the graph.", source=str(kept),
                              command=" ".join(cmd))
        try:
            data = out.read_bytes()
        except OSError as e:
            raise file_error(out, e, f"read the library {CC} just wrote") from None
    STATS["compiles"] += 1
    info = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "name": name,
            "flags": list(flags), "compiler": compiler_version()}
    publish_entry(so.with_suffix(".c"), source)     # kept beside the build, for reading and debugging
    publish_entry(meta, json.dumps(info, indent=1))
    publish_entry(so, data)                         # last: a visible .so always has its sidecar
    return time.perf_counter() - t0


def _first_errors(stderr: str, n: int = 12) -> str:
    """The compiler's first error lines (errors first, then whatever context follows them)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    first = next((k for k, ln in enumerate(lines) if "error" in ln), 0)
    return "\n".join("  " + ln for ln in lines[first:first + n])
