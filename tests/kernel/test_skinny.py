"""The skinny contraction path (kumiko/kernel/skinny.py): GEMV and skinny GEMM (few rows on the A side)
against the Tiny IR evaluator at sizes that are not multiples of a vector or a panel, with a bias and an
activation in the epilogue, the weights bound (pre-packed once) and unbound (read in place, or packed per
panel: the last, partial one, and weights used transposed), batched
with broadcast weights and with weights per batch point; the plan that picks it, and its checks."""
from dataclasses import replace

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import rel_l2
from kumiko.diagnostics import KumikoError
from kumiko.plan.choose import MAX_SKINNY_ROWS, skinny_tile
from kumiko.plan.validate import validate
from kumiko.runtime.host import cpu_features


def _vw() -> int:
    """This machine's float vector width, which the plans are chosen for."""
    return cpu_features()["vector_width_f32"]


def _check(g, seed=0, algo="skinny"):
    """Compile for cpu, check that every contraction took ``algo`` and that two calls on fresh random inputs
    match the evaluator; return the Executable."""
    exe = kumiko.compile(g, "cpu")
    algos = {p.algo for p in exe._run.plans.values()} - {"loops"}
    assert algos == {algo}, exe._run.plans
    return two_calls_match(exe, g, seed)


def two_calls_match(exe, g, seed=0):
    """Two calls of ``exe`` on fresh random inputs (its bound parameters kept) equal the evaluator's
    outputs; returns ``exe``."""
    ref = kumiko.compile(g, "eval")
    for s in (seed, seed + 1):
        ins = {k: v for k, v in exe.random_inputs(s).items() if k not in exe.params}
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert out[k].shape == want[k].shape, k
            assert rel_l2(out[k], want[k]) < 1e-5, (k, rel_l2(out[k], want[k]))
    return exe


def _linear(m, k, n, bound, act="relu", batch=None, transposed=False, seed=0):
    """act(x @ W + b): W [K, N] (or [N, K] used transposed, as a torch Linear), bound or a plain input."""
    rng = np.random.default_rng(seed)
    wshape = (n, k) if transposed else (k, n)
    w = (Tensor(rng.standard_normal(wshape).astype(np.float32) * 0.2, name="w", role="param") if bound
         else Tensor.input("w", wshape))
    b = Tensor(rng.standard_normal(n).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", (batch, m, k) if batch else (m, k))
    y = (x @ (w.T if transposed else w)) + b
    return {"relu": y.relu(), "tanh": y.tanh(), "none": y}[act].graph("y")


CASES = [(1, 2, 7), (1, 767, 33), (1, 33, 3073), (2, 7, 33), (3, 767, 65), (5, 33, 767), (14, 65, 33)]


@pytest.mark.parametrize("m,k,n", CASES)
@pytest.mark.parametrize("bound", [True, False], ids=["bound", "input"])
def test_skinny_matches_the_evaluator(m, k, n, bound):
    """Where the registers hold this many rows (14 rows: AVX-512 only; AVX2's 16 registers take 6) the skinny
    path, else the packed one; either matches the evaluator."""
    skinny = skinny_tile(_vw(), m, n) is not None
    exe = _check(_linear(m, k, n, bound, act="relu" if m % 2 else "tanh"), algo="skinny" if skinny else "packed")
    if not skinny:
        return
    assert "skinny contraction" in exe._run.source
    runner = exe._run.runner
    packs = sum(len(st.packs) for st in runner.steps)
    assert (packs > 0) == bound            # a bound weight is pre-packed, an input is not
    assert ("kk_micro_bld_" in exe._run.source) == (not bound)    # an input is read in place (whole panels)
    assert runner.pack_calls == packs      # after two calls: packed on the first one only


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "input"])
def test_skinny_with_transposed_weights(bound):
    """x @ W.T (a torch Linear's [N, K] weight): B's rows are not contiguous; packed (or pre-packed) all the same."""
    exe = _check(_linear(3, 37, 70, bound, transposed=True))
    assert "kk_micro_bld_" not in exe._run.source


def test_batched_rows_with_broadcast_weights_are_rows():
    """x[B, M, K] @ W: the batch axes W does not read are M axes, B*M rows on the A side (skinny 12-row
    tiles on AVX-512; on AVX2 12 rows are too many for the skinny path and the packed one's 6-row tiles
    cover them twice)."""
    skinny = skinny_tile(_vw(), 12, 90) is not None
    exe = _check(_linear(3, 40, 90, True, batch=4), algo="skinny" if skinny else "packed")
    (plan,) = exe._run.plans.values()
    assert plan.register_block[0] == (12 if skinny else 6)


def test_batched_weights_per_batch_point():
    """q[b, 1, d] @ k[b, d, t] (attention decoding one token): the batch points and the panels split among
    the threads, A packed once per batch point."""
    q, kt = Tensor.input("q", (6, 1, 24)), Tensor.input("k", (6, 24, 45))
    _check(((q @ kt) * 0.5).graph("y"))


def test_residual_epilogue_is_fused():
    rng = np.random.default_rng(3)
    w = Tensor(rng.standard_normal((30, 41)).astype(np.float32), name="w", role="param")
    x, r = Tensor.input("x", (2, 30)), Tensor.input("r", (2, 41))
    exe = _check(((x @ w) + r).relu().graph("y"))
    assert len(exe._run.plans) == 1


@pytest.mark.parametrize("m", [15, 16, MAX_SKINNY_ROWS + 1])
def test_many_rows_take_the_packed_path(m):
    _check(_linear(m, 20, 40, True), algo="packed")


def test_unknown_rows_take_the_packed_path():
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    exe = kumiko.compile((a @ b).graph("y"), "cpu")
    assert {p.algo for p in exe._run.plans.values()} == {"packed"}


def test_skinny_tile():
    assert skinny_tile(16, 1, None) == (1, 128)         # 8 accumulators, 8 B vectors and a broadcast
    assert skinny_tile(16, 4, None) == (4, 96)          # 24 + 6 + 1 registers of 32
    assert skinny_tile(16, 14, None) == (14, 32)
    assert skinny_tile(16, 15, None) is None            # one vector per row and panel: the packed tiles win
    assert skinny_tile(8, 7, None) is None and skinny_tile(8, 6, None) == (6, 16)
    assert skinny_tile(8, 2, None) == (2, 40)
    assert skinny_tile(16, 1, 100) == (1, 16)           # every thread gets two panels of a narrow B side
    assert skinny_tile(16, 0, None) is None and skinny_tile(16, None, 64) is None


def test_a_skinny_plan_is_checked():
    g = _linear(2, 20, 40, True)
    exe = kumiko.compile(g, "cpu")
    (name, plan), = exe._run.plans.items()
    region = next(r for r in exe.compilation.region.regions if r.name == name)
    feats = {"vector_width_f32": plan.vector_width}
    assert validate(plan, region, (), feats) == plan
    for bad in ({"cache_block": (2, 32, 8)}, {"register_block": (2, plan.vector_width + 1)}):
        with pytest.raises(KumikoError) as e:
            validate(replace(plan, **bad), region, (), feats)
        assert e.value.code == "E1801"


_PACK_HARNESS = """#include "kumiko_cpu.h"
%s
#if defined(__AVX__)
int kk_test_pack(void** bufs, const long long* syms) {
  const float* src = (const float*)bufs[1];
  const float* rows[8];
  for (int i = 0; i < 8; ++i) rows[i] = src + i * syms[2];
  kk_pack_rows8((float*)bufs[0], syms[0], rows, (int)syms[1], syms[2]);
  return 0;
}
#endif
"""


@pytest.mark.parametrize("ld", [1, 2, 3, 4, 5, 8, 12, 16])
def test_the_row_packer_writes_nothing_past_the_last_column(ld):
    # a 2-row skinny panel (ld 2) with K a multiple of 8 had its 8-wide stores run 16 bytes past the A panel:
    # aligned_alloc's rounding hid it unless 2*K floats filled whole 64-byte lines (a heap abort, at random)
    from kumiko.kernel.micro import vector_types
    from kumiko.runtime.cpu import build_c, cpu_features
    if not (cpu_features().get("avx") or cpu_features().get("avx2")):
        pytest.skip("the transposing packer is AVX code")
    fn = build_c(_PACK_HARNESS % vector_types(8), name="pack_rows8_test").fn("kk_test_pack")
    rng = np.random.default_rng(ld)
    for nr in sorted({min(ld, 8), max(1, min(ld, 8) - 1)}):
        for kc in (1, 7, 8, 9, 16, 24, 33):
            src = rng.standard_normal((8, kc)).astype(np.float32)
            used = (kc - 1) * ld + nr
            dst = np.full(used + 32, np.float32(-7.0))
            assert fn([dst, src], [ld, nr, kc]) == 0
            got = np.array([[dst[p * ld + i] for i in range(nr)] for p in range(kc)])
            np.testing.assert_array_equal(got, src[:nr].T, err_msg=f"ld {ld} nr {nr} kc {kc}")
            assert np.all(dst[used:] == -7.0), f"ld {ld} nr {nr} kc {kc}: written past the last column"
