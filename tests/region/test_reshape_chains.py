"""Reshape round trips give the plain index back: floor atoms are simplified with the iterators' ranges
(``symbolic.simplify``), in region formation (``region.index.move_index``) and in the IndexBook's
composed maps, so a chain of merge/split reshapes neither grows its index expressions nor its compile time.
"""
import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kumiko
from kumiko.accuracy import rel_l2
from kumiko.compiler import to_tiny
from kumiko.indexbook import build_indexbook
from kumiko.region import form_regions
from kumiko.region.index import move_index
from kumiko.symbolic import Expr, bounds, iter_ranges, parse_expr, simplify_in
from kumiko.tensor import Tensor

P = parse_expr


# ------------------------------------------------------------------------------------------------
# the rules

def test_floor_below_the_divisor_is_zero():
    assert simplify_in("floor(i/4)", {"i": 4}) == 0
    assert simplify_in("floor(i/4)", {"i": 3}) == 0
    assert simplify_in("floor((i + 4)/4)", {"i": 4}) == 1                  # k*q <= E < (k+1)*q
    assert simplify_in("floor((2*i + j)/8)", {"i": 3, "j": 2}) == 0       # 2*2 + 1 < 8


def test_mod_inside_its_range_is_the_value():
    assert simplify_in(P("i") % 6, {"i": 6}) == P("i")
    assert simplify_in(P("i - 6*floor(i/6)"), {"i": 5}) == P("i")


def test_whole_multiples_come_out_and_the_rest_goes():
    # floor((a*q + b)/q) = a + floor(b/q) = a for 0 <= b < q, with a unbounded (a symbolic size)
    assert simplify_in("floor((4*a + b)/4)", {"a": "M", "b": 4}) == P("a")
    # floor((c*X + R)/q) = floor(X/(q/c)) for c | q and 0 <= R < c
    assert simplify_in("floor((6*i + j)/12)", {"i": 4, "j": 6}) == P("floor(i/2)")
    assert simplify_in("floor((6*i + j)/12)", {"i": "M", "j": 6}) == P("floor(i/2)")


def test_nested_floors_flatten():
    # always (no ranges needed): part of the canonical form
    assert P("floor(floor(x/4)/3)") == P("floor(x/12)")
    assert P("floor((floor(x/4) + 1)/3)") == P("floor((x + 4)/12)")
    assert P("4*floor(x/12) - 4*floor(floor(x/4)/3)") == 0
    # and with ranges: floor(floor((6*i + j)/4)/3) = floor((6*i + j)/12) = floor(i/2)
    assert simplify_in("floor(floor((6*i + j)/4)/3)", {"i": 4, "j": 6}) == P("floor(i/2)")


@pytest.mark.parametrize("text, sizes", [
    ("floor(i/4)", {"i": 5}),                  # i = 4 gives 1
    ("floor(i/4)", {"i": "M"}),                # symbolic size: nothing provable above
    ("floor(i/4)", {"i": "M - M + 5"}),        # a constant size in disguise is still 5 > 4
    ("i - 4*floor(i/4)", {"i": "M"}),
    ("floor((i - 1)/4)", {"i": 4}),            # -1 <= i - 1: floor is -1 or 0
    ("floor(m/4)", {}),                        # m has no range (a size, a gather value)
    ("floor((m + i)/4)", {"i": 4}),
    ("floor((6*i + j)/12)", {"i": 4, "j": 7}), # j = 6 carries into i's place
    ("floor((4*a + b)/4)", {"a": "M", "b": "N"}),
    ("floor((2*i + j)/8)", {"i": 4, "j": 3}),  # 2*3 + 2 = 8
])
def test_not_provable_is_left_alone(text, sizes):
    e = P(text)
    assert simplify_in(e, sizes) == e


def test_ranges_and_bounds():
    r = iter_ranges({"i": 4, "m": "M", "k": Expr.lift(3)})
    assert r["i"] == (0, 3) and r["k"] == (0, 2)
    assert r["m"][0] == 0 and r["m"][1] == float("inf")
    assert bounds(P("2*i - k + 1"), r) == (-1, 7)
    assert bounds(P("floor(i/2) + 3*floor(k/2)"), r) == (0, 4)
    lo, hi = bounds(P("i*m - m"), r)
    assert lo == -float("inf") and hi == float("inf")


_TERMS = st.lists(st.tuples(st.sampled_from(["i", "j", "k", "m"]), st.integers(-7, 9)), min_size=1, max_size=4)


@st.composite
def _exprs(draw, depth=2):
    e = Expr.lift(draw(st.integers(-5, 12)))
    for name, c in draw(_TERMS):
        e = e + c * Expr.sym(name)
    if depth:
        for _ in range(draw(st.integers(0, 2))):
            inner = draw(_exprs(depth=depth - 1))
            q = draw(st.integers(1, 13))
            op = draw(st.sampled_from(["floor", "mod"]))
            e = e + draw(st.integers(-4, 4)) * (inner.floordiv(q) if op == "floor" else inner % q)
    return e


@settings(max_examples=300, deadline=None)
@given(_exprs(), st.integers(1, 6), st.integers(1, 13), st.integers(1, 5))
def test_simplify_is_exact_inside_the_box(e, si, sj, sk):
    """Property: ``simplify`` agrees with the original everywhere in the box (m has no range: sampled)."""
    sizes = {"i": si, "j": sj, "k": sk}
    s = simplify_in(e, sizes)
    for i, j, k in itertools.product(range(si), range(sj), range(sk)):
        for m in (-9, -1, 0, 3, 17):
            env = {"i": i, "j": j, "k": k, "m": m}
            assert s.evaluate(env) == e.evaluate(env), (str(e), str(s), env)


# ------------------------------------------------------------------------------------------------
# reshape chains end to end

PATTERNS = {
    "merge-split": ((4, 6), [(2, 12), (24,), (4, 6)]),
    "flat-3d": ((4, 6), [(24,), (2, 3, 4), (4, 6)]),
    "uneven": ((4, 6), [(3, 2, 4), (4, 6)]),
    "cross": ((4, 6), [(6, 4), (2, 3, 4), (12, 2), (4, 6)]),
    "symbolic": (("M", 4, 6), [("M", 24), ("M", 2, 3, 4), ("M", 6, 4), ("M", 4, 6)]),
}


def _chain(pattern: str, trips: int):
    shape, steps = PATTERNS[pattern]
    x = Tensor.input("x", shape)
    y = x
    for _ in range(trips):
        for s in steps:
            y = y.reshape(*s)
    return y


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_round_trip_gives_the_plain_index(pattern):
    tiny = to_tiny((_chain(pattern, 6) + 1).graph("y"))
    book = build_indexbook(tiny)
    out = list(book.values)[-1]
    (acc,) = book[out].inputs
    rank = len(PATTERNS[pattern][0])
    assert [str(e) for e in acc.map] == [f"i{k}" for k in range(rank)]
    assert not book[out].guards                    # no floor left, so no div guard either
    prog = form_regions(tiny)
    assert len(prog.regions) == 1
    read = prog.regions[0].lets[-1].expr.x
    assert [str(e) for e in read.index] == [f"i{k}" for k in range(rank)]


def test_move_index_simplifies_with_sizes():
    x = Tensor.input("x", (4, 6))
    tiny = to_tiny((x.reshape(2, 12) + 1).graph("y"))
    n = next(n for n in tiny.nodes.values() if n.uop == "RESHAPE")
    idx = (Expr.sym("a"), Expr.sym("b"))
    plain, _ = move_index(tiny, n, idx)
    assert [str(e) for e in plain] == ["2*a + floor(b/6)", "b - 6*floor(b/6)"]   # no sizes: as before
    same, _ = move_index(tiny, n, idx, {"a": 2, "b": 12})
    assert same == plain                                                         # b < 12: not provable
    back, _ = move_index(tiny, n, (Expr.sym("a"), 6 * Expr.sym("c") + Expr.sym("d")), {"a": 2, "c": 2, "d": 6})
    assert [str(e) for e in back] == ["2*a + c", "d"]


@pytest.mark.parametrize("pattern, trips", [("merge-split", 60), ("flat-3d", 60), ("uneven", 60),
                                            ("cross", 40), ("symbolic", 40)])
def test_long_chains_compile_fast_and_match_the_evaluator(pattern, trips):
    g = (_chain(pattern, trips) + 1).graph("y")
    t0 = time.perf_counter()
    exe = kumiko.compile(g, "cpu")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0, f"{pattern} x{trips}: {elapsed:.1f} s"
    ref = kumiko.compile(g, "eval")
    for seed, shapes in enumerate([{"M": 3}, {"M": 1}] if pattern == "symbolic" else [None]):
        ins = exe.random_inputs(seed, shapes)
        got, want = exe(**ins)["y"], ref(**ins)["y"]
        assert got.shape == want.shape
        assert rel_l2(got, want) < 1e-6
        np.testing.assert_allclose(got, ins["x"] + 1, rtol=0, atol=0)


@pytest.mark.parametrize("step", ["rows", "transpose"])
def test_permuting_chains_are_cut_by_r_index(step):
    """reshape -> permute -> reshape composes to genuine permutations whose floor forms can double per
    step: R-index materialises before an index passes MAX_INDEX_TERMS, so 40 steps compile in seconds."""
    x = Tensor.input("x", (4, 6))
    y = x
    for _ in range(40):
        y = y.reshape(2, 2, 6).permute(1, 0, 2).reshape(4, 6) if step == "rows" else \
            y.reshape(3, 8).transpose(0, 1).reshape(4, 6)
    g = (y + 1).graph("y")
    prog = form_regions(to_tiny(g))
    assert any("R-index" in note for r in prog.regions for note in r.notes)
    assert all(sum(len(str(e)) for e in r.lets[-1].expr.x.index) < 20000 for r in prog.regions
               if hasattr(r.lets[-1].expr, "x") and hasattr(r.lets[-1].expr.x, "index"))
    t0 = time.perf_counter()
    exe = kumiko.compile(g, "cpu")
    assert time.perf_counter() - t0 < 20.0
    ins = exe.random_inputs(0)
    got, want = exe(**ins)["y"], kumiko.compile(g, "eval")(**ins)["y"]
    np.testing.assert_array_equal(got, want)
