"""Unroll-and-jam of a loop body over consecutive points of an outer axis (kernel IR to kernel IR).

A sliding window (a depthwise conv's 3x3 taps, a pool) reads ``x[..., i + r, ...]`` at each output point
``i``: the points ``i .. i + U - 1`` together read U + 2 input vectors per window row, where one point at a
time reads 3 each (and its 3 weights again). ``jam`` takes the body emitted once for one point, makes U
copies for the points ``base + 0 .. base + U - 1`` (the axis renamed to ``(base + u)``, every name the
body declares suffixed ``_u``), unrolls the small constant loops inside (a window row's taps) and merges
the copies in lockstep: loops with the same header become one loop whose body holds every copy's body,
anything else is laid out copy after copy. Within one merged straight-line block the copies' loads of the
same address are the same expression, which gcc merges (value numbering), and the copies' multiply-adds are
independent chains.

Merging is sound because the copies are independent: each writes its own temporaries and its own output
points (the stores of a region never alias its reads: every buffer is ``restrict``), and a copy's
statements keep their order. Bodies that declare scratch arrays or hold verbatim C (``Raw``) are not
jammed (``jammable``).
"""
from __future__ import annotations

import dataclasses

from kumiko.kernel.cexpr import rename
from kumiko.kernel.loops import Assign, Block, Comment, Decl, For, If, Store, VecStore

#: constant loops inside a jammed body with at most this many iterations are unrolled (a window row's taps),
#: so that the copies' loads of one address land in one block
UNROLL_TRIPS = 4


def jammable(body: tuple) -> bool:
    """Whether ``jam`` can take ``body``: only the statement kinds it knows how to rename and merge, and no
    assignment to a variable declared outside it (an accumulator the copies would update out of order)."""
    return _kinds_ok(body) and _assigned(body) <= _declared(body)


def _walk(body: tuple):
    """Every statement of ``body``, those inside loops, branches and blocks included."""
    for s in body:
        yield s
        if isinstance(s, (For, Block)):
            yield from _walk(s.body)
        elif isinstance(s, If):
            yield from _walk(s.then + s.other)


def _assigned(body: tuple) -> set:
    return {s.name for s in _walk(body) if isinstance(s, Assign)}


def _kinds_ok(body: tuple) -> bool:
    """No Scratch (each copy would declare it), Raw (the names it declares are unknown) or threads."""
    return all(isinstance(s, (For, If, Block, Decl, Assign, Store, VecStore, Comment))
               and not (isinstance(s, For) and (s.parallel or s.workshare)) for s in _walk(body))


def jam(body: tuple, axis: str, base: str, copies: int, keep: frozenset) -> tuple:
    """``body`` (emitted for one point of ``axis``) for the ``copies`` points ``base + u``, merged.
    ``keep``: declared names that are the same in every copy (a reduce axis unrolled as a constant)."""
    names = _declared(body) - keep
    out = []
    for u in range(copies):
        subst = {n: f"{n}_{u}" for n in names}
        subst[axis] = f"({base} + {u}LL)"
        out.append(_rename(_unroll(body), subst))
    return _zip(out)


def _declared(body: tuple) -> set:
    return {s.name for s in _walk(body) if isinstance(s, Decl)}


def _rename(body: tuple, subst: dict) -> tuple:
    out = []
    for s in body:
        if isinstance(s, Decl):
            s = Decl(s.ctype, subst.get(s.name, s.name), rename(s.init, subst))
        elif isinstance(s, Assign):
            s = Assign(subst.get(s.name, s.name), rename(s.value, subst))
        elif isinstance(s, Store):
            s = Store(s.buf, rename(s.offset, subst), rename(s.value, subst))
        elif isinstance(s, VecStore):
            s = VecStore(s.fn, s.buf, rename(s.offset, subst), rename(s.value, subst))
        elif isinstance(s, For):
            s = dataclasses.replace(s, lo=rename(s.lo, subst), hi=rename(s.hi, subst), body=_rename(s.body, subst))
        elif isinstance(s, If):
            s = If(rename(s.cond, subst), _rename(s.then, subst), _rename(s.other, subst))
        elif isinstance(s, Block):
            s = Block(_rename(s.body, subst), s.unrolled)
        out.append(s)
    return tuple(out)


def _unroll(body: tuple) -> tuple:
    """``body`` with its loops of at most UNROLL_TRIPS constant iterations from 0 as blocks, one per
    iteration, each declaring the index as a constant."""
    out = []
    for s in body:
        if isinstance(s, For):
            inner = _unroll(s.body)
            if s.trips is not None and s.trips <= UNROLL_TRIPS and s.lo == "0" and s.step == "1" \
                    and not s.tail and s.vector == 0:
                out.append(Block(tuple(Block((Decl("const long long", s.var, f"{k}LL"),) + inner)
                                       for k in range(s.trips)), unrolled=True))
                continue
            s = dataclasses.replace(s, body=inner)
        elif isinstance(s, If):
            s = If(s.cond, _unroll(s.then), _unroll(s.other))
        elif isinstance(s, Block):
            s = Block(_unroll(s.body), s.unrolled)
        out.append(s)
    return tuple(out)


def _zip(copies: list) -> tuple:
    """The copies' statements in lockstep: position by position, loops with one header and blocks of one
    shape merged (their bodies zipped), a declaration equal in every copy once, anything else copy by copy."""
    if len({len(c) for c in copies}) != 1:
        return tuple(s for c in copies for s in c)
    out: list = []
    for group in zip(*copies):
        first = group[0]
        if isinstance(first, Decl) and all(g == first for g in group):
            out.append(first)           # a constant every copy declares alike (an unrolled tap's index)
        elif all(isinstance(g, For) for g in group) and \
                len({dataclasses.replace(g, body=()) for g in group}) == 1:
            out.append(dataclasses.replace(first, body=_zip([g.body for g in group])))
        elif all(isinstance(g, Block) and g.unrolled == first.unrolled for g in group):
            out.append(Block(_zip([g.body for g in group]), first.unrolled))
        else:
            out.extend(group)
    return tuple(out)

