"""Channels-last convolutions on the cpu target (``x_layout``/``y_layout``/``w_layout``): the packed kernel
broadcasts each A row (a pixel, its channels the K elements) from the input where it lies, or from its padded
copy, rows a pixel's channels apart (``kumiko.kernel.stage``'s ``rdim``, the ``kk_micro_astage_u_``
micro-kernel); a short last panel reads its missing rows from the panel before it. Checked against the
evaluator at odd sizes, batch 1 and N, bound and unbound weights, on 1-3 threads."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from tests.kernel.test_contract_packing import rel
from tests.kernel.test_stage import _in_threads, _stage_counter, _trace_stage

LAST = "channels_last"


def conv_last(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, w_layout="channels_first"):
    """A channels-last Conv2D node (x and the result ``[N, H, W, C]``)."""
    srcs = (x, w) if b is None else (x, w, b)
    return Tensor._record("Conv2D", srcs, stride=[stride] * 2, padding=[padding] * 2, dilation=[dilation] * 2,
                          groups=groups, x_layout=LAST, y_layout=LAST, w_layout=w_layout)


def _checked(monkeypatch, g, shapes=None, seeds=(0, 1), tol=2e-5):
    """``g`` built with the stage traced: (its source, calls that read A in place), against the evaluator."""
    _trace_stage(monkeypatch)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    counter = _stage_counter(exe)
    for seed in seeds:
        ins = exe.random_inputs(seed, shapes)
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert out[k].shape == want[k].shape
            assert rel(out[k], want[k]) < tol, (k, rel(out[k], want[k]))
    return exe._run.source, counter.value


@pytest.mark.parametrize("c,co,n,hw,k,s,pad", [
    (16, 24, 1, (14, 14), 1, 1, 0),      # 196 pixels: a short last panel of 4 rows reads the panel before
    (19, 32, 2, (9, 13), 1, 1, 0),       # odd channels, batch 2
    (32, 48, 1, (12, 12), 1, 1, 0),      # whole panels
    (24, 16, 1, (11, 10), 3, 1, 1),      # 3x3 from the padded copy: panels that wrap an output row
    (12, 40, 2, (9, 17), 5, 1, 2),       # 5x5, padding 2, batch 2
    (16, 32, 1, (15, 15), 3, 2, 1),      # stride 2: rows two pixels apart
    (20, 24, 1, (14, 14), 1, 2, 0),      # a 1x1 downsample
    (64, 32, 1, (10, 9), 3, 1, 1),       # K 576: one K block under bound weights, blocks of KC else
])
@pytest.mark.parametrize("bound", [False, True])
def test_channels_last_conv_reads_its_pixels_in_place(monkeypatch, c, co, n, hw, k, s, pad, bound):
    rng = np.random.default_rng(7)
    x = Tensor.input("x", (n, hw[0], hw[1], c))
    w = (Tensor(rng.standard_normal((co, c, k, k)).astype(np.float32), name="w", role="param") if bound
         else Tensor.input("w", (co, c, k, k)))
    y = conv_last(x, w, Tensor.input("b", (co,)), stride=s, padding=pad)
    g = (y + Tensor.input("r", tuple(y.shape))).relu().graph("y")
    src, calls = _checked(monkeypatch, g)
    assert "kk_micro_astage_u_" in src
    assert calls > 0
    # a padded stage under pre-packed weights runs all of K in one block (the C tile in registers for it)
    assert ("kk_adir && kk_K > 0 ? kk_K : kk_kc" in src) == (bound and pad > 0)


def test_an_image_smaller_than_a_panel_is_packed(monkeypatch):
    """Four pixels on 6- or 12-row panels: no panel before the short one to borrow rows from, so the A panel
    is packed (the same results)."""
    x, w = Tensor.input("x", ("N", "H", "W", 24)), Tensor.input("w", (32, 24, 1, 1))
    g = conv_last(x, w).graph("y")          # sizes known at run time: the packed plan whatever the image
    src, calls = _checked(monkeypatch, g, {"N": 1, "H": 2, "W": 2})
    assert "kk_micro_astage_u_" in src and calls == 0
    assert _checked(monkeypatch, g, {"N": 2, "H": 5, "W": 7})[1] > 0


def test_a_wide_weight_side_packs_the_pixels(monkeypatch):
    """Past IN_PLACE_COLS output channels each A panel serves enough B panels to pay for its copy: a 1x1
    conv's pixels are read in place for 64 output channels and packed for 320 (the same results)."""
    rng = np.random.default_rng(2)
    x = Tensor.input("x", (1, 14, 14, 32))
    for co, in_place in ((64, True), (320, False)):
        w = Tensor(rng.standard_normal((co, 32, 1, 1)).astype(np.float32), name="w", role="param")
        src, calls = _checked(monkeypatch, conv_last(x, w).relu().graph("y"))
        assert "kk_micro_astage_u_" in src and (calls > 0) == in_place, (co, calls)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_channels_last_conv_with_threads(threads):
    """Threads split the pixels (the weights pre-packed: no barrier between K blocks) or the channels."""
    _in_threads("""
from tests.kernel.test_channels_last import conv_last
rng = np.random.default_rng(3)
x = Tensor.input("x", ("N", "H", "W", 20))
w = Tensor(rng.standard_normal((48, 20, 3, 3)).astype(np.float32), name="w", role="param")
g = conv_last(x, w, padding=1).relu().graph("y")
exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
assert "kk_micro_astage_u_" in exe._run.source
""", ({"N": 1, "H": 7, "W": 7}, {"N": 2, "H": 14, "W": 14}, {"N": 1, "H": 5, "W": 40}), threads)


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-march=x86-64",)])
def test_channels_last_micro_kernel_on_narrower_isas(monkeypatch, flags):
    """The channels-last A-stage micro-kernel pins its B vectors only where the ISA has registers that wide
    (``KK_PIN<bytes>``): built for SSE2 the same 8-lane code is GCC's emulated vectors and computes the same
    (the pin had been an impossible asm constraint there)."""
    from kumiko.runtime import cpu as cpu_rt
    monkeypatch.setattr(cpu_rt, "DEFAULT_FLAGS", tuple(cpu_rt.DEFAULT_FLAGS) + flags)
    rng = np.random.default_rng(6)
    x = Tensor.input("x", (1, 9, 11, 16))
    w = Tensor(rng.standard_normal((24, 16, 3, 3)).astype(np.float32), name="w", role="param")
    g = conv_last(x, w, padding=1).relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert "kk_micro_astage_u_" in exe._run.source and "KK_PIN" in exe._run.source
    ins = exe.random_inputs(0)
    assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


def test_pre_packed_weights_need_no_barrier_per_k_block():
    """The threads of a row split share nothing they pack when the weights are pre-packed: the K loop has no
    barrier (it has one where the threads pack B panels together)."""
    rng = np.random.default_rng(0)
    x = Tensor.input("x", (1, 28, 28, 64))
    bound = Tensor(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), name="w", role="param")
    k_barrier = "if (kk_mode == 0) {"         # the barrier of a row split between K blocks
    assert k_barrier not in kumiko.compile(conv_last(x, bound, padding=1).graph("y"), "cpu")._run.source
    a, b = Tensor.input("a", (300, 200)), Tensor.input("b", (200, 300))
    assert k_barrier in kumiko.compile((a @ b).graph("y"), "cpu")._run.source


@pytest.mark.parametrize("c,hw,s,n", [(144, (14, 14), 1, 1), (40, (15, 11), 2, 2), (24, (7, 9), 1, 3)])
def test_depthwise_channels_last_runs_along_the_channels(c, hw, s, n):
    """A depthwise conv with its weight ``[KH, KW, 1, C]`` (``w_layout``) vectorises along the channels
    (contiguous in the input, the weight and the output)."""
    rng = np.random.default_rng(1)
    x = Tensor.input("x", (n, hw[0], hw[1], c))
    w = Tensor(rng.standard_normal((3, 3, 1, c)).astype(np.float32), name="w", role="param")
    g = conv_last(x, w, Tensor.input("b", (c,)), stride=s, padding=1, groups=c, w_layout=LAST).clip(0.0, 6.0)
    exe, ref = kumiko.compile(g.graph("y"), "cpu"), kumiko.compile(g.graph("y"), "eval")
    assert "kv_fma" in exe._run.source
    for seed in (0, 1):
        ins = exe.random_inputs(seed)
        assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5
