"""Each of the seven bug kinds, injected into the generated GEMM by mutating its GPU IR, is caught by
the emulator (in the configuration docs/cuda.md names), and the schedule bugs already by the verifier."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import Barrier, KLoop, LoadFrag, MmaKernel, WaitGroup
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.pipeline import compile_cuda
from kumiko.render.cuda import render_cuda
from kumiko.runtime.emu_program import CompiledCuda

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
#: bugs that read memory outside the operand: what lies there decides the symptom - a wrong result, or, when it
#: is another buffer's NaN poison, a poisoned read (which one depends on the process's heap layout)
READS_OUTSIDE = {"missing_k_predicate"}


def _compile(g, release: str) -> CompiledCuda:
    """The GEMM under its chosen plan with the ring schedule ``release`` (async.release)."""
    base = compile_cuda(g.tiny)
    plans = {n: p.with_(async_={**dict(p.async_), "release": release}) for n, p in base.plans.items()}
    return compile_cuda(g.tiny, plans=plans)


@pytest.fixture(scope="module")
def gemm():
    """The study's seven bugs live in the two-barrier ("trailing") schedule: it has a trailing barrier."""
    g = graph("gemm_bias_relu", "fp16")
    return g, _compile(g, "trailing")


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
        try:
            errs = run_and_compare(bad, g, emu, 5, SIZES)
        except KumikoError as e:
            assert bug in READS_OUTSIDE and e.code == "E1702" and e.details["fault"] == "poisoned_read", e
        else:
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


#: the one-barrier schedules' own bugs ("merged", the large plan's; "registers", the small plan's, with its
#: fragments double-buffered): every one is rejected by the verifier and caught by the emulator
ONE_BARRIER_BUGS = {
    "missing_wait": BUGS["missing_wait"],
    "wrong_wait_depth": BUGS["wrong_wait_depth"],
    "missing_barrier": lambda k: replace(k, loop=KLoop(k.loop.var, tuple(s for s in k.loop.body
                                                                         if not isinstance(s, Barrier)))),
}
BODIES = {"merged": ["WaitGroup", "Barrier", "LoadTile", "CommitGroup", "Compute"],
          "registers": ["LoadFrag", "MmaFrag", "LoadTile", "CommitGroup", "WaitGroup", "Barrier", "LoadFrag",
                        "MmaFrag"]}


def _swap_first_fragment_steps(k: MmaKernel) -> MmaKernel:
    """The registers schedule's own bug: the iteration's first MMAs read register buffer 1 before its ldmatrix
    refills it (the previous tile's last step, multiplied again), and step 0 is never multiplied."""
    body = list(k.loop.body)
    i = next(i for i, s in enumerate(body) if isinstance(s, LoadFrag))
    body[i], body[i + 1] = body[i + 1], body[i]
    body[i] = replace(body[i], buf=1 - body[i].buf)
    return replace(k, loop=KLoop(k.loop.var, tuple(body)))


@needs_gxx
@pytest.mark.parametrize("release, bug", [(r, b) for r in BODIES for b in sorted(ONE_BARRIER_BUGS)]
                         + [("registers", "fragment_order")])
def test_one_barrier_schedule_bugs_are_caught(gpu_cache, release, bug):
    g = graph("gemm_bias_relu", "fp16")
    base = _compile(g, release)
    k = next(k for k in base.kernels if isinstance(k, MmaKernel))
    assert [type(s).__name__ for s in k.loop.body] == BODIES[release]
    assert all(s.pending == k.stages - 2 for s in k.loop.body if isinstance(s, WaitGroup))
    assert max(run_and_compare(base, g, "deferred", 5, SIZES).values()) < 1e-2
    mutate = _swap_first_fragment_steps if bug == "fragment_order" else ONE_BARRIER_BUGS[bug]
    ks = [mutate(k) if isinstance(k, MmaKernel) else k for k in base.kernels]
    bad = CompiledCuda(base.program, base.plans, ks, render_cuda(ks), base.launches, base.arch)
    assert bad.source != base.source
    with pytest.raises(KumikoError) as e:
        verify_mma(next(k for k in ks if isinstance(k, MmaKernel)))
    assert e.value.details["hazard"] in (("fragment_order",) if bug == "fragment_order" else
                                         ("unwaited_token", "no_barrier_after_wait", "stage_not_released"))
    if bug == "fragment_order":                  # stale registers: a wrong result, no fault
        assert max(run_and_compare(bad, g, "deferred", 5, SIZES).values()) > 0.05
        return
    with pytest.raises(KumikoError) as e:
        run_and_compare(bad, g, "deferred", 5, SIZES)
    assert e.value.code == "E1702" and e.value.details["fault"] == "poisoned_read", e.value


@needs_gxx
@pytest.mark.parametrize("bug", ["missing_row_predicate", "missing_k_predicate"])
def test_predicate_bugs_in_the_row_gather_are_caught(gpu_cache, bug):
    """The implicit GEMM's im2col operand is gathered by rows (its M indices decomposed once, its K indices
    advanced as a counter past tile 0): without the row predicate the rows past M read past the input
    (AddressSanitizer), without the K predicate tile 0's columns before K = 0 are read (a fault or a wrong
    result); the clean kernel passes at the same sizes."""
    g = graph("conv3x3_s2_p1", "fp16")
    base = compile_cuda(g.tiny)
    sizes = {"N": 2, "C": 5, "H": 21, "W": 19, "Co": 24}    # M = 220: a partial M tile; K = 45: a partial K tile
    assert "// x gathered by rows" in base.source
    assert max(run_and_compare(base, g, "asan", 3, sizes).values()) < 1e-2
    bad = _inject(base, bug)
    assert bad.source != base.source
    try:
        errs = run_and_compare(bad, g, "asan", 3, sizes)
    except KumikoError as e:
        assert e.code == "E1702" and e.details["fault"].startswith("asan:"), e
    else:
        assert bug == "missing_k_predicate" and max(errs.values()) > 0.05, errs
