"""The staged B operand (kumiko/kernel/stage.py): a zero-padded copy of a padded operand's source read in
place by the stage micro-kernel, against the Tiny IR evaluator. Rows long enough for every panel to be
one or two runs take the stage path; shorter rows (three runs in a panel) fall back to packing per block,
and the results must not tell the two apart. Strided pixels (known sizes, enough of them) take a stage
split into phase planes."""
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel.contract import ContractionLowering
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.kernel.stage import span
from kumiko.region.operands import stage_bounds
from kumiko.runtime.program import program_symbols
from kumiko.symbolic import Expr
from tests.kernel.test_contract_packing import SMALL, check, rel


def _lowering(g):
    exe = kumiko.compile(g, "cpu")
    prog = exe._run.program
    (r,) = prog.regions
    lo = CpuLowering(r, program_symbols(prog), "k")
    return ContractionLowering(lo, lo.facts.contraction, exe._run.plans[r.name])


def test_span_of_affine_index_parts():
    sizes = {"i": Expr.sym("H"), "k": Expr.lift(3)}
    lo, hi = span(Expr.sym("i") * 2 - Expr.sym("k") + 1, sizes, {"i", "k"})
    env = {"s_H": 5}
    assert eval(lo.replace("LL", ""), {}, env) == 1 - 2 and eval(hi.replace("LL", ""), {}, env) == 1 + 8
    assert span(Expr.sym("i") * Expr.sym("H"), sizes, {"i"}) is None     # a size times an axis: not affine


def test_padding_guards_are_stage_bounds_and_others_are_not():
    x, w = Tensor.input("x", ("N", 4, "H", "W")), Tensor.input("w", (6, 4, 3, 3))
    cl = _lowering(x.conv2d(w, padding=1).graph("y"))
    assert cl.stage is not None and len(stage_bounds(cl.b.table)) == 4
    # no guards: the source is its own stage, read in place (nothing copied)
    assert _lowering(x.conv2d(w, padding=0).graph("y")).stage.in_place
    assert not cl.stage.in_place
    # bounds, but pixels two elements apart: no panel is a run, so no stage (built for nothing)
    assert _lowering(x.conv2d(w, padding=1, stride=2).graph("y")).stage is None


def test_staged_source_says_so():
    x, w = Tensor.input("x", ("N", 4, "H", "W")), Tensor.input("w", (6, 4, 3, 3))
    src = check(x.conv2d(w, padding=1).relu().graph("y"), {"N": 2, "H": 5, "W": 70},
                want=["kk_micro_stage_", "kk_stg", "kk_dir"])
    assert "a padded stage read in place" in src and "kk_scratch(10" in src
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    gemm = check((a @ b).graph("y"), {"M": 9, "N": 40, "K": 7}, want=["kk_micro_stage_", "kk_nfull"])
    # a row-major B is read where it lies: no stage buffer, no fill
    assert "read in place from its source" in gemm and "kk_scratch(10" not in gemm and "memset(kk_sd" not in gemm


@pytest.mark.parametrize("co,hw", [(11, (5, 70)), (11, (6, 33)), (11, (4, 32)), (11, (3, 31)), (11, (2, 5)),
                                   (11, (9, 64)), (7, (4, 49)), (7, (3, 47)), (7, (5, 46))])
@pytest.mark.parametrize("blocks", [None, SMALL])
def test_staged_conv_matches_the_evaluator(co, hw, blocks):
    """11 output channels take 12 x 32 micro-tiles on AVX-512, 7 take 8 x 48: rows of 70, 64, 33, 32 and 31
    (NR - 1) for the first, 49 and 47 for the second: every panel is one or two runs, the stage; rows of 5
    (and 46 on 48-wide panels): more runs in a panel, the blocks pack instead."""
    x, w = Tensor.input("x", ("N", 5, "H", "W")), Tensor.input("w", (co, 5, 3, 3))
    g = (x.conv2d(w, padding=1) + Tensor.input("b", (co, 1, 1))).relu().graph("y")
    check(g, {"N": 3, "H": hw[0], "W": hw[1]}, blocks)


@pytest.mark.parametrize("hw", [(6, 70), (8, 56), (5, 41)])
@pytest.mark.parametrize("blocks", [None, SMALL, (8, 64, 4)])
def test_staged_conv_relu_maxpool(hw, blocks):
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (10, 3, 3, 3))
    g = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
    check(g, {"N": 2, "H": hw[0], "W": hw[1]}, blocks)


@pytest.mark.parametrize("stride,padding,dilation", [(1, (0, 2), 1), (1, 2, 2), (2, 1, 1), (1, (2, 0), 1)])
def test_staged_conv_padding_and_dilation_variants(stride, padding, dilation):
    """Asymmetric pads and a dilation (it spaces K, not the pixels) stage; stride 2 spaces the pixels, so
    that conv packs. All match the evaluator."""
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (4, 3, 3, 3))
    g = x.conv2d(w, stride=stride, padding=padding, dilation=dilation).graph("y")
    check(g, {"N": 2, "H": 7, "W": 75})
    check(g, {"N": 1, "H": 4, "W": 40}, SMALL)


def test_zero_padded_gemm_operand_is_staged():
    """Not a convolution: a GEMM whose B operand is zero-padded along N and K."""
    a, b = Tensor.input("a", ("M", 9)), Tensor.input("b", (6, "N0"))
    g = (a @ b.pad(((1, 2), (3, 5)))).graph("y")
    src = check(g, {"M": 11, "N0": 70})
    assert "kk_micro_stage_" in src


def test_half_precision_operand_is_not_staged():
    x, w = Tensor.input("x", ("N", 4, "H", "W"), dtype="fp16"), Tensor.input("w", (6, 4, 3, 3), dtype="fp16")
    src = check(x.conv2d(w, padding=1).graph("y"), {"N": 1, "H": 4, "W": 40}, tol=1e-2)
    assert "kk_micro_stage_" not in src


_THREADS = r"""
import numpy as np, kumiko
from kumiko import Tensor
x, w = Tensor.input("x", ("N", 6, "H", "W")), Tensor.input("w", (20, 6, 3, 3))
for g, shapes in ((x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y"), {"N": 3, "H": 6, "W": 66}),
                  (x.conv2d(w, padding=1).graph("y"), {"N": 1, "H": 9, "W": 45})):
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(1, shapes)
    out, want = exe(**ins), ref(**ins)
    for n in want:
        a, b = np.asarray(out[n], np.float64), np.asarray(want[n], np.float64)
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), shapes
print("OK")
"""


@pytest.mark.parametrize("threads", ["2", "3"])
def test_staged_conv_with_threads(threads):
    """The threads fill the stage together (a barrier before any panel reads it)."""
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_other_cache_blocks_keep_the_stage():
    """A plan with other cache blocks still stages (the stage does not depend on NC or KC)."""
    x, w = Tensor.input("x", ("N", 4, "H", "W")), Tensor.input("w", (6, 4, 3, 3))
    g = x.conv2d(w, padding=1).graph("y")
    exe = kumiko.compile(g, "cpu")
    plans = {k: replace(p, cache_block=(p.register_block.mr, p.register_block.nr * 2, 8))
             for k, p in exe._run.plans.items()}
    src = kumiko.compile(g, "cpu", plans=plans)._run.source
    assert "kk_micro_stage_" in src


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-march=x86-64",)])
def test_stage_micro_kernel_without_avx512(monkeypatch, flags):
    """The stage micro-kernel is GCC vector code (its blend is integer masks): built for narrower ISAs
    it computes the same."""
    from kumiko.runtime import cpu as cpu_rt
    monkeypatch.setattr(cpu_rt, "DEFAULT_FLAGS", tuple(cpu_rt.DEFAULT_FLAGS) + flags)
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (5, 3, 3, 3))
    src = check(x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y"), {"N": 2, "H": 6, "W": 50})
    assert "kk_micro_stage_" in src


def _trace_stage(monkeypatch) -> None:
    """Kernels built from here on count their staged blocks (-DKUMIKO_TRACE_STAGE)."""
    from kumiko.runtime import cpu as cpu_rt
    monkeypatch.setattr(cpu_rt, "DEFAULT_FLAGS", tuple(cpu_rt.DEFAULT_FLAGS) + ("-DKUMIKO_TRACE_STAGE",))


def _stage_counter(exe):
    """The traced program's count of staged blocks (``kk_stage_blocks``), set to 0."""
    import ctypes
    counter = ctypes.c_longlong.in_dll(exe._run.module.lib, "kk_stage_blocks")
    counter.value = 0
    return counter


def _staged_blocks(monkeypatch, g, shapes) -> int:
    """Blocks that read B from the stage in one run (the kernel built with -DKUMIKO_TRACE_STAGE)."""
    _trace_stage(monkeypatch)
    exe = kumiko.compile(g, "cpu")
    counter = _stage_counter(exe)
    ins = exe.random_inputs(0, shapes)
    out, ref = exe(**ins), kumiko.compile(g, "eval")(**ins)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-4, atol=1e-4)
    return counter.value


def test_long_rows_take_the_stage_and_short_rows_pack(monkeypatch):
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (5, 3, 3, 3))
    g = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
    assert _staged_blocks(monkeypatch, g, {"N": 2, "H": 6, "W": 50}) > 0
    assert _staged_blocks(monkeypatch, g, {"N": 2, "H": 6, "W": 8}) == 0      # rows of 8: packed
    g = x.conv2d(w, padding=1).graph("y")
    assert _staged_blocks(monkeypatch, g, {"N": 1, "H": 3, "W": 50}) > 0
    # a row of NR - 1 pixels is the shortest that every panel of the micro-tile's NR columns spans in two runs
    # (5 output channels take 8 x 48 tiles on AVX-512, 6 x 16 on AVX2)
    nr = _lowering(g).plan.register_block.nr
    assert _staged_blocks(monkeypatch, g, {"N": 1, "H": 4, "W": nr - 1}) > 0
    assert _staged_blocks(monkeypatch, g, {"N": 1, "H": 4, "W": nr - 2}) == 0


@pytest.mark.parametrize("blocks", [None, SMALL])
def test_staged_b_with_a_packed_per_k_block(monkeypatch, blocks):
    """M x K past what a thread keeps resident (64 x 1152 floats): A is packed per K block and the stage
    micro-kernel runs once per K block, adding into the C tile."""
    x, w = Tensor.input("x", ("N", 128, "H", "W")), Tensor.input("w", (64, 128, 3, 3))
    g = x.conv2d(w, padding=1).graph("y")
    check(g, {"N": 1, "H": 2, "W": 50}, blocks, tol=2e-5)
    assert _staged_blocks(monkeypatch, g, {"N": 1, "H": 2, "W": 50}) > 0


@pytest.mark.parametrize("c,co,hw", [(64, 64, (20, 50)), (40, 24, (9, 33)), (128, 20, (5, 47))])
def test_staged_b_in_k_blocks_that_fit_l1(monkeypatch, c, co, hw):
    """Bound weights (pre-packed A, resident for all of K) and the pixels read from the stage: K past what
    an in-place panel keeps in L1 (576, 360 and 1152 rows of NR lanes) is read in K blocks of equal size,
    the stage micro-kernel adding each into the C tile; against the evaluator, twice."""
    rng = np.random.default_rng(11)
    x = Tensor.input("x", (1, c, "H", "W"))
    w = Tensor(rng.standard_normal((co, c, 3, 3)).astype(np.float32) * 0.1, name="w", role="param")
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    g = x.conv2d(w, b, padding=1).relu().graph("y")
    shapes = {"H": hw[0], "W": hw[1]}
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert "kk_kl1" in exe._run.source and "kk_pka" in exe._run.source
    for seed in (0, 1):
        ins = exe.random_inputs(seed, shapes)
        out, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(out - want) <= 1e-5 * np.linalg.norm(want)
    assert _staged_blocks(monkeypatch, g, shapes) > 0


# the phased stage: a strided operand's pixels through phase planes (space-to-depth) -----------------------
def _conv_shapes(c, co, hw, k, stride, pad, dil, n):
    x, w = Tensor.input("x", (n, c, hw[0], hw[1])), Tensor.input("w", (co, c, k, k))
    return x.conv2d(w, stride=stride, padding=pad, dilation=dil) + Tensor.input("b", (co, 1, 1))


@pytest.mark.parametrize("c,co,hw,k,stride,pad,dil,n", [
    (3, 11, (61, 63), 5, 2, 1, 1, 1),       # 30 x 30 rows, odd source width: phases of unequal length
    (3, 16, (36, 130), 7, 2, 3, 1, 2),      # a ResNet-like stem, batch 2
    (4, 7, (80, 83), 3, 3, 2, 1, 1),        # stride 3
    (2, 9, (40, 261), 7, 4, (3, 1), 1, 1),  # stride 4, pads 3 (H) and 1 (W)
    (5, 6, (20, 134), 3, 2, 2, 2, 3),       # stride 2 with dilation 2 (K steps two phase-rows), batch 3
    (8, 12, (64, 65), 1, 2, 0, 1, 1),       # 1x1 stride 2: no guards, the stage only reorders
    (3, 10, (20, 131), 3, (1, 2), 1, 1, 2),  # only the columns strided: rows a phase-plane apart
    (3, 10, (40, 70), 3, (2, 1), 1, 1, 1),   # only the rows strided: unit columns, the rows' dimension split
])
def test_phased_stage_matches_the_evaluator(monkeypatch, c, co, hw, k, stride, pad, dil, n):
    """Stride 2 to 4 with at least MIN_PHASED_ROWS output pixels (known sizes): the pixels go to the lanes,
    read in place from a stage whose strided dimensions are split into phases; with output rows of at least
    NR - 1 pixels (63 and more here) the blocks read it directly."""
    g = _conv_shapes(c, co, hw, k, stride, pad, dil, n).relu().graph("y")
    src = check(g, want=["kk_sps", "kk_micro_stage_"])
    assert src.count("kk_sps") > 2
    assert _staged_blocks(monkeypatch, g, {}) > 0
    check(g, blocks=SMALL)


def test_few_strided_rows_stay_packed_on_the_a_side():
    """Below MIN_PHASED_ROWS output pixels (14 x 14) a strided conv keeps its pixels on the A side, packed;
    with symbolic sizes too (the row count is unknown when compiling)."""
    g = _conv_shapes(16, 32, (28, 28), 3, 2, 1, 1, 1).graph("y")
    assert _lowering(g).stage is None and _lowering(g).swapped is False
    x, w = Tensor.input("x", ("N", 4, "H", "W")), Tensor.input("w", (6, 4, 3, 3))
    assert _lowering(x.conv2d(w, padding=1, stride=2).graph("y")).stage is None


def test_phased_stage_with_constant_weights_and_threads():
    """Weights bound as constants (pre-packed A, one K block) beside the phased stage, on 1 to 3 threads."""
    code = r"""
import numpy as np, kumiko
from kumiko import Tensor
rng = np.random.default_rng(1)
x = Tensor.input("x", (1, 3, 65, 67))
w = Tensor(rng.standard_normal((24, 3, 7, 7)).astype(np.float32), name="w", role="param")
b = Tensor(rng.standard_normal(24).astype(np.float32), name="b", role="param")
g = x.conv2d(w, b, stride=2, padding=3).relu().graph("y")
exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
assert "kk_sps" in exe._run.source
X = rng.standard_normal((1, 3, 65, 67)).astype(np.float32)
for _ in range(2):
    a, e = np.asarray(exe(x=X)["y"], np.float64), np.asarray(ref(x=X)["y"], np.float64)
    assert np.linalg.norm(a - e) <= 1e-5 * np.linalg.norm(e)
print("OK")
"""
    for threads in ("1", "2", "3"):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


# B read in place from its own source: an operand with neither guards nor phases ---------------------------
def _conv1x1(c, co, n=1, const=False, seed=3):
    rng = np.random.default_rng(seed)
    x = Tensor.input("x", (n, c, "H", "W"))
    w = (Tensor(rng.standard_normal((co, c, 1, 1)).astype(np.float32), name="w", role="param") if const else
         Tensor.input("w", (co, c, 1, 1)))
    return (x.conv2d(w) + Tensor.input("b", (co, 1, 1))).relu().graph("y")


@pytest.mark.parametrize("c,co,n,hw", [
    (19, 11, 1, (7, 7)),      # 49 pixels: full panels and a short last one (packed)
    (19, 11, 2, (4, 24)),     # 96 pixels: every panel full, batch 2
    (40, 24, 3, (5, 13)),     # batch 3, 65 pixels
    (5, 7, 1, (1, 47)),       # one row of NR - 1 pixels: the only panel is short
    (300, 20, 1, (9, 9)),     # K past KC: A resident, several K blocks (the short panel packed per block)
])
@pytest.mark.parametrize("blocks", [None, SMALL])
def test_in_place_conv1x1_matches_the_evaluator(monkeypatch, c, co, n, hw, blocks):
    """A 1x1 convolution's pixels are consecutive rows of its source: the stage micro-kernel reads them
    there; a last panel shorter than NR (nothing behind the source's end to over-read) is packed."""
    g = _conv1x1(c, co, n)
    src = check(g, {"H": hw[0], "W": hw[1]}, blocks, want=["read in place from its source", "kk_nfull"])
    assert "kk_scratch(10" not in src
    full = hw[0] * hw[1] >= _lowering(g).plan.register_block.nr
    assert (_staged_blocks(monkeypatch, g, {"H": hw[0], "W": hw[1]}) > 0) == full


def test_in_place_b_with_constant_weights():
    """Weights bound once (pre-packed A, one K block) and the pixels read in place, twice in a row."""
    g = _conv1x1(96, 24, 1, const=True)
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert "read in place from its source" in exe._run.source and "kk_pka" in exe._run.source
    for seed in (0, 1):
        ins = exe.random_inputs(seed, {"H": 14, "W": 14})
        out, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(out - want) <= 1e-5 * np.linalg.norm(want)


def test_in_place_needs_few_rows(monkeypatch):
    """Past IN_PLACE_ROWS A rows each B panel is re-read too often for strided rows to pay: packed as before
    (same results). Rows 1 KiB apart (a 16 x 16 image) are read in place."""
    from kumiko.kernel.stage import IN_PLACE_ROWS
    assert _staged_blocks(monkeypatch, _conv1x1(8, 24), {"H": 10, "W": 30}) > 0
    assert _staged_blocks(monkeypatch, _conv1x1(8, IN_PLACE_ROWS + 1), {"H": 10, "W": 30}) == 0
    assert _staged_blocks(monkeypatch, _conv1x1(8, 24), {"H": 16, "W": 16}) > 0


def _in_threads(setup: str, shapes: tuple, threads: str) -> None:
    """Run ``setup`` (which makes ``exe`` and ``ref``) in a fresh process on ``threads`` OpenMP threads and
    compare the two at each of ``shapes``."""
    code = ("import numpy as np, kumiko\nfrom dataclasses import replace\nfrom kumiko import Tensor\n" + setup +
            f"\nfor shapes in {shapes!r}:\n"
            "    ins = exe.random_inputs(2, shapes)\n"
            "    a, b = np.asarray(exe(**ins)['y'], np.float64), np.asarray(ref(**ins)['y'], np.float64)\n"
            "    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), shapes\n"
            "print('OK')\n")
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("threads", ["2", "3"])
def test_in_place_b_with_threads(threads):
    """Threads splitting M share the block's packed short panel (a barrier before it is read)."""
    _in_threads("""
x, w = Tensor.input("x", ("N", 37, "H", "W")), Tensor.input("w", (30, 37, 1, 1))
g = x.conv2d(w).relu().graph("y")
exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
assert "read in place from its source" in exe._run.source
""", ({"N": 1, "H": 7, "W": 29}, {"N": 3, "H": 5, "W": 50}, {"N": 1, "H": 33, "W": 31}), threads)


# A read from a stage: the pixels of a padded conv on the A side (channels in the lanes) ----------------------
def _channels_in_lanes(g):
    """``g`` compiled with every packed plan asking for the other side in the lanes (the chooser's pick for
    a 7x7 or 14x14 conv with constant weights)."""
    exe = kumiko.compile(g, "cpu")
    plans = {n: replace(p, vectorize=(("axis", "n"), ("width", p.vector_width)))
             for n, p in exe._run.plans.items() if p.algo == "packed"}
    return kumiko.compile(g, "cpu", plans=plans)


def _a_staged(monkeypatch, g, shapes, blocks=None) -> int:
    """Calls (counted once each) whose A panels were read from the stage, checked against the evaluator."""
    _trace_stage(monkeypatch)
    exe = _channels_in_lanes(g)
    if blocks is not None:
        exe = kumiko.compile(g, "cpu", plans={n: replace(p, cache_block=(p.register_block.mr, p.register_block.nr,
                                                                          blocks))
                                              for n, p in exe._run.plans.items()})
    assert "kk_micro_astage_" in exe._run.source
    counter = _stage_counter(exe)
    ref = kumiko.compile(g, "eval")
    for seed in (0, 1):
        ins = exe.random_inputs(seed, shapes)
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert rel(out[k], want[k]) < 2e-5, (k, rel(out[k], want[k]))
    return counter.value


@pytest.mark.parametrize("c,co,n,hw,pad,dil", [
    (19, 32, 1, (14, 14), 1, 1),     # 196 pixels on 14-row tiles, rows of 14 in a stage 16 wide: two runs
    (24, 64, 1, (7, 7), 1, 1),       # 7 x 64 tiles, one run a panel
    (8, 48, 2, (9, 13), 1, 1),       # batch 2, odd sizes, a short last panel reading the stage's slack
    (5, 16, 3, (11, 20), 2, 2),      # dilation 2, padding 2, batch 3
    (6, 32, 1, (10, 31), (0, 2), 1),  # padding along W only
])
def test_a_stage_conv_matches_the_evaluator(monkeypatch, c, co, n, hw, pad, dil):
    """The A-stage micro-kernel broadcasts each row from the padded copy of the input where it lies; the
    results are those of the evaluator (bias + residual + ReLU in the transposed epilogue)."""
    x, w = Tensor.input("x", (n, c, hw[0], hw[1])), Tensor.input("w", (co, c, 3, 3))
    y = x.conv2d(w, padding=pad, dilation=dil)
    g = (y + Tensor.input("r", tuple(y.shape)) + Tensor.input("b", (co, 1, 1))).relu().graph("y")
    assert _a_staged(monkeypatch, g, None) > 0
    assert _a_staged(monkeypatch, g, None, blocks=8) > 0          # K in blocks of 8: the panels per block


def test_a_stage_falls_back_to_packing_for_short_rows(monkeypatch):
    """Output rows of 3 pixels: an 8- or 12-row panel spans three or more runs of the stage, so the A panels
    are packed as before (the same results)."""
    x, w = Tensor.input("x", (1, 7, 9, 3)), Tensor.input("w", (32, 7, 3, 3))
    g = x.conv2d(w, padding=1).graph("y")
    (plan,) = _channels_in_lanes(g)._run.plans.values()
    if plan.register_block.mr <= 2 * 3:
        pytest.skip(f"this machine's micro-tile ({plan.register_block}) spans at most two rows: it stages them")
    assert _a_staged(monkeypatch, g, None) == 0


def test_strided_pixels_on_the_a_side_stay_packed():
    """Phase planes on the A side ran 1.15-1.95x slower than packing (ResNet-50's stride-2 convs to 14x14
    and 7x7): only a padding stage is read on the A side."""
    x, w = Tensor.input("x", (1, 16, 14, 14)), Tensor.input("w", (32, 16, 3, 3))
    src = check(x.conv2d(w, padding=1, stride=2).graph("y"))
    assert "kk_micro_astage_" not in src


@pytest.mark.parametrize("threads", ["2", "3"])
def test_a_stage_with_constant_weights_and_threads(threads):
    """Pre-packed weights in the lanes, the threads fill the A stage together (a barrier before any panel
    reads it) and each checks the panels' runs itself."""
    _in_threads("""
rng = np.random.default_rng(3)
x = Tensor.input("x", ("N", 20, "H", "W"))
w = Tensor(rng.standard_normal((48, 20, 3, 3)).astype(np.float32), name="w", role="param")
g = x.conv2d(w, padding=1).relu().graph("y")
exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
plans = {n: replace(p, vectorize=(("axis", "n"), ("width", p.vector_width))) for n, p in exe._run.plans.items()}
exe = kumiko.compile(g, "cpu", plans=plans)
assert "kk_micro_astage_" in exe._run.source
""", ({"N": 1, "H": 7, "W": 7}, {"N": 2, "H": 14, "W": 14}, {"N": 1, "H": 5, "W": 40}), threads)


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-march=x86-64",)])
def test_a_stage_micro_kernel_without_avx512(monkeypatch, flags):
    """The A-stage micro-kernel is GCC vector code: built for narrower ISAs it computes the same."""
    from kumiko.runtime import cpu as cpu_rt
    monkeypatch.setattr(cpu_rt, "DEFAULT_FLAGS", tuple(cpu_rt.DEFAULT_FLAGS) + flags)
    x, w = Tensor.input("x", (2, 6, 7, 9)), Tensor.input("w", (24, 6, 3, 3))
    g = x.conv2d(w, padding=1).relu().graph("y")
    exe, ref = _channels_in_lanes(g), kumiko.compile(g, "eval")
    assert "kk_micro_astage_" in exe._run.source
    ins = exe.random_inputs(0)
    assert rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


@pytest.mark.parametrize("co,n,hw,read", [
    (48, 1, (7, 7), True),      # 49 pixels on 7-row tiles: whole panels, read where they lie
    (32, 2, (7, 7), True),      # batch 2 (98 rows on 14-row tiles): a panel's rows run across the batch boundary
    (32, 1, (1, 43), False),    # 43 pixels on 12-row tiles: a short last panel would read past the end
    (272, 1, (7, 7), False),    # past IN_PLACE_COLS channels each A panel is re-read too often: packed
])
def test_unpadded_a_side_in_place(monkeypatch, co, n, hw, read):
    """A 1x1 conv's pixels on the A side (its channels in the lanes) are read from the source itself when
    the rows fill whole MR panels and the B side is narrow (``IN_PLACE_COLS``); else packed. The same
    results either way."""
    from kumiko.kernel.stage import IN_PLACE_COLS
    assert co <= IN_PLACE_COLS or not read
    rng = np.random.default_rng(7)
    x = Tensor.input("x", (n, 40, hw[0], hw[1]))
    w = Tensor(rng.standard_normal((co, 40, 1, 1)).astype(np.float32), name="w", role="param")
    g = (x.conv2d(w) + Tensor.input("b", (co, 1, 1))).relu().graph("y")
    (plan,) = _channels_in_lanes(g)._run.plans.values()
    if ((n * hw[0] * hw[1]) % plan.register_block.mr == 0) != (read or co > IN_PLACE_COLS):
        pytest.skip(f"this machine's micro-tile ({plan.register_block}) does not make the case")
    assert (_a_staged(monkeypatch, g, None) > 0) == read


def test_a_stage_packs_past_the_panels_a_thread_checks(monkeypatch):
    """More A panels than A_CHECK_PANELS (their run tables live on each thread's stack): packed, the same
    results."""
    from kumiko.kernel import stage
    monkeypatch.setattr(stage, "A_CHECK_PANELS", 3)
    x, w = Tensor.input("x", (1, 6, 14, 14)), Tensor.input("w", (32, 6, 3, 3))
    g = x.conv2d(w, padding=1).relu().graph("y")
    assert _a_staged(monkeypatch, g, None) == 0
    monkeypatch.setattr(stage, "A_CHECK_PANELS", 8192)
    assert _a_staged(monkeypatch, g, None) > 0
