"""Group axes (``kumiko.region.groups``): a grouped conv's output channel, read by its input in whole groups,
split into a batch axis and a channel within the group; the region becomes a contraction, its output a view of
the same memory, and its playback (handed on to the next region in the program's shape) the evaluator's."""
import numpy as np

import kumiko
from kumiko import Tensor
from kumiko.region import form_regions, play_program
from kumiko.region.analysis import analyze
from kumiko.region.groups import split_axis
from kumiko.region.ssa import Read
from kumiko.region.verify import verify
from kumiko.symbolic import Expr
from kumiko.tiny.evaluate import bind_symbols


def _reads(e, out):
    if isinstance(e, Read):
        out.append(e)
    for f in ("x", "y", "then", "other", "body", "operand"):
        k = getattr(e, f, None)
        if k is not None and not isinstance(k, (str, int, float)):
            _reads(k, out)
    return out


def _graph():
    """A grouped conv (4 groups of 6 -> 9 channels), then a second conv that reads its output as [N, 36, H, W]."""
    x = Tensor.input("x", (2, 24, 7, 9))
    w1, w2 = Tensor.input("w1", (36, 6, 3, 3)), Tensor.input("w2", (5, 36, 1, 1))
    y = x.conv2d(w1, padding=1, groups=4).relu()
    return y.conv2d(w2).graph("z")


def test_split_makes_the_group_a_batch_axis():
    g = _graph()
    plain = form_regions(g.tiny)
    r = plain.regions[0]
    assert analyze(r).contraction is None          # co is read by both operands: no N
    s = split_axis(r, "i1", 9)
    assert [(a.name, a.size) for a in s.iters] == [("i0", 2), ("i1_g", 4), ("i1_c", 9), ("i2", 7), ("i3", 9)]
    assert s.outputs[0].memref.shape == (2, 4, 9, 7, 9)             # the output as a view: the same memory
    xs = [e for let in s.lets for e in _reads(let.expr, []) if e.tensor == "x"]
    assert xs and all(e.index[1] == Expr.lift("6*i1_g + r0") for e in xs)        # floor((9*g + c)/9) = g
    c = analyze(s).contraction
    assert c.batch == ("i1_g",) and c.n_axes == ("i1_c",)
    verify(s)


def test_split_program_plays_back_as_the_evaluator():
    g = _graph()
    split = form_regions(g.tiny, group_axes=True)
    assert [a.name for a in split.regions[0].iters][1:3] == ["i1_g", "i1_c"]
    assert form_regions(g.tiny).regions[0].iters[1].name == "i1"       # off unless a target asks for it
    exe = kumiko.compile(g, "eval")
    ins = exe.random_inputs(3)
    want = exe(**ins)
    got = play_program(split, ins, bind_symbols(g.tiny, ins))
    assert got["z"].shape == want["z"].shape
    np.testing.assert_allclose(got["z"], want["z"], rtol=1e-4, atol=1e-5)
