"""Fragment layouts of the warp collectives against numpy, from the PTX ISA formulas.

The fixtures in kernels/fragments.cu build mma operands and decode ldmatrix registers with the PTX
ISA's per-lane formulas written out independently of the emulator; numpy computes the expected
values from the same formulas here. A layout bug in either (or on a GPU, with the same kernel)
fails these tests.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from .conftest import needs_gxx

pytestmark = needs_gxx


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("values", ["integers", "normal"])
def test_mma_m16n8k16(emu_module, dtype, values):
    mod = emu_module("fragments")
    rng = np.random.default_rng(1)
    npt = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    if values == "integers":  # exact in fp32: any misplaced element changes the result
        a = rng.integers(-8, 9, (16, 16)).astype(npt)
        b = rng.integers(-8, 9, (16, 8)).astype(npt)
        c = rng.integers(-64, 65, (16, 8)).astype(np.float32)
    else:
        a = rng.standard_normal((16, 16)).astype(npt)
        b = rng.standard_normal((16, 8)).astype(npt)
        c = rng.standard_normal((16, 8)).astype(np.float32)
    d = np.full((16, 8), np.nan, np.float32)
    mod.launch(f"mma_{dtype}", 1, 32, args=[a.view(np.uint16), b.view(np.uint16), c, d])
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    if values == "integers":
        np.testing.assert_array_equal(d, ref.astype(np.float32))
    else:
        np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)


def _expected_ldmatrix(src, rows, cols, num, trans):
    """Registers per PTX ISA 'ldmatrix': lanes 8m..8m+7 address the rows of matrix m; lane l gets
    row l/4, elements 2(l%4), 2(l%4)+1 (low half first), or with .trans column l/4, rows 2(l%4),+1."""
    out = np.zeros((32, 4), np.uint32)
    for m in range(num):
        mat = np.stack([src[rows[8 * m + r], cols[8 * m + r]:cols[8 * m + r] + 8] for r in range(8)])
        for lane in range(32):
            r, c = lane // 4, 2 * (lane % 4)
            lo, hi = (mat[c, r], mat[c + 1, r]) if trans else (mat[r, c], mat[r, c + 1])
            out[lane, m] = int(lo) | (int(hi) << 16)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ldmatrix_all_variants(emu_module, seed):
    mod = emu_module("fragments")
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 0xFFFF, (32, 16)).astype(np.uint16)  # 0xFFFF excluded: that is the poison
    rows = rng.permutation(32).astype(np.int32) if seed else np.arange(32, dtype=np.int32)
    cols = (rng.integers(0, 2, 32) * 8).astype(np.int32)
    out = np.zeros((6, 32, 4), np.uint32)
    mod.launch("ldmatrix_dump", 1, 32, args=[src, rows, cols, out])
    for v, (num, trans) in enumerate([(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)]):
        exp = _expected_ldmatrix(src, rows, cols, num, trans)
        np.testing.assert_array_equal(out[v, :, :num], exp[:, :num], err_msg=f"x{num}{' trans' if trans else ''}")


def test_warp_shuffles_and_votes(emu_module):
    mod = emu_module("fragments")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(32).astype(np.float32)
    out = np.zeros((9, 32), np.float32)
    votes = np.zeros(32, np.uint32)
    mod.launch("warp_ops", 1, 32, args=[x, out, votes])
    lanes = np.arange(32)
    # butterfly reductions: every lane gets the total (summation order of a xor tree)
    np.testing.assert_allclose(out[0], np.full(32, x.sum()), rtol=1e-5)
    np.testing.assert_array_equal(out[1], np.full(32, x.max()))
    np.testing.assert_array_equal(out[2], np.full(32, x[7]))
    np.testing.assert_array_equal(out[3], np.where(lanes + 3 < 32, x[np.minimum(lanes + 3, 31)], x))
    np.testing.assert_array_equal(out[4], np.where(lanes >= 5, x[np.maximum(lanes - 5, 0)], x))
    np.testing.assert_array_equal(out[5], x[lanes ^ 9])
    np.testing.assert_array_equal(out[6], x[lanes ^ 4])  # width 8: xor 4 stays inside the segment
    seg_end = (lanes // 16 + 1) * 16
    np.testing.assert_array_equal(out[7], np.where(lanes + 2 < seg_end, x[np.minimum(lanes + 2, 31)], x))
    ballot = sum(1 << i for i in range(32) if x[i] > 0)
    np.testing.assert_array_equal(votes, np.full(32, ballot, np.uint32))
    np.testing.assert_array_equal(out[8], x[lanes ^ 1])  # two half-warp groups in flight at once


def test_block_barrier_reduction(emu_module):
    mod = emu_module("fragments")
    x = np.random.default_rng(4).standard_normal(3 * 256).astype(np.float32)
    out = np.zeros(3, np.float32)
    count = np.zeros(3, np.int32)
    mod.launch("block_sum", 3, 256, args=[x, out, count])
    np.testing.assert_allclose(out, x.reshape(3, 256).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(count, (x.reshape(3, 256) > 0).sum(1))


def test_lane_and_warp_ids_in_2d_blocks(emu_module):
    out = np.zeros(64, np.uint32)
    emu_module("fragments").launch("lane_ids", 1, (8, 8), args=[out])
    linear = np.arange(64, dtype=np.uint32)
    np.testing.assert_array_equal(out, (linear % 32) | ((linear // 32) << 8) | ((linear ^ 1) << 16))
