"""Properties on random movement chains (pads, flips, strided shrinks, sliding-window VIEWs, a final
REDUCE): every value read through its IndexBook map (enumerating the domain, first-match pieces)
equals the reference evaluator's value exactly; and the ISL relations Poly-View builds from the book
hold exactly the same (point -> element) pairs and pad points."""
from __future__ import annotations

import math

import islpy as isl
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kumiko.indexbook import build_indexbook, play
from kumiko.indexbook.model import Piece
from kumiko.poly import poly_view
from kumiko.symbolic import Expr
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.evaluate import evaluate

OPS = ("RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "VIEW")
MAX_ELEMS = 600


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _step(draw, b: TinyBuilder, x: str) -> str:
    shape = b.shape(x)
    rank = len(shape)
    op = draw(st.sampled_from(OPS))
    if op == "RESHAPE":
        k = draw(st.integers(1, 4))
        bins = [1] * k
        for f in _factors(math.prod(shape)):
            bins[draw(st.integers(0, k - 1))] *= f
        return b.add("RESHAPE", [x], result_shape=tuple(bins))
    if op == "PERMUTE":
        return b.add("PERMUTE", [x], perm=tuple(draw(st.permutations(range(rank)))))
    if op == "EXPAND":
        pos = draw(st.integers(0, rank))
        y = b.add("RESHAPE", [x], result_shape=shape[:pos] + (1,) + shape[pos:])
        return b.add("EXPAND", [y], result_shape=shape[:pos] + (draw(st.integers(1, 3)),) + shape[pos:])
    if op == "PAD":
        pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(rank))
        return b.add("PAD", [x], pad=pads, value=draw(st.integers(-9, -1)))
    if op == "SHRINK":
        lo, hi, step = [], [], []
        for d in shape:
            a = draw(st.integers(0, d - 1))
            lo.append(a)
            hi.append(draw(st.integers(a + 1, d)))
            step.append(draw(st.integers(1, 3)))
        return b.add("SHRINK", [x], lo=tuple(lo), hi=tuple(hi), step=tuple(step))
    if op == "FLIP":
        axes = draw(st.sets(st.integers(0, rank - 1), min_size=1))
        return b.add("FLIP", [x], axes=tuple(sorted(axes)))
    # VIEW: per source axis one of identity / reversed / sliding window / constant
    sizes: list[int] = []
    parts: list = []
    for d in shape:
        mode = draw(st.sampled_from(("id", "rev", "win", "const")))
        if mode == "const":
            parts.append(("c", draw(st.integers(0, d - 1))))
        elif mode in ("id", "rev"):
            parts.append((mode, len(sizes)))
            sizes.append(d)
        else:
            s, w = draw(st.integers(1, 2)), draw(st.integers(1, d))
            parts.append(("win", len(sizes), s))
            sizes += [(d - w) // s + 1, w]
    if not sizes:
        return x
    order = draw(st.permutations(range(len(sizes))))   # output axes in a random order
    var = [Expr.sym(f"i{order[j]}") for j in range(len(sizes))]
    out_shape = [0] * len(sizes)
    for j, sz in enumerate(sizes):
        out_shape[order[j]] = sz
    imap = []
    for part, d in zip(parts, shape):
        if part[0] == "c":
            imap.append(Expr((), part[1]))
        elif part[0] == "id":
            imap.append(var[part[1]])
        elif part[0] == "rev":
            imap.append(d - 1 - var[part[1]])
        else:
            imap.append(part[2] * var[part[1]] + var[part[1] + 1])
    return b.add("VIEW", [x], result_shape=tuple(out_shape), index_map=tuple(imap))


@st.composite
def chains(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    b = TinyBuilder("prop")
    x = b.add("INPUT", tensor_id="X", dtype="i32", shape=shape)
    cur, nodes = x, []
    for _ in range(draw(st.integers(1, 5))):
        nxt = _step(draw, b, cur)
        if math.prod(b.shape(nxt)) > MAX_ELEMS:
            break
        cur = nxt
        nodes.append(cur)
    if draw(st.booleans()) and b.shape(cur):
        axes = draw(st.sets(st.integers(0, len(b.shape(cur)) - 1), min_size=1))
        op = draw(st.sampled_from(("SUM", "MAX")))
        cur = b.reduce(cur, op, axes, "i32")
        nodes.append(cur)
    if b.node(cur).uop != "REDUCE":
        cur = b.add("NEG", [cur])                     # a computed value: a Poly-View block reads the chain
    g = b.finish([("X", x)], [("Y", cur)])
    return g, x, shape


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.integers(0, 2**31 - 1))
def test_indexbook_reproduces_evaluator(case, seed):
    g, x, shape = case
    arr = np.random.default_rng(seed).integers(-50, 50, size=shape, dtype=np.int32)
    want = evaluate(g, {"X": arr}, keep=True)
    book = build_indexbook(g)
    for nid, info in book.values.items():
        if nid == x or not (info.is_movement or info.reduce):
            continue
        got = play(book, nid, {x: arr}, {})
        np.testing.assert_array_equal(got, want[nid], err_msg=f"{nid} {info.uop}")


def _isl_points(s) -> set[tuple[int, ...]]:
    out: set[tuple[int, ...]] = set()
    n = s.dim(isl.dim_type.set)
    s.foreach_point(lambda p: out.add(tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python()
                                            for k in range(n))))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_isl_relations_hold_exactly_the_indexbook_pairs(case):
    g, x, shape = case
    book = build_indexbook(g)
    view = poly_view(book)
    (blk,) = view.blocks.values()
    info = book[blk.name]
    acc = info.inputs[0]
    sizes = [int(a.size) for a in info.axes + info.reduce]
    names = [a.name for a in info.axes + info.reduce]
    reads, pads = set(), set()
    for pt in np.ndindex(*sizes):
        env = dict(zip(names, pt))
        piece = next(p for p in (acc.pieces or (Piece(),)) if all(bool(r.holds(env)) for r in p.constraints))
        if piece.reads:
            reads.add(tuple(pt) + tuple(int(e.evaluate(env)) for e in acc.map))
        else:
            pads.add(tuple(pt))
    rel = next(r for r in blk.reads if not r.accumulate)
    assert _isl_points(rel.rel.wrap()) == reads
    isl_pads: set = set()
    for s, _ in rel.pads:
        isl_pads |= _isl_points(s)
    assert isl_pads == pads
