"""build_c: the content-addressed cache (hits compile nothing), corrupted entries rebuilt, failed builds
diagnosed and leaving nothing behind, and run-time ISA detection."""
import json
from pathlib import Path

import numpy as np
import pytest

from kumiko.diagnostics import KumikoError
from kumiko.runtime import cpu
from kumiko.runtime.cpu import STATS, build_c, cache_key, cpu_features, forget_loaded

SRC = r"""
#include "kumiko_cpu.h"
KUMIKO_KERNEL fill(void** bufs, const long long* syms) {
    float* y = bufs[0];
    for (long long i = 0; i < syms[0]; i++) y[i] = (float)i + %s;
    return 0;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    forget_loaded()
    yield tmp_path / "cpu"
    forget_loaded()


def _replace_bytes(path, data: bytes) -> None:
    """Corrupt an entry the way another process would: a new file under the name. (Writing into the old
    file in place would truncate pages this process has mapped, and crash it: that is not the scenario.)"""
    tmp = path.with_name(path.name + ".corrupt")
    tmp.write_bytes(data)
    tmp.replace(path)


def _fill(mod, n=10):
    y = np.zeros(n, np.float32)
    assert mod.fn("fill")([y], [n]) == 0
    return y


def test_second_build_compiles_nothing(cache):
    src = SRC % "0.5f"
    before = STATS["compiles"]
    m1 = build_c(src, name="fill")
    assert STATS["compiles"] == before + 1 and not m1.cached and m1.compile_s > 0
    m2 = build_c(src, name="fill")                      # same process: the loaded module
    forget_loaded()
    m3 = build_c(src, name="fill")                      # a new process would see: the disk entry
    assert STATS["compiles"] == before + 1
    assert m2.cached and m3.cached and m1.path == m3.path
    np.testing.assert_array_equal(_fill(m3), np.arange(10, dtype=np.float32) + 0.5)
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted(f"{m1.key}{ext}" for ext in (".c", ".json", ".so"))   # no temporaries left


def test_key_covers_source_flags_and_header():
    src = SRC % "1.0f"
    k = cache_key(src, cpu.DEFAULT_FLAGS)
    assert k == cache_key(src, cpu.DEFAULT_FLAGS)
    assert k != cache_key(SRC % "2.0f", cpu.DEFAULT_FLAGS)
    assert k != cache_key(src, (*cpu.DEFAULT_FLAGS, "-O2"))
    assert cpu.header_digest(src) != cpu.header_digest("no header named here")


def test_truncated_entry_is_rebuilt(cache):
    src = SRC % "2.0f"
    m = build_c(src, name="fill")
    data = m.path.read_bytes()
    _replace_bytes(m.path, data[: len(data) // 3])
    forget_loaded()
    before, corrupt = STATS["compiles"], STATS["rebuilt_corrupt"]
    m2 = build_c(src, name="fill")
    assert STATS["compiles"] == before + 1 and STATS["rebuilt_corrupt"] == corrupt + 1
    assert len(m2.path.read_bytes()) == json.loads(m2.path.with_suffix(".json").read_text())["size"]
    np.testing.assert_array_equal(_fill(m2), np.arange(10, dtype=np.float32) + 2)


def test_entry_that_dlopen_rejects_is_rebuilt(cache):
    """A file whose sidecar matches (so the digest check passes) but which is not a shared library."""
    import hashlib
    src = SRC % "3.0f"
    key = cache_key(src, cpu.DEFAULT_FLAGS)
    cache.mkdir(parents=True)
    junk = b"\x7fELF but not really" * 10
    (cache / f"{key}.so").write_bytes(junk)
    (cache / f"{key}.json").write_text(json.dumps({"sha256": hashlib.sha256(junk).hexdigest(), "size": len(junk)}))
    before = STATS["compiles"]
    m = build_c(src, name="fill")
    assert STATS["compiles"] == before + 1 and not m.cached
    np.testing.assert_array_equal(_fill(m), np.arange(10, dtype=np.float32) + 3)


def test_missing_sidecar_is_rebuilt(cache):
    src = SRC % "4.0f"
    m = build_c(src, name="fill")
    m.path.with_suffix(".json").unlink()
    forget_loaded()
    before = STATS["compiles"]
    build_c(src, name="fill")
    assert STATS["compiles"] == before + 1


def test_build_failure_is_diagnosed_and_leaves_nothing(cache):
    bad = '#include "kumiko_cpu.h"\nKUMIKO_KERNEL broken(void** b, const long long* s) { return undefined_name; }\n'
    cache.mkdir(parents=True, exist_ok=True)
    with pytest.raises(KumikoError) as e:
        build_c(bad, name="broken_kernel")
    err = e.value
    assert err.code == "E1701" and err.kind == "KernelBuildFailed"
    assert "undefined_name" in err.why and "error" in err.why
    assert "broken_kernel.c" in err.why and "/tmp/" not in err.why.split("\n")[1]
    assert list(cache.iterdir()) == []
    kept = Path(err.details["source"])                  # the failing source is kept, outside the cache
    assert kept.read_text() == bad and cache not in kept.parents
    kept.unlink()


def test_cache_off_uses_a_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", "0")
    forget_loaded()
    m = build_c(SRC % "5.0f", name="fill")
    assert "kumiko-cache-" in str(m.path)
    np.testing.assert_array_equal(_fill(m), np.arange(10, dtype=np.float32) + 5)
    forget_loaded()


def test_custom_flags(cache):
    m = build_c(SRC % "6.0f", flags=["-O1", "-fPIC", "-shared", "-std=c11"], name="fill")
    np.testing.assert_array_equal(_fill(m), np.arange(10, dtype=np.float32) + 6)
    assert json.loads(m.path.with_suffix(".json").read_text())["flags"] == ["-O1", "-fPIC", "-shared", "-std=c11"]


def test_cpu_features_are_consistent():
    f = cpu_features()
    assert f["vector_width_f32"] in (4, 8, 16) and f["cores"] >= 1
    assert f["vector_width_f32"] == (16 if f["avx512f"] else 8 if f["avx"] else 4)
    if f["avx2"]:
        assert f["avx"]
    macros = cpu.native_macros()
    if macros:   # what -march=native compiles for agrees with what the CPU reports
        assert ("__AVX512F__" in macros) == f["avx512f"] and ("__AVX2__" in macros) == f["avx2"]
