"""Running the external compilers (gcc, g++, nvcc) and cleaning up after builds that were killed.

- ``run_tool``: every compiler run is bounded by ``KUMIKO_BUILD_TIMEOUT`` (``knobs.build_timeout``), since a
  compiler that never returns would hang ``kumiko run`` forever. The tool runs in a session of its own, so on
  expiry the whole process tree it started (gcc's cc1 and as, nvcc's cicc and ptxas) is killed, not only the
  driver, and E1706 BuildTimeout names the command, the limit and the knob.
- ``build_dir``: a scratch directory ``<tmp>/kumiko-<kind>-<pid>-XXXXXXXX`` for one build; the pid in its
  name tells a later process whether its owner is still running.
- ``clean_stale``: a process killed with SIGKILL during a build leaves its scratch directory in the temporary
  directory and its half-written ``.tmp`` files in the cache, forever. The first build of each later process
  sweeps them: only names kumiko makes, only older than ``STALE_S``, and never one whose name carries the pid
  of a live process.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from kumiko import knobs
from kumiko.diagnostics import KumikoError

#: leftovers younger than this are never touched (a build that is still running may own them)
STALE_S = 3600.0
#: the scratch directories kumiko makes in the temporary directory (``build_dir``, ``files.temp_base``, and
#: the names of earlier versions, which carry no pid)
_SCRATCH = re.compile(r"kumiko-(?:build|cubin-build|nvcc|emu-run|cache|emu)-(?:(\d+)-)?[A-Za-z0-9_]+")
#: temporary files of atomic writes and builds inside a cache directory (``.<name>.<random>.tmp``)
_PARTIAL = re.compile(r"\..+\.tmp")

_lock = threading.Lock()
_swept: set[str] = set()


def run_tool(cmd: Sequence[str], *, at: str, cwd: str | Path | None = None,
             input: str | None = None) -> subprocess.CompletedProcess:
    """Run a compiler to completion and capture its output (text), killed after ``KUMIKO_BUILD_TIMEOUT``
    seconds (0 or less: no limit) with E1706. An ``OSError`` (the tool is missing) is the caller's to word."""
    limit = knobs.build_timeout()
    proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(input, timeout=limit if limit > 0 else None)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise KumikoError("E1706", at=at, why=f"{Path(cmd[0]).name} did not finish within {limit:g} s and was "
                          "killed", command=" ".join(map(str, cmd)), limit_s=limit,
                          knob="KUMIKO_BUILD_TIMEOUT") from None
    except BaseException:           # Ctrl-C: leave no compiler running behind
        _kill_tree(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def first_errors(log: str, n: int = 12) -> str:
    """A compiler's first error lines (from the first line that says "error", then what follows it)."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    first = next((k for k, ln in enumerate(lines) if "error" in ln), 0)
    return "\n".join("  " + ln for ln in lines[first:first + n])


def optional_output(cmd: Sequence[str], at: str, cwd, out: Path) -> bytes | None:
    """Run a tool whose output ``out`` a build can do without (a precompiled header): the bytes it wrote, or
    None when it failed or could not be started."""
    try:
        r = run_tool(list(cmd), at=at, cwd=cwd)
        return out.read_bytes() if r.returncode == 0 else None
    except OSError:
        return None


def check_source_kept(src: Path, cmd: Sequence[str]) -> None:
    """After a failed compile: E1502 when the build's own source file is gone, because then its directory was
    deleted under the compiler (a temporary-directory cleaner, the cache removed by hand) - not a compile
    error, and no reason to blame the code generator."""
    if not src.is_file():
        raise KumikoError("E1502", at=str(src.parent), why=f"the build's source {src.name} vanished while "
                          f"{Path(cmd[0]).name} ran (was its directory deleted during the build?)",
                          suggestion="Run again, and leave kumiko's build and cache directories alone while it "
                          "builds.", command=" ".join(map(str, cmd)))


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the tool's session (it leads its own process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pass                        # a grandchild that left the group still holds the pipes: do not wait on it


def build_dir(kind: str) -> tempfile.TemporaryDirectory:
    """A scratch directory for one build, removed when the ``with`` block ends; stale ones of killed
    processes are swept first (``clean_stale``)."""
    clean_stale()
    return tempfile.TemporaryDirectory(prefix=f"kumiko-{kind}-{os.getpid()}-")


def clean_stale(cache: Path | None = None) -> None:
    """Remove what killed builds left: kumiko's scratch directories in the temporary directory and, with
    ``cache``, partial ``.tmp`` files in that cache directory. Each directory is swept once per process."""
    where = Path(tempfile.gettempdir())
    for d, is_dir in ((where, True), (cache, False)):
        if d is None:
            continue
        with _lock:
            if str(d) in _swept:
                continue
            _swept.add(str(d))
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        now = time.time()
        for e in entries:
            m = (_SCRATCH if is_dir else _PARTIAL).fullmatch(e.name)
            if m is None or not _stale(e, is_dir, now, int(m.group(1)) if is_dir and m.group(1) else None):
                continue
            if is_dir:
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass


def _stale(e: os.DirEntry, want_dir: bool, now: float, pid: int | None) -> bool:
    try:
        if e.is_symlink() or e.is_dir() != want_dir or now - e.stat().st_mtime < STALE_S:
            return False
    except OSError:
        return False
    return pid is None or not _alive(pid)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True                 # someone else's process: alive
    return True
