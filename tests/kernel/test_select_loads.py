"""A value select (``where(cond, a, b)`` whose condition reads data) loads both sides unconditionally in the
CPU's scalar code (``kumiko.kernel.lower_base``, ``select``): a load inside the C ternary is a conditional
load, and gcc 12.2's loop vectorizer made it a masked load with the wrong stride across the outer loop's rows
at -O3 (``max(where(y < 0, x, -1), z)`` over 2 x 4 read ``x[1, j]`` from ``x[0, j + 2]``; found by the random
graph test in CI). Checked against the evaluator at the small row lengths (under a vector) where it happened."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.tiny import TinyBuilder


@pytest.mark.parametrize("rows,cols", [(2, 4), (3, 4), (4, 4), (4, 7), (5, 4), (5, 7), (3, 9)])
def test_where_then_max_over_short_rows(rows, cols):
    x, y, z = (Tensor.input(n, (rows, cols)) for n in "xyz")
    graphs = {"where_max": (y < 0).where(x, -1.0).maximum(z) * 1.0,
              "where2": (y < 0).where(x, z) + (z > 0).where(y, x)}
    for name, t in graphs.items():
        g = t.graph("o")
        exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
        for seed in (0, 1):
            ins = exe.random_inputs(seed)
            np.testing.assert_allclose(exe(**ins)["o"], ref(**ins)["o"], rtol=0, atol=1e-6, err_msg=name)


def test_the_tiny_graph_ci_found():
    """The random graph of the failing CI run, as it was built: INPUT, CMPLT, WHERE, MAX, MUL over 2 x 4."""
    rng = np.random.default_rng(0)
    b = TinyBuilder("rand")
    feeds = {n: rng.standard_normal((2, 4)).astype(np.float32) for n in ("in0", "in1", "in2")}
    x = b.add("INPUT", tensor_id="in0", dtype="fp32", shape=(2, 4))
    y = b.add("INPUT", tensor_id="in1", dtype="fp32", shape=(2, 4))
    w = b.add("WHERE", [b.add("CMPLT", [y, 0.0]), x, -1.0])
    z = b.add("INPUT", tensor_id="in2", dtype="fp32", shape=(2, 4))
    out = b.add("MUL", [b.add("MAX", [w, z]), 1.0])
    g = b.finish([("in0", x), ("in1", y), ("in2", z)], [("out", out)])
    want = np.maximum(np.where(feeds["in1"] < 0, feeds["in0"], -1.0), feeds["in2"])
    np.testing.assert_array_equal(kumiko.compile(g)(**feeds)["out"], want.astype(np.float32))
