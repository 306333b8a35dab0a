"""The operands of a region's contraction as the packed CPU path sees them: table forms and orientation.

Table form. An operand of the form ``guard ? v(src[index]) : 0`` - nested pad Selects over one Read, with
casts or pointwise maps of the loaded element - whose index and guard expressions split into a part over
the row axes, a part over K and a part over batch/sizes (affine maps do; a floor division mixing rows and
K does not) is a ``TableForm``: the kernel packs it from index tables (``kumiko.kernel.pack``), or reads it
in place from a zero-padded copy of its source when every guard is a bound of a source dimension
(``stage_bounds``, ``kumiko.kernel.stage``). Anything else (a data-dependent gather, a non-separable index,
a pad of another value) has no table form.

Orientation (``orient``). The micro-kernel's B panels are NR rows wide along the vector lanes, so the
operand whose rows are contiguous in memory goes to the B (N) side: ``x`` and ``y`` swap roles when only
``x`` has a unit-stride row axis (a stride-1 convolution's pixels against its weights) or one of stride 2
to ``MAX_PHASES`` along its source's last dimension (a strided convolution's pixels, which a stage makes
consecutive, ``lane_rows``), and always when a
window reduction (a pooling consumer computed at the contraction) is fused, so windows run along the
columns of the accumulator tile. Each side's row axes are ordered by decreasing memory stride (the pixels
of a pooled conv become ``(n, oh, ow)`` again), which keeps consecutive rows consecutive in memory.

These are functions of the Region alone: the planner (``kumiko.plan.choose``) reads the orientation to size
its micro-tile, the kernel to pack.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko import dtypes
from kumiko.region.analysis import Contraction
from kumiko.region.ssa import Binary, BroadcastInDim, Cast, Const, Guard, Read, Ref, RExpr, Select, Transpose, Unary
from kumiko.symbolic import Expr, FloorDiv, Sym, least, prod

#: the largest stride of a row axis that a stage splits into phases (``kumiko.kernel.stage``)
MAX_PHASES = 4
#: the fewest rows of a strided operand that go to the lanes (B) through a phased stage; fewer stay on the
#: A side, packed: on the 2-core EPYC (one thread) the ResNet stem ran 2.02 -> 1.13 ms and a 1x1
#: stride-2 conv to 28x28 1.32 -> 0.92 ms through the stage, while to 14x14 (196 rows) and 7x7 both ran
#: 13-27% slower than packed on the A side
MIN_PHASED_ROWS = 512


@dataclass(frozen=True)
class TableForm:
    """An operand as ``valid ? value(src[o0 + o_row + o_k]) : 0`` where every guard is
    ``g0 + g_row + g_k (>= | ==) 0``: each part of an index depends on the rows, on K, or on neither
    (batch axes and sizes: part 0)."""
    tensor: str
    dtype: dtypes.DType
    off: tuple            # (rest, row part, k part): Exprs
    guards: tuple         # ((op, (rest, row part, k part)), ...)
    value: RExpr          # the packed value, over Ref("__ld") (the loaded element in its compute type)
    identity: bool        # value is the fp32 element itself (vector copies apply)
    dims: tuple = ()      # per dimension of the source: ((rest, row part, k part) of its index, size); () if flat


def _names(atom) -> set:
    return {atom.name} if isinstance(atom, Sym) else set(atom.num.symbols())


def _parts(e: Expr, rows: set, ks: set) -> tuple | None:
    """(rest, row part, k part) of ``e``; None when one term mixes rows and K."""
    out: tuple = ({}, {}, {})
    for mono, coef in e.terms:
        names: set = set()
        for a in mono:
            names |= _names(a)
        r, k = bool(names & rows), bool(names & ks)
        if r and k:
            return None
        out[1 if r else 2 if k else 0][mono] = coef
    return Expr(out[0], e.const), Expr(out[1]), Expr(out[2])


def _is_zero(e: RExpr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and float(e.value) == 0.0


def table_form(e: RExpr, memrefs: dict, rows: set, ks: set) -> TableForm | None:
    guards: list = []
    casts: list = []
    node = e
    while True:
        if isinstance(node, Select) and isinstance(node.pred, Guard) and _is_zero(node.other):
            guards += list(node.pred.constraints)
            node = node.then
        elif isinstance(node, Cast):
            casts.append(node.to)
            node = node.x
        elif isinstance(node, (BroadcastInDim, Transpose)):
            node = node.operand
        else:
            break
    reads: list = []

    def rebuild(x: RExpr) -> RExpr | None:
        if isinstance(x, Read):
            reads.append(x)
            return Ref("__ld")
        if isinstance(x, (BroadcastInDim, Transpose)):
            return rebuild(x.operand)
        if isinstance(x, Unary):
            y = rebuild(x.x)
            return None if y is None else Unary(x.fn, y)
        if isinstance(x, Cast):
            y = rebuild(x.x)
            return None if y is None else Cast(y, x.to)
        if isinstance(x, Binary) and isinstance(x.y, Const):
            y = rebuild(x.x)
            return None if y is None else Binary(x.fn, y, x.y)
        if isinstance(x, Binary) and isinstance(x.x, Const):
            y = rebuild(x.y)
            return None if y is None else Binary(x.fn, x.x, y)
        return None
    value = rebuild(node)
    if value is None or len(reads) != 1:
        return None
    for to in reversed(casts):
        value = Cast(value, to)
    rd = reads[0]
    m = memrefs[rd.tensor]
    dims: tuple = ()
    if rd.flat:
        off = Expr.lift(rd.index[0])
    else:
        off = Expr.lift(0)
        for i, d in zip(rd.index, m.shape):
            off = off * d + i
        dp = [_parts(Expr.lift(i), rows, ks) for i in rd.index]
        if all(x is not None for x in dp):
            dims = tuple(zip(dp, (Expr.lift(d) for d in m.shape)))
    op = _parts(off, rows, ks)
    gs = []
    for g, kind in guards:
        gp = _parts(Expr.lift(g), rows, ks)
        if op is None or gp is None:
            return None
        gs.append((kind, gp))
    if op is None:
        return None
    if m.dtype.name == "fp32" and value == Cast(Ref("__ld"), dtypes.fp32):
        value = Ref("__ld")
    identity = value == Ref("__ld") and m.dtype.name == "fp32"
    return TableForm(rd.tensor, m.dtype, op, tuple(gs), value, identity, dims)


def stage_bounds(t: TableForm | None) -> tuple | None:
    """Whether a padded copy of the source (a stage) can replace the guards of ``t``: every guard is a
    bound of one of the source's dimensions (``index >= 0`` or ``size - 1 - index >= 0``), and every
    index part is affine. Then an element whose guard fails is exactly an element of the stage's zero
    border, and the stage reads need no test. An operand without guards qualifies too (its stage only
    reorders: a strided one's phases, ``kumiko.kernel.stage``). Returns the dims (as in ``TableForm.dims``),
    else None."""
    if t is None or not t.identity or not t.dims:
        return None
    for op, g in t.guards:
        if op != "ge":
            return None
        lower = any(all(a == b for a, b in zip(g, p)) for p, _ in t.dims)
        upper = any(g[0] == n - 1 - p[0] and g[1] == -p[1] and g[2] == -p[2] for p, n in t.dims)
        if not lower and not upper:
            return None
    for p, n in t.dims:
        if not all(e.is_affine() for e in p) or not n.is_affine():
            return None
    return t.dims


def _stride(off: Expr, a: str) -> int | None:
    """How far ``off`` moves when axis ``a`` grows by one, when that is a number (else None)."""
    k = 0
    for mono, coef in off.terms:
        for atom in mono:
            if isinstance(atom, FloorDiv) and a in atom.num.symbols():
                return None
            if isinstance(atom, Sym) and atom.name == a:
                if mono != (atom,):
                    return None
                k = coef
    return k


def row_order(axes: tuple, t: TableForm | None) -> tuple:
    """Rows ordered by decreasing memory stride (sizes counted as 64): consecutive rows then tend to be
    consecutive elements. Axes that move nothing or move it non-affinely go outermost."""
    if t is None:
        return axes

    def weight(a: str) -> float:
        w = 0
        for mono, coef in t.off[1].terms:
            if any(isinstance(x, FloorDiv) and a in x.num.symbols() for x in mono):
                return float("inf")
            if sum(1 for x in mono if isinstance(x, Sym) and x.name == a) == 1:
                w += abs(coef) * 64 ** (len(mono) - 1)
        return w or float("inf")
    return tuple(sorted(axes, key=lambda a: -weight(a)))


def unit_rows(rows: tuple, t: TableForm | None) -> bool:
    """The innermost row axis moves the operand by one element."""
    return t is not None and bool(rows) and _stride(t.off[1], rows[-1]) == 1


def row_step(rows: tuple, t: TableForm | None, sizes: dict) -> int | None:
    """How many elements apart consecutive rows are: how far the innermost row axis longer than 1 (``sizes``:
    axis -> size) moves the operand, when that is a number (else None; None without a table form or rows)."""
    if t is None:
        return None
    for a in reversed(rows):
        if Expr.lift(sizes[a]).as_int() != 1:
            return _stride(t.off[1], a)
    return None


def phase_count(rest: Expr, rp: Expr, rows: tuple) -> int:
    """How many phases a stage splits a source dimension into: ``f`` (2 to ``MAX_PHASES``) when its index
    moves ``f`` per step of one row axis and its rest part is a constant (so each element's phase is a
    function of K alone), else 1 (``kumiko.kernel.stage``)."""
    if rest.terms or len(rp.terms) != 1:
        return 1
    (mono, coef), = rp.terms
    if len(mono) != 1 or not isinstance(mono[0], Sym) or mono[0].name not in rows:
        return 1
    return coef if 1 < coef <= MAX_PHASES else 1


def steps_last_dim(rows: tuple, dims: tuple, f: int) -> bool:
    """The innermost row axis moves only the source's last dimension, by ``f``: one element of the stage
    per row once that dimension is split into ``f`` phases (``f`` = 1: not split)."""
    return row_dim(rows, dims) == (len(dims) - 1, f)


def row_dim(rows: tuple, dims: tuple) -> tuple[int, int] | None:
    """(the source dimension, its step) when the innermost row axis moves one dimension alone, by a positive
    constant (a channels-last conv's pixels step its W dimension by the stride, each pixel's channels
    inside), else None."""
    last = rows[-1] if rows else None
    moves = [(i, p[1].coeff(last)) for i, (p, _) in enumerate(dims) if last is not None and p[1].coeff(last)]
    return moves[0] if len(moves) == 1 and isinstance(moves[0][1], int) and moves[0][1] > 0 else None


def lane_rows(rows: tuple, t: TableForm | None, sizes: dict | None = None) -> bool:
    """The innermost row axis moves the operand by one element, or steps its source's last dimension alone
    by 2 to ``MAX_PHASES`` (a strided convolution's pixels: a stage splits that dimension into phases and
    the rows are consecutive again) when there are at least ``MIN_PHASED_ROWS`` of them at every size
    (``sizes``: axis -> size)."""
    if t is None or not rows:
        return False
    if _stride(t.off[1], rows[-1]) == 1:
        return True
    if not t.dims or sizes is None:
        return False
    (rest, rp, _), _ = t.dims[-1]
    f = phase_count(rest, rp, rows)
    if f == 1 or not steps_last_dim(rows, t.dims, f) or any(a not in sizes for a in rows):
        return False
    # symbolic sizes count at their least (a batch of images has at least the pixels of one)
    return least(prod([Expr.lift(sizes[a]) for a in rows])) >= MIN_PHASED_ROWS


@dataclass(frozen=True)
class Orientation:
    """Which operand of a contraction packs into A panels (the M side of the micro-kernel) and which into
    B panels (along the vector lanes), each with its rows in packing order and its table form if any."""
    a: RExpr
    a_rows: tuple
    a_table: TableForm | None
    b: RExpr
    b_rows: tuple
    b_table: TableForm | None
    swapped: bool             # x went to the B side


def orient(c: Contraction, memrefs: dict, sizes: dict | None = None, lanes: str | None = None) -> Orientation:
    """The orientation of ``c``'s operands (see the module docstring); ``sizes`` (axis -> size) lets a
    strided operand with enough rows go to the lanes. ``lanes`` is a plan's choice (its ``vectorize.axis``):
    ``"m"`` puts ``x``'s rows (the M axes) in the vector lanes, ``"n"`` ``y``'s; a fused window reduction
    keeps its own (the windows run along the tile's columns)."""
    ks = {a.name for a in c.k_axes}
    tx = table_form(c.x, memrefs, set(c.m_axes), ks)
    ty = table_form(c.y, memrefs, set(c.n_axes), ks)
    ox, oy = row_order(c.m_axes, tx), row_order(c.n_axes, ty)
    if lanes is None:
        lanes = "m" if lane_rows(ox, tx, sizes) and not lane_rows(oy, ty, sizes) else "n"
    if c.outer is not None or lanes == "m":
        return Orientation(c.y, oy, ty, c.x, ox, tx, True)
    return Orientation(c.x, ox, tx, c.y, oy, ty, False)
