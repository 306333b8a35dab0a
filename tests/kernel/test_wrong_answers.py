"""Regression tests for silent wrong answers on the CPU target (each failed before its fix).

- A row reduction vectorised with four accumulators combined them inside the loops over its outer
  reduction axes, so from the second outer point on the other three were added again: a keepdim mean
  over (H, W) broadcast back (squeeze-excitation, instance norm) was wrong once a row held 64 floats
  (four vectors of 16), right at 48x48.
- gcc 12's loop vectorizer miscompiles an in-order float reduction that reads backwards along its
  inner reduction axis (``x.flip(1).sum()`` returned 67 for 66); such kernels are built with that one
  pass off (``Kernel.no_loop_vectorize``).
- With ``-ffp-contract=fast`` gcc fused a product into every add and subtract that used it, across
  statements: ``p - mean(p)`` over an axis of one element kept the product's rounding error (the fused
  ``fma(a, b, -round(a * b))``), and a layernorm there scaled it by ``1 / sqrt(eps)`` (fuzz seeds 91080 and
  91958: -7.7e-5 where the answer is 0). The kernels build with contraction off; a sum of products (GEMM
  micro-kernels, dot products, conv windows) is an explicit fused multiply-add.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import rel_l2

REDUCE_BACK = {
    "mul_mean_hw": lambda x: x * x.mean(axis=(2, 3), keepdim=True),
    "add_sum_hw": lambda x: x + x.sum(axis=(2, 3), keepdim=True),
    "relu_mul_mean": lambda x: x.relu() * x.relu().mean(axis=(2, 3), keepdim=True),
    "mul_sum_13": lambda x: x * x.sum(axis=(1, 3), keepdim=True),
    "sub_mean_03": lambda x: x - x.mean(axis=(0, 3), keepdim=True),
    "layernorm_last": lambda x: x.layernorm(-1),
}


@pytest.mark.parametrize("shape", [(1, 32, 64, 64), (2, 8, 40, 64), (2, 3, 17, 130)])
@pytest.mark.parametrize("name", sorted(REDUCE_BACK))
def test_reduction_broadcast_back_matches_the_evaluator_on_long_rows(name, shape):
    x = Tensor.input("x", shape)
    g = REDUCE_BACK[name](x).graph("y")
    xv = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    got = kumiko.compile(g)(x=xv)["y"]
    want = kumiko.compile(g, "eval")(x=xv)["y"]
    assert rel_l2(got, want) <= 1e-5


REVERSED = {
    "flip_sum": (lambda x: x.flip([1]).sum(), lambda v: v[:, ::-1].sum()),
    "flip_mean": (lambda x: x.flip([1]).mean(), lambda v: v[:, ::-1].mean()),
    "neg_step_sum": (lambda x: x[:, ::-1].sum(), lambda v: v[:, ::-1].sum()),
    "neg_step2_rows": (lambda x: x[:, ::-2].sum(1), lambda v: v[:, ::-2].sum(1)),
}


@pytest.mark.parametrize("shape", [(4, 3), (5, 7), (16, 16)])
@pytest.mark.parametrize("name", sorted(REVERSED))
def test_backwards_reductions_are_exact_on_integers(name, shape):
    f, ref = REVERSED[name]
    x = Tensor.input("x", shape)
    xv = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)   # sums of small integers: exact
    np.testing.assert_allclose(kumiko.compile(f(x).graph("y"))(x=xv)["y"], ref(xv), rtol=1e-6)


def test_only_backwards_reductions_turn_the_loop_vectorizer_off():
    def source(t: Tensor) -> str:
        return kumiko.compile(t.graph("y"), "cpu")._run.source

    x = Tensor.input("x", (4, 3))
    assert "no-tree-loop-vectorize" in source(x.flip([1]).sum())
    assert "no-tree-loop-vectorize" not in source(x.sum())
    assert "no-tree-loop-vectorize" not in source(x.flip([1]).relu())


@pytest.mark.parametrize("rows", [1, 7, 64, 130])
def test_a_product_minus_its_mean_over_one_element_is_exactly_zero(rows):
    a, b = Tensor.input("a", (rows, 1)), Tensor.input("b", (rows, 1))
    p = (a * 2.0 - 3.0) * b
    g = (p - p.mean(axis=-1, keepdim=True)).layernorm(-1).graph("y")
    rng = np.random.default_rng(rows)
    ins = {n: rng.standard_normal((rows, 1), dtype=np.float32) for n in "ab"}
    got = kumiko.compile(g)(**ins)["y"]
    assert np.array_equal(got, np.zeros_like(got)), got.ravel()[:8]


@pytest.mark.parametrize("seed", [91080, 91958])
def test_fuzz_seeds_of_fused_products(seed):
    from tests.fuzz.netgraphs import RandomDraw, agrees, draw_graph, inputs_for
    g, shapes, _ = draw_graph(RandomDraw(seed))
    ins = inputs_for(shapes, seed)
    ok, err = agrees(g, ins, kumiko.compile(g, "cpu")(**ins)["y"], kumiko.compile(g, "eval")(**ins)["y"])
    assert ok, err


def test_sums_of_products_are_fused_multiply_adds(monkeypatch):
    """The contraction's micro-kernel and a loop nest's dot product spell their fused multiply-adds; the build
    turns contraction off."""
    from kumiko.runtime.cpu import DEFAULT_FLAGS
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")         # the source, not a cached program
    assert "-ffp-contract=off" in DEFAULT_FLAGS
    x, w = Tensor.input("x", (96, 200)), Tensor.input("w", (200, 64))
    src = kumiko.compile((x @ w).graph("y")).compilation.source
    assert "kk_vfma(" in src.source
    v = Tensor.input("v", (3, 300))
    src = kumiko.compile((v * v).sum(axis=-1).graph("y")).compilation.source
    assert "kv_fma(" in src.source
