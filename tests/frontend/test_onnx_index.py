"""The ONNX indexing and shape ops of kumiko/frontend/onnx_index.py (Split, Trilu, GatherElements,
GatherND, ScatterND/ScatterElements, ArgMax/ArgMin, Einsum, TopK, Tile) and int64/float64 at the call:
each model is built with onnx.helper, imported, compiled for the evaluator and the CPU, and compared
with onnxruntime on fresh random inputs (integers exactly, fp32 to a relative L2 of 1e-4). Refused
cases must be diagnostics naming the node and what is missing.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2
from tests.frontend.test_onnx_import import RNG, model, onnxruntime_run

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

TARGETS = ["eval", "cpu"]
F, I64 = TP.FLOAT, TP.INT64


def const(name, arr):
    return nh.from_array(np.asarray(arr), name)


def check(m, feeds, target, **kw):
    """Import m, run it on ``target`` and compare every output with onnxruntime's."""
    want = onnxruntime_run(m, feeds)
    g = kumiko.from_onnx(m, **kw)
    got = kumiko.compile(g, target)(**{k: v for k, v in feeds.items() if k in {i.tensor for i in g.inputs}})
    for o, w in zip(m.graph.output, want):
        y = got[o.name]
        assert y.shape == w.shape, f"{o.name}: {y.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(y, w, err_msg=o.name)
        else:
            assert rel_l2(y.astype(np.float64), w.astype(np.float64)) <= 1e-4, o.name
    return g


def refused(m, code="E1010"):
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == code, e.value.render()
    return e.value


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# Split


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("opset,how,outs", [
    (13, "input", [2, 3, 1]),
    (13, "equal", [2, 2, 2]),
    (18, "num_outputs", [3, 3, 1]),        # uneven: the last chunk is smaller
    (11, "attr", [4, 2]),                  # opset 11's split attribute (converted to 13)
], ids=["input", "equal", "num-outputs-uneven", "opset11-attr"])
def test_split(target, opset, how, outs):
    n = sum(outs)
    names = [f"y{k}" for k in range(len(outs))]
    inits, ins, attrs = [], ["x"], {"axis": 1}
    if how == "input":
        inits, ins = [const("sp", np.array(outs, np.int64))], ["x", "sp"]
    elif how == "num_outputs":
        attrs["num_outputs"] = len(outs)
    elif how == "attr":
        attrs["split"] = outs
    m = model([h.make_node("Split", ins, names, **attrs)], [("x", F, [2, n, 3])],
              [(y, F, [2, k, 3]) for y, k in zip(names, outs)], inits, opset=opset)
    check(m, {"x": randn(2, n, 3)}, target)


def test_split_that_does_not_add_up():
    m = model([h.make_node("Split", ["x", "sp"], ["a", "b"], name="sp")], [("x", F, [5])],
              [("a", F, [2]), ("b", F, [2])], [const("sp", np.array([2, 2], np.int64))], opset=13)
    e = refused(m, "E1011")
    assert "'sp' (Split)" in e.at and "[2, 2]" in e.why


# ------------------------------------------------------------------------------------------------
# Trilu


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, 2), (0, -1), (1, -7)])
def test_trilu(target, upper, k):
    inits = [const("k", np.array(k, np.int64))]
    m = model([h.make_node("Trilu", ["x", "k"], ["y"], upper=upper)], [("x", F, [2, 5, 6])], [("y", F, [2, 5, 6])],
              inits, opset=14)
    g = check(m, {"x": randn(2, 5, 6)}, target)
    assert "Elementwise" in {n.op for n in g.nodes}


@pytest.mark.parametrize("target", TARGETS)
def test_trilu_int_without_k_and_symbolic_rows(target):
    m = model([h.make_node("Trilu", ["x"], ["y"], upper=0)], [("x", TP.INT32, ["S", 4])], [("y", TP.INT32, ["S", 4])],
              opset=14)
    for s in (3, 6):
        check(m, {"x": RNG.integers(-9, 9, (s, 4)).astype(np.int32)}, target)


def test_trilu_of_a_constant_folds():
    """The exporters' causal mask: Trilu over ConstantOfShape is a constant, not a run-time op."""
    nodes = [h.make_node("ConstantOfShape", ["shape"], ["ones"], value=nh.from_array(np.array([1.0], np.float32))),
             h.make_node("Trilu", ["ones"], ["mask"], upper=0), h.make_node("Mul", ["x", "mask"], ["y"])]
    m = model(nodes, [("x", F, [4, 4])], [("y", F, [4, 4])], [const("shape", np.array([4, 4], np.int64))], opset=14)
    g = check(m, {"x": randn(4, 4)}, "eval")
    assert [n.op for n in g.nodes] == ["Elementwise"]


# ------------------------------------------------------------------------------------------------
# GatherElements, GatherND


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(target, axis):
    """Indices smaller than data on the other axes, negative indices among them."""
    shape, ishape = [4, 5, 3], [3, 5, 2]
    a = axis % 3
    ishape[a] = 6
    m = model([h.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)], [("x", F, shape), ("i", I64, ishape)],
              [("y", F, ishape)])
    idx = RNG.integers(-shape[a], shape[a], ishape).astype(np.int64)
    check(m, {"x": randn(*shape), "i": idx}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("batch_dims,dshape,ishape", [
    (0, [4, 5, 3], [2, 3, 2]),      # slices of rank 1
    (0, [4, 5], [6, 2]),            # single elements
    (0, [4, 5, 3], [3]),            # one index tuple
    (1, [2, 4, 3], [2, 5, 1]),
    (2, [2, 3, 4, 5], [2, 3, 2, 1]),
])
def test_gather_nd(target, batch_dims, dshape, ishape):
    k = ishape[-1]
    out = ishape[:-1] + dshape[batch_dims + k:]
    m = model([h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
              [("x", F, dshape), ("i", I64, ishape)], [("y", F, out)])
    hi = np.array(dshape[batch_dims:batch_dims + k])
    idx = RNG.integers(-hi, hi, ishape).astype(np.int64)
    check(m, {"x": randn(*dshape), "i": idx}, target)


# ------------------------------------------------------------------------------------------------
# ScatterND, ScatterElements


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", [None, "add", "mul", "max", "min"])
def test_scatter_nd(target, reduction):
    idx = np.array([[[0, 2], [3, 1]], [[0, 2], [-1, 0]]], np.int64)     # (0, 2) twice: reductions accumulate
    attrs = {} if reduction is None else {"reduction": reduction}
    if reduction is None:
        idx[1, 0] = [1, 1]              # duplicates are undefined without a reduction
    m = model([h.make_node("ScatterND", ["x", "i", "u"], ["y"], **attrs)], [("x", F, [4, 3, 5]), ("u", F, [2, 2, 5])],
              [("y", F, [4, 3, 5])], [const("i", idx)], opset=18)
    check(m, {"x": randn(4, 3, 5), "u": randn(2, 2, 5)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("axis,reduction", [(0, None), (1, "add"), (-1, "max")])
def test_scatter_elements(target, axis, reduction):
    idx = np.array([[1, 0, 2], [0, 2, -1]], np.int64)
    attrs = {"axis": axis} if reduction is None else {"axis": axis, "reduction": reduction}
    m = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], **attrs)],
              [("x", F, [3, 4]), ("u", F, [2, 3])], [("y", F, [3, 4])], [const("i", idx)], opset=18)
    check(m, {"x": randn(3, 4), "u": randn(2, 3)}, target)


def test_scatter_with_runtime_indices_is_refused():
    m = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="sc")],
              [("x", F, [3, 4]), ("i", I64, [2, 3]), ("u", F, [2, 3])], [("y", F, [3, 4])])
    e = refused(m)
    assert "'sc' (ScatterElements)" in e.at and "run-time indices" in e.why


# ------------------------------------------------------------------------------------------------
# ArgMax, ArgMin, TopK


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 0), (1, 1, 1), (-1, 0, 1)])
def test_argmax(target, op, axis, keepdims, last):
    shape = [3, 5, 4]
    out = list(shape)
    if keepdims:
        out[axis] = 1
    else:
        del out[axis]
    m = model([h.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
              [("x", F, shape)], [("y", I64, out)])
    x = RNG.integers(0, 3, shape).astype(np.float32)     # ties, so first and last index differ
    check(m, {"x": x}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_one(target, largest):
    m = model([h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)], [("x", F, [3, 5])],
              [("v", F, [3, 1]), ("i", I64, [3, 1])], [const("k", np.array([1], np.int64))])
    check(m, {"x": RNG.integers(0, 3, (3, 5)).astype(np.float32)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,axis,k,largest,dtype", [
    ([3, 7], 1, 3, 1, np.float32), ([3, 7], 1, 4, 0, np.float32), ([4, 5, 6], 0, 4, 1, np.float32),
    ([2, 9], -1, 9, 1, np.int32), ([2, 6, 3], 1, 2, 0, np.int32)],
    ids=["largest", "smallest", "axis0-all-but-none", "k-is-the-axis", "int-smallest"])
def test_topk_above_one(target, shape, axis, k, largest, dtype):
    """Few distinct values, so ties are many: onnxruntime orders them by the lower index, and so must kumiko."""
    out = list(shape)
    out[axis] = k
    et = F if dtype == np.float32 else TP.INT32
    m = model([h.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], [("x", et, shape)],
              [("v", et, out), ("i", I64, out)], [const("k", np.array([k], np.int64))])
    x = RNG.integers(-3, 3, shape).astype(dtype)
    if dtype == np.float32:
        x[..., 0] = -np.inf                  # an infinity is a value like the others
    check(m, {"x": x}, target)


def test_topk_values_only_and_unsorted():
    """sorted=0 leaves the order to the implementation (kumiko's is sorted); the set of values is ONNX's."""
    m = model([h.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0)], [("x", F, [2, 8])],
              [("v", F, [2, 3]), ("i", I64, [2, 3])], [const("k", np.array([3], np.int64))])
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    got = kumiko.compile(kumiko.from_onnx(m))(x=x)
    np.testing.assert_array_equal(got["v"], -np.sort(-x, axis=1)[:, :3])
    np.testing.assert_array_equal(np.take_along_axis(x, got["i"].astype(np.int64), 1), got["v"])


@pytest.mark.parametrize("k,size,code,what", [(33, 40, "E1010", "K=33"), (6, 5, "E1011", "exceeds"),
                                              (0, 5, "E1010", "K >= 1")], ids=["above-limit", "above-axis", "zero"])
def test_topk_refusals(k, size, code, what):
    from kumiko.frontend.onnx_index import TOPK_MAX_K
    m = model([h.make_node("TopK", ["x", "k"], ["v", "i"], name="tk")], [("x", F, [3, size])],
              [("v", F, [3, k]), ("i", I64, [3, k])], [const("k", np.array([k], np.int64))])
    e = refused(m, code)
    assert "'tk' (TopK)" in e.at and what in e.why
    if k > TOPK_MAX_K:
        assert f"K <= {TOPK_MAX_K}" in e.suggestion


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reps", [[2, 1, 3], [1, 1, 1], [3, 2, 1]])
def test_tile(target, reps):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    m = model([h.make_node("Tile", ["x", "r"], ["y"])], [("x", F, [2, 3, 4])],
              [("y", F, [2 * reps[0], 3 * reps[1], 4 * reps[2]])], [const("r", np.array(reps, np.int64))])
    check(m, {"x": x}, target)


# ------------------------------------------------------------------------------------------------
# Einsum


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("eq,shapes", [
    ("bhid,bhjd->bhij", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhij,bhjd->bhid", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("ij,jk->ik", [(4, 6), (6, 3)]),
    ("bij->bji", [(2, 3, 4)]),
    ("ij->i", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("ij,kj", [(3, 4), (5, 4)]),            # implicit output: ik
    ("bi,bj->bij", [(2, 3), (2, 4)]),       # outer product per batch
    ("abc,cd,de->aeb", [(2, 3, 4), (4, 5), (5, 6)]),
    ("ijk,ik->j", [(3, 4, 5), (3, 5)]),     # contracted letters in front
])
def test_einsum(target, eq, shapes):
    names = [f"x{k}" for k in range(len(shapes))]
    want = np.einsum(eq, *[np.zeros(s) for s in shapes]).shape
    m = model([h.make_node("Einsum", names, ["y"], equation=eq)], [(n, F, list(s)) for n, s in zip(names, shapes)],
              [("y", F, list(want))], opset=12 + 1)
    check(m, {n: randn(*s) for n, s in zip(names, shapes)}, target)


@pytest.mark.parametrize("eq,what", [("...ii->...i", "ellipsis"), ("ii->i", "repeats a letter")])
def test_einsum_refused(eq, what):
    m = model([h.make_node("Einsum", ["x"], ["y"], equation=eq, name="es")], [("x", F, [3, 3])], [("y", F, [3])])
    e = refused(m)
    assert "'es' (Einsum)" in e.at and what in e.why


# ------------------------------------------------------------------------------------------------
# Range from a Shape; int64 and float64 at the call


def gpt2_embedding(seq):
    """token ids -> wte gather + position embeddings from Range(0, Shape(ids)[1]), as GPT-2 exports do."""
    wte, wpe = RNG.standard_normal((50, 8)).astype(np.float32), RNG.standard_normal((16, 8)).astype(np.float32)
    nodes = [
        h.make_node("Gather", ["wte", "ids"], ["tok"]),
        h.make_node("Shape", ["ids"], ["s"], name="shape"),
        h.make_node("Gather", ["s", "one"], ["n"], axis=0),
        h.make_node("Range", ["zero", "n", "one"], ["pos"]),
        h.make_node("Gather", ["wpe", "pos"], ["pe"]),
        h.make_node("Add", ["tok", "pe"], ["y"]),
    ]
    inits = [const("wte", wte), const("wpe", wpe), const("zero", np.array(0, np.int64)),
             const("one", np.array(1, np.int64))]
    return model(nodes, [("ids", I64, [2, seq])], [("y", F, [2, seq, 8])], inits)


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_with_int64_token_ids(target):
    m = gpt2_embedding(6)
    g = check(m, {"ids": RNG.integers(0, 50, (2, 6)).astype(np.int64)}, target)
    assert "Range" not in str([n.op for n in g.nodes]) and g.tensors["ids"].dtype is kumiko.dtypes.i32


def test_int64_ids_outside_i32_are_refused_at_the_call():
    exe = kumiko.compile(kumiko.from_onnx(gpt2_embedding(6)))
    ids = np.zeros((2, 6), np.int64)
    ids[0, 0] = 2**33
    with pytest.raises(kumiko.KumikoError) as e:
        exe(ids=ids)
    assert e.value.code == "E1015" and "ids" in e.value.at and "i32" in e.value.why


@pytest.mark.parametrize("target", TARGETS)
def test_range_over_a_symbolic_shape_runs_at_any_length(target):
    """Range(0, Shape(ids)[1]) with a dim_param length is an iota of symbolic length: one executable for
    every sequence length (more in test_onnx_dynamic.py)."""
    m = gpt2_embedding("S")
    exe = kumiko.compile(kumiko.from_onnx(m), target)
    for seq in (3, 7):
        ids = RNG.integers(0, 50, (2, seq)).astype(np.int64)
        np.testing.assert_allclose(exe(ids=ids)["y"], onnxruntime_run(m, {"ids": ids})[0], rtol=1e-6, atol=1e-6)


def _double_matmul():
    w = const("w", RNG.standard_normal((4, 3)))            # float64 initializer
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Cast", ["y"], ["z"], to=TP.DOUBLE)]
    return model(nodes, [("x", TP.DOUBLE, [2, 4])], [("y", TP.DOUBLE, [2, 3]), ("z", TP.DOUBLE, [2, 3])], [w])


@pytest.mark.parametrize("target", TARGETS)
def test_float64_inputs_and_initializers_stay_float64(target):
    m = _double_matmul()
    g = kumiko.from_onnx(m)
    assert g.tensors["x"].dtype is kumiko.dtypes.fp64 and g.params["w"].dtype == np.float64 and not g.fp64_inputs
    x = 1e200 * RNG.standard_normal((2, 4))                  # beyond fp32: float64 all the way
    got, want = kumiko.compile(g, target)(x=x), onnxruntime_run(m, {"x": x})
    for k, v in enumerate(want):
        assert got["yz"[k]].dtype == np.float64 and rel_l2(got["yz"[k]], v) <= 1e-12


@pytest.mark.parametrize("target", TARGETS)
def test_a_double_model_matches_onnxruntime(target):
    # softmax over rows past 4096, a row sum of exps and a scaled difference, all DOUBLE
    nodes = [h.make_node("Softmax", ["x"], ["s"], axis=1), h.make_node("Exp", ["x"], ["e"]),
             h.make_node("ReduceSum", ["e", "ax"], ["r"], keepdims=1), h.make_node("Sub", ["x", "r"], ["d"]),
             h.make_node("Mul", ["d", "k"], ["y"])]
    m = model(nodes, [("x", TP.DOUBLE, [3, 4099])], [("s", TP.DOUBLE, [3, 4099]), ("y", TP.DOUBLE, [3, 4099])],
              [const("ax", np.array([1], np.int64)), const("k", np.array([0.37]))])
    x = RNG.standard_normal((3, 4099)) * 4
    got, want = kumiko.compile(kumiko.from_onnx(m), target)(x=x), onnxruntime_run(m, {"x": x})
    for name, w in zip("sy", want):
        assert got[name].dtype == np.float64 and rel_l2(got[name], w) <= 1e-12, name


@pytest.mark.parametrize("target", TARGETS)
def test_float64_inputs_and_initializers_are_narrowed_on_request(target):
    m = _double_matmul()
    x = RNG.standard_normal((2, 4))
    g = kumiko.from_onnx(m, narrow_double=True)
    assert g.tensors["x"].dtype is kumiko.dtypes.fp32 and g.params["w"].dtype == np.float32
    assert g.fp64_inputs == {"x"}
    exe = kumiko.compile(g, target)
    got = exe(x=x)
    want = onnxruntime_run(m, {"x": x})
    assert got["y"].dtype == np.float32 and rel_l2(got["z"], want[1]) <= 1e-4
    with pytest.raises(kumiko.KumikoError) as e:     # a finite float64 that fp32 cannot hold
        exe(x=np.full((2, 4), 1e300))
    assert e.value.code == "E1015"


def test_float64_constant_beyond_fp32_is_refused_when_narrowed():
    big = const("big", np.array([1e300, 1.0]))
    m = model([h.make_node("Add", ["x", "big"], ["y"], name="add_big")], [("x", TP.DOUBLE, [2])],
              [("y", TP.DOUBLE, [2])], [big])
    x = np.array([1.5, -2.25])
    np.testing.assert_array_equal(kumiko.compile(kumiko.from_onnx(m), "eval")(x=x)["y"], x + [1e300, 1.0])
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m, narrow_double=True)
    assert e.value.code == "E1012" and "'big'" in e.value.why and "fp32" in e.value.why


def _norm_reference(op: str, x: np.ndarray, p: dict) -> np.ndarray:
    """The ONNX definitions, in float64."""
    if op == "BatchNormalization":
        sh = (1, -1, 1, 1)
        return (x - p["m"].reshape(sh)) / np.sqrt(p["v"].reshape(sh) + 1e-5) * p["s"].reshape(sh) + p["b"].reshape(sh)
    if op == "InstanceNormalization":
        mu, var = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * p["s"].reshape(1, -1, 1, 1) + p["b"].reshape(1, -1, 1, 1)
    if op == "GroupNormalization":         # opset 21: two groups, scale and bias per channel
        g = x.reshape(x.shape[0], 2, -1)
        y = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + 1e-5)).reshape(x.shape)
        return y * p["s"].reshape(1, -1, 1, 1) + p["b"].reshape(1, -1, 1, 1)
    sq, total = x ** 2, np.zeros_like(x)                 # LRN, size 3
    for c in range(x.shape[1]):
        total[:, c] = sq[:, max(0, c - 1):c + 2].sum(1)
    return x / (1.0 + 1e-4 / 3 * total) ** 0.75


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["BatchNormalization", "InstanceNormalization", "GroupNormalization", "LRN"])
def test_double_normalisations_compute_in_float64(op, target):
    # values near 1e25: their squares (1e50) overflow fp32, so only a float64 computation gets these right
    c = 4
    p = {"s": RNG.standard_normal(c), "b": RNG.standard_normal(c), "m": RNG.standard_normal(c) * 1e25,
         "v": (RNG.random(c) + 0.5) * 1e50}
    names = {"BatchNormalization": "sbmv", "InstanceNormalization": "sb", "GroupNormalization": "sb", "LRN": ""}[op]
    attrs = {"GroupNormalization": {"num_groups": 2}, "LRN": {"size": 3}}.get(op, {})
    node = h.make_node(op, ["x", *names], ["y"], **attrs)
    m = model([node], [("x", TP.DOUBLE, [2, c, 5, 7])], [("y", TP.DOUBLE, [2, c, 5, 7])],
              [const(k, p[k]) for k in names], opset=21)
    x = RNG.standard_normal((2, c, 5, 7)) * (1.0 if op == "LRN" else 1e25)
    got = kumiko.compile(kumiko.from_onnx(m), target)(x=x)["y"]
    assert got.dtype == np.float64 and rel_l2(got, _norm_reference(op, x, p)) <= 1e-12


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
def test_double_attention_computes_in_float64(causal, target):
    # scores near 1e3 apart: exp of their differences spans far past what fp32 resolves
    shape = [1, 2, 9, 8]
    node = h.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=int(causal))
    m = model([node], [(n, TP.DOUBLE, shape) for n in "qkv"], [("y", TP.DOUBLE, shape)], opset=23)
    xs = {n: RNG.standard_normal(shape) * 10 for n in "qkv"}
    s = xs["q"] @ xs["k"].transpose(0, 1, 3, 2) / np.sqrt(8)
    if causal:
        s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ xs["v"]
    got = kumiko.compile(kumiko.from_onnx(m), target)(**xs)["y"]
    assert got.dtype == np.float64 and rel_l2(got, want) <= 1e-12
