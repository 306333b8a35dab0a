"""ONNX Pad in edge/reflect/wrap modes and Resize/Upsample (nearest, linear) against onnxruntime, on the
evaluator and the CPU target: copies (padding, nearest) must match exactly, linear blends to a relative
L2 of 1e-4. Sizes are odd and even, up and down, 3-D and 4-D; what the importer refuses names the
attribute. How the index maps become ops (views where they can, a Gather otherwise) is checked on the
graphs too, since that decides whether the kernels fuse (kumiko/frontend/onnx_resize.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tests.frontend.test_onnx_import import model, onnxruntime_run  # noqa: E402

RNG = np.random.default_rng(23)
TARGETS = ("eval", "cpu")


def check(m, feeds: dict, exact: bool, reference: bool = False) -> kumiko.Graph:
    """Import ``m`` and compare it with onnxruntime (or onnx's reference evaluator) on each target:
    exactly, or to relative L2 1e-4."""
    g = kumiko.from_onnx(m)
    want = ReferenceEvaluator(m).run(None, feeds) if reference else onnxruntime_run(m, feeds)
    for target in TARGETS:
        got = kumiko.compile(g, target)(**feeds)
        for o, w in zip(m.graph.output, want):
            assert got[o.name].shape == w.shape, f"{target} {o.name}: shape {got[o.name].shape} != {w.shape}"
            if exact:
                np.testing.assert_array_equal(got[o.name], w, err_msg=f"{target} {o.name}")
            else:
                assert rel_l2(got[o.name], w) <= 1e-4, f"{target} {o.name}: relative L2 {rel_l2(got[o.name], w):.3g}"
    return g


def out(dtype, rank: int):
    """An output of a known rank and unnamed sizes (the checker wants a shape; the sizes are the op's)."""
    return ("y", dtype, [f"d{k}" for k in range(rank)])


def ops(g: kumiko.Graph) -> set[str]:
    return {n.op for n in g.nodes}


def rand(shape, dtype=np.float32) -> np.ndarray:
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-50, 50, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def refused(m, code: str = "E1010") -> kumiko.KumikoError:
    with pytest.raises(kumiko.KumikoError) as e:
        kumiko.from_onnx(m)
    assert e.value.code == code, e.value.render()
    return e.value


# ------------------------------------------------------------------------------------------------
# Pad


def pad_model(shape, pads, mode, axes=None, opset=19, dtype=TP.FLOAT):
    inits = [nh.from_array(np.array(pads, np.int64), "pads")]
    ins = ["x", "pads"]
    if axes is not None:
        inits.append(nh.from_array(np.array(axes, np.int64), "axes"))
        ins += ["", "axes"]
    node = h.make_node("Pad", ins, ["y"], mode=mode, name="pad")
    return model([node], [("x", dtype, list(shape))], [out(dtype, len(shape))], inits, opset=opset)


PAD_CASES = [
    ((2, 3, 5), [0, 1, 2, 0, 2, 1]),               # 3-D, odd last axis, asymmetric
    ((1, 2, 4, 6), [0, 0, 1, 3, 0, 0, 3, 2]),      # 4-D, even sizes (reflect's largest pads)
    ((1, 2, 5, 4), [0, 0, -1, 2, 0, 0, 2, -1]),    # a side cropped, the other padded from what is left
    ((2, 7), [0, 1, 0, 1]),                        # 2-D: only the last axis
]


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("shape,pads", PAD_CASES, ids=["3d", "4d", "crop", "2d"])
def test_pad_modes(mode, shape, pads):
    g = check(pad_model(shape, pads, mode), {"x": rand(shape)}, exact=True)
    assert "Gather" not in ops(g) and "Pad" not in ops(g)     # slices, flips, expands and a concat: views


@pytest.mark.parametrize("mode", ["edge", "wrap"])
def test_pad_larger_than_the_axis(mode):
    """Edge repeats the border and wrap cycles as often as needed (onnx's np.pad, onnxruntime alike)."""
    check(pad_model((2, 3), [0, 7, 0, 5], mode), {"x": rand((2, 3))}, exact=True)


def test_pad_wrap_of_many_periods_falls_back_to_a_gather():
    g = check(pad_model((2, 2), [0, 11, 0, 12], "wrap"), {"x": rand((2, 2))}, exact=True)
    assert "Gather" in ops(g)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_axes_input_and_int32(mode):
    """opset 18's axes input (negative axes count from the end); copies work for any dtype."""
    m = pad_model((2, 3, 4), [1, 2, 3, 1], mode, axes=[-1, 1], dtype=TP.INT32)
    check(m, {"x": rand((2, 3, 4), np.int32)}, exact=True)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_attribute_form_of_opset_2(mode):
    m = model([h.make_node("Pad", ["x"], ["y"], mode=mode, pads=[0, 2, 1, 0, 1, 2])],
              [("x", TP.FLOAT, [2, 3, 4])], [out(TP.FLOAT, 3)], opset=10)
    check(m, {"x": rand((2, 3, 4))}, exact=True)


def test_pad_symbolic_batch():
    """Only the padded axes need static sizes."""
    m = model([h.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")], [("x", TP.FLOAT, ["N", 3, 5])],
              [out(TP.FLOAT, 3)], [nh.from_array(np.array([0, 0, 2, 0, 0, 2], np.int64), "pads")])
    check(m, {"x": rand((2, 3, 5))}, exact=True)


@pytest.mark.parametrize("shape,pads,why", [
    ((2, 4), [0, 4, 0, 0], "axis 1 has 4 elements"),
    ((2, 5), [0, -3, 0, 2], "axis 1 has 2 elements"),     # cropped first, then too small to reflect 2
])
def test_pad_reflect_beyond_the_axis_is_refused(shape, pads, why):
    e = refused(pad_model(shape, pads, "reflect"))
    assert e.at == "onnx node 'pad' (Pad)" and "reflect" in e.why and why in e.why


def test_pad_runtime_pads_are_refused():
    m = model([h.make_node("Pad", ["x", "p"], ["y"], mode="edge", name="pad")],
              [("x", TP.FLOAT, [2, 3]), ("p", TP.INT64, [4])], [out(TP.FLOAT, 2)])
    assert "pads" in refused(m, "E1011").why       # E1011: the output shape would depend on tensor data


# ------------------------------------------------------------------------------------------------
# Resize


def resize_model(shape, *, scales=None, sizes=None, opset=19, axes_input=False, **attrs):
    """Resize with constant scales or sizes (as initializers), an empty roi and the given attributes."""
    inits, ins = [], ["x", ""]
    if opset < 13:                                   # roi is not optional before opset 13
        inits.append(nh.from_array(np.zeros(0, np.float32), "roi"))
        ins[1] = "roi"
    if scales is not None:
        inits.append(nh.from_array(np.array(scales, np.float32), "scales"))
        ins.append("scales")
    else:
        inits.append(nh.from_array(np.array(sizes, np.int64), "sizes"))
        ins += ["", "sizes"]
    node = h.make_node("Resize", ins, ["y"], name="resize", **attrs)
    return model([node], [("x", TP.FLOAT, list(shape))], [out(TP.FLOAT, len(shape))], inits, opset=opset)


COORDS = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric"]
#: (shape, scales or None, sizes or None): odd and even sizes, up and down, 3-D and 4-D
GEOMETRY = [
    ((1, 2, 4, 6), [1, 1, 2, 2], None),              # even, integer upscale
    ((1, 2, 5, 7), [1, 1, 1.5, 0.6], None),          # odd, one axis up and one down, fractional
    ((2, 3, 9), [1, 1, 0.5], None),                  # 3-D, downscale by 2 of an odd axis
    ((1, 1, 6, 5), None, [1, 1, 4, 8]),              # sizes: down and up
    ((2, 3, 7), None, [2, 3, 10]),                   # 3-D sizes, odd to even
]
GEO_IDS = ["up2", "frac", "3d-half", "sizes", "3d-sizes"]
#: where scale * size is fractional (1.5 * 5, 0.6 * 7, 0.5 * 9), onnx's align_corners divides by that real-valued
#: size (its reference and node tests) and onnxruntime by the integer one; kumiko follows onnx, so those compare
#: with its reference
REAL_WIDTH = {"align_corners"}
#: nearest cases: half_pixel_symmetric at a fractional width puts coordinates within 2e-7 of a rounding tie,
#: which onnx's float64 reference and onnxruntime's fp32 break differently from each other (kumiko computes in
#: fp32 like onnxruntime and matches it at other ties), so it is checked at whole widths only
NEAREST = [(geo, coord) for geo in (GEOMETRY[0], GEOMETRY[1], GEOMETRY[3])
           for coord in COORDS + ["tf_half_pixel_for_nn"]
           if not (coord == "half_pixel_symmetric" and geo is GEOMETRY[1])]


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("geo,coord", NEAREST, ids=[f"{GEO_IDS[GEOMETRY.index(g)]}-{c}" for g, c in NEAREST])
def test_resize_nearest(geo, coord, nearest_mode):
    shape, scales, sizes = geo
    m = resize_model(shape, scales=scales, sizes=sizes, mode="nearest", coordinate_transformation_mode=coord,
                     nearest_mode=nearest_mode)
    check(m, {"x": rand(shape)}, exact=True, reference=coord in REAL_WIDTH and scales is not None)


@pytest.mark.parametrize("shape,scales,sizes", GEOMETRY, ids=GEO_IDS)
def test_resize_nearest_default_modes(shape, scales, sizes):
    check(resize_model(shape, scales=scales, sizes=sizes, mode="nearest"), {"x": rand(shape)}, exact=True)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("shape,scales,sizes", GEOMETRY, ids=GEO_IDS)
def test_resize_linear(shape, scales, sizes, coord):
    m = resize_model(shape, scales=scales, sizes=sizes, mode="linear", coordinate_transformation_mode=coord)
    check(m, {"x": rand(shape)}, exact=False, reference=coord in REAL_WIDTH and scales is not None)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("axes,scales", [([2, 3], [2.0, 0.5]), ([-1], [1.75])])
def test_resize_axes_attribute(mode, axes, scales):
    m = resize_model((1, 3, 4, 6), scales=scales, axes=axes, mode=mode)
    check(m, {"x": rand((1, 3, 4, 6))}, exact=mode == "nearest")


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_policy(policy):
    m = resize_model((1, 1, 4, 6), sizes=[7, 8], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy=policy)
    check(m, {"x": rand((1, 1, 4, 6))}, exact=True)


def test_resize_symbolic_batch():
    m = model([h.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], [("x", TP.FLOAT, ["N", 2, 3, 4])],
              [out(TP.FLOAT, 4)], [nh.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")])
    check(m, {"x": rand((3, 2, 3, 4))}, exact=False)


def test_resize_integer_nearest_upscale_is_a_view():
    """2x nearest (YOLO/FPN necks) repeats rows and columns: Reshape/Expand, no Gather; a fractional scale
    gathers."""
    g = check(resize_model((1, 2, 4, 5), scales=[1, 1, 2, 2], mode="nearest"), {"x": rand((1, 2, 4, 5))}, True)
    assert "Gather" not in ops(g)
    g = check(resize_model((1, 2, 40, 3), scales=[1, 1, 1.5, 1], mode="nearest"), {"x": rand((1, 2, 40, 3))}, True)
    assert "Gather" in ops(g)


def test_resize_fp16_linear_blends_in_fp32():
    x = rand((1, 2, 5, 6))
    m32 = resize_model((1, 2, 5, 6), scales=[1, 1, 1.6, 0.5], mode="linear")
    want = onnxruntime_run(m32, {"x": x})[0]
    m16 = model([h.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], [("x", TP.FLOAT16, [1, 2, 5, 6])],
                [out(TP.FLOAT16, 4)], [nh.from_array(np.array([1, 1, 1.6, 0.5], np.float32), "scales")])
    got = kumiko.compile(kumiko.from_onnx(m16), "eval")(x=x.astype(np.float16))["y"]
    assert got.dtype == np.float16 and rel_l2(got, want) <= 1e-2


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_resize_older_opsets(opset):
    m = resize_model((1, 2, 5, 4), scales=[1, 1, 1.4, 2], opset=opset, mode="linear",
                     coordinate_transformation_mode="align_corners")
    check(m, {"x": rand((1, 2, 5, 4))}, exact=False)


# ------------------------------------------------------------------------------------------------
# before opset 11: Upsample and Resize-10 mean onnxruntime's asymmetric mapping


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 1.5, 2.5]], ids=["int", "frac"])
def test_upsample_opset_7_and_9(mode, scales):
    x = rand((1, 2, 3, 4))
    m7 = model([h.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[float(s) for s in scales])],
               [("x", TP.FLOAT, [1, 2, 3, 4])], [out(TP.FLOAT, 4)], opset=7)
    check(m7, {"x": x}, exact=mode == "nearest")
    m9 = model([h.make_node("Upsample", ["x", "s"], ["y"], mode=mode)], [("x", TP.FLOAT, [1, 2, 3, 4])],
               [out(TP.FLOAT, 4)], [nh.from_array(np.array(scales, np.float32), "s")], opset=9)
    check(m9, {"x": x}, exact=mode == "nearest")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 0.6, 1.5], [1, 1, 2, 0.5]], ids=["frac", "int"])
def test_resize_opset_10(mode, scales):
    """Nearest rounds down on a growing axis and up on a shrinking one, as onnxruntime does."""
    m = model([h.make_node("Resize", ["x", "s"], ["y"], mode=mode)], [("x", TP.FLOAT, [1, 2, 10, 6])],
              [out(TP.FLOAT, 4)], [nh.from_array(np.array(scales, np.float32), "s")], opset=10)
    check(m, {"x": rand((1, 2, 10, 6))}, exact=mode == "nearest")


def test_upsample_in_a_new_opset_is_refused():
    node = h.make_node("Upsample", ["x", "s"], ["y"], mode="nearest", name="up")
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", TP.FLOAT, [1, 1, 2, 2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)],
                     [nh.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    e = refused(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))
    assert e.at == "onnx node 'up' (Upsample)" and "deprecated" in e.why


# ------------------------------------------------------------------------------------------------
# refused


@pytest.mark.parametrize("attrs,what", [
    ({"mode": "cubic"}, "cubic"),
    ({"mode": "linear", "antialias": 1}, "antialias"),
    ({"mode": "linear", "exclude_outside": 1}, "exclude_outside"),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "tf_crop_and_resize"),
])
def test_resize_refused_attributes(attrs, what):
    e = refused(resize_model((1, 1, 4, 4), scales=[1, 1, 2, 2], **attrs))
    assert e.at == "onnx node 'resize' (Resize)" and what in e.why


@pytest.mark.parametrize("what", ["scales", "sizes"])
def test_resize_runtime_scales_or_sizes_are_refused(what):
    ins = ["x", "", "q"] if what == "scales" else ["x", "", "", "q"]
    dt = TP.FLOAT if what == "scales" else TP.INT64
    m = model([h.make_node("Resize", ins, ["y"], name="resize")], [("x", TP.FLOAT, [1, 1, 4, 4]), ("q", dt, [4])],
              [out(TP.FLOAT, 4)])
    e = refused(m, "E1011")
    assert e.at == "onnx node 'resize' (Resize)" and what in e.why and "import time" in e.why


def test_resize_linear_of_integers_is_refused():
    m = model([h.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")], [("x", TP.INT32, [1, 1, 4, 4])],
              [out(TP.INT32, 4)], [nh.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    assert "linear" in refused(m, "E1012").why
