"""The evaluator against IEEE fp32 where values overflow (issue 20): a contraction adds exact products in
order, as an FMA or a tensor core does; a SUM adds its terms one at a time; the comparison accepts any NaN
or inf where the reference has one, and measures huge finite values without overflowing."""
import numpy as np
import pytest

import kumiko
from kumiko.accuracy import compare, rel_l2
from kumiko.tensor import Tensor


def _matmul(dtype: str):
    a, b = Tensor.input("a", (2, 4), dtype=dtype), Tensor.input("b", (4, 3), dtype=dtype)
    return a.matmul(b).graph("y")


def test_fp32_gemm_overflow_follows_the_fused_sequential_sum():
    # every product is about 1e60: rounded on its own each is +-inf and the sum NaN; an FMA accumulator
    # overflows to the sign of the first term and stays there (numpy's BLAS and the cpu target agree)
    a = np.array([[1e30, -1e30, 1e30, 1e30], [-1e30, 1e30, 1e30, 1e30]], np.float32)
    b = np.full((4, 3), 1e30, np.float32)
    got = kumiko.compile(_matmul("fp32"), target="eval")(a=a, b=b)["y"]
    assert np.array_equal(got, np.array([[np.inf] * 3, [-np.inf] * 3], np.float32))


def test_fp16_products_over_65504_stay_finite_in_an_fp32_accumulator():
    a = np.full((2, 4), 300, np.float16)
    b = np.ones((4, 3), np.float16)
    b[0], b[1] = 300, -300                        # 300 * 300 = 90000 is inf in fp16, not in the fp32 sum
    got = kumiko.compile(_matmul("fp16"), target="eval")(a=a, b=b)["y"]
    assert np.all(np.isfinite(got)) and np.all(got == np.float16(600))


def test_cumsum_overflows_like_a_running_sum():
    x = Tensor.input("x", (1, 8))
    g = x.cumsum(1).graph("y")
    big = np.float32(3e38)
    xs = np.array([[big, big, -big, -big, big, -big, 1, 2]], np.float32)
    with np.errstate(over="ignore"):
        want = np.cumsum(xs, axis=1, dtype=np.float32)  # numpy's cumsum adds in order
    got = kumiko.compile(g, target="eval")(x=xs)["y"]
    assert np.array_equal(got, want)                    # inf from the second element on


def test_eval_and_cpu_agree_on_an_overflowing_gemm():
    g = kumiko.load("examples/gemm_bias_relu.json")
    rng = np.random.default_rng(0)
    ins = {"A": (rng.standard_normal((8, 16)) * 1e30).astype(np.float32),
           "B": (rng.standard_normal((16, 8)) * 1e10).astype(np.float32), "bias": np.zeros(8, np.float32)}
    ref = kumiko.compile(g, target="eval")(**ins)
    got = kumiko.compile(g, target="cpu")(**ins)
    assert all(c.ok for c in compare(got, ref))


def test_any_nan_or_inf_matches_a_non_finite_reference():
    want = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert rel_l2(np.array([1.0, -np.inf, np.nan, np.inf], np.float32), want) == 0.0
    assert rel_l2(np.array([1.0, 0.0, np.inf, -np.inf], np.float32), want) == float("inf")


def test_relative_l2_of_huge_finite_values_does_not_overflow():
    want = np.full(1000, 3e38, np.float32)
    got = want * np.float32(1 + 1e-6)
    assert rel_l2(got, want) == pytest.approx(1e-6, rel=0.2)
    assert rel_l2(want.astype(np.float64) * 1e200, want.astype(np.float64) * 1e200) == 0.0
