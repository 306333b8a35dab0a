"""kumiko.util.files.place_entry: a large cache entry (a precompiled header) hard-linked into a build's scratch
directory, its digest checked once per process, a damaged or replaced one caught."""
from __future__ import annotations

import hashlib
import json

from kumiko.util import files


def _entry(root, data: bytes):
    path, meta = root / "e.gch", root / "e.json"
    files.publish_checked(path, meta, data, name="e")
    return path, meta


def test_publish_checked_writes_the_sidecar_first_and_read_entry_accepts_it(tmp_path, monkeypatch):
    order = []
    real = files.publish_entry
    monkeypatch.setattr(files, "publish_entry", lambda p, d: order.append(p.name) or real(p, d))
    path, meta = _entry(tmp_path, b"abc")
    assert order == ["e.json", "e.gch"]                         # a visible entry always has its sidecar
    data, info = files.read_entry(path, meta)
    assert data == b"abc" and info["name"] == "e" and info["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert json.loads(meta.read_text())["size"] == 3


def test_a_whole_entry_is_linked_and_hashed_once(tmp_path, monkeypatch):
    path, meta = _entry(tmp_path, b"x" * 4096)
    reads = []
    real = files.read_entry
    monkeypatch.setattr(files, "read_entry", lambda *a, **k: reads.append(a) or real(*a, **k))
    for i in range(3):
        dest = tmp_path / f"work{i}.gch"
        assert files.place_entry(path, meta, dest) and dest.read_bytes() == b"x" * 4096
        assert dest.stat().st_ino == path.stat().st_ino            # a hard link, not a copy
    assert len(reads) == 1


def test_a_replaced_or_damaged_entry_is_checked_again(tmp_path):
    path, meta = _entry(tmp_path, b"a" * 100)
    assert files.place_entry(path, meta, tmp_path / "w1")
    path, meta = _entry(tmp_path, b"b" * 100)                    # replaced: a new inode, checked again
    assert files.place_entry(path, meta, tmp_path / "w2") and (tmp_path / "w2").read_bytes() == b"b" * 100
    path.unlink()
    path.write_bytes(b"c" * 100)                                    # damaged: the sidecar's digest disagrees
    assert not files.place_entry(path, meta, tmp_path / "w3")
    assert not path.exists() and not meta.exists() and not (tmp_path / "w3").exists()
