"""The program cache: what a plain ``cpu`` compile built (the region program, the plans, the C source, the
steps and the library's bytes: ``runtime.cpu_artifact.save_state``), kept under ``<KUMIKO_CACHE>/program``
so that compiling the same program again skips every stage: ResNet-50's warm compile was region formation
and analysis again (over a second) although every kernel object came from the object cache.

An entry's key is everything the result depends on: the Tiny IR program (its JSON, node for node), the
target and its typed options, the names of the bound constants (the cpu target packs those; their values
are bound again at load), the ISA of this machine, and a digest of kumiko's own source files (so a changed
compiler never reads an old entry). Tuned plans (``tune=True``) are chosen from the tuning cache, which a
later tune can change: such compiles skip this cache, and a tune empties it. A compile that wants more than
the binary (dumps, ``--resume``, ``want``, ``KUMIKO_SPEC=2``, ``KUMIKO_DEBUG=5``) runs every stage.
``KUMIKO_PROGRAM_CACHE=0`` turns the cache off (the test suite does, so that a test that patches a stage
sees its patch run). A hit fills the Compilation's region, plan, source and binary; its indexbook,
poly_view and kernel stages stay unmade. Entries are written atomically; an unreadable or foreign entry is
a miss (and is replaced)."""
from __future__ import annotations

import functools
import hashlib
import json
import pickle
import shutil
from pathlib import Path
from typing import Any, Mapping

from kumiko import knobs
from kumiko.tiny.ir import TinyGraph, to_json
from kumiko.util.files import cache_root, write_file
from kumiko.util.log import enabled, log

#: what an entry holds (a new version when the record changes)
ENTRY_FORMAT = "kumiko-program/1"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over kumiko's own source files (Python, C and CUDA headers), read once per process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".h", ".cuh") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def usable(target: str, options: Any, start: Mapping | None, want: tuple) -> bool:
    """Whether a compile may come from (and go into) the program cache."""
    return (target == "cpu" and knobs.program_cache() and not start and not want and knobs.dump_dir() is None
            and knobs.spec() < 2 and not enabled(5) and not getattr(options, "plans", None)
            and not getattr(options, "tune", False))


def key(tiny: TinyGraph, target: str, options: Any, constants: Mapping) -> str:
    from kumiko.runtime.cpu_artifact import machine_key
    h = hashlib.sha256()
    for part in (source_digest(), target, repr(options), json.dumps(to_json(tiny), sort_keys=True, default=str),
                 json.dumps(sorted(constants)), repr(machine_key())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(k: str) -> Path:
    return cache_root("program") / f"{k[:40]}.pkl"


def lookup(k: str, constants: Mapping) -> Any | None:
    """The cached ``CompiledCpu`` of key ``k`` with ``constants`` bound, or None (a miss, or an entry that
    cannot be used: unreadable, another format or key, a library this machine cannot load)."""
    from kumiko.runtime.cpu_artifact import restore
    p = _path(k)
    try:
        state = pickle.loads(p.read_bytes())
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a truncated or foreign entry is a miss; the next store replaces it
        log(2, f"program cache: unreadable entry {p.name}, compiling again")
        return None
    if not isinstance(state, dict) or state.get("format") != ENTRY_FORMAT or state.get("key") != k:
        return None
    try:
        return restore(state["artifact"], constants=constants)
    except Exception as e:  # noqa: BLE001 - a library that no longer loads: compile again
        log(2, f"program cache: entry {p.name} does not load ({type(e).__name__}: {e}), compiling again")
        return None


def store(k: str, binary: Any) -> None:
    from kumiko.runtime.cpu_artifact import save_state
    data = pickle.dumps({"format": ENTRY_FORMAT, "key": k, "artifact": save_state(binary)},
                        protocol=pickle.HIGHEST_PROTOCOL)
    write_file(_path(k), data, "a program cache entry")


def forget_programs() -> None:
    """Empty the program cache (a tune may change the plans of programs cached before it)."""
    shutil.rmtree(cache_root("program"), ignore_errors=True)
