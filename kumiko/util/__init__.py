"""Small helpers shared by every stage."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

#: the process's umask, read once at import (reading it means setting it)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it; the file gets the
    permissions an ``open(path, "w")`` would give (mkstemp's temporary file is private to its owner)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def reachable(roots: Iterable, successors: Callable[[Any], Iterable]) -> set:
    """Everything reachable from ``roots`` (the roots included) through ``successors``, with an explicit
    stack (a chain may be longer than Python's recursion limit)."""
    seen: set = set()
    stack = list(roots)
    while stack:
        x = stack.pop()
        if x not in seen:
            seen.add(x)
            stack.extend(successors(x))
    return seen
