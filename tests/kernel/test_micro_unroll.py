"""The micro-kernels' loop over k is unrolled ``MICRO_UNROLL`` times (``kumiko.kernel.micro``): every variant
(packed panels, A rows in place, B from a stage, A from a stage with its rows a unit apart) asks gcc for it
before each of its k loops, and GEMMs whose K is no multiple of it (the remainder gcc peels) match the
evaluator, on the packed and the skinny paths, with bound and passed weights."""
import re

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel import micro


@pytest.mark.parametrize("text", [micro.micro_kernel(6, 16, 8), micro.micro_kernel(6, 16, 8, a_rows=True),
                                  micro.micro_kernel(4, 32, 8, b_ld=True), micro.stage_micro_kernel(6, 16, 8),
                                  micro.astage_micro_kernel(6, 16, 8), micro.astage_micro_kernel(6, 16, 8, True)])
def test_every_k_loop_is_unrolled(text):
    loops = re.findall(r"(.*)\n\s*for \(long long p = 0; p < kc; \+\+p\)", text)
    assert loops and all(f"#pragma GCC unroll {micro.MICRO_UNROLL}" in line for line in loops)
    assert micro.MICRO_UNROLL > 1


@pytest.mark.parametrize("m,k,n", [(13, 1, 40), (37, 3, 33), (64, 5, 16), (9, 7, 100), (200, 13, 24),
                                   (1, 11, 70), (50, 261, 17)])
@pytest.mark.parametrize("bound", [True, False])
def test_k_not_a_multiple_of_the_unroll(m, k, n, bound):
    rng = np.random.default_rng(m * k + n)
    x = Tensor.input("x", (m, k))
    w = Tensor(rng.standard_normal((k, n)).astype(np.float32), name="w", role="param") if bound else \
        Tensor.input("w", (k, n))
    g = (x @ w).relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(1)
    out, want = np.asarray(exe(**ins)["y"], np.float64), np.asarray(ref(**ins)["y"], np.float64)
    assert np.linalg.norm(out - want) <= 1e-5 * max(np.linalg.norm(want), 1e-30)
