"""Precompiled headers for the CUDA emulator's builds.

Every emulator library is one g++ unit that starts with ``#include "cuda_emu.h"``: the emulator and the C++
standard headers it needs, about two seconds of parsing at -O1 (more with AddressSanitizer) before the
kernel's own few hundred lines. ``emulator_header`` compiles that header once per set of flags into
``<cache>/emu/pch-<key>.gch`` (the key covers the flags, the compiler and every emulator header), with a JSON
sidecar of its size and SHA-256 like every cache entry; a build links it into its scratch directory
(``kumiko.util.files.place_entry``: checked once per process) and puts that directory first on the include
path, where g++ takes ``cuda_emu.h.gch`` in place of the header.

g++ checks a precompiled header against the unit's flags and macros itself and reads the header's text when
they differ, so a precompiled header only ever saves time: one that fails to build is left out (logged), and
a damaged one is removed and built again. Threads of one process that need the same header build it once."""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Sequence

from kumiko.runtime.toolchain import build_dir, optional_output
from kumiko.util.files import place_entry, publish_checked
from kumiko.util.log import log

#: precompiled headers built, and builds that included one
STATS = {"built": 0, "used": 0}
_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}


def _key(flags: Sequence[str], compiler: str, headers: str) -> str:
    h = hashlib.sha256(b"emu-pch\0")
    for part in (*flags, compiler, headers):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


def emulator_header(cxx: str, flags: Sequence[str], compiler: str, header: Path, headers: str, root: Path,
                    scratch: Path) -> bool:
    """Put a precompiled ``header`` for ``flags`` (the unit's g++ flags but its own macros) into ``scratch``
    (named so that g++ finds it in place of the header when ``scratch`` comes first on the include path), built
    into the cache ``root`` when it is not there; True when ``scratch`` holds one. ``headers``: a digest of
    every file the header includes from kumiko's include directory (the key covers it; the caller read them
    for its own key).

    Unlike the cpu backend's per-program header (built in the build's pool, beside the units, and only for
    programs of many units), this one is built first and always: it is one header per emulator config, shared
    by every kernel library of that config, and a library is a single translation unit that cannot start
    before it."""
    pch_flags = [f for f in flags if f != "-shared"]
    key = _key(pch_flags, compiler, headers)
    gch, meta = root / f"pch-{key}.gch", root / f"pch-{key}.json"
    dest = scratch / f"{header.name}.gch"
    with _lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        placed = gch.exists() and place_entry(gch, meta, dest)
        if not placed and _build(cxx, pch_flags, header, gch, meta):
            placed = place_entry(gch, meta, dest)
    if placed:
        with _lock:
            STATS["used"] += 1
    return placed


def _build(cxx: str, flags: Sequence[str], header: Path, gch: Path, meta: Path) -> bool:
    with build_dir("pch") as work:
        out = Path(work) / f"{header.name}.gch"
        cmd = [cxx, *flags, "-I", str(header.parent), "-x", "c++-header", str(header), "-o", str(out)]
        data = optional_output(cmd, f"{header.name} (precompiled header)", work, out)
        if data is None:
            log(1, f"the emulator's precompiled header did not build; its builds parse {header.name}")
            return False
    publish_checked(gch, meta, data, name=header.name, flags=list(flags), compiler=cxx)
    with _lock:
        STATS["built"] += 1
    log(2, f"precompiled {header.name} for the emulator: {gch} ({len(data) >> 20} MiB, pid {os.getpid()})")
    return True
