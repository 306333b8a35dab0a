"""Winograd F(2x2, 3x3) and F(4x4, 3x3) for 3x3 stride-1 convolutions on the CPU (``kumiko.plan.winograd``,
``kumiko.kernel.winograd``): which regions the chooser gives it (read off the region: a channels-last conv's
stage, stride 1, dilation 1, even output rows and columns, bound weights, enough tiles), results against the
evaluator (bias, residual, ReLU in the epilogue; output channels that are not whole panels; batches; blocks
split over channels; a network whose activations the layout pass keeps channels-last), every block taken
once on 1-3 threads, the weights transformed once, a saved Executable, and the plan's validation."""
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.plan.winograd import Geometry, winograd_blocks, winograd_tile

rng = np.random.default_rng(3)


def param(shape, name):
    return Tensor((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name=name,
                  role="param")


def conv_nhwc(x, w, stride=1, dilation=1, padding=1):
    return Tensor._record("Conv2D", (x, w), stride=[stride] * 2, padding=[padding] * 2, dilation=[dilation] * 2,
                          groups=1, x_layout="channels_last", y_layout="channels_last")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def algos(exe):
    return sorted(p.algo for p in exe._run.plans.values())


def inputs(exe, seed=0):
    """Fresh random data inputs (the bound weights stay as bound)."""
    return {k: v for k, v in exe.random_inputs(seed).items() if k not in exe.params}


def check(g, tol=3e-6, seeds=(0, 1)):
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    for seed in seeds:
        ins = inputs(exe, seed)
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert out[k].shape == want[k].shape and rel(out[k], want[k]) < tol, (k, rel(out[k], want[k]))
    return exe


def block(h, c_in, c_out, batch=1, residual=True, bias=True):
    x = Tensor.input("x", (batch, h, h, c_in))
    y = conv_nhwc(x, param((c_out, c_in, 3, 3), "w"))
    if bias:
        y = y + param((c_out,), "b")
    if residual:
        y = y + Tensor.input("r", (batch, h, h, c_out))
    return y.relu().graph("y")


def tile(exe):
    (plan,) = exe._run.plans.values()
    return plan.get("algo_choice", "tile", 2)


@pytest.mark.parametrize("h,c_in,c_out,batch,m", [
    (28, 16, 24, 1, 4),     # 24 output channels: a short last panel of NR; rows a multiple of 4: F(4x4)
    (14, 32, 48, 2, 2),     # two images: tile rows run across them; 14 rows: F(2x2)
    (16, 32, 40, 1, 4),     # 4 tiles a row: blocks of tile rows that leave a short last one
    (18, 16, 16, 1, 2),     # 81 tiles of 2x2
])
def test_matches_the_evaluator(h, c_in, c_out, batch, m):
    exe = check(block(h, c_in, c_out, batch))
    assert algos(exe) == ["winograd"] and tile(exe) == m
    assert f"Winograd F({m}x{m}, 3x3) contraction" in exe._run.source


@pytest.mark.parametrize("h,c,m", [(28, 16, 4), (14, 32, 2)])
def test_symbolic_batch(h, c, m):
    """A batch of any size (a dynamic-batch export): the plan is made for one image and the kernel counts the
    tile rows of all images at run time; against the evaluator at 1, 2 and 3 images from one build."""
    x = Tensor.input("x", ("N", h, h, c))
    g = (conv_nhwc(x, param((c, c, 3, 3), "w")) + param((c,), "b")).relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert algos(exe) == ["winograd"] and tile(exe) == m
    for n in (1, 2, 3):
        ins = {"x": rng.standard_normal((n, h, h, c)).astype(np.float32)}
        out, want = exe(**ins)["y"], ref(**ins)["y"]
        assert out.shape == want.shape and rel(out, want) < 3e-6, (n, rel(out, want))


@pytest.mark.parametrize("what,graph", [
    # no padding: the source is its own stage, whatever the packed path's rules for reading it in place (more
    # than 256 columns) say
    ("unpadded, 320 output channels", lambda: conv_nhwc(Tensor.input("x", (1, 18, 18, 16)),
                                                        param((320, 16, 3, 3), "w"), padding=0).graph("y")),
    # output rows 4 pixels wide, shorter than a micro-tile's rows: the padded stage all the same
    ("4 columns", lambda: conv_nhwc(Tensor.input("x", (1, 98, 4, 16)), param((16, 16, 3, 3), "w")).graph("y")),
    ("pad 2, 20x20 out", lambda: conv_nhwc(Tensor.input("x", (1, 18, 18, 16)), param((16, 16, 3, 3), "w"),
                                           padding=2).graph("y")),
])
def test_edges(what, graph):
    exe = check(graph())
    assert algos(exe) == ["winograd"], what


@pytest.mark.parametrize("m", [2, 4])
def test_either_tile_matches(m):
    """A plan may take F(2x2) or F(4x4) where the sizes allow both; every block shape gives the same result."""
    g = block(28, 32, 48)
    exe = kumiko.compile(g, "cpu")
    ins = inputs(exe)
    want = kumiko.compile(g, "eval")(**ins)["y"]
    (name, plan), = exe._run.plans.items()
    mr, nr = plan.register_block
    for tr, nc in ((1, nr), (2, 3 * nr), (28 // m, 48)):
        p = replace(plan, algo_choice=(("contraction", "winograd"), ("tile", m)), cache_block=(tr, nc, 32))
        got = kumiko.compile(g, "cpu", plans={name: p})
        assert f"Winograd F({m}x{m}, 3x3)" in got._run.source
        assert rel(got(**ins)["y"], want) < 3e-6, (m, tr, nc)


def test_blocks_split_over_channels_match():
    """256 -> 256 at 14x14: the chooser splits the output channels between blocks (the weights, 4 MiB
    transformed, streamed once); every pairing of tile rows and channel ranges gives the same result."""
    g = block(14, 256, 256, residual=False)
    exe = check(g, seeds=(0,))
    (plan,) = exe._run.plans.values()
    assert plan.algo == "winograd" and plan.cache_block[1] < 256
    ins = inputs(exe)
    want = exe(**ins)["y"]
    mr, nr = plan.register_block
    for tr, nc in ((1, nr), (3, 2 * nr), (7, 256)):
        p = replace(plan, cache_block=(tr, nc, 256))
        got = kumiko.compile(g, "cpu", plans={k: p for k in exe._run.plans})(**ins)["y"]
        assert rel(got, want) < 1e-6, (tr, nc)


@pytest.mark.parametrize("what,graph", [
    ("odd rows and columns", lambda: block(27, 16, 16)),
    ("7x7: too few tiles", lambda: block(8, 32, 32)),
    ("stride 2", lambda: conv_nhwc(Tensor.input("x", (1, 28, 28, 16)), param((16, 16, 3, 3), "w"),
                                   stride=2).graph("y")),
    ("dilation 2", lambda: conv_nhwc(Tensor.input("x", (1, 28, 28, 16)), param((16, 16, 3, 3), "w"), dilation=2,
                                     padding=2).graph("y")),
    ("5x5 kernel", lambda: conv_nhwc(Tensor.input("x", (1, 28, 28, 16)), param((16, 16, 5, 5), "w"),
                                     padding=2).graph("y")),
    ("weights an input", lambda: conv_nhwc(Tensor.input("x", (1, 28, 28, 16)),
                                           Tensor.input("w", (16, 16, 3, 3))).graph("y")),
    ("channels not whole vectors", lambda: block(28, 12, 16)),
])
def test_other_convolutions_stay_packed(what, graph):
    exe = check(graph())
    assert "winograd" not in algos(exe), what


def test_a_network_keeps_its_activations_channels_last():
    """NCHW in and out: the layout pass keeps the activations channels-last between the convs, so the
    middle ones (channels-last in and out) run as Winograd, the first (an NCHW input) packed."""
    x = Tensor.input("x", (1, 32, 14, 14))
    y = x.conv2d(param((32, 32, 3, 3), "w0"), param((32,), "b0"), padding=1).relu()
    z = (y.conv2d(param((32, 32, 3, 3), "w1"), param((32,), "b1"), padding=1) + y).relu()
    z = z.conv2d(param((32, 32, 3, 3), "w2"), padding=1).relu()
    exe = check(z.graph("out"))
    assert "winograd" in algos(exe) and "packed" in algos(exe)


def test_weights_transformed_once_and_saved(tmp_path):
    """The transformed weights are the constant pool's: packed once for any number of calls, and a saved
    Executable gives the same outputs in a new process."""
    g = block(14, 32, 32)
    exe = kumiko.compile(g, "cpu")
    ins = inputs(exe)
    runner = exe._run.runner
    packs = sum(len(st.packs) for st in runner.steps)
    assert packs == 1
    first = exe(**ins)["y"]
    for _ in range(3):
        np.testing.assert_array_equal(exe(**ins)["y"], first)
    assert runner.pack_calls == packs          # transformed on the first call only
    path = tmp_path / "w.kumiko"
    exe.save(path)
    np.save(tmp_path / "x.npy", ins["x"])
    np.save(tmp_path / "r.npy", ins["r"])
    x, r = str(tmp_path / "x.npy"), str(tmp_path / "r.npy")
    code = (f"import kumiko, numpy as np; e = kumiko.load_executable({str(path)!r}); "
            f"print(e(x=np.load({x!r}), r=np.load({r!r}))['y'].tobytes().hex())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert bytes.fromhex(r.stdout.strip()) == first.tobytes()


_DEALT = r'''
import ctypes, json, sys, numpy as np, kumiko
sys.path.insert(0, sys.argv[1])
from kumiko.runtime import cpu as cpu_rt
cpu_rt.DEFAULT_FLAGS = tuple(cpu_rt.DEFAULT_FLAGS) + ("-DKUMIKO_TRACE_STAGE",)
from test_winograd import block
out = {}
for name, g in (("28", block(28, 16, 24)), ("14x256", block(14, 256, 256, residual=False))):
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    counter = ctypes.c_longlong.in_dll(exe._run.module.lib, "kk_dealt")
    (plan,) = exe._run.plans.values()
    ins = {k: v for k, v in exe.random_inputs(0).items() if k not in exe.params}
    counter.value = 0
    a, b = np.asarray(exe(**ins)["y"], np.float64), np.asarray(ref(**ins)["y"], np.float64)
    assert np.linalg.norm(a - b) <= 3e-6 * np.linalg.norm(b), name
    out[name] = {"dealt": counter.value, "algo": plan.algo, "tr": plan.cache_block[0], "nc": plan.cache_block[1],
                 "m": plan.get("algo_choice", "tile", 2)}
print(json.dumps(out))
'''


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_threads_take_every_block_once(threads):
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _DEALT, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for (h, n), case in ((28, 24), got["28"]), ((14, 256), got["14x256"]):
        assert case["algo"] == "winograd"
        blocks = -(-(h // case["m"]) // case["tr"]) * -(-n // case["nc"])
        assert case["dealt"] == (0 if threads == "1" else blocks), (case, blocks)


def test_plan_validation():
    """A winograd plan for a region it cannot compute, or with blocks that are not whole panels, is E1801."""
    g = (Tensor.input("x", (64, 64)) @ param((64, 64), "w")).graph("y")
    exe = kumiko.compile(g, "cpu")
    (name, plan), = exe._run.plans.items()
    bad = replace(plan, algo_choice=(("contraction", "winograd"),))
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "cpu", plans={name: bad})
    assert e.value.code == "E1801" and "3x3 convolution" in e.value.why and e.value.suggestion
    g = block(14, 32, 32)
    exe = kumiko.compile(g, "cpu")
    (name, plan), = exe._run.plans.items()
    mr, nr = plan.register_block
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "cpu", plans={name: replace(plan, cache_block=(2, nr + 1, 32))})
    assert e.value.code == "E1801" and "multiple of nr" in e.value.why
    for m in (3, 4):       # no F(3x3) is built; 14 rows are no whole tiles of 4
        bad = replace(plan, algo_choice=(("contraction", "winograd"), ("tile", m)))
        with pytest.raises(KumikoError) as e:
            kumiko.compile(g, "cpu", plans={name: bad})
        assert e.value.code == "E1801" and f"tile {m}" in e.value.why and e.value.suggestion


def test_blocks_model():
    """The chooser's blocks: small weights (64 -> 64 at 56x56) in blocks of few tile rows with all channels
    or half; 4 MiB of them (256 -> 256 at 14x14) streamed once: all tile rows, the channels split in two."""
    def g(h, c):
        return Geometry("oh", "ow", "kh", "kw", "ci", 1, 2, h, h, c, c, h)
    tr, nc = winograd_blocks(g(56, 64), 6, 16, 2)
    assert tr <= 4 and nc >= 32
    assert winograd_blocks(g(14, 256), 6, 16, 2) == (7, 128)
    assert winograd_tile(g(56, 64), 16) == 4 and winograd_tile(g(14, 256), 16) == 2
    assert winograd_tile(g(8, 64), 16) is None                  # 16 tiles: the direct kernel
    assert winograd_tile(g(14, 512), 16) is None                # 16 MiB of transformed weights
