"""The packed contraction path (kumiko/kernel/contract.py, pack.py) against the Tiny IR evaluator:
index-table packing (contiguous, strided, guarded at the edges), the per-element fallback, the operand
swap, the thread splits (M, N, whole batch points) and the fused window epilogue, at sizes that are not
multiples of the micro-tile or the cache blocks, and with cache blocks small enough that every path runs
several blocks."""
import re
from dataclasses import replace

import numpy as np
import pytest

import kumiko
from kumiko import Tensor


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(g, shapes=None, blocks=None, tol=1e-5, seed=0, want=None, packed=True):
    """Compile for cpu (with cache blocks ``blocks`` (MC, NC, KC) on every packed region), compare with the
    evaluator; return the generated source."""
    exe = kumiko.compile(g, "cpu")
    if blocks is not None:
        def fit(p):      # MC, NC rounded down to the machine's register block (6x16 on AVX2, 12x32 on AVX-512)
            (mr, nr), (mc, nc, kc) = p.register_block, blocks
            return replace(p, cache_block=(max(mr, mc // mr * mr), max(nr, nc // nr * nr), kc))
        plans = {k: fit(p) if p.algo == "packed" else p for k, p in exe._run.plans.items()}
        exe = kumiko.compile(g, "cpu", plans=plans)
    src = exe._run.source
    assert any(p.algo == "packed" for p in exe._run.plans.values()) or not packed
    for w in want or ():
        assert w in src, w
    ins = exe.random_inputs(seed, shapes)
    out, ref = exe(**ins), kumiko.compile(g, "eval")(**ins)
    for k in ref:
        assert out[k].shape == ref[k].shape and out[k].dtype == ref[k].dtype, k
        assert rel(out[k], ref[k]) < tol, (k, rel(out[k], ref[k]))
    return src


SMALL = (12, 32, 8)        # MC, NC, KC: several blocks along every axis at test sizes (see fit)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 3, 37), (13, 50, 9), (65, 17, 70)])
@pytest.mark.parametrize("blocks", [None, SMALL])
def test_gemm_odd_sizes(m, n, k, blocks):
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    g = ((a @ b) + Tensor.input("c", ("N",))).relu().graph("y")
    check(g, {"M": m, "N": n, "K": k}, blocks, want=["index tables"])


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
def test_gemm_transposed_operands_are_gathered(ta, tb):
    a = Tensor.input("a", ("K", "M")).T if ta else Tensor.input("a", ("M", "K"))
    b = Tensor.input("b", ("N", "K")).T if tb else Tensor.input("b", ("K", "N"))
    g = (a @ b).graph("y")
    for blocks in (None, SMALL):
        check(g, {"M": 23, "N": 29, "K": 19}, blocks)


@pytest.mark.parametrize("batch", [1, 2, 3, 9])
def test_batched_matmul_splits(batch):
    """B=2 and 9 run whole batch points per thread; 1 and 3 split each block between threads."""
    q, k = Tensor.input("q", ("B", 3, "S", 8)), Tensor.input("k", ("B", 3, 8, "T"))
    g = (q @ k).graph("y")
    check(g, {"B": batch, "S": 11, "T": 21}, SMALL)
    check(g, {"B": batch, "S": 5, "T": 70})


def test_m_split_and_n_split():
    """A tall product splits rows between threads, a wide one the N panels."""
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    g = (a @ b).graph("y")
    check(g, {"M": 200, "N": 5, "K": 13}, SMALL)
    check(g, {"M": 3, "N": 300, "K": 13}, SMALL)


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    (1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (1, 1, 1, 2), (2, 0, 1, 2), (1, (0, 2), 1, 1)])
@pytest.mark.parametrize("blocks", [None, SMALL])
def test_conv_variants(stride, padding, dilation, groups, blocks):
    x = Tensor.input("x", ("N", 4, "H", "W"))
    w = Tensor.input("w", (6, 4 // groups, 3, 3))
    g = x.conv2d(w, stride=stride, padding=padding, dilation=dilation, groups=groups).relu().graph("y")
    check(g, {"N": 2, "H": 9, "W": 11}, blocks, packed=groups == 1)   # a grouped conv is not one contraction
    check(g, {"N": 1, "H": 5, "W": 5}, blocks, packed=groups == 1)


@pytest.mark.parametrize("blocks", [None, SMALL, (6, 16, 8)])
@pytest.mark.parametrize("hw", [(8, 8), (7, 9), (4, 34)])
def test_conv_relu_maxpool_window_epilogue(blocks, hw):
    """The pooled conv swaps operands (pixels on the N side) and reduces windows along columns; with
    NC smaller than a window group, a block is one group."""
    x = Tensor.input("x", ("N", 3, "H", "W"))
    w = Tensor.input("w", (5, 3, 3, 3))
    g = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
    src = check(g, {"N": 2, "H": hw[0], "W": hw[1]}, blocks, want=["index tables"])
    assert "kk_G" in src
    assert re.search(r"#pragma omp simd\s+for \(long long kk_e = ", src)     # windows of a group side by side


@pytest.mark.parametrize("w", [8, 58])
def test_nan_propagates_through_the_pooling_epilogue(w):
    """The window max keeps a NaN wherever it sits in the window (first or later element) and wherever
    the pooled column falls (vector body or scalar tail of the epilogue loop), as the evaluator does."""
    x = Tensor.input("x", ("N", 3, "H", "W"))
    g = x.conv2d(Tensor.input("w", (4, 3, 3, 3)), padding=1).relu().max_pool2d(2, 2).graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(0, {"N": 1, "H": 6, "W": w})
    ins["x"][0, 0, 0, 0] = np.nan               # a corner: the first window element of pooled (0, 0)
    ins["x"][0, 1, 3, w - 1] = np.nan           # the last column: the scalar tail
    ins["x"][0, 2, 5, w // 2] = np.nan
    out, want = exe(**ins)["y"], ref(**ins)["y"]
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    ok = ~np.isnan(want)
    assert rel(out[ok], want[ok]) < 1e-5


def test_window_epilogue_with_rows_split_between_threads():
    """Many output channels and one window group: the threads split the rows and share the B panels."""
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (64, 3, 3, 3))
    g = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
    check(g, {"N": 1, "H": 2, "W": 6})
    check(g, {"N": 2, "H": 3, "W": 7}, SMALL)


def test_conv_stride1_puts_pixels_on_the_n_side():
    x = Tensor.input("x", ("N", 8, "H", "W"))
    w = Tensor.input("w", (16, 8, 3, 3))
    g = x.conv2d(w, padding=1).graph("y")
    src = check(g, {"N": 2, "H": 13, "W": 21}, SMALL)
    comment = next(line for line in src.splitlines() if "/* contraction" in line)
    n_part = comment.split(", N ")[1]
    assert "'i2'" in n_part and "'i3'" in n_part    # the output pixels are the N (vector) side


@pytest.mark.parametrize("dt,tol", [("fp16", 1e-2), ("bf16", 2e-2)])
def test_half_precision_operands_are_converted_while_packing(dt, tol):
    x = Tensor.input("x", ("N", 4, "H", "W"), dtype=dt)
    w = Tensor.input("w", (6, 4, 3, 3), dtype=dt)
    g = x.conv2d(w, padding=1).relu().graph("y")
    check(g, {"N": 2, "H": 7, "W": 10}, SMALL, tol=tol)
    a, b = Tensor.input("a", ("M", "K"), dtype=dt), Tensor.input("b", ("K", "N"), dtype=dt)
    check((a @ b).graph("y"), {"M": 9, "N": 20, "K": 17}, SMALL, tol=tol)


def test_pointwise_map_of_the_operand_is_packed_from_tables():
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    g = (a.relu() @ (b * 2.0).exp()).graph("y")
    check(g, {"M": 10, "N": 19, "K": 7}, SMALL, want=["index tables"])


def test_gathered_operand_falls_back_to_per_element_packing():
    e, w = Tensor.input("e", ("V", 8)), Tensor.input("w", (8, "N"))
    idx = Tensor.input("idx", ("T",), dtype="i32")
    g = (e.take(idx, axis=0) @ w).graph("y")
    exe = kumiko.compile(g, "cpu")
    src = exe._run.source
    rng = np.random.default_rng(0)
    ins = {"e": rng.standard_normal((13, 8), dtype=np.float32), "w": rng.standard_normal((8, 21), dtype=np.float32),
           "idx": rng.integers(0, 13, (17,)).astype(np.int32)}
    np.testing.assert_allclose(exe(**ins)["y"], ins["e"][ins["idx"]] @ ins["w"], rtol=1e-5, atol=1e-5)
    assert src


def test_padded_with_a_nonzero_value_falls_back_to_per_element_packing():
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    g = (a.pad(((1, 2), (0, 0)), value=1.5) @ b).graph("y")
    check(g, {"M": 9, "N": 18, "K": 5}, SMALL, want=["per element"])


def test_upsampled_input_conv():
    """Nearest upsampling then a conv: the input index floor((oh + kh - 1)/2) mixes pixels and K."""
    x = Tensor.input("x", (1, 2, 5, 6))
    up = x.reshape(1, 2, 5, 1, 6, 1).expand(1, 2, 5, 2, 6, 2).reshape(1, 2, 10, 12)
    w = Tensor.input("w", (3, 2, 3, 3))
    g = up.conv2d(w, padding=1).graph("y")
    for blocks in (None, SMALL):
        check(g, None, blocks)


@pytest.mark.parametrize("flags", [("-mno-avx2",), ("-march=x86-64",)])
def test_scalar_packing_without_avx2(monkeypatch, flags):
    """The masked-load / gather packing is AVX2 code; without AVX2 the scalar branch packs the same."""
    from kumiko.runtime import cpu as cpu_rt
    monkeypatch.setattr(cpu_rt, "DEFAULT_FLAGS", tuple(cpu_rt.DEFAULT_FLAGS) + flags)
    x = Tensor.input("x", ("N", 3, "H", "W"))
    w = Tensor.input("w", (5, 3, 3, 3))
    check(x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y"), {"N": 2, "H": 7, "W": 9}, SMALL)
    a, b = Tensor.input("a", ("K", "M")).T, Tensor.input("b", ("K", "N"))
    check((a @ b).graph("y"), {"M": 13, "N": 21, "K": 10}, SMALL)


_THREADS_SCRIPT = r"""
import numpy as np, kumiko
from kumiko import Tensor
def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
gemm = ((a @ b) + Tensor.input("c", ("N",))).relu().graph("y")
q, k = Tensor.input("q", ("B", "S", 8)), Tensor.input("k", ("B", 8, "T"))
bmm = (q @ k).graph("y")
x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (5, 3, 3, 3))
pool = x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y")
pool64 = x.conv2d(Tensor.input("w", (64, 3, 3, 3)), padding=1).relu().max_pool2d(2, 2).graph("y")
for g, shapes in ((gemm, {"M": 61, "N": 45, "K": 30}), (gemm, {"M": 5, "N": 200, "K": 7}),
                  (bmm, {"B": 3, "S": 13, "T": 20}), (bmm, {"B": 7, "S": 4, "T": 3}),
                  (pool, {"N": 3, "H": 6, "W": 10}), (pool64, {"N": 1, "H": 2, "W": 6})):
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    ins = exe.random_inputs(0, shapes)
    out, want = exe(**ins), ref(**ins)
    assert all(rel(out[n], want[n]) < 1e-5 for n in want), shapes
print("OK")
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_thread_counts(threads, tmp_path):
    """Every split at 1 thread and at an odd thread count (uneven shares of rows, panels, batch points)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    r = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_zero_sizes():
    """An empty K is the epilogue of zero; an empty M, N or output window group computes nothing (and
    divides by nothing)."""
    a, b = Tensor.input("a", ("M", "K")), Tensor.input("b", ("K", "N"))
    g = ((a @ b) + Tensor.input("c", ("N",))).relu().graph("y")
    for shapes in ({"M": 3, "N": 5, "K": 0}, {"M": 0, "N": 5, "K": 3}, {"M": 3, "N": 0, "K": 3}):
        check(g, shapes)
    x, w = Tensor.input("x", ("N", 2, "H", "W")), Tensor.input("w", (3, 2, 3, 3))
    check(x.conv2d(w, stride=2).graph("y"), {"N": 2, "H": 2, "W": 2})
    check(x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y"), {"N": 2, "H": 1, "W": 5})


@pytest.mark.parametrize("micro,blocks,width", [((12, 32), (24, 64, 16), 8), ((6, 8), (12, 32, 8), 4)])
def test_other_micro_tiles(micro, blocks, width):
    """The AVX-512 machine's 12 x 32 tile (two 8-lane chunks, the second short) and the 4-lane 6 x 8 one,
    run here with the vector types of the plan."""
    x, w = Tensor.input("x", ("N", 3, "H", "W")), Tensor.input("w", (5, 3, 3, 3))
    a, b = Tensor.input("a", ("K", "M")).T, Tensor.input("b", ("N", "K")).T
    for g, shapes in ((x.conv2d(w, padding=1).relu().max_pool2d(2, 2).graph("y"), {"N": 2, "H": 7, "W": 9}),
                      ((a @ b).relu().graph("y"), {"M": 29, "N": 37, "K": 21}),
                      ((Tensor.input("a2", ("M", "K")) @ Tensor.input("b2", ("K", "N"))).graph("y"),
                       {"M": 31, "N": 70, "K": 19})):
        exe = kumiko.compile(g, "cpu")
        plans = {k: replace(p, register_block=micro, cache_block=blocks, vectorize=tuple(
            (n, width if n == "width" else v) for n, v in p.vectorize)) if p.algo == "packed" else p
            for k, p in exe._run.plans.items()}
        exe = kumiko.compile(g, "cpu", plans=plans)
        assert f"kk_micro_{micro[0]}x{micro[1]}_v{width}(" in exe._run.source
        ins = exe.random_inputs(3, shapes)
        out, ref = exe(**ins), kumiko.compile(g, "eval")(**ins)
        assert rel(out["y"], ref["y"]) < 1e-5


_BOUND_GEMM = r"""
import numpy as np, kumiko
from kumiko import Tensor
rng = np.random.default_rng(3)
even = "kk_wn * 10 <= kk_wm * 11"
for m, k, n in ((37, 300, 200), (130, 257, 3 * 48 + 5), (20, 1100, 97), (300, 700, 160), (800, 700, 100),
                ("M", 300, 70)):
    x = Tensor.input("x", (m, k))
    w = Tensor(rng.standard_normal((k, n)).astype(np.float32) * 0.1, name="w", role="param")
    b = Tensor(rng.standard_normal(n).astype(np.float32), name="b", role="param")
    g = ((x @ w) + b).relu().graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    src = exe._run.source
    (plan,) = [p for p in exe._run.plans.values() if p.algo == "packed"]
    assert "kk_pkb" in src, "the weights are pre-packed B panels"
    if m == "M":      # A's size is known at run time only: the plan says the kernel tests it
        assert plan.split == "n_if_small_a" and f"|| (kk_Mp * kk_K <= 524288 && {even})" in src
        m = 29
    else:             # the plan decided: N when A (Mp x K floats) is at most 2 MiB and B at least as wide as A
        mr = plan.register_block.mr  # has rows, the kernel tests no size
        mp = -(-m // mr) * mr
        assert plan.split == ("n" if mp * k <= 524288 and n >= mp else "m"), (m, k, n, plan.split)
        assert "kk_Mp * kk_K <=" not in src and (f"|| {even}" in src) == (plan.split == "n")
    X = rng.standard_normal((m, k)).astype(np.float32)
    for _ in range(2):
        a, e = np.asarray(exe(x=X)["y"], np.float64), np.asarray(ref(x=X)["y"], np.float64)
        assert np.linalg.norm(a - e) <= 1e-5 * np.linalg.norm(e), (m, k, n)
print("OK")
"""


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_bound_weights_split_by_columns_across_threads(threads):
    """Pre-packed B (bound weights) with A up to 2 MiB and at least as many columns as A has rows: the
    threads split N, each packing all of A and streaming its own panels (odd panel counts, uneven splits), or
    split M otherwise; all match the evaluator on two calls."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _BOUND_GEMM], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("known", [True, False])
def test_prepacked_a_takes_one_k_block_when_b_fits(known):
    """Bound conv weights (pre-packed A) over K = 2304 take all of K in one block when B's panels fit 2 MiB
    (the weights stream once): the plan says so (k_blocks "one", KC = K) when the pixels are known, or that
    the kernel tests it at run time ("one_if_fits") when they are symbolic; the same conv with the weights
    as an input keeps KC-sized blocks. All match the evaluator."""
    rng = np.random.default_rng(4)
    # 96 pixels: whole vectors, so the pixels stay in the lanes (channels there pad less only past FLIP_GAIN)
    x = Tensor.input("x", (1, 256, 8, 12) if known else ("N", 256, "H", "W"))
    w = rng.standard_normal((40, 256, 3, 3)).astype(np.float32) * 0.05
    test = "kk_ncp * kk_K <= 524288 ? 1 : "
    for bound in (True, False):
        wt = Tensor(w, name="w", role="param") if bound else Tensor.input("w", w.shape)
        g = x.conv2d(wt, padding=1).relu().graph("y")
        exe = kumiko.compile(g, "cpu")
        (plan,) = exe._run.plans.values()
        src = exe._run.source
        if not bound:
            assert plan.k_blocks == "kc" and plan.cache_block.kc == 256 and test not in src
        elif known:
            assert plan.k_blocks == "one" and plan.cache_block.kc == 2304
            assert "kk_nkb = 1;" in src and test not in src
        else:
            assert plan.k_blocks == "one_if_fits" and plan.cache_block.kc == 256 and test in src
        ins = {k: v for k, v in exe.random_inputs(1, None if known else {"N": 1, "H": 8, "W": 12}).items()
               if k != "w" or not bound}
        if not bound:
            ins["w"] = w
        want = kumiko.compile(g, "eval")(**ins, **({"w": w} if bound else {}))["y"]
        assert rel(exe(**ins)["y"], want) < 1e-5


@pytest.mark.parametrize("c,co,hw,stride,n", [(16, 32, 56, 1, 1), (16, 32, 28, 2, 1), (8, 24, 30, 1, 2),
                                               (12, 16, 15, 2, 3)])
def test_each_packed_operand_has_one_packing_code(c, co, hw, stride, n):
    """A conv whose weights and pixels are both packed per call has two packing codes, one per operand:
    resident A panels (all of K) and per-block ones come from the same code, and so do a staged B's
    panels when the stage is not read and its short last panel when it is (each copy of the packing text
    is gcc time: two had been about a fifth of a staged conv unit's). The answers are the evaluator's."""
    x, w = Tensor.input("x", (n, c, hw, hw)), Tensor.input("w", (co, c, 3, 3))
    g = x.conv2d(w, padding=1, stride=stride).relu().graph("y")
    src = check(g)
    assert src.count("kk_kcontig = kk_kcb > 0") == 2
