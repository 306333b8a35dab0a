"""fp64 is a graph dtype (issue 22): the evaluator computes fp64 nodes in float64, reductions included, whether
or not it runs in its float64 reference mode."""
import numpy as np

from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.evaluate import evaluate

RNG = np.random.default_rng(2264)


def test_fp64_sum_accumulates_in_float64():
    # a row of 5000 values near 1 plus tiny parts: an fp32 accumulator (or an fp32 rounding of the result)
    # loses ~1e-8 relative, float64 keeps 1e-15
    b = TinyBuilder()
    x = b.add("INPUT", tensor_id="x", dtype="fp32", shape=(3, 5000))
    y = b.reduce(b.cast(x, "fp64"), "SUM", [1], "fp64")
    big = b.add("ADD", [b.cast(x, "fp64"), b.broadcast_to(b.const(1e9 + 0.125, "fp64"), (3, 5000))])
    z = b.reduce(big, "SUM", [1], "fp64")
    g = b.finish([("x", x)], [("y", y), ("z", z)])
    xs = (RNG.standard_normal((3, 5000)) + 1).astype(np.float32)
    out = evaluate(g, {"x": xs})
    want = xs.astype(np.float64).sum(axis=1)
    assert out["y"].dtype == np.float64 and out["z"].dtype == np.float64
    np.testing.assert_allclose(out["y"], want, rtol=1e-12)
    np.testing.assert_allclose(out["z"], (xs.astype(np.float64) + (1e9 + 0.125)).sum(axis=1), rtol=1e-14)
