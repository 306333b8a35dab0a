"""The cpu target end to end: generated C against the Tiny IR evaluator, the structure of what is
generated, and the compile cache."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kumiko
from kumiko import Tensor
from kumiko.frontend.graph import Graph
from kumiko.frontend.tensor import build_graph
from kumiko.runtime import cpu as cpu_rt

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(g, seed=0, shapes=None, tol=1e-5, ref_dt=None):
    exe = kumiko.compile(g, "cpu")
    ref = kumiko.compile(g, "eval")
    ins = exe.random_inputs(seed, shapes)
    out, want = exe(**ins), ref(**ins)
    for k in want:
        assert out[k].dtype == want[k].dtype and out[k].shape == want[k].shape, k
        assert rel(out[k], want[k]) < tol, (k, rel(out[k], want[k]))
    return exe


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_match_the_evaluator(path):
    g = kumiko.load(path)
    exe = check(g, seed=1)
    check(g, seed=2, shapes={k: v + 5 for k, v in g.symbols.items()})      # not multiples of any tile
    ones = {k: 1 for k in g.symbols if k not in ("H", "W", "S", "K", "D")}  # size-1 dims
    check(g, seed=3, shapes=ones)
    assert exe.target == "cpu"


def _with_dtype(path, dt):
    d = json.loads(Path(path).read_text())
    for t in d["tensors"].values():
        t["dtype"] = dt
    return Graph.from_json(d)


@pytest.mark.parametrize("dt,tol", [("fp16", 1e-2), ("bf16", 2e-2)])
@pytest.mark.parametrize("stem", ["gemm_bias_relu", "conv_relu_maxpool", "attention_causal"])
def test_half_precision(stem, dt, tol):
    check(_with_dtype(EXAMPLES[[p.stem for p in EXAMPLES].index(stem)], dt), seed=4, tol=tol)


def test_symbolic_dims_bound_at_call_time():
    x = Tensor.input("x", ("M", "K"))
    w = Tensor.input("w", ("K", "N"))
    g = (x @ w).relu().graph("y")
    exe = kumiko.compile(g, "cpu")
    rng = np.random.default_rng(0)
    for m, k, n in [(1, 1, 1), (7, 3, 37), (130, 65, 17)]:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        np.testing.assert_allclose(exe(x=a, w=b)["y"], np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_gemm_source_has_packed_microkernel_vectors_and_openmp():
    g = kumiko.load(EXAMPLES[[p.stem for p in EXAMPLES].index("gemm_bias_relu")])
    c = kumiko.compile(g, "cpu")._run
    src = c.source
    (plan,) = c.plans.values()
    mr, nr = plan.register_block
    assert plan.algo == "packed" and f"kk_micro_{mr}x{nr}_v{plan.vector_width}(" in src
    assert "vector_size(" in src and "#pragma omp" in src and "kk_Ap" in src and "kk_Bp" in src
    assert plan.epilogue == ("add", "relu")


def test_fused_conv_relu_maxpool_is_one_kernel_without_intermediate():
    g = kumiko.load(EXAMPLES[[p.stem for p in EXAMPLES].index("conv_relu_maxpool")])
    c = kumiko.compile(g, "cpu")._run
    assert len(c.program.regions) == 1 and c.program.buffers == ()
    assert c.source.count("int kumiko_") == 1


def test_second_compile_hits_the_cache_and_corruption_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    cpu_rt.forget_loaded()
    x = Tensor.input("x", (5, 7))
    g = (x.exp() * 3.0).sum(axis=1).graph("y")
    before = dict(cpu_rt.STATS)
    kumiko.compile(g, "cpu")
    assert cpu_rt.STATS["compiles"] == before["compiles"] + 1
    cpu_rt.forget_loaded()
    kumiko.compile(g, "cpu")
    assert cpu_rt.STATS["compiles"] == before["compiles"] + 1      # nothing compiled the second time
    # corrupt a copy of the cache that this process never mapped (a loaded .so must not be rewritten)
    other = tmp_path.parent / (tmp_path.name + "_copy")
    shutil.copytree(tmp_path, other)
    for so in other.rglob("*.so"):
        so.write_bytes(b"not a shared object")
    monkeypatch.setenv("KUMIKO_CACHE", str(other))
    cpu_rt.forget_loaded()
    exe = kumiko.compile(g, "cpu")
    assert cpu_rt.STATS["compiles"] == before["compiles"] + 2      # the corrupted entry was rebuilt
    a = np.random.default_rng(0).standard_normal((5, 7), dtype=np.float32)
    np.testing.assert_allclose(exe(x=a)["y"], (np.exp(a) * 3).sum(axis=1), rtol=1e-5)


UNARY = ["relu", "exp", "neg", "sigmoid", "tanh", "abs", "gelu"]


@st.composite
def graphs(draw):
    a, b, c = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    x, y = Tensor.input("x", (a, b)), Tensor.input("y", (b, c))
    vals = [x, y, x @ y]
    for _ in range(draw(st.integers(1, 5))):
        t = draw(st.sampled_from(vals))
        op = draw(st.sampled_from(["unary", "binary", "reduce", "permute", "pad", "flip", "matmul", "softmax"]))
        if op == "unary":
            t = getattr(t, draw(st.sampled_from(UNARY)))()
        elif op == "binary":
            other = draw(st.sampled_from([v for v in vals if v.shape == t.shape] + [t]))
            t = t._ew(draw(st.sampled_from(["add", "sub", "mul", "max", "min"])), other)
        elif op == "reduce" and t.ndim:
            t = t._reduce(draw(st.sampled_from(["sum", "max", "mean"])), draw(st.integers(0, t.ndim - 1)), False)
        elif op == "permute" and t.ndim == 2:
            t = t.permute(1, 0)
        elif op == "pad" and t.ndim:
            t = t.pad([(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(t.ndim)])
        elif op == "flip" and t.ndim:
            t = t.flip(draw(st.integers(0, t.ndim - 1)))
        elif op == "matmul" and t.ndim == 2:
            partner = [v for v in vals if v.ndim == 2 and v.shape[0] == t.shape[1]]
            if partner:
                t = t @ draw(st.sampled_from(partner))
        elif op == "softmax" and t.ndim:
            t = t.softmax(draw(st.integers(0, t.ndim - 1)))
        if all(t is not v for v in vals):
            vals.append(t)
    return {"o": vals[-1]}


@settings(max_examples=15, deadline=None)
@given(graphs(), st.integers(0, 1000))
def test_random_graphs_on_cpu(outs, seed):
    g = build_graph(outs)
    exe = kumiko.compile(g, "cpu")
    ins = exe.random_inputs(seed)
    out, want = exe(**ins), kumiko.compile(g, "eval")(**ins)
    a, b = out["o"].astype(np.float64), want["o"].astype(np.float64)
    fin = np.isfinite(b)
    assert np.array_equal(np.isfinite(a), fin)
    assert rel(a[fin], b[fin]) < 1e-5


def test_gather_index_out_of_range_is_a_diagnostic_not_a_wild_read():
    x, idx = Tensor.input("x", (4, 5)), Tensor.input("idx", (4, 3), "i32")
    exe = kumiko.compile(x.gather(1, idx).graph("y"), "cpu")
    a = np.random.default_rng(0).standard_normal((4, 5), dtype=np.float32)
    good = np.array([[0, 4, 2]] * 4, np.int32)
    np.testing.assert_array_equal(exe(x=a, idx=good)["y"], np.take_along_axis(a, good, axis=1))
    with pytest.raises(kumiko.KumikoError) as e:
        exe(x=a, idx=np.array([[0, 1, 9]] * 4, np.int32))
    assert e.value.code == "E1015" and "gather" in e.value.why
