"""Window kernels on the CPU loop path: the guard-free interior copy and the jammed points
(``kumiko.kernel.lower_cpu`` ``_interior_split``, ``kumiko.kernel.jam``).

The loop around the innermost loops of a padded window (a depthwise conv, a pool) tests each bound once per
point, at its weakest tap, and runs a copy of its body without the per-tap guards where they all hold; where
the window slides along that loop's axis it also runs JAM interior points at once, their taps merged so each
input vector is loaded once for all of them. Checked against the evaluator on random inputs with the outputs
poisoned, at the sizes where the runs of points change: rows of 1 to 13 points (no loop, an interior
shorter than JAM, runs of JAM with 0 to 3 points after them), stride 2, padding 0 to 2, dilation 2, 5x5
windows, batch 3, channels-last and channels-first, pools; and against the plain emitter bit for bit (the
jammed copy adds in the same order). The jam's renaming and merging are unit-tested on the kernel IR."""
import re

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel.jam import jam, jammable
from kumiko.kernel.loops import Assign, Block, Decl, For, Raw, Scratch, VecStore
from tests.kernel.test_channels_last import conv_last
from tests.kernel.test_depthwise_vec import rel


def _dw_last(n, h, w, c, k=3, stride=1, pad=1, dil=1, seed=0):
    rng = np.random.default_rng(seed + 31 * h + w)
    x = Tensor.input("x", (n, h, w, c))
    # the weight [KH, KW, 1, C] as the layout pass leaves an imported network's: vectors along the channels
    wt = Tensor(rng.standard_normal((k, k, 1, c), np.float32) + np.float32(0.1), name="w", role="param")
    b = Tensor(rng.standard_normal(c, np.float32), name="b", role="param")
    y = conv_last(x, wt, b, stride=stride, padding=pad, dilation=dil, groups=c, w_layout="channels_last")
    return y.clip(0.0, 6.0).graph("y", name="dwl")


def _dw_first(n, c, h, w, k=3, stride=1, pad=1):
    rng = np.random.default_rng(5 * h + w)
    x = Tensor.input("x", (n, c, h, w))
    wt = Tensor(rng.standard_normal((c, 1, k, k), np.float32), name="w", role="param")
    return x.conv2d(wt, None, stride=stride, padding=pad, groups=c).graph("y", name="dwf")


def _checked(g, monkeypatch) -> str:
    monkeypatch.setenv("KUMIKO_SPEC", "1")          # outputs poisoned (NaN) before each run
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    for seed in (0, 1):
        ins = {k: v for k, v in exe.random_inputs(seed).items() if k not in exe.params}
        out, want = exe(**ins)["y"], ref(**ins)["y"]
        assert out.shape == want.shape and not np.isnan(out).any()
        assert rel(out, want) < 1e-5, rel(out, want)
    return exe._run.source


@pytest.mark.parametrize("w", [1, 2, 3, 5, 6, 7, 9, 13])
def test_depthwise_rows_around_the_run_length(w, monkeypatch):
    src = _checked(_dw_last(1, 6, w, 16), monkeypatch)
    assert ("i2_jam" in src) == (w > 1)                 # the output columns' loop steps JAM points at a time


@pytest.mark.parametrize("stride,pad,dil,k", [(1, 0, 1, 3), (1, 2, 1, 3), (2, 1, 1, 3), (2, 0, 1, 3),
                                              (1, 2, 2, 3), (1, 2, 1, 5), (2, 2, 1, 5)])
@pytest.mark.parametrize("n,c,sizes", [(1, 8, [(9, 11), (14, 14)]), (3, 13, [(7, 22)])])
def test_depthwise_windows(stride, pad, dil, k, n, c, sizes, monkeypatch):
    for h, w in sizes:
        _checked(_dw_last(n, h, w, c, k=k, stride=stride, pad=pad, dil=dil), monkeypatch)


@pytest.mark.parametrize("stride,dil,jammed", [(1, 1, True), (2, 1, False), (2, 2, True), (1, 2, True)])
def test_jammed_where_neighbours_share_taps(stride, dil, jammed, monkeypatch):
    """Points are jammed where the window's step along the output (the stride) is at most its taps' (the
    dilation): a stride-2 3x3 window's neighbours share a third of their loads, not worth a jammed copy."""
    src = _checked(_dw_last(1, 17, 17, 16, stride=stride, pad=dil, dil=dil), monkeypatch)
    assert ("i2_jam" in src) == jammed


def test_the_interior_copy_has_no_per_tap_guard(monkeypatch):
    """A 3x3 padded depthwise conv: the jammed copy loads each tap unguarded; its test is one per run."""
    src = _checked(_dw_last(1, 12, 12, 16), monkeypatch)
    m = re.search(r"if \(i2_jam >= 0LL && i2_jam \+ 3LL < 12LL && (.*)\) \{\n", src)
    assert m is not None, src
    jammed = src[m.end():src.index("} else {", m.end())]
    assert "if (" not in jammed and jammed.count("kv_fma(") == 36      # 4 points x 9 taps, no guard
    assert "(i2_jam + 3LL)" in jammed
    # the interior's bounds: rows 1..10 and columns 1..10 of the 12 x 12 output
    assert "(i1 + -1LL) >= 0" in m.group(1) and "(-1LL*i1 + 10LL) >= 0" in m.group(1)


@pytest.mark.parametrize("pad,start", [(1, -3), (2, -2)])
def test_runs_start_where_the_interior_does(pad, start, monkeypatch):
    """The runs of JAM points are aligned on the interior's first column (the pad): with a pad of 1 the runs
    are 1..4 and 5..8 (a row of 7 gets one), the loop starting at -3 (its first run holds column 0 alone); with
    a pad of 2, 2..5, from -2."""
    src = _checked(_dw_last(1, 9, 7, 16, pad=pad), monkeypatch)
    assert re.search(rf"for \(long long i2_jam = {start}; i2_jam < \d+LL; i2_jam \+= 4LL\)", src), src


def test_jammed_points_give_the_same_bits(monkeypatch):
    """Interior points jammed or one by one add their taps in the same order."""
    g = _dw_last(1, 20, 23, 24)
    exe = kumiko.compile(g, "cpu")
    ins = {k: v for k, v in exe.random_inputs(3).items() if k not in exe.params}
    jammed = exe(**ins)["y"].copy()
    monkeypatch.setattr("kumiko.kernel.lower_cpu.JAM", 1)
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")
    plain = kumiko.compile(g, "cpu")
    assert "_jam" not in plain._run.source
    np.testing.assert_array_equal(plain(**ins)["y"], jammed)


@pytest.mark.parametrize("h,w", [(5, 31), (13, 17), (3, 4)])
def test_channels_first_depthwise(h, w, monkeypatch):
    """Channels-first: the vector loop runs along the columns (split by lane guards); the rows are jammed."""
    src = _checked(_dw_first(2, 3, h, w), monkeypatch)
    assert "i2_jam" in src


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (3, 1, 1), (2, 2, 0)])
def test_pools(k, s, p, monkeypatch):
    x = Tensor.input("x", (2, 3, 15, 18))
    _checked(x.max_pool2d(k, s, p).graph("y", name="mp"), monkeypatch)
    _checked(x.avg_pool2d(k, s, p).graph("y", name="ap"), monkeypatch)


# the kernel IR transform ----------------------------------------------------------------------------------
def _body(extra=()):
    tap = Block(tuple(Block((Decl("const long long", "r0", f"{k}LL"),
                             Assign("t1", "kv_fma(kv_load(x + (i + r0)), kv_load(w + r0), t1)")))
                      for k in range(3)), unrolled=True)
    return (Decl("kv_t", "t1", "kv_broadcast(0.0f)"),
            For("r1", "0", "2LL", (Assign("t1", "t1 + kv_load(x + (i + r1))"),), trips=2),
            tap, Decl("kv_t", "v_out", "t1"), VecStore("kv_store", "y", "i", "v_out")) + extra


def test_jam_renames_and_merges():
    out = jam(_body(), "i", "i_jam", 2, frozenset({"r0", "r1", "i"}))
    text = repr(out)
    assert "t1_0" in text and "t1_1" in text and "v_out_1" in text and "(i_jam + 1LL)" in text
    assert "x + (i + r0)" not in text                                    # the axis renamed everywhere
    # the constant loop unrolled, the copies' blocks merged: one block per tap, both copies inside
    taps = [s for s in out if isinstance(s, Block) and s.unrolled]
    assert len(taps) == 2 and all(len(b.body) in (2, 3) for b in taps)
    first = taps[1].body[0].body
    assert first[0] == Decl("const long long", "r0", "0LL")              # declared once, the same in both
    assert [s.name for s in first[1:]] == ["t1_0", "t1_1"]
    stores = [s for s in out if isinstance(s, VecStore)]
    assert [s.offset for s in stores] == ["(i_jam + 0LL)", "(i_jam + 1LL)"]


def test_what_is_not_jammed():
    assert jammable(_body())
    assert not jammable(_body((Assign("acc", "acc + 1"),)))             # an accumulator from outside
    assert not jammable(_body((Scratch("float", "s", "4", stack=True),)))
    assert not jammable(_body((Raw("f(x);"),)))
    assert not jammable((For("j", "0", "4", (), parallel=True),))
