"""The Plan record (JSON, hashing), its validation against region and machine, the cost model's
candidates and pruning, and autotuning with its on-disk cache."""
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.plan import Plan, make_plan
from kumiko.plan import tune as tuning
from kumiko.plan.choose import choose_plan, micro_tile
from kumiko.plan.cost import Machine, candidates, estimate, flops
from kumiko.plan.validate import validate
from kumiko.region import form_regions

AVX2 = {"vector_width_f32": 8, "cores": 2}
EX = Path(__file__).parents[2] / "examples"


def gemm_region():
    g = kumiko.load(EX / "gemm_bias_relu.json")
    return g, form_regions(g.tiny).regions[0]


def test_plan_json_round_trip_and_hash():
    _, r = gemm_region()
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    again = Plan.from_json(p.to_json())
    assert again == p and hash(again) == hash(p)
    assert "async" not in p.to_json() and p.to_json()["vectorize"] == {"axis": "n", "width": 8}
    assert p.algo == "packed" and p.register_block == (6, 16) and p.vector_width == 8
    assert p.register_block.nr == 16 and p.cache_block.kc == 256
    assert p.epilogue == ("add", "relu")
    with pytest.raises(KumikoError):
        Plan.from_json({**p.to_json(), "bogus": 1})


def test_a_cpu_plan_names_its_blocks_and_has_no_gpu_fields():
    """A packed CPU plan's JSON: cache blocks {mc, nc, kc} and register block {mr, nr} by name; none of a
    GPU plan's fields (tile, warp_tile, stages, async, ...); a field of the GPU's is E1801 naming it."""
    _, r = gemm_region()
    d = choose_plan(r, ("K", "M", "N"), AVX2).to_json()
    assert d["register_block"] == {"mr": 6, "nr": 16} and d["cache_block"] == {"mc": 120, "nc": 2048, "kc": 256}
    assert not {"tile", "micro", "warp_tile", "stages", "async", "barrier_model", "threads"} & set(d)
    assert d["layout_hints"] == {}
    for extra, name in (({"tile": [48, 64, 32]}, "tile"), ({"stages": 3}, "stages")):
        with pytest.raises(KumikoError) as e:
            Plan.from_json({**d, **extra})
        assert e.value.code == "E1801" and name in e.value.why and "cache_block" in e.value.suggestion
    with pytest.raises(KumikoError) as e:
        Plan.from_json({**d, "layout_hints": {"note": "packed"}})
    assert e.value.code == "E1801" and "layout_hints.note" in e.value.why
    with pytest.raises(KumikoError) as e:
        Plan.from_json({**d, "cache_block": {"mc": 120, "nc": 2048}})
    assert e.value.code == "E1801" and "cache_block" in e.value.why
    p = Plan.from_json({**d, "register_block": [4, 24]})               # a list of the block's numbers in order
    assert p.register_block == (4, 24) and p.register_block.mr == 4


def test_a_format_1_plan_is_e1801_with_what_to_do():
    """A plan written before the blocks were named (``tile``/``micro`` on the CPU) is refused with how to
    get one of this format, not a crash or a silently different plan."""
    _, r = gemm_region()
    d = choose_plan(r, ("K", "M", "N"), AVX2).to_json()
    old = {k: v for k, v in d.items() if k not in ("cache_block", "register_block")}
    old.update(tile=[120, 2048, 256], micro=[6, 16], warp_tile=None, stages=1, threads=0)
    with pytest.raises(KumikoError) as e:
        Plan.from_json(old, at="plan of k_C2 in old.json")
    err = e.value
    assert err.code == "E1801" and err.at == "plan of k_C2 in old.json" and "format 1" in err.why
    assert "cache_block" in err.why and "--dump plan" in err.suggestion


def test_non_contraction_region_gets_loops():
    x = Tensor.input("x", (4, 5))
    r = form_regions(x.softmax().graph("y").tiny).regions[0]
    assert choose_plan(r, (), AVX2).algo == "loops"


@pytest.mark.parametrize("bad,why", [
    (dict(arch="sm80"), "not a CPU arch"),
    (dict(vectorize=(("width", 16),)), "exceeds"),
    (dict(cache_block=(100, 2048, 256)), "multiples"),
    (dict(register_block=(6, 12)), "whole number"),
    (dict(register_block=None), "needs register_block"),
    (dict(warp_tile="32x32"), "warp_tile"),
    (dict(vectorize=(("axis", "k"), ("width", 8))), "vectorize.axis"),
])
def test_validation_diagnostics(bad, why):
    _, r = gemm_region()
    p = replace(choose_plan(r, ("K", "M", "N"), AVX2), **bad)
    with pytest.raises(KumikoError) as e:
        validate(p, r, ("K", "M", "N"), AVX2)
    assert e.value.code == "E1801" and why in e.value.why


def test_packed_plan_on_a_non_contraction_is_refused():
    x = Tensor.input("x", (4, 5))
    r = form_regions(x.softmax().graph("y").tiny).regions[0]
    p = make_plan("cpu-avx2", algo_choice={"contraction": "packed"}, register_block=(6, 16),
                  cache_block={"mc": 120, "nc": 1024, "kc": 256},
                  vectorize={"width": 8})
    with pytest.raises(KumikoError) as e:
        validate(p, r, (), AVX2)
    assert "no" in e.value.why


def test_user_plan_is_used_and_checked():
    g, r = gemm_region()
    p = replace(choose_plan(r, ("K", "M", "N"), AVX2), cache_block=(48, 64, 32))
    exe = kumiko.compile(g, "cpu", plans={r.name: p})
    assert exe._run.plans[r.name].cache_block == (48, 64, 32)
    ins = exe.random_inputs(2, {"M": 100, "N": 70, "K": 45})
    np.testing.assert_allclose(exe(**ins)["C2"], kumiko.compile(g, "eval")(**ins)["C2"], rtol=1e-5, atol=1e-5)
    with pytest.raises(KumikoError):
        kumiko.compile(g, "cpu", plans={"nope": p})


def test_cost_model_counts_and_prunes():
    _, r = gemm_region()
    env = {"M": 64, "N": 32, "K": 16}
    assert flops(r, env) >= 2 * 64 * 32 * 16          # multiply-add plus the epilogue
    m = Machine(l1_bytes=32 * 1024, l2_bytes=512 * 1024)
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    cands = candidates(p, m)
    assert 10 <= len(cands) <= 20 and cands[0] == p
    for c in cands:
        mc, _, kc = c.cache_block
        assert mc * kc * 4 <= 0.8 * m.l2_bytes or c == p
        assert kc * 16 * 4 <= 0.8 * m.l1_bytes
    e = estimate(r, p, env, m, (64, 32, 16))
    assert e.seconds > 0 and e.flops == flops(r, env)


def test_tune_picks_the_fastest_scores_failures_inf_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    g, r = gemm_region()
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    program = form_regions(g.tiny)
    cands = candidates(p, Machine())
    target = cands[3]
    calls = []

    def fake_time(plans):
        q = plans[r.name]
        calls.append(q)
        if q == cands[1]:
            raise KumikoError("E1701", at="gcc", why="injected build failure")
        return 0.5 if q == target else 1.0 + len(calls) * 1e-3

    env = {"M": 256, "N": 128, "K": 64}
    out = tuning.tune(program, {r.name: p}, env, AVX2, "gcc-test", fake_time, report=lambda *a: None)
    assert out[r.name] == target and len(calls) == len(cands)
    key = tuning.tune_key(r, env, p.arch, "gcc-test")
    assert tuning.cached_plan(key) == target
    calls.clear()
    again = tuning.tune(program, {r.name: p}, env, AVX2, "gcc-test", fake_time, report=lambda *a: None)
    assert again[r.name] == target and not calls                   # served from the cache
    (tmp_path / "tune" / f"{key}.json").write_text("{ corrupted")
    assert tuning.cached_plan(key) is None
    assert tuning.shape_cluster({"M": 100, "N": 3}) == "M=128,N=4"
    assert math.isinf(float("inf"))


def test_micro_tile_pads_known_row_counts_little():
    assert micro_tile(16) == (12, 32) and micro_tile(8) == (6, 16)
    assert micro_tile(16, 1024) == (12, 32)          # 1024 rows on 12-row tiles: 1.2% padding
    assert micro_tile(16, 64) == (8, 48)             # 72 rows for 64 on 12-row tiles; 8 divides it, 3 vectors wide
    assert micro_tile(4, 64) == (4, 12)              # 66 for 64 on 6-row tiles: past 2%; 4-row tiles compute 64
    assert micro_tile(4, 100) == (6, 8)              # 102 for 100: within 2%
    assert micro_tile(8, 64) == (6, 16) and micro_tile(8, 20) == (6, 16)    # AVX2: 6 x 16 whatever it pads
    # a B side of 3-4 vectors: one panel that wide, the same accumulator budget
    assert micro_tile(16, None, 64) == (6, 64) and micro_tile(16, 1024, 48) == (8, 48)
    assert micro_tile(16, None, 32) == (12, 32) and micro_tile(16, None, 65) == (12, 32)
    assert micro_tile(8, None, 24) == (4, 24)
    assert micro_tile(8, None, 32) == (6, 16)        # 3 x 4 accumulators + 4 B vectors + 1 > 16 registers
    for vw in (8, 16):                               # the accumulators and the B vectors fit the registers
        for rows in (20, 64, 1024, None):
            for cols in (None, 24, 40, 64):
                mr, nr = micro_tile(vw, rows, cols)
                assert mr * nr // vw + nr // vw + 1 <= (32 if vw == 16 else 16)


def test_conv_weights_get_the_row_tile_that_divides_them():
    x, w = Tensor.input("x", ("N", 8, "H", "W")), Tensor.input("w", (64, 8, 3, 3))
    g = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
    exe = kumiko.compile(g, "cpu")
    (plan,) = exe._run.plans.values()
    assert (-64 % plan.register_block.mr) / 64 <= 0.05        # 8 rows on AVX-512 (not 12: 72 for 64), 6 on AVX2
    ins = exe.random_inputs(1, {"N": 1, "H": 6, "W": 10})
    want = kumiko.compile(g, "eval")(**ins)["y"]
    got = exe(**ins)["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 7, 9)])
def test_window_over_the_m_axis_gets_a_plan(shape):
    """A reduction over one of a contraction's M axes (max over axis 1 of x @ y) makes it an outer window:
    the chooser sizes the M side with the window's axes too (it used to look them up among the region's
    sizes and raise KeyError; found by test_random_graphs)."""
    x, y = Tensor.input("x", shape), Tensor.input("y", (shape[2], 5))
    g = (x @ y).max(axis=1).graph("o", name="window_m")
    exe = kumiko.compile(g, "cpu")
    ins = exe.random_inputs(3)
    np.testing.assert_allclose(exe(**ins)["o"], kumiko.compile(g, "eval")(**ins)["o"], rtol=1e-5, atol=1e-5)


def _conv(c, co, hw, k, symbolic=False):
    rng = np.random.default_rng(0)
    x = Tensor.input("x", (1, c, "H", "W") if symbolic else (1, c, hw, hw))
    w = Tensor(rng.standard_normal((co, c, k, k)).astype(np.float32) * 0.05, name="w", role="param")
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    return x.conv2d(w, b, padding=k // 2).relu().graph("y", name="conv")


def _short_k(plan, k: int, co: int, pixels: int) -> bool:
    """The pixels' B panel of all of ``k`` (on the micro-tile that puts them in the lanes: ``co`` rows, ``pixels``
    columns) fits ``IN_PLACE_PANEL_BYTES``: they stay in the lanes whatever the tiles pad."""
    import os

    from kumiko.plan.packed import IN_PLACE_PANEL_BYTES
    nr = micro_tile(plan.vector_width, co, pixels, os.cpu_count() or 1)[1]
    return k * nr * 4 <= IN_PLACE_PANEL_BYTES


@pytest.mark.parametrize("c,co,hw,k,stride", [(3, 32, 48, 3, 2), (32, 16, 40, 1, 1), (96, 576, 14, 1, 1),
                                              (1024, 256, 14, 1, 1)])
def test_pixels_read_in_place_keep_the_lanes_while_their_panel_fits_l1(c, co, hw, k, stride):
    """MobileNetV2's first conv (3 -> 32, stride 2: its pixels read through a phased stage) and 1x1 convs
    with a short K keep the pixels on the lanes although 16 or 32 output channels, or 196 pixels, pad the
    tiles: packing the pixels into A panels instead took 1.07-2.4x the time on AVX2. Past L1 (K 1024) the
    channels take the lanes where the pixels pad them. Against the evaluator, batch 1."""
    rng = np.random.default_rng(7)
    x = Tensor.input("x", (1, c, hw, hw))
    w = Tensor(rng.standard_normal((co, c, k, k)).astype(np.float32) * 0.1, name="w", role="param")
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    g = x.conv2d(w, b, stride=stride, padding=k // 2).relu().graph("y", name="conv")
    exe = kumiko.compile(g, "cpu")
    (plan,) = exe._run.plans.values()
    if c * k * k <= 96:
        assert plan.lanes == "m", plan.register_block
    elif hw == 14 and plan.vector_width == 8:
        assert plan.lanes == "n", plan.register_block
    ins = exe.random_inputs(4)
    want = kumiko.compile(g, "eval")(**ins)["y"]
    assert np.linalg.norm(exe(**ins)["y"] - want) <= 1e-5 * np.linalg.norm(want)


def test_split_counts_a_symbolic_batch_at_its_least():
    """Under pre-packed weights narrower than A's rows the threads split M; with a symbolic batch the rows are
    at least one image's (``mp_least``), so the rule is decided when compiling, not left to a run-time test
    of A's size that splits N (MobileNetV2's 16 -> 96 1x1 conv at 112x112, dynamic batch: 1.06 -> 0.53 ms)."""
    from kumiko.plan.packed import split_rule
    assert split_rule(True, None, 16, 96, 12544) == "m"
    assert split_rule(True, None, 16, 96) == "n_if_small_a"
    assert split_rule(True, None, 16, 96, 64) == "n_if_small_a"
    assert split_rule(False, None, 16, 96, 12544) == "n_if_a_resident"
    rng = np.random.default_rng(6)
    x = Tensor.input("x", ("N", 40, 40, 16))         # channels-last, as the layout pass keeps a CNN's
    w = Tensor(rng.standard_normal((24, 16, 1, 1)).astype(np.float32) * 0.1, name="w", role="param")
    g = Tensor._record("Conv2D", (x, w), stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1,
                       x_layout="channels_last", y_layout="channels_last").relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    (plan,) = exe._run.plans.values()
    assert plan.lanes == "n" and plan.split == "m"
    for n in (1, 3):
        ins = {"x": rng.standard_normal((n, 40, 40, 16)).astype(np.float32)}
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("hint,lanes", [(224, "m"), (28, "n"), (None, "n"), ("batch", "m")])
def test_symbolic_strided_conv_takes_its_lanes_at_the_example_sizes(hint, lanes):
    """A stride-2 conv compiled for any image size reads its pixels in place from a phased stage (their lanes)
    when the graph's example sizes give it at least ``MIN_PHASED_ROWS`` output pixels (224 -> 112x112), packs
    them as A panels at small ones (28 -> 14x14) or with no example; a symbolic batch of 224x224 images (a
    dynamic-batch export) has at least one image's pixels. Each against the evaluator at sizes large, odd and
    tiny (the stage is right at every size)."""
    from kumiko.region.operands import MIN_PHASED_ROWS
    rng = np.random.default_rng(5)
    batch_only = hint == "batch"
    x = Tensor.input("x", ("N", 3, 224, 224) if batch_only else ("N", 3, "H", "W"))
    w = Tensor(rng.standard_normal((16, 3, 7, 7)).astype(np.float32) * 0.1, name="w", role="param")
    y = x.conv2d(w, stride=2, padding=3).relu()
    g = y.graph("y", symbols={"N": 1, "H": hint, "W": hint} if hint and not batch_only else None)
    assert not isinstance(hint, int) or ((hint // 2) ** 2 >= MIN_PHASED_ROWS) == (lanes == "m")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    (plan,) = exe._run.plans.values()
    assert plan.lanes == lanes
    sizes = ((1, 224, 224), (2, 224, 224)) if batch_only else ((1, 96, 112), (2, 37, 53), (1, 5, 4), (1, 1, 1))
    for n, h, wd in sizes:
        ins = {"x": rng.standard_normal((n, 3, h, wd)).astype(np.float32)}
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("c,co,hw,k", [(128, 48, 7, 3), (1024, 64, 5, 1), (32, 48, 7, 3), (8, 20, 17, 3),
                                      (64, 96, 14, 1), (16, 32, 8, 3)])
def test_plan_says_which_side_the_lanes_hold_and_the_kernel_follows(c, co, hw, k):
    """The plan's ``vectorize.axis`` names the side in the vector lanes: a stride-1 conv's pixels (the M
    axes), or with known sizes its output channels where the pixels pad the vectors (``FLIP_GAIN``); a plan
    asking for the other side computes the same, against the evaluator, with known sizes and with
    symbolic ones."""
    for symbolic in (False, True):
        g = _conv(c, co, hw, k, symbolic)
        exe = kumiko.compile(g, "cpu")
        (plan,) = exe._run.plans.values()
        assert plan.to_json()["vectorize"]["axis"] == plan.lanes
        if symbolic:
            assert plan.lanes == "m"
        else:       # 8x8 pixels fill 16-lane vectors; 49, 25, 289 and 196 do not, 48 to 96 channels do (on AVX2's
            #         6-row tiles 32 channels pad the rows more than 64 pixels do); a 1x1 conv whose pixels' panel
            #         of all of K fits in L1 reads them in place whatever they pad
            keep = (8, 17) if plan.vector_width == 16 else (17,)
            short = k == 1 and _short_k(plan, c, co, hw * hw)
            assert plan.lanes == ("m" if hw in keep or short else "n"), plan.register_block
        ins = exe.random_inputs(2, {"H": hw, "W": hw} if symbolic else None)
        want = kumiko.compile(g, "eval")(**ins)["y"]
        to = "n" if plan.lanes == "m" else "m"
        other = {n: replace(p, vectorize=(("axis", to), ("width", p.vector_width))) for n, p in exe._run.plans.items()}
        flipped = kumiko.compile(g, "cpu", plans=other)
        assert next(iter(flipped._run.plans.values())).lanes == to
        for e in (exe, flipped):
            got = e(**ins)["y"]
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("hw, algo", [(7, "mma"), (4, "mma"), (17, "simt")])
def test_gpu_plan_for_a_window_no_mma_tile_holds(hw, algo):
    """ResNet-50's last block at 224x224: conv + bias + residual + ReLU + a 7x7 global average pool feeding the FC
    layer. The pool's 49-row windows divide no power-of-two M tile: the MMA skeleton takes a 64-row tile whose
    tiles start 49 rows apart (the chooser looped forever doubling the tile once; then the region ran on the SIMT
    kernel, 69.5 us of ResNet-50's 0.97 ms on an H100). A 4x4 pool's 16-row windows divide the tile. A 17x17
    pool's 289 rows exceed the largest window tile: the SIMT kernel, a warp per output point (the bias is read once
    per point, not along the window, so it does not make the point a thread's)."""
    from kumiko.accuracy import rel_l2
    x, r = Tensor.input("x", (1, 32, hw, hw), dtype="fp16"), Tensor.input("r", (1, 64, hw, hw), dtype="fp16")
    w, fc = Tensor.input("w", (64, 32, 1, 1), dtype="fp16"), Tensor.input("fc", (64, 10), dtype="fp16")
    bias = Tensor.input("bias", (64,), dtype="fp16").reshape((64, 1, 1))   # a 1-D read: bias[channel]
    g = (((x.conv2d(w) + bias + r).relu().mean((2, 3))) @ fc).graph("y", name="conv_gap_fc")
    exe = kumiko.compile(g, "cuda-emu")
    pooled = exe._run.program.regions[0]
    plan = exe._run.plans[pooled.name]
    assert plan.algo == algo and (algo == "mma" or plan.get("bind", "point") == "warp")
    if hw == 7:
        assert exe._run.kernels[0].m_rows == 49 and exe._run.kernels[0].tile[0] == 64
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(1)
    assert rel_l2(exe(**ins)["y"], ref(**ins)["y"]) < 2e-3


def test_micro_tile_takes_a_divisor_of_awkward_row_counts():
    """49 and 196 rows (a conv's 7x7 and 14x14 pixels) pad 12- and 8-row tiles by 4-22%: a divisor takes
    the rows exactly, with as many accumulators, its width the one that pads a known B side least; a 3-4
    vector wide B side keeps its row count unless one row fewer divides the rows."""
    from kumiko.plan.choose import micro_tile, tile_efficiency
    assert micro_tile(16, 49) == (7, 64) and micro_tile(16, 49, 160) == (7, 32)
    assert micro_tile(16, 196) == (14, 32) and micro_tile(16, 784) == (12, 32)
    assert micro_tile(16, 64) == (8, 48) and micro_tile(8, 49) == (6, 16)       # AVX2 keeps its own
    # a 3-vector B side: one row fewer when that divides the rows (8 x 48 pads 49 rows to 56), not more
    assert micro_tile(16, 49, 48) == (7, 48) and micro_tile(16, 64, 49) == (6, 64)
    assert tile_efficiency((7, 64), 49, 1280) == 1.0 and tile_efficiency((6, 64), 49, 49) < 0.7
    # two threads: 7 row tiles split 4 / 3; so do 5 panels of 64 (960 -> 320), but 10 of 32 split evenly, and
    # 160 -> 960's 15 panels of 64 leave a sixteenth idle where 20 of 48 do not
    assert micro_tile(16, 49, 320) == (7, 64) and micro_tile(16, 49, 320, threads=2) == (7, 32)
    assert micro_tile(16, 49, 960, threads=2) == (7, 48) and micro_tile(16, 49, 512, threads=2) == (7, 64)
    assert micro_tile(16, 49, 160, threads=2) == (7, 32) and micro_tile(16, 196, 320, threads=2) == (14, 32)


@pytest.mark.parametrize("c,co,hw,k,n", [(96, 160, 7, 1, 1), (64, 128, 7, 3, 2), (48, 64, 14, 1, 1),
                                         (40, 96, 14, 3, 1), (24, 80, 7, 3, 3), (192, 320, 7, 1, 1)])
def test_channels_in_the_lanes_with_a_residual(c, co, hw, k, n):
    """Constant weights and pixels that pad the vectors: the channels take the lanes, the pixels the
    tile's rows, and bias + residual + ReLU run down the output's columns; batch 1 to 3, against the
    evaluator on fresh inputs, twice."""
    rng = np.random.default_rng(5)
    x, res = Tensor.input("x", (n, c, hw, hw)), Tensor.input("r", (n, co, hw, hw))
    w = Tensor(rng.standard_normal((co, c, k, k)).astype(np.float32) * 0.05, name="w", role="param")
    b = Tensor(rng.standard_normal(co).astype(np.float32), name="b", role="param")
    g = (x.conv2d(w, b, padding=k // 2) + res).relu().graph("y", name="conv")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    (plan,) = exe._run.plans.values()
    if plan.vector_width == 16:
        assert plan.lanes == ("m" if _short_k(plan, c * k * k, co, n * hw * hw) else "n"), plan.register_block
    for seed in (0, 1):
        ins = exe.random_inputs(seed)
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("hw,lanes", [(28, "n"), (20, "n"), (56, "m")])
def test_short_padded_rows_put_the_pixels_on_the_a_stage(hw, lanes):
    """A padded 3x3 conv whose output rows are shorter than a B panel (28 and 20 pixels on 48 lanes) would
    pack im2col panels with its pixels in the lanes; with bound weights the chooser puts the channels there
    and reads the pixels from the A side's stage. 56-pixel rows keep the B side's stage."""
    g = _conv(32, 64, hw, 3)
    exe = kumiko.compile(g, "cpu")
    (plan,) = exe._run.plans.values()
    if plan.vector_width != 16:
        pytest.skip("the rule is measured on AVX-512")
    assert plan.lanes == lanes, plan.register_block
    assert ("kk_micro_astage_" in exe._run.source) == (lanes == "n")
    ins = exe.random_inputs(3)
    want = kumiko.compile(g, "eval")(**ins)["y"]
    assert np.linalg.norm(exe(**ins)["y"] - want) <= 1e-5 * np.linalg.norm(want)
