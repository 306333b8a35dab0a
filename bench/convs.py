"""The convolution classes of CNNs as bench/bench.py workloads (issue 23): depthwise (stride 1 and 2),
grouped, strided, 1x1 at the small spatial sizes of a network's late stages, dilated and a ResNet 3x3, each
Conv + bias + ReLU at batch 1, NCHW, fp32, against the same layer in PyTorch, ONNX Runtime and tinygrad.

``conv_workloads(Workload)`` builds them (bench.py passes its own ``Workload`` class, so this module imports
nothing of it). Keys are ``C-<class>``; ``--workloads C`` selects them all.
"""
from __future__ import annotations

from kumiko import Tensor

#: key, title, sizes (C in, Co out, H = W, k, stride, pad, dilation, groups), quick sizes
CONVS = (
    ("C-dw-s1", "Depthwise 3x3 s1, 144 ch, 56x56", dict(C=144, Co=144, H=56, k=3, s=1, p=1, d=1, g=144)),
    ("C-dw-s2", "Depthwise 3x3 s2, 144 ch, 56x56 -> 28x28", dict(C=144, Co=144, H=56, k=3, s=2, p=1, d=1, g=144)),
    ("C-dw-7", "Depthwise 3x3 s1, 960 ch, 7x7", dict(C=960, Co=960, H=7, k=3, s=1, p=1, d=1, g=960)),
    ("C-grouped", "Conv 3x3 groups 8, 64 -> 64, 56x56", dict(C=64, Co=64, H=56, k=3, s=1, p=1, d=1, g=8)),
    ("C-strided", "Conv 3x3 s2, 128 -> 128, 56x56 -> 28x28", dict(C=128, Co=128, H=56, k=3, s=2, p=1, d=1, g=1)),
    ("C-1x1-56", "Conv 1x1, 256 -> 64, 56x56", dict(C=256, Co=64, H=56, k=1, s=1, p=0, d=1, g=1)),
    ("C-1x1-14", "Conv 1x1, 96 -> 576, 14x14", dict(C=96, Co=576, H=14, k=1, s=1, p=0, d=1, g=1)),
    ("C-1x1-7", "Conv 1x1, 320 -> 1280, 7x7", dict(C=320, Co=1280, H=7, k=1, s=1, p=0, d=1, g=1)),
    ("C-3x3-7", "Conv 3x3, 512 -> 512, 7x7 (ResNet-50's last stage)", dict(C=512, Co=512, H=7, k=3, s=1, p=1, d=1,
                                                                          g=1)),
    ("C-dilated", "Conv 3x3 dilation 2, 64 -> 64, 28x28", dict(C=64, Co=64, H=28, k=3, s=1, p=2, d=2, g=1)),
    ("C-stem", "Conv 7x7 s2, 3 -> 64, 224x224 -> 112x112 (ResNet-50's stem)", dict(C=3, Co=64, H=224, k=7, s=2, p=3,
                                                                                    d=1, g=1)),
)


def _quick(sz: dict) -> dict:
    """Smoke-run sizes of the same class: at most 17 pixels wide, a few channels per group."""
    g, small = sz["g"], dict(sz, H=min(sz["H"], 17))
    if g == sz["C"] and g > 1:         # depthwise stays depthwise
        small.update(C=min(g, 16), Co=min(g, 16), g=min(g, 16))
    else:
        small.update(C=g * min(sz["C"] // g, 4), Co=g * min(sz["Co"] // g, 4) if g > 1 else min(sz["Co"], 8))
    return small


def _graph(sz: dict):
    x = Tensor.input("X", ("N", sz["C"], "H", "H"))
    w = Tensor.input("Wt", (sz["Co"], sz["C"] // sz["g"], sz["k"], sz["k"]))
    b = Tensor.input("bias", (sz["Co"],))
    y = x.conv2d(w, b, stride=sz["s"], padding=sz["p"], dilation=sz["d"], groups=sz["g"]).relu()
    return y.graph("y", name="conv", symbols={"N": sz["N"], "H": sz["H"]})


def _torch(t, i, sz):
    return t.relu(t.nn.functional.conv2d(i["X"], i["Wt"], i["bias"], stride=sz["s"], padding=sz["p"],
                                         dilation=sz["d"], groups=sz["g"]))


def _onnx(h, sz):
    k = sz["k"]
    return [h.make_node("Conv", ["X", "Wt", "bias"], ["c"], kernel_shape=[k, k], pads=[sz["p"]] * 4,
                        strides=[sz["s"]] * 2, dilations=[sz["d"]] * 2, group=sz["g"]),
            h.make_node("Relu", ["c"], ["y"])], []


def _tinygrad(T, i, sz):
    return i["X"].conv2d(i["Wt"], i["bias"], groups=sz["g"], stride=sz["s"], dilation=sz["d"],
                         padding=sz["p"]).relu()


def conv_workloads(workload_cls) -> list:
    """The conv-class workloads as bench.py's ``Workload`` objects (batch 1)."""
    out = []
    for key, title, sz in CONVS:
        sizes = dict(sz, N=1)
        out.append(workload_cls(key, f"{title} + bias + ReLU, batch 1", sizes, _quick(sizes), _graph,
                                torch=_torch, onnx=_onnx, tinygrad=_tinygrad))
    return out
