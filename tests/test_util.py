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


def test_knobs_see_every_change_made_through_os_environ(monkeypatch):
    """The knobs read ``os.environ``'s own dict and keep what they parsed: a value set, changed, made invalid
    or removed between two reads is seen by the second."""
    from kumiko import knobs
    monkeypatch.delenv("KUMIKO_SPEC", raising=False)
    assert knobs.spec() == 1
    for raw, want in (("0", 0), ("2", 2), (" 3 ", 3), ("x", 1), ("", 1), ("0", 0)):
        monkeypatch.setenv("KUMIKO_SPEC", raw)
        assert knobs.spec() == want, raw
    monkeypatch.delenv("KUMIKO_SPEC")
    assert knobs.spec() == 1
    monkeypatch.setenv("KUMIKO_SPLIT_K", "bad")
    assert knobs.split_k(16) == 16 and knobs.split_k(4) == 4      # an invalid value: each caller's default
