"""The header and the GEMM fixture build for real GPUs: nvcc sm_80 / sm_90a, ptxas resources, PTX.

``pytest -m nvcc`` runs the compile checks (skipped with a reason where nvcc is missing); the
ptxas report parser is tested on a recorded log everywhere.
"""
from __future__ import annotations

import pytest

from kumiko.runtime.ptxas import KernelResources, nvcc_compile, nvcc_path, parse_ptxas_report

from .conftest import kernel_source

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")

RECORDED = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_f16_sm80' for 'sm_80'
ptxas info    : Function properties for gemm_f16_sm80
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers, 392 bytes cmem[0]
ptxas info    : Compile time = 76.113 ms
ptxas info    : Compiling entry function 'block_sum' for 'sm_90a'
ptxas info    : Function properties for block_sum
    24 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 376 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for _Z6helperv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_parse_ptxas_report():
    r = parse_ptxas_report(RECORDED)
    assert r["gemm_f16_sm80"] == KernelResources(name="gemm_f16_sm80", arch="sm_80", entry=True, registers=126,
                                                 barriers=1, smem=0, cmem={0: 392})
    b = r["block_sum"]
    assert (b.arch, b.registers, b.smem, b.stack_frame, b.spill_stores, b.spill_loads) == ("sm_90a", 12, 1024, 24, 8, 4)
    assert b.cmem == {0: 376, 2: 8}
    assert not r["_Z6helperv"].entry
    assert r["gemm_f16_sm80"].to_dict()["registers"] == 126


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gemm_builds_for_gpu(arch, record_property):
    res = nvcc_compile(kernel_source("gemm_sm80.cu"), arch, name="gemm_sm80")
    k = res.resources["gemm_f16_sm80"]
    record_property(f"ptxas_{arch}", k.to_dict())
    assert k.entry and k.arch == arch
    assert k.spill_stores == 0 and k.spill_loads == 0 and k.stack_frame == 0
    assert 0 < k.registers <= 255
    for instr in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
                  "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
        assert instr in res.ptx, instr


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("source", ["fragments.cu", "semantics.cu", "faults.cu"])
def test_fixtures_build_for_gpu(source):
    """Every fixture the emulator runs also compiles for sm_80 (same source, same names)."""
    res = nvcc_compile(kernel_source(source), "sm_80", name=source.removesuffix(".cu"))
    assert res.resources and all(k.spill_stores == 0 for k in res.resources.values())
    if source == "fragments.cu":
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in res.ptx
        assert "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16" in res.ptx


@pytest.mark.nvcc
@needs_nvcc
def test_gemm_host_entry_builds():
    """With host code: KUMIKO_ENTRY's cudaLaunchKernel wrapper and signature export compile too."""
    res = nvcc_compile(kernel_source("gemm_sm80.cu"), "sm_80", name="gemm_sm80", host=True)
    assert res.resources["gemm_f16_sm80"].spill_stores == 0
