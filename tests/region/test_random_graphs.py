"""Hypothesis: random graphs of movement, elementwise, reductions and contractions; the regions they
form play back equal to the Tiny IR evaluator (fp32, relative L2 error < 1e-5)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kumiko
from kumiko import Tensor
from kumiko.region import form_regions, play_program
from kumiko.region.verify import verify
from kumiko.tiny.evaluate import bind_symbols

UNARY = ["relu", "exp", "neg", "sigmoid", "tanh", "abs"]
BINARY = ["add", "sub", "mul", "max", "min"]


@st.composite
def graphs(draw):
    a, b, c = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    x = Tensor.input("x", (a, b))
    y = Tensor.input("y", (b, c))
    vals = [x, y, x @ y]
    for _ in range(draw(st.integers(1, 6))):
        t = draw(st.sampled_from(vals))
        op = draw(st.sampled_from(["unary", "binary", "reduce", "permute", "pad", "flip", "slice", "matmul",
                                   "softmax", "reshape"]))
        if op == "unary":
            t = getattr(t, draw(st.sampled_from(UNARY)))()
        elif op == "binary":
            other = draw(st.sampled_from([v for v in vals if v.shape == t.shape] + [t]))
            t = t._ew(draw(st.sampled_from(BINARY)), other)
        elif op == "reduce" and t.ndim:
            t = t._reduce(draw(st.sampled_from(["sum", "max", "min", "mean"])), draw(st.integers(0, t.ndim - 1)),
                          draw(st.booleans()))
        elif op == "permute" and t.ndim == 2:
            t = t.permute(1, 0)
        elif op == "pad" and t.ndim:
            t = t.pad([(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(t.ndim)],
                      value=draw(st.sampled_from([0.0, 1.5])))
        elif op == "flip" and t.ndim:
            t = t.flip(draw(st.integers(0, t.ndim - 1)))
        elif op == "slice" and t.ndim and all(d > 1 for d in t.shape):
            t = t[(slice(1, None, draw(st.integers(1, 2))),) * 1]
        elif op == "matmul" and t.ndim == 2:
            partner = [v for v in vals if v.ndim == 2 and v.shape[0] == t.shape[1]]
            if partner:
                t = t @ draw(st.sampled_from(partner))
        elif op == "softmax" and t.ndim:
            t = t.softmax(draw(st.integers(0, t.ndim - 1)))
        elif op == "reshape" and t.ndim == 2:
            t = t.reshape(-1)
        if all(t is not v for v in vals):
            vals.append(t)
    outs = {"o0": vals[-1]}
    if draw(st.booleans()) and vals[-2] is not x and vals[-2] is not y:
        outs["o1"] = vals[-2]
    return outs


@settings(max_examples=60, deadline=None)
@given(graphs(), st.integers(0, 2**16))
def test_regions_play_back_like_the_evaluator(outs, seed):
    from kumiko.frontend.tensor import build_graph
    g = build_graph(outs)
    exe = kumiko.compile(g)
    ins = exe.random_inputs(seed)
    ref = exe(**ins)
    p = form_regions(g.tiny)
    for r in p.regions:
        verify(r)
    out = play_program(p, ins, bind_symbols(g.tiny, ins))
    for k in ref:
        a, b = out[k].astype(np.float64), ref[k].astype(np.float64)
        assert a.shape == b.shape
        fin = np.isfinite(b)
        assert np.array_equal(np.isfinite(a), fin)
        err = np.linalg.norm(a[fin] - b[fin]) / max(np.linalg.norm(b[fin]), 1e-30)
        assert err < 1e-5, (k, err)
