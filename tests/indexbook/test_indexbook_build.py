"""The IndexBook of the seed examples carries the seed's facts; per-op rules; diagnostics; JSON."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.indexbook import IndexBook, build_indexbook, play, reshape_map
from kumiko.indexbook.build import NonAffineStep
from kumiko.pipeline import stage_indexbook
from kumiko.symbolic import Expr, dim, parse_expr
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.evaluate import evaluate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALL = ["gemm_bias_relu", "conv3x3_s2_p1", "conv3x3_s2_p1_silu", "attention_row_softmax", "attention_causal",
       "conv_relu_maxpool"]


def load(name: str):
    return kumiko.load(EXAMPLES / f"{name}.json")


def book_of(name: str) -> IndexBook:
    return stage_indexbook(load(name))


def first(book: IndexBook, uop: str, pred=lambda i: True):
    return next(i for i in book.values.values() if i.uop == uop and pred(i))


def maps(acc) -> list[str]:
    return [str(e) for e in acc.map]


def test_gemm_contraction_reads_straight_from_inputs():
    book = book_of("gemm_bias_relu")
    red = first(book, "REDUCE")
    mul = book[red.inputs[0].value_id]
    assert mul.uop == "MUL"
    (a, b) = mul.inputs
    assert (a.tensor, maps(a)) == ("A", ["i0", "i2"]) and (b.tensor, maps(b)) == ("B", ["i2", "i1"])
    assert maps(red.inputs[0]) == ["i0", "i1", "r0"]
    assert [x.name for x in red.reduce] == ["r0"] and red.reduce[0].kind == "reduce"
    assert red.reduce_axes == (mul.axes[2].id,) and red.reduce[0].size == Expr.sym("K")
    assert [a.kind for a in mul.axes] == ["iter", "iter", "iter"]


def test_gemm_bias_broadcast_is_a_constant_zero_map():
    book = book_of("gemm_bias_relu")
    exp = first(book, "EXPAND", lambda i: i.inputs[0].tensor == "bias")
    assert [str(e) for e in exp.src_maps[0].map] == ["0", "i1"]
    assert maps(exp.inputs[0]) == ["i1"]
    assert [a.kind for a in exp.axes] == ["broadcast", "iter"]
    add = first(book, "ADD")
    assert [(x.tensor, maps(x)) for x in add.inputs][1] == ("bias", ["i1"])


def test_conv_input_map_and_pad_pieces():
    book = book_of("conv3x3_s2_p1")
    view = first(book, "VIEW")
    (acc,) = view.inputs
    assert acc.tensor == "X" and maps(acc) == ["i0", "i1", "2*i2 + i4 - 1", "2*i3 + i5 - 1"]
    read, pad = view.pieces
    assert read.reads and [r.parts() for r in read.constraints] == [
        ["0 <= 2*i2 + i4 - 1", "2*i2 + i4 - 1 < H"], ["0 <= 2*i3 + i5 - 1", "2*i3 + i5 - 1 < W"]]
    assert pad.fill == 0 and pad.constraints == ()
    d = book.to_json()["index_book"][view.value_id]["domain"]
    assert d["pieces"][1] == {"constraints": [["else_pad_piece"]], "value": 0}
    mul = first(book, "MUL")      # after RESHAPE/EXPAND/PERMUTE the pieces moved with the axes
    x = mul.inputs[0]
    assert maps(x) == ["i0", "i5", "2*i3 + i6 - 1", "2*i4 + i7 - 1"]
    assert [r.parts() for r in x.pieces[0].constraints][0] == ["0 <= 2*i3 + i6 - 1", "2*i3 + i6 - 1 < H"]
    assert x.pieces[1].fill == 0


def test_causal_mask_is_a_triangular_piece():
    book = book_of("attention_causal")
    where = first(book, "WHERE")
    mask = next(a for a in where.inputs if book[a.value_id].uop == "CONST")
    assert mask.map == ()
    read, other = mask.pieces
    assert [r.parts() for r in read.constraints] == [["0 <= i2 - i3"]] and other.fill is False
    exp = first(book, "EXPAND", lambda i: i.dtype == "bool" and len(i.axes) == 4)
    assert [str(e) for e in exp.src_maps[0].map] == ["0", "0", "i2", "i3"]
    assert [a.kind for a in exp.axes] == ["broadcast", "broadcast", "iter", "iter"]


@pytest.mark.parametrize("name", ["conv3x3_s2_p1", "attention_causal", "conv_relu_maxpool"])
def test_symbolic_example_plays_back_like_the_evaluator(name):
    g = load(name)
    exe = kumiko.compile(g)
    inputs = exe.random_inputs(seed=1, shapes={"H": 7, "W": 6, "S": 5} if "conv" in name else {"S": 5})
    env = exe.bind(inputs)
    want = evaluate(g.tiny, inputs, env, keep=True)
    book = stage_indexbook(g)
    bases = {nid: inputs[t] for t, nid in g.tiny.inputs}
    bases.update({nid: np.asarray(n.arg["value"]) for nid, n in g.tiny.nodes.items() if n.uop == "CONST"})
    checked = 0
    for vid, info in book.values.items():
        if info.is_movement and all(a.value_id in bases for a in info.inputs):
            np.testing.assert_array_equal(play(book, vid, bases, env), want[vid], err_msg=vid)
            checked += 1
    assert checked >= 3


def test_reshape_rule_linearises_and_resplits():
    E = parse_expr
    assert reshape_map((dim("M"), 1, dim("K")), (dim("M"), dim("K"))) == (E("i0"), Expr((), 0), E("i1"))
    assert reshape_map((6,), (2, 3)) == (E("3*i0 + i1"),)
    assert reshape_map((2, 3), (6,)) == (E("floor(i0/3)"), E("i0 % 3"))
    assert reshape_map((dim("M"), 4), (dim("4*M"),)) == (E("floor(i0/4)"), E("i0 % 4"))
    assert reshape_map((dim("4*M"),), (dim("M"), 2, 2)) == (E("4*i0 + 2*i1 + i2"),)
    with pytest.raises(NonAffineStep):
        reshape_map((dim("M"), dim("K")), (dim("M*K"),))


def test_symbolic_stride_reshape_is_non_scop_and_products_become_parameters():
    b = TinyBuilder("flat")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("M", "K"))
    y = b.add("NEG", [b.reshape(x, (dim("M*K"),))])
    book = build_indexbook(b.finish([("X", x)], [("Y", y)]))
    r = first(book, "RESHAPE")
    assert r.non_scop and "symbolic stride" in r.reason and r.inputs[0].map is None
    assert [a.value_id for a in book[y].inputs] == [r.value_id]     # composition stops at the boundary
    assert dict(book.derived) == {"K_M": Expr.sym("M") * Expr.sym("K")}   # the size M*K is a fresh parameter
    assert book.to_json()["derived_params"] == {"K_M": "K*M"}
    from kumiko.poly import poly_view
    pv = poly_view(book)
    assert pv.blocks[r.value_id].kind == "non_scop" and pv.table.names == ["M", "K", "K_M"]


def test_gather_is_non_scop():
    b = TinyBuilder("g")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=(4, 5))
    i = b.add("INPUT", tensor_id="I", dtype="i32", shape=(2, 5))
    y = b.add("GATHER", [x, i], axis=0)
    book = build_indexbook(b.finish([("X", x), ("I", i)], [("Y", y)]))
    assert book[y].non_scop and book[y].inputs[0].map is None and book[y].inputs[1].map is not None


def test_align_params_rejects_a_signature_mismatch():
    g = load("gemm_bias_relu").tiny
    with pytest.raises(KumikoError) as e:
        build_indexbook(g, {"A": ("M", "K"), "B": ("K", "N"), "bias": ("M",)})
    assert e.value.code == "E1304" and "bias" in e.value.why


def test_align_params_rejects_undeclared_and_reserved_symbols():
    b = TinyBuilder("v")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("M",))
    y = b.add("VIEW", [x], result_shape=("P",), index_map=(Expr((), 0),))
    g = b.finish([("X", x)], [("Y", y)])
    with pytest.raises(KumikoError) as e:
        build_indexbook(g)
    assert e.value.code == "E1304" and "P" in e.value.why
    b = TinyBuilder("r")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("i0",))
    with pytest.raises(KumikoError) as e:
        build_indexbook(b.finish([("X", x)], [("X", x)]))
    assert e.value.code == "E1304"


def test_verify_requires_div_guards():
    b = TinyBuilder("m")
    x = b.add("INPUT", tensor_id="X", dtype="fp32", shape=("M", 4))
    y = b.add("NEG", [b.reshape(x, (dim("4*M"),))])
    book = build_indexbook(b.finish([("X", x)], [("Y", y)]))
    d = book.to_json()
    r = next(v for v in d["index_book"].values() if v["uop"] == "RESHAPE")
    assert r["domain"]["guards"] == [["0 <= i0 - 4*floor(i0/4)", "i0 - 4*floor(i0/4) < 4"]]
    IndexBook.from_json(d).verify()
    del r["domain"]["guards"]
    with pytest.raises(KumikoError) as e:
        IndexBook.from_json(d).verify()
    assert e.value.code == "E1203"


def test_verify_rejects_misnamed_axes():
    d = book_of("gemm_bias_relu").to_json()
    next(iter(d["index_book"].values()))["axes"][0]["name"] = "m"
    with pytest.raises(KumikoError) as e:
        IndexBook.from_json(d).verify()
    assert e.value.code == "E1304"


@pytest.mark.parametrize("name", ALL)
def test_json_round_trip_and_determinism(name):
    from kumiko.pipeline import dumps
    book = book_of(name)
    book.verify()
    text = dumps(book.to_json())
    again = IndexBook.from_json(json.loads(text))
    again.verify()
    assert dumps(again.to_json()) == text
    assert dumps(book_of(name).to_json()) == text
