"""Emulator semantics: cp.async groups and zero-fill, per-block poisoned shared memory, fp16/bf16.

These pin down the behaviour the bug-catching relies on: in deferred mode a cp.async lands exactly
at the wait_group that covers it (earlier reads see the 0xFF poison), in eager mode at issue; every
block starts with all shared memory poisoned; conversions round like CUDA's.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kumiko.runtime.emu import EmuConfig

from .conftest import needs_gxx

pytestmark = needs_gxx
POISON32 = 0xFFFFFFFF


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_cp_async_groups_and_zero_fill(emu_module, mode):
    mod = emu_module("semantics", EmuConfig(cp_async=mode))
    g = np.random.default_rng(0).standard_normal(192).astype(np.float32)
    gbits = g.view(np.uint32).reshape(-1, 16, 4)  # [region][thread][word]
    out = np.zeros((5, 16, 4), np.uint32)
    mod.launch("cp_async_groups", 1, 16, args=[g, out])
    deferred = mode == "deferred"
    # region 0 before any wait: poison when deferred, data when eager
    np.testing.assert_array_equal(out[0], np.full((16, 4), POISON32) if deferred else gbits[0])
    np.testing.assert_array_equal(out[1], gbits[0])  # wait<1>: the older group has landed
    # 6-byte copy of group 1: word 0 whole, word 1 keeps its low 2 bytes, the rest zero-filled
    landed = np.zeros((16, 4), np.uint32)
    landed[:, 0] = gbits[1][:, 0]
    landed[:, 1] = gbits[1][:, 1] & 0xFFFF
    np.testing.assert_array_equal(out[2], np.full((16, 4), POISON32) if deferred else landed)
    np.testing.assert_array_equal(out[3], landed)
    np.testing.assert_array_equal(out[4], 0)  # src_bytes = 0: sixteen zero bytes


def test_shared_memory_poisoned_for_every_block(emu_module):
    mod = emu_module("semantics")
    out = np.zeros((3, 2, 32), np.uint32)  # [block][static, dynamic][thread]
    mod.launch("smem_poison", 3, 32, args=[out], smem=32 * 4)
    np.testing.assert_array_equal(out, POISON32)


def test_fp16_bf16_conversions(emu_module):
    mod = emu_module("semantics")
    rng = np.random.default_rng(5)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 65536.0, 1e-8, 2.0**-24,
                         2.0**-25, 1.5 * 2.0**-25, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1 + 2.0**-11,
                         1 + 3 * 2.0**-11, 3.0e38, -3.4e38, 1e-40], np.float32)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near_half = (rng.standard_normal(200_000) * 100).astype(np.float32)
    x = np.concatenate([specials, bits, near_half])
    n = x.size
    h = np.zeros(n, np.uint16)
    bf = np.zeros(n, np.uint16)
    hf = np.zeros(n, np.float32)
    bff = np.zeros(n, np.float32)
    mod.launch("convert", 64, 256, args=[x, h, bf, hf, bff, n])
    nan = np.isnan(x)
    # fp32 -> fp16 / bf16: round to nearest even like numpy / ml_dtypes; NaN -> canonical 0x7FFF (CUDA)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h[~nan], x[~nan].astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(bf[~nan], x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.all(h[nan] == 0x7FFF) and np.all(bf[nan] == 0x7FFF)
    # fp16 / bf16 -> fp32 for every bit pattern (index i converts pattern i & 0xFFFF)
    pat = (np.arange(n) & 0xFFFF).astype(np.uint16)
    np.testing.assert_array_equal(hf.view(np.uint32), pat.view(np.float16).astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(bff.view(np.uint32), pat.astype(np.uint32) << 16)


def test_exp2_ftz_flushes_subnormal_results(emu_module):
    """exp2_ftz is ex2.approx.ftz.f32 on a GPU: 2^x where that is a normal float (or 0, inf, NaN at -inf, inf,
    NaN), +0 where it would be subnormal (x below -126: the PTX ISA flushes .ftz results to sign-preserving 0)."""
    mod = emu_module("semantics")
    x = np.array([0.0, 1.0, -1.0, 10.5, -126.0, -126.5, -127.0, -140.0, -149.0, -200.0, -np.inf, np.inf, np.nan,
                  2.0**-140, -(2.0**-140), 127.5], np.float32)
    y = np.full(x.size, np.float32(7.0))
    mod.launch("exp2_ftz_map", 1, 32, args=[x, y, x.size])
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    want[(want < np.finfo(np.float32).tiny) & ~np.isnan(want)] = 0.0
    np.testing.assert_allclose(y[~np.isnan(x)], want[~np.isnan(x)], rtol=1e-6, atol=0)
    assert np.isnan(y[np.isnan(x)]).all()
    assert (y[(x < -126) & (x > -np.inf)] == 0).all() and np.signbit(y[x < -126]).sum() == 0
    assert y[x == -126.0][0] == np.finfo(np.float32).tiny      # 2^-126, the smallest normal, is kept


def _warp_order(mod, bug: int = 0):
    x = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    y = np.zeros(256, np.float32)
    order, counter = np.zeros(256, np.uint32), np.zeros(1, np.uint32)
    mod.launch("warp_order", 1, 256, args=[x, y, order, counter, bug])
    want = np.concatenate([x[:32], x[:-32]])
    return order, y, want


def test_schedules_order_threads_as_documented(emu_module):
    """round_robin and run_ahead start thread 0 first; reversed the last thread first (descending);
    random is a permutation fixed by its seed and different for another seed."""
    orders = {}
    for sched, seed in (("round_robin", 0), ("run_ahead", 0), ("reversed", 0), ("random", 1), ("random", 2)):
        order, y, want = _warp_order(emu_module("semantics", EmuConfig(schedule=sched, seed=seed)))
        np.testing.assert_array_equal(y, want)              # with its barrier the kernel is right in every order
        np.testing.assert_array_equal(np.sort(order), np.arange(256))
        orders[sched, seed] = order
    np.testing.assert_array_equal(orders["round_robin", 0], np.arange(256))
    np.testing.assert_array_equal(orders["run_ahead", 0], np.arange(256))
    np.testing.assert_array_equal(orders["reversed", 0], np.arange(256)[::-1])
    assert not np.array_equal(orders["random", 1], orders["random", 2])
    again, _, _ = _warp_order(emu_module("semantics", EmuConfig(schedule="random", seed=1)))
    np.testing.assert_array_equal(again, orders["random", 1])


def test_missing_barrier_between_warps_is_seen_only_out_of_order(emu_module):
    """A warp reading what the warp before it stored, without a barrier: warp-0-first schedules run the
    writer first and miss it; the reversed schedule (and a random one) reads the poison."""
    for sched in ("round_robin", "run_ahead"):
        _, y, want = _warp_order(emu_module("semantics", EmuConfig(schedule=sched)), bug=1)
        np.testing.assert_array_equal(y, want)
    for sched, seed in (("reversed", 0), ("random", 1)):
        _, y, want = _warp_order(emu_module("semantics", EmuConfig(schedule=sched, seed=seed)), bug=1)
        assert np.isnan(y[32:]).any(), sched


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule"):
        EmuConfig(schedule="backwards")
