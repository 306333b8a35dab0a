"""The evaluator's contractions (a float SUM of a float MUL): computed from the operands with an einsum in
float64, never materialising the product, with the sequential-sum semantics kept where a running sum may
overflow; values no later node reads are dropped, and the size limit counts what is live at once."""
import importlib

import numpy as np
import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.tensor import Tensor
from kumiko.tiny.limits import eval_schedule, evaluator_peak

ev = importlib.import_module("kumiko.tiny.evaluate")   # the module (the package exports its function)
RNG = np.random.default_rng(7)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _materialised(a, b, shape, axes, acc=np.float32):
    """The definition: every exact product, summed in order (``_sequential_sum`` on the whole product)."""
    terms = np.broadcast_to(np.asarray(a, np.float64) * np.asarray(b, np.float64), shape)
    return ev._sequential_sum(terms, axes, np.dtype(acc))


def test_a_gemm_whose_product_exceeds_the_limit_runs_without_materialising_it(monkeypatch):
    # the M x N x K product is 512 MiB in fp32 (1 GiB as float64 terms); the limit is 48 MiB
    monkeypatch.setenv("KUMIKO_MAX_BYTES", str(48 << 20))
    a, b = Tensor.input("a", (512, 512)), Tensor.input("b", (512, 512))
    g = a.matmul(b).graph("y")
    x, w = _rand(512, 512), _rand(512, 512)
    got = kumiko.compile(g, target="eval")(a=x, b=w)["y"]
    want = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert eval_schedule(g.tiny).fused          # the MUL is never a value of its own


def test_the_limit_still_refuses_what_the_evaluator_would_hold(monkeypatch):
    monkeypatch.setenv("KUMIKO_MAX_BYTES", str(8 << 20))
    a, b = Tensor.input("a", (1024, 1024)), Tensor.input("b", (1024, 1024))   # 4 MiB each, 4 MiB out
    g = a.matmul(b).graph("y")
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, target="eval")(a=_rand(1024, 1024), b=_rand(1024, 1024))
    assert e.value.code == "E1017" and "live values" in e.value.why


@pytest.mark.parametrize("form", ["b_constant_along_k", "both_constant_along_k", "kept_axis_broadcast"])
def test_broadcast_operands(form):
    M, N, K = 5, 7, 9
    a, b = Tensor.input("a", (M, K)), Tensor.input("b", (N,))
    x, w = _rand(M, K), _rand(N)
    if form == "b_constant_along_k":        # sum_k a[m,k] * b[n] = b[n] * sum_k a[m,k]
        y = (a.reshape((M, 1, K)).expand((M, N, K)) * b.reshape((1, N, 1)).expand((M, N, K))).sum(2)
        terms = x[:, None, :] * w[None, :, None]
    elif form == "both_constant_along_k":   # neither operand varies along k: K copies of a[m,0] * b[n]
        y = (a.shrink(((0, M), (0, 1))).reshape((M, 1, 1)).expand((M, N, K)) *
             b.reshape((1, N, 1)).expand((M, N, K))).sum(2)
        terms = np.broadcast_to(x[:, :1, None] * w[None, :, None], (M, N, K))
    else:                                   # the output's n axis is broadcast in both operands
        y = (a.reshape((M, 1, K)).expand((M, N, K)) * a.reshape((M, 1, K)).expand((M, N, K))).sum(2) + b * 0
        terms = np.broadcast_to(x[:, None, :] ** 2, (M, N, K))
    g = y.graph("y")
    got = kumiko.compile(g, target="eval")(**{t: v for t, v in (("a", x), ("b", w)) if t in dict(g.tiny.inputs)})["y"]
    want = ev._sequential_sum(np.asarray(terms, np.float64), (2,), np.dtype(np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_overflowing_points_follow_the_in_order_sum_and_the_rest_the_einsum():
    M, N, K = 64, 48, 96
    x, w = _rand(M, K), _rand(K, N)
    x[3, :4] = [3e38, 3e38, -3e38, 1.0]     # row 3's running sums leave fp32's range, then come back in float64
    x[40, 10] = np.inf                      # an infinite term
    w[20, 7] = -2e38
    x[50, 20] = 1e10                        # with w[20, 7]: one product far past fp32's range
    a, b = Tensor.input("a", (M, K)), Tensor.input("b", (K, N))
    got = kumiko.compile(a.matmul(b).graph("y"), target="eval")(a=x, b=w)["y"]
    want = _materialised(x[:, :, None], w[None, :, :], (M, K, N), (1,))
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    assert np.array_equal(got[~np.isfinite(got)], want[~np.isfinite(want)], equal_nan=True)
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6, atol=1e-5)
    assert (~np.isfinite(got[3])).any() and np.isfinite(got[3]).any()   # both paths taken


def test_fp16_contraction_accumulates_in_fp32():
    a, b = Tensor.input("a", (33, 65), dtype="fp16"), Tensor.input("b", (65, 17), dtype="fp16")
    x, w = _rand(33, 65, dtype=np.float16), _rand(65, 17, dtype=np.float16)
    got = kumiko.compile(a.matmul(b).graph("y"), target="eval")(a=x, b=w)["y"]
    assert got.dtype == np.float16
    want = _materialised(x[:, :, None], w[None, :, :], (33, 65, 17), (1,)).astype(np.float16)
    assert np.array_equal(got, want)


def test_keep_returns_every_value_including_the_product():
    a, b = Tensor.input("a", (3, 4)), Tensor.input("b", (4, 5))
    g = a.matmul(b).relu().graph("y")
    vals = ev.evaluate(g.tiny, {"a": _rand(3, 4), "b": _rand(4, 5)}, keep=True)
    assert len(vals) == len(g.tiny.nodes)
    assert any(g.tiny.nodes[nid].uop == "MUL" and v.shape == (3, 5, 4) or v.shape == (3, 4, 5)
               for nid, v in vals.items() if g.tiny.nodes[nid].uop == "MUL")


def test_dead_values_are_dropped_so_a_long_chain_holds_two_at_a_time():
    x = Tensor.input("x", (1024, 1024))
    y = x
    for _ in range(40):
        y = (y * 1.0001).relu()
    g = y.graph("y")
    one = 4 * 1024 * 1024
    assert evaluator_peak(g.tiny, {}) <= 4 * one     # input, output, and at most two live intermediates
    got = kumiko.compile(g, target="eval")(x=(xs := _rand(1024, 1024)))["y"]
    want = xs.copy()
    for _ in range(40):
        want = np.maximum(want * np.float32(1.0001), 0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
