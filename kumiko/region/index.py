"""Index propagation through Tiny IR movement ops: given an index of a movement node's result, the
index of its source (and the guard constraints a PAD adds). These are the IndexBook's per-op update
rules (seed 001 §4.4) applied to one concrete index tuple; region formation uses them to inline.

Reshapes are split into groups of consecutive axes with equal element counts (size-1 axes are
dropped), so the common reshapes (adding/removing unit axes, splitting one axis, merging axes) give
simple affine maps; a merge over symbolic axes has no affine inverse and returns ``None``.
"""
from __future__ import annotations

from kumiko.symbolic import Expr, prod
from kumiko.tiny.ir import Node, TinyGraph


def move_index(g: TinyGraph, n: Node, index: tuple) -> tuple:
    """(source index, guards) for ``n``'s result at ``index``; guards are ``(expr, "ge")`` pairs."""
    src = g.nodes[n.src[0]]
    u, a = n.uop, n.arg
    index = tuple(Expr.lift(i) for i in index)
    if u == "PERMUTE":
        out: list = [None] * len(index)
        for k, p in enumerate(a["perm"]):
            out[p] = index[k]
        return tuple(out), ()
    if u == "EXPAND":
        return tuple(Expr.lift(0) if s == 1 and d != 1 else i for i, s, d in zip(index, src.shape, n.shape)), ()
    if u == "SHRINK":
        step = a.get("step") or (1,) * len(index)
        return tuple(Expr.lift(lo) + st * i for i, lo, st in zip(index, a["lo"], step)), ()
    if u == "FLIP":
        return tuple(Expr.lift(s) - 1 - i if k in a["axes"] else i
                     for k, (i, s) in enumerate(zip(index, src.shape))), ()
    if u == "PAD":
        guards, out = [], []
        for i, (lo, hi), s in zip(index, a["pad"], src.shape):
            if lo == 0 and hi == 0:
                out.append(i)
                continue
            if lo != 0:
                guards.append((i - lo, "ge"))
            if hi != 0:
                guards.append((Expr.lift(s) + lo - 1 - i, "ge"))
            out.append(i - lo)
        return tuple(out), tuple(guards)
    if u == "VIEW":
        env = {f"i{k}": i for k, i in enumerate(index)}
        return tuple(e.subs(env) for e in a["index_map"]), ()
    if u == "RESHAPE":
        return reshape_index(index, n.shape, src.shape), ()
    raise AssertionError(f"{u} is not a movement op")


def linear(index: tuple, shape: tuple) -> Expr:
    """Row-major offset of ``index`` in ``shape``."""
    off = Expr.lift(0)
    for i, d in zip(index, shape):
        off = off * d + i
    return off


def _groups(dst: tuple, src: tuple):
    """Pair runs of non-unit axes of dst and src with equal products: [([dst axes], [src axes]), ...].
    The side with the smaller product grows (for symbolic sizes: the side that divides the other)."""
    d = [k for k, x in enumerate(dst) if x != 1]
    s = [k for k, x in enumerate(src) if x != 1]
    out, i, j = [], 0, 0
    while i < len(d) and j < len(s):
        gd, gs = [d[i]], [s[j]]
        i, j = i + 1, j + 1
        while True:
            pd, ps = prod(dst[k] for k in gd), prod(src[k] for k in gs)
            if pd == ps:
                break
            if isinstance(pd, int) and isinstance(ps, int):
                grow_d = pd < ps
            elif Expr.lift(ps).exact_div(pd) is not None:
                grow_d = True
            elif Expr.lift(pd).exact_div(ps) is not None:
                grow_d = False
            else:
                return None
            if grow_d and i < len(d):
                gd.append(d[i])
                i += 1
            elif not grow_d and j < len(s):
                gs.append(s[j])
                j += 1
            else:
                return None
        out.append((gd, gs))
    return out if i == len(d) and j == len(s) else None


def reshape_index(index: tuple, dst: tuple, src: tuple) -> tuple | None:
    """The source index of a reshape ``src -> dst`` at ``index`` (None: needs a symbolic division)."""
    groups = _groups(dst, src)
    if groups is None:
        return None
    out: list = [Expr.lift(0)] * len(src)
    for gd, gs in groups:
        lin = linear(tuple(index[k] for k in gd), tuple(dst[k] for k in gd))
        if len(gs) == 1:
            out[gs[0]] = lin
            continue
        strides = []
        for k in range(len(gs)):
            st = prod(src[m] for m in gs[k + 1:])
            if not isinstance(st, int):
                return None
            strides.append(st)
        for k, (axis, st) in enumerate(zip(gs, strides)):
            q = lin.floordiv(st)
            out[axis] = q if k == 0 else q % src[axis] if isinstance(src[axis], int) else None
            if out[axis] is None:
                return None
    return tuple(out)


def injective(index: tuple, sizes: dict) -> bool:
    """Is ``point -> index`` injective over the box of ``sizes``? Every axis must appear, in one index
    expression only, and within an expression the terms sorted by |coefficient| must not overlap
    (each term's span stays below the next coefficient). Conservative with symbolic extents."""
    seen: set[str] = set()
    for e in index:
        e = Expr.lift(e)
        terms = []
        for name in sorted(e.symbols()):
            if name not in sizes:
                continue
            c = e.coeff(name)
            if c == 0 or name in seen:
                return False
            seen.add(name)
            terms.append((abs(c), sizes[name]))
        terms.sort(key=lambda t: t[0])
        span = 0
        for k, (c, size) in enumerate(terms):
            if k and span >= c:
                return False
            if not isinstance(size, int):
                if k + 1 < len(terms):
                    return False
                continue
            span += c * (size - 1)
    return all(n in seen or sizes[n] == 1 for n in sizes)
