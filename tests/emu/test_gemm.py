"""End-to-end: the SM80-style fp16 GEMM fixture on the emulator, correct in every configuration of
``CONFIGS``, and each of the seven injected bugs of the feasibility study caught by at least one of them.

kernels/gemm_sm80.cu is the skeleton kumiko's generator will emit (cp.async ring -> commit/wait ->
ldmatrix -> mma.sync -> epilogue -> predicated stores); M, N, K are not tile multiples. The bugs are
switched on by a kernel argument (one build per configuration serves all seven), and a bug counts
as caught when the launch raises E1702 (poisoned read, sanitizer report, guard-zone write) or the
result is wrong (relative L2 error >= 1e-2, or NaN).
"""
from __future__ import annotations

import numpy as np
import pytest

from kumiko.diagnostics import KumikoError
from kumiko.runtime.emu import CONFIGS

from .conftest import GEMM_SMEM, needs_gxx, rel_l2

pytestmark = needs_gxx

BUGS = {
    "missing_wait": 1,
    "wrong_wait_depth": 2,
    "missing_trailing_barrier": 3,
    "missing_row_predicate": 4,
    "missing_k_predicate": 5,
    "wrong_ldmatrix_lane_address": 6,
    "missing_epilogue_column_check": 7,
}
#: which configurations catch which bug (measured; docs/emulator.md has the same table). The test
#: requires at least one catcher per bug, and that the set does not silently shrink.
EXPECTED_CATCHERS = {
    "missing_wait": {"deferred+round_robin", "deferred+random1", "asan"},
    "wrong_wait_depth": {"deferred+round_robin", "deferred+random1", "asan"},
    "missing_trailing_barrier": {"eager+run_ahead", "eager+reversed"},
    "missing_row_predicate": {"asan"},
    "missing_k_predicate": set(CONFIGS),
    "wrong_ldmatrix_lane_address": set(CONFIGS),
    "missing_epilogue_column_check": set(CONFIGS),
}
SHAPE = (200, 136, 200)  # M, N, K: 2x2 blocks of 128x128, 7 k-tiles of 32 (> 3 stages), all with tails


def _module(emu_module, config_name):
    key = "gemm_asan" if config_name == "asan" else "gemm"
    return emu_module(key, CONFIGS[config_name])


def _operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    return a, b, a.astype(np.float32) @ b.astype(np.float32)


def run_gemm(mod, m, n, k, bug=0, seed=0):
    a, b, ref = _operands(m, n, k, seed)
    c = np.zeros((m, n), np.float16)
    res = mod.launch("gemm_f16_sm80", ((n + 127) // 128, (m + 127) // 128), 256, GEMM_SMEM,
                     args=[a, b, c, m, n, k, bug])
    return c, ref, res


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("shape", [SHAPE, (256, 256, 128), (37, 8, 24)])
def test_gemm_matches_numpy(emu_module, config_name, shape):
    c, ref, res = run_gemm(_module(emu_module, config_name), *shape)
    assert rel_l2(c, ref) < 1e-2
    assert res.stats["blocks"] == ((shape[1] + 127) // 128) * ((shape[0] + 127) // 128)


def test_gemm_emulation_time(emu_module, record_property):
    """The feasibility study's yardstick: 256x256x128 with 128x128x32 tiles in about 0.1 s."""
    mod = _module(emu_module, "deferred+round_robin")
    run_gemm(mod, 256, 256, 128)  # warm: fiber stacks are mapped on first use
    runs = [run_gemm(mod, 256, 256, 128)[2] for _ in range(3)]
    record_property("gemm_256x256x128_seconds", min(r.seconds for r in runs))
    record_property("gemm_256x256x128_cpu_seconds", min(r.cpu_seconds for r in runs))
    assert min(r.cpu_seconds for r in runs) < 2.0


def _caught(mod, bug) -> str | None:
    """How the configuration caught the bug, or None."""
    try:
        c, ref, _ = run_gemm(mod, *SHAPE, bug=bug)
    except KumikoError as e:
        assert e.code == "E1702", str(e)
        return f"E1702 {e.details.get('fault')}"
    err = rel_l2(c, ref)
    return f"wrong result (rel L2 {err:.3g})" if err >= 1e-2 else None


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bug_is_caught(emu_module, bug):
    caught = {name: _caught(_module(emu_module, name), BUGS[bug]) for name in CONFIGS}
    catchers = {name for name, how in caught.items() if how}
    assert catchers, f"{bug} escaped every configuration"
    assert catchers >= EXPECTED_CATCHERS[bug], f"{bug}: caught by {caught}"


def test_asan_report_names_line_and_thread(emu_module):
    """A sanitizer report becomes E1702 naming the access, the kernel source line and the CUDA thread."""
    with pytest.raises(KumikoError) as ei:
        run_gemm(_module(emu_module, "asan"), *SHAPE, bug=BUGS["missing_row_predicate"])
    e = ei.value
    assert e.code == "E1702" and e.details["fault"] == "asan:heap-buffer-overflow"
    assert "READ of 16 bytes" in e.why
    assert e.details["where"].rsplit(":", 1)[0].endswith("gemm_sm80.cu")
    assert e.details["block"][1] == 1  # rows >= M = 200 exist only in the second block row
    assert len(e.details["thread"]) == 3 and "AddressSanitizer" in e.details["report"]
