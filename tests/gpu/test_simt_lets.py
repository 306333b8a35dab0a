"""Regression tests for the SIMT skeleton's let handling (found by the differential fuzz, tests/fuzz):

- a let memoised outside a reduction and varying along the reduction's axes was reused inside it: for
  ``t0 = softmax(x, 1); y = t0 + t0.sum((0, 1), keepdim)`` the softmax denominator, a sum over axis 1
  nested in the sum over (0, 1), added the outer point's exp seven times (wrong answers);
- a let that is only another let's name (``out = v_n17``) raised KeyError while lowering.
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import bound, rel_l2

from .conftest import needs_gxx

pytestmark = needs_gxx


def _softmax_then_sum_back(x):
    t0 = x.softmax(1)
    return t0 + t0.sum(axis=(0, 1), keepdim=True)


def _layernorm_max_back_permuted(x):
    t0 = x.layernorm(0)
    return (t0 + t0.max(axis=2, keepdim=True)).permute(2, 1, 0).permute(2, 0, 1)


@pytest.mark.parametrize("build, shape", [(_softmax_then_sum_back, (1, 7, 31)),
                                          (_softmax_then_sum_back, (2, 5, 9)),
                                          (_layernorm_max_back_permuted, (1, 3, 48))])
def test_simt_lets_match_the_evaluator(build, shape):
    g = build(Tensor.input("x", shape)).graph("y")
    xv = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    got = kumiko.compile(g, "cuda-emu")(x=xv)["y"]
    assert rel_l2(got, kumiko.compile(g, "eval")(x=xv)["y"]) <= bound("fp32")
