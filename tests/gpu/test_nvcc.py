"""Every example's kernels build with nvcc for sm_80 and sm_90a with zero spills (the ptxas report is fed
back to the plan: ``nvcc_check`` raises E1801 on spills or shared-memory overflow); the generated GEMM's
PTX holds cp.async, ldmatrix and mma. Skipped with a reason where nvcc is missing."""
from __future__ import annotations

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.pipeline import compile_cuda
from kumiko.plan.gpu import check_resources
from kumiko.runtime.emu_program import nvcc_check
from kumiko.runtime.ptxas import KernelResources, nvcc_path

from .conftest import STEMS, graph

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("stem", STEMS)
def test_examples_build_for_sm80_and_sm90a_without_spills(stem, dtype):
    c = compile_cuda(graph(stem, dtype).tiny)
    for arch in ("sm_80", "sm_90a"):
        res = nvcc_check(c, arch)
        assert "warning" not in res.log, res.log        # e.g. a variable declared and never used
        for ln in c.launches:
            r = res.resources[ln.kernel]
            assert r.spill_stores == r.spill_loads == 0 and r.registers <= 255, r
        if stem == "gemm_bias_relu" and dtype == "fp16":
            for instr in ("cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4",
                          "ldmatrix.sync.aligned.m8n8.x4.trans", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
                assert instr in res.ptx, instr


def test_ptxas_feedback_rejects_spills_and_smem_overflow():
    c = compile_cuda(graph("gemm_bias_relu", "fp16").tiny)
    plan = next(iter(c.plans.values()))
    ok = KernelResources("k", "sm_80", True, registers=96)
    check_resources(plan, "k", ok, 30000)
    with pytest.raises(KumikoError) as e:
        check_resources(plan, "k", KernelResources("k", "sm_80", True, registers=255, spill_stores=64), 30000)
    assert e.value.code == "E1801" and e.value.details["hazard"] == "spill"
    with pytest.raises(KumikoError) as e:
        check_resources(plan, "k", ok, 200000)
    assert e.value.details["hazard"] == "smem"
