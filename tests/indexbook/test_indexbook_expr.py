"""Index expressions: Range normalisation, div guards, parameters for non-affine sizes, exact ISL conversion."""
from __future__ import annotations

import islpy as isl
import pytest

from kumiko.indexbook import ParamTable, Range, aff_to_expr, div_guard, to_aff, to_multi_aff, to_pw_aff
from kumiko.indexbook.expr import NonAffine, floor_atoms, guards_for, index_names, param_names
from kumiko.symbolic import Expr, parse_expr


def E(s: str) -> Expr:
    return parse_expr(s)


def test_range_normalises_lower_bound_to_zero():
    r = Range.make(E("S + i0 - i1 - 1"), E("S - 1"), E("2*S - 1"))
    assert r.expr == E("i0 - i1") and r.lo == 0 and r.hi == E("S")
    assert r.parts() == ["0 <= i0 - i1", "i0 - i1 < S"]
    assert Range.from_parts(r.parts()) == r


def test_range_decides_constant_facts():
    assert Range.make(E("3"), 0, 4).decided() is True
    assert Range.make(E("4"), 0, 4).decided() is False
    assert Range.make(E("i0"), 0, 4).decided() is None
    assert Range.make(E("2"), 0, E("M")).decided() is None


def test_mod_is_expanded_and_guarded():
    e = E("i0 % 4")
    assert "%" not in str(e) and len(floor_atoms(e)) == 1
    (g,) = guards_for([e])
    assert g == div_guard(next(iter(floor_atoms(e))))
    assert g.parts() == ["0 <= i0 - 4*floor(i0/4)", "i0 - 4*floor(i0/4) < 4"]


def test_names_split_into_index_variables_and_sizes():
    e = E("2*i3 + r1 - 1 + H")
    assert index_names(e) == {"i3", "r1"} and param_names(e) == {"H"}


def test_param_table_gives_products_a_fresh_parameter():
    t = ParamTable(["M", "K"])
    a = t.affine(E("M*K + 2*i0"))
    assert a == E("K_M + 2*i0") and t.derived == {"K_M": E("M*K")}
    assert t.affine(E("floor((M*K)/2)")) == E("floor(K_M/2)")
    assert t.names == ["M", "K", "K_M"]
    with pytest.raises(NonAffine):
        t.affine(E("i0*K"))


@pytest.mark.parametrize("text", ["2*i0 + floor((i1 + M)/3) - 1", "i1 - 4*floor(i1/4)", "M - 1 - i0", "7"])
def test_isl_conversion_is_exact(text):
    t = ParamTable(["M"])
    e = E(text)
    assert aff_to_expr(to_aff(t, ["i0", "i1"], e)) == e
    assert isinstance(to_pw_aff(t, ["i0", "i1"], e), isl.PwAff)
    ma = to_multi_aff(t, ["i0", "i1"], [e, E("i0")], "X")
    assert ma.get_tuple_name(isl.dim_type.out) == "X"
    assert aff_to_expr(ma.get_at(0)) == e
