"""The epilogue on the accumulators (``ContractionLowering._tile_epilogue``): where K is one block each
micro-tile hands its sums back (the ``_o`` micro-kernels, no C tile) and the rest of the region runs on them,
KUMIKO_VW points at a time, into the output; no second pass. The kernels match the evaluator with poisoned
outputs and the C-tile path bit for bit, at tile and non-tile sizes (M's last tile, a symbolic M), the weights
bound (pre-packed B, the dealt M blocks) or passed, A read in place or packed, B read from a stage; where it does
not apply (K of several blocks, an N that NR does not divide, an output written along M) the kernel has none of
it."""
import numpy as np
import pytest

import kumiko
import kumiko.kernel.contract as CT
from kumiko import Tensor


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _check(g, shapes=None, fused=True):
    """The kernel against the evaluator (two seeds) and against the C-tile path; its source."""
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    src = exe._run.source
    assert ("_o(kk_kcb" in src) == fused and ("#if KUMIKO_VW != " in src) == fused
    orig = CT.ContractionLowering._tile_epilogue
    try:
        CT.ContractionLowering._tile_epilogue = lambda self: None
        plain = kumiko.compile(g, "cpu")
    finally:
        CT.ContractionLowering._tile_epilogue = orig
    assert "_o(kk_kcb" not in plain._run.source
    for seed in (0, 1):
        ins = exe.random_inputs(seed, shapes)
        out, want, c_tile = exe(**ins), ref(**ins), plain(**ins)
        for k in want:
            assert _rel(out[k], want[k]) <= 2e-6, (k, _rel(out[k], want[k]))
            # the same sums in the same order, the same epilogue: the same bits as through the C tile
            assert np.array_equal(np.asarray(out[k]), np.asarray(c_tile[k])), k
    return src


def _param(rng, shape, name):
    return Tensor((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name=name,
                  role="param")


def _pointwise_conv(hw, cin, cout, residual, bound=True, relu6=False):
    rng = np.random.default_rng(hw * cin + cout)
    x = Tensor.input("x", (1, hw, hw, cin))
    w = _param(rng, (cout, cin, 1, 1), "w") if bound else Tensor.input("w", (cout, cin, 1, 1))
    y = Tensor._record("Conv2D", (x, w), stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1,
                       x_layout="channels_last", y_layout="channels_last") + _param(rng, (cout,), "b")
    if residual:
        y = y + Tensor.input("r", (1, hw, hw, cout))
    y = y.relu()
    return (y.minimum(6.0) if relu6 else y).graph("y")


@pytest.mark.parametrize("hw,cin,cout,residual", [(7, 64, 256, True), (6, 16, 96, False), (13, 24, 48, True),
                                                  (56, 16, 32, False), (9, 200, 16, True)])
def test_pointwise_convs(hw, cin, cout, residual):
    """1x1 convs channels-last (ResNet-50's and MobileNetV2's): 49 and 169 pixels end in a tail tile, 36 do not;
    a K of 200 is still one block."""
    _check(_pointwise_conv(hw, cin, cout, residual))


def test_passed_weights_and_a_packed():
    _check(_pointwise_conv(7, 32, 48, True, bound=False))


@pytest.mark.parametrize("m", [17, 18, 50, 128])
def test_gemm_epilogues(m):
    """GEMMs past the skinny path's rows: bias, a scaled residual, a clamp and a square root on the tile's
    accumulators; GELU (erf, a polynomial written out per vector) left to the block's pass."""
    rng = np.random.default_rng(m)
    x, r = Tensor.input("x", (m, 96)), Tensor.input("r", (m, 64))
    y = x @ _param(rng, (96, 64), "w") + _param(rng, (64,), "b")
    _check(((y + r * 0.5).maximum(-1.0).minimum(1.0) + 2.0).sqrt().graph("y"))
    _check(y.gelu().graph("y"), fused=False)


def test_symbolic_m_guards_the_padding_rows():
    """M known only at run time: no tail kernel, so the last tile's padding rows are not stored (a guard)."""
    g = kumiko.Graph.from_json({
        "name": "gemm_m", "symbols": {"M": 20},
        "signature": {"inputs": [{"tensor": "A", "role": "data"}, {"tensor": "B", "role": "data"},
                                 {"tensor": "bias", "role": "data"}], "outputs": [{"tensor": "C1"}]},
        "tensors": {"A": {"dtype": "fp32", "shape": ["M", 40]}, "B": {"dtype": "fp32", "shape": [40, 32]},
                    "bias": {"dtype": "fp32", "shape": [32]}, "C1": {"dtype": "fp32", "shape": ["M", 32]}},
        "graph": [{"op": "GEMM", "name": "gemm", "inputs": ["A", "B"], "outputs": ["C0"],
                   "attrs": {"acc_dtype": "fp32"}},
                  {"op": "Elementwise", "name": "add", "fn": "add", "inputs": ["C0", "bias"], "outputs": ["C1"]}]})
    for m in (20, 7, 1, 13):
        src = _check(g, shapes={"M": m})
    assert "kk_ic + kk_ir + 5 < kk_M" in src


@pytest.mark.parametrize("k", [600, 1000])
def test_not_with_several_k_blocks(k):
    """K of 600 and 1000: blocks of at most KC, the C tile and the pass (the inlined tile beside the C-tile one
    for the earlier blocks paid nothing and cost gcc time)."""
    rng = np.random.default_rng(k)
    x = Tensor.input("x", (50, k))
    _check((x @ _param(rng, (k, 48), "w") + Tensor.input("r", (50, 48))).relu().graph("y"), fused=False)
    _check(_pointwise_conv(7, k, 32, True), fused=False)
    _check(_pointwise_conv(7, k, 32, False, bound=False), fused=False)


def test_the_sums_come_back_without_a_c_tile():
    """The ``_o`` micro-kernels of every kind take no C tile and no ``acc``: K is one block."""
    from kumiko.kernel import micro
    for src in (micro.micro_kernel(6, 16, 8, out=True), micro.micro_kernel(6, 16, 8, rows=4, out=True),
                micro.stage_micro_kernel(6, 16, 8, out=True), micro.astage_micro_kernel(6, 16, 8, True, out=True)):
        head = src.splitlines()[0]
        assert head.endswith("kk_vf* KUMIKO_RESTRICT o) {") and "acc" not in src and "ldc" not in src, head


def test_not_where_it_does_not_apply():
    rng = np.random.default_rng(0)
    x = Tensor.input("x", (30, 40))                  # 40 columns: NR (16 or 32) does not divide N
    _check((x @ _param(rng, (40, 40), "w")).relu().graph("y"), fused=False)


def test_rows_outer_only_where_the_panels_fit():
    """Row tiles outermost where one K block's panels of the N block fit in L2, panels outermost elsewhere."""
    small = _check(_pointwise_conv(7, 64, 256, True))
    big = _check(_pointwise_conv(7, 256, 512, False))
    assert small.index("for (long long kk_ir = 0") < small.index("for (long long kk_jr = 0")
    assert big.index("for (long long kk_jr = 0") < big.index("for (long long kk_ir = 0")


def test_channels_first_convs():
    """A channels-first 1x1 conv: the pixels are the lanes (8 x 8: one flat span that NR divides); MobileNetV2's
    first conv, channels-first to channels-last, its pixels the lanes, writes along M (the transposed
    epilogue): none there."""
    rng = np.random.default_rng(3)
    x = Tensor.input("x", (1, 24, 8, 8))
    y = Tensor._record("Conv2D", (x, _param(rng, (32, 24, 1, 1), "w")), stride=[1, 1], padding=[0, 0],
                       dilation=[1, 1], groups=1, x_layout="channels_first", y_layout="channels_first")
    _check((y + Tensor.input("r", (1, 32, 8, 8))).relu().graph("y"))
    x = Tensor.input("x", (1, 3, 224, 224))
    y = Tensor._record("Conv2D", (x, _param(rng, (32, 3, 3, 3), "w")), stride=[2, 2], padding=[1, 1],
                       dilation=[1, 1], groups=1, x_layout="channels_first", y_layout="channels_last")
    _check((y + _param(rng, (32,), "b")).relu().graph("y"), fused=False)
