"""Compute-at (seed 003): backward slice, footprints as affine expressions of a symbolic tile, halo,
schedule check (legal and deliberately illegal nests), minimum buffer."""
from __future__ import annotations

from pathlib import Path

import pytest

import kumiko
from kumiko.compiler import load_json
from kumiko.pipeline import stage_indexbook
from kumiko.poly import compute_at, poly_view
from kumiko.symbolic import parse_expr

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
E = parse_expr


@pytest.fixture(scope="module")
def crp():
    v = poly_view(stage_indexbook(kumiko.load(EXAMPLES / "conv_relu_maxpool.json")))
    conv, relu, pool = v.blocks.values()
    return v, conv, relu, pool


def test_conv_inside_pool_is_legal_with_an_affine_footprint(crp):
    v, conv, relu, pool = crp
    r = compute_at(v, conv.name, pool.name, tile={"i2": "TH", "i3": "TW"})
    assert r.ok and r.diagnostic is None and r.group == (conv.name, relu.name)
    x = {a.axis: a for a in r.footprints["X"].axes}
    # pool stride 2, pool window 2, conv window 3, pad 1: rows 2*oh - 1 .. 2*oh + 2*TH
    assert x["i2"].lo == E("2*o_i2 - 1") and x["i2"].hi == E("2*o_i2 + 2*TH")
    assert x["i2"].extent == E("2*TH + 2") and x["i3"].extent == E("2*TW + 2")
    assert x["i2"].halo == 2 and x["i1"].extent == E("C") and x["i0"].extent == 1
    assert r.footprints["X"].elements == E("C*(2*TH + 2)*(2*TW + 2)")
    w = {a.axis: a.extent for a in r.footprints["Wt"].axes}
    assert w == {"i0": 1, "i1": E("C"), "i2": 3, "i3": 3}
    conv_val = {a.axis: a for a in r.value_footprint.axes}
    assert conv_val["i3"].extent == E("2*TH") and conv_val["i3"].halo == 0   # pool windows do not overlap
    assert r.halo() == {"bytes": 0, "per_axis": {"i0": 0, "i1": 0, "i2": 0, "i3": 0, "i4": 0}}
    assert r.min_buffer["buffer"] == "reg"
    assert set(r.slices) == {conv.name, relu.name}


def test_aligned_fusion_of_conv_and_pool_is_illegal(crp):
    v, conv, relu, pool = crp
    r = compute_at(v, conv.name, pool.name, tile={"i2": "TH", "i3": "TW"}, placement="aligned")
    assert not r.ok and r.diagnostic.code == "E1305"
    assert "runs backwards" in r.diagnostic.why and r.violation
    d = r.to_json()
    assert d["ok"] is False and d["diagnostic"]["code"] == "E1305" and "example" in d["diagnostic"]


def test_a_placement_that_reads_values_written_later_is_illegal(crp):
    v, conv, relu, pool = crp
    late = {relu.name: f"[N, C, H, W, Co] -> {{ S_{relu.name}[i0, i1, i2, i3] -> [i0, i1, i2, i3] }}"}
    r = compute_at(v, relu.name, pool.name, placement=late)
    assert not r.ok and r.diagnostic.code == "E1305"
    ok = compute_at(v, relu.name, pool.name)                      # the derived placement (lexmin) is legal
    assert ok.ok


def test_reversed_or_unrelated_nests_are_rejected(crp):
    v, conv, relu, pool = crp
    r = compute_at(v, pool.name, conv.name)
    assert not r.ok and r.diagnostic.code == "E1305" and "reads what" in r.diagnostic.why


def test_gemm_epilogue_is_register_resident():
    v = poly_view(stage_indexbook(kumiko.load(EXAMPLES / "gemm_bias_relu.json")))
    mm, add, relu = v.blocks.values()
    r = compute_at(v, mm.name, relu.name)
    assert r.ok and r.halo() == {"bytes": 0, "per_axis": {"i0": 0, "i1": 0}}
    assert r.min_buffer == {"buffer": "reg", "depth": 1, "why": "each element is used by one consumer point"}
    a = {x.axis: x.extent for x in r.footprints["A"].axes}
    assert a == {"i0": E("T_i0"), "i1": E("K")}                  # the whole reduction per epilogue tile


TWO_CONVS = {
    "name": "conv_relu_conv", "symbols": {"N": 1, "C": 4, "H": 8, "W": 8},
    "signature": {"inputs": [{"tensor": "X"}, {"tensor": "W1", "role": "param"}, {"tensor": "W2", "role": "param"}],
                  "outputs": [{"tensor": "Y"}]},
    "tensors": {"X": {"dtype": "fp32", "shape": ["N", "C", "H", "W"]},
                "W1": {"dtype": "fp32", "shape": ["C", "C", 3, 3]}, "W2": {"dtype": "fp32", "shape": ["C", "C", 3, 3]}},
    "graph": [
        {"op": "Conv2D", "name": "c1", "inputs": ["X", "W1"], "outputs": ["A"], "attrs": {"stride": 1, "padding": 1}},
        {"op": "Elementwise", "name": "r", "fn": "relu", "inputs": ["A"], "outputs": ["B"]},
        {"op": "Conv2D", "name": "c2", "inputs": ["B", "W2"], "outputs": ["Y"], "attrs": {"stride": 1, "padding": 1}},
    ],
}


def test_conv_over_conv_has_a_halo_and_needs_a_ring():
    v = poly_view(stage_indexbook(load_json(TWO_CONVS)))
    c1, relu, c2 = v.blocks.values()
    r = compute_at(v, relu.name, c2.name, tile={"i3": "TH", "i4": "TW", "r0": "TC"})
    assert r.ok
    fp = {a.axis: a for a in r.value_footprint.axes}
    assert fp["i2"].extent == E("TH + 2") and fp["i2"].halo == 2 and fp["i1"].extent == E("TC")
    assert r.halo()["per_axis"] == {"i0": 0, "i1": 0, "i2": 2, "i3": 2}
    assert r.halo()["bytes"] == str(4 * (E("TC*(TH + 2)*(TW + 2)") - E("TC*TH*TW")))
    assert r.min_buffer["buffer"] == "smem_ring" and r.min_buffer["depth"] == 3
    whole = compute_at(v, relu.name, c2.name, tile={"i3": "TH", "i4": "TW"})   # all input channels per tile
    assert whole.min_buffer["buffer"] == "gmem"
