"""ONNX normalisations: BatchNormalization (inference), InstanceNormalization, GroupNormalization and
LRN, built from frontend LayerNorm, Elementwise, Reduce and movement ops (LayerNormalization stays in
``onnx_ops``).

BatchNormalization at inference is an affine map per channel, ``x * s + t`` with
``s = scale / sqrt(var + eps)`` and ``t = bias - mean * s``. Exported CNNs put it right after a Conv
(or Gemm/MatMul) whose weight is a constant nobody else reads; then the map is folded into that
op's weight and bias at import (the op is converted again from the folded constants, and what the
first conversion emitted is dead and dropped), so the network runs no normalisation at all. Otherwise
``s`` and ``t`` are constants computed at import, or computed in the graph when they are run-time
tensors.

Normalisations of fp16/bf16 inputs compute in fp32 and cast back once, as LayerNorm does; fp64 inputs
compute in fp64.
"""
from __future__ import annotations

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_import import CONVERTERS, Importer
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.frontend.onnx_ops import converter, dtype_name

_FLOATS = (dtypes.fp32, dtypes.fp16, dtypes.bf16, dtypes.fp64)


def _float_input(imp: Importer, node: OnnxNode, min_rank: int) -> tuple[str, dtypes.DType]:
    """x in its compute dtype (fp32, or fp64 for an fp64 x) and its own dtype; E1012 unless float, E1011
    below ``min_rank`` ([N, C, spatial...])."""
    x = imp.tensor(node.input(0))
    dt = imp.dtype(x)
    if dt not in _FLOATS:
        raise node.err("E1012", f"{node.op_type} takes a float input (fp32, fp16, bf16 or fp64), got {dt}")
    if len(imp.shape(x)) < min_rank:
        raise node.err("E1011", f"{node.op_type} needs an input of rank {min_rank} or more ([N, C, ...]), got "
                       f"{[str(d) for d in imp.shape(x)]}")
    return imp.cast(x, dt if dt is dtypes.fp64 else dtypes.fp32), dt


def _channel_vector(imp: Importer, node: OnnxNode, k: int, channels, rank: int, what: str, like: str) -> str:
    """Input ``k`` (a [C] vector) in the dtype of ``like`` (x in its compute dtype), shaped [C, 1, ...] to
    broadcast over x's axes 1.."""
    v = imp.cast(imp.tensor(node.input(k)), imp.dtype(like))
    if imp.shape(v) != (channels,):
        raise node.err("E1011", f"{what} must have shape [{channels}], got {[str(d) for d in imp.shape(v)]}")
    return imp.reshape(v, (channels,) + (1,) * (rank - 2))


def _new_const(imp: Importer, base: str, arr: np.ndarray) -> str:
    """Register an import-time constant under a name no ONNX or kumiko tensor has (it becomes a param
    named so when a run-time op reads it)."""
    name, k = base, 0
    while name in imp.consts or name in imp.onnx_names or name in imp.taken or name in imp.types:
        k += 1
        name = f"{base}::{k}"
    imp.consts[name] = arr
    return name


# ------------------------------------------------------------------------------------------------
# BatchNormalization

def _fold(imp: Importer, node: OnnxNode, s: np.ndarray, t: np.ndarray) -> str | None:
    """Fold ``x * s + t`` into the Conv / Gemm / 2-D MatMul that produced x, when x feeds only this node and
    the op's weight is a float constant that only the op reads (folding then rewrites that weight rather
    than copying it). Returns the folded op's output, or None where the rule does not apply."""
    xn = node.input(0)
    p = imp.producer.get(xn)
    if p is None or p.op_type not in ("Conv", "Gemm", "MatMul") or xn not in imp.kt or imp.uses(xn) != 1:
        return None
    wn = p.input(1)
    w = imp.consts.get(wn)
    if w is None or w.dtype.kind != "f" or imp.uses(wn) != 1 or p.input(0) == wn:
        return None
    bn = p.input(2) if p.op_type != "MatMul" else ""
    if bn and bn not in imp.consts:
        return None                                    # a run-time bias: nothing to fold it into at import
    b = imp.consts[bn].astype(np.float64) if bn else np.zeros(1)
    attrs = dict(p.attrs)
    if p.op_type == "Conv":
        w2 = w * s.reshape((-1,) + (1,) * (w.ndim - 1))
        b2 = b * s + t
        op = "Conv"
    else:
        if p.op_type == "MatMul" and (w.ndim != 2 or len(imp.shape(imp.kt[p.input(0)])) != 2):
            return None                                # batched: axis 1 is not the weight's output axis
        w2 = w * (s[:, None] if p.attrs.get("transB", 0) else s[None, :])
        b2 = float(p.attrs.get("beta", 1.0)) * b * s + t
        op, attrs["beta"] = "Gemm", 1.0
    from onnx import NodeProto
    proto = NodeProto()
    proto.CopyFrom(p.proto)
    proto.op_type = op
    del proto.input[:]
    proto.input.extend([p.input(0), _new_const(imp, f"{wn}::bn", w2.astype(w.dtype)),
                        _new_const(imp, f"{bn or wn}::bn_bias", b2.astype(w.dtype))])
    return CONVERTERS[op](imp, OnnxNode(proto, p.index, p.opset, attrs))


@converter("BatchNormalization", attrs="epsilon momentum training_mode")
def conv_batchnorm(imp: Importer, node: OnnxNode) -> str:
    """Inference-mode BatchNormalization. Training mode, and the running or saved statistics outputs
    that only training computes, are E1010. ``momentum`` weights the running-statistics update, which
    inference does not make, so it changes nothing here."""
    if int(node.attr("training_mode", 0)):
        raise node.err("E1010", "BatchNormalization in training mode (batch statistics, running-mean updates) "
                       "is not supported; kumiko imports inference graphs", suggestion="export in eval mode")
    if any(node.wants_output(k) for k in range(1, len(node.outputs))):
        raise node.err("E1010", "BatchNormalization's running/saved mean and variance outputs are training "
                       "outputs, which kumiko does not import", suggestion="export in eval mode")
    eps = float(node.attr("epsilon", 1e-5))
    x, xdt = _float_input(imp, node, 2)
    shape = imp.shape(x)
    names = [node.input(k) for k in range(1, 5)]
    if all(n in imp.consts for n in names):
        scale, bias, mean, var = (imp.consts[n].astype(np.float64) for n in names)
        if any(a.shape != (shape[1],) for a in (scale, bias, mean, var)):
            raise node.err("E1011", f"scale, B, mean and var must have shape [{shape[1]}], got "
                           f"{[list(a.shape) for a in (scale, bias, mean, var)]}")
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
        folded = _fold(imp, node, s, t)
        if folded is not None:
            return folded
        shaped = (-1,) + (1,) * (len(shape) - 2)
        cnp = imp.dtype(x).np
        sv = imp.tensor(_new_const(imp, f"{node.name}::scale", s.astype(cnp).reshape(shaped)))
        tv = imp.tensor(_new_const(imp, f"{node.name}::shift", t.astype(cnp).reshape(shaped)))
    else:
        scale, bias, mean, var = (_channel_vector(imp, node, k, shape[1], len(shape), what, x)
                                  for k, what in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")))
        sv = imp.ew("mul", scale, imp.ew("rsqrt", imp.ew("add", var, eps)))
        tv = imp.ew("sub", bias, imp.ew("mul", mean, sv))
    return imp.cast(imp.ew("add", imp.ew("mul", x, sv), tv), xdt)


# ------------------------------------------------------------------------------------------------
# Instance and group normalisation: LayerNorm over the right axes, then the per-channel affine

def _stash_fp32(node: OnnxNode) -> None:
    if int(node.attr("stash_type", 1)) != 1:
        raise node.err("E1010", f"stash_type {dtype_name(int(node.attr('stash_type')))} is not supported "
                       "(kumiko normalises in fp32)")


@converter("InstanceNormalization", attrs="epsilon")
def conv_instancenorm(imp: Importer, node: OnnxNode) -> str:
    x, dt = _float_input(imp, node, 3)
    shape = imp.shape(x)
    y = imp.emit("LayerNorm", [x], axis=2, eps=float(node.attr("epsilon", 1e-5)))
    y = imp.ew("mul", y, _channel_vector(imp, node, 1, shape[1], len(shape), "scale", x))
    return imp.cast(imp.ew("add", y, _channel_vector(imp, node, 2, shape[1], len(shape), "B", x)), dt)


@converter("GroupNormalization", attrs="epsilon num_groups stash_type")
def conv_groupnorm(imp: Importer, node: OnnxNode) -> str:
    """x [N, C, ...] seen as [N, G, C/G * spatial] and normalised over its last axis. Opset 18 gives scale
    and bias per group (applied in the grouped view); opset 21 per channel (applied after)."""
    x, dt = _float_input(imp, node, 3)
    _stash_fp32(node)
    shape = imp.shape(x)
    c, g = shape[1], int(node.attr("num_groups"))
    if not isinstance(c, int) or g < 1 or c % g:
        raise node.err("E1011", f"{c} channels do not split into num_groups={g} groups")
    grouped = imp.reshape(x, (shape[0], g, -1))
    y = imp.emit("LayerNorm", [grouped], axis=2, eps=float(node.attr("epsilon", 1e-5)))
    if node.opset < 21:
        y = imp.ew("mul", y, _channel_vector(imp, node, 1, g, 3, "scale (one per group before opset 21)", x))
        y = imp.ew("add", y, _channel_vector(imp, node, 2, g, 3, "bias (one per group before opset 21)", x))
        return imp.cast(imp.reshape(y, shape), dt)
    y = imp.ew("mul", imp.reshape(y, shape), _channel_vector(imp, node, 1, c, len(shape), "scale", x))
    return imp.cast(imp.ew("add", y, _channel_vector(imp, node, 2, c, len(shape), "bias", x)), dt)


# ------------------------------------------------------------------------------------------------
# LRN

@converter("LRN", attrs="alpha beta bias size")
def conv_lrn(imp: Importer, node: OnnxNode) -> str:
    """``x / (bias + alpha/size * sum of x^2 over a channel window)^beta``; the window sum is the squares
    padded on the channel axis and ``size`` shifted slices added (size is small: 3 or 5 in practice)."""
    x, dt = _float_input(imp, node, 2)
    size = int(node.attr("size"))
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    shape = imp.shape(x)
    c = shape[1]
    if size < 1:
        raise node.err("E1010", f"LRN's size must be at least 1, got {size}")
    if not isinstance(c, int):
        raise node.err("E1010", f"LRN needs a static channel count, got {c}")
    lo = (size - 1) // 2
    pads = [[0, 0]] * len(shape)
    pads[1] = [lo, size - 1 - lo]
    sq = imp.ew("mul", x, x)
    padded = imp.emit("Pad", [sq], pads=pads, value=0.0) if size > 1 else sq
    total = None
    for j in range(size):
        part = imp.emit("Slice", [padded], starts=[j], ends=[j + c], axes=[1], steps=[1]) if size > 1 else sq
        total = part if total is None else imp.ew("add", total, part)
    den = imp.ew("pow", imp.ew("add", imp.ew("mul", total, alpha / size), bias), beta)
    return imp.cast(imp.ew("div", x, den), dt)
