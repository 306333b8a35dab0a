"""Each of the seven bug kinds, injected into the generated GEMM by mutating its GPU IR, is caught by
the emulator (in the configuration docs/cuda.md names), and the schedule bugs already by the verifier."""
from __future__ import annotations

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import MmaKernel
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.render.cuda import render_cuda
from kumiko.runtime.target_cuda import CompiledCuda, compile_cuda

from .bugs import BUGS, SIZES, VERIFIER_HAZARD
from .conftest import graph, needs_gxx, run_and_compare

#: bug -> (configuration that catches it, E1702 fault kind or None for a wrong result)
CAUGHT = {
    "missing_wait": ("deferred", "poisoned_read"),
    "wrong_wait_depth": ("deferred", "poisoned_read"),
    "missing_trailing_barrier": ("eager", None),
    "missing_row_predicate": ("asan", "asan:heap-buffer-overflow"),
    "missing_k_predicate": ("deferred", None),
    "wrong_ldmatrix_lane_address": ("deferred", None),
    "missing_epilogue_column_check": ("deferred", "out_of_bounds_write"),
}


@pytest.fixture(scope="module")
def gemm():
    g = graph("gemm_bias_relu", "fp16")
    return g, compile_cuda(g.tiny)


def _inject(base: CompiledCuda, bug: str) -> CompiledCuda:
    ks = [BUGS[bug](k) if isinstance(k, MmaKernel) else k for k in base.kernels]
    return CompiledCuda(base.program, base.plans, ks, render_cuda(ks), base.launches, base.arch)


def test_the_clean_kernel_passes_in_every_configuration_used(gemm, gpu_cache):
    g, base = gemm
    for emu in sorted({e for e, _ in CAUGHT.values()}):
        errs = run_and_compare(base, g, emu, 5, SIZES)
        assert max(errs.values()) < 1e-2, (emu, errs)


@needs_gxx
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_emulator_catches_injected_bug(gemm, gpu_cache, bug):
    g, base = gemm
    bad = _inject(base, bug)
    assert bad.source != base.source
    emu, fault = CAUGHT[bug]
    if fault is None:
        errs = run_and_compare(bad, g, emu, 5, SIZES)
        assert max(errs.values()) > 0.05, errs
    else:
        with pytest.raises(KumikoError) as e:
            run_and_compare(bad, g, emu, 5, SIZES)
        assert e.value.code == "E1702" and e.value.details["fault"] == fault, e.value


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_verifier_rejects_schedule_bugs(gemm, bug):
    _, base = gemm
    (k,) = [k for k in base.kernels if isinstance(k, MmaKernel)]
    bad = BUGS[bug](k)
    if bug not in VERIFIER_HAZARD:
        assert verify_mma(bad) is bad        # address and predicate bugs are the emulator's to catch
        return
    with pytest.raises(KumikoError) as e:
        verify_mma(bad)
    assert e.value.code == "E1801" and e.value.details["hazard"] == VERIFIER_HAZARD[bug], e.value
