"""The files kumiko writes: names derived from graph names, the compile cache directory, and write failures.

Issue 20 asks for "never a traceback" on a bad path, so everything here turns an ``OSError`` into
E1502 FileError naming the path, or recovers where recovering is what the user wants:

- ``safe_stem``: a graph name is user text (``../../escaped``); a file name made from it keeps
  ``[A-Za-z0-9._-]`` only and never starts with a dot, so it names a plain file inside the directory given;
- ``cache_root``: the cache directory, checked once per process: a file in its place is E1502; a directory
  kumiko cannot write (read-only, another user's) is replaced by a temporary one for this process, with a
  warning, since a build does not need the cache to be right;
- ``write_file``: an atomic write whose failure is E1502; ``publish_entry`` also clears a directory that
  squats a cache entry's name (the cache is kumiko's own, so whatever occupies an entry's path is debris);
- ``publish_checked`` / ``read_entry`` / ``place_entry``: an entry with a sidecar of its size and SHA-256,
  published sidecar first, read back (or hard-linked into a build directory) only when whole.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

from kumiko import knobs
from kumiko.diagnostics import KumikoError, KumikoWarning
from kumiko.util import atomic_write

#: the longest stem ``safe_stem`` gives: room for ``.<stage>.json`` (or a hash) within a 255-byte file name
MAX_STEM = 160

_lock = threading.Lock()
_TEMP_BASE: list[Path] = []           # this process's temporary cache base (KUMIKO_CACHE=0 or unwritable)
_CHECKED: dict[str, Path] = {}        # configured cache root -> the root builds use (itself or a temporary one)


def safe_stem(name: str, default: str = "program") -> str:
    """A file name made from ``name`` that stays inside the directory it is joined to: characters outside
    ``[A-Za-z0-9._-]`` become ``_`` and leading dots do too (no ``..``, no hidden file); at most MAX_STEM long."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", str(name))[:MAX_STEM]
    stem = re.sub(r"^\.+", lambda m: "_" * len(m.group()), stem)
    return stem or default


def temp_base() -> Path:
    """This process's temporary cache directory (removed at exit); its name carries the pid, so a later
    process's stale-file sweep (``toolchain.clean_stale``) can tell it from a live one."""
    with _lock:
        if not _TEMP_BASE:
            tmp = Path(tempfile.mkdtemp(prefix=f"kumiko-cache-{os.getpid()}-"))
            _TEMP_BASE.append(tmp)
            atexit.register(shutil.rmtree, tmp, True)
        return _TEMP_BASE[0]


def cache_root(kind: str = "cpu") -> Path:
    """``<KUMIKO_CACHE>/<kind>`` (``cpu`` shared objects, ``cubin`` GPU images, ``emu``, ``tune``), created.

    With the cache off (``KUMIKO_CACHE=0``): under this process's temporary directory. A cache directory that
    cannot be written is replaced by the temporary one, with a warning; a file where the directory should be
    is E1502. Checked once per process and root (``forget_roots`` starts over)."""
    base = knobs.cache_dir()
    if base is None:
        root = temp_base() / kind
        root.mkdir(parents=True, exist_ok=True)
        return root
    root = base / kind
    with _lock:
        known = _CHECKED.get(str(root))
    if known is not None:
        return known
    use = _check_writable(root)
    with _lock:
        _CHECKED[str(root)] = use
    return use


def forget_roots() -> None:
    """Check the cache directories again on next use (tests change KUMIKO_CACHE and permissions)."""
    with _lock:
        _CHECKED.clear()


def _probe(root: Path) -> None:
    """Create and remove a file in ``root``: the sure test that kumiko can write there (``os.access`` can be
    wrong, e.g. for root on a read-only mount)."""
    fd, probe = tempfile.mkstemp(dir=root, prefix=".kumiko-probe-")
    os.close(fd)
    os.unlink(probe)


def _check_writable(root: Path) -> Path:
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not root.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(root))
        _probe(root)
        return root
    except (FileExistsError, NotADirectoryError):
        raise KumikoError("E1502", at=str(root), why=f"the compile cache directory cannot be made: "
                          f"{_in_the_way(root) or root} is a file", suggestion="Point KUMIKO_CACHE at a directory (or "
                          "move the file away), or set KUMIKO_CACHE=0 to build without a cache.") from None
    except OSError as e:
        tmp = temp_base() / root.name
        tmp.mkdir(parents=True, exist_ok=True)
        warnings.warn(f"kumiko: cannot write the compile cache {root} ({e.strerror or e}); building in the "
                      f"temporary directory {tmp} instead, so nothing is kept for later runs. Point KUMIKO_CACHE "
                      "at a writable directory, or set KUMIKO_CACHE=0.", KumikoWarning, stacklevel=3)
        return tmp


def _in_the_way(path: Path) -> Path | None:
    """The path itself or the nearest ancestor that exists and is not a directory (what makes a write fail
    with "File exists" or "Not a directory")."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def file_error(path: Path | str, e: OSError, doing: str, suggestion: str | None = None) -> KumikoError:
    """E1502 for an OSError while ``doing`` something with ``path``: what is wrong in words (a directory
    where a file goes, a file where a directory goes, the strerror), not a traceback."""
    path = Path(path)
    blocker = _in_the_way(path.parent) if isinstance(e, (FileExistsError, NotADirectoryError)) else None
    if isinstance(e, IsADirectoryError) and path.is_dir():
        why = "it is a directory"
    elif blocker is not None:
        why = f"{blocker} is a file, not a directory"
    else:
        why = e.strerror or str(e)
    return KumikoError("E1502", at=str(path), why=f"cannot {doing}: {why}",
                       **({"suggestion": suggestion} if suggestion else {}))


def write_file(path: Path, data: str | bytes, what: str = "the file") -> None:
    """``atomic_write`` (parent directories created) with any failure as E1502 naming the path: a directory
    where the file should be, a parent that is a file, no permission, a full disk."""
    try:
        atomic_write(path, data)
    except OSError as e:
        raise file_error(path, e, f"write {what}",
                         suggestion="Give a path to a file in a directory you can write.") from None


def clear_path(path: Path) -> None:
    """Remove whatever occupies ``path`` inside a cache (a file, a link, or a directory squatting an entry's
    name); nothing there is fine. E1502 when it cannot be removed."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as e:
        raise file_error(path, e, "remove a broken cache entry",
                         suggestion="Remove it by hand, or point KUMIKO_CACHE elsewhere.") from None


def read_entry(path: Path, meta: Path, accept=None) -> tuple[bytes, dict] | None:
    """A cache entry's bytes and its JSON sidecar, if the entry is whole: the sidecar parses and records the
    file's size and SHA-256 (and ``accept(info)``, if given, agrees). A damaged entry is removed, both files
    (a file, or a directory squatting the name), and None comes back: the caller builds it again."""
    try:
        info = json.loads(meta.read_text())
        data = path.read_bytes()
        if len(data) == info["size"] and hashlib.sha256(data).hexdigest() == info["sha256"] and (
                accept is None or accept(info)):
            return data, info
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for p in (path, meta):
        clear_path(p)
    return None


#: large entries (precompiled headers) found whole by this process: path -> (inode, size, mtime) when checked
_WHOLE: dict[str, tuple[int, int, int]] = {}


def place_entry(path: Path, meta: Path, dest: Path) -> bool:
    """Put the cache entry ``path`` at ``dest`` (a scratch directory's file) if the entry is whole, as a hard
    link where the file system allows (a copy where not): True when ``dest`` holds it. A large entry (a
    precompiled header: tens of MB) is read and hashed once per process, not once per build: the file linked
    is whole when its inode, size and modification time are those of one checked before (an entry is replaced,
    never rewritten in place, by ``publish_entry``). A damaged entry is removed, as ``read_entry`` does."""
    try:
        dest.unlink(missing_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
        st = dest.stat()
    except OSError:
        clear_path(dest)
        return False
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        if _WHOLE.get(str(path)) == ident:
            return True
    if read_entry(dest, meta) is None:           # checks what was placed; a damaged one goes, the entry too
        clear_path(path)
        clear_path(meta)
        return False
    with _lock:
        _WHOLE[str(path)] = ident
    return True


def publish_entry(path: Path, data: str | bytes) -> None:
    """Write one file of a cache entry atomically, replacing whatever occupies its name."""
    if path.is_dir() and not path.is_symlink():
        clear_path(path)
    write_file(path, data, "a cache entry")


def publish_checked(path: Path, meta: Path, data: bytes, **info) -> dict:
    """Publish a cache entry that ``read_entry`` and ``place_entry`` check: first its JSON sidecar (the
    entry's size and SHA-256, then ``info``), last the file, so that a visible entry always has its sidecar
    and a reader never trusts a half-published one. Each file is written atomically. Returns the sidecar."""
    record = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), **info}
    publish_entry(meta, json.dumps(record, indent=1))
    publish_entry(path, data)
    return record
