"""ONNX Pad (every mode) and Resize (nearest, linear), both as constant index maps per axis.

Edge, reflect and wrap padding and nearest/linear resizing all read the input at positions that
depend only on the static shapes, so the importer computes those positions with numpy (the index
map of one axis) and emits frontend movement ops that read them; no Tiny IR op is added. An index
map becomes, in order of preference:

* nothing, when it is the identity (a resize's scale-1 axis);
* a **repeat** - one Slice of a run, then Reshape/Expand/Reshape - when every index is repeated k
  times in a row (nearest upsampling by an integer factor, the common case in detection necks);
* a **Concat of a few slices**, one per arithmetic run of the map (step 1 copies, step -1 reflects
  through the flip of a Slice with a negative step, step 0 repeats an edge through Expand, larger
  steps decimate): every padding mode, and nearest downsampling by an integer factor;
* a **Gather** (take) with a constant i32 index tensor, for anything else (fractional scales).

The first three are affine VIEWs, so IndexBook/Poly see them and the pieces fuse with their consumer
like any pad or slice; a Gather is the one data-dependent index Tiny IR has and stops that analysis
(``non_scop``), which is why it is the fallback and not the rule. Linear resizing is two maps (the
left and right neighbour) blended with constant weights, computed in fp32.
"""
from __future__ import annotations

import math

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_fold import _ints
from kumiko.frontend.onnx_import import Importer
from kumiko.frontend.onnx_index import _axis, _static
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.frontend.onnx_ops import converter

#: the most slices an index map is cut into before it is a Gather instead
MAX_PIECES = 8


# ------------------------------------------------------------------------------------------------
# index maps


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """The map cut greedily into arithmetic runs ``(first, step, length)``."""
    out, i, m = [], 0, len(idx)
    while i < m:
        if i + 1 == m:
            out.append((int(idx[i]), 1, 1))
            break
        step, j = int(idx[i + 1] - idx[i]), i + 1
        while j + 1 < m and idx[j + 1] - idx[j] == step:
            j += 1
        out.append((int(idx[i]), step, j - i + 1))
        i = j + 1
    return out


def _repeat(idx: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(base, k)`` when ``idx`` is ``np.repeat(base, k)`` with k > 1, else None."""
    k = int(np.argmax(idx != idx[0])) if (idx != idx[0]).any() else len(idx)
    if k < 2 or len(idx) % k:
        return None
    rows = idx.reshape(-1, k)
    return (rows[:, 0], k) if (rows == rows[:, :1]).all() else None


def _piece(imp: Importer, x: str, axis: int, n: int, first: int, step: int, length: int) -> str:
    """One run of an index map as a Slice (an Expand of one element for step 0)."""
    if step == 0:
        y = imp.emit("Slice", [x], starts=[first], ends=[first + 1], axes=[axis], steps=[1])
        if length == 1:
            return y
        shape = list(imp.shape(y))
        shape[axis] = length
        return imp.emit("Expand", [y], shape=shape)
    end = first + step * length
    if end < 0:             # a negative step down to index 0 inclusive: Python's "before the start"
        end = -n - 1
    if (first, end, step) == (0, n, 1):
        return x
    return imp.emit("Slice", [x], starts=[first], ends=[end], axes=[axis], steps=[step])


def take_axis(imp: Importer, x: str, axis: int, idx: np.ndarray) -> str:
    """``numpy.take(x, idx, axis)`` for a constant map ``idx`` of in-range indices, as affine views
    where the map allows it (see the module docstring) and a Gather otherwise."""
    idx = np.asarray(idx, dtype=np.int64)
    n = imp.shape(x)[axis]
    if len(idx) == n and (idx == np.arange(n)).all():
        return x
    rep = _repeat(idx)
    if rep is not None and len(_runs(rep[0])) <= MAX_PIECES:
        base, k = rep
        y = take_axis(imp, x, axis, base)
        s = imp.shape(y)
        y = imp.reshape(y, s[:axis + 1] + (1,) + s[axis + 1:])
        y = imp.emit("Expand", [y], shape=list(s[:axis + 1]) + [k] + list(s[axis + 1:]))
        return imp.reshape(y, s[:axis] + (len(idx),) + s[axis + 1:])
    runs = _runs(idx)
    if len(runs) <= MAX_PIECES:
        pieces = [_piece(imp, x, axis, n, *r) for r in runs]
        return pieces[0] if len(pieces) == 1 else imp.emit("Concat", pieces, axis=axis)
    where = imp._param(f"{imp.cur.name}::index", idx.astype(np.int32))
    return imp.emit("Gather", [x, where], axis=axis, mode="take")


# ------------------------------------------------------------------------------------------------
# Pad

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@converter("Pad", attrs="mode")
def conv_pad(imp: Importer, node: OnnxNode) -> str:
    """Constant padding is the frontend Pad; the other modes are index maps per padded axis, taken
    the way onnxruntime does: negative pads crop first and the rest pads what is left (numpy's
    ``np.pad`` modes, which onnx's reference uses)."""
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES:
        raise node.err("E1010", f"Pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    r = len(shape)
    pads = _ints(imp.const(node.input(1), "pads"))
    axes = _ints(imp.const(node.input(3), "axes")) if node.input(3) else list(range(r))
    if len(pads) != 2 * len(axes):
        raise node.err("E1010", f"pads has {len(pads)} values for {len(axes)} axes")
    pairs = [[0, 0] for _ in range(r)]
    for k, a in enumerate(axes):
        pairs[_axis(node, a, r)] = [pads[k], pads[k + len(axes)]]
    if mode == "constant":
        value = imp.const(node.input(2), "constant_value", "E1010").reshape(()).item() if node.input(2) else 0
        return imp.emit("Pad", [x], pads=pairs, value=value)
    for a, (lo, hi) in enumerate(pairs):
        if lo or hi:
            x = take_axis(imp, x, a, _pad_map(node, mode, _static(node, shape[a], f"padded axis {a}"), lo, hi, a))
    return x


def _pad_map(node: OnnxNode, mode: str, n: int, lo: int, hi: int, axis: int) -> np.ndarray:
    kept = np.arange(n)[max(-lo, 0):n - max(-hi, 0)]
    before, after = max(lo, 0), max(hi, 0)
    if (before or after) and kept.size == 0:
        raise node.err("E1010", f"Pad mode {mode!r} cannot pad axis {axis}: nothing is left of it to repeat")
    if mode == "reflect" and max(before, after) >= kept.size:
        raise node.err("E1010", f"Pad mode 'reflect' needs pads smaller than the axis: axis {axis} has "
                       f"{kept.size} elements, pads ({lo}, {hi})",
                       suggestion="onnx and onnxruntime allow at most size - 1 reflected elements per side")
    return np.pad(kept, (before, after), mode=mode)


# ------------------------------------------------------------------------------------------------
# Resize

NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn")
POLICIES = ("stretch", "not_larger", "not_smaller")


@converter("Resize", attrs="mode coordinate_transformation_mode nearest_mode cubic_coeff_a exclude_outside "
                           "extrapolation_value antialias axes keep_aspect_ratio_policy")
def conv_resize(imp: Importer, node: OnnxNode) -> str:
    """Resize axis by axis (onnx's reference is separable), each axis an index map (nearest) or two
    maps and a blend (linear), following onnx's reference formulas at import.

    ``cubic_coeff_a`` only shapes cubic kernels and ``extrapolation_value`` only tf_crop_and_resize's
    outside points, and ``roi`` is read only by tf_crop_and_resize: all three are refused with the mode
    that would read them and carry no meaning otherwise. Models older than opset 11 (Upsample,
    Resize-10) mean onnxruntime's legacy mapping: asymmetric, nearest rounding down when an axis
    grows and up when it shrinks (onnx's version converter drops that when it makes them Resize-13).
    """
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise node.err("E1010", f"Resize mode={mode!r} is not supported (nearest, linear)")
    for key in ("antialias", "exclude_outside"):
        if int(node.attr(key, 0)):
            raise node.err("E1010", f"Resize {key}=1 is not supported (only cubic and antialiased kernels read it)")
    legacy = imp.source_opset < 11
    ctm = "asymmetric" if legacy else node.attr("coordinate_transformation_mode", "half_pixel")
    if ctm not in COORD_MODES:
        raise node.err("E1010", f"Resize coordinate_transformation_mode={ctm!r} is not supported "
                       f"({', '.join(COORD_MODES)})")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    if nearest not in NEAREST_MODES:
        raise node.err("E1010", f"Resize nearest_mode={nearest!r} is not one of {', '.join(NEAREST_MODES)}")
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    dt = imp.dtype(x)
    if mode == "linear" and not dt.is_float:
        raise node.err("E1012", f"linear Resize of {dt} is not supported (float inputs only)")
    for a, scale, out in _resize_plan(imp, node, shape):
        n = shape[a]
        if math.isclose(scale, 1.0) and out == n:
            continue                    # the reference skips such axes whatever the mode
        xo = _source_coords(ctm, scale, n, out)
        if mode == "nearest":
            rule = ("floor" if scale >= 1 else "ceil") if legacy else nearest
            x = take_axis(imp, x, a, np.clip(_round(xo, rule), 0, n - 1))
        else:
            x = _linear(imp, x, a, xo, n, dt)
    return x


def _resize_plan(imp: Importer, node: OnnxNode, shape: tuple) -> list[tuple[int, np.float32, int]]:
    """``(axis, scale, output size)`` per resized axis, from constant scales or sizes (sizes win when both
    are given; ``keep_aspect_ratio_policy`` rescales), in fp32 as onnxruntime computes them: onnx's
    reference multiplies in float64, so a scale of 1.4 on 5 gives it 6 rows and onnxruntime 7. An axis
    whose scale is 1 and whose size stays is left alone, so it may be symbolic."""
    r = len(shape)
    axes = node.ints("axes")
    axes = list(range(r)) if axes is None else [_axis(node, a, r) for a in axes]
    if len(set(axes)) != len(axes):
        raise node.err("E1010", f"Resize axes {node.ints('axes')} name an axis twice")
    given = {}
    for k, what in ((2, "scales"), (3, "sizes")):
        if node.input(k):
            v = imp.const(node.input(k), f"Resize's {what}")
            if v.size:
                if v.size != len(axes):
                    raise node.err("E1010", f"Resize's {what} has {v.size} values for {len(axes)} axes")
                given[what] = v.reshape(-1)
    if not given:
        raise node.err("E1010", "Resize needs scales or sizes")
    if "sizes" in given:
        keep = [k for k, (a, s) in enumerate(zip(axes, given["sizes"])) if s == shape[a]]
    else:
        keep = [k for k, s in enumerate(given["scales"]) if s == 1]
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        raise node.err("E1010", f"Resize keep_aspect_ratio_policy={policy!r} is not one of {', '.join(POLICIES)}")
    if policy == "stretch" or "sizes" not in given:
        axes, given = [a for k, a in enumerate(axes) if k not in keep], \
            {w: np.delete(v, keep) for w, v in given.items()}
    n = [np.float32(_static(node, shape[a], f"resized axis {a}")) for a in axes]
    if "sizes" in given:
        sizes = [int(s) for s in given["sizes"]]
        scales = [np.float32(s) / d for s, d in zip(sizes, n)]
        if policy != "stretch":
            s = (min if policy == "not_larger" else max)(scales)
            scales = [s] * len(axes)
            sizes = [int(s * d + np.float32(0.5)) for d in n]
    else:
        scales = [np.float32(s) for s in given["scales"]]
        if min(scales, default=1) <= 0:
            raise node.err("E1010", f"Resize scales must be positive, got {[float(s) for s in scales]}")
        sizes = [int(s * d) for s, d in zip(scales, n)]
    if min(sizes, default=1) < 1:
        raise node.err("E1010", f"Resize to sizes {sizes} would leave an empty axis")
    return list(zip(axes, scales, sizes))


def _source_coords(ctm: str, scale: np.float32, n: int, out: int) -> np.ndarray:
    """Where each output position samples the input axis: onnx's ``_compute_x_ori`` (align_corners and
    half_pixel_symmetric use the real-valued output size ``scale * n``, as the reference and the node
    tests do), evaluated in fp32 as onnxruntime does, so ties round the same way."""
    f = np.float32
    y = np.arange(out, dtype=f)
    width = scale * f(n)
    if ctm == "align_corners":
        return np.zeros(out, f) if width == 1 else y * f(n - 1) / (width - f(1))
    if ctm == "asymmetric":
        return y / scale
    if ctm == "pytorch_half_pixel":
        return np.full(out, -0.5, f) if width == 1 else (y + f(0.5)) / scale - f(0.5)
    if ctm == "half_pixel_symmetric":
        return f(n) / f(2) * (f(1) - f(out) / width) + (y + f(0.5)) / scale - f(0.5)
    if ctm == "tf_half_pixel_for_nn":
        return (y + f(0.5)) / scale
    return (y + f(0.5)) / scale - f(0.5)     # half_pixel


def _round(xo: np.ndarray, rule: str) -> np.ndarray:
    """The nearest input index; an exact integer is itself in every rule (onnx's ``_nearest_coeffs``)."""
    lo = np.floor(xo)
    frac = xo - lo
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5, "floor": np.zeros_like(frac, bool),
          "ceil": frac > 0}[rule]
    return (lo + up).astype(np.int64)


def _linear(imp: Importer, x: str, axis: int, xo: np.ndarray, n: int, dt: dtypes.DType) -> str:
    """``(1 - w) * x[i0] + w * x[i0 + 1]`` along ``axis`` (indices clamped, as onnx's edge padding
    does), in fp32 with constant weights laid along the axis."""
    lo = np.floor(xo)
    w = xo - lo
    i0 = np.clip(lo.astype(np.int64), 0, n - 1)
    i1 = np.clip(lo.astype(np.int64) + 1, 0, n - 1)
    r = len(imp.shape(x))
    wshape = [1] * r
    wshape[axis] = len(xo)

    def weighted(idx: np.ndarray, wt: np.ndarray) -> str:
        v = imp.cast(take_axis(imp, x, axis, idx), dtypes.fp32)
        if (wt == 1).all():
            return v
        return imp.ew("mul", v, imp._param(f"{imp.cur.name}::weight", wt.astype(np.float32).reshape(wshape)))

    w1 = np.where(i0 == i1, 0.0, w)      # both neighbours clamped to one element: all weight on it
    y = weighted(i0, 1 - w1)
    if (w1 != 0).any():
        y = imp.ew("add", y, weighted(i1, w1))
    return imp.cast(y, dt)


@converter("Upsample", attrs="mode scales")
def conv_upsample(imp: Importer, node: OnnxNode) -> str:
    """Upsample (opsets 7 and 9) reaches the converters as Resize: load_model converts such models to
    opset 13 first. One left in a newer model is an op onnx deprecated at opset 10."""
    raise node.err("E1010", f"Upsample is deprecated from opset 10 (this model is opset {imp.source_opset})",
                   suggestion="use Resize (mode and scales carry over; Upsample meant coordinate mode asymmetric)")
