"""Build generated C into a shared library, cache it on disk by content, load it with ctypes.

Every kernel has the ABI ``int NAME(void** bufs, const long long* syms)`` (see docs/runtime.md). Two ways
to build:

- ``build_c``: one C translation unit, compiled by one gcc into ``<cache>/cpu/<sha256>.so``, keyed by
  everything that changes the machine code: the source, the flags, the compiler's version, the headers the
  source includes and (for ``-march=native``) the host's ISA. A second build of the same source compiles
  nothing.
- ``build_units``: several translation units (the ``cpu`` target gives one per distinct kernel,
  ``kumiko.render.cpu_program``), each compiled by ``gcc -c`` into ``<cache>/cpu/<sha256>.o`` (the same key,
  over the unit and the compile flags), by a pool of threads running one gcc each (``jobs``, default the
  CPUs this process may use), then linked into ``<cache>/cpu/<sha256>.so`` keyed by the objects' keys and
  the link flags. A library in the cache is loaded without looking at its objects (a warm build runs no gcc
  and hashes only the units' text); a network that shares kernels with another, or changes one layer,
  compiles only the units whose objects are not in the cache.

Why the cache is paranoid: a half-written or truncated ``.so`` can be dlopen'ed and then crash the
process with SIGBUS on first touch. So gcc writes into a scratch directory and the entry is published
atomically (a temporary name in the cache directory, then ``os.replace``), a JSON sidecar records its
SHA-256 and size, and a load checks both before dlopen; an entry that fails either check (or dlopen) is
rebuilt, not trusted. Objects get the same treatment: published atomically with a sidecar, checked before
each link (a corrupt one is compiled again), and linked from checked copies in the build's scratch
directory, never from the cache. Every gcc runs within ``KUMIKO_BUILD_TIMEOUT`` (E1706; ``toolchain.run_tool``).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.runtime.host import CC, compiler_version, cpu_features, native_macros  # noqa: F401 (re-exported)
from kumiko.runtime.toolchain import build_dir, check_source_kept, clean_stale, first_errors, optional_output, run_tool
from kumiko.util.files import (
    cache_root,
    clear_path,
    file_error,
    forget_roots,
    place_entry,
    publish_checked,
    publish_entry,
    read_entry,
    safe_stem,
)
from kumiko.util.log import log

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11",
                                  "-ffp-contract=off", "-fno-trapping-math")
#: flags a kind of unit (``kumiko.render.cpu_program.CpuSource.unit_kinds``) gets after the others. A packed
#: contraction's hot loops are its micro-kernels, vectorised by hand (GCC vector types), which -O2 compiles as
#: -O3 does; -O3's loop versioning, peeling and unswitching of the rest (index tables, packing, thread modes)
#: doubled the unit's compile time and code size. On a 2-core Zen 3, -O2 against -O3 (one process, builds
#: interleaved 30 rounds): 3x3 convs 64 -> 64 at 56x56 and 256 -> 256 at 14x14 0.99 and 1.01 of the time, a
#: 1x1 conv 1.01, a 128 x 768 x 3072 GEMM with a GELU epilogue 1.00; ResNet-50's cold compile 15.2 -> 10.8 s.
#: A contraction whose epilogue reduces keeps -O3 (a batched matmul with its softmax ran 1.09-1.18x slower at
#: -O2), and so do loop nests: their scalar tails and row loops are what -O3 vectorises. Then -O1 with the
#: vectoriser (the epilogue's and the packing's ``omp simd`` loops), strict aliasing, aligned loops and jumps
#: and the second scheduling pass: one unit 1.62 -> 1.18 s of gcc, ResNet-50's cold compile on a slower
#: 2-core Zen 3 15.0-16.0 s -> 12.4-13.2 s, MobileNetV2 12.4 -> 10.9 s; whole networks alternating in one
#: process 0.98-1.01 of the time. -O1 and the vectoriser alone ran the 128 x 3072 x 768 GEMM 1.08x slower.
#: A constant operand's pack function (``pack``) runs once per set of sizes, or on a call that passes other
#: arrays for the constant: plain -O1 halves its unit's gcc time (ResNet-50's 27 pack units 7.0 -> 3.6 s of
#: gcc on a 2-core Zen 3, a fifth of all its units' time) and packs about 5% slower (ResNet-50 with every
#: weight passed anew, packed on each call: 1.026 of the time; with its bound weights, once).
#: A contraction's register allocator takes the function as one region (``-fira-region=one``): its units 13.8 ->
#: 12.3 s of gcc for ResNet-50, the networks 0.99-1.02 of the time (in-process A/B, 30-60 pairs: MobileNetV2
#: 0.988, ResNet-50 1.006 and 1.016, BERT 1.010, every interquartile range across 1.0; the hand-vectorised
#: micro-kernels' loops keep their registers). ``-fno-ivopts`` saved 9% more gcc but ran ResNet-50 1.047x.
UNIT_FLAGS: dict[str, tuple[str, ...]] = {"contraction": (
    "-O1", "-ftree-vectorize", "-fstrict-aliasing", "-falign-loops", "-falign-jumps", "-falign-functions",
    "-fschedule-insns2", "-fira-region=one"), "pack": ("-O1",)}
#: libraries built (compiled, or linked from objects), served from the disk cache or from the modules already
#: loaded here, cache entries found corrupt and rebuilt (libraries, objects, precompiled headers); objects
#: of ``build_units`` compiled and found in the cache; links run; precompiled headers built and found
STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "rebuilt_corrupt": 0,
         "objects_compiled": 0, "objects_cached": 0, "links": 0, "pch_compiled": 0, "pch_cached": 0}
#: ``build_units`` precompiles the units' common prefix when it has at least this many units to compile (it
#: costs about five units' parsing once, and saves most of the parsing of every unit after; then it is cached)
_PCH_MIN_UNITS = 8
_stats_lock = threading.Lock()

_C_NAME = re.compile(r"[A-Za-z_]\w*")
_LOADED: dict[tuple[str, str], "CModule"] = {}   # (cache root, key) -> module loaded in this process


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

    def steps_fn(self):
        """The module's ``kumiko_run_steps`` (``kumiko_cpu.h``: a run's kernels in one C call), or None when
        its source did not include the header."""
        try:
            fn = self.lib["kumiko_run_steps"]
        except AttributeError:
            return None
        fn.restype = ctypes.c_int
        return fn

    def fn(self, name: str) -> Callable[[Sequence[np.ndarray], Sequence[int]], int]:
        try:
            cfn = getattr(self.lib, name)
        except AttributeError:
            raise KumikoError("E1703", at=f"{self.path.name}", why=f"the module defines no function {name!r}",
                              suggestion="Check the kernel names the generated source exports.") from None
        cfn.restype = ctypes.c_int
        cfn.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong))
        bare = self.lib[name]          # a second function object of its own: no argument conversion
        bare.restype = ctypes.c_int
        return _KernelFn(name, cfn, bare)


class _KernelFn:
    """Calls one ABI function; ctypes releases the GIL for the call, so OpenMP threads run freely.

    ``bare(bufs, syms)`` is the same function without ctypes' argument conversion (about half the cost of a
    call): only for the ABI's own argument arrays, ``ctypes.c_void_p * n`` and ``ctypes.c_longlong * m``,
    which ``CpuProgram`` prepares once per call state and set of sizes."""

    def __init__(self, name: str, cfn, bare=None):
        self.name, self._cfn = name, cfn
        self.bare = bare if bare is not None else cfn

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

def header_digest(source: str, headers: Sequence[tuple[str, bytes]] | None = None) -> str:
    """The headers of kumiko/include the source names: editing kumiko_cpu.h (or kumiko_cuda.cuh, which
    holds the PTX) must invalidate old builds. ``headers``: ``_headers()`` read once for many sources."""
    h = hashlib.sha256()
    for name, data in _headers() if headers is None else headers:
        if name in source:
            h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def _headers() -> list[tuple[str, bytes]]:
    """(name, contents) of the files in kumiko/include, sorted by name."""
    return [(p.name, p.read_bytes()) for p in sorted(INCLUDE_DIR.iterdir()) if p.is_file()] \
        if INCLUDE_DIR.is_dir() else []


def cache_key(source: str, flags: Sequence[str], headers: Sequence[tuple[str, bytes]] | None = None) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler_version(), header_digest(source, headers)):
        h.update(part.encode())
        h.update(b"\x00\x01")
    if any(f.startswith(("-march=native", "-mtune=native", "-mcpu=native")) for f in flags):
        h.update(" ".join(sorted(native_macros())).encode())   # a shared cache across different hosts stays right
    return h.hexdigest()


def link_key(object_keys: Sequence[str], flags: Sequence[str]) -> str:
    """A library linked from objects: their keys (each covers its unit, flags, compiler, headers and ISA), in
    link order, and the link flags."""
    h = hashlib.sha256(b"link\0")
    for part in (*object_keys, "\0".join(flags), compiler_version()):
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()


def unit_flags(flags: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile flags of one object, link flags) from the flags of a one-unit build: ``-c`` instead of
    ``-shared``, and ``-shared`` (with the rest: ``-fopenmp`` links libgomp) for the link."""
    compile_flags = tuple(f for f in flags if f != "-shared") + ("-c",)
    link_flags = tuple(flags) + (() if "-shared" in flags else ("-shared",))
    return compile_flags, link_flags


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        STATS[key] += n


def build_c(source: str, *, flags: Sequence[str] | None = None, extra_flags: Sequence[str] = (),
            name: str = "kumiko") -> CModule:
    """Compile ``source`` (one C translation unit) and load it; reuse the cached build when there is one.

    ``flags`` replaces ``DEFAULT_FLAGS``; ``extra_flags`` are appended (e.g. ``-mno-f16c`` in tests).
    ``-I kumiko/include`` is always added. A compile error raises E1701 KernelBuildFailed with the
    compiler's first error lines and leaves nothing in the cache.
    """
    all_flags = tuple(DEFAULT_FLAGS if flags is None else flags) + tuple(extra_flags)
    key = cache_key(source, all_flags)
    mod = _cached_or_made(key, name, "built", lambda root, so, meta: _compile(source, all_flags, name, root, so, meta))
    log(2, f"build_c {name}: {'cache hit' if mod.cached else f'compiled in {mod.compile_s * 1e3:.0f} ms'}: {mod.path}")
    return mod


def _cached_or_made(key: str, name: str, verb: str, make: Callable[[Path, Path, Path], float]) -> CModule:
    """The library of cache key ``key``: already loaded here, a whole cache entry, or ``make(root, so, meta)``
    (which publishes it and returns the seconds it took), then loaded."""
    root = cache_root()
    mod = _LOADED.get((str(root), key))
    if mod is not None:
        _count("memory_hits")
        return CModule(mod.path, key, mod.lib, cached=True)
    so, meta = root / f"{key}.so", root / f"{key}.json"
    lib = _load_entry(so, meta)
    cached, compile_s = lib is not None, 0.0
    if lib is None:
        compile_s = make(root, so, meta)
        lib = _dlopen(so)
        if lib is None and not so.is_file():
            raise KumikoError("E1502", at=str(so), why=f"the library just {verb} vanished from the cache before it "
                              "could be loaded (was the cache directory deleted during the build?)",
                              suggestion="Run again; do not delete the cache while kumiko builds.")
        if lib is None:
            raise KumikoError("E1701", at=name, why=f"the freshly {verb} {so.name} cannot be loaded")
    else:
        _count("disk_hits")
    mod = CModule(so, key, lib, cached=cached, compile_s=compile_s)
    _LOADED[(str(root), key)] = mod
    return mod


def build_units(units: Sequence[str], *, flags: Sequence[str] | None = None, extra_flags: Sequence[str] = (),
                name: str = "kumiko", jobs: int | None = None, aliases: Sequence[tuple[str, str]] = (),
                prefix: str = "", unit_extra: Sequence[Sequence[str]] | None = None) -> CModule:
    """Compile each of ``units`` (C translation units) into an object, in parallel, link them into one
    library and load it; every object and the library are cached (module docstring).

    ``flags``/``extra_flags`` as for ``build_c`` (``-shared`` becomes ``-c`` for the objects); ``jobs``: gcc
    processes at a time (default: the CPUs this process may use); ``aliases``: (name, defined name) pairs the
    library exports as well (``ld --defsym``: the same function under a second name, no code); ``prefix``:
    text every unit starts with (the header and the prelude), parsed once into a precompiled header
    (``_PCH_MIN_UNITS``); ``unit_extra``: flags of each unit's own, after the others (``UNIT_FLAGS``). A unit
    that does not compile raises E1701 with the compiler's first errors (the units not started yet are not
    compiled), a link that fails E1701 too; nothing of a failed build lands in the cache, but the objects
    compiled before it stay there."""
    if not units:
        raise ValueError("build_units: no translation units")
    if prefix and not all(u.startswith(prefix) for u in units):
        raise ValueError("build_units: a unit does not start with the prefix")
    all_flags = tuple(DEFAULT_FLAGS if flags is None else flags) + tuple(extra_flags)
    compile_flags, link_flags = unit_flags(all_flags)
    for alias, defined in aliases:
        if not (_C_NAME.fullmatch(alias) and _C_NAME.fullmatch(defined)):
            raise ValueError(f"build_units: alias {alias!r} -> {defined!r} is not a pair of C names")
        link_flags += (f"-Wl,--defsym={alias}={defined}",)
    headers = _headers()
    if unit_extra is not None and len(unit_extra) != len(units):
        raise ValueError("build_units: unit_extra needs one entry per unit")
    per_unit = [compile_flags + tuple(unit_extra[i] if unit_extra is not None else ()) for i in range(len(units))]
    keys = [cache_key(u, f, headers) for u, f in zip(units, per_unit)]
    key = link_key(keys, link_flags)
    mod = _cached_or_made(key, name, "linked", lambda root, so, meta: _build_linked(
        units, keys, compile_flags, per_unit, link_flags, name, root, so, meta, jobs, prefix))
    # the same tag as build_c's line: KUMIKO_DEBUG=2 readers (and tests) look for "build_c NAME:"
    log(2, f"build_c {name}: {len(units)} units, "
        f"{'cache hit' if mod.cached else f'built in {mod.compile_s * 1e3:.0f} ms'}: {mod.path}")
    return mod


def build_jobs() -> int:
    """How many gcc processes ``build_units`` runs at once: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _build_linked(units: Sequence[str], keys: Sequence[str], compile_flags: Sequence[str],
                  per_unit: Sequence[Sequence[str]], link_flags: Sequence[str], name: str, root: Path, so: Path,
                  meta: Path, jobs: int | None, prefix: str = "") -> float:
    """The objects (from the cache, or compiled in parallel with ``per_unit`` flags each), copied into a scratch
    directory and linked there; the library published like ``_compile``'s. Returns the seconds it took."""
    clean_stale(root)
    stem = safe_stem(name, "kumiko")
    t0 = time.perf_counter()
    with build_dir("build") as work:
        work = Path(work)
        objs = [work / f"u{i}.o" for i in range(len(units))]
        todo = []
        for i, k in enumerate(keys):
            data = _load_object(root / f"{k}.o", root / f"{k}.json")
            if data is None:
                todo.append(i)
                continue
            _count("objects_cached")
            try:
                objs[i].write_bytes(data)
            except OSError as e:
                raise file_error(objs[i], e, "copy an object into the build directory") from None
        todo.sort(key=lambda i: (-len(units[i]), i))          # the longest first: the pool ends sooner
        tasks = []
        include = None
        if prefix and todo:
            # one precompiled prefix for every unit: gcc takes it whatever a unit's -O level (the macros agree)
            include, pch_task = _precompiled(prefix, compile_flags, name, root, work, len(todo))
            tasks += [pch_task] if pch_task is not None else []

        body_line = prefix.count("\n") + 1        # where a unit's own text starts, for gcc's line numbers

        def one(i: int) -> None:
            text = units[i] if include is None else \
                f'#include "{include}"\n#line {body_line}\n' + units[i][len(prefix):]
            _compile_object(units[i], text, per_unit[i], f"{name}[{i}]", f"{stem}_{i}", root, keys[i], work, objs[i])
        tasks += [functools.partial(one, i) for i in todo]
        workers = min(jobs or build_jobs(), len(tasks))
        if workers <= 1:
            for task in tasks:
                task()
        elif tasks:
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kumiko-gcc")
            try:
                futures = [pool.submit(task) for task in tasks]
                wait(futures, return_when=FIRST_EXCEPTION)
                for f in futures:                    # the first failure in submission order, if any
                    if f.done() and f.exception() is not None:
                        raise f.exception()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)   # a failure or Ctrl-C starts no further gcc
        out = work / f"{stem}.so"
        cmd = [CC, *link_flags, "-o", str(out), *map(str, objs)]
        r = _gcc(cmd, name, work)
        if r.returncode != 0:
            check_source_kept(objs[0], cmd)
            raise KumikoError("E1701", at=name, why=f"linking {len(objs)} objects failed (exit {r.returncode}):\n"
                              + first_errors(r.stderr), suggestion="A code generator bug (a symbol defined in two "
                              "units?): report it with the graph.", command=" ".join(cmd))
        try:
            data = out.read_bytes()
        except OSError as e:
            raise file_error(out, e, f"read the library {CC} just linked") from None
    _count("links")
    _count("compiles")
    publish_checked(so, meta, data, name=name, flags=list(link_flags), compiler=compiler_version(),
                    objects=list(keys))
    return time.perf_counter() - t0


def _compile_object(source: str, text: str, flags: Sequence[str], at: str, stem: str, root: Path, key: str,
                    work: Path, out: Path) -> None:
    """One unit into ``out`` (in the scratch directory) with ``gcc -c``, then published into the cache as
    ``<key>.o`` with its sidecar and ``source``. ``text`` is what gcc reads: ``source``, or the same with its
    prefix included from the precompiled header (a ``#line`` keeps the line numbers of ``source``, which is
    what a failure keeps for the report). Runs in a pool thread."""
    src = work / f"{stem}.c"
    try:
        src.write_text(text)
    except OSError as e:
        raise file_error(src, e, "write a translation unit into the build directory") from None
    _run_compiler([CC, *flags, f"-I{INCLUDE_DIR}", str(src), "-o", str(out)], source, src, at, stem, key, work)
    try:
        data = out.read_bytes()
    except OSError as e:
        raise file_error(out, e, f"read the object {CC} just wrote") from None
    _count("objects_compiled")
    publish_entry(root / f"{key}.c", source)
    publish_checked(root / f"{key}.o", root / f"{key}.json", data, name=at, flags=list(flags),
                    compiler=compiler_version())


def _precompiled(prefix: str, compile_flags: Sequence[str], name: str, root: Path, work: Path, n_units: int
                 ) -> tuple[str, Callable[[], None] | None]:
    """The header the units include instead of their common ``prefix`` (written into ``work``), and the task
    that precompiles it, if one is needed.

    gcc reads ``<header>.gch`` in its place when the file is there and valid, and the header's text when not,
    so the precompiled header only saves time: a cached one (``<key>.gch``, checked like an object, once per
    process) is hard-linked into ``work`` (``place_entry``); else, with ``_PCH_MIN_UNITS`` units or more to
    compile, the returned task builds it, runs first in the pool and publishes it into ``work`` (atomically)
    and the cache, while units that start before it is there parse the text; one that ``start_precompiled``
    began when the compile started and that is still building is waited for by that task instead. A
    precompiled header that fails to build is left out, not an error."""
    pch_flags, key, header = _pch_names(prefix, compile_flags)
    try:
        (work / header).write_text(prefix)
    except OSError as e:
        raise file_error(work / header, e, "write the units' common header into the build directory") from None
    gch = work / f"{header}.gch"
    early = _pch_early.get((str(root), key))

    def cached() -> bool:
        if (root / f"{key}.gch").exists():
            if place_entry(root / f"{key}.gch", root / f"{key}.json", gch):
                _count("pch_cached")
                return True
            _count("rebuilt_corrupt")       # damaged and removed: built again below
        return False
    if early is not None and n_units >= _PCH_MIN_UNITS:
        # being built since the compile began (``start_precompiled``): a pool worker waits for it, the others
        # compile units from the text meanwhile
        return header, lambda: early.wait(BUILD_WAIT_S) and cached()
    if cached():
        return header, None
    if n_units < _PCH_MIN_UNITS:
        return header, None
    return header, lambda: _build_pch(header, pch_flags, key, name, root, work, publish_into=gch)


def _pch_names(prefix: str, compile_flags: Sequence[str]) -> tuple[tuple[str, ...], str, str]:
    """The precompiled header's flags, cache key and header file name for a prefix under the units' flags."""
    pch_flags = tuple(f for f in compile_flags if f != "-c")
    key = cache_key(prefix, pch_flags + ("-x", "c-header"))
    return pch_flags, key, f"kumiko_prefix_{key[:16]}.h"


def _build_pch(header: str, pch_flags: Sequence[str], key: str, name: str, root: Path, work: Path,
               publish_into: Path | None = None) -> None:
    """gcc precompiles ``work/header`` and the result is published into the cache (and, atomically, as
    ``publish_into``: a gcc that starts then sees all of it or nothing). One that fails is logged, not raised:
    the units parse the text instead."""
    tmp = work / f"{header}.part"
    cmd = [CC, *pch_flags, f"-I{INCLUDE_DIR}", "-x", "c-header", str(work / header), "-o", str(tmp)]
    built = optional_output(cmd, f"{name} (precompiled header)", work, tmp)
    if built is None:
        log(1, f"the precompiled header of {name} did not build; the units parse its text")
        return
    if publish_into is not None:
        os.replace(tmp, publish_into)
    _count("pch_compiled")
    publish_checked(root / f"{key}.gch", root / f"{key}.json", built, name=header, flags=list(pch_flags),
                    compiler=compiler_version())


#: (cache root, key) -> set when the precompiled header ``start_precompiled`` builds is in the cache (or failed)
_pch_early: dict[tuple[str, str], threading.Event] = {}
_pch_lock = threading.Lock()
#: how long a build waits for a precompiled header begun early before its units go on parsing the text
BUILD_WAIT_S = 120.0


def start_precompiled(prefix: str, flags: Sequence[str] | None = None, name: str = "kumiko") -> bool:
    """Begin building the precompiled header of the units' common ``prefix`` (``build_units``'s, under ``flags``
    as there) in a thread of its own, when the cache lacks it: a compile calls this before its Python stages
    (regions, plans, lowering: seconds for a network on one core), so gcc precompiles on another core and the
    units find it ready instead of waiting for it, or parsing the text, at the start of the build (ResNet-50 on
    an empty cache: 1.3-1.5 s of gcc). Returns whether a build began."""
    compile_flags, _ = unit_flags(tuple(DEFAULT_FLAGS if flags is None else flags))
    pch_flags, key, header = _pch_names(prefix, compile_flags)
    root = cache_root()
    slot = (str(root), key)
    with _pch_lock:
        if slot in _pch_early or (root / f"{key}.gch").exists():
            return False
        done = _pch_early[slot] = threading.Event()

    def run() -> None:
        try:
            with build_dir("pch") as work:
                (Path(work) / header).write_text(prefix)
                _build_pch(header, pch_flags, key, name, root, Path(work))
        except Exception as e:  # noqa: BLE001 - only a speed-up: the build makes it itself
            log(1, f"the precompiled header begun early did not build: {e}")
        finally:
            with _pch_lock:
                _pch_early.pop(slot, None)
            done.set()
    threading.Thread(target=run, name="kumiko-pch", daemon=True).start()
    return True


def _load_object(obj: Path, meta: Path) -> bytes | None:
    """A cached object's bytes, if it is whole (the sidecar's digest and size match); a damaged entry is
    removed and counted, and the caller compiles the unit again."""
    if not obj.exists():
        return None
    entry = read_entry(obj, meta)
    if entry is None:
        _count("rebuilt_corrupt")
        return None
    return entry[0]


def load_library(data: bytes, *, name: str = "kumiko") -> CModule:
    """A library from its bytes (a saved Executable's): published into the cache under its digest, as a
    build's entry is (atomically, with its sidecar), and loaded; nothing is compiled."""
    key = "lib-" + hashlib.sha256(data).hexdigest()
    root = cache_root()
    mod = _LOADED.get((str(root), key))
    if mod is not None:
        return CModule(mod.path, key, mod.lib, cached=True)
    so, meta = root / f"{key}.so", root / f"{key}.json"
    lib = _load_entry(so, meta)
    if lib is None:
        publish_checked(so, meta, data, name=name, saved=True)
        lib = _dlopen(so)
        if lib is None:
            raise KumikoError("E1502", at=name, why="the saved kernel library cannot be loaded (a damaged file, "
                              "or one built for another kind of machine)",
                              suggestion="Compile the graph again on this machine.")
    mod = CModule(so, key, lib, cached=True)
    _LOADED[(str(root), key)] = mod
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
    lib = _dlopen(so) if read_entry(so, meta) is not None else None
    if lib is None:
        _count("rebuilt_corrupt")
        for p in (so, meta):
            clear_path(p)       # dlopen refused a whole file (read_entry removed a damaged one)
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
        _run_compiler([CC, *flags, f"-I{INCLUDE_DIR}", str(src), "-o", str(out)], source, src, name, stem,
                      so.stem, work)
        try:
            data = out.read_bytes()
        except OSError as e:
            raise file_error(out, e, f"read the library {CC} just wrote") from None
    _count("compiles")
    publish_entry(so.with_suffix(".c"), source)     # kept beside the build, for reading and debugging
    publish_checked(so, meta, data, name=name, flags=list(flags), compiler=compiler_version())
    return time.perf_counter() - t0


def _gcc(cmd: list[str], name: str, work):
    """Run a gcc command in ``work`` (bounded by the build timeout); gcc missing is E1701."""
    try:
        return run_tool(cmd, at=name, cwd=work)
    except OSError as e:
        raise KumikoError("E1701", at=name, why=f"cannot run {CC}: {e}",
                          suggestion="Install gcc (Debian: apt-get install gcc).") from None


def _run_compiler(cmd: list[str], source: str, src: Path, name: str, stem: str, key: str, work) -> None:
    """Run gcc on ``src``; a failure is E1701 with its first errors, the source kept in the temporary
    directory (not in the cache) for the report."""
    r = _gcc(cmd, name, work)
    if r.returncode != 0:
        check_source_kept(src, cmd)
        kept = Path(tempfile.gettempdir()) / f"kumiko-failed-{stem}-{key[:12]}.c"   # not in the cache
        kept.write_text(source)
        raise KumikoError("E1701", at=name, why=f"{CC} failed (exit {r.returncode}):\n"
                          + first_errors(r.stderr.replace(str(src), src.name)),
                          suggestion="The generated C does not compile: a code generator bug. The source is "
                          "kept at the path below; report it with the graph.", source=str(kept),
                          command=" ".join(cmd))
