"""The SM90 verifier (kumiko/kernel/gpu_verify_sm90.py): the hand-assembled TMA + wgmma GEMM passes, and each
rule rejects a small wrong program - the GEMM with one bug injected into its GPU IR - with its hazard."""
from __future__ import annotations

import dataclasses

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir_sm90 import SetMaxNReg, rewrite
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from tests.emu.sm90_program import gemm_kernel, inject, roles_kernel, ws_gemm_kernel


@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("stages", [2, 3])
def test_gemm_program_verifies(n, stages):
    k = gemm_kernel(n, "bf16", stages)
    assert verify_sm90(k) is k


@pytest.mark.parametrize("bug,hazard,text", [
    ("parity", "mbar_parity", "waits on kk_full[0] with parity 1, i.e. for phase 1, but the phase it waits for next "
                              "is 0"),
    ("expect_tx", "expect_tx", "phase 0 of kk_full[0]: arrive.expect_tx announced 24576 bytes, the TMA loads "
                               "signalling it delivered 16384"),
    ("empty_count", "mbar_deadlock", "waits on kk_empty[0] with parity 0 in phase 0 (128 of 256 arrivals missing"),
    ("no_full_wait", "unwaited_tma", "reads sA[0], whose TMA load completes phase 0 of kk_full[0]"),
    ("no_epilogue_wait", "acc_in_flight", "accumulator acc is read before wgmma.wait_group retired"),
    ("no_wgmma_fence", "wgmma_fence", "no wgmma.fence since its registers were last accessed"),
    ("no_proxy_fence", "proxy_fence", "TMA store reads sC[0], which threads wrote with ordinary stores and no "
                                      "fence.proxy.async since"),
    ("no_barrier", "no_barrier", "TMA store reads sC[0], which other threads wrote, with no barrier since"),
    ("desc_swizzle", "desc_swizzle", "the descriptor of sA says 64B swizzle, the tensor map tmA that filled it 128B"),
    ("no_empty_wait", "stage_not_released", "TMA load 1 into stage 0 of sA: its consumers release fill 0 in phase 0 "
                                            "of kk_empty[0], which role cta did not wait for"),
    ("early_release", "release_in_flight", "releases stage 0 (arrives on kk_empty[0]) while its wgmma reading the "
                                           "stage is in flight"),
    ("no_wgmma_wait", "release_in_flight", "while its wgmma reading the stage is in flight"),
    ("no_bulk_wait", "bulk_not_waited", "ends with TMA stores not waited for"),
    ("wrong_n", "shape", "wgmma m64n72k16 fp16 into acc"),
])
def test_each_rule_rejects_its_bug(bug, hazard, text):
    with pytest.raises(KumikoError) as e:
        verify_sm90(inject(gemm_kernel(64), bug))
    assert e.value.code == "E1801" and e.value.details["hazard"] == hazard, e.value
    assert text in e.value.why, e.value.why


def test_warp_specialised_gemm_verifies_and_its_ring_bugs_do_not():
    k = verify_sm90(ws_gemm_kernel(128, "bf16", 3))
    for bug, hazard in (("no_empty_wait", "stage_not_released"), ("early_release", "release_in_flight"),
                        ("parity", "mbar_parity")):
        with pytest.raises(KumikoError) as e:
            verify_sm90(inject(k, bug))
        assert e.value.details["hazard"] == hazard, (bug, e.value)


def test_register_budget_and_setmaxnreg():
    verify_sm90(roles_kernel(232))
    with pytest.raises(KumikoError) as e:
        verify_sm90(roles_kernel(240))
    assert e.value.details["hazard"] == "register_budget" and "66560 registers" in e.value.why
    k = roles_kernel(232)
    odd = dataclasses.replace(k, body=rewrite(k.body, lambda s: (SetMaxNReg(False, 20),)
                                              if isinstance(s, SetMaxNReg) and not s.inc else None))
    with pytest.raises(KumikoError) as e:
        verify_sm90(odd)
    assert e.value.details["hazard"] == "setmaxnreg"


def test_shared_memory_budget():
    with pytest.raises(KumikoError) as e:
        verify_sm90(gemm_kernel(256, stages=5))
    assert e.value.details["hazard"] == "smem_budget"
