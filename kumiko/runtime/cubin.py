"""nvcc -> cubin for the ``cuda`` target, with a content-addressed disk cache and the ptxas report.

``build_cubin(source, "sm_80" | "sm_90a" | ...)`` compiles one generated ``.cu`` (the same text the
emulator runs) with ``nvcc -cubin -arch=ARCH -O3 --ptxas-options=-v -I kumiko/include`` and returns a
``Cubin``: the machine code the driver loads (``cuModuleLoadData``) and the ptxas resource report per
kernel (``ptxas.parse_ptxas_report``), which the target feeds back to the plans (spills and shared
memory, seed 001 §11) before anything runs.

The cache (``<KUMIKO_CACHE or ~/.cache/kumiko>/cubin/<sha256>.cubin``; ``KUMIKO_CACHE=0``: a
per-process temporary directory) is keyed by everything that changes the machine code: the source, the
arch, the flags, ``nvcc --version`` and the kumiko headers the source includes (``kumiko_cuda.cuh``
holds the PTX). Beside each cubin: ``<sha256>.json`` (size and SHA-256 of the cubin, arch, flags,
compiler, the ptxas log) and ``<sha256>.cu`` (the source, for reading). Why the paranoia, as in
``runtime/cpu.py``: a truncated cubin may load and then fault in the middle of a launch. So

- nvcc writes into a scratch directory outside the cache; the sidecar and then the cubin are published
  with ``os.replace`` (a visible cubin always has its sidecar);
- a load checks the sidecar's size and digest; an entry failing either is deleted and rebuilt
  (``STATS["rebuilt_corrupt"]``); ``invalidate`` drops an entry the driver refused;
- a failed build raises E1701 KernelBuildFailed with nvcc's first errors, the command and the log tail,
  and writes nothing into the cache (the failing source is kept in the temp directory for reading).
"""
from __future__ import annotations

import functools
import hashlib
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kumiko.diagnostics import KumikoError
from kumiko.runtime.cpu import header_digest
from kumiko.runtime.ptxas import INCLUDE_DIR, KernelResources, nvcc_path, parse_ptxas_report
from kumiko.runtime.toolchain import build_dir, check_source_kept, clean_stale, first_errors, run_tool
from kumiko.util.files import cache_root, publish_checked, publish_entry, read_entry, safe_stem
from kumiko.util.log import log

#: flags of every cubin build (``-std`` as the nvcc compile checks use). No ``-lineinfo`` by default: it
#: records the build directory, so the same source would give different bytes; pass it in ``extra_flags``
#: for compute-sanitizer or Nsight source lines
NVCC_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "--ptxas-options=-v")
#: builds compiled, served from the disk cache, and entries found corrupt (deleted and rebuilt)
STATS = {"compiles": 0, "disk_hits": 0, "rebuilt_corrupt": 0}
_ARCH = re.compile(r"sm_\d+[af]?")


@dataclass(frozen=True)
class Cubin:
    """One build: the cubin bytes, where they live, and what ptxas reported per kernel."""

    arch: str
    key: str
    path: Path
    data: bytes = field(repr=False)
    resources: dict[str, KernelResources] = field(repr=False)
    log: str = field(repr=False, default="")
    cached: bool = False            # True when nothing was compiled (a disk-cache hit)
    compile_s: float = 0.0


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """``nvcc --version``'s release and build lines: part of every cache key."""
    try:
        out = run_tool([nvcc, "--version"], at="nvcc").stdout
    except OSError as e:
        raise KumikoError("E1701", at="nvcc", why=f"nvcc cannot be run: {e}",
                          suggestion="Install the CUDA toolkit (nvcc) or fix PATH.") from None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return " | ".join(ln for ln in lines if ln.startswith(("Cuda compilation", "Build"))) or " | ".join(lines)


def find_nvcc() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise KumikoError("E1701", at="nvcc", why="nvcc is not on PATH; the cuda target compiles its kernels with it",
                          suggestion="Install the CUDA toolkit (nvcc 12 or newer) and put its bin/ on PATH.")
    return nvcc


def check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise KumikoError("E1501", at="cuda", why=f"{arch!r} is not an nvcc GPU arch",
                          suggestion="Give an arch like sm_80, sm_86 or sm_90a.")
    return arch


def cubin_key(source: str, arch: str, flags: Sequence[str], version: str) -> str:
    h = hashlib.sha256()
    for part in ("cubin-v1", source, arch, "\0".join(flags), version, header_digest(source)):
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()


def build_cubin(source: str, arch: str = "sm_80", *, name: str = "kernel", extra_flags: Sequence[str] = ()) -> Cubin:
    """Compile ``source`` for ``arch`` into a cubin, or return the cached one (same key, intact).

    ``extra_flags`` are appended to ``NVCC_FLAGS`` (and are part of the key): e.g. ``-maxrregcount=32``
    in tests. Raises E1701 when nvcc is missing or the source does not compile.
    """
    check_arch(arch)
    nvcc = find_nvcc()
    flags = (*NVCC_FLAGS, *extra_flags)
    key = cubin_key(source, arch, flags, nvcc_version(nvcc))
    root = cache_root("cubin")
    hit = _load_entry(root, key, arch)
    if hit is not None:
        STATS["disk_hits"] += 1
        _debug(name, arch, f"cache hit: {hit.path}")
        return hit
    t0 = time.perf_counter()
    data, log, cmd = _compile(nvcc, source, arch, flags, name)
    took = time.perf_counter() - t0
    STATS["compiles"] += 1
    resources = parse_ptxas_report(log)
    path = root / f"{key}.cubin"
    clean_stale(root)
    publish_entry(root / f"{key}.cu", source)                  # for reading and debugging
    publish_checked(path, root / f"{key}.json", data, arch=arch, name=name, flags=list(flags),
                    compiler=nvcc_version(nvcc), command=cmd, log=log)
    _debug(name, arch, f"compiled in {took * 1e3:.0f} ms: {path}")
    return Cubin(arch, key, path, data, resources, log, cached=False, compile_s=took)


def invalidate(cubin: Cubin) -> None:
    """Drop a cache entry (the runtime does when the driver refuses the image), so the next build recompiles."""
    for suffix in (".cubin", ".json", ".cu"):
        try:
            cubin.path.with_suffix(suffix).unlink()
        except OSError:
            pass


def _load_entry(root: Path, key: str, arch: str) -> Cubin | None:
    """The cached build, if whole: the sidecar parses, names this arch, and matches the cubin's size and digest."""
    path, meta = root / f"{key}.cubin", root / f"{key}.json"
    if not path.exists():
        return None
    entry = read_entry(path, meta, lambda info: info["arch"] == arch)
    if entry is None:
        STATS["rebuilt_corrupt"] += 1
        return None
    data, info = entry
    log = str(info.get("log", ""))
    return Cubin(arch, key, path, data, parse_ptxas_report(log), log, cached=True)


def _compile(nvcc: str, source: str, arch: str, flags: Sequence[str], name: str) -> tuple[bytes, str, str]:
    stem = safe_stem(name, "kernel")
    with build_dir("cubin-build") as work:
        src, out = Path(work) / f"{stem}.cu", Path(work) / f"{stem}.cubin"
        src.write_text(source)
        # relative paths, run in the scratch directory: the line info names ``NAME.cu``, not a random temp dir,
        # so the same source gives the same bytes
        cmd = [nvcc, "-cubin", f"-arch={arch}", *flags, "-I", str(INCLUDE_DIR), "-o", out.name, src.name]
        try:
            proc = run_tool(cmd, at=name, cwd=work)
        except OSError as e:
            raise KumikoError("E1701", at=name, why=f"cannot run nvcc: {e}",
                              suggestion="Install the CUDA toolkit (nvcc) or fix PATH.") from None
        log = (proc.stdout + proc.stderr).replace(str(src), src.name)
        if proc.returncode != 0:
            check_source_kept(src, cmd)
        if proc.returncode != 0 or not out.exists():
            kept = Path(tempfile.gettempdir()) / f"kumiko-failed-{stem}-{arch}.cu"   # never in the cache
            kept.write_text(source)
            raise KumikoError("E1701", at=name, why=f"nvcc -arch={arch} failed (exit {proc.returncode}):\n"
                              + first_errors(log),
                              suggestion="The generated CUDA does not compile for this arch: a code generator bug "
                              "(or a too old nvcc). The source is kept at the path below; report it with the graph.",
                              source=str(kept), command=" ".join(cmd), log=log[-8000:])
        return out.read_bytes(), log, " ".join(cmd)


def _debug(name: str, arch: str, what: str) -> None:
    log(2, f"cubin {name} ({arch}): {what}")
