"""Faults the emulator detects come back as KumikoError with kernel, block and thread, not a crash.

kernels/faults.cu misbehaves in the way its first argument selects; each case checks the E1702
fault kind, who it names and that the process survives to run the next case. Launch-configuration
and argument mistakes are E1703; a kernel that does not compile is E1701 and leaves nothing behind.
"""
from __future__ import annotations

import numpy as np
import pytest

from kumiko.diagnostics import CODES, KumikoError
from kumiko.runtime.emu import EmuConfig, build, dynamic_shared_names, entry_names

from .conftest import needs_gxx

pytestmark = needs_gxx

#: which -> (block size, dynamic smem, fault kind, thread named (None: no single thread), text in why)
FAULTS = {
    1: (64, 0, "misaligned", (0, 0, 0), "not 16-byte aligned"),
    2: (64, 0, "deadlock", None, "threads 1-63 wait in __syncthreads"),
    3: (32, 0, "misaligned", (5, 0, 0), "row address of lane 5"),
    4: (32, 0, "poisoned_read", (0, 0, 0), "never-written shared memory"),
    5: (32, 0, "divergent_collective", (1, 0, 0), "__ballot_sync"),
    6: (32, 0, "cp_async", (0, 0, 0), "is shared memory, not global"),
    7: (32, 1024, "dynamic_smem_overflow", (0, 0, 0), "the launch gave 1024 bytes"),
    8: (48, 0, "partial_warp", (32, 0, 0), "needs all 32 lanes"),
    9: (64, 0, "warp_collective", (5, 0, 0), "exited while lanes"),
    10: (64, 0, "not_shared_memory", (0, 0, 0), "not in shared memory"),
    12: (32, 1024, "dynamic_smem_overflow", None, "stored to bytes [1024, 1152) of dynamic shared memory"),
    13: (32, 0, "misaligned", (3, 0, 0), "st_shared_16 destination"),
    14: (32, 0, "not_shared_memory", (0, 0, 0), "st_shared_16 destination"),
    17: (32, 0, "misaligned", (0, 0, 0), "global source"),
}


def _check_diag(err: KumikoError, code: str) -> None:
    assert err.code == code and err.kind == CODES[code][0]
    assert err.at and err.why and err.suggestion
    assert code in str(err)


@pytest.mark.parametrize("which", sorted(FAULTS))
def test_fault_reported(emu_module, which):
    mod = emu_module("faults")
    block, smem, kind, thread, text = FAULTS[which]
    g = np.arange(64, dtype=np.float32)
    out = np.zeros(2 * block, np.float32)
    with pytest.raises(KumikoError) as ei:
        mod.launch("fault", 2, block, args=[which, g, out], smem=smem)
    err = ei.value
    _check_diag(err, "E1702")
    assert err.details["fault"] == kind
    assert err.details["kernel"] == "fault" and err.details["block"] == [0, 0, 0]
    assert err.details["thread"] == (list(thread) if thread else None)
    assert text in err.why
    assert "block (0,0,0)" in err.at
    if thread is not None:
        assert err.details["where"].endswith(tuple(f"faults.cu:{n}" for n in range(1, 200)))


@pytest.mark.parametrize("which", [0, 11])
def test_no_fault(emu_module, which):
    """The module still works after faults; exited threads do not hold up __syncthreads."""
    mod = emu_module("faults")
    out = np.zeros(128, np.float32)
    mod.launch("fault", 2, 64, args=[which, np.zeros(64, np.float32), out])
    warp_sums = [sum(range(32)), sum(range(32, 64))]
    np.testing.assert_array_equal(out[:32], warp_sums[0])
    if which == 0:
        np.testing.assert_array_equal(out[32:64], warp_sums[1])


def test_st_shared_16_stores_four_words(emu_module):
    mod = emu_module("faults")
    out = np.full(128, np.nan, np.float32)
    mod.launch("fault", 2, 64, args=[15, np.zeros(64, np.float32), out])
    np.testing.assert_array_equal(out[:64], np.arange(64, dtype=np.float32))


@pytest.mark.parametrize("grid, block, smem, text", [
    (0, 32, 0, "grid"),
    (1, 2048, 0, "at most 1024 threads"),
    (1, (32, 32, 2), 0, "at most 1024 threads"),
    ((1, 70000), 32, 0, "grid"),
    (1, 32, 300_000, "shared memory"),
])
def test_invalid_launch(emu_module, grid, block, smem, text):
    mod = emu_module("faults")
    with pytest.raises(KumikoError) as ei:
        mod.launch("fault", grid, block, smem, args=[0, np.zeros(64, np.float32), np.zeros(4096, np.float32)])
    _check_diag(ei.value, "E1703")
    assert text in ei.value.why


def test_sm80_shared_memory_limit(emu_module):
    mod = emu_module("faults", EmuConfig(arch="sm80"))
    with pytest.raises(KumikoError, match="166912"):
        mod.launch("fault", 1, 32, 200_000, args=[0, np.zeros(64, np.float32), np.zeros(32, np.float32)])


@pytest.mark.parametrize("args, text", [
    ([0, np.zeros(64, np.float32)], "takes 3 arguments"),
    ([0, np.zeros(64, np.float64), np.zeros(64, np.float32)], "dtype float64"),
    ([0.5, np.zeros(64, np.float32), np.zeros(64, np.float32)], "integer"),
    ([0, np.zeros(64, np.float32), np.zeros((8, 16), np.float32)[:, ::2]], "C-contiguous"),
    ([0, np.zeros(64, np.float32), 3.0], "is a pointer"),
])
def test_bad_arguments(emu_module, args, text):
    mod = emu_module("faults")
    assert mod.signature("fault") == ["i32", "cptr:f32", "ptr:f32"]
    with pytest.raises(KumikoError) as ei:
        mod.launch("fault", 1, 32, args=args)
    _check_diag(ei.value, "E1703")
    assert text in ei.value.why


def test_unknown_kernel(emu_module):
    with pytest.raises(KumikoError) as ei:
        emu_module("faults").launch("nope", 1, 32, args=[])
    _check_diag(ei.value, "E1703")


def test_build_failure_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    bad = ('#include "kumiko_cuda.cuh"\n'
           'extern "C" __global__ void k(int* x) { x[0] = undefined_name; }\nKUMIKO_ENTRY(k)\n')
    with pytest.raises(KumikoError) as ei:
        build(bad, name="broken")
    _check_diag(ei.value, "E1701")
    assert "undefined_name" in ei.value.why or "undefined_name" in ei.value.details["log"]
    # nothing of the failed library (the precompiled emulator header it built stays: whole, with its sidecar;
    # the session's background builds may be writing here too, since KUMIKO_CACHE is process-wide)
    assert not [p for p in (tmp_path / "emu").rglob("*") if "broken" in str(p.relative_to(tmp_path))]
    assert all(p.name.startswith("pch-") for p in (tmp_path / "emu").glob("*.gch"))


def test_build_cache_and_out_of_bounds_guard(tmp_path, monkeypatch):
    """Content-addressed cache: the second build is a hit; an in-process store past the end of an
    output lands in a guard zone and is reported (E1702), and the next launch is clean."""
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    src = ('#include "kumiko_cuda.cuh"\n'
           'extern "C" __global__ void fill(float* x, int n, int extra) {\n'
           '  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
           '  if (i < n + extra) x[i] = 1.0f;\n'
           '}\nKUMIKO_ENTRY(fill)\n')
    mod = build(src, name="fill")
    mtime = mod.path.stat().st_mtime_ns
    again = build(src, name="fill")
    assert again.path == mod.path and again.path.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "emu").glob("*.so")] == [mod.path.name]
    assert entry_names(src) == ["fill"] and dynamic_shared_names(src) == []
    x = np.zeros(100, np.float32)
    mod.launch("fill", 4, 32, args=[x, 100, 0])
    np.testing.assert_array_equal(x, 1.0)
    with pytest.raises(KumikoError) as ei:
        mod.launch("fill", 4, 32, args=[np.zeros(100, np.float32), 100, 3])
    _check_diag(ei.value, "E1702")
    assert ei.value.details["fault"] == "out_of_bounds_write" and "12 bytes past its end" in ei.value.why


def test_dynamic_shared_names():
    src = """
    // extern __shared__ float commented_out[];
    extern __shared__ __align__(16) unsigned char smem[];
    extern __shared__ half  buf [ ] ;
    """
    assert dynamic_shared_names(src) == ["buf", "smem"]


def test_cp_async_source_checked_when_nothing_is_read(emu_module):
    """cp.async with src_bytes 0 reads nothing, but its source must still be a valid address: the plain
    build lets a source past the operand's end pass; the ASan build (the strict one) reports it."""
    g = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    emu_module("faults").launch("fault", 2, 32, args=[16, g, out])
    with pytest.raises(KumikoError) as ei:
        emu_module("faults_asan").launch("fault", 2, 32, args=[16, g, out])
    _check_diag(ei.value, "E1702")
    assert ei.value.details["fault"] == "cp_async" and "outside any live allocation" in ei.value.why
