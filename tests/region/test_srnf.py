"""Each SRNF rule and each region diagnostic, with a test that fails if the rule is removed."""
import numpy as np
import pytest

from kumiko import Tensor, dtypes
from kumiko.diagnostics import KumikoError
from kumiko.region import form_regions, play_region, srnf
from kumiko.region.ssa import (
    Axis,
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Guard,
    Let,
    MemRef,
    Output,
    Read,
    Reduce,
    Ref,
    Region,
    Select,
    Unary,
    Yield,
    typecheck,
)
from kumiko.region.verify import verify
from kumiko.symbolic import Expr

F32 = dtypes.fp32
I0, I1, R0, R1 = (Expr.sym(n) for n in ("i0", "i1", "r0", "r1"))


def region(lets, inputs=(("X", (4, 5)),), out_shape=(4,), iters=(("i0", 4),), cast=None, out_dt=F32):
    return Region("t", tuple(Axis(n, s) for n, s in iters), tuple((n, MemRef(s, F32)) for n, s in inputs),
                  (Output("Y", MemRef(out_shape, out_dt)),), tuple(Let(n, e) for n, e in lets),
                  (Yield(lets[-1][0], "Y", cast),))


def run(r, **bufs):
    return play_region(r, bufs, {})["Y"]


X = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)


def test_r0_merges_nested_reduces_of_the_same_op():
    inner = Reduce("sum", (Axis("r1", 5),), 0.0, F32, Read("X", (I0, R1)))
    outer = Reduce("sum", (Axis("r0", 1),), 0.0, F32, inner)
    r = region([("y", outer)])
    merged = srnf.merge_nested(r).lets[0].expr
    assert isinstance(merged, Reduce) and [a.name for a in merged.axes] == ["r0", "r1"]
    assert not isinstance(merged.body, Reduce)
    np.testing.assert_allclose(run(srnf.merge_nested(r), X=X), run(r, X=X), rtol=1e-6)


def test_r0_applies_in_formation():
    x, w = Tensor.input("x", (3, 4)), Tensor.input("w", (4, 5))
    p = form_regions((x @ w).sum(axis=1).graph("y").tiny)
    red = [let.expr for let in p.regions[0].lets if isinstance(let.expr, Reduce)]
    assert len(red) == 1 and len(red[0].axes) == 2 and not isinstance(red[0].body, Reduce)


def test_r4_never_merges_different_ops():
    inner = Reduce("sum", (Axis("r1", 5),), 0.0, F32, Read("X", (I0, R1)))
    outer = Reduce("max", (Axis("r0", 1),), float("-inf"), F32, inner)
    r = region([("y", outer)])
    assert isinstance(srnf.merge_nested(r).lets[0].expr.body, Reduce)
    with pytest.raises(KumikoError) as e:
        srnf.merge_reduces(outer, inner)
    assert e.value.code == "E1402" and e.value.kind == "NonAssociativeTransform"


def test_r1_hoists_an_invariant_factor():
    scale = Read("S", (I0,))
    body = Binary("mul", scale, Read("X", (I0, R0)))
    r = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32, body))], inputs=(("X", (4, 5)), ("S", (4,))))
    h = srnf.hoist_invariant(r).lets[0].expr
    assert isinstance(h, Binary) and h.fn == "mul" and h.x == scale and isinstance(h.y, Reduce)
    s = np.arange(4, dtype=np.float32) + 1
    np.testing.assert_allclose(run(srnf.hoist_invariant(r), X=X, S=s), run(r, X=X, S=s), rtol=1e-6)


def test_r1_keeps_factors_that_depend_on_the_reduced_axis():
    body = Binary("mul", Read("X", (I0, R0)), Read("X", (I0, R0)))
    r = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32, body))])
    assert isinstance(srnf.hoist_invariant(r).lets[0].expr, Reduce)


def test_r2_distributes_only_when_asked():
    body = Binary("add", Read("X", (I0, R0)), Unary("exp2", Read("X", (I0, R0))))
    r = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32, body))])
    assert isinstance(srnf.normalize(r).lets[0].expr, Reduce)
    d = srnf.normalize(r, distribute_sums=True).lets[0].expr
    assert isinstance(d, Binary) and isinstance(d.x, Reduce) and isinstance(d.y, Reduce)
    np.testing.assert_allclose(run(srnf.distribute(r), X=X), run(r, X=X), rtol=1e-5)


def test_r3_gives_the_accumulator_its_own_let_and_names_the_epilogue():
    acc = Reduce("sum", (Axis("r0", 5),), 0.0, F32, Read("X", (I0, R0)))
    r = region([("y", Unary("relu", Binary("add", acc, Const(1.0))))])
    n = srnf.hoist_accumulators(r)
    assert [type(x.expr).__name__ for x in n.lets] == ["Reduce", "Unary"]
    assert srnf.epilogue(n) == ["add", "relu"]
    np.testing.assert_allclose(run(n, X=X), run(r, X=X), rtol=1e-6)


def test_guard_fold_turns_a_mask_into_an_index_predicate():
    mask = Select(Guard(((I0 - I1, "ge"),)), Const(True, dtypes.bool_), Const(False, dtypes.bool_))
    r = region([("m", mask), ("y", Select(Ref("m"), Read("X", (I0, I1)), Const(float("-inf"))))],
               out_shape=(4, 5), iters=(("i0", 4), ("i1", 5)))
    f = srnf.fold_guard_pred(r)
    assert len(f.lets) == 1 and isinstance(f.lets[0].expr.pred, Guard)
    np.testing.assert_array_equal(run(f, X=X), run(r, X=X))


def test_causal_attention_mask_is_an_index_guard_after_formation():
    q = Tensor.input("q", (1, 2, 8, 4))
    o = q.scaled_dot_product_attention(Tensor.input("k", (1, 2, 8, 4)), Tensor.input("v", (1, 2, 8, 4)),
                                       is_causal=True)
    p = form_regions(o.graph("o").tiny)
    sel = [x.expr for x in p.regions[0].lets if isinstance(x.expr, Select)]
    assert sel and isinstance(sel[0].pred, Guard)


def test_binary_typecheck_inserts_broadcast_and_ccon1_holds():
    acc = Reduce("sum", (Axis("r0", 5),), 0.0, F32, Binary("mul", Read("X", (I0, R0)), Read("B", (R0, I1))))
    r = region([("acc", acc), ("y", Binary("add", Ref("acc"), Read("b", (I1,))))],
               inputs=(("X", (4, 5)), ("B", (5, 3)), ("b", (3,))), out_shape=(4, 3), iters=(("i0", 4), ("i1", 3)))
    t, types = typecheck(r)
    assert isinstance(t.lets[1].expr.y, BroadcastInDim) and types["y"].axes == ("i0", "i1")
    assert not isinstance(t.lets[0].expr.body.x, BroadcastInDim)   # C-CON1: reads stay direct
    bad = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32,
                               Binary("mul", BroadcastInDim(Read("X", (I0, R0)), ("i0", "r0")), Const(2.0))))])
    with pytest.raises(KumikoError):
        srnf.check_ccon1(bad)


def test_diag_broadcast_mismatch_and_dtype():
    r = region([("y", Binary("add", Read("X", (I0, Expr.lift(0))), Cast(Read("X", (I0, Expr.lift(0))),
                                                                         dtypes.fp16)))])
    with pytest.raises(KumikoError) as e:
        typecheck(r)
    assert e.value.code == "E1005"


def test_diag_acc_dtype_missing():
    r = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, None, Read("X", (I0, R0))))])
    with pytest.raises(KumikoError) as e:
        typecheck(r)
    assert e.value.code == "E1004" and e.value.kind == "AccDtypeMissing"


def test_diag_neutral_invalid():
    r = region([("y", Reduce("max", (Axis("r0", 5),), 0.0, F32, Read("X", (I0, R0))))])
    with pytest.raises(KumikoError) as e:
        verify(r)
    assert e.value.code == "E1403" and e.value.kind == "NeutralInvalid"


def test_diag_unguarded_access_static_and_at_playback():
    shifted = Read("X", (I0, R0 + 1))         # reads column 5 of a 5-column X
    r = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32, shifted))])
    with pytest.raises(KumikoError) as e:
        verify(r)
    assert e.value.code == "E1401" and e.value.kind == "UnguardedAccess"
    with pytest.raises(KumikoError) as e2:
        run(r, X=X)
    assert e2.value.code == "E1401"
    guarded = Select(Guard(((Expr.lift(3) - R0, "ge"),)), shifted, Const(0.0))
    ok = region([("y", Reduce("sum", (Axis("r0", 5),), 0.0, F32, guarded))])
    verify(ok)
    np.testing.assert_allclose(run(ok, X=X), X[:, 1:].sum(axis=1), rtol=1e-6)


def test_diag_symbolic_guard_is_checked_by_isl():
    m = Expr.sym("M")
    inside = Read("X", (I0, Expr.lift(m) - 1 - R0))
    r = Region("t", (Axis("i0", 4),), (("X", MemRef((4, m), F32)),), (Output("Y", MemRef((4,), F32)),),
               (Let("y", Reduce("sum", (Axis("r0", m),), 0.0, F32, inside)),), (Yield("y", "Y"),))
    verify(r)                                  # M-1-r0 stays in [0, M) for every M >= 1
    bad = Region("t", r.iters, r.inputs, r.outputs,
                 (Let("y", Reduce("sum", (Axis("r0", m),), 0.0, F32, Read("X", (I0, Expr.lift(m) - R0)))),),
                 r.yields)
    with pytest.raises(KumikoError):
        verify(bad)
