"""The whole networks `bench/models.py` times, as plain torch ``nn.Module``s (no torchvision, no transformers).

- ``resnet50``: torchvision's ResNet-50 v1.5 (bottleneck blocks [3, 4, 6, 3], the stride on the 3x3 conv,
  a 1x1 strided conv + BatchNorm shortcut where the shape changes), 1000 classes, input [N, 3, 224, 224].
- ``mobilenetv2``: torchvision's MobileNetV2, width 1.0 (inverted residuals with ReLU6, the 1x1 conv to
  1280, global average pool, a 1000-way classifier), input [N, 3, 224, 224].
- ``bert``: BERT-base (vocab 30522, hidden 768, 12 heads, FFN 3072, erf GELU, post-LayerNorm eps 1e-12, word +
  position + token-type embeddings), the last hidden state [N, S, 768] from ``input_ids`` [N, S] (int64).
  No attention mask input: every token is attended (an all-ones mask, which adds 0 to every score), and
  the token types are all 0, as a single-segment input without padding; this keeps the graph simple.
- ``gpt2``: GPT-2 small (vocab 50257, 1024 positions, hidden 768, 12 heads, pre-LayerNorm eps 1e-5, causal
  mask, "gelu_new" tanh GELU, HF's Conv1D layers as addmm), the final LayerNorm's output [N, S, 768] (no LM head).

Weights are random, drawn after ``torch.manual_seed(seed)`` (the same seed builds the same model); every
BatchNorm has random running statistics (mean ~ N(0, 0.1), var ~ U(0.5, 1.5)) and affine parameters, so the
importer's BatchNorm folding computes something other than the identity. Models are in eval mode.

``small=True`` is the smoke-run size: images 64 x 64, 2 transformer layers (unless ``layers`` says
otherwise), sequence 32; the widths, vocabularies and block structure are the real ones.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

MODELS = ("resnet50", "mobilenetv2", "bert", "gpt2")
IMAGE = 224
IMAGE_SMALL = 64
SEQ = 128
SEQ_SMALL = 32
LAYERS = 12
LAYERS_SMALL = 2


# ------------------------------------------------------------------------------------------------
# ResNet-50 (torchvision v1.5)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = _bn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)   # v1.5: stride here
        self.bn2 = _bn(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = _bn(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + idt)


class ResNet50(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = _bn(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, layers[0])
        self.layer2 = self._layer(128, layers[1], 2)
        self.layer3 = self._layer(256, layers[2], 2)
        self.layer4 = self._layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * 4, classes)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False), _bn(planes * 4))
        out = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        out += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*out)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ------------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision, width 1.0)


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), _bn(cout),
                         nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand: int):
        super().__init__()
        hidden = int(round(inp * expand))
        self.use_res = stride == 1 and inp == oup
        layers: list[nn.Module] = [ConvBNReLU6(inp, hidden, 1)] if expand != 1 else []
        layers += [ConvBNReLU6(hidden, hidden, 3, stride, groups=hidden),       # depthwise
                   nn.Conv2d(hidden, oup, 1, bias=False), _bn(oup)]             # linear bottleneck
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))   # expansion t, channels c, repeats n, first stride s

    def __init__(self, classes: int = 1000, width: float = 1.0):
        super().__init__()
        cin, last = _make_divisible(32 * width), _make_divisible(1280 * max(1.0, width))
        feats: list[nn.Module] = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in self.SETTINGS:
            cout = _make_divisible(c * width)
            for i in range(n):
                feats.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        feats.append(ConvBNReLU6(cin, last, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ------------------------------------------------------------------------------------------------
# BERT-base encoder


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def _split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.d).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)   # no mask: all ones adds 0
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        b, _, s, _ = ctx.shape
        return ctx.permute(0, 2, 1, 3).contiguous().view(b, s, self.heads * self.d)


class BertLayer(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072, eps: float = 1e-12):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_ln = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x):
        x = self.attn_ln(self.attn_out(self.attention(x)) + x)
        return self.out_ln(self.output(F.gelu(self.intermediate(x))) + x)      # GELU via erf (exact)


class Bert(nn.Module):
    def __init__(self, layers: int = 12, vocab: int = 30522, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                 max_pos: int = 512, type_vocab: int = 2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.emb_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, max_pos, dtype=torch.long), persistent=False)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids):
        s = input_ids.shape[1]
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(self.token_type_ids[:, :s])
             + self.position_embeddings(self.position_ids[:, :s]))
        x = self.emb_ln(x)
        for layer in self.layers:
            x = layer(x)
        return x


# ------------------------------------------------------------------------------------------------
# GPT-2 small


class Conv1D(nn.Module):
    """HF GPT-2's linear layer: weight [in, out], ``addmm(bias, x, weight)`` on the flattened tokens."""

    def __init__(self, nin: int, nout: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.empty(nout))

    def forward(self, x):
        size = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight).view(size)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, max_pos: int = 1024, eps: float = 1e-5):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.c_attn = Conv1D(hidden, 3 * hidden)
        self.attn_proj = Conv1D(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.c_fc = Conv1D(hidden, 4 * hidden)
        self.mlp_proj = Conv1D(4 * hidden, hidden)
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool))
                             .view(1, 1, max_pos, max_pos), persistent=False)

    def _split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.d).permute(0, 2, 1, 3)

    def attn(self, x):
        q, k, v = self.c_attn(x).split(self.heads * self.d, dim=2)
        q, k, v = self._split(q), self._split(k), self._split(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        s = q.shape[-2]
        # the fill on w's device: a CPU scalar here is a host-to-device copy that a CUDA Graph cannot capture
        low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(self.bias[:, :, :s, :s], w, low)
        ctx = torch.matmul(torch.softmax(w, dim=-1), v)
        b = ctx.shape[0]
        return self.attn_proj(ctx.permute(0, 2, 1, 3).contiguous().view(b, s, self.heads * self.d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, layers: int = 12, vocab: int = 50257, hidden: int = 768, heads: int = 12, max_pos: int = 1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_pos, hidden)
        self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)
        self.h = nn.ModuleList(GPT2Block(hidden, heads, max_pos) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids):
        x = self.wte(input_ids) + self.wpe(self.position_ids[:, :input_ids.shape[1]])
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


# ------------------------------------------------------------------------------------------------
# building, inputs, export


VOCAB = {"bert": 30522, "gpt2": 50257}


def _randomise(model: nn.Module) -> None:
    """Random weights after the caller's ``torch.manual_seed``: He-normal convs, small-normal linears and
    embeddings (std 0.02, as BERT/GPT-2 initialise), LayerNorm/BatchNorm affine near (1, 0), and BatchNorm
    running statistics mean ~ N(0, 0.1), var ~ U(0.5, 1.5)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    m.bias.normal_(0, 0.02)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.0)
                m.bias.normal_(0, 0.1)
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            elif isinstance(m, (nn.Linear, Conv1D)):
                m.weight.normal_(0, 0.02)
                m.bias.normal_(0, 0.02)
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0, 0.02)
            elif isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.05)
                m.bias.normal_(0, 0.02)


def sizes(name: str, small: bool = False, layers: int | None = None) -> dict:
    """The sizes a model is built and fed at: image side or sequence length, and transformer layers."""
    if name in ("resnet50", "mobilenetv2"):
        return {"image": IMAGE_SMALL if small else IMAGE}
    if name in VOCAB:
        return {"seq": SEQ_SMALL if small else SEQ,
                "layers": layers if layers is not None else (LAYERS_SMALL if small else LAYERS)}
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def build(name: str, seed: int = 0, small: bool = False, layers: int | None = None) -> nn.Module:
    """The model with seeded random weights, in eval mode."""
    sz = sizes(name, small, layers)
    torch.manual_seed(seed)
    model = {"resnet50": ResNet50, "mobilenetv2": MobileNetV2}[name]() if "image" in sz else \
        (Bert if name == "bert" else GPT2)(layers=sz["layers"])
    _randomise(model)
    return model.eval()


def input_names(name: str) -> list[str]:
    return ["input_ids"] if name in VOCAB else ["x"]


def output_names(name: str) -> list[str]:
    return ["last_hidden_state"] if name in VOCAB else ["logits"]


def inputs(name: str, batch: int, seed: int = 0, small: bool = False) -> dict[str, np.ndarray]:
    """The data inputs by ONNX name: standard-normal images (float32) or token ids (int64 in range(vocab))."""
    sz = sizes(name, small)
    rng = np.random.default_rng(seed + 1000 * batch)
    if name in VOCAB:
        return {"input_ids": rng.integers(0, VOCAB[name], (batch, sz["seq"]), dtype=np.int64)}
    return {"x": rng.standard_normal((batch, 3, sz["image"], sz["image"])).astype(np.float32)}


def export_onnx(name: str, batch: int, path: str | Path, seed: int = 0, *, small: bool = False,
                layers: int | None = None, model: nn.Module | None = None, dynamic_batch: bool = False) -> Path:
    """Export the model at ``batch`` to ``path`` with the TorchScript exporter, opset 17: static shapes, or
    (``dynamic_batch``) the inputs' and outputs' first dimension a ``dim_param`` "batch", as exports for
    serving usually are."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else build(name, seed, small, layers)
    args = tuple(torch.from_numpy(v) for v in inputs(name, batch, seed, small).values())
    tmp = path.with_name(path.name + ".tmp")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="It is recommended that constant folding be turned off")
        # PRESERVE (the model is in eval mode, so it exports for inference): the default, EVAL, folds each
        # BatchNorm into its Conv's weights inside the exporter, and the importer would never see one
        dyn = {n: {0: "batch"} for n in (*input_names(name), *output_names(name))} if dynamic_batch else None
        torch.onnx.export(model, args, str(tmp), opset_version=17, dynamo=False, input_names=input_names(name),
                          output_names=output_names(name), training=torch.onnx.TrainingMode.PRESERVE,
                          dynamic_axes=dyn)
    tmp.replace(path)
    return path
