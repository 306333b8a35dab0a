"""Region formation: the kernel boundaries the seeds ask for, and playback equal to the evaluator."""
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.region import form_regions, play_program
from kumiko.region.serial import program_from_json, program_json
from kumiko.region.srnf import epilogue
from kumiko.region.ssa import BroadcastInDim, Read, Reduce, Select
from kumiko.region.verify import verify
from kumiko.symbolic import Expr
from kumiko.tiny.evaluate import bind_symbols

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _check_playback(g, seed=0, shapes=None):
    exe = kumiko.compile(g)
    ins = exe.random_inputs(seed, shapes)
    ref = exe(**ins)
    p = form_regions(g.tiny)
    for r in p.regions:
        verify(r)
    out = play_program(p, ins, bind_symbols(g.tiny, ins))
    for k in ref:
        assert out[k].dtype == ref[k].dtype and out[k].shape == ref[k].shape
        assert _rel(out[k], ref[k]) < 1e-5, k
    return p


def _walk(e):
    yield e
    for k in ("x", "y", "then", "other", "body", "operand", "by"):
        if hasattr(e, k):
            yield from _walk(getattr(e, k))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_play_back_like_the_evaluator(path):
    g = kumiko.load(path)
    _check_playback(g, seed=1)
    _check_playback(g, seed=2, shapes={k: v + 3 for k, v in g.symbols.items()})   # not tile-friendly sizes


def test_gemm_bias_relu_is_one_region_with_epilogue():
    p = form_regions(kumiko.load(EXAMPLES[[e.stem for e in EXAMPLES].index("gemm_bias_relu")]).tiny)
    (r,) = p.regions
    acc = r.lets[0].expr
    assert isinstance(acc, Reduce) and acc.op == "sum" and acc.dtype.name == "fp32"
    # C-CON1: the contraction body reads A[m,k] and B[k,n] directly
    a, b = acc.body.x, acc.body.y
    assert isinstance(a, Read) and isinstance(b, Read)
    assert [str(i) for i in a.index] == ["i0", "r0"] and [str(i) for i in b.index] == ["r0", "i1"]
    assert epilogue(r) == ["add", "relu"]
    bias = r.lets[1].expr.y
    assert isinstance(bias, BroadcastInDim) and isinstance(bias.operand, Read) and bias.operand.tensor == "bias"


def test_conv_relu_maxpool_is_one_region_without_intermediate():
    p = form_regions(kumiko.load(EXAMPLES[[e.stem for e in EXAMPLES].index("conv_relu_maxpool")]).tiny)
    assert len(p.regions) == 1 and p.buffers == ()
    (r,) = p.regions
    assert [o.name for o in r.outputs] == ["Y"] and {n for n, _ in r.inputs} == {"X", "Wt"}
    out = r.lets[-1].expr
    assert isinstance(out, Reduce) and out.op == "max"
    inner = [e for e in _walk(out.body) if isinstance(e, Reduce)]
    assert inner and inner[0].op == "sum"        # conv computed inside the pooling (compute-at)
    assert any("Poly Core says legal" in n for n in r.notes)   # the decision came from Poly Core


@pytest.mark.parametrize("stem", ["conv3x3_s2_p1", "conv3x3_s2_p1_silu"])
def test_conv_is_one_region_with_a_pad_select(stem):
    p = form_regions(kumiko.load(EXAMPLES[[e.stem for e in EXAMPLES].index(stem)]).tiny)
    assert len(p.regions) == 1
    sel = [e for let in p.regions[0].lets for e in _walk(let.expr) if isinstance(e, Select)]
    assert sel and any(isinstance(s.then, Read) and s.then.tensor == "X" for s in sel)
    read = next(s.then for s in sel if isinstance(s.then, Read))
    assert "2*i2" in str(read.index[2]) and "- 1" in str(read.index[2])   # 2*h + kh - 1


def test_attention_splits_with_p_deferred():
    p = form_regions(kumiko.load(EXAMPLES[[e.stem for e in EXAMPLES].index("attention_causal")]).tiny)
    assert len(p.regions) == 2
    first, second = p.regions
    assert first.outputs[0].materialize == "deferred" and second.outputs[0].materialize == "gmem"
    assert first.outputs[0].name in {n for n, _ in second.inputs}
    maxes = [e for let in first.lets for e in _walk(let.expr) if isinstance(e, Reduce) and e.op == "max"]
    sums = [e for let in first.lets for e in _walk(let.expr) if isinstance(e, Reduce) and e.op == "sum"]
    assert len(maxes) == 1 and len(sums) == 2        # QK^T, row max, row sum: never merged (R4)


def test_row_softmax_is_one_region_and_shares_s():
    p = form_regions(kumiko.load(EXAMPLES[[e.stem for e in EXAMPLES].index("attention_row_softmax")]).tiny)
    (r,) = p.regions
    contractions = [e for let in r.lets for e in _walk(let.expr) if isinstance(e, Reduce) and e.op == "sum"
                    and isinstance(e.body, type(r.lets[0].expr.body))]
    assert len([x for x in contractions if any(isinstance(k, Read) and k.tensor == "K" for k in _walk(x))]) == 1


def test_fanout_of_a_reduction_is_materialised_once():
    x = Tensor.input("x", (6, 5))
    w = Tensor.input("w", (5, 4))
    h = x @ w                       # a reduction used by two different kernels
    a = (h.sum(axis=0) * 2.0)
    b = h.max(axis=1)
    g = build2(a, b)
    p = _check_playback(g)
    assert len(p.buffers) == 1 and any("R-fanout" in n or "R-contract" in n for r in p.regions for n in r.notes)


def build2(a, b):
    from kumiko.frontend.tensor import build_graph
    return build_graph({"a": a, "b": b})


def test_cheap_fanout_is_recomputed_not_materialised():
    x = Tensor.input("x", (8, 3))
    e = (x * 2.0).exp()             # cheap: elementwise of an input
    g = build2(e.sum(axis=0), e.max(axis=1))
    p = _check_playback(g)
    assert p.buffers == ()


def test_overlapping_window_materialises_producer():
    x = Tensor.input("x", (1, 2, 10, 10))
    w = Tensor.input("w", (3, 2, 3, 3))
    y = x.conv2d(w, padding=1).relu().max_pool2d(3, stride=1)   # windows overlap: recompute would be 9x
    p = _check_playback(y.graph("y"))
    assert len(p.regions) == 2 and any("R-window" in n and "Poly Core" in n for r in p.regions for n in r.notes)


def test_gather_data_operand_is_a_memref():
    x = Tensor.input("x", (4, 5))
    idx = Tensor.input("idx", (4, 3), "i32")
    y = (x @ Tensor.input("w", (5, 5))).gather(1, idx)
    g = y.graph("y")
    exe = kumiko.compile(g)
    ins = exe.random_inputs(0)
    ref = exe(**ins)
    p = form_regions(g.tiny)
    assert len(p.regions) == 2 and any("R-gather" in n for r in p.regions for n in r.notes)
    out = play_program(p, ins, bind_symbols(g.tiny, ins))
    np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6)


def test_symbolic_reshape_merge_reads_flat():
    x = Tensor.input("x", ("B", "S", 4))
    y = (x * 2.0).reshape(-1, 4).sum(axis=1)
    p = _check_playback(y.graph("y", symbols={"B": 3, "S": 5}))
    assert any(isinstance(e, Read) and e.flat for r in p.regions for let in r.lets for e in _walk(let.expr))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_region_dump_round_trips_and_resumes(path):
    g = kumiko.load(path)
    p = form_regions(g.tiny)
    d = program_json(p)
    back = program_from_json(d)
    assert program_json(back) == d
    exe = kumiko.compile(g)
    ins = exe.random_inputs(4)
    env = bind_symbols(g.tiny, ins)
    a, b = play_program(p, ins, env), play_program(back, ins, env)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_reducing_value_needed_at_two_points_is_materialised_once():
    x, y = Tensor.input("x", (3, 3)), Tensor.input("y", (3, 3))
    t = (x @ y).exp()
    p = _check_playback((t + t.permute(1, 0)).graph("o"))
    assert len(p.regions) == 2 and any("two different points" in n for r in p.regions for n in r.notes)
    e = Tensor.input("e", (3, 3)).exp()          # cheap: recomputed at both points, one kernel
    assert len(_check_playback((e + e.permute(1, 0)).graph("o")).regions) == 1


def _shortcut_block(n=1, c_in=24, c_mid=16, c_out=40, hw=10):
    """ResNet's downsampling block tail: relu(conv1x1(y) + b1 + conv1x1_stride2(x) + b2), the shortcut a
    second contraction over a different K."""
    x = Tensor.input("x", [n, c_in, 2 * hw, 2 * hw])
    y = Tensor.input("y", [n, c_mid, hw, hw])
    w1 = Tensor.input("w1", [c_out, c_mid, 1, 1], role="param")
    w2 = Tensor.input("w2", [c_out, c_in, 1, 1], role="param")
    b1 = Tensor.input("b1", [c_out], role="param")
    b2 = Tensor.input("b2", [c_out], role="param")
    out = (y.conv2d(w1, b1) + x.conv2d(w2, b2, stride=2)).relu()
    return out.graph("out", name="shortcut")


def test_a_second_contraction_gets_a_kernel_of_its_own():
    """Two contractions summed at the top of one kernel: the second would run as scalar loops in the first's
    epilogue (ResNet-50's shortcut: 28 ms fused, under 1 ms as a kernel). R-contract materialises it."""
    g = _shortcut_block()
    p = _check_playback(g)
    assert len(p.regions) == 2
    first, second = p.regions
    assert any("second contraction" in n for n in first.notes)
    for r in p.regions:
        sums = [e for let in r.lets for e in _walk(let.expr) if isinstance(e, Reduce) and e.op == "sum"]
        assert len(sums) == 1, r.name
    assert first.outputs[0].name in {n for n, _ in second.inputs}


@pytest.mark.parametrize("n", [1, 3])
def test_shortcut_block_runs_packed_and_right_on_cpu(n):
    g = _shortcut_block(n=n, c_in=24, c_mid=16, c_out=40, hw=9)
    ref = kumiko.compile(g, target="eval")
    exe = kumiko.compile(g, target="cpu")
    ins = exe.random_inputs(1)
    assert _rel(exe(**ins)["out"], ref(**ins)["out"]) < 1e-5
    plans = exe._run.plans
    assert all(p.algo == "packed" for p in plans.values()), {k: p.algo for k, p in plans.items()}


@pytest.mark.parametrize("n", [1, 2])
def test_conv_then_global_mean_over_unit_batch_runs_packed(n):
    """A 1x1 conv + ReLU6 whose global average pool is computed at it (Poly Core: each element used once; over
    8 x 8 pixels, as many as a vector panel's lanes, R-pool leaves it fused): with a batch of 1 the contraction's
    let has no batch axis, which kept it off the packed path (MobileNetV2's last conv ran as scalar loops)."""
    x = Tensor.input("x", [n, 24, 8, 8])
    w = Tensor.input("w", [40, 24, 1, 1], role="param")
    b = Tensor.input("b", [40], role="param")
    y = x.conv2d(w, b).relu().minimum(6.0).mean((2, 3))
    g = y.graph("y", name="conv_gap")
    ref = kumiko.compile(g, target="eval")
    exe = kumiko.compile(g, target="cpu")
    ins = exe.random_inputs(2)
    assert _rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5
    assert [p.algo for p in exe._run.plans.values()] == ["packed"]


def _residual_stack(layers: int, d: int = 16, rows: int = 6):
    """A pre-LayerNorm residual stream: h = h + relu(layernorm(h) @ W_l + b_l) @ V_l, ``layers`` times."""
    rng = np.random.default_rng(5)
    h = Tensor.input("x", [rows, d])
    for k in range(layers):
        w = Tensor(rng.standard_normal((d, 2 * d)).astype(np.float32) * 0.3, name=f"w{k}", role="param")
        b = Tensor(rng.standard_normal(2 * d).astype(np.float32) * 0.1, name=f"b{k}", role="param")
        v = Tensor(rng.standard_normal((2 * d, d)).astype(np.float32) * 0.3, name=f"v{k}", role="param")
        h = h + ((h.layernorm(-1) @ w) + b).relu() @ v
    return h.graph("y")


@pytest.mark.parametrize("layers", [3, 8])
def test_a_residual_stream_is_not_recomputed_in_every_layer(layers):
    """The residual adds are cheap, but recomputing the stream from all of its terms in every layer's
    LayerNorm made each kernel read one more tensor per layer (GPT-2: quadratic in depth). R-fanout bounds
    what a recomputed value may read; every kernel reads a bounded number of activations."""
    g = _residual_stack(layers)
    p = _check_playback(g)
    act = {n for n, m in p.buffers} | {"x"}
    widest = max(sum(1 for n, _ in r.inputs if n in act) for r in p.regions)
    assert widest <= 3, [(r.name, [n for n, _ in r.inputs if n in act]) for r in p.regions]
    assert len(p.regions) <= 4 * layers + 1
    ref = kumiko.compile(g, target="eval")
    exe = kumiko.compile(g, target="cpu")
    ins = exe.random_inputs(3)
    assert _rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


@pytest.mark.parametrize("batch", [1, 3])
def test_a_gemm_read_through_a_reshape_at_several_points_is_computed_once(batch):
    """GPT-2's MLP: (x.reshape(B*S, D) @ W).reshape(B, S, N) feeds a tanh-GELU that uses it three times. With
    B > 1 the GEMM is read at (S*i0 + i1, i2), not a plain point, and was inlined once per use: three
    contractions in one kernel (GPT-2 batch 8: 21 s a call instead of 0.5 s)."""
    rng = np.random.default_rng(9)
    x = Tensor.input("x", (batch, 6, 16))
    w = Tensor(rng.standard_normal((16, 40)).astype(np.float32) * 0.3, name="w", role="param")
    h = (x.reshape(batch * 6, 16) @ w).reshape(batch, 6, 40)
    g = (h * 0.5 * (1.0 + (0.79788456 * (h + 0.044715 * h ** 3)).tanh())).graph("y")
    p = _check_playback(g)
    (r,) = p.regions
    sums = [e for let in r.lets for e in _walk(let.expr) if isinstance(e, Reduce) and e.op == "sum"]
    assert len(sums) == 1
    ref = kumiko.compile(g, target="eval")
    exe = kumiko.compile(g, target="cpu")
    ins = exe.random_inputs(1)
    assert _rel(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5


def test_r_pool_is_the_cpu_targets():
    """A conv + ReLU pooled whole over 7 x 7 pixels: the cpu target forms the conv and the pool apart (R-pool),
    target-neutral formation (the GPU targets') keeps them one kernel; a sum of a matmul (SRNF R0 merges the
    two sums), a conv's own sum over its taps or channels and a pool over 8 x 8 pixels are never split."""
    from kumiko.region.form import GLOBAL_POOL_POINTS
    x, w = Tensor.input("x", [1, 16, 7, 7]), Tensor.input("w", [24, 16, 3, 3], role="param")
    g = x.conv2d(w, padding=1).relu().mean((2, 3)).graph("y")
    apart = form_regions(g.tiny, pool_points=GLOBAL_POOL_POINTS)
    assert len(apart.regions) == 2 and any("R-pool" in n for n in apart.regions[0].notes)
    assert len(form_regions(g.tiny).regions) == 1
    assert [p.algo for p in kumiko.compile(g, "cpu")._run.plans.values()] == ["packed", "loops"]
    x8 = Tensor.input("x", [1, 16, 8, 8])
    assert len(form_regions(x8.conv2d(w, padding=1).relu().mean((2, 3)).graph("y").tiny,
                            pool_points=GLOBAL_POOL_POINTS).regions) == 1
    a, m = Tensor.input("a", (3, 4)), Tensor.input("m", (4, 5))
    assert len(form_regions((a @ m).sum(axis=1).graph("y").tiny, pool_points=GLOBAL_POOL_POINTS).regions) == 1


def test_each_move_is_asked_once():
    """Region formation restarts when a value must become a root and builds the regions that had inlined it
    again, with the same indices: each movement step (a node at an index, under its iterators' extents) is
    computed once (``Former._move``; GPT-2's 385 region builds asked 11,171 moves of 1,133 distinct ones)."""
    import collections

    import kumiko.region.form as form
    x, w = Tensor.input("x", (8, 16)), Tensor.input("w", (16, 16))
    q = (x @ w).reshape(8, 2, 8).permute(1, 0, 2)
    s = (q @ q.permute(0, 2, 1)).softmax(-1)
    g = ((s @ q).permute(1, 0, 2).reshape(8, 16) + x).graph("y")
    calls: collections.Counter = collections.Counter()
    orig = form.move_index

    def spy(graph, n, index, sizes):
        used = frozenset().union(*(Expr.lift(i).symbols() for i in index))
        calls[(n.id, index, tuple(sorted((a, sizes[a]) for a in used if a in sizes)))] += 1
        return orig(graph, n, index, sizes)
    form.move_index = spy
    try:
        program = form_regions(g.tiny)
    finally:
        form.move_index = orig
    assert len(program.regions) == 3 and calls and max(calls.values()) == 1
