"""Every environment knob kumiko reads, in one place (nothing else reads ``os.environ``).

- ``KUMIKO_DEBUG``: graded verbosity on stderr, as in tinygrad; each level adds to the ones below it
  (``kumiko.util.log`` prints, ``kumiko.pipeline.report`` says what each compile shows):

  1. each stage's name and time: load (parse, check, lower to Tiny IR), region, plan, kernel, source, binary;
  2. the kernels: each one a compile made, each C or cubin build (cache hit or compile time) and each
     kernel's time when a program runs (``cpu``, ``cuda-emu`` and ``cuda``: the ``cuda`` target then
     launches one by one, synchronising after each);
  3. the chosen plan of each kernel (the line ``kumiko compile`` prints);
  4. the generated source (C or CUDA C), once per compile, cached or not;
  5. every IR: the JSON dump of each stage (frontend for a Graph, tiny, indexbook, poly_view, region, and
     gpu_ir on the CUDA targets), as ``kumiko dump`` writes it.
- ``KUMIKO_DUMP``: a directory; when set, every compile writes there what ``kumiko compile FILE --dump all
  --out DIR`` writes (every stage it has; frontend only for a Graph), under the same names
  (``pipeline.dump_path``); a file that cannot be written is E1502.
- ``KUMIKO_CACHE``: the compile cache directory (default ``~/.cache/kumiko``); ``0`` disables the cache.
- ``KUMIKO_PROGRAM_CACHE``: 0 turns off the program cache (a plain ``cpu`` compile's whole result kept under
  ``KUMIKO_CACHE``, ``kumiko.pipeline.cache``); default on.
- ``KUMIKO_SPEC``: verifier strictness at stage boundaries: 0 off, 1 (default) the cheap checks and the verifiers
  of a stage read from a file (``--resume``), 2 every stage's verifiers on every compile (``pipeline.verify``).
  At run time (``cpu``): 1 poisons the outputs before every call and the arena of intermediates before its first
  call, 2 the arena before every call too, 0 nothing (``runtime.program``).
- ``KUMIKO_CUDA_GRAPH``: 1 makes the ``cuda`` target replay each program's launches as a CUDA Graph (default 0).
- ``KUMIKO_SPLIT_K``: the most CTAs the GPU plan chooser divides one output tile's K among (split-K, ``Plan.split_k``;
  default 16, 1 turns it off): for comparing plans on a device.
- ``KUMIKO_BUILD_TIMEOUT``: seconds one external compiler run (gcc, g++, nvcc) may take before E1706 (default 600).
- ``KUMIKO_MAX_BYTES``: the largest total of buffers one call may allocate before E1017 (default: 3/4 of the
  machine's physical memory).
"""
from __future__ import annotations

import os
from pathlib import Path

#: ``os.environ``'s own dict of encoded names and values, where the platform keeps one (POSIX CPython: every
#: change made through ``os.environ`` lands in it): a lookup there costs 0.06 us, ``os.environ.get`` 1.2 us
#: (it encodes the name and decodes the value), twice on every kernel call (``debug`` and ``spec``), which was
#: a sixth of a small graph's call
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
#: (name, encoded value) -> the integer it parses to, or None (unset, empty or not a number: the default)
_PARSED: dict[tuple[str, bytes], int | None] = {}


def _int(name: str, default: int) -> int:
    if isinstance(_ENV_DATA, dict) and os.environ._data is _ENV_DATA:
        raw = _ENV_DATA.get(name.encode(), b"")
        try:
            value = _PARSED[(name, raw)]
        except KeyError:
            value = _parse(raw)
            if len(_PARSED) < 256:
                _PARSED[(name, raw)] = value
    else:
        value = _parse(os.environ.get(name, ""))
    return default if value is None else value


def _parse(raw: str | bytes) -> int | None:
    try:
        return int(raw) if raw.strip() else None
    except ValueError:
        return None


def debug() -> int:
    return _int("KUMIKO_DEBUG", 0)


def spec() -> int:
    return _int("KUMIKO_SPEC", 1)


def program_cache() -> bool:
    return _int("KUMIKO_PROGRAM_CACHE", 1) >= 1


def split_k(default: int) -> int:
    return max(1, _int("KUMIKO_SPLIT_K", default))


def cuda_graph() -> bool:
    return _int("KUMIKO_CUDA_GRAPH", 0) >= 1


def dump_dir() -> Path | None:
    raw = os.environ.get("KUMIKO_DUMP", "").strip()
    return Path(raw) if raw else None


def cache_dir() -> Path | None:
    raw = os.environ.get("KUMIKO_CACHE", "").strip()
    if raw == "0":
        return None
    return Path(raw) if raw else Path.home() / ".cache" / "kumiko"


def build_timeout() -> float:
    """Seconds one external compiler run may take (``KUMIKO_BUILD_TIMEOUT``; 0 or less: no limit)."""
    raw = os.environ.get("KUMIKO_BUILD_TIMEOUT", "").strip()
    try:
        return float(raw) if raw else 600.0
    except ValueError:
        return 600.0


def max_bytes() -> int:
    """The most bytes of buffers one call may allocate (``KUMIKO_MAX_BYTES``; default 3/4 of physical memory)."""
    raw = _int("KUMIKO_MAX_BYTES", 0)
    if raw > 0:
        return raw
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    except (ValueError, OSError, AttributeError):
        return 1 << 34
