"""ONNX Conv, pooling and Attention: the converters with real convention work in them.

ONNX spells windows N-dimensionally (pads as ``[x1_begin, x2_begin, ..., x1_end, x2_end]``,
``auto_pad``); the frontend's windows are N-dimensional too, with ``padding=[x1_begin, x1_end,
x2_begin, x2_end, ...]`` (2-D: ``[top, bottom, left, right]``). Attention
(opset 23) maps onto the frontend Attention op where it can (the common case) and onto explicit
MatMul / Softmax / MatMul otherwise (softcap, the qk_matmul output), following onnx's reference
implementation: bottom-right causal alignment with a KV cache, GQA by repeating each KV head.
"""
from __future__ import annotations

import math

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_import import Importer
from kumiko.frontend.onnx_index import _iota
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.frontend.onnx_ops import converter


def _window_pads(imp: Importer, node: OnnxNode, spatial: tuple, kernel: list, strides: list,
                 dilations: list) -> list[tuple[int, int]]:
    """Per spatial axis (begin, end) padding from ``pads`` or ``auto_pad`` (SAME_* need static sizes)."""
    n = len(spatial)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = node.ints("pads", [0] * 2 * n)
        if len(pads) != 2 * n:
            raise node.err("E1010", f"pads needs {2 * n} values, got {pads}")
        return [(pads[k], pads[k + n]) for k in range(n)]
    if auto == "VALID":
        return [(0, 0)] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.err("E1010", f"auto_pad={auto!r} is not supported")
    out = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        if not isinstance(size, int):
            raise node.err("E1010", f"auto_pad={auto} needs static spatial sizes, got {size}")
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out


def _spatial(imp: Importer, node: OnnxNode, x: str) -> int:
    n = len(imp.shape(x)) - 2
    if n < 1:
        raise node.err("E1011", f"{node.op_type} needs an input [N, C, spatial...], got rank {n + 2}")
    return n


def _flat(pads: list[tuple[int, int]]) -> list[int]:
    """ONNX's per-axis (begin, end) pairs as the frontend's ``padding`` ``[a1_begin, a1_end, ...]``."""
    return [p for pair in pads for p in pair]


_CONV = {1: "Conv1D", 2: "Conv2D", 3: "Conv3D"}


def _kernel(imp: Importer, node: OnnxNode, w: str) -> list:
    kernel = list(imp.shape(w)[2:])
    if node.ints("kernel_shape") not in (None, kernel):
        raise node.err("E1011", f"kernel_shape {node.ints('kernel_shape')} differs from the weight's {kernel}")
    return kernel


@converter("Conv", attrs="auto_pad dilations group kernel_shape pads strides")
def conv_conv(imp: Importer, node: OnnxNode) -> str:
    x, w = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    n = _spatial(imp, node, x)
    kernel = _kernel(imp, node, w)
    strides, dil = node.ints("strides", [1] * n), node.ints("dilations", [1] * n)
    pads = _window_pads(imp, node, imp.shape(x)[2:], kernel, strides, dil)
    bias = [imp.tensor(node.input(2))] if node.input(2) else []
    return imp.emit(_CONV.get(n, "ConvND"), [x, w, *bias], stride=strides, dilation=dil,
                    groups=int(node.attr("group", 1)), padding=_flat(pads))


@converter("ConvTranspose", attrs="auto_pad dilations group kernel_shape output_padding output_shape pads strides")
def conv_conv_transpose(imp: Importer, node: OnnxNode) -> str:
    """Pads from ``pads``, or from ``output_shape`` / ``auto_pad`` as onnx's reference computes them
    (total = s*(I-1) + output_padding + d*(k-1) + 1 - out; SAME_UPPER puts the odd one at the end)."""
    x, w = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    n = _spatial(imp, node, x)
    kernel = _kernel(imp, node, w)
    strides, dil = node.ints("strides", [1] * n), node.ints("dilations", [1] * n)
    extra = node.ints("output_padding", [0] * n)
    if any(len(v) != n for v in (strides, dil, extra)):
        raise node.err("E1010", f"strides, dilations and output_padding need {n} values each")
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise node.err("E1010", f"auto_pad={auto!r} is not supported")
    out = node.ints("output_shape")
    if out is not None and len(out) == n + 2:
        out = out[2:]
    if out is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [imp.shape(x)[2 + a] * strides[a] for a in range(n)]
    if out is None:
        pads = node.ints("pads", [0] * 2 * n) if auto == "NOTSET" else [0] * 2 * n
        if len(pads) != 2 * n:
            raise node.err("E1010", f"pads needs {2 * n} values, got {pads}")
        pads = [(pads[a], pads[a + n]) for a in range(n)]
    else:
        sizes = imp.shape(x)[2:]
        if len(out) != n or not all(isinstance(v, int) for v in (*sizes, *kernel)):
            raise node.err("E1010", f"output_shape {out} needs {n} values and static input and kernel sizes")
        pads = []
        for a in range(n):
            total = strides[a] * (sizes[a] - 1) + extra[a] + (kernel[a] - 1) * dil[a] + 1 - out[a]
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    bias = [imp.tensor(node.input(2))] if node.input(2) else []
    return imp.emit("ConvTranspose", [x, w, *bias], stride=strides, dilation=dil, output_padding=extra,
                    groups=int(node.attr("group", 1)), padding=_flat(pads))


@converter("MaxPool", attrs="auto_pad ceil_mode dilations kernel_shape pads storage_order strides")
@converter("AveragePool", attrs="auto_pad ceil_mode count_include_pad dilations kernel_shape pads strides")
def conv_pool(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    n = _spatial(imp, node, x)
    kernel = node.ints("kernel_shape")
    if kernel is None or len(kernel) != n:
        raise node.err("E1010", f"kernel_shape must give {n} sizes, got {kernel}")
    strides, dil = node.ints("strides", [1] * n), node.ints("dilations", [1] * n)
    pads = _window_pads(imp, node, imp.shape(x)[2:], kernel, strides, dil)
    attrs = dict(kernel=kernel, stride=strides, dilation=dil, ceil_mode=bool(node.attr("ceil_mode", 0)),
                 padding=_flat(pads))
    if node.op_type == "AveragePool":
        return imp.emit("AvgPool", [x], count_include_pad=bool(node.attr("count_include_pad", 0)), **attrs)
    y = imp.emit("MaxPool", [x], **attrs)
    if not node.wants_output(1):
        return y
    return [y, _maxpool_indices(imp, node, x, y, kernel, strides, dil, pads)]


def _maxpool_indices(imp: Importer, node: OnnxNode, x: str, y: str, kernel: list, strides: list, dil: list,
                     pads: list) -> str:
    """MaxPool's Indices: for each window, the flat index into x (``((n*C + c) * H + h) * W + w``, or
    ``(n*C + c) * H*W + w*H + h`` with storage_order=1) of its first maximum in scan order (row-major over
    the kernel), as onnx defines it. For each of the prod(kernel) offsets a strided slice of x (padded
    with -inf) is compared with the pooled y; the first offset that hits and is not padding wins, its
    index a constant per output position. Spatial sizes must be static."""
    shape, out = imp.shape(x), imp.shape(y)
    n = len(kernel)
    sizes, osz = shape[2:], out[2:]
    if not all(isinstance(v, int) for v in (*sizes, *osz)):
        raise node.err("E1010", f"MaxPool's Indices output needs static spatial sizes, got {[str(v) for v in sizes]}")
    if not imp.dtype(x).is_float:
        raise node.err("E1012", f"MaxPool's Indices output needs a float input, got {imp.dtype(x)}")
    order = int(node.attr("storage_order", 0))
    if order not in (0, 1):
        raise node.err("E1010", f"storage_order must be 0 or 1, got {order}")
    if order and n != 2:
        raise node.err("E1010", f"storage_order=1 is defined for 2-D pooling, got {n}-D")
    high = [(o - 1) * s + (k - 1) * d + 1 - size - lo for o, s, k, d, size, (lo, _) in
            zip(osz, strides, kernel, dil, sizes, pads)]
    xp = imp.emit("Pad", [x], pads=[[0, 0], [0, 0]] + [[lo, max(0, h)] for (lo, _), h in zip(pads, high)],
                  value=float("-inf"))
    spatial = math.prod(sizes)
    grid = np.indices(osz)
    idx = None
    for off in reversed(list(np.ndindex(*kernel))):         # the first offset in scan order is applied last
        pos = [grid[a] * strides[a] - pads[a][0] + off[a] * dil[a] for a in range(n)]
        valid = np.logical_and.reduce([(p >= 0) & (p < sizes[a]) for a, p in enumerate(pos)])
        flat = (pos[1] * sizes[0] + pos[0]) if order else np.ravel_multi_index(
            [np.clip(p, 0, sizes[a] - 1) for a, p in enumerate(pos)], sizes)
        part = imp.emit("Slice", [xp], starts=[off[a] * dil[a] for a in range(n)],
                        ends=[off[a] * dil[a] + (osz[a] - 1) * strides[a] + 1 for a in range(n)],
                        axes=list(range(2, 2 + n)), steps=list(strides))
        hit = imp.ew("eq", part, y)
        if not valid.all():
            hit = imp.ew("where", imp._param(f"{node.name}::valid", valid.reshape((1, 1, *osz))), hit, False)
        here = imp._param(f"{node.name}::index", np.where(valid, flat, 0).astype(np.int32).reshape((1, 1, *osz)))
        idx = here if idx is None else imp.ew("where", hit, here, idx)
    lead = imp.ew("add", imp.ew("mul", _iota(imp, shape[0], n + 2, 0), shape[1]), _iota(imp, shape[1], n + 2, 1))
    return imp.ew("add", idx if idx is not None else 0, imp.ew("mul", lead, spatial))


# ------------------------------------------------------------------------------------------------
# Attention (opset 23)

def _heads(imp: Importer, x: str, heads: int) -> str:
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, hd = imp.shape(x)
    if not isinstance(hd, int) or hd % heads:
        raise imp.err("E1011", f"hidden size {hd} is not divisible by {heads} heads")
    return imp.permute(imp.reshape(x, (b, s, heads, hd // heads)), (0, 2, 1, 3))


def _repeat_heads(imp: Importer, x: str, reps: int) -> str:
    """GQA: repeat each KV head ``reps`` times in place ([h0, h0, h1, h1, ...], as np.repeat)."""
    if reps == 1:
        return x
    b, h, s, d = imp.shape(x)
    y = imp.emit("Expand", [imp.reshape(x, (b, h, 1, s, d))], shape=[b, h, reps, s, d])
    return imp.reshape(y, (b, h * reps, s, d))


@converter("Attention", attrs="is_causal kv_num_heads q_num_heads qk_matmul_output_mode scale softcap "
                                    "softmax_precision left_window_size right_window_size")
def conv_attention(imp: Importer, node: OnnxNode) -> list:
    if node.input(6):
        raise node.err("E1010", "the nonpad_kv_seqlen input is not supported")
    for key in ("left_window_size", "right_window_size"):
        if int(node.attr(key, -1)) != -1:
            raise node.err("E1010", f"{key} is not supported")
    q, k, v = (imp.tensor(node.input(i)) for i in range(3))
    if not imp.dtype(q).is_float:
        raise node.err("E1012", f"Attention needs float inputs (fp32, fp16, bf16 or fp64), got {imp.dtype(q)}")
    rank = len(imp.shape(q))
    if rank == 3:
        hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
        if hq is None or hkv is None:
            raise node.err("E1010", "3-D Attention inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(imp, q, int(hq)), _heads(imp, k, int(hkv)), _heads(imp, v, int(hkv))
    elif rank != 4:
        raise node.err("E1011", f"Attention takes 3-D or 4-D inputs, got rank {rank}")
    past = 0
    if node.input(4) or node.input(5):
        if not (node.input(4) and node.input(5)):
            raise node.err("E1009", "past_key and past_value come together")
        pk, pv = imp.tensor(node.input(4)), imp.tensor(node.input(5))
        past = imp.shape(pk)[2]
        k, v = imp.emit("Concat", [pk, k], axis=2), imp.emit("Concat", [pv, v], axis=2)
    present_k, present_v = k, v
    bsz, nq, sq, dh = imp.shape(q)
    nkv, skv = imp.shape(k)[1], imp.shape(k)[2]
    if nq != nkv:
        if not isinstance(nq, int) or not isinstance(nkv, int) or nq % nkv:
            raise node.err("E1011", f"{nq} query heads do not group over {nkv} KV heads")
        k, v = _repeat_heads(imp, k, nq // nkv), _repeat_heads(imp, v, nq // nkv)
    scale = node.attr("scale")
    if scale is None:
        if not isinstance(dh, int):
            raise node.err("E1010", "a symbolic head size needs an explicit scale")
        scale = 1.0 / math.sqrt(dh)
    mask = _mask(imp, node, skv)
    causal = bool(node.attr("is_causal", 0))
    softcap = float(node.attr("softcap", 0.0) or 0.0)
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if causal and (past or mask is not None):   # one mask: causal (bottom-right with a cache) & attn_mask
        allowed = _causal_const(imp, node, sq, skv, past)
        fill = False if mask is None or imp.dtype(mask) is dtypes.bool_ else float("-inf")
        mask = allowed if mask is None else imp.ew("where", allowed, mask, fill)
        causal = False
    keep = _unmasked_rows(imp, mask)
    if softcap <= 0 and not node.wants_output(3):
        y = imp.emit("Attention", [q, k, v] + ([mask] if mask is not None else []), scale=float(scale),
                     causal=causal)
        y, qk = (y if keep is None else imp.ew("where", keep, y, 0.0)), None
    else:
        y, qk = _attention_explicit(imp, node, q, k, v, mask, float(scale), causal, softcap, mode, keep)
    if rank == 3:
        b, h, s, d = imp.shape(y)
        y = imp.reshape(imp.permute(y, (0, 2, 1, 3)), (b, s, h * d))
    return [y, present_k, present_v, qk]


def _unmasked_rows(imp: Importer, mask: str | None) -> str | None:
    """bool [..., M, 1]: rows with at least one visible key. onnx defines a fully masked row's output
    (and probabilities) as 0, where a plain softmax over all -inf gives NaN."""
    if mask is None:
        return None
    if imp.dtype(mask) is dtypes.bool_:
        return imp.emit("Reduce", [mask], fn="max", axes=[-1], keepdim=True)
    return imp.ew("gt", imp.emit("Reduce", [mask], fn="max", axes=[-1], keepdim=True), float("-inf"))


def _mask(imp: Importer, node: OnnxNode, skv) -> str | None:
    """attn_mask, padded on the right up to the KV length (with -inf, or False for bool masks)."""
    if not node.input(3):
        return None
    m = imp.tensor(node.input(3))
    s = imp.shape(m)
    if s[-1] != skv:
        fill = False if imp.dtype(m) is dtypes.bool_ else float("-inf")
        pads = [[0, 0]] * (len(s) - 1) + [[0, skv - s[-1]]]
        m = imp.emit("Pad", [m], pads=pads, value=fill)
    return m


def _causal_const(imp: Importer, node: OnnxNode, sq, skv, offset: int) -> str:
    if not isinstance(sq, int) or not isinstance(skv, int):
        raise node.err("E1010", "causal attention with a KV cache needs static sequence lengths")
    name = imp.fresh_name(f"{node.name}::causal")
    imp.consts[name] = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + offset
    return imp.tensor(name)


def _attention_explicit(imp: Importer, node: OnnxNode, q: str, k: str, v: str, mask: str | None, scale: float,
                        causal: bool, softcap: float, mode: int, keep: str | None) -> tuple[str, str]:
    """Scores in fp32 -> softcap -> mask -> softmax -> P @ V, keeping the score the mode asks for."""
    dt = imp.dtype(q)
    s = imp.emit("MatMul", [q, k], trans_b=True, acc_dtype="fp32", out_dtype="fp32")
    s = imp.ew("mul", s, scale)
    if softcap > 0:
        s = imp.ew("mul", imp.ew("tanh", imp.ew("div", s, softcap)), softcap)
    qk = s
    if mask is not None:
        if imp.dtype(mask) is dtypes.bool_:
            s = imp.ew("where", mask, s, float("-inf"))
        else:
            s = imp.ew("add", s, imp.cast(mask, dtypes.fp32))
    if causal:
        sq, skv = imp.shape(s)[-2:]
        s = imp.ew("where", _causal_const(imp, node, sq, skv, 0), s, float("-inf"))
    if mode == 2:
        qk = s
    p = imp.emit("Softmax", [s], axis=-1)
    if keep is not None:
        p = imp.ew("where", keep, p, 0.0)
    if mode == 3:
        qk = p
    elif mode not in (0, 1, 2):
        raise node.err("E1010", f"qk_matmul_output_mode={mode} is not supported")
    y = imp.emit("MatMul", [imp.cast(p, dt), v])
    return y, imp.cast(qk, dt)
