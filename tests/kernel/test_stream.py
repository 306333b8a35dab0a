"""Row-block fusion of a contraction region pair (kumiko.kernel.stream): which pairs fuse, that the
deferred buffer is never allocated, and that the fused kernel matches the evaluator - with causal
micro-tiles skipped, zero key blocks skipped only when that is exact, at odd and size-1 shapes."""
import math

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.compiler import load, to_tiny
from kumiko.kernel.stream import acc_guards
from kumiko.region import form_regions
from kumiko.region.ssa import Binary, Const, Guard, Let, Read, Reduce, Ref, Select
from kumiko.symbolic import Expr

from .test_cpu_target import EXAMPLES, check, rel


def _attention(causal, d=32, epilogue=None, mask=None):
    q, k, v = (Tensor.input(n, ("B", "H", "S", d)) for n in ("Q", "K", "V"))
    y = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=1.0 / math.sqrt(d), attn_mask=mask)
    if epilogue is not None:
        y = epilogue(y)
    return y.graph("y", name="attn", symbols={"B": 2, "H": 3, "S": 37})


def _steps(exe):
    return exe._run.runner.steps


def test_attention_is_one_kernel_without_its_intermediate():
    g = load(EXAMPLES[[p.stem for p in EXAMPLES].index("attention_causal")])
    exe = check(g, seed=1)
    (step,) = _steps(exe)
    assert len(step.regions) == 2
    prog = exe._run.runner
    assert not prog._planned.buffers            # P is handed over inside the kernel: no arena slot
    src = exe._run.source
    assert "row-block pipeline" in src and "kk_micro_rows_" in src
    # the causal guard on the accumulator becomes a per-micro-tile skip test
    assert "kk_mhi" in src and "kk_nlo" in src


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shapes", [{"B": 1, "H": 1, "S": 1}, {"B": 2, "H": 1, "S": 7}, {"B": 1, "H": 2, "S": 61},
                                    {"B": 1, "H": 1, "S": 300}])
def test_fused_attention_matches_the_evaluator(causal, shapes):
    exe = check(_attention(causal), seed=2, shapes=shapes)
    assert len(_steps(exe)) == 1


@pytest.mark.parametrize("causal", [False, True])
def test_batch_of_one_and_projected_heads_fuse(causal):
    """An exported transformer's attention at batch 1: a leading size-1 axis that is none of batch, M or N, and
    Q/K/V heads of one [1, S, 3 * H * d] projection (the shapes are constants): still one fused step."""
    x = Tensor.input("X", (1, 45, 3 * 3 * 32))
    q, k, v = (x[:, :, i * 96:(i + 1) * 96].reshape(1, 45, 3, 32).permute(0, 2, 1, 3) for i in range(3))
    g = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=0.2).graph("y", name="heads")
    exe = check(g, seed=4)
    assert any(len(st.regions) == 2 for st in _steps(exe)) and "row-block pipeline: " in exe._run.source
    q1, k1, v1 = (Tensor.input(n, (1, 2, 37, 32)) for n in ("Q", "K", "V"))
    exe = check(q1.scaled_dot_product_attention(k1, v1, is_causal=causal).graph("y", name="one"), seed=5)
    assert len(_steps(exe)) == 1


@pytest.mark.parametrize("d", [40, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_each_contraction_keeps_its_own_micro_tile(d, causal):
    """A head of 3-4 vectors gives P x V its own micro-tile (6 x 64 for d = 64 on AVX-512: P read once per
    block); Q x K^T keeps the default. BM is a multiple of both MRs."""
    from kumiko.plan.choose import micro_tile
    from kumiko.runtime.cpu import cpu_features
    vw = int(cpu_features()["vector_width_f32"])
    exe = check(_attention(causal, d=d), seed=4, shapes={"B": 1, "H": 2, "S": 61})
    assert len(_steps(exe)) == 1
    src = exe._run.source
    mr0, nr0 = micro_tile(vw)
    mr1, nr1 = micro_tile(vw, None, d)
    assert f"kk_micro_{mr0}x{nr0}_v{vw}(" in src and f"kk_micro_rows_{mr1}x{nr1}_v{vw}(" in src
    bm = int(src.split("BM=")[1].split(",")[0])
    assert bm % mr0 == 0 and bm % mr1 == 0
    if vw == 16:
        assert (mr1, nr1) == ((6, 64) if d == 64 else (8, 48))


def test_consumer_epilogue_and_wide_head():
    # D = 300 > KC: the producer's K runs in several blocks; N1 = 300 is not a multiple of NR
    g = _attention(True, d=300, epilogue=lambda y: (y * 2.0 + 1.0).relu())
    exe = check(g, seed=3, shapes={"B": 1, "H": 2, "S": 29})
    assert len(_steps(exe)) == 1


def test_softmax_between_two_gemms_fuses():
    a, b, c = Tensor.input("A", ("M", 40)), Tensor.input("Bm", (40, "N")), Tensor.input("C", ("N", 19))
    g = ((a @ b).softmax(-1) @ c).graph("y", name="chain", symbols={"M": 33, "N": 50})
    exe = check(g, seed=4)
    check(g, seed=5, shapes={"M": 1, "N": 1})
    assert len(_steps(exe)) == 1


def test_two_gemms_with_a_pointwise_map_between_stay_two_kernels():
    """No row program (an MLP: GEMM -> GELU -> GEMM, here with constant weights at a batch of one): the plain path
    reads the weights' panels packed once, where the pipeline would pack the second GEMM's on every call."""
    rng = np.random.default_rng(0)
    x = Tensor.input("X", (1, 33, 40))
    w1 = Tensor(rng.standard_normal((40, 96)).astype(np.float32), role="param", name="w1")
    w2 = Tensor(rng.standard_normal((96, 24)).astype(np.float32), role="param", name="w2")
    g = ((x @ w1).gelu() @ w2).graph("y", name="mlp")
    exe = check(g, seed=6, tol=1e-4)
    assert len(_steps(exe)) == 2 and "row-block pipeline: " not in exe._run.source


def test_no_fusion_when_the_intermediate_is_an_output():
    g = load(EXAMPLES[[p.stem for p in EXAMPLES].index("attention_row_softmax")])
    exe = check(g, seed=6)
    assert all(len(s.regions) == 1 for s in _steps(exe))


def test_nonfinite_values_are_not_skipped_away():
    """0 * inf is NaN: a key block whose P is zero is skipped only when V is finite there."""
    g = _attention(True)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(7, {"B": 1, "H": 1, "S": 40})
    ins["V"][0, 0, 39, 3] = np.inf                      # row 39's key: masked for every earlier query row
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.isnan(want).any()
    ok = ~np.isnan(want) & np.isfinite(want)
    assert rel(out[ok], want[ok]) < 1e-5


def test_random_inputs_other_seeds_and_symbolic_sizes():
    g = _attention(True)
    exe = kumiko.compile(g, "cpu")
    ref = kumiko.compile(g, "eval")
    for seed, s in [(8, 5), (9, 48), (10, 49)]:
        ins = exe.random_inputs(seed, {"B": 1, "H": 1, "S": s})
        assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


# acc_guards ------------------------------------------------------------------------------------------
G = Guard(((Expr.sym("i") - Expr.sym("j"), "ge"),))


def test_acc_guards_follows_pointwise_lets_into_a_guarded_select():
    lets = (Let("acc", Const(0.0)), Let("s", Binary("mul", Ref("acc"), Const(2.0))),
            Let("m", Select(G, Ref("s"), Const(-math.inf))))
    assert acc_guards(lets, "acc") == (G,)


def test_acc_guards_none_when_a_use_escapes():
    red = Reduce("max", (), -math.inf, None, Ref("acc"))
    assert acc_guards((Let("acc", Const(0.0)), Let("m", Select(G, Ref("acc"), Const(0.0))),
                       Let("x", Binary("add", Ref("acc"), Const(1.0)))), "acc", ("x",)) is None
    assert acc_guards((Let("acc", Const(0.0)), Let("r", red)), "acc") is None
    assert acc_guards((Let("acc", Const(0.0)), Let("m", Select(G, Const(1.0), Ref("acc")))), "acc") is None


def test_acc_guards_none_without_a_guard():
    lets = (Let("acc", Const(0.0)), Let("r", Read("X", (Expr.sym("i"),))))
    assert acc_guards(lets, "acc") is None


def test_region_structure_of_the_fused_pair():
    prog = form_regions(to_tiny(_attention(True)))
    assert [o.materialize for o in prog.regions[0].outputs] == ["deferred"]


def test_buffers_of_a_fused_pair_are_live_together():
    """The arena plans lifetimes by call: the producer's inputs and the consumer's output are live in
    the same kernel, so they must not share memory even though different regions touch them."""
    x = Tensor.input("X", ("S", 16))
    wq, wk, wv, wo = (Tensor.input(n, (16, 16)) for n in ("Wq", "Wk", "Wv", "Wo"))
    q, k, v = ((x @ w).reshape(("S", 2, 8)).permute(1, 0, 2) for w in (wq, wk, wv))
    o = q.scaled_dot_product_attention(k, v, is_causal=True).permute(1, 0, 2).reshape(("S", 16))
    g = (o @ wo).graph("y", name="block", symbols={"S": 21})
    exe = check(g, seed=11)
    fused = [s for s in _steps(exe) if len(s.regions) == 2]
    assert fused
    runner = exe._run.runner
    plan, _ = runner.arena({"S": 21})
    slots = {s.name: s for s in plan.slots}
    for a in fused[0].buffers:
        for b in fused[0].buffers:
            if a != b and a in slots and b in slots:
                assert not slots[a].overlaps(slots[b]), (a, b)
