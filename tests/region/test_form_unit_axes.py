"""Region formation with size-1 axes: a coordinate on an axis of extent 1 is the same point whatever
expression it holds (``0`` from an EXPAND/RESHAPE of a unit dim, or the size-1 iterator), so unit batch
axes form the same regions as larger ones. Each graph is also compiled for the CPU, and both the
compiled kernels and the region playback are checked against the evaluator."""
import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.region import form_regions, play_program
from kumiko.region.form import _unit_free
from kumiko.region.serial import program_json
from kumiko.region.verify import verify
from kumiko.symbolic import Expr
from kumiko.tiny.evaluate import bind_symbols


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _check(g, seed=0, shapes=None):
    """Regions of ``g``; the CPU executable and the region playback both match the evaluator."""
    ev = kumiko.compile(g, "eval")
    ins = ev.random_inputs(seed, shapes)
    ref = ev(**ins)
    p = form_regions(g.tiny)
    for r in p.regions:
        verify(r)
    played = play_program(p, ins, bind_symbols(g.tiny, ins))
    cpu = kumiko.compile(g, "cpu")(**ins)
    for k in ref:
        for got in (played[k], cpu[k]):
            assert got.dtype == ref[k].dtype and got.shape == ref[k].shape
            assert _rel(got, ref[k]) < 1e-5, k
    assert program_json(form_regions(g.tiny)) == program_json(p)     # deterministic
    return p


def _attention(b, h):
    q, k, v = (Tensor.input(n, (b, h, "S", 16)) for n in ("Q", "K", "V"))
    return q.scaled_dot_product_attention(k, v, is_causal=True).graph("y", name="a", symbols={"S": 21})


@pytest.mark.parametrize("bh", [(1, 1), (1, 3), (2, 1)])
def test_attention_with_unit_batch_axes_forms_like_larger_ones(bh):
    big = _check(_attention(2, 3))
    p = _check(_attention(*bh), seed=1, shapes={"S": 13})
    assert len(big.regions) == 2
    assert len(p.regions) == len(big.regions)
    first, second = p.regions
    assert first.outputs[0].materialize == "deferred" and second.outputs[0].materialize == "gmem"
    assert len(p.buffers) == 1     # only P between the two kernels (scores and softmax are fused)
    assert [n.split(":")[1] for n in first.notes[:1]] == [n.split(":")[1] for n in big.regions[0].notes[:1]]


@pytest.mark.parametrize("shape", [(1, "S", "D"), ("S", 1, "D"), (1, 1, "S", "D"), (1, "S", 1, "D"), (1, "S", 16),
                                   ("S", 1, 16), (2, "S", "D"), ("S", 16)])
@pytest.mark.parametrize("op", ["softmax", "layernorm", "log_softmax"])
def test_row_normalisation_with_unit_axes_is_one_region(shape, op):
    x = Tensor.input("X", shape)
    g = getattr(x, op)(-1).graph("y", name=op, symbols={"S": 7, "D": 5})
    p = _check(g)
    assert len(p.regions) == 1 and p.buffers == ()
    _check(g, seed=3, shapes={"S": 9, "D": 33})


def test_layernorm_with_weight_and_bias_over_unit_batch_is_one_region():
    x, w, b = Tensor.input("X", (1, "S", "D")), Tensor.input("W", ("D",)), Tensor.input("B", ("D",))
    p = _check(x.layernorm(-1, weight=w, bias=b).graph("y", symbols={"S": 6, "D": 40}))
    assert len(p.regions) == 1


@pytest.mark.parametrize("lead", [(), (1,), (2,), (1, 1)])
@pytest.mark.parametrize("op", ["softmax", "layernorm"])
def test_gemm_then_row_op_with_leading_unit_axes_is_one_region(lead, op):
    a, w = Tensor.input("A", lead + ("S", 8)), Tensor.input("W", (8, 16))
    p = _check(getattr(a.matmul(w), op)(-1).graph("y", symbols={"S": 11}))
    assert len(p.regions) == 1


def test_unit_axis_in_the_middle_of_a_reduction_chain():
    x = Tensor.input("X", ("S", 1, "D"))
    y = x - x.mean(-1, keepdim=True)
    p = _check((y / (y * y).mean(-1, keepdim=True).sqrt()).graph("y", symbols={"S": 5, "D": 7}))
    assert len(p.regions) == 1


def test_unit_free_index_names_the_point():
    i0, i1, i2 = Expr.sym("i0"), Expr.sym("i1"), Expr.sym("i2")
    sizes = {"i0": 1, "i1": Expr.sym("S"), "i2": 4, "r0": 1}
    a = _unit_free((i0, i1, i2), (1, "S", 4), sizes)
    b = _unit_free((Expr.lift(0), i1, i2 + Expr.sym("r0")), (1, "S", 4), sizes)
    assert a == b == (Expr.lift(0), i1, i2)
    # a size-1 iterator inside a non-unit coordinate is 0 too; other coordinates are kept
    assert _unit_free((i1 + i0,), ("S",), sizes) == (i1,)
    assert _unit_free((i1, i2), ("S", 4), sizes) == (i1, i2)
