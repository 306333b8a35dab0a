"""Keeping piecewise reads small while movement chains are composed (seed 001 §4.3 rule 7).

Composition substitutes, it never drops anything, so a pad that a later SHRINK cuts away, or a bound
that a VIEW makes redundant, would stay in the pieces forever. After each step that can change
which points a piece covers (PAD, SHRINK, VIEW), ``simplify_pieces`` asks ISL — never a home-made
solver — three questions per piece, in first-match order:

1. is the piece empty once earlier pieces are removed (drop it);
2. does it cover everything earlier pieces left (it becomes the catch-all ``else`` piece);
3. which of its half-constraints are implied by the box, the sizes' context and the others
   (``remove_redundancies`` at the level of our own Range constraints, so dumps stay readable).

Ranges that are constant facts (``0 <= 0``) are folded without ISL.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import islpy as isl

from kumiko.indexbook.expr import ParamTable, Range, isl_set_str
from kumiko.indexbook.model import Piece


def fold_constants(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    out: list[Piece] = []
    for p in pieces:
        cons: list[Range] = []
        dead = False
        for r in p.constraints:
            d = r.decided()
            if d is False:
                dead = True
                break
            if d is None:
                cons.append(r)
        if dead:
            continue
        out.append(Piece(tuple(cons), p.fill))
        if not cons:
            break   # a catch-all: later pieces are unreachable
    return _collapse(out)


def _collapse(pieces: list[Piece]) -> tuple[Piece, ...]:
    """All pieces give the same thing (all read, or all the same fill): one catch-all, or none."""
    if not pieces:
        return ()
    fills = {repr(p.fill) for p in pieces}
    if len(fills) == 1 and not pieces[-1].constraints:
        return () if pieces[0].reads else (Piece((), pieces[0].fill),)
    return tuple(pieces)


class _Space:
    def __init__(self, table: ParamTable, dims: list[str], box: Iterable[Range]):
        self.table, self.dims = table, dims
        self.ctx = table.context()
        self.box = self.set(box)

    def set(self, cons: Iterable[Range]) -> isl.Set:
        s = isl.Set(isl_set_str(self.table, "", self.dims, [r.to_isl(self.table) for r in cons]))
        return s.intersect_params(self.ctx)


def simplify_pieces(pieces: Sequence[Piece], box: Sequence[Range], dims: list[str],
                    table: ParamTable) -> tuple[Piece, ...]:
    """Exact simplification of a first-match piece list over ``box`` (see the module doc)."""
    pieces = fold_constants(pieces)
    if not pieces or all(not p.constraints for p in pieces):
        return pieces
    sp = _Space(table, dims, box)
    covered = sp.box.subtract(sp.box)   # empty, in the right space
    out: list[Piece] = []
    for p in pieces:
        pset = sp.box.intersect(sp.set(p.constraints))
        rest = sp.box.subtract(covered)
        eff = pset.intersect(rest)
        if eff.is_empty():
            continue
        if rest.is_subset(pset):
            out.append(Piece((), p.fill))
            break
        halves = [h for r in p.constraints for h in r.halves()]
        keep = list(halves)
        for h in halves:
            trial = [x for x in keep if x is not h]
            if sp.box.intersect(sp.set(trial)).intersect(rest).is_subset(sp.set([h])):
                keep = trial
        out.append(Piece(_merge(keep), p.fill))
        covered = covered.union(pset).coalesce()
    return _collapse(out)


def _merge(halves: list[Range]) -> tuple[Range, ...]:
    """Join a lower and an upper half on the same expression back into one Range, order kept."""
    order: list = []
    by: dict = {}
    for h in halves:
        if h.expr not in by:
            order.append(h.expr)
            by[h.expr] = [None, None]
        if h.lo is not None:
            by[h.expr][0] = h.lo
        if h.hi is not None:
            by[h.expr][1] = h.hi
    return tuple(Range(e, by[e][0], by[e][1]) for e in order)
