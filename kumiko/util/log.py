"""``KUMIKO_DEBUG`` output: one prefix (``kumiko: ``), one stream (stderr) and one level check for every
stage, so a user reading a compile sees one voice and stdout stays the command's own output (the CLI's
reports and ``--json`` documents are parsed by scripts).

The levels are ``knobs.py``'s; each stage reports only what its level promises and nothing is computed for a
level that is off (``enabled``), so ``KUMIKO_DEBUG=0`` costs one environment read per message site.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator

from kumiko import knobs


def enabled(level: int) -> bool:
    """Whether ``KUMIKO_DEBUG`` asks for ``level``; check it before building an expensive message."""
    return knobs.debug() >= level


def log(level: int, msg: str) -> None:
    """Print ``msg`` on stderr when ``KUMIKO_DEBUG >= level`` (a multi-line message keeps its lines: sources
    and JSON are printed whole, under their one prefixed header line)."""
    if knobs.debug() >= level:
        print(f"kumiko: {msg}", file=sys.stderr)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block and report ``stage NAME: T ms`` at level 1. A block that raises reports nothing: its
    diagnostic says what happened, and a time for work that did not finish would mislead."""
    t0 = time.perf_counter()
    yield
    log(1, f"stage {name}: {(time.perf_counter() - t0) * 1e3:.1f} ms")
