"""ONNX activations, trigonometry, Dropout and ReduceLogSumExp, each built from frontend Elementwise and
Reduce ops (there is no frontend op per activation: the compositions below are what those ops would
lower to anyway, and the backends fuse elementwise chains).

Float activations on fp16/bf16 are computed in fp32 and cast back once, so a chain such as
``alpha * (exp(x) - 1)`` rounds once rather than after every step. Every default is ONNX's.
"""
from __future__ import annotations

import math

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_import import Importer
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.frontend.onnx_ops import _axes_arg, converter


def _float_input(imp: Importer, node: OnnxNode) -> tuple[str, dtypes.DType]:
    """The input in fp32 (16-bit floats widened; fp64 stays fp64) and its own dtype; E1012 for non-float
    inputs."""
    x = imp.tensor(node.input(0))
    dt = imp.dtype(x)
    if not dt.is_float:
        raise node.err("E1012", f"{node.op_type} takes a float input, got {dt}")
    return imp.cast(x, dtypes.default_acc(dt)), dt


def _softplus(imp: Importer, x: str) -> str:
    """log(1 + exp(x)) as relu(x) + log(1 + exp(-|x|)): no overflow for large x."""
    return imp.ew("add", imp.ew("relu", x), imp.ew("log", imp.ew("add", imp.ew("exp", imp.ew("neg", imp.ew("abs", x))),
                                                                 1.0)))


def _act(imp: Importer, node: OnnxNode, x: str) -> str:
    a = node.attr
    op = node.op_type
    if op == "Elu":
        alpha = float(a("alpha", 1.0))
        return imp.ew("where", imp.ew("lt", x, 0.0), imp.ew("mul", imp.ew("sub", imp.ew("exp", x), 1.0), alpha), x)
    if op == "Selu":
        alpha, gamma = float(a("alpha", 1.67326319217681884765625)), float(a("gamma", 1.05070102214813232421875))
        neg = imp.ew("mul", imp.ew("sub", imp.ew("exp", x), 1.0), alpha * gamma)
        return imp.ew("where", imp.ew("le", x, 0.0), neg, imp.ew("mul", x, gamma))
    if op == "Celu":
        alpha = float(a("alpha", 1.0))
        if alpha == 0:
            raise node.err("E1010", "Celu's alpha must not be 0 (it divides x)")
        neg = imp.ew("mul", imp.ew("sub", imp.ew("exp", imp.ew("div", x, alpha)), 1.0), alpha)
        return imp.ew("add", imp.ew("relu", x), imp.ew("min", neg, 0.0))
    if op == "Softplus":
        return _softplus(imp, x)
    if op == "Softsign":
        return imp.ew("div", x, imp.ew("add", imp.ew("abs", x), 1.0))
    if op in ("HardSigmoid", "HardSwish"):
        alpha, beta = (float(a("alpha", 0.2)), float(a("beta", 0.5))) if op == "HardSigmoid" else (1 / 6, 0.5)
        y = imp.ew("clip", imp.ew("add", imp.ew("mul", x, alpha), beta), min=0.0, max=1.0)
        return y if op == "HardSigmoid" else imp.ew("mul", x, y)
    if op == "Mish":
        return imp.ew("mul", x, imp.ew("tanh", _softplus(imp, x)))
    if op == "ThresholdedRelu":
        return imp.ew("where", imp.ew("gt", x, float(a("alpha", 1.0))), x, 0.0)
    return imp.ew(op.lower(), x)          # Sin, Cos, Tan


@converter("Elu", "Celu", "ThresholdedRelu", attrs="alpha")
@converter("Selu", attrs="alpha gamma")
@converter("HardSigmoid", attrs="alpha beta")
@converter("Softplus", "Softsign", "HardSwish", "Mish", "Sin", "Cos", "Tan")
def conv_activation(imp: Importer, node: OnnxNode) -> str:
    x, dt = _float_input(imp, node)
    return imp.cast(_act(imp, node, x), dt)


@converter("PRelu")
def conv_prelu(imp: Importer, node: OnnxNode) -> str:
    """where(x < 0, slope * x, x); the slope broadcasts to x's shape one way only (ONNX's unidirectional
    broadcast), so the output has x's shape. Models written for opset 6 give a per-channel slope [C]."""
    x = imp.tensor(node.input(0))
    xs = imp.shape(x)
    sn = node.input(1)
    ss = imp.consts[sn].shape if sn in imp.consts else imp.shape(imp.tensor(sn))
    if imp.source_opset < 7 and len(ss) == 1 and ss[0] != 1 and len(xs) > 2 and ss[0] == xs[1]:
        # opset 6 (before broadcasting): a slope of C values is one per channel (axis 1)
        slope = imp.reshape(imp.tensor(sn), (ss[0],) + (1,) * (len(xs) - 2))
        return imp.ew("where", imp.ew("lt", x, 0), imp.ew("mul", x, slope), x)
    if len(ss) > len(xs) or any(d not in (1, e) for d, e in zip(reversed(ss), reversed(xs))):
        raise node.err("E1011", f"the slope's shape {[str(d) for d in ss]} does not broadcast to the input's "
                       f"{[str(d) for d in xs]}")
    slope = imp.operand(sn, len(xs)) if sn in imp.consts else imp.tensor(sn)
    return imp.ew("where", imp.ew("lt", x, 0), imp.ew("mul", x, slope), x)


@converter("Dropout", attrs="seed")
def conv_dropout(imp: Importer, node: OnnxNode) -> list:
    """Inference: the identity, and an all-true mask when one is asked for. Training with a non-zero
    ratio draws random numbers, which kumiko does not do (E1010); training with ratio 0 is the identity
    too. ``seed`` only seeds that draw, so it changes nothing here."""
    x = imp.tensor(node.input(0))
    training = bool(imp.const(node.input(2), "training_mode", "E1010").reshape(-1)[0]) if node.input(2) else False
    if training:
        ratio = float(imp.const(node.input(1), "ratio", "E1010").reshape(-1)[0]) if node.input(1) else 0.5
        if ratio != 0.0:
            raise node.err("E1010", f"Dropout in training mode (ratio {ratio}) draws random numbers; kumiko "
                           "imports inference graphs", suggestion="export the model in eval mode")
    mask = None
    if node.wants_output(1):
        true = imp.fresh_name(f"{node.name}::true")
        imp.consts[true] = np.array(True)
        mask = imp.emit("Expand", [imp.tensor(true)], shape=list(imp.shape(x)))
    return [x, mask]


@converter("ReduceLogSumExp", attrs="axes keepdims noop_with_empty_axes")
def conv_reduce_log_sum_exp(imp: Importer, node: OnnxNode) -> str:
    """log(sum(exp(x - m))) + m with m the max over the axes, so large inputs do not overflow; an
    infinite m (a slice of all -inf, or any +inf) is replaced by 0 so that x - m is not inf - inf."""
    x, dt = _float_input(imp, node)
    axes = _axes_arg(imp, node, 1)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return imp.tensor(node.input(0))
        axes = list(range(len(imp.shape(x))))
    m = imp.emit("Reduce", [x], fn="max", axes=axes, keepdim=True)
    m = imp.ew("where", imp.ew("lt", imp.ew("abs", m), math.inf), m, 0.0)
    s = imp.emit("Reduce", [imp.ew("exp", imp.ew("sub", x, m))], fn="sum", axes=axes, keepdim=True)
    y = imp.ew("add", imp.ew("log", s), m)
    if not node.attr("keepdims", 1):
        r = len(imp.shape(x))
        keep = {a % r for a in axes}
        y = imp.reshape(y, [d for k, d in enumerate(imp.shape(y)) if k not in keep])
    return imp.cast(y, dt)

