"""Poly-View of the seed examples: blocks, accesses, piecewise pads, ContractionPatterns, diagnostics."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import islpy as isl
import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.indexbook import IndexBook, build_indexbook
from kumiko.pipeline import stage_indexbook
from kumiko.poly import PolyView, poly_view, report
from kumiko.symbolic import Expr
from kumiko.tiny.build import TinyBuilder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def view_of(name: str) -> PolyView:
    return poly_view(stage_indexbook(kumiko.load(EXAMPLES / f"{name}.json")))


def contractions(v: PolyView):
    return [b for b in v.blocks.values() if b.kind == "contraction_pattern"]


def test_gemm_is_one_matmul_block_reading_a_and_b():
    v = view_of("gemm_bias_relu")
    (b,) = contractions(v)
    c = b.contraction
    assert (c.pattern, c.lhs, c.rhs) == ("matmul", "A", "B")
    assert (c.lhs_idx, c.rhs_idx, c.out_idx, c.reduce_idx) == (("i0", "r0"), ("r0", "i1"), ("i0", "i1"), ("r0",))
    assert len(b.nodes) == 2 and v.book[b.nodes[0]].uop == "MUL"       # the MUL is merged, not a block
    reads = {r.array: r for r in b.reads}
    assert reads["A"].rel.is_equal(isl.Map("[M, K, N] -> { S_%s[i0, i1, r0] -> A[i0, r0] : 0 <= i0 < M and "
                                           "0 <= i1 < N and 0 <= r0 < K }" % b.name))
    assert reads[b.write.array].accumulate
    assert [(e.producer, e.consumer) for e in v.edges][0][0] == b.name


def test_conv_pattern_strides_offsets_and_pad_pieces():
    v = view_of("conv3x3_s2_p1")
    (b,) = contractions(v)
    c = b.contraction
    assert c.pattern == "conv" and c.lhs == "X" and c.rhs == "Wt" and c.image == "lhs"
    assert c.strides == (2, 2) and c.dilations == (1, 1) and c.offsets == (-1, -1)
    assert dict(c.affine_offsets) == {"i3": "2*i3 + r1 - 1", "i4": "2*i4 + r2 - 1"}
    assert c.reduce_idx == ("r0", "r1", "r2")
    x = next(r for r in b.reads if r.array == "X")
    (pad, fill), = x.pads
    assert fill == 0
    origin = isl.Set("[N, C, H, W, Co] -> { %s[0, 0, 0, 0, 0, 0, 0, 0] }" % b.stmt)   # reads X[.., -1, -1]
    inside = isl.Set("[N, C, H, W, Co] -> { %s[0, 0, 0, 1, 1, 0, 0, 0] : H >= 4 and W >= 4 }" % b.stmt)
    origin, inside = origin.intersect_params(v.context), inside.intersect_params(v.context)
    assert origin.is_subset(pad) and x.rel.intersect_domain(origin).is_empty()
    assert not x.rel.intersect_domain(inside).is_empty() and inside.intersect(pad).is_empty()
    assert not x.virtual.intersect_domain(origin).is_empty()          # the footprint counts the pad


def test_attention_has_two_batched_matmuls():
    v = view_of("attention_causal")
    qk, pv = contractions(v)
    assert qk.contraction.pattern == pv.contraction.pattern == "batched_matmul"
    assert (qk.contraction.lhs, qk.contraction.rhs) == ("Q", "K")
    assert qk.contraction.batch_idx == ("i0", "i1") and qk.contraction.reduce_idx == ("r0",)
    assert pv.contraction.rhs == "V" and v.arrays[pv.contraction.lhs].value_id in v.blocks
    mask = next(b for b in v.blocks.values() if b.uop == "WHERE")
    const = next(r for r in mask.reads if r.map == ())
    (pad, fill), = const.pads
    assert fill is False
    assert str(pad.gist(mask.domain).remove_redundancies()).endswith("i3 > i2 }")


def test_maxpool_is_a_reduce_not_a_contraction():
    v = view_of("conv_relu_maxpool")
    kinds = [(b.kind, b.uop) for b in v.blocks.values()]
    assert kinds == [("contraction_pattern", "REDUCE"), ("elementwise", "RELU"), ("reduce", "REDUCE")]
    assert contractions(v)[0].contraction.strides == (1, 1)


def test_out_of_bounds_view_is_unguarded_access():
    b = TinyBuilder("oob")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("M",))
    y = b.add("NEG", [b.add("VIEW", [x], result_shape=("M",), index_map=(Expr.sym("i0") + 1,))])
    v = poly_view(build_indexbook(b.finish([("X", x)], [("Y", y)])))
    assert [d.code for d in v.diagnostics] == ["E1401"]
    with pytest.raises(KumikoError) as e:
        v.verify()
    assert e.value.code == "E1401"


def test_excessive_piecewise_warns():
    b = TinyBuilder("pads")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("A", "B", "C", "D", "E"))
    y = b.add("NEG", [b.pad(b.pad(x, [(1, 1)] * 5, 0.0), [(1, 1)] * 5, 1.0)])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        v = poly_view(build_indexbook(b.finish([("X", x)], [("Y", y)])))
    assert [d.code for d in v.diagnostics] == ["W2101"] and any("W2101" in str(m.message) for m in w)
    v.verify()     # a warning, not an error
    assert [f for _, f in v.blocks[y].reads[0].pads] == [0.0, 1.0]


def test_poly_view_from_a_dumped_indexbook_gives_the_same_report():
    book = stage_indexbook(kumiko.load(EXAMPLES / "gemm_bias_relu.json"))
    loaded = IndexBook.from_json(json.loads(json.dumps(book.to_json())))
    assert report(poly_view(loaded)) == report(poly_view(book))


def _product(b: TinyBuilder):
    from kumiko.symbolic import dim
    a = b.add("INPUT", tensor_id="A", dtype="fp32", shape=("M", "K"))
    w = b.add("INPUT", tensor_id="B", dtype="fp32", shape=("K", "N"))
    x = b.expand(b.reshape(a, (dim("M"), 1, dim("K"))), ("M", "N", "K"))
    y = b.expand(b.permute(b.reshape(w, (1, dim("K"), dim("N"))), (0, 2, 1)), ("M", "N", "K"))
    return a, w, b.add("MUL", [x, y])


def test_contraction_through_a_permute_and_an_unmerged_product():
    b = TinyBuilder("perm")
    a, w, m = _product(b)
    red = b.reduce(b.permute(m, (2, 0, 1)), "SUM", [0], "fp32")         # sum over K, laid out first
    v = poly_view(build_indexbook(b.finish([("A", a), ("B", w)], [("C", red)])))
    (blk,) = v.blocks.values()
    assert blk.contraction.pattern == "matmul" and blk.contraction.lhs_idx == ("i0", "r0")
    b = TinyBuilder("shared")
    a, w, m = _product(b)
    red = b.reduce(m, "SUM", [2], "fp32")
    both = b.add("ADD", [b.reduce(m, "MAX", [2], "fp32"), red])      # the product is read twice
    v = poly_view(build_indexbook(b.finish([("A", a), ("B", w)], [("C", both)])))
    assert [x.kind for x in v.blocks.values()] == ["elementwise", "reduce", "reduce", "elementwise"]
