"""Masked-column elision (kumiko.kernel.elide) and its use by the row-block pipeline: which row programs
may skip a block's fully masked columns, the bound on those columns, and that the fused kernel still
matches the evaluator when the elision's run-time assumptions fail (the block is then recomputed)."""
import math

import numpy as np
import pytest

import kumiko
from kumiko import dtypes
from kumiko.kernel.cexpr import index
from kumiko.kernel.elide import masked_elision, prefix_bound
from kumiko.region.ssa import Axis, Binary, BroadcastInDim, Const, Guard, Let, Read, Reduce, Ref, Select, Unary, VType
from kumiko.symbolic import Expr

from .test_cpu_target import rel
from .test_stream import _attention

F32 = dtypes.fp32
CAUSAL = Guard(((Expr.sym("i") - Expr.sym("j"), "ge"),))
ROW, COL = ("i", "j"), ("i",)


def _types(**axes):
    return {k: VType(F32, v) for k, v in axes.items()}


def _softmax_lets(other=-math.inf, red="max"):
    """acc -> select(causal, acc * c, other) -> row max -> exp2(x - max) -> row sum -> divide."""
    j = (Axis("j", "S"),)
    lets = (Let("acc", Const(0.0)),
            Let("s", Select(CAUSAL, Binary("mul", Ref("acc"), Const(0.125)), Const(other))),
            Let("mx", Reduce(red, j, -math.inf if red == "max" else 0.0, F32, Ref("s"))),
            Let("e", Unary("exp2", Binary("sub", Ref("s"), BroadcastInDim(Ref("mx"), ROW)))),
            Let("z", Reduce("sum", j, 0.0, F32, Ref("e"))),
            Let("p", Binary("div", Ref("e"), BroadcastInDim(Ref("z"), ROW))))
    return lets, _types(acc=ROW, s=ROW, mx=COL, e=ROW, z=COL, p=ROW)


def test_softmax_row_program_elides_with_row_checks():
    lets, types = _softmax_lets()
    el = masked_elision(lets, "acc", "j", (CAUSAL,), "p", types)
    assert el is not None
    assert el.finite == {"mx", "z"} and el.nonzero == {"z"}


def test_no_elision_when_the_masked_value_is_not_the_identity():
    lets, types = _softmax_lets(other=0.0)        # max sees 0 on a masked column: it could win
    assert masked_elision(lets, "acc", "j", (CAUSAL,), "p", types) is None
    lets, types = _softmax_lets(red="sum")        # a sum of -inf is not a sum of nothing
    assert masked_elision(lets, "acc", "j", (CAUSAL,), "p", types) is None


def test_nested_reductions_are_checked_too():
    """A reduction over N inside a let (not a let of its own) also runs over the prefix only."""
    lets, types = _softmax_lets()
    j = (Axis("j", "S"),)
    inv = Let("inv", Binary("div", Const(1.0), Reduce("sum", j, 0.0, F32, Ref("e"))))     # 1 / sum_j e
    good = lets[:4] + (inv, Let("p", Binary("mul", Ref("e"), BroadcastInDim(Ref("inv"), ROW))))
    types = dict(types, inv=VType(F32, COL))
    el = masked_elision(good, "acc", "j", (CAUSAL,), "p", types)
    assert el is not None and "inv" in el.finite
    # the nested sum sees 1 on an elided column (exp2(0)): dropping it would change the kept columns, even
    # though the output itself is 0 there
    masked_p = Let("p", Select(CAUSAL, Binary("mul", Ref("e"), BroadcastInDim(Ref("inv"), ROW)), Const(0.0)))
    bad = lets[:3] + (Let("e", Unary("exp2", Const(0.0))), inv, masked_p)
    assert masked_elision(bad, "acc", "j", (CAUSAL,), "p", types) is None


def test_no_elision_when_the_output_is_not_zero_there():
    lets, types = _softmax_lets()
    lets = lets[:-1] + (Let("p", Binary("add", Ref("e"), Const(1.0))),)
    assert masked_elision(lets, "acc", "j", (CAUSAL,), "p", types) is None


def test_no_elision_without_a_guard_or_with_an_unknown_read():
    lets, types = _softmax_lets()
    assert masked_elision(lets, "acc", "j", (), "p", types) is None
    other = Guard(((Expr.sym("j") - 3, "ge"),))   # a guard that is not the pipeline's: both branches differ
    lets2 = (lets[0], Let("s", Select(other, Ref("acc"), Const(-math.inf)))) + lets[2:]
    assert masked_elision(lets2, "acc", "j", (CAUSAL,), "p", types) is None
    lets3 = (lets[0], Let("s", Read("X", (Expr.sym("i"), Expr.sym("j"))))) + lets[2:]
    assert masked_elision(lets3, "acc", "j", (CAUSAL,), "p", types) is None


def _c(e):
    return index(e, {"kk_mhi"})


def test_prefix_bound_of_guards():
    i, j = Expr.sym("i"), Expr.sym("j")
    assert prefix_bound((CAUSAL,), "i", "j", "kk_mhi", {"i", "j"}, _c) == "kk_mhi + 1"
    # 2j <= i + 4  ->  j <= floor((i + 4) / 2)
    g = Guard(((i - j * 2 + 4, "ge"),))
    assert prefix_bound((g,), "i", "j", "kk_mhi", {"i", "j"}, _c) == "kk_fdiv((kk_mhi + 4LL), 2LL) + 1"
    # two guards: the union of their prefixes; j <= S - 1 - i (a < 0) and j >= i (lower bound): no bound
    assert "?" in prefix_bound((CAUSAL, g), "i", "j", "kk_mhi", {"i", "j"}, _c)
    assert prefix_bound((Guard(((Expr.sym("S") - 1 - i - j, "ge"),)),), "i", "j", "kk_mhi", {"i", "j"}, _c) is None
    assert prefix_bound((Guard(((j - i, "ge"),)),), "i", "j", "kk_mhi", {"i", "j"}, _c) is None
    # a bound that depends on another axis of the region (a batch axis) is not used
    assert prefix_bound((Guard(((i - j + Expr.sym("b"), "ge"),)),), "i", "j", "kk_mhi", {"i", "j", "b"}, _c) is None


def test_causal_attention_kernel_elides_masked_columns():
    exe = kumiko.compile(_attention(True), "cpu")
    src = exe._run.source
    assert "s_kk_nh = kk_mhi + 1" in src and "kk_rowok &=" in src
    assert "i3 < s_kk_nh - (KUMIKO_VW - 1)" in src          # the row program's vector loops stop there
    assert "kk_rowok" not in kumiko.compile(_attention(False), "cpu")._run.source


@pytest.mark.parametrize("s", [1, 16, 49, 131])
def test_elided_causal_attention_matches_the_evaluator(s):
    g = _attention(True)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(11 + s, {"B": 1, "H": 2, "S": s})
    assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_row_check_failure_recomputes_the_block(bad):
    """A non-finite score makes a row's max non-finite: the elision's assumption fails, the block runs
    over every column, and the output matches the evaluator's (NaN where it has NaN)."""
    g = _attention(True)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(5, {"B": 1, "H": 1, "S": 70})
    ins["Q"][0, 0, 3, :] = bad
    ins["K"][0, 0, 1, :] = 1.0
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert np.array_equal(np.isnan(out), np.isnan(want))
    ok = np.isfinite(want)
    assert ok.any() and rel(out[ok], want[ok]) < 1e-5


def test_nonfinite_values_keep_every_column():
    """With an inf in V, 0 * inf is NaN: the masked columns are not elided (nor skipped)."""
    g = _attention(True)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(6, {"B": 1, "H": 1, "S": 60})
    ins["V"][0, 0, 59, 0] = np.inf
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.isnan(want).any()
    ok = np.isfinite(want)
    assert rel(out[ok], want[ok]) < 1e-5
