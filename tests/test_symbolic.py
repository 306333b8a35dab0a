"""Symbolic sizes and index expressions: canonical forms, floordiv normalisation, parsing, evaluation."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiko.symbolic import Expr, dim, parse_expr, prod

M, N, K = Expr.sym("M"), Expr.sym("N"), Expr.sym("K")


def test_canonical_equality_and_hash():
    a = M * 2 + N - 1
    b = parse_expr("N + 2*M - 1")
    assert a == b and hash(a) == hash(b)
    assert M * N == N * M
    assert (M + 1) * (M - 1) == M * M - 1
    assert dim(M - M + 3) == 3 and isinstance(dim(M - M + 3), int)


def test_floordiv_normalisation():
    assert (2 * M + 4).floordiv(2) == M + 2            # gcd pulled out exactly
    assert (4 * M + 3).floordiv(2) == 2 * M + 1         # whole multiple pulled out, floor(3/2) = 1
    assert (M + 1).floordiv(1) == M + 1
    e = (M + 1).floordiv(2)
    assert not e.is_const and e.is_affine() and "floor" in str(e)
    assert Expr.lift(7).floordiv(2) == 3 and Expr.lift(-7).floordiv(2) == -4


def test_mod_expands_to_floordiv():
    e = parse_expr("i0 % 4")
    assert "floor" in str(e) and "%" not in str(e)
    for v in range(-9, 10):
        assert e.evaluate({"i0": v}) == v % 4


def test_parse_print_round_trip():
    for text in ["2*h + kh - 1", "floor((H + 1)/2)", "M*K", "-i0 + 3", "(H+1)//2", "ceil(W/4)", "i0 - i1 + S - 1"]:
        e = parse_expr(text)
        assert parse_expr(str(e)) == e


def test_parse_errors():
    for bad in ["2*", "floor(H/0)", "H / 3", "a $ b", "(H + 1"]:
        with pytest.raises(SyntaxError):
            parse_expr(bad)


def test_exact_div_for_reshape():
    assert (M * K * 4).exact_div(K) == M * 4
    assert (M * K).exact_div(N) is None
    assert Expr.lift(12).exact_div(5) is None
    assert prod([M, 4, K]) == 4 * M * K


def test_affinity():
    assert parse_expr("2*i0 + floor((i1 + 1)/2)").is_affine()
    assert not (M * K).is_affine()


def test_vectorised_evaluation_matches_scalar():
    e = parse_expr("2*i0 + floor((3*i1 - 1)/4) - H")
    i0, i1 = np.indices((3, 5))
    vec = e.evaluate({"i0": i0, "i1": i1, "H": 7})
    for a, b in itertools.product(range(3), range(5)):
        assert vec[a, b] == 2 * a + (3 * b - 1) // 4 - 7


@settings(max_examples=200, deadline=None)
@given(st.integers(-20, 20), st.integers(-20, 20), st.integers(-20, 20), st.integers(1, 9), st.integers(-30, 30))
def test_floordiv_is_exact(a, b, c, q, x):
    """floor((a*x + b*y + c)/q) after normalisation evaluates like Python's // for every point."""
    e = (a * Expr.sym("x") + b * Expr.sym("y") + c).floordiv(q)
    for y in (-3, 0, 5):
        assert e.evaluate({"x": x, "y": y}) == (a * x + b * y + c) // q
