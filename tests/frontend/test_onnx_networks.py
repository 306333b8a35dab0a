"""Whole networks through ``kumiko.from_onnx``, small enough for CI: a ResNet basic block and a strided
bottleneck, a MobileNetV2/EfficientNet inverted-residual block with squeeze-excitation, a BERT encoder
layer from token ids and a Llama-style decoder layer (RMSNorm, rotary embeddings, causal mask, grouped-query
attention, SiLU-gated MLP). Each model is built with onnx.helper from seeded random weights, imported,
compiled for ``eval``, ``cpu`` and ``cuda-emu`` and compared with onnxruntime on fresh random inputs by the
relative L2 error within ``kumiko.accuracy.bound`` (fp32 1e-4, fp16 1e-2).

The fp16 variants run on cuda-emu (the MMA skeleton) against onnxruntime's fp32 run of the same model
with every weight and input rounded to fp16 first, so the reference has the fp16 model's values and the
error measured is kumiko's rounding only.

Each model is written the way exporters write it (torch.onnx's BatchNormalization after Conv, the
attention as MatMul/Div/Add/Softmax/MatMul with Reshape/Transpose around it, Erf-GELU, RMSNorm as
Pow/ReduceMean/Sqrt/Reciprocal, rotary tables from a Range), not with the fused ops the importer also
understands, so the importer's folding and the compilers' fusion see exporter-shaped graphs.
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import bound, rel_l2

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from tests.frontend.test_onnx_import import model, onnxruntime_run  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="cpu and cuda-emu need g++")


class Weights:
    """Seeded random initializers in the model's float dtype. ``kind``: "fp32", "fp16", or "fp32r" (fp32
    holding the fp16 model's values: the reference for the fp16 variant). The same seed draws the same
    values whatever the kind, so an fp16 model and its "fp32r" reference hold the same numbers."""

    def __init__(self, seed: int, kind: str = "fp32"):
        self.rng, self.kind, self.inits = np.random.default_rng(seed), kind, []
        self.np = np.float16 if kind == "fp16" else np.float32
        self.onnx = TP.FLOAT16 if kind == "fp16" else TP.FLOAT

    def cast(self, a) -> np.ndarray:
        a = np.asarray(a, np.float32)
        return a.astype(np.float16).astype(self.np) if self.kind != "fp32" else a

    def add(self, name: str, value) -> str:
        self.inits.append(nh.from_array(self.cast(value), name))
        return name

    def randn(self, name: str, shape, scale: float = 0.3, offset: float = 0.0) -> str:
        a = self.rng.standard_normal(shape) * scale + offset
        a[a == 0] = scale / 7                   # never zero: a zero weight hides a wrong index
        return self.add(name, a)

    def bn(self, prefix: str, c: int) -> list[str]:
        """BatchNormalization's scale, bias, mean and (positive) var."""
        return [self.randn(f"{prefix}_s", [c], 0.2, 1.0), self.randn(f"{prefix}_b", [c], 0.2),
                self.randn(f"{prefix}_m", [c], 0.2), self.add(f"{prefix}_v", self.rng.random(c) + 0.5)]

    def ints(self, name: str, value) -> str:
        self.inits.append(nh.from_array(np.asarray(value, np.int64), name))
        return name


def check(m: onnx.ModelProto, feeds: dict, target: str, ref: onnx.ModelProto | None = None) -> kumiko.Graph:
    """Import ``m``, run it on ``target`` and compare every output with onnxruntime's run of ``ref`` (``m``
    itself by default; the "fp32r" model for an fp16 one, fed the same values in fp32)."""
    g = kumiko.from_onnx(m)
    if ref is None:
        want = onnxruntime_run(m, feeds)
    else:
        want = onnxruntime_run(ref, {k: v.astype(np.float32) if v.dtype == np.float16 else v
                                     for k, v in feeds.items()})
    got = kumiko.compile(g, target)(**feeds)
    for o, w in zip(m.graph.output, want):
        y = got[o.name]
        assert y.shape == w.shape, f"{target} {o.name}: shape {y.shape} != {w.shape}"
        err, lim = rel_l2(y, w), bound(y.dtype)
        assert err <= lim, f"{target} {o.name}: relative L2 {err:.3g} > {lim}"
    return g


def float_input(rng, shape, kind: str, scale: float = 1.0) -> np.ndarray:
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return x.astype(np.float16) if kind == "fp16" else x


def ops_of(g: kumiko.Graph) -> set[str]:
    return {n.op for n in g.nodes} | {n.fn for n in g.nodes if n.op == "Elementwise"}


# ------------------------------------------------------------------------------------------------
# 1. ResNet: basic block, bottleneck with a strided downsample shortcut, head


def resnet(n=2, c=8, hw=8, classes=10, kind="fp32", seed=1) -> onnx.ModelProto:
    """x -> [conv3x3+BN+relu, conv3x3+BN, + x, relu] -> [1x1 conv+BN+relu, 3x3 s2 conv+BN+relu, 1x1 conv+BN]
    + [1x1 s2 conv+BN](shortcut), relu -> GlobalAveragePool -> Flatten -> Gemm."""
    w, mid, out = Weights(seed, kind), c // 2, 2 * c
    f = w.onnx
    nodes = []

    def conv_bn(x, y, name, cin, cout, k, stride=1, relu=True):
        nodes.append(h.make_node("Conv", [x, w.randn(f"{name}_w", [cout, cin, k, k], 1.2 / math.sqrt(cin * k * k))],
                                 [f"{name}_c"], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride] * 2,
                                 name=name))
        nodes.append(h.make_node("BatchNormalization", [f"{name}_c", *w.bn(f"{name}_bn", cout)],
                                 [f"{name}_n" if relu else y], epsilon=1e-5, name=f"{name}_bn"))
        if relu:
            nodes.append(h.make_node("Relu", [f"{name}_n"], [y], name=f"{name}_relu"))

    # basic block
    conv_bn("x", "b1", "basic1", c, c, 3)
    conv_bn("b1", "b2", "basic2", c, c, 3, relu=False)
    nodes += [h.make_node("Add", ["b2", "x"], ["b_sum"], name="basic_add"),
              h.make_node("Relu", ["b_sum"], ["b_out"], name="basic_relu")]
    # bottleneck with a strided downsample
    conv_bn("b_out", "t1", "bott1", c, mid, 1)
    conv_bn("t1", "t2", "bott2", mid, mid, 3, stride=2)
    conv_bn("t2", "t3", "bott3", mid, out, 1, relu=False)
    conv_bn("b_out", "sc", "down", c, out, 1, stride=2, relu=False)
    nodes += [h.make_node("Add", ["t3", "sc"], ["t_sum"], name="bott_add"),
              h.make_node("Relu", ["t_sum"], ["t_out"], name="bott_relu"),
              h.make_node("GlobalAveragePool", ["t_out"], ["gap"], name="gap"),
              h.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"),
              h.make_node("Gemm", ["flat", w.randn("fc_w", [classes, out], 0.5), w.randn("fc_b", [classes], 0.1)],
                          ["logits"], transB=1, name="fc")]
    return model(nodes, [("x", f, [n, c, hw, hw])], [("logits", f, [n, classes])], w.inits, opset=17, name="resnet")


RESNET_SIZES = {"eval": [(2, 8, 8)], "cpu": [(2, 8, 8), (1, 16, 12)], "cuda-emu": [(1, 8, 4)]}


@needs_gxx
@pytest.mark.parametrize("target,size", [(t, s) for t, ss in RESNET_SIZES.items() for s in ss], ids=str)
def test_resnet(target, size):
    n, c, hw = size
    m = resnet(n, c, hw)
    x = float_input(np.random.default_rng(100 + hw), (n, c, hw, hw), "fp32")
    g = check(m, {"x": x}, target)
    assert {"Conv2D", "MatMul"} <= ops_of(g) and "BatchNormalization" not in ops_of(g)


@needs_gxx
def test_resnet_dynamic_batch():
    """A dynamic-batch export (the batch a dim_param, as exports for serving are): one cpu build runs 1 and 3
    images, each against onnxruntime, and keeps the static build's algorithms for its convs (its 3x3 convs
    Winograd: the plans count a symbolic batch at its least, one image)."""
    m = resnet(1, 16, 28)
    for v in (m.graph.input[0], m.graph.output[0]):
        d = v.type.tensor_type.shape.dim[0]
        d.ClearField("dim_value")
        d.dim_param = "batch"
    g = kumiko.from_onnx(m)
    exe = kumiko.compile(g, "cpu")
    static = kumiko.compile(kumiko.from_onnx(resnet(1, 16, 28)), "cpu")
    # the same algorithm for every conv; the head's rows are the batch itself: packed, not the skinny GEMV
    algo = {r: p.algo for r, p in static._run.plans.items()}
    assert {r: p.algo for r, p in exe._run.plans.items()} == {r: "packed" if a == "skinny" else a
                                                               for r, a in algo.items()}
    assert "winograd" in algo.values()
    rng = np.random.default_rng(7)
    for n in (1, 3):
        x = float_input(rng, (n, 16, 28, 28), "fp32")
        (want,) = onnxruntime_run(m, {"x": x})
        y = exe(x=x)["logits"]
        assert y.shape == want.shape and rel_l2(y, want) <= bound(y.dtype)


# ------------------------------------------------------------------------------------------------
# 2. MobileNetV2 / EfficientNet inverted residual with squeeze-excitation


def mbconv(n=2, c=8, hw=8, expand=2, act="hardswish", kind="fp32", seed=2) -> onnx.ModelProto:
    """1x1 expand conv+BN+act -> depthwise 3x3 conv (group = channels)+BN+act -> SE (GAP -> 1x1 conv ->
    relu -> 1x1 conv -> sigmoid -> mul) -> 1x1 project conv+BN -> + x. act: HardSwish or SiLU as x*Sigmoid(x)."""
    w, e, se = Weights(seed, kind), c * expand, max(c // 4, 2)
    f = w.onnx
    nodes = []

    def activation(x, y, name):
        if act == "hardswish":
            nodes.append(h.make_node("HardSwish", [x], [y], name=name))
        else:
            nodes.extend([h.make_node("Sigmoid", [x], [f"{name}_sig"], name=f"{name}_sig"),
                          h.make_node("Mul", [x, f"{name}_sig"], [y], name=name)])

    def conv_bn(x, y, name, cin, cout, k, group=1):
        nodes.append(h.make_node("Conv", [x, w.randn(f"{name}_w", [cout, cin // group, k, k],
                                                     1.2 / math.sqrt(cin // group * k * k))],
                                 [f"{name}_c"], pads=[k // 2] * 4, group=group, name=name))
        nodes.append(h.make_node("BatchNormalization", [f"{name}_c", *w.bn(f"{name}_bn", cout)], [y],
                                 name=f"{name}_bn"))

    conv_bn("x", "e_n", "expand", c, e, 1)
    activation("e_n", "e_a", "expand_act")
    conv_bn("e_a", "d_n", "dw", e, e, 3, group=e)
    activation("d_n", "d_a", "dw_act")
    nodes += [h.make_node("GlobalAveragePool", ["d_a"], ["se_gap"], name="se_gap"),
              h.make_node("Conv", ["se_gap", w.randn("se1_w", [se, e, 1, 1], 0.5), w.randn("se1_b", [se], 0.1)],
                          ["se1"], name="se_reduce"),
              h.make_node("Relu", ["se1"], ["se1_r"], name="se_relu"),
              h.make_node("Conv", ["se1_r", w.randn("se2_w", [e, se, 1, 1], 0.5), w.randn("se2_b", [e], 0.1)],
                          ["se2"], name="se_expand"),
              h.make_node("Sigmoid", ["se2"], ["se_gate"], name="se_sigmoid"),
              h.make_node("Mul", ["d_a", "se_gate"], ["se_out"], name="se_mul")]     # [N,E,H,W] * [N,E,1,1]
    conv_bn("se_out", "p_n", "project", e, c, 1)
    nodes.append(h.make_node("Add", ["p_n", "x"], ["y"], name="residual"))
    return model(nodes, [("x", f, [n, c, hw, hw])], [("y", f, [n, c, hw, hw])], w.inits, opset=17, name="mbconv")


MBCONV_SIZES = {"eval": [(2, 8, 8)], "cpu": [(2, 8, 8), (1, 12, 7)], "cuda-emu": [(1, 8, 4)]}


@needs_gxx
@pytest.mark.parametrize("act", ["hardswish", "silu"])
@pytest.mark.parametrize("target,size", [(t, s) for t, ss in MBCONV_SIZES.items() for s in ss], ids=str)
def test_mbconv(target, size, act):
    n, c, hw = size
    m = mbconv(n, c, hw, act=act)
    g = check(m, {"x": float_input(np.random.default_rng(200 + hw), (n, c, hw, hw), "fp32")}, target)
    assert "Conv2D" in ops_of(g) and ("hardswish" in ops_of(g) or "sigmoid" in ops_of(g))


# ------------------------------------------------------------------------------------------------
# 3. BERT encoder layer from token ids


def bert(b=2, s=8, d=32, heads=4, ff=64, vocab=50, kind="fp32", seed=3, embed=True) -> onnx.ModelProto:
    """ids -> word + position embeddings (Gather) -> LayerNorm -> fused QKV MatMul + bias -> Split -> heads
    (Reshape/Transpose) -> QK^T / sqrt(dh) + (1 - mask) * -10000 -> Softmax -> @V -> merge heads -> out proj
    -> + residual -> LayerNorm -> FFN with Erf-GELU -> + residual -> LayerNorm. ``embed=False``: the layer from
    hidden states (input ``emb``, no Gather) with the same weights."""
    w, dh = Weights(seed, kind), d // heads
    f = w.onnx
    sc = 1 / math.sqrt(d)
    word, pos = w.randn("word_emb", [vocab, d], 1.0), w.randn("pos_emb", [s, d], 0.5)
    nodes = [
        h.make_node("Gather", [word, "input_ids"], ["we"], axis=0, name="word_emb"),
        h.make_node("Gather", [pos, w.ints("pos_ids", np.arange(s)[None])], ["pe"], axis=0, name="pos_emb"),
        h.make_node("Add", ["we", "pe"], ["emb"], name="emb_add"),
    ] if embed else []
    nodes += [
        h.make_node("LayerNormalization", ["emb", w.randn("ln0_g", [d], 0.2, 1.0), w.randn("ln0_b", [d], 0.1)],
                    ["h0"], axis=-1, epsilon=1e-12, name="emb_ln"),
        # extended attention mask: [B, S] int64 -> [B, 1, 1, S] additive
        h.make_node("Cast", ["attention_mask"], ["mask_f"], to=f, name="mask_cast"),
        h.make_node("Sub", [w.add("one", 1.0), "mask_f"], ["mask_inv"], name="mask_inv"),
        h.make_node("Mul", ["mask_inv", w.add("neg_big", -10000.0)], ["mask_add"], name="mask_scale"),
        h.make_node("Unsqueeze", ["mask_add", w.ints("ax12", [1, 2])], ["mask4"], name="mask_unsq"),
        # fused QKV
        h.make_node("MatMul", ["h0", w.randn("qkv_w", [d, 3 * d], sc)], ["qkv_mm"], name="qkv"),
        h.make_node("Add", ["qkv_mm", w.randn("qkv_b", [3 * d], 0.1)], ["qkv_b_out"], name="qkv_bias"),
        h.make_node("Split", ["qkv_b_out", w.ints("qkv_split", [d, d, d])], ["q", "k", "v"], axis=-1, name="qkv_split"),
    ]
    for t in "qkv":
        nodes += [h.make_node("Reshape", [t, w.ints(f"{t}_shape", [0, 0, heads, dh])], [f"{t}4"], name=f"{t}_reshape"),
                  h.make_node("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3],
                              name=f"{t}_transpose")]
    nodes += [
        h.make_node("MatMul", ["qh", "kh"], ["scores"], name="qk"),
        h.make_node("Div", ["scores", w.add("sqrt_dh", math.sqrt(dh))], ["scores_s"], name="qk_scale"),
        h.make_node("Add", ["scores_s", "mask4"], ["scores_m"], name="qk_mask"),
        h.make_node("Softmax", ["scores_m"], ["probs"], axis=-1, name="softmax"),
        h.make_node("MatMul", ["probs", "vh"], ["ctx_h"], name="pv"),
        h.make_node("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_transpose"),
        h.make_node("Reshape", ["ctx_t", w.ints("ctx_shape", [0, 0, d])], ["ctx"], name="ctx_reshape"),
        h.make_node("MatMul", ["ctx", w.randn("o_w", [d, d], sc)], ["o_mm"], name="out_proj"),
        h.make_node("Add", ["o_mm", w.randn("o_b", [d], 0.1)], ["o"], name="out_bias"),
        h.make_node("Add", ["o", "h0"], ["r1"], name="residual1"),
        h.make_node("LayerNormalization", ["r1", w.randn("ln1_g", [d], 0.2, 1.0), w.randn("ln1_b", [d], 0.1)], ["h1"],
                    axis=-1, epsilon=1e-12, name="attn_ln"),
        h.make_node("MatMul", ["h1", w.randn("ff1_w", [d, ff], sc)], ["ff1_mm"], name="ff1"),
        h.make_node("Add", ["ff1_mm", w.randn("ff1_b", [ff], 0.1)], ["ff1_o"], name="ff1_bias"),
        # Erf-GELU as torch.onnx writes it: x * 0.5 * (1 + erf(x / sqrt(2)))
        h.make_node("Div", ["ff1_o", w.add("sqrt2", math.sqrt(2.0))], ["g_div"], name="gelu_div"),
        h.make_node("Erf", ["g_div"], ["g_erf"], name="gelu_erf"),
        h.make_node("Add", ["g_erf", "one"], ["g_add"], name="gelu_add"),
        h.make_node("Mul", ["ff1_o", "g_add"], ["g_mul"], name="gelu_mul"),
        h.make_node("Mul", ["g_mul", w.add("half", 0.5)], ["gelu"], name="gelu_half"),
        h.make_node("MatMul", ["gelu", w.randn("ff2_w", [ff, d], 1 / math.sqrt(ff))], ["ff2_mm"], name="ff2"),
        h.make_node("Add", ["ff2_mm", w.randn("ff2_b", [d], 0.1)], ["ff2_o"], name="ff2_bias"),
        h.make_node("Add", ["ff2_o", "h1"], ["r2"], name="residual2"),
        h.make_node("LayerNormalization", ["r2", w.randn("ln2_g", [d], 0.2, 1.0), w.randn("ln2_b", [d], 0.1)],
                    ["last_hidden_state"], axis=-1, epsilon=1e-12, name="ffn_ln"),
    ]
    if not embed:
        w.inits = [i for i in w.inits if i.name not in (word, pos)]
    first = ("input_ids", TP.INT64, [b, s]) if embed else ("emb", f, [b, s, d])
    return model(nodes, [first, ("attention_mask", TP.INT64, [b, s])],
                 [("last_hidden_state", f, [b, s, d])], w.inits, opset=17, name="bert")


def bert_feeds(b, s, vocab, seed, kind="fp32", embed=True, d=None):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int64)
    for i in range(b):                  # right padding: row i keeps s - i tokens (at least one)
        mask[i, max(s - i, 1):] = 0
    first = ({"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64)} if embed
             else {"emb": float_input(rng, (b, s, d), kind)})
    return {**first, "attention_mask": mask}


BERT_SIZES = {"eval": [(2, 8, 32, 4)], "cpu": [(2, 8, 32, 4), (3, 5, 24, 2)], "cuda-emu": [(2, 4, 16, 2)]}
#: from token ids everywhere; on cuda-emu also from hidden states
BERT_CASES = [pytest.param(t, s, True, id=f"{t}-{s}-token-ids") for t, ss in BERT_SIZES.items() for s in ss] + \
             [pytest.param("cuda-emu", s, False, id=f"cuda-emu-{s}-hidden-states") for s in BERT_SIZES["cuda-emu"]]


@needs_gxx
@pytest.mark.parametrize("target,size,embed", BERT_CASES)
def test_bert(target, size, embed):
    b, s, d, heads = size
    m = bert(b, s, d, heads, ff=2 * d, embed=embed)
    g = check(m, bert_feeds(b, s, 50, 300 + s, embed=embed, d=d), target)
    assert {"LayerNorm", "Softmax", "MatMul", "erf"} <= ops_of(g) and ("Gather" in ops_of(g)) == embed


# ------------------------------------------------------------------------------------------------
# 4. Llama-style decoder layer


def llama(b=2, s=8, d=32, heads=4, kv_heads=2, ff=48, kind="fp32", seed=4, theta=10000.0) -> onnx.ModelProto:
    """RMSNorm (Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul) -> q/k/v projections -> heads -> rotary embeddings
    (cos/sin of Range * inv_freq, rotate_half by Slice/Neg/Concat) -> GQA (KV heads repeated by
    Unsqueeze/Expand/Reshape) -> QK^T * scale, causal mask Trilu + Where(-inf) -> Softmax -> @V -> o_proj ->
    + residual -> RMSNorm (Sqrt/Div) -> SiLU(gate) * up -> down -> + residual."""
    w, dh, rep = Weights(seed, kind), d // heads, heads // kv_heads
    f = w.onnx
    sc = 1 / math.sqrt(d)
    half = dh // 2
    inv_freq = 1.0 / theta ** (np.arange(0, dh, 2, dtype=np.float32) / dh)
    nodes = [
        # rotary tables, computed in-graph in fp32 (as exporters do) and cast to the model's dtype
        h.make_node("Constant", [], ["r_start"], value=nh.from_array(np.array(0.0, np.float32)), name="r_start"),
        h.make_node("Constant", [], ["r_limit"], value=nh.from_array(np.array(float(s), np.float32)), name="r_limit"),
        h.make_node("Constant", [], ["r_delta"], value=nh.from_array(np.array(1.0, np.float32)), name="r_delta"),
        h.make_node("Range", ["r_start", "r_limit", "r_delta"], ["pos"], name="positions"),
        h.make_node("Unsqueeze", ["pos", w.ints("ax1", [1])], ["pos2"], name="pos_unsq"),
        h.make_node("Constant", [], ["inv_freq"], value=nh.from_array(inv_freq, "inv_freq"), name="inv_freq"),
        h.make_node("Mul", ["pos2", "inv_freq"], ["freqs"], name="freqs"),                  # [S, dh/2]
        h.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1, name="emb"),             # [S, dh]
        h.make_node("Cos", ["emb"], ["cos32"], name="cos"), h.make_node("Sin", ["emb"], ["sin32"], name="sin"),
        h.make_node("Cast", ["cos32"], ["cos"], to=f, name="cos_cast"),
        h.make_node("Cast", ["sin32"], ["sin"], to=f, name="sin_cast"),
        # causal mask: lower-triangular ones -> bool -> Where(-inf)
        h.make_node("Trilu", [w.add("ones_ss", np.ones((s, s)))], ["tril"], upper=0, name="tril"),
        h.make_node("Cast", ["tril"], ["causal"], to=TP.BOOL, name="causal"),
    ]

    def rmsnorm(x, y, name, div=False):
        nodes.extend([
            h.make_node("Pow", [x, w.add(f"{name}_two", 2.0)], [f"{name}_sq"], name=f"{name}_pow"),
            h.make_node("ReduceMean", [f"{name}_sq", w.ints(f"{name}_axes", [-1])], [f"{name}_ms"], keepdims=1,
                        name=f"{name}_mean"),
            h.make_node("Add", [f"{name}_ms", w.add(f"{name}_eps", 1e-5)], [f"{name}_mse"], name=f"{name}_eps"),
            h.make_node("Sqrt", [f"{name}_mse"], [f"{name}_rms"], name=f"{name}_sqrt")])
        if div:
            nodes.append(h.make_node("Div", [x, f"{name}_rms"], [f"{name}_xn"], name=f"{name}_div"))
        else:
            nodes.extend([h.make_node("Reciprocal", [f"{name}_rms"], [f"{name}_inv"], name=f"{name}_recip"),
                          h.make_node("Mul", [x, f"{name}_inv"], [f"{name}_xn"], name=f"{name}_mul")])
        nodes.append(h.make_node("Mul", [w.randn(f"{name}_w", [d], 0.2, 1.0), f"{name}_xn"], [y], name=f"{name}_w"))

    def heads_of(x, y, n):
        nodes.extend([h.make_node("Reshape", [x, w.ints(f"{y}_shape", [b, s, n, dh])], [f"{y}_4"], name=f"{y}_reshape"),
                      h.make_node("Transpose", [f"{y}_4"], [y], perm=[0, 2, 1, 3], name=f"{y}_transpose")])

    def rope(x, y):
        nodes.extend([
            h.make_node("Slice", [x, w.ints(f"{y}_s0", [0]), w.ints(f"{y}_e0", [half]), w.ints(f"{y}_a", [-1])],
                        [f"{y}_x1"], name=f"{y}_x1"),
            h.make_node("Slice", [x, w.ints(f"{y}_s1", [half]), w.ints(f"{y}_e1", [dh]), f"{y}_a"], [f"{y}_x2"],
                        name=f"{y}_x2"),
            h.make_node("Neg", [f"{y}_x2"], [f"{y}_nx2"], name=f"{y}_neg"),
            h.make_node("Concat", [f"{y}_nx2", f"{y}_x1"], [f"{y}_rot"], axis=-1, name=f"{y}_rot"),
            h.make_node("Mul", [x, "cos"], [f"{y}_c"], name=f"{y}_mul_cos"),
            h.make_node("Mul", [f"{y}_rot", "sin"], [f"{y}_s"], name=f"{y}_mul_sin"),
            h.make_node("Add", [f"{y}_c", f"{y}_s"], [y], name=f"{y}_rope")])

    rmsnorm("x", "xn", "ln1")
    nodes += [h.make_node("MatMul", ["xn", w.randn("wq", [d, heads * dh], sc)], ["q"], name="q_proj"),
              h.make_node("MatMul", ["xn", w.randn("wk", [d, kv_heads * dh], sc)], ["k"], name="k_proj"),
              h.make_node("MatMul", ["xn", w.randn("wv", [d, kv_heads * dh], sc)], ["v"], name="v_proj")]
    heads_of("q", "qh", heads)
    heads_of("k", "kh", kv_heads)
    heads_of("v", "vh", kv_heads)
    rope("qh", "qr")
    rope("kh", "kr")
    for t, src in (("k", "kr"), ("v", "vh")):     # repeat_kv: [B, KV, S, dh] -> [B, KV, rep, S, dh] -> [B, H, S, dh]
        nodes += [h.make_node("Unsqueeze", [src, w.ints(f"{t}_ax2", [2])], [f"{t}_5"], name=f"{t}_unsq"),
                  h.make_node("Expand", [f"{t}_5", w.ints(f"{t}_rep", [b, kv_heads, rep, s, dh])], [f"{t}_e"],
                              name=f"{t}_expand"),
                  h.make_node("Reshape", [f"{t}_e", w.ints(f"{t}_hshape", [b, heads, s, dh])], [f"{t}_full"],
                              name=f"{t}_repeat")]
    nodes += [
        h.make_node("Transpose", ["k_full"], ["kt"], perm=[0, 1, 3, 2], name="k_t"),
        h.make_node("MatMul", ["qr", "kt"], ["scores"], name="qk"),
        h.make_node("Mul", ["scores", w.add("scale", 1 / math.sqrt(dh))], ["scores_s"], name="qk_scale"),
        h.make_node("Where", ["causal", "scores_s", w.add("neg_inf", -np.inf)], ["scores_m"], name="causal_mask"),
        h.make_node("Softmax", ["scores_m"], ["probs"], axis=-1, name="softmax"),
        h.make_node("MatMul", ["probs", "v_full"], ["ctx_h"], name="pv"),
        h.make_node("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_transpose"),
        h.make_node("Reshape", ["ctx_t", w.ints("ctx_shape", [b, s, d])], ["ctx"], name="ctx_reshape"),
        h.make_node("MatMul", ["ctx", w.randn("wo", [d, d], sc)], ["o"], name="o_proj"),
        h.make_node("Add", ["x", "o"], ["r1"], name="residual1"),
    ]
    rmsnorm("r1", "r1n", "ln2", div=True)
    nodes += [
        h.make_node("MatMul", ["r1n", w.randn("w_gate", [d, ff], sc)], ["gate"], name="gate_proj"),
        h.make_node("MatMul", ["r1n", w.randn("w_up", [d, ff], sc)], ["up"], name="up_proj"),
        h.make_node("Sigmoid", ["gate"], ["gate_sig"], name="silu_sigmoid"),
        h.make_node("Mul", ["gate", "gate_sig"], ["gate_act"], name="silu"),
        h.make_node("Mul", ["gate_act", "up"], ["mlp_h"], name="gated"),
        h.make_node("MatMul", ["mlp_h", w.randn("w_down", [ff, d], 1 / math.sqrt(ff))], ["down"], name="down_proj"),
        h.make_node("Add", ["r1", "down"], ["y"], name="residual2"),
    ]
    return model(nodes, [("x", f, [b, s, d])], [("y", f, [b, s, d])], w.inits, opset=18, name="llama")


LLAMA_SIZES = {"eval": [(2, 8, 32, 4, 2)], "cpu": [(2, 8, 32, 4, 2), (1, 6, 48, 6, 3)],
               "cuda-emu": [(1, 4, 16, 4, 2)]}


@needs_gxx
@pytest.mark.parametrize("target,size", [(t, s) for t, ss in LLAMA_SIZES.items() for s in ss], ids=str)
def test_llama(target, size):
    b, s, d, heads, kv = size
    m = llama(b, s, d, heads, kv, ff=3 * d // 2)
    g = check(m, {"x": float_input(np.random.default_rng(400 + s), (b, s, d), "fp32")}, target)
    assert {"Softmax", "MatMul", "Expand", "where", "sigmoid", "sin", "cos"} <= ops_of(g)    # rotary tables in-graph


# ------------------------------------------------------------------------------------------------
# fp16


FP16 = {
    "resnet": (lambda kind: resnet(1, 8, 4, kind=kind), lambda kind: {
        "x": float_input(np.random.default_rng(501), (1, 8, 4, 4), kind)}),
    "mbconv-hardswish": (lambda kind: mbconv(1, 8, 4, act="hardswish", kind=kind), lambda kind: {
        "x": float_input(np.random.default_rng(502), (1, 8, 4, 4), kind)}),
    "mbconv-silu": (lambda kind: mbconv(1, 8, 4, act="silu", kind=kind), lambda kind: {
        "x": float_input(np.random.default_rng(502), (1, 8, 4, 4), kind)}),
    "bert": (lambda kind: bert(1, 4, 16, 2, ff=32, kind=kind), lambda kind: bert_feeds(1, 4, 50, 503)),
    "bert-hidden-states": (lambda kind: bert(2, 4, 16, 2, ff=32, kind=kind, embed=False),
                           lambda kind: bert_feeds(2, 4, 50, 503, kind, embed=False, d=16)),
    "llama": (lambda kind: llama(1, 4, 16, 4, 2, ff=24, kind=kind), lambda kind: {
        "x": float_input(np.random.default_rng(504), (1, 4, 16), kind)}),
}


@needs_gxx
@pytest.mark.parametrize("name", list(FP16))
@pytest.mark.parametrize("target", ["eval", "cpu", "cuda-emu"])
def test_fp16(target, name):
    """The fp16 model against onnxruntime's fp32 run of the same (fp16-rounded) weights and inputs."""
    build, feeds = FP16[name]
    g = check(build("fp16"), feeds("fp16"), target, ref=build("fp32r"))
    assert all(g.tensors[o].dtype is kumiko.dtypes.fp16 for o in g.outputs)
