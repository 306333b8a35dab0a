"""Channels-last activations between the convolutions of a CNN: a Graph -> Graph rewrite (the ``cpu``
target's ``layout="auto"``, ``kumiko.backend.cpu``).

ONNX and PyTorch give a CNN its activations as ``[N, C, H, W]``. A 2-D convolution reads them best as
``[N, H, W, C]``: the rows of its contraction are pixels, each pixel's channels are the K elements the
micro-kernel broadcasts one after another, so a panel of pixels is one stream of memory (and its output
tile a run of whole pixels). In ``[N, C, H, W]`` every K step is another channel plane, another stream:
on a 2-core Zen 3 a 1x1 conv 96 -> 24 at 56x56 ran 0.75x the time channels-last, a 3x3 64 -> 64 at 56x56
0.84x, a depthwise 3x3 stride 2 over 144 channels 0.43x.

The rewrite walks the graph once, in order, and keeps for each ``[N, C, H, W]`` tensor the name of its
channels-last twin (``name::nhwc``) once one exists:

- a ``Conv2D`` with one group, or depthwise (groups = input channels = output channels) with a bound
  weight, writes its result channels-last (``y_layout``) and reads its input channels-last where the twin
  exists, else as given (``x_layout``: the graph's image stays ``[N, C, H, W]``); a depthwise weight is
  bound again as ``[KH, KW, 1, C]`` (``w_layout``, a new param ``name::hwio``) so that its channels are the
  vector lanes;
- ``Elementwise`` ops with an input that has a twin run channels-last: their other tensor inputs are bound
  params (permuted now, as 4-D ``::nhwc`` params), twins, or 4-D tensors transposed by a ``Permute``;
- 2-D ``MaxPool`` / ``AvgPool`` of a twin pool channels-last (``layout``), and a ``Reduce`` of a twin
  reduces its axes where they are channels-last (a global average pool without keepdim gives the same
  ``[N, C]`` either way);
- every other op, and the graph's outputs, read the ``[N, C, H, W]`` tensor by its own name: a ``Permute``
  of the twin makes it where something needs it (a network's classifier head: once).

The graph's data inputs and outputs keep their names, shapes and layouts. A bound param the rewrite
permutes (a depthwise weight, ``name::hwio``; a constant an elementwise op reads, ``name::nhwc``) is bound
under the new name, the old one dropped where nothing else reads it: a call passing the old name is refused
(E1015, which lists the names the graph takes), as for weights that import-time folding rewrote. Nothing is
rewritten in a graph with fewer than ``MIN_CONVS`` convolutions to convert.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kumiko.frontend.graph import Graph, OpNode, SigInput, TensorType
from kumiko.tiny.ir import FrozenDict

#: ``[N, C, H, W]`` -> ``[N, H, W, C]`` and back
TO_LAST, TO_FIRST = (0, 2, 3, 1), (0, 3, 1, 2)
#: the fewest convolutions a graph converts: one alone would pay two transposes for one faster kernel
MIN_CONVS = 2
LAST = "channels_last"
_POOLS = ("MaxPool", "MaxPool2D", "AvgPool", "AvgPool2D")


def _first_layout(n: OpNode, *keys: str) -> bool:
    return all(n.attrs.get(k, "channels_first") == "channels_first" for k in keys)


def _convertible_conv(g: Graph, n: OpNode) -> bool:
    """A 2-D convolution this rewrite converts: ``[N, C, H, W]``, its layouts the defaults, one group, or
    depthwise with a bound weight."""
    if n.op != "Conv2D" or not _first_layout(n, "x_layout", "y_layout", "w_layout"):
        return False
    x, w = n.inputs[0], n.inputs[1]
    xs, ws = g.tensors[x].shape, g.tensors[w].shape
    if len(xs) != 4 or len(ws) != 4:
        return False
    groups = n.attrs.get("groups", 1)
    if groups == 1:
        return True
    return groups == xs[1] == ws[0] and ws[1] == 1 and w in g.params


class _Rewrite:
    def __init__(self, g: Graph):
        self.g = g
        self.nodes: list[OpNode] = []
        self.twin: dict[str, str] = {}          # [N, C, H, W] tensor -> its channels-last twin
        self.pending: set[str] = set()          # tensors only their twin holds so far
        self.params: dict[str, Any] = dict(g.params)
        self.sig: list[SigInput] = list(g.inputs)
        self.types: dict[str, TensorType] = {i.tensor: g.tensors[i.tensor] for i in g.inputs}
        self.consts: dict[str, str] = {}        # bound param -> its permuted (or reshaped) copy

    # names and nodes --------------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.g.tensors or name in self.types:
            k += 1
            name = f"{base}{k}"
        return name

    def _permute(self, src: str, dst: str, perm: tuple, at: str) -> None:
        self.nodes.append(OpNode("Permute", at, (src,), (dst,), FrozenDict({"perm": perm})))

    def first(self, t: Any) -> Any:
        """``t`` by its own ``[N, C, H, W]`` name, made from its twin if only the twin exists yet."""
        if isinstance(t, str) and t in self.pending:
            self._permute(self.twin[t], t, TO_FIRST, f"{t}::to_nchw")
            self.pending.discard(t)
        return t

    def last(self, t: str) -> str:
        """``t``'s channels-last twin: the one made already, a bound param permuted now, or a ``Permute``."""
        if t in self.twin:
            return self.twin[t]
        if t in self.params:
            return self._const(t)
        name = self._fresh(f"{t}::nhwc")
        self._permute(t, name, TO_LAST, f"{t}::to_nhwc")
        self.twin[t] = name
        return name

    def _const(self, t: str) -> str:
        """A bound param as the channels-last twin of its broadcast to 4-D (``[C, 1, 1]`` -> ``[1, 1, 1, C]``)."""
        if t not in self.consts:
            v = np.asarray(self.params[t])
            v4 = v.reshape((1,) * (4 - v.ndim) + v.shape).transpose(TO_LAST)
            self.consts[t] = self._bind_like(t, "::nhwc", np.ascontiguousarray(v4))
        return self.consts[t]

    def _bind_like(self, t: str, suffix: str, value: np.ndarray) -> str:
        name = self._fresh(t + suffix)
        self.params[name] = value
        self.sig.append(SigInput(name, "param"))
        self.types[name] = TensorType(self.g.tensors[t].dtype, tuple(value.shape))
        return name

    def _out(self, node: OpNode, o: str) -> None:
        """``node`` (an op converted) writes ``o``'s channels-last twin."""
        self.nodes.append(node)
        self.pending.add(o)

    # the ops ----------------------------------------------------------------------------------------
    def conv(self, n: OpNode) -> None:
        x, w, *rest = n.inputs
        attrs = dict(n.attrs)
        o = n.outputs[0]
        tw = self._fresh(f"{o}::nhwc")
        if x in self.twin:
            x, attrs["x_layout"] = self.twin[x], LAST
        else:
            x = self.first(x)
        if attrs.get("groups", 1) != 1:     # depthwise: the weight [C, 1, KH, KW] as [KH, KW, 1, C]
            w = self._hwio(w)
            attrs["w_layout"] = LAST
        attrs["y_layout"] = LAST
        self.twin[o] = tw
        self._out(OpNode(n.op, n.name, (x, self.first(w), *map(self.first, rest)), (tw,), FrozenDict(attrs)), o)

    def _hwio(self, w: str) -> str:
        key = w + "::hwio"
        if key not in self.consts:
            v = np.ascontiguousarray(np.asarray(self.params[w]).transpose(2, 3, 1, 0))
            self.consts[key] = self._bind_like(w, "::hwio", v)
        return self.consts[key]

    def elementwise(self, n: OpNode) -> bool:
        ts = [t for t in n.inputs if isinstance(t, str)]
        if len(n.outputs) != 1 or len(self.g.tensors[n.outputs[0]].shape) != 4 or not any(t in self.twin for t in ts):
            return False
        for t in ts:        # every tensor input: a twin, a bound param of rank <= 4, or a 4-D tensor
            r = len(self.g.tensors[t].shape)
            if t not in self.twin and not (t in self.params and r <= 4) and r != 4:
                return False
        o = n.outputs[0]
        tw = self._fresh(f"{o}::nhwc")
        ins = tuple(self.last(t) if isinstance(t, str) else t for t in n.inputs)
        self.twin[o] = tw
        self._out(OpNode(n.op, n.name, ins, (tw,), n.attrs), o)
        return True

    def pool(self, n: OpNode) -> bool:
        x = n.inputs[0]
        k = n.attrs.get("kernel")
        two_d = n.op.endswith("2D") or (len(k) == 2 if isinstance(k, (list, tuple)) else isinstance(k, int))
        if x not in self.twin or not two_d or not _first_layout(n, "layout") or len(self.g.tensors[x].shape) != 4:
            return False
        o = n.outputs[0]
        tw = self._fresh(f"{o}::nhwc")
        self.twin[o] = tw
        self._out(OpNode(n.op, n.name, (self.twin[x],), (tw,), FrozenDict({**n.attrs, "layout": LAST})), o)
        return True

    def reduce(self, n: OpNode) -> bool:
        x = n.inputs[0]
        axes = n.attrs.get("axes")
        if x not in self.twin or axes is None or len(self.g.tensors[x].shape) != 4:
            return False
        axes = [a if isinstance(a, int) else None for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
        if None in axes:
            return False
        axes = sorted({a % 4 for a in axes})
        moved = [TO_LAST.index(a) for a in axes]
        o = n.outputs[0]
        attrs = FrozenDict({**n.attrs, "axes": tuple(moved)})
        if n.attrs.get("keepdim", False):
            tw = self._fresh(f"{o}::nhwc")
            self.twin[o] = tw
            self._out(OpNode(n.op, n.name, (self.twin[x],), (tw,), attrs), o)
            return True
        kept = [TO_LAST.index(a) for a in range(4) if a not in axes]
        if kept != sorted(kept):
            return False            # the kept axes would come out in another order
        self.nodes.append(OpNode(n.op, n.name, (self.twin[x],), (o,), attrs))
        return True

    def run(self) -> Graph:
        g = self.g
        for n in g.nodes:
            if _convertible_conv(g, n):
                self.conv(n)
                continue
            if n.op == "Elementwise" and self.elementwise(n):
                continue
            if n.op in _POOLS and self.pool(n):
                continue
            if n.op == "Reduce" and self.reduce(n):
                continue
            self.nodes.append(replace(n, inputs=tuple(self.first(t) for t in n.inputs)))
        for o in g.outputs:
            self.first(o)
        used = {t for n in self.nodes for t in n.inputs if isinstance(t, str)} | set(g.outputs)
        sig = [s for s in self.sig if s.tensor in used or s.role != "param"]
        params = {k: v for k, v in self.params.items() if k in used}
        out = Graph.make(sig, g.outputs, {s.tensor: self.types[s.tensor] for s in sig}, self.nodes, g.symbols,
                         g.name, params=params)
        return replace(out, fp64_inputs=g.fp64_inputs)


def channels_last(g: Graph) -> Graph:
    """``g`` with channels-last activations between its convolutions (module docstring); ``g`` itself when it
    has fewer than ``MIN_CONVS`` to convert."""
    if sum(_convertible_conv(g, n) for n in g.nodes) < MIN_CONVS:
        return g
    return _Rewrite(g).run()
