"""Vector loops of the generic CPU nest (kumiko/kernel/lower_vec.py): kv_* lanes with scalar tails,
vector reductions with horizontal ends, NaN and -inf through them, 16-bit storage, masks, the loops
that must stay scalar, and scratch rows allocated once per thread. Every run compares the cpu target
with the numpy evaluator on fresh random inputs."""
import re
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor, dtypes
from kumiko.kernel.loops import For, Parallel, Scratch, VecStore
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.plan.plan import make_plan
from kumiko.region.playback import play_region
from kumiko.region.ssa import (
    Axis,
    Binary,
    Const,
    Guard,
    Let,
    MemRef,
    Output,
    Read,
    Reduce,
    Ref,
    Region,
    Select,
    Unary,
    Yield,
)
from kumiko.render.c import render_program
from kumiko.runtime.cpu import build_c
from kumiko.runtime.program import program_symbols
from kumiko.symbolic import Expr

SIZES = [1, 7, 9, 1023]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_both(g, ins):
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    return exe(**ins), ref(**ins), exe._run.source


def check(g, ins, tol=1e-5):
    out, want, src = run_both(g, ins)
    for k in want:
        assert out[k].dtype == want[k].dtype and out[k].shape == want[k].shape, k
        o, w = np.asarray(out[k], np.float64), np.asarray(want[k], np.float64)
        assert np.array_equal(np.isnan(o), np.isnan(w)), (k, "NaN positions differ")
        assert np.array_equal(o[np.isinf(w)], w[np.isinf(w)]), (k, "infinities differ")
        fin = np.isfinite(w)
        assert rel(o[fin], w[fin]) < tol, (k, rel(o[fin], w[fin]))
    return src


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def kernel_bodies(src: str) -> str:
    return src[src.index("int kumiko_"):]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_row_reductions_at_every_tail_length(op, n):
    x = Tensor.input("x", ("R", "N"))
    g = getattr(x, op)(-1).graph("y")
    rng = np.random.default_rng(n)
    src = check(g, {"x": randn(rng, 5, n)})
    assert "kv_load(" in src and ("kv_hsum(" in src or "kv_hmax_nan(" in src or "kv_hmin_nan(" in src)


@pytest.mark.parametrize("n", SIZES)
def test_softmax_rows_symbolic(n):
    x = Tensor.input("x", ("B", "H", "S", "N"))
    g = x.softmax(-1).graph("y")
    rng = np.random.default_rng(10 + n)
    src = check(g, {"x": randn(rng, 2, 3, 4, n) * 4})
    body = kernel_bodies(src)
    assert "kv_exp2(" in body and "kumiko_exp2(" in body and "exp2f(" not in body
    # the row buffer is allocated once per thread, before the worksharing loop
    assert body.index("kumiko_tmp_alloc(") < body.index("#pragma omp for") and "#pragma omp parallel if(" in body
    # the row's sum divides every lane: one reciprocal per row, a multiply per vector (the scalar tail divides)
    assert "* kv_broadcast(1.0f / (" in body and " / kv_broadcast(" not in body
    # exp and the row sum share one pass: each vector stored is added right away, in the tail too
    fused = re.findall(r"kv_store\((a_\w+) \+ (\w+), kv_exp2\(\w+\)\);\n\s*(t\d+) = \3 \+ kv_load\(\1 \+ \2\);", body)
    assert len(fused) == 5                           # 4 unrolled accumulators + the one-vector remainder
    assert re.search(r"(a_\w+)\[(\w+)\] = kumiko_exp2\(\w+\);\n\s*(t\d+) = \3 \+ \1\[\2\];", body)


def test_a_loop_whose_reduction_stays_scalar_runs_before_it():
    """Rows of 3 (constant, below a vector): the row sum stays scalar, so the loop storing exp(x - max)
    keeps its own pass and runs first; the results match the evaluator."""
    x = Tensor.input("x", ("R", 3))
    src = check(x.softmax(-1).graph("y"), {"x": randn(np.random.default_rng(3), 6, 3) * 4})
    body = kernel_bodies(src)
    assert "kv_" not in body
    assert body.index("= kumiko_exp2(") < body.index("+ a_v_")


@pytest.mark.parametrize("shape", [(3, 64), (2, 1000), (4, 4096), (1, 1)])
def test_layernorm_rows(shape):
    r, d = shape
    x = Tensor.input("x", ("R", "D"))
    w = Tensor.input("w", ("D",))
    b = Tensor.input("b", ("D",))
    g = x.layernorm(-1, eps=1e-5, weight=w, bias=b).graph("y")
    rng = np.random.default_rng(d)
    check(g, {"x": randn(rng, r, d) * 3 + 1, "w": randn(rng, d), "b": randn(rng, d)})


@pytest.mark.parametrize("n", [9, 40, 1023])
def test_nan_propagates_through_vector_max_and_min(n):
    x = Tensor.input("x", ("R", "N"))
    g = x.max(-1).graph("mx", outputs={"mn": x.min(-1), "sm": x.softmax(-1)})
    rng = np.random.default_rng(n)
    a = randn(rng, 6, n)
    a[1, 0] = np.nan               # first lane of the first vector
    a[2, n // 2] = np.nan          # inside the vector part
    a[3, n - 1] = np.nan           # the scalar tail (n is not a multiple of the vector width)
    a[4, :] = np.nan
    a[5, 3] = np.inf               # max is inf, softmax is NaN at inf - inf ... as numpy says
    out, want, _ = run_both(g, {"x": a})
    for k in ("mx", "mn", "sm"):
        np.testing.assert_array_equal(np.isnan(out[k]), np.isnan(want[k]), err_msg=k)
    assert np.isnan(out["mx"][[1, 2, 3, 4]]).all() and np.isnan(out["mn"][[1, 2, 3, 4]]).all()
    np.testing.assert_array_equal(out["mx"][[0, 5]], want["mx"][[0, 5]])
    np.testing.assert_array_equal(out["mn"][[0, 5]], want["mn"][[0, 5]])


@pytest.mark.parametrize("n", [7, 33, 1023])
def test_minus_inf_into_exp_masked_rows(n):
    x = Tensor.input("x", ("R", "N"))
    g = x.softmax(-1).graph("y")
    rng = np.random.default_rng(n)
    a = randn(rng, 4, n)
    a[0, : n // 2] = -np.inf                   # a half-masked row
    a[1, 1:] = -np.inf                         # one live element
    a[2, ::3] = -np.inf
    check(g, {"x": a})
    out, _, _ = run_both(g, {"x": a})
    assert (out["y"][0, : n // 2] == 0).all() and out["y"][1, 0] == 1.0


@pytest.mark.parametrize("stem", ["attention_causal", "attention_row_softmax"])
@pytest.mark.parametrize("loops", [False, True])
def test_attention_examples_at_odd_sizes(stem, loops):
    """As planned (contractions packed), and with every region on the generic nest (loops=True: the
    scores' row reductions, the softmax rows and P @ V all take vector loops)."""
    g = kumiko.load(Path(__file__).parents[2] / "examples" / f"{stem}.json")
    exe = kumiko.compile(g, "cpu")
    if loops:
        plans = {n: make_plan(p.arch, algo_choice={"region": "loops"}) for n, p in exe._run.plans.items()}
        exe = kumiko.compile(g, "cpu", plans=plans)
    ref = kumiko.compile(g, "eval")
    for seed, extra in ((1, 0), (2, 3)):
        shapes = {k: v + extra for k, v in g.symbols.items()}
        ins = exe.random_inputs(seed, shapes)
        out, want = exe(**ins), ref(**ins)
        for k in want:
            assert rel(out[k], want[k]) < 1e-5, (k, rel(out[k], want[k]))
    if loops:
        src = kernel_bodies(exe._run.source)
        assert "kv_exp2(" in src and "kv_hsum(" in src and "kv_hmax_nan(" in src


def _run_region(region, ins: dict, env: dict, parallel: bool = True) -> tuple[dict, str]:
    """One region through the generic CPU nest, C, gcc; its outputs and its source."""
    syms = tuple(sorted(env))
    k = CpuLowering(region, syms, "k_test", parallel=parallel).lower()
    src = render_program([k])
    mod = build_c(src, name="vector_region")
    outs = {o.name: np.zeros([int(Expr.lift(d).evaluate(env)) for d in o.memref.shape], o.memref.dtype.np)
            for o in region.outputs}
    arrays = [ins[n] for n, _ in region.inputs] + [outs[o.name] for o in region.outputs]
    assert mod.fn("k_test")(arrays, [env[s] for s in syms]) == 0
    return outs, src


@pytest.mark.parametrize("n", [1, 7, 9, 1023])
def test_affine_guard_over_the_vector_axis_is_a_lane_mask(n):
    """A causal mask: select(i - j >= 0, s, -inf) and select(i - 2j + 3 == 0, ...) on the lanes of j."""
    i, j = Expr.sym("i"), Expr.sym("j")
    M, N = Expr.sym("M"), Expr.sym("N")
    x = Read("x", (i, j))
    lets = (Let("s", Binary("mul", x, Const(0.5))),
            Let("m", Select(Guard(((i - j, "ge"),)), Ref("s"), Const(float("-inf")))),
            Let("e", Select(Guard(((i - 2 * j + 3, "eq"),)), Const(7.0), Unary("exp2", Ref("m")))))
    region = Region("k_guard", (Axis("i", M), Axis("j", N)), (("x", MemRef((M, N), dtypes.fp32)),),
                    (Output("y", MemRef((M, N), dtypes.fp32)),), lets, (Yield("e", "y"),))
    env = {"M": 13, "N": n}
    a = np.random.default_rng(n).standard_normal((13, n), dtype=np.float32)
    out, src = _run_region(region, {"x": a}, env)
    want = play_region(region, {"x": a}, env)["y"]
    assert "kv_affine_ge(" in src and "kv_affine_eq(" in src
    np.testing.assert_array_equal(out["y"] == 0, want == 0)
    assert rel(out["y"], want) < 1e-6


def test_guard_branch_that_reads_along_the_axis_stays_scalar_and_a_row_guard_is_an_if():
    x = Tensor.input("x", ("R", "N"))
    g = x.pad(((0, 0), (2, 3)), value=0.5).exp().graph("y", outputs={"z": x.pad(((1, 2), (0, 0))).exp()})
    rng = np.random.default_rng(5)
    for n in (1, 9, 30):
        src = check(g, {"x": randn(rng, 4, n)})
    assert "kv_exp2(" in src


@pytest.mark.parametrize("dt,tol", [("fp16", 2e-3), ("bf16", 1e-2)])
@pytest.mark.parametrize("n", [7, 9, 1023])
def test_half_storage(dt, tol, n):
    x = Tensor.input("x", ("R", "N"), dtype=dt)
    w = Tensor.input("w", ("N",), dtype=dt)
    b = Tensor.input("b", ("N",), dtype=dt)
    g = x.softmax(-1).graph("y", outputs={"z": x.layernorm(-1, weight=w, bias=b), "r": (x * w + b).relu()})
    rng = np.random.default_rng(n)
    npdt = dtypes.ALL[dt].np
    ins = {"x": randn(rng, 3, n, dtype=npdt), "w": randn(rng, n, dtype=npdt), "b": randn(rng, n, dtype=npdt)}
    src = check(g, ins, tol=tol)
    short = {"fp16": "f16", "bf16": "bf16"}[dt]
    assert f"kv_load_{short}(" in src and f"kv_store_{short}(" in src and f"kv_round_{short}(" in src


def test_masks_selects_and_bool_outputs():
    x = Tensor.input("x", ("R", "N"))
    y = Tensor.input("y", ("R", "N"))
    m = Tensor.input("m", ("R", "N"), dtype="bool")
    sel = m.where(x, y * 2)
    cmp = (x > y)
    mx = x.maximum(y)
    g = sel.graph("sel", outputs={"cmp": cmp, "mx": mx, "both": (cmp.where(x, y) + m.cast("fp32"))})
    rng = np.random.default_rng(0)
    for n in (5, 37):
        a, b = randn(rng, 3, n), randn(rng, 3, n)
        a[0, 1] = np.nan
        b[1, 2] = np.nan
        src = check(g, {"x": a, "y": b, "m": rng.random((3, n)) < 0.5})
    assert "kv_load_bool(" in src and "kv_store_bool(" in src and "kv_maxnan(" in src


@pytest.mark.parametrize("n", [1, 9, 130])
def test_reduction_inside_a_vector_loop_is_lane_wise(n):
    """Column reductions: the loop over the contiguous axis is the vector one, the reduction runs over rows."""
    x = Tensor.input("x", ("R", "N"))
    g = x.sum(0).graph("s", outputs={"mx": x.max(0)})
    rng = np.random.default_rng(n)
    a = randn(rng, 11, n)
    if n > 1:
        a[4, n - 1] = np.nan
    src = check(g, {"x": a})
    if n > 1:
        assert "kv_select(" in src          # NaN lanes of the max accumulator


def test_strided_and_gather_loops_stay_scalar_and_correct():
    x = Tensor.input("x", ("N", "M"))
    idx = Tensor.input("i", ("K",), dtype="i32")
    g = x.transpose(0, 1).exp().graph("t", outputs={"g": x.take(idx, axis=1).sum(-1)})
    rng = np.random.default_rng(3)
    ins = {"x": randn(rng, 19, 13), "i": rng.integers(0, 13, 23).astype(np.int32)}
    check(g, ins)


def test_vector_source_uses_ymm_registers_in_the_hot_loops(tmp_path):
    """The generated vector loops compile to AVX instructions on this machine (when it has AVX)."""
    import subprocess

    from kumiko.runtime.cpu import DEFAULT_FLAGS, INCLUDE_DIR, cpu_features
    if cpu_features()["vector_width_f32"] < 8:
        pytest.skip("no 256-bit vectors here")
    x = Tensor.input("x", ("R", "N"))
    src = kumiko.compile(x.softmax(-1).graph("y"), "cpu")._run.source
    c = tmp_path / "k.c"
    c.write_text(src)
    flags = [f for f in DEFAULT_FLAGS if f != "-shared"]
    subprocess.run(["gcc", *flags, f"-I{INCLUDE_DIR}", "-S", str(c), "-o", str(tmp_path / "k.s")], check=True)
    asm = (tmp_path / "k.s").read_text()
    assert "ymm" in asm or "zmm" in asm
    assert "exp2f" not in asm


def test_scratch_is_per_thread_and_small_constant_rows_live_on_the_stack():
    x = Tensor.input("x", ("R", 64))
    src = kernel_bodies(kumiko.compile(x.softmax(-1).graph("y"), "cpu")._run.source)
    assert "KUMIKO_ALIGN(64) float a_" in src and "kumiko_tmp_alloc(" not in src
    x = Tensor.input("x", ("R", "N"))
    src = kernel_bodies(kumiko.compile(x.softmax(-1).graph("y"), "cpu")._run.source)
    assert src.count("kumiko_tmp_alloc(") == src.count("kumiko_tmp_free(") == 1


def test_kernel_ir_parallel_region_holds_scratch_and_vector_stores():
    x = Tensor.input("x", ("R", "N"))
    exe = kumiko.compile(x.softmax(-1).graph("y"), "cpu")
    prog = exe._run.program
    (region,) = prog.regions
    k = CpuLowering(region, program_symbols(prog), "k").lower()
    (par,) = [s for s in k.body if isinstance(s, Parallel)]
    assert isinstance(par.body[0], Scratch) and isinstance(par.body[-1], For) and par.body[-1].workshare

    def walk(s):
        yield s
        for f in ("body", "then", "other"):
            for b in getattr(s, f, ()) or ():
                yield from walk(b)
    stmts = list(walk(par))
    assert any(isinstance(s, VecStore) for s in stmts)
    assert any(isinstance(s, For) and s.step == "KUMIKO_VW" for s in stmts)
    assert any(isinstance(s, For) and s.tail for s in stmts)


def test_serial_nest_allocates_scratch_once_before_its_loop():
    x = Tensor.input("x", ("R", "N"))
    prog = kumiko.compile(x.softmax(-1).graph("y"), "cpu")._run.program
    (region,) = prog.regions
    env = {"R": 5, "N": 37}
    a = np.random.default_rng(0).standard_normal((5, 37), dtype=np.float32)
    out, src = _run_region(region, {"x": a}, env, parallel=False)
    want = play_region(region, {"x": a}, env)["y"]
    assert rel(out["y"], want) < 1e-6
    body = src[src.index("int k_test("):]
    assert "#pragma omp" not in body and body.index("kumiko_tmp_alloc(") < body.index("for (")


def test_row_and_column_reductions_of_one_value():
    """A column max recomputed inside the row loop: a lane-wise reduction over rows."""
    x = Tensor.input("x", ("R", "N"))
    g = (x / x.sum(1, keepdim=True) + x.max(0, keepdim=True)).graph("y")
    rng = np.random.default_rng(1)
    for r, n in ((3, 1), (5, 9), (17, 70)):
        check(g, {"x": rng.random((r, n), dtype=np.float32) + 0.5})


@pytest.mark.parametrize("n", [1, 7, 9, 100])
def test_array_phase_with_vector_loops(n):
    """Reductions over both iter axes of one value: the loop-order constraints cycle, the column sum
    becomes an array phase with loops of its own (vectorised over columns)."""
    i, j = Expr.sym("i"), Expr.sym("j")
    M, N = Expr.sym("M"), Expr.sym("N")
    lets = (Let("a", Binary("mul", Read("x", (i, j)), Const(2.0))),
            Let("s", Reduce("sum", (Axis("i", M),), 0.0, dtypes.fp32, Ref("a"))),
            Let("t", Reduce("max", (Axis("j", N),), float("-inf"), dtypes.fp32, Ref("a"))),
            Let("o", Binary("add", Binary("mul", Ref("a"), Ref("s")), Ref("t"))))
    region = Region("k_phase", (Axis("i", M), Axis("j", N)), (("x", MemRef((M, N), dtypes.fp32)),),
                    (Output("y", MemRef((M, N), dtypes.fp32)),), lets, (Yield("o", "y"),))
    env = {"M": 6, "N": n}
    a = np.random.default_rng(n).standard_normal((6, n), dtype=np.float32)
    a[2, n - 1] = np.nan
    out, src = _run_region(region, {"x": a}, env)
    want = play_region(region, {"x": a}, env)["y"]
    assert np.array_equal(np.isnan(out["y"]), np.isnan(want))
    fin = ~np.isnan(want)
    assert rel(out["y"][fin], want[fin]) < 1e-6
    if n >= 7:
        assert "kv_store(a_s" in src


@pytest.mark.parametrize("n", [7, 1023])
def test_erf_runs_in_vector_lanes_and_its_scalar_twin(n):
    """ERF in a loop nest is kv_erf on the lanes and kumiko_erff in the tail (no lane-wise libm call);
    NaN, +-inf and the two polynomial pieces (around |x| = 0.921875) match the evaluator."""
    x = Tensor.input("x", (3, n))
    g = (x.erf() * 2.0).graph("y")
    v = randn(np.random.default_rng(5), 3, n) * 2
    v[0, :4] = [np.nan, np.inf, -np.inf, 0.921875][: min(4, n)]
    src = check(g, {"x": v}, tol=1e-6)
    body = kernel_bodies(src)
    assert "kv_erf(" in body and "kumiko_erff(" in body and "erff(" not in body.replace("kumiko_erff(", "")
