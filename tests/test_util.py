"""kumiko.util.atomic_write: whole files or nothing, with the permissions a plain open() would give."""
from __future__ import annotations

import os
import stat

import pytest

from kumiko.util import atomic_write


def test_atomic_write_replaces_whole_files_with_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    f = tmp_path / "sub" / "out.cu"
    atomic_write(f, "first")
    atomic_write(f, b"second")
    assert f.read_bytes() == b"second"
    assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask          # not mkstemp's 0600
    assert [p.name for p in f.parent.iterdir()] == ["out.cu"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    f = tmp_path / "plan.json"
    atomic_write(f, "old")
    with pytest.raises(TypeError):
        atomic_write(f, 42)                                            # not str or bytes: fails mid-write
    assert f.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]
