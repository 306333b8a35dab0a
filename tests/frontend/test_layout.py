"""Layouts: the channels-last forms of Conv2D (``x_layout``, ``y_layout``, ``w_layout``) and of the pools
(``layout``) against their channels-first results, and the cpu target's rewrite of a CNN into channels-last
activations between its convolutions (``kumiko.frontend.layout``) against the evaluator of the graph as given."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.frontend.layout import channels_last

LAST, FIRST = "channels_last", "channels_first"


def _nhwc(a):
    return np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))


def _eval(t: Tensor, **ins):
    return kumiko.compile(t.graph("y"), "eval")(**ins)["y"]


@pytest.mark.parametrize("c,co,groups,k,stride,pad,dil", [
    (5, 7, 1, 3, 1, 1, 1), (6, 4, 2, 3, 2, 1, 1), (8, 8, 8, 3, 1, 1, 1), (8, 8, 8, 5, 2, 2, 1),
    (3, 6, 1, 1, 1, 0, 1), (4, 6, 1, 3, 1, 2, 2)])
@pytest.mark.parametrize("x_l,y_l,w_l", [(LAST, LAST, FIRST), (FIRST, LAST, FIRST), (LAST, FIRST, LAST),
                                         (LAST, LAST, LAST)])
def test_conv2d_layouts_are_the_channels_first_conv_transposed(c, co, groups, k, stride, pad, dil, x_l, y_l, w_l):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c, 9, 11)).astype(np.float32)
    w = rng.standard_normal((co, c // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    attrs = dict(stride=[stride] * 2, padding=[pad] * 2, dilation=[dil] * 2, groups=groups)
    tx, tw, tb = Tensor.input("x", x.shape), Tensor.input("w", w.shape), Tensor.input("b", b.shape)
    want = _eval(Tensor._record("Conv2D", (tx, tw, tb), **attrs), x=x, w=w, b=b)
    xa = _nhwc(x) if x_l == LAST else x
    wa = np.ascontiguousarray(w.transpose(2, 3, 1, 0)) if w_l == LAST else w
    ta, twa = Tensor.input("x", xa.shape), Tensor.input("w", wa.shape)
    y = Tensor._record("Conv2D", (ta, twa, tb), **attrs, x_layout=x_l, y_layout=y_l, w_layout=w_l)
    for target in ("eval", "cpu"):
        got = kumiko.compile(y.graph("y"), target)(x=xa, w=wa, b=b)["y"]
        np.testing.assert_allclose(got, _nhwc(want) if y_l == LAST else want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,extra", [("MaxPool", {}), ("AvgPool", {}), ("AvgPool", {"count_include_pad": False}),
                                      ("MaxPool", {"ceil_mode": True}), ("AvgPool", {"ceil_mode": True})])
def test_pools_channels_last(op, extra):
    x = np.random.default_rng(1).standard_normal((2, 5, 10, 9)).astype(np.float32)
    attrs = dict(kernel=[3, 3], stride=[2, 2], padding=[1, 1], **extra)
    want = _eval(Tensor._record(op, (Tensor.input("x", x.shape),), **attrs), x=x)
    y = Tensor._record(op, (Tensor.input("x", (2, 10, 9, 5)),), **attrs, layout=LAST)
    for target in ("eval", "cpu"):
        got = kumiko.compile(y.graph("y"), target)(x=_nhwc(x))["y"]
        np.testing.assert_allclose(got, _nhwc(want), rtol=1e-5, atol=1e-5)


def test_a_layout_that_is_not_one_is_a_diagnostic():
    x, w = Tensor.input("x", (1, 3, 8, 8)), Tensor.input("w", (4, 3, 3, 3))
    with pytest.raises(KumikoError) as e:
        Tensor._record("Conv2D", (x, w), x_layout="NHWC").graph("y")
    assert e.value.code == "E1010" and "x_layout" in e.value.why
    with pytest.raises(KumikoError) as e:
        kumiko.compile(x.conv2d(w).graph("y"), "cpu", layout="nhwc")
    assert e.value.code == "E1010" and "layout" in e.value.why


def _cnn():
    """A small CNN: stem conv (bias), ReLU6, depthwise conv (bound weight), a 1x1 projection, a residual add, a
    per-channel scale from the input's mean (an SE gate: a run-time [N, C, 1, 1]), a max pool, a 3x3 conv, a
    global average pool (keepdim), flatten, a linear head."""
    rng = np.random.default_rng(5)

    def p(name, *shape):
        return Tensor((rng.standard_normal(shape) * 0.3).astype(np.float32), name=name, role="param")
    x = Tensor.input("x", (2, 3, 17, 15))
    h = x.conv2d(p("w0", 16, 3, 3, 3), p("b0", 16), stride=2, padding=1).clip(0.0, 6.0)
    d = h.conv2d(p("wd", 16, 1, 3, 3), padding=1, groups=16).relu()
    e = d.conv2d(p("w1", 16, 16, 1, 1)) + h + p("c1", 16, 1, 1)
    gate = e.mean((2, 3), keepdim=True).sigmoid()
    f = (e * gate).max_pool2d(2, 2)
    f = f.conv2d(p("w2", 24, 16, 3, 3), padding=1).relu()
    head = f.mean((2, 3), keepdim=True).reshape(2, 24)
    return head @ p("fc", 24, 10)


def test_a_cnn_runs_channels_last_on_the_cpu_and_matches_the_graph_as_given():
    g = _cnn().graph("y")
    arranged = channels_last(g)
    convs = [n for n in arranged.nodes if n.op == "Conv2D"]
    assert len(convs) == 4 and all(n.attrs["y_layout"] == LAST for n in convs)
    assert convs[0].attrs.get("x_layout", FIRST) == FIRST            # the image as given
    assert all(n.attrs["x_layout"] == LAST for n in convs[1:])
    # the one transpose: the head's pooled [N, 1, 1, C] to [N, C, 1, 1] for the flatten (the SE gate's mean
    # and sigmoid stay channels-last, as its product does)
    perms = [n for n in arranged.nodes if n.op == "Permute"]
    assert [n.attrs["perm"] for n in perms] == [(0, 3, 1, 2)], [n.name for n in perms]
    assert "wd::hwio" in arranged.params and "wd" not in arranged.params and "c1::nhwc" in arranged.params
    assert arranged.params["wd::hwio"].shape == (3, 3, 1, 16)
    exe = kumiko.compile(g, "cpu")
    assert "wd::hwio" in exe.input_names and "wd" not in exe.input_names
    with pytest.raises(KumikoError) as e:        # the old name: refused, the names it takes listed
        exe(x=exe.random_inputs(0)["x"], wd=np.ones((16, 1, 3, 3), np.float32))
    assert e.value.code == "E1015" and "wd::hwio" in str(e.value)
    given = kumiko.compile(g, "cpu", layout="as_given")
    assert "wd" in given.input_names
    ref = kumiko.compile(g, "eval")
    for seed in (0, 1):
        x = exe.random_inputs(seed)["x"]
        want = ref(x=x)["y"]
        np.testing.assert_allclose(exe(x=x)["y"], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(given(x=x)["y"], want, rtol=1e-4, atol=1e-5)


def test_a_graph_with_one_conv_stays_as_given():
    x, w = Tensor.input("x", (1, 3, 8, 8)), Tensor.input("w", (4, 3, 3, 3))
    g = x.conv2d(w, padding=1).relu().graph("y")
    assert channels_last(g) is g
    # two convs, the second grouped (not depthwise) with a run-time weight: one to convert, so none
    h = x.conv2d(w, padding=1).conv2d(Tensor.input("w2", (4, 2, 3, 3)), groups=2).graph("y")
    assert channels_last(h) is h


def test_the_rewrite_keeps_the_signature_and_reads_outputs_channels_first():
    """Graph outputs taken between convolutions stay [N, C, H, W] under their names; a run-time [N, C, H, W]
    input added to a channels-last activation is transposed to it."""
    x = Tensor.input("x", (1, 4, 6, 6))
    a = x.conv2d(Tensor.input("w1", (8, 4, 3, 3)), padding=1).relu()
    b = a.conv2d(Tensor.input("w2", (8, 8, 1, 1))) + Tensor.input("r", (1, 8, 6, 6))
    g = b.graph("y", outputs={"mid": a})
    arranged = channels_last(g)
    assert arranged.output_types == g.output_types and arranged.input_types == g.input_types
    perms = sorted(n.attrs["perm"] for n in arranged.nodes if n.op == "Permute")
    assert perms == [(0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 1, 2)], perms      # r in; mid and y out
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(3)
    out, want = exe(**ins), ref(**ins)
    for k in ("y", "mid"):
        np.testing.assert_allclose(out[k], want[k], rtol=1e-4, atol=1e-5)
