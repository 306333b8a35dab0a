"""Every frontend op against an independent numpy formula, through both the JSON Graph and the Tensor API.

Expected values are written here with plain numpy (float64 where it matters, naive loops for conv and
pooling) and never through kumiko's evaluator. fp32 results must be within 1e-5 relative error (max
abs error over max abs value); fp16/bf16 within a relative L2 error of ~1e-2.
"""
from __future__ import annotations

import json
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.frontend.graph import Graph

BF16 = np.dtype(ml_dtypes.bfloat16)
DT = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16", BF16: "bf16", np.dtype(np.int32): "i32",
      np.dtype(np.bool_): "bool"}


# ------------------------------------------------------------------------------------------------
# helpers


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def randn(rng, *shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def graph_json(op: str, ins: list, attrs: dict | None = None, fn: str | None = None) -> tuple[dict, dict]:
    """A one-op frontend graph in JSON; arrays become signature inputs a0, a1..., scalars stay literals."""
    arrays, names = {}, []
    for k, x in enumerate(ins):
        if isinstance(x, np.ndarray):
            arrays[f"a{k}"] = x
            names.append(f"a{k}")
        elif isinstance(x, float) and not math.isfinite(x):
            names.append({"const": "nan" if x != x else ("inf" if x > 0 else "-inf")})
        else:
            names.append(x)
    node: dict = {"op": op, "name": "the_op", "inputs": names, "outputs": ["y"]}
    if fn is not None:
        node["fn"] = fn
    if attrs:
        node["attrs"] = attrs
    d = {"kumiko": "frontend", "version": 1, "name": "one_op",
         "signature": {"inputs": [{"tensor": n} for n in arrays], "outputs": [{"tensor": "y"}]},
         "tensors": {n: {"dtype": DT[a.dtype], "shape": list(a.shape)} for n, a in arrays.items()},
         "graph": [node]}
    return json.loads(json.dumps(d)), arrays


def run_json(op: str, ins: list, attrs: dict | None = None, fn: str | None = None) -> np.ndarray:
    d, arrays = graph_json(op, ins, attrs, fn)
    g = Graph.from_json(d)
    return kumiko.compile(g, "eval")(**arrays)["y"]   # frontend semantics: the evaluator (cpu: other tests)


def tensors(ins: list) -> list:
    return [Tensor(x, name=f"a{k}") if isinstance(x, np.ndarray) else x for k, x in enumerate(ins)]


def run_tensor(build, ins: list) -> np.ndarray:
    return build(*tensors(ins)).numpy()


def both(op: str, ins: list, attrs: dict | None = None, fn: str | None = None, build=None) -> list[np.ndarray]:
    """Outputs of the JSON path and (when ``build`` is given) of the Tensor API path."""
    outs = [run_json(op, ins, attrs, fn)]
    if build is not None:
        outs.append(run_tensor(build, ins))
    return outs


def assert_rel(got: np.ndarray, want, tol: float = 1e-5, dtype=None) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), got.dtype
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.all(np.isfinite(g) == np.isfinite(w)), "non-finite values differ"
    fin = np.isfinite(w)
    np.testing.assert_array_equal(g[~fin], w[~fin])
    if not fin.any():
        return
    scale = max(np.max(np.abs(w[fin])), 1e-30)
    err = np.max(np.abs(g[fin] - w[fin])) / scale
    assert err < tol, f"relative error {err:.3g} >= {tol}"


def assert_l2(got: np.ndarray, want, tol: float, dtype=None) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), got.dtype
    g, w = got.astype(np.float64), want.astype(np.float64)
    err = np.linalg.norm(g - w) / np.linalg.norm(w)
    assert err < tol, f"relative L2 error {err:.3g} >= {tol}"


def assert_exact(got: np.ndarray, want, dtype=None) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), got.dtype
    np.testing.assert_array_equal(got, want)


def f64(*xs):
    return [np.asarray(x, dtype=np.float64) for x in xs]


# ------------------------------------------------------------------------------------------------
# MatMul (tinygrad's dot: 1-D and N-D rules), compared with np.matmul in float64

MATMUL_SHAPES = [
    ((5,), (5,)),              # 1-D x 1-D -> scalar
    ((5,), (5, 3)),            # 1-D x 2-D
    ((4, 5), (5,)),            # 2-D x 1-D
    ((4, 5), (5, 3)),
    ((5,), (2, 5, 3)),         # 1-D x N-D
    ((2, 4, 5), (5,)),         # N-D x 1-D
    ((2, 1, 4, 5), (3, 5, 6)),  # batch broadcast + rank difference
    ((3, 1, 4, 5), (1, 2, 5, 6)),
    ((1, 4, 5), (3, 5, 2)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("op", ["MatMul", "GEMM", "matmul"])
def test_matmul_rules(sa, sb, op):
    rng = rng_for("mm", sa, sb)
    a, b = randn(rng, *sa), randn(rng, *sb)
    want = np.matmul(*f64(a, b))
    builds = {"MatMul": lambda x, y: x @ y, "GEMM": lambda x, y: x.dot(y), "matmul": lambda x, y: x.matmul(y)}
    for got in both(op, [a, b], build=builds[op]):
        assert_rel(got, want, dtype=np.float32)


def test_matmul_lowers_to_tinygrads_dot_form():
    """Seed 000 §1.1: reshape [M,1,K] / [1,K,N] -> transpose(-1, axis_w) -> broadcast -> MUL -> REDUCE(SUM) over
    the last axis, with an explicit fp32 accumulator; no contraction uop."""
    g = Graph.from_json(graph_json("MatMul", [randn(rng_for("form"), 4, 5), randn(rng_for("form"), 5, 3)])[0])
    uops = [(n.uop, n.shape) for n in g.tiny.nodes.values()]
    assert ("RESHAPE", (4, 1, 5)) in uops and ("RESHAPE", (1, 5, 3)) in uops and ("PERMUTE", (1, 3, 5)) in uops
    assert [u for u, _ in uops].count("MUL") == 1
    red = [n for n in g.tiny.nodes.values() if n.uop == "REDUCE"]
    assert len(red) == 1 and red[0].arg["op"] == "SUM" and tuple(red[0].arg["axes"]) == (2,)
    assert red[0].arg["dtype"] == "fp32" and red[0].shape == (4, 3)
    mul = g.tiny.nodes[red[0].src[0]]
    assert mul.uop == "MUL" and mul.shape == (4, 3, 5)


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_matmul_transpose_flags(ta, tb, batch):
    rng = rng_for("mmT", ta, tb, batch)
    a = randn(rng, *batch, *((5, 4) if ta else (4, 5)))
    b = randn(rng, *batch, *((3, 5) if tb else (5, 3)))
    a64, b64 = f64(a, b)
    want = np.matmul(np.swapaxes(a64, -1, -2) if ta else a64, np.swapaxes(b64, -1, -2) if tb else b64)
    got = run_json("MatMul", [a, b], {"trans_a": ta, "trans_b": tb, "acc_dtype": "fp32"})
    assert_rel(got, want, dtype=np.float32)


def test_matmul_int32_exact():
    rng = rng_for("mmi")
    a = rng.integers(-5, 6, size=(3, 4)).astype(np.int32)
    b = rng.integers(-5, 6, size=(4, 2)).astype(np.int32)
    for got in both("MatMul", [a, b], build=lambda x, y: x @ y):
        assert_exact(got, a.astype(np.int64) @ b.astype(np.int64), dtype=np.int32)


def test_numpy_array_operands_become_data_tensors():
    rng = rng_for("rmm")
    a, b = randn(rng, 3, 4), randn(rng, 4, 2)
    got = (a @ Tensor(b, name="b")).numpy()   # numpy defers to Tensor.__rmatmul__
    assert_rel(got, np.matmul(*f64(a, b)), dtype=np.float32)
    t = Tensor(b, name="b")
    assert_rel((t @ a.T[:2, :2].copy()).numpy(), np.matmul(*f64(b, a.T[:2, :2])), dtype=np.float32)
    c = randn(rng, 4, 2)
    assert_exact((c + t).numpy(), c + b, dtype=np.float32)
    assert_exact((t * c).numpy(), b * c, dtype=np.float32)


def test_matmul_fp16_and_bf16():
    rng = rng_for("mm16")
    a, b = randn(rng, 2, 8, 16), randn(rng, 16, 12)
    want = np.matmul(*f64(a.astype(np.float16), b.astype(np.float16)))
    for got in both("MatMul", [a.astype(np.float16), b.astype(np.float16)], build=lambda x, y: x @ y):
        assert_l2(got, want, 1e-2, dtype=np.float16)
    # out_dtype fp32: the IR multiplies in the input dtype (tinygrad's dot), but a contraction's products are
    # exact in the reference, as in every kernel (an FMA, a tensor core: fp16 x fp16 fits fp32 exactly);
    # the accumulation and the result are fp32
    a64, b64 = f64(a.astype(np.float16), b.astype(np.float16))
    got = run_json("MatMul", [a.astype(np.float16), b.astype(np.float16)], {"out_dtype": "fp32"})
    assert_rel(got, np.matmul(a64, b64), 1e-5, dtype=np.float32)
    ab, bb = a.astype(BF16), b.astype(BF16)
    for got in both("MatMul", [ab, bb], build=lambda x, y: x @ y):
        assert_l2(got, np.matmul(*f64(ab, bb)), 2e-2, dtype=BF16)


# ------------------------------------------------------------------------------------------------
# Conv2D: a naive seven-loop reference


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pads4(p):
    if isinstance(p, int):
        return p, p, p, p
    p = tuple(p)
    return (p[0], p[0], p[1], p[1]) if len(p) == 2 else p


def conv2d_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    x, w = f64(x, w)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    pt, pb, pl, pr = _pads4(padding)
    n_, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    assert cg * groups == c
    xp = np.zeros((n_, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    per_group = co // groups
    out = np.zeros((n_, co, oh, ow))
    for n in range(n_):
        for o in range(co):
            g = o // per_group
            for oy in range(oh):
                for ox in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for ky in range(kh):
                            for kx in range(kw):
                                acc += xp[n, g * cg + ci, oy * sh + ky * dh, ox * sw + kx * dw] * w[o, ci, ky, kx]
                    out[n, o, oy, ox] = acc + (0.0 if b is None else float(b[o]))
    return out


CONV_CASES = [
    # (x shape, w shape, bias, stride, padding, dilation, groups)
    ((2, 3, 7, 6), (4, 3, 3, 3), False, 1, 0, 1, 1),
    ((2, 3, 7, 6), (4, 3, 3, 3), True, 2, 1, 1, 1),
    ((1, 3, 8, 7), (2, 3, 3, 2), False, [2, 1], [1, 2], 1, 1),
    ((1, 2, 9, 8), (3, 2, 3, 3), True, 1, [0, 2, 1, 0], 2, 1),
    ((2, 4, 6, 6), (6, 2, 3, 3), True, 1, 1, 1, 2),
    ((1, 4, 7, 7), (4, 1, 3, 3), False, 2, 1, 1, 4),            # depthwise
    ((1, 6, 9, 10), (9, 2, 3, 2), True, [2, 3], [2, 1, 0, 2], [2, 1], 3),
    ((2, 3, 5, 4), (5, 3, 1, 1), True, 1, 0, 1, 1),              # 1x1
    ((1, 2, 5, 5), (3, 2, 5, 5), False, 1, 0, 1, 1),             # kernel == input
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"conv{i}" for i in range(len(CONV_CASES))])
def test_conv2d(case):
    xs, ws, has_bias, stride, padding, dilation, groups = case
    rng = rng_for("conv", case)
    x, w = randn(rng, *xs), randn(rng, *ws)
    ins = [x, w] + ([randn(rng, ws[0])] if has_bias else [])
    want = conv2d_ref(x, w, ins[2] if has_bias else None, stride, padding, dilation, groups)
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}

    def build(x, w, b=None):
        return x.conv2d(w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    for got in both("Conv2D", ins, attrs, build=build):
        assert_rel(got, want, dtype=np.float32)


def test_conv2d_alias_and_defaults():
    rng = rng_for("conv-alias")
    x, w = randn(rng, 1, 2, 5, 5), randn(rng, 3, 2, 2, 2)
    want = conv2d_ref(x, w)
    for op in ("Conv2D", "conv", "conv2d"):
        assert_rel(run_json(op, [x, w]), want, dtype=np.float32)


def test_conv2d_fp16():
    rng = rng_for("conv16")
    x, w, b = randn(rng, 1, 4, 6, 6, dtype=np.float16), randn(rng, 4, 2, 3, 3, dtype=np.float16), \
        randn(rng, 4, dtype=np.float16)
    want = conv2d_ref(x, w, b, 1, 1, 1, 2)
    for got in both("Conv2D", [x, w, b], {"padding": 1, "groups": 2},
                    build=lambda x, w, b: x.conv2d(w, b, padding=1, groups=2)):
        assert_l2(got, want, 1e-2, dtype=np.float16)
    got = run_json("Conv2D", [x, w, b], {"padding": 1, "groups": 2, "out_dtype": "fp32"})
    assert_rel(got, conv2d_ref(x, w, b, 1, 1, 1, 2), 1e-5, dtype=np.float32)   # exact products (see matmul)


# ------------------------------------------------------------------------------------------------
# pooling with PyTorch semantics, written as naive loops


def _pool_out(size, lo, hi, k, s, d, ceil):
    span = size + lo + hi - d * (k - 1) - 1
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= size + lo:   # torch: the last window must start inside input or left padding
        o -= 1
    return o


def pool_ref(x, kind, kernel, stride=None, padding=0, dilation=1, ceil_mode=False, count_include_pad=True):
    x = np.asarray(x, dtype=np.float64)
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride if stride is not None else kernel)
    dh, dw = _pair(dilation)
    pt, pb, pl, pr = _pads4(padding)
    h, w = x.shape[-2:]
    oh = _pool_out(h, pt, pb, kh, sh, dh, ceil_mode)
    ow = _pool_out(w, pl, pr, kw, sw, dw, ceil_mode)
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - pt, ox * sw - pl
            rows = [y0 + ky * dh for ky in range(kh)]
            cols = [x0 + kx * dw for kx in range(kw)]
            rv = [r for r in rows if 0 <= r < h]
            cv = [c for c in cols if 0 <= c < w]
            win = x[..., rv, :][..., cv]
            if kind == "max":
                out[..., oy, ox] = win.max(axis=(-2, -1))
            else:
                if count_include_pad:   # torch: the window clipped to the padded extent (never ceil overflow)
                    cnt = (min(y0 + kh, h + pb) - y0) * (min(x0 + kw, w + pr) - x0)
                else:
                    cnt = len(rv) * len(cv)
                out[..., oy, ox] = win.sum(axis=(-2, -1)) / cnt
    return out


MAXPOOL_CASES = [
    # kernel, stride, padding, dilation, ceil_mode
    (2, None, 0, 1, False),
    (3, 2, 1, 1, False),
    (3, 2, 1, 1, True),
    (2, 2, 0, 1, True),             # odd size: ceil adds a partial window
    (2, 3, 1, 1, True),             # ceil's extra window would start in the right padding: dropped
    (3, 1, 2, 2, False),            # dilation
    (3, 2, 1, 2, True),
    ([3, 2], [2, 1], [1, 0], 1, False),
    ([2, 3], [1, 2], [0, 1, 1, 1], [1, 2], True),
]


@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=[f"max{i}" for i in range(len(MAXPOOL_CASES))])
@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (3, 4, 5)])
def test_maxpool(case, shape):
    kernel, stride, padding, dilation, ceil = case
    rng = rng_for("maxpool", case, shape)
    x = randn(rng, *shape)
    want = pool_ref(x, "max", kernel, stride, padding, dilation, ceil)
    attrs = {"kernel": kernel, "padding": padding, "dilation": dilation, "ceil_mode": ceil}
    if stride is not None:
        attrs["stride"] = stride
    for got in both("MaxPool", [x], attrs, build=lambda t: t.max_pool2d(kernel, stride, padding, dilation, ceil)):
        assert_rel(got, want, dtype=np.float32)


def test_maxpool_int32_and_alias():
    rng = rng_for("maxpool-int")
    x = rng.integers(-50, 50, size=(2, 5, 6)).astype(np.int32)
    want = pool_ref(x, "max", 3, 2, 1, 1, True).astype(np.int32)
    got = run_json("MaxPool2D", [x], {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True})
    assert_exact(got, want, dtype=np.int32)


AVGPOOL_CASES = [
    # kernel, stride, padding, ceil_mode
    (2, None, 0, False),
    (3, 2, 1, False),
    (3, 2, 1, True),
    (2, 2, 0, True),
    (2, 3, 1, True),
    (3, 1, 1, False),
    ([3, 2], [2, 1], [1, 0], True),
    ([3, 3], [2, 2], [1, 0, 0, 1], False),
]


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("case", AVGPOOL_CASES, ids=[f"avg{i}" for i in range(len(AVGPOOL_CASES))])
def test_avgpool(case, include):
    kernel, stride, padding, ceil = case
    rng = rng_for("avgpool", case, include)
    x = randn(rng, 2, 3, 7, 8)
    want = pool_ref(x, "avg", kernel, stride, padding, 1, ceil, include)
    attrs = {"kernel": kernel, "padding": padding, "ceil_mode": ceil, "count_include_pad": include}
    if stride is not None:
        attrs["stride"] = stride
    for got in both("AvgPool", [x], attrs,
                    build=lambda t: t.avg_pool2d(kernel, stride, padding, ceil, count_include_pad=include)):
        assert_rel(got, want, dtype=np.float32)


def test_avgpool_default_counts_padding_and_fp16():
    rng = rng_for("avgpool-default")
    x = randn(rng, 1, 2, 6, 5)
    got = run_json("AvgPool2D", [x], {"kernel": 3, "stride": 2, "padding": 1})
    assert_rel(got, pool_ref(x, "avg", 3, 2, 1, 1, False, True), dtype=np.float32)
    xh = x.astype(np.float16)
    got = run_json("AvgPool", [xh], {"kernel": 3, "stride": 2, "padding": 1, "count_include_pad": False})
    assert_l2(got, pool_ref(xh, "avg", 3, 2, 1, 1, False, False), 1e-2, dtype=np.float16)


# ------------------------------------------------------------------------------------------------
# Softmax / LogSoftmax / LayerNorm


def softmax_ref(x, axis):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    x = np.asarray(x, dtype=np.float64)
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("axis", [-1, 0, 1, -2, None])
def test_softmax_and_log_softmax(axis):
    rng = rng_for("softmax", axis)
    x = randn(rng, 3, 4, 5, scale=3.0)
    ax = -1 if axis is None else axis
    attrs = None if axis is None else {"axis": axis}
    for got in both("Softmax", [x], attrs, build=lambda t: t.softmax(ax)):
        assert_rel(got, softmax_ref(x, ax), dtype=np.float32)
    for got in both("LogSoftmax", [x], attrs, build=lambda t: t.log_softmax(ax)):
        assert_rel(got, log_softmax_ref(x, ax), dtype=np.float32)
    assert_rel(run_json("Softmax", [x], {"axis": ax, "log": True}), log_softmax_ref(x, ax))


def test_softmax_16bit():
    rng = rng_for("softmax16")
    x = randn(rng, 4, 33, scale=2.0)
    for dt, tol in ((np.float16, 1e-2), (BF16, 2e-2)):
        xd = x.astype(dt)
        for got in both("Softmax", [xd], {"axis": -1}, build=lambda t: t.softmax(-1)):
            assert_l2(got, softmax_ref(xd, -1), tol, dtype=dt)


def layernorm_ref(x, axis, eps=1e-5, w=None, b=None):
    x = np.asarray(x, dtype=np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if w is not None:
        y = y * np.asarray(w, dtype=np.float64)
    if b is not None:
        y = y + np.asarray(b, dtype=np.float64)
    return y


@pytest.mark.parametrize("axis", [-1, -2, 2])
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_layernorm(axis, affine, eps):
    rng = rng_for("ln", axis, affine, eps)
    x = randn(rng, 2, 3, 4, 5, scale=2.0) + 0.5
    norm = x.shape[axis:]
    w = randn(rng, *norm) if affine != "none" else None
    b = randn(rng, *norm) if affine == "weight+bias" else None
    ins = [a for a in (x, w, b) if a is not None]
    attrs = {"axis": axis}
    if eps is not None:
        attrs["eps"] = eps
    want = layernorm_ref(x, axis, 1e-5 if eps is None else eps, w, b)

    def build(t, *wb):
        return t.layernorm(axis, 1e-5 if eps is None else eps, *wb)

    for op in ("LayerNorm", "LayerNormalization"):
        assert_rel(run_json(op, ins, attrs), want, dtype=np.float32)
    assert_rel(run_tensor(build, ins), want, dtype=np.float32)


def test_layernorm_16bit():
    rng = rng_for("ln16")
    x, w, b = randn(rng, 3, 16, scale=2.0), randn(rng, 16), randn(rng, 16)
    for dt, tol in ((np.float16, 1e-2), (BF16, 2e-2)):
        xd, wd, bd = x.astype(dt), w.astype(dt), b.astype(dt)
        for got in both("LayerNorm", [xd, wd, bd], {"axis": -1}, build=lambda t, w, b: t.layernorm(-1, 1e-5, w, b)):
            assert_l2(got, layernorm_ref(xd, -1, 1e-5, wd, bd), tol, dtype=dt)


# ------------------------------------------------------------------------------------------------
# Attention (torch scaled_dot_product_attention semantics)


def attention_ref(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = f64(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    m, n = s.shape[-2:]
    if causal:   # top-left aligned, as torch's is_causal: query i sees keys j <= i
        keep = np.tril(np.ones((m, n), dtype=bool))
        s = np.where(keep, s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask.astype(np.float64)
    return np.matmul(softmax_ref(s, -1), v)


def _bool_mask(rng, shape):
    m = rng.random(shape) < 0.6
    m[..., 0] = True   # every query keeps at least one key
    return m


ATTN_CASES = ["plain", "causal", "causal_square", "causal_tall", "bool_mask", "bool_mask_full", "float_mask",
              "scale", "causal+mask", "rank2", "rank3"]


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention(case):
    rng = rng_for("attn", case)
    b, h, m, n, d, dv = 2, 3, 5, 7, 8, 6
    if case == "causal_square":
        n = m
    elif case == "causal_tall":   # more queries than keys: the rows past n see every key
        m, n = 7, 4
    lead = {"rank2": (), "rank3": (h,)}.get(case, (b, h))
    q, k, v = randn(rng, *lead, m, d), randn(rng, *lead, n, d), randn(rng, *lead, n, dv)
    mask, causal, scale = None, case.startswith("causal"), None
    if case == "bool_mask":
        mask = _bool_mask(rng, (m, n))
    elif case == "bool_mask_full":
        mask = _bool_mask(rng, (b, h, m, n))
    elif case == "float_mask":
        mask = randn(rng, b, 1, m, n, scale=2.0)
    elif case == "scale":
        scale = 0.3
    elif case == "causal+mask":
        mask = randn(rng, m, n)
    want = attention_ref(q, k, v, mask, causal, scale)
    ins = [q, k, v] + ([mask] if mask is not None else [])
    attrs = {"causal": causal}
    if scale is not None:
        attrs["scale"] = scale

    def build(q, k, v, mask=None):
        return q.scaled_dot_product_attention(k, v, mask, is_causal=causal, scale=scale)

    for got in both("Attention", ins, attrs, build=build):
        assert_rel(got, want, dtype=np.float32)


def test_attention_fp16():
    rng = rng_for("attn16")
    q, k, v = (randn(rng, 2, 6, 16, dtype=np.float16) for _ in range(3))
    for got in both("Attention", [q, k, v], {"causal": True},
                    build=lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True)):
        assert_l2(got, attention_ref(q, k, v, causal=True), 1e-2, dtype=np.float16)


# ------------------------------------------------------------------------------------------------
# Reduce


REDUCE_NP = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


@pytest.mark.parametrize("fn", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("axes", [None, [1], [0, 2], -1, [-1, 0], [0, 1, 2]])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce(fn, axes, keepdim):
    rng = rng_for("reduce", fn, axes, keepdim)
    x = randn(rng, 3, 4, 5)
    npax = None if axes is None else (tuple(axes) if isinstance(axes, list) else axes)
    want = REDUCE_NP[fn](x.astype(np.float64), axis=npax, keepdims=keepdim)
    attrs = {"fn": fn, "keepdim": keepdim}
    if axes is not None:
        attrs["axes"] = axes
    for got in both("Reduce", [x], attrs, build=lambda t: getattr(t, fn)(axes, keepdim)):
        assert_rel(got, want, dtype=np.float32)


def test_reduce_int_bool_and_16bit():
    rng = rng_for("reduce-int")
    xi = rng.integers(-100, 100, size=(4, 6)).astype(np.int32)
    assert_exact(run_json("Reduce", [xi], {"fn": "sum", "axes": [1]}), xi.sum(axis=1), dtype=np.int32)
    assert_exact(run_json("Reduce", [xi], {"fn": "max", "axes": [0]}), xi.max(axis=0), dtype=np.int32)
    assert_exact(run_json("Reduce", [xi], {"fn": "min"}), xi.min(), dtype=np.int32)
    xb = rng.random((4, 6)) < 0.3
    assert_exact(run_json("Reduce", [xb], {"fn": "max", "axes": [1]}), xb.any(axis=1), dtype=np.bool_)
    assert_exact(run_json("Reduce", [xb], {"fn": "min", "axes": [1]}), xb.all(axis=1), dtype=np.bool_)
    xh = randn(rng, 8, 64, dtype=np.float16)
    for fn in ("sum", "mean"):
        got = run_json("Reduce", [xh], {"fn": fn, "axes": [1]})
        assert_l2(got, REDUCE_NP[fn](xh.astype(np.float64), axis=1), 1e-2, dtype=np.float16)
    xbf = randn(rng, 8, 64, dtype=BF16)
    assert_l2(run_tensor(lambda t: t.sum(1), [xbf]), xbf.astype(np.float64).sum(axis=1), 2e-2, dtype=BF16)


# ------------------------------------------------------------------------------------------------
# Elementwise


_erf = np.vectorize(math.erf)


def _pos(x):   # keep away from zero and negative values for log/sqrt/recip
    return np.abs(x) + 0.25


def _nonzero(x):
    return np.where(x < 0, x - 0.25, x + 0.25).astype(x.dtype)


UNARY = {
    # fn: (numpy reference on float64, input transform, Tensor method)
    "neg": (lambda x: -x, None, lambda t: -t),
    "relu": (lambda x: np.maximum(x, 0), None, lambda t: t.relu()),
    "abs": (np.abs, None, lambda t: t.abs()),
    "exp": (np.exp, None, lambda t: t.exp()),
    "exp2": (np.exp2, None, lambda t: t.exp2()),
    "log": (np.log, _pos, lambda t: t.log()),
    "log2": (np.log2, _pos, lambda t: t.log2()),
    "sqrt": (np.sqrt, _pos, lambda t: t.sqrt()),
    "rsqrt": (lambda x: 1 / np.sqrt(x), _pos, lambda t: t.rsqrt()),
    "recip": (lambda x: 1 / x, _nonzero, lambda t: t.reciprocal()),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), None, lambda t: t.sigmoid()),
    "silu": (lambda x: x / (1 + np.exp(-x)), None, lambda t: t.silu()),
    "tanh": (np.tanh, None, lambda t: t.tanh()),
    "erf": (_erf, None, lambda t: t.erf()),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), None, lambda t: t.gelu()),
}


@pytest.mark.parametrize("fn", sorted(UNARY))
def test_unary(fn):
    ref, prep, method = UNARY[fn]
    rng = rng_for("unary", fn)
    x = randn(rng, 3, 4, 5, scale=2.0)
    if prep is not None:
        x = prep(x).astype(np.float32)
    want = ref(x.astype(np.float64))
    for got in both("Elementwise", [x], fn=fn, build=method):
        assert_rel(got, want, dtype=np.float32)


def test_gelu_tanh_and_leaky_relu():
    rng = rng_for("gelu-tanh")
    x = randn(rng, 4, 9, scale=2.5)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    for got in both("Elementwise", [x], {"approximate": "tanh"}, fn="gelu", build=lambda t: t.gelu("tanh")):
        assert_rel(got, want, dtype=np.float32)
    assert_rel(run_json("Elementwise", [x], {"approximate": "none"}, fn="gelu"),
               0.5 * x64 * (1 + _erf(x64 / math.sqrt(2))))
    for alpha in (None, 0.2):
        a = 0.01 if alpha is None else alpha
        want = np.where(x64 > 0, x64, a * x64)
        for got in both("Elementwise", [x], None if alpha is None else {"alpha": alpha}, fn="leaky_relu",
                        build=lambda t, a=a: t.leaky_relu(a)):
            assert_rel(got, want, dtype=np.float32)


def test_unary_fn_names_are_case_insensitive():
    rng = rng_for("case")
    x = randn(rng, 6)
    assert_rel(run_json("Elementwise", [x], fn="ReLU"), np.maximum(x.astype(np.float64), 0))


def test_unary_16bit():
    rng = rng_for("unary16")
    x = randn(rng, 64, scale=2.0)
    for dt, tol in ((np.float16, 1e-2), (BF16, 2e-2)):
        xd = x.astype(dt)
        x64 = xd.astype(np.float64)
        for fn in ("gelu", "silu", "exp", "tanh", "sigmoid"):
            ref = UNARY[fn][0]
            for got in both("Elementwise", [xd], fn=fn, build=UNARY[fn][2]):
                assert_l2(got, ref(x64), tol, dtype=dt)


BINARY = {
    "add": (np.add, lambda a, b: a + b),
    "sub": (np.subtract, lambda a, b: a - b),
    "mul": (np.multiply, lambda a, b: a * b),
    "div": (np.divide, lambda a, b: a / b),
    "max": (np.maximum, lambda a, b: a.maximum(b) if isinstance(a, Tensor) else b.maximum(a)),
    "min": (np.minimum, lambda a, b: a.minimum(b) if isinstance(a, Tensor) else b.minimum(a)),
    "pow": (np.power, lambda a, b: a ** b if isinstance(a, Tensor) else None),
}

BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 1, 5), (4, 5)), ((5,), (2, 3, 5)), ((2, 1), (1, 3)), ((3, 4), None),
                 (None, (3, 4))]


@pytest.mark.parametrize("fn", sorted(BINARY))
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=[str(s) for s in BINARY_SHAPES])
def test_binary(fn, shapes):
    ref, op = BINARY[fn]
    rng = rng_for("binary", fn, shapes)
    ins = []
    for s in shapes:
        if s is None:
            ins.append(1.75)   # a scalar literal
        else:
            v = randn(rng, *s)
            ins.append(_pos(v).astype(np.float32) if fn == "pow" and not ins else
                       _nonzero(v) if fn == "div" and ins else v)
    if fn == "pow" and not isinstance(ins[0], np.ndarray):
        ins[1] = np.clip(ins[1], -3, 3).astype(np.float32)
    want = ref(*[np.asarray(a, dtype=np.float64) for a in ins])
    build = op if (fn != "pow" or isinstance(ins[0], np.ndarray)) else None
    for got in both("Elementwise", ins, fn=fn, build=build):
        assert_rel(got, want, dtype=np.float32)


def test_binary_int32_exact():
    rng = rng_for("binary-int")
    a = rng.integers(-50, 50, size=(3, 4)).astype(np.int32)
    b = rng.integers(-50, 50, size=(4,)).astype(np.int32)
    for fn, ref in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("max", np.maximum),
                    ("min", np.minimum)):
        assert_exact(run_json("Elementwise", [a, b], fn=fn), ref(a, b), dtype=np.int32)
    assert_exact(run_json("Elementwise", [a, 3], fn="mul"), a * 3, dtype=np.int32)
    assert_exact(run_json("Elementwise", [a, 2.0], fn="add"), a + 2, dtype=np.int32)   # integral float literal
    assert_exact(run_json("Elementwise", [a, 2.0], fn="lt"), a < 2, dtype=np.bool_)
    for fn, ref in (("neg", np.negative), ("abs", np.abs), ("relu", lambda v: np.maximum(v, 0))):
        assert_exact(run_json("Elementwise", [a], fn=fn), ref(a), dtype=np.int32)


COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal}
COMPARE_T = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
             "ge": lambda a, b: a >= b, "eq": lambda a, b: a.eq(b), "ne": lambda a, b: a.ne(b)}


@pytest.mark.parametrize("fn", sorted(COMPARE))
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_compare(fn, dtype):
    rng = rng_for("cmp", fn, dtype)
    a = rng.integers(-2, 3, size=(3, 4)).astype(dtype)   # small ints so equality happens often
    b = rng.integers(-2, 3, size=(4,)).astype(dtype)
    for got in both("Elementwise", [a, b], fn=fn, build=COMPARE_T[fn]):
        assert_exact(got, COMPARE[fn](a, b), dtype=np.bool_)
    lit = 1.0 if dtype == np.float32 else 1
    for got in both("Elementwise", [a, lit], fn=fn, build=COMPARE_T[fn]):
        assert_exact(got, COMPARE[fn](a, lit), dtype=np.bool_)
    assert_exact(run_json("Elementwise", [lit, a], fn=fn), COMPARE[fn](lit, a), dtype=np.bool_)


def test_where():
    rng = rng_for("where")
    c = rng.random((3, 1, 5)) < 0.5
    a, b = randn(rng, 4, 5), randn(rng, 3, 4, 1)
    for got in both("Elementwise", [c, a, b], fn="where", build=lambda c, a, b: c.where(a, b)):
        assert_exact(got, np.where(c, a, b), dtype=np.float32)
    for got in both("Elementwise", [c, a, 0.5], fn="where", build=lambda c, a, b: c.where(a, b)):
        assert_exact(got, np.where(c, a, np.float32(0.5)), dtype=np.float32)
    for got in both("Elementwise", [c, -2.0, b], fn="where", build=lambda c, a, b: c.where(a, b)):
        assert_exact(got, np.where(c, np.float32(-2.0), b), dtype=np.float32)
    got = run_json("Elementwise", [c, a, float("-inf")], fn="where")
    assert_exact(got, np.where(c, a, -np.inf).astype(np.float32), dtype=np.float32)
    ci = rng.integers(-9, 9, size=(3, 4, 5)).astype(np.int32)
    got = run_json("Elementwise", [c, ci, 7], fn="where")
    assert_exact(got, np.where(c, ci, 7), dtype=np.int32)
    # both values literals: fp32 if either is a float, i32 for ints, bool for bools
    for a_, b_, dt in ((1.5, 0, np.float32), (3, -1, np.int32), (False, True, np.bool_)):
        for got in both("Elementwise", [c, a_, b_], fn="where", build=lambda c, a, b: c.where(a, b)):
            assert_exact(got, np.where(c, np.asarray(a_, dt), np.asarray(b_, dt)), dtype=dt)
    cb1, cb2 = rng.random((2, 5)) < 0.5, rng.random((2, 5)) < 0.5
    assert_exact(run_json("Elementwise", [c[0, :, :].repeat(2, 0), cb1, cb2], fn="where"),
                 np.where(c[0].repeat(2, 0), cb1, cb2), dtype=np.bool_)


def test_clip():
    rng = rng_for("clip")
    x = randn(rng, 4, 6, scale=2.0)
    for lo, hi in ((-0.5, 0.7), (None, 0.3), (-0.2, None)):
        want = np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)
        attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
        for got in both("Elementwise", [x], attrs, fn="clip", build=lambda t, lo=lo, hi=hi: t.clip(lo, hi)):
            assert_exact(got, want, dtype=np.float32)
    xi = rng.integers(-9, 9, size=(10,)).astype(np.int32)
    assert_exact(run_json("Elementwise", [xi], {"min": -2, "max": 3}, fn="clip"), np.clip(xi, -2, 3), dtype=np.int32)


def test_cast():
    x = np.array([[-2.7, -1.5, -0.5, -0.0], [0.4, 1.0, 2.9, 123.99]], dtype=np.float32)
    trunc = np.array([[-2, -1, 0, 0], [0, 1, 2, 123]], dtype=np.int32)   # C semantics: toward zero
    nz = np.array([[True, True, True, False], [True, True, True, True]])
    for op, attrs, fn in (("Elementwise", {"to": "i32"}, "cast"), ("Cast", {"to": "i32"}, None)):
        assert_exact(run_json(op, [x], attrs, fn), trunc, dtype=np.int32)
    assert_exact(run_tensor(lambda t: t.cast("i32"), [x]), trunc, dtype=np.int32)
    for got in both("Cast", [x], {"to": "bool"}, build=lambda t: t.cast("bool")):
        assert_exact(got, nz, dtype=np.bool_)
    xi = np.array([-3, 0, 5, 1 << 20], dtype=np.int32)
    assert_exact(run_json("Cast", [xi], {"to": "fp32"}), xi.astype(np.float32), dtype=np.float32)
    assert_exact(run_json("Cast", [xi], {"to": "bool"}), xi != 0, dtype=np.bool_)
    xb = np.array([True, False, True])
    assert_exact(run_json("Cast", [xb], {"to": "fp32"}), xb.astype(np.float32), dtype=np.float32)
    assert_exact(run_json("Cast", [xb], {"to": "i32"}), xb.astype(np.int32), dtype=np.int32)
    rng = rng_for("cast")
    xf = randn(rng, 5, 7, scale=10.0)
    for got in both("Cast", [xf], {"to": "fp16"}, build=lambda t: t.half()):
        assert_exact(got, xf.astype(np.float16), dtype=np.float16)
    assert_exact(run_json("Cast", [xf], {"to": "bf16"}), xf.astype(BF16), dtype=BF16)
    assert_exact(run_tensor(lambda t: t.float(), [xf.astype(np.float16)]), xf.astype(np.float16).astype(np.float32),
                 dtype=np.float32)
    assert_exact(run_json("Elementwise", [xf], {"to": "float16"}, fn="cast"), xf.astype(np.float16),
                 dtype=np.float16)   # numpy-style dtype alias


def test_elementwise_chain_with_scalars_both_sides():
    rng = rng_for("chain")
    x, y = randn(rng, 4, 5), randn(rng, 5)

    def build(x, y):
        return ((2.0 - x) * y + 0.5) / (1.0 + (x * x))

    x64, y64 = f64(x, y)
    assert_rel(run_tensor(build, [x, y]), ((2.0 - x64) * y64 + 0.5) / (1.0 + x64 * x64), dtype=np.float32)


# ------------------------------------------------------------------------------------------------
# movement ops (exact)


@pytest.mark.parametrize("shape", [[4, -1], [-1], [2, 1, 12], [-1, 2, 3], [24, 1], [2, 3, 4]])
def test_reshape(shape):
    x = randn(rng_for("reshape", shape), 2, 3, 4)
    for got in both("Reshape", [x], {"shape": shape}, build=lambda t: t.reshape(shape)):
        assert_exact(got, x.reshape(shape), dtype=np.float32)


def test_reshape_helpers():
    x = randn(rng_for("reshape-helpers"), 2, 1, 3, 4)
    assert_exact(run_tensor(lambda t: t.flatten(1), [x]), x.reshape(2, -1))
    assert_exact(run_tensor(lambda t: t.flatten(), [x]), x.reshape(-1))
    assert_exact(run_tensor(lambda t: t.unsqueeze(0), [x]), x[None])
    assert_exact(run_tensor(lambda t: t.unsqueeze(-1), [x]), x[..., None])
    assert_exact(run_tensor(lambda t: t.squeeze(), [x]), x.squeeze())
    assert_exact(run_tensor(lambda t: t.squeeze(1), [x]), x.squeeze(1))


@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 0, 1], [0, 1, 2], [2, 1, 0], None])
def test_permute(perm):
    x = randn(rng_for("perm", perm), 2, 3, 4)
    want = np.transpose(x, perm)
    attrs = None if perm is None else {"perm": perm}
    assert_exact(run_json("Permute", [x], attrs), want, dtype=np.float32)
    assert_exact(run_json("Transpose", [x], attrs), want, dtype=np.float32)
    if perm is not None:
        assert_exact(run_tensor(lambda t: t.permute(perm), [x]), want)
    assert_exact(run_tensor(lambda t: t.transpose(0, 2), [x]), np.swapaxes(x, 0, 2))
    assert_exact(run_tensor(lambda t: t.T, [x]), np.swapaxes(x, -1, -2))


@pytest.mark.parametrize("src,shape", [((3, 1), [2, 3, 4]), ((3, 1), [2, -1, 4]), ((1,), [5]), ((1, 4), [3, 4]),
                                       ((2, 1, 3), [4, 2, 5, 3]), ((3,), [2, 2, 3])])
def test_expand(src, shape):
    x = randn(rng_for("expand", src, shape), *src)
    npshape = [s if s != -1 else src[k - (len(shape) - len(src))] for k, s in enumerate(shape)]
    for got in both("Expand", [x], {"shape": shape}, build=lambda t: t.expand(shape)):
        assert_exact(got, np.broadcast_to(x, npshape), dtype=np.float32)


def pad_ref(x, pads, value=0.0):
    pos = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    y = np.pad(x, pos, mode="constant", constant_values=value)
    sl = tuple(slice(-min(lo, 0), y.shape[k] + min(hi, 0)) for k, (lo, hi) in enumerate(pads))
    return y[sl]


@pytest.mark.parametrize("pads,value", [
    ([[1, 2], [0, 3]], None),
    ([[1, 2], [0, 3]], 1.5),
    ([[-1, 2], [1, -2]], None),
    ([[-2, -1], [-1, 0]], -3.0),
    ([[0, 0], [2, 2]], float("-inf")),
])
def test_pad(pads, value):
    x = randn(rng_for("pad", pads, value), 4, 5)
    want = pad_ref(x, pads, 0.0 if value is None else value)
    attrs = {"pads": pads}
    if value is not None:
        attrs["value"] = value if math.isfinite(value) else {"const": "-inf"}
    assert_exact(run_json("Pad", [x], attrs), want, dtype=np.float32)
    assert_exact(run_tensor(lambda t: t.pad(pads, 0.0 if value is None else value), [x]), want, dtype=np.float32)


def test_pad_int_and_bool():
    xi = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    assert_exact(run_json("Pad", [xi], {"pads": [[1, 0], [-1, 2]], "value": 9}), pad_ref(xi, [[1, 0], [-1, 2]], 9),
                 dtype=np.int32)
    xb = np.array([[True, False, True]])
    assert_exact(run_json("Pad", [xb], {"pads": [[0, 1], [1, 1]]}), pad_ref(xb, [[0, 1], [1, 1]], False),
                 dtype=np.bool_)


BIG = 2 ** 31 - 1
SLICES = [
    # (starts, ends, axes, steps) on a [6, 7, 5] input
    ([1], [5], [0], None),
    ([-4], [-1], [1], None),
    ([0, 1], [6, 7], [0, 2], [2, 3]),
    ([5], [0], [0], [-1]),
    ([-1], [-BIG], [1], [-2]),
    ([BIG], [-BIG], [2], [-1]),
    ([2, -2], [BIG, 0], [-1, 0], [2, -3]),
    ([-100], [100], [1], [3]),
    ([1, 0, 4], [3, 7, 0], [0, 1, 2], [1, 4, -2]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = randn(rng_for("slice", starts, ends), 6, 7, 5)
    idx = [slice(None)] * 3
    for k, (s, e, a) in enumerate(zip(starts, ends, axes)):
        idx[a] = slice(s, e, 1 if steps is None else steps[k])
    want = x[tuple(idx)]
    attrs = {"starts": starts, "ends": ends, "axes": axes}
    if steps is not None:
        attrs["steps"] = steps
    assert_exact(run_json("Slice", [x], attrs), want, dtype=np.float32)


def test_slice_default_axes_and_getitem():
    x = randn(rng_for("getitem"), 6, 7, 5)
    assert_exact(run_json("Slice", [x], {"starts": [1, 2], "ends": [4, -1]}), x[1:4, 2:-1])
    for key in [np.s_[1:5:2, ::-1, -3:], np.s_[2], np.s_[-1, 1:], np.s_[..., ::2], np.s_[::-2, 3, ::-3],
                np.s_[:, -6:-1:2], np.s_[4:1:-1]]:
        assert_exact(run_tensor(lambda t, key=key: t[key], [x]), x[key], dtype=np.float32)


def test_shrink_and_flip():
    x = randn(rng_for("shrink"), 6, 7, 5)
    bounds = [[1, 3], [0, 7], [2, 5]]
    for got in both("Shrink", [x], {"bounds": bounds}, build=lambda t: t.shrink(bounds)):
        assert_exact(got, x[1:3, 0:7, 2:5], dtype=np.float32)
    for axes in ([0, 2], [-1], [1], [0, 1, 2]):
        for got in both("Flip", [x], {"axes": axes}, build=lambda t, axes=axes: t.flip(axes)):
            assert_exact(got, np.flip(x, axis=tuple(axes)), dtype=np.float32)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    rng = rng_for("concat", axis)
    base = [3, 4, 5]
    pieces = []
    for extent in (2, 1, 3):
        s = list(base)
        s[axis] = extent
        pieces.append(randn(rng, *s))
    want = np.concatenate(pieces, axis=axis)
    for got in both("Concat", pieces, {"axis": axis}, build=lambda a, b, c: a.cat(b, c, dim=axis)):
        assert_exact(got, want, dtype=np.float32)
    bools = [rng.random(p.shape) < 0.5 for p in pieces]
    for got in both("Concat", bools, {"axis": axis}, build=lambda a, b, c: a.cat(b, c, dim=axis)):
        assert_exact(got, np.concatenate(bools, axis=axis), dtype=np.bool_)
    ints = [rng.integers(-9, 9, size=p.shape).astype(np.int32) for p in pieces]
    assert_exact(run_json("Concat", ints, {"axis": axis}), np.concatenate(ints, axis=axis), dtype=np.int32)
    assert_exact(run_json("Concat", pieces[:1], {"axis": axis}), pieces[0], dtype=np.float32)


def test_concat_with_special_values():
    # concat must not mix pieces: infinities and NaNs must come through unchanged
    a = np.array([[np.inf, -np.inf]], dtype=np.float32)
    b = np.array([[np.nan, 1.0]], dtype=np.float32)
    got = run_json("Concat", [a, b], {"axis": 0})
    assert_exact(got, np.concatenate([a, b], axis=0), dtype=np.float32)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements(axis):
    rng = rng_for("gather-el", axis)
    x = randn(rng, 3, 4, 5)
    size = x.shape[axis]
    ishape = list(x.shape)
    ishape[axis] = 6
    idx = rng.integers(-size, size, size=ishape).astype(np.int32)   # negative indices count from the end
    want = np.take_along_axis(x, np.where(idx < 0, idx + size, idx), axis=axis)
    for got in both("Gather", [x, idx], {"axis": axis}, build=lambda t, i: t.gather(axis, i)):
        assert_exact(got, want, dtype=np.float32)
    assert_exact(run_json("Gather", [x, idx], {"axis": axis, "mode": "elements"}), want)


@pytest.mark.parametrize("axis,ishape", [(0, (2, 3)), (1, (4,)), (-1, (2, 2, 2)), (2, ()), (1, (1,))])
def test_gather_take(axis, ishape):
    rng = rng_for("gather-take", axis, ishape)
    x = randn(rng, 3, 4, 5)
    size = x.shape[axis]
    idx = np.asarray(rng.integers(-size, size, size=ishape), dtype=np.int32)
    want = np.take(x, idx, axis=axis)
    for got in both("Gather", [x, idx], {"axis": axis, "mode": "take"}, build=lambda t, i: t.take(i, axis)):
        assert_exact(got, want, dtype=np.float32)


def test_gather_int_data():
    x = np.arange(12, dtype=np.int32).reshape(3, 4) * 7
    idx = np.array([[3, 0], [-1, 1], [2, -4]], dtype=np.int32)
    assert_exact(run_json("Gather", [x, idx], {"axis": 1, "mode": "take"}), np.take(x, idx, axis=1), dtype=np.int32)


def cumsum_ref(x, axis, exclusive=False, reverse=False):
    x = np.asarray(x, dtype=np.float64 if x.dtype.kind == "f" else np.int64)
    if reverse:
        x = np.flip(x, axis)
    c = np.cumsum(x, axis=axis)
    if exclusive:
        c = c - x
    return np.flip(c, axis) if reverse else c


@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(axis, exclusive, reverse):
    rng = rng_for("cumsum", axis, exclusive, reverse)
    x = randn(rng, 3, 4, 5)
    ax = -1 if axis is None else axis   # the JSON op's default axis is -1
    attrs = {"exclusive": exclusive, "reverse": reverse}
    if axis is not None:
        attrs["axis"] = axis
    want = cumsum_ref(x, ax, exclusive, reverse)
    assert_rel(run_json("CumSum", [x], attrs), want, dtype=np.float32)
    assert_rel(run_tensor(lambda t: t.cumsum(ax, exclusive, reverse), [x]), want, dtype=np.float32)


def test_cumsum_int_and_tensor_default_axis():
    rng = rng_for("cumsum-int")
    xi = rng.integers(-9, 9, size=(4, 6)).astype(np.int32)
    assert_exact(run_json("CumSum", [xi], {"axis": 1, "reverse": True}), cumsum_ref(xi, 1, reverse=True),
                 dtype=np.int32)
    x = randn(rng, 5, 3)
    assert_rel(run_tensor(lambda t: t.cumsum(), [x]), cumsum_ref(x, 0), dtype=np.float32)   # Tensor default: 0


# ------------------------------------------------------------------------------------------------
# a multi-op graph with several outputs, through JSON


def test_multi_op_json_graph_with_declared_types():
    rng = rng_for("multi")
    x, w, b = randn(rng, 4, 6), randn(rng, 6, 3), randn(rng, 3)
    d = {
        "kumiko": "frontend", "version": 1, "name": "mlp",
        "signature": {"inputs": [{"tensor": "x"}, {"tensor": "w", "role": "param"}, {"tensor": "b", "role": "param"}],
                      "outputs": [{"tensor": "p"}, {"tensor": "h"}]},
        "tensors": {"x": {"dtype": "fp32", "shape": [4, 6]}, "w": {"dtype": "fp32", "shape": [6, 3]},
                    "b": {"dtype": "fp32", "shape": [3]}, "h": {"dtype": "fp32", "shape": [4, 3]}},
        "graph": [
            {"op": "MatMul", "name": "mm", "inputs": ["x", "w"], "outputs": ["z"]},
            {"op": "Elementwise", "fn": "add", "name": "bias", "inputs": ["z", "b"], "outputs": ["zb"]},
            {"op": "Elementwise", "fn": "tanh", "name": "act", "inputs": ["zb"], "outputs": ["h"]},
            {"op": "Softmax", "name": "sm", "inputs": ["h"], "outputs": ["p"], "attrs": {"axis": 0}},
        ],
    }
    g = Graph.from_json(d)
    out = kumiko.compile(g, "eval")(x=x, w=w, b=b)
    assert list(out) == ["p", "h"]
    h = np.tanh(np.matmul(*f64(x, w)) + b)
    assert_rel(out["h"], h, dtype=np.float32)
    assert_rel(out["p"], softmax_ref(h, 0), dtype=np.float32)
    # the graph round-trips through its own JSON
    g2 = Graph.from_json(json.loads(json.dumps(g.to_json())))
    out2 = kumiko.compile(g2, "eval")(x=x, w=w, b=b)
    assert_exact(out2["p"], out["p"])
