"""The host a CPU build is for: the CPU's features (``cpu_features``), the ISA macros ``gcc -march=native``
defines (``native_macros``) and the compiler's identity (``compiler_version``), with the answers of the two
gcc queries kept in the cache between processes (``<cache>/toolchain/``), so a build whose library is
cached runs no gcc at all."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from kumiko.diagnostics import KumikoError
from kumiko.runtime.toolchain import run_tool
from kumiko.util.files import cache_root, publish_entry

CC = "gcc"


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
    known = _recalled("native_macros")
    if isinstance(known, list) and known and all(isinstance(m, str) for m in known):
        return frozenset(known)
    try:
        out = run_tool([CC, "-march=native", "-dM", "-E", "-x", "c", "-"], at=CC, input="").stdout
    except OSError:
        return frozenset()          # no gcc: cpu_features falls back on nothing; a build says what is missing
    macros = frozenset(m.group(1) for m in re.finditer(r"#define (\w+)", out))
    if macros:
        _remember("native_macros", sorted(macros))
    return macros


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """``gcc --version``'s first line and the target triple: part of every cache key."""
    known = _recalled("compiler_version")
    if isinstance(known, str) and known.strip():
        return known
    try:
        ver = run_tool([CC, "--version"], at=CC).stdout
        triple = run_tool([CC, "-dumpmachine"], at=CC).stdout
    except OSError as e:
        raise KumikoError("E1701", at=CC, why=f"the C compiler cannot be run: {e}",
                          suggestion="Install gcc (Debian: apt-get install gcc).") from None
    version = (ver.splitlines() or [""])[0].strip() + " " + triple.strip()
    _remember("compiler_version", version)
    return version


# The answers of the two queries above are kept in the cache between processes, so that a build whose
# library is cached runs no gcc at all (the queries cost ~30 ms): ``<cache>/toolchain/gcc-<id>.json``, where
# the id covers the compiler's executable (its resolved path, size, mtime and inode: an upgrade or another
# gcc first on PATH is another id), the environment variables that redirect gcc, and the CPU's model and
# flags (``-march=native``). Anything wrong with the file (missing, damaged, another shape) is a miss: gcc
# is asked and the file written again.

@functools.lru_cache(maxsize=None)
def _toolchain_file() -> Path | None:
    exe = shutil.which(CC)
    if exe is None:
        return None
    try:
        real = os.path.realpath(exe)
        st = os.stat(real)
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None                 # no /proc/cpuinfo (not Linux): the CPU cannot be identified, ask each time
    cpu = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines()
           if ln.split(":", 1)[0].strip() in ("model name", "flags", "Features", "CPU part")]
    ident = json.dumps([real, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, sorted(set(cpu)),
                        [os.environ.get(v) for v in ("GCC_EXEC_PREFIX", "COMPILER_PATH", "CPATH", "C_INCLUDE_PATH")]])
    try:
        root = cache_root("toolchain")
    except KumikoError:
        return None                 # the cache is unusable: the build says so
    return root / f"{CC}-{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"


def _recalled(field: str):
    path = _toolchain_file()
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data.get(field) if isinstance(data, dict) else None


def _remember(field: str, value) -> None:
    path = _toolchain_file()
    if path is None:
        return
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[field] = value
    try:
        publish_entry(path, json.dumps(data, indent=1))
    except (OSError, KumikoError):
        pass                        # not kept: asked again next time
