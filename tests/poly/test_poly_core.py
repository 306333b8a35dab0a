"""Poly Core: ISL dependences, parallel/reduction axes, tail axes (seed 001 §7)."""
from __future__ import annotations

from pathlib import Path

import islpy as isl

import kumiko
from kumiko.indexbook import build_indexbook
from kumiko.pipeline import stage_indexbook
from kumiko.poly import axis_roles, dependences, poly_view, tail_axes
from kumiko.poly.core import umaps
from kumiko.symbolic import dim
from kumiko.tiny.build import TinyBuilder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def view_of(name: str):
    return poly_view(stage_indexbook(kumiko.load(EXAMPLES / f"{name}.json")))


def gemm_view(m, n, k):
    b = TinyBuilder("mm")
    a = b.add("INPUT", tensor_id="A", dtype="fp32", shape=(m, k))
    w = b.add("INPUT", tensor_id="B", dtype="fp32", shape=(k, n))
    x = b.expand(b.reshape(a, (dim(m), 1, dim(k))), (m, n, k))
    y = b.expand(b.permute(b.reshape(w, (1, dim(k), dim(n))), (0, 2, 1)), (m, n, k))
    c = b.reduce(b.add("MUL", [x, y]), "SUM", [2], "fp32")
    return poly_view(build_indexbook(b.finish([("A", a), ("B", w)], [("C", c)]))), c


def test_gemm_axes_match_the_seed_report():
    v = view_of("gemm_bias_relu")
    deps = dependences(v)
    mm = next(b for b in v.blocks.values() if b.contraction)
    assert axis_roles(v, mm, deps) == {"parallel_axes": ["i0", "i1"], "reduce_axes": ["r0"], "carried_axes": ["r0"]}
    assert tail_axes(v, mm) == ["i0", "i1", "r0"]                     # m, n, k
    for b in v.blocks.values():
        if not b.contraction:
            assert axis_roles(v, b, deps)["carried_axes"] == []


def test_flow_dependence_leaves_the_reduction_at_its_last_step():
    v = view_of("gemm_bias_relu")
    deps = dependences(v)
    mm = next(b for b in v.blocks.values() if b.contraction)
    out = [m for m in umaps(deps.flow) if m.get_tuple_name(isl.dim_type.in_) == mm.stmt
           and m.get_tuple_name(isl.dim_type.out) != mm.stmt]
    (m,) = out
    last = isl.Set(f"[M, K, N] -> {{ {mm.stmt}[i0, i1, r0] : r0 = K - 1 }}")
    assert m.domain().is_subset(last) and not m.is_empty()
    (acc,) = [m for m in umaps(deps.flow) if m.get_tuple_name(isl.dim_type.out) == mm.stmt]
    assert acc.deltas().reset_tuple_id().is_equal(isl.Set("[M, K, N] -> { [0, 0, 1] : M > 0 and N > 0 and K >= 2 }"))
    assert not deps.anti.is_empty() and not deps.output.is_empty()


def test_pool_window_and_conv_reductions_are_carried():
    v = view_of("conv_relu_maxpool")
    deps = dependences(v)
    conv, relu, pool = v.blocks.values()
    assert axis_roles(v, conv, deps)["carried_axes"] == ["r0", "r1", "r2"]
    assert axis_roles(v, pool, deps) == {"parallel_axes": ["i0", "i1", "i2", "i3"], "reduce_axes": ["r0", "r1"],
                                         "carried_axes": ["r0", "r1"]}
    assert axis_roles(v, relu, deps)["parallel_axes"] == ["i0", "i1", "i2", "i3"]


def test_tail_axes_follow_divisibility():
    v, c = gemm_view(128, 96, 64)
    mm = v.blocks[c]
    assert tail_axes(v, mm) == []
    assert tail_axes(v, mm, {"i0": 64, "i1": 64, "r0": 32}) == ["i1"]
    assert tail_axes(v, mm, {"i0": "BM"}) == ["i0"]                      # a symbolic tile never divides provably
    v, c = gemm_view(dim("4*M"), dim("N"), 8)
    mm = v.blocks[c]
    assert tail_axes(v, mm, {"i0": 4, "i1": 4, "r0": 8}) == ["i1"]     # ISL proves 4 | 4*M
    assert tail_axes(v, mm, {"i0": 8}) == ["i0"]


def test_fusion_report_has_the_seed_shape():
    from kumiko.poly import fusion_report
    v = view_of("gemm_bias_relu")
    mm, _, relu = v.blocks.values()
    assert fusion_report(v, mm.name, relu.name) == {"analysis": {
        "parallel_axes": ["i0", "i1"], "reduce_axes": ["r0"], "tail_axes": ["i0", "i1", "r0"],
        "compute_at": {"ok": True, "halo": {"bytes": 0, "per_axis": {"i0": 0, "i1": 0}}},
        "min_buffer": {"buffer": "reg", "depth": 1}}}
