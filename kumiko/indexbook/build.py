"""Tiny IR -> IndexBook: the per-op update rules of seed 001 §4.4, composed along movement chains.

Every node gets fresh axes ``i0..``. A movement node's one-step map (its source's coordinates as
expressions of its own axes) is substituted into its source's *view* (base value, map, pieces), so
a chain RESHAPE -> EXPAND -> PERMUTE -> ... ends as one affine map straight to its base. Base values
are INPUT, CONST, every computed value and every ``non_scop`` value (a gather, or a reshape whose
re-split needs a symbolic stride: ISL cannot divide by a size): the Region layer materialises or
re-reads those, so composition stops there.

Rules: reshape linearises ``L = sum(y_j*stride_j)`` and re-splits ``x_k = floor(L/s_k) % d_k`` per
group of axes whose sizes multiply to the same product (size-1 axes are constant 0); expand maps a
broadcast axis to constant 0; pad shifts by ``lo`` and opens an in-bounds piece plus an ``else`` piece
holding the pad value; shrink maps ``x = lo + step*y``; flip ``x = d-1-y``; VIEW substitutes its
index_map; permute is the inverse permutation; reduce maps deleted axes to ``r0, r1, ...``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from kumiko.indexbook.expr import NonAffine, ParamTable, Range, axis_var, index_names, lift
from kumiko.indexbook.model import Access, Axis, IndexBook, IndexInfo, Piece, identity_map, reduce_env
from kumiko.indexbook.simplify import fold_constants, simplify_pieces
from kumiko.symbolic import Expr, iter_ranges, simplify
from kumiko.tiny.ir import MOVEMENT, Node, TinyGraph, is_ref

#: movement ops after which pieces may have become empty or redundant (the others are bijections)
_RESIMPLIFY = ("PAD", "SHRINK", "VIEW")


@dataclass(frozen=True)
class View:
    """How a value reads its base: ``base[exprs]`` where ``pieces`` allow (first match)."""
    base: str
    exprs: tuple[Expr, ...]
    pieces: tuple[Piece, ...] = ()

    def compose(self, f: tuple[Expr, ...], sizes: Mapping[str, object] | None = None) -> "View":
        """Substitute ``i_k := f[k]`` (the source axes in terms of the consumer's variables); with
        ``sizes`` (the consumer's axis name -> extent) the result is simplified over the consumer's box
        (``symbolic.simplify``), so a reshape round trip composes back to the plain index."""
        env = {f"i{k}": e for k, e in enumerate(f)}
        exprs = tuple(e.subs(env) for e in self.exprs)
        pieces = tuple(Piece(tuple(r.subs(env) for r in p.constraints), p.fill) for p in self.pieces)
        if sizes:
            rng = iter_ranges(sizes)
            exprs = tuple(simplify(e, rng) for e in exprs)
            pieces = tuple(Piece(tuple(Range.make(simplify(r.expr, rng), r.lo, r.hi) for r in p.constraints),
                                 p.fill) for p in pieces)
        return View(self.base, exprs, pieces)


class NonAffineStep(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# one-step maps

def reshape_map(src: tuple, dst: tuple) -> tuple[Expr, ...]:
    """Source coordinates of ``reshape(src -> dst)`` over dst's axis variables; raises NonAffineStep."""
    out: list[Expr | None] = [Expr((), 0) if lift(d) == 1 else None for d in src]
    sk = [k for k, d in enumerate(src) if lift(d) != 1]
    dj = [j for j, d in enumerate(dst) if lift(d) != 1]
    for gs, gd in _groups(src, dst, sk, dj):
        if len(gs) == 1 and len(gd) == 1:
            out[gs[0]] = axis_var(gd[0])
            continue
        lin, stride = Expr((), 0), Expr((), 1)
        for j in reversed(gd):
            if stride.as_int() is None:
                raise NonAffineStep(f"merging axes needs the symbolic stride {stride}")
            lin = lin + axis_var(j) * stride
            stride = stride * lift(dst[j])
        istride = Expr((), 1)
        for pos, k in reversed(list(enumerate(gs))):
            q = istride.as_int()
            if q is None:
                raise NonAffineStep(f"splitting axes needs the symbolic stride {istride}")
            x = lin.floordiv(q)
            if pos > 0:
                d = lift(src[k]).as_int()
                if d is None:
                    raise NonAffineStep(f"re-splitting needs the symbolic stride '% {src[k]}'")
                x = x % d
            out[k] = x
            istride = istride * lift(src[k])
    assert all(e is not None for e in out)
    return tuple(out)  # type: ignore[arg-type]


def _groups(src: tuple, dst: tuple, sk: list[int], dj: list[int]) -> list[tuple[list[int], list[int]]]:
    """Minimal runs of source and destination axes with equal products (symbolic sizes compared exactly)."""
    groups = []
    i = j = 0
    while i < len(sk) and j < len(dj):
        gs, gd = [sk[i]], [dj[j]]
        ps, pd = lift(src[sk[i]]), lift(dst[dj[j]])
        i, j = i + 1, j + 1
        while ps != pd:
            if j < len(dj) and ps.exact_div(pd) is not None:
                gd.append(dj[j])
                pd = pd * lift(dst[dj[j]])
                j += 1
            elif i < len(sk) and pd.exact_div(ps) is not None:
                gs.append(sk[i])
                ps = ps * lift(src[sk[i]])
                i += 1
            elif i < len(sk):
                gs.append(sk[i])
                ps = ps * lift(src[sk[i]])
                i += 1
            elif j < len(dj):
                gd.append(dj[j])
                pd = pd * lift(dst[dj[j]])
                j += 1
            else:
                break
        groups.append((gs, gd))
    if i < len(sk) or j < len(dj):
        groups.append((sk[i:], dj[j:]))
    return groups


def step_map(n: Node, x: Node) -> tuple[tuple[Expr, ...], tuple[Range, ...]]:
    """(source coordinates, in-bounds constraints opened by a PAD) for movement node ``n`` over ``x``."""
    a, rank = n.arg, len(x.shape)
    ys = [axis_var(k) for k in range(len(n.shape))]
    if n.uop == "RESHAPE":
        return reshape_map(x.shape, n.shape), ()
    if n.uop == "PERMUTE":
        inv = {p: j for j, p in enumerate(a["perm"])}
        return tuple(ys[inv[k]] for k in range(rank)), ()
    if n.uop == "EXPAND":
        return tuple(Expr((), 0) if lift(d) == 1 else ys[k] for k, d in enumerate(x.shape)), ()
    if n.uop == "PAD":
        f = tuple(ys[k] - lo for k, (lo, _) in enumerate(a["pad"]))
        cons = tuple(Range.make(f[k], 0, x.shape[k]) for k, (lo, hi) in enumerate(a["pad"])
                     if not (lift(lo) == 0 and lift(hi) == 0))
        return f, cons
    if n.uop == "SHRINK":
        step = a.get("step") or (1,) * rank
        return tuple(lift(lo) + s * ys[k] for k, (lo, s) in enumerate(zip(a["lo"], step))), ()
    if n.uop == "FLIP":
        axes = set(a["axes"])
        return tuple(lift(d) - 1 - ys[k] if k in axes else ys[k] for k, d in enumerate(x.shape)), ()
    if n.uop == "VIEW":
        return tuple(a["index_map"]), ()
    raise AssertionError(n.uop)


# ------------------------------------------------------------------------------------------------

class _Builder:
    def __init__(self, tiny: TinyGraph):
        self.tiny = tiny
        self.table = ParamTable(_symbols_in_order(tiny))
        self.views: dict[str, View] = {}
        self.infos: dict[str, IndexInfo] = {}
        self.next_id = 0
        self.tensor = {nid: t for t, nid in tiny.outputs}
        self.tensor.update({nid: t for t, nid in tiny.inputs})

    def axes(self, n: Node) -> tuple[Axis, ...]:
        out = []
        for k, d in enumerate(n.shape):
            out.append(Axis(self.next_id, f"i{k}", d))
            self.next_id += 1
        return tuple(out)

    def access(self, v: View) -> Access:
        return Access(v.base, v.exprs, v.pieces, self.tensor.get(v.base) if self.tiny[v.base].uop == "INPUT" else None)

    def base(self, n: Node) -> View:
        return View(n.id, identity_map(len(n.shape)))

    def run(self) -> IndexBook:
        for n in self.tiny.nodes.values():
            info, view = self.node(n)
            self.infos[n.id] = replace(info, guards=info.needed_guards())
            self.views[n.id] = view
            for e in [lift(a.size) for a in info.axes + info.reduce] + [x for a in info.inputs for x in a.exprs()]:
                self.table.affine(e)   # registers every non-affine size as a derived parameter, in order
        values = _kinds(self.tiny, self.infos)
        return IndexBook(self.tiny.name, tuple(self.table.params), values, tuple(self.tiny.inputs),
                         tuple(self.tiny.outputs), tuple(self.table.derived.items()))

    def node(self, n: Node) -> tuple[IndexInfo, View]:
        axes = self.axes(n)
        common = dict(value_id=n.id, uop=n.uop, dtype=n.dtype.name, axes=axes, tensor=self.tensor.get(n.id))
        if n.uop in ("INPUT", "CONST"):
            return IndexInfo(**common), self.base(n)
        if n.uop in MOVEMENT:
            return self.movement(n, common)
        if n.uop == "REDUCE":
            x = self.tiny[n.src[0]]
            f = reduce_env(len(n.shape), n.arg["axes"], len(x.shape))
            xinfo = self.infos[x.id]
            red = tuple(Axis(xinfo.axes[k].id, f"r{j}", x.shape[k], "reduce") for j, k in enumerate(n.arg["axes"]))
            dims = [f"i{k}" for k in range(len(axes))] + [a.name for a in red]
            v = self.views[x.id].compose(f, {d: a.size for d, a in zip(dims, axes + red)})
            box = tuple(Range.make(lift(d), 0, a.size) for d, a in zip(dims, axes + red))
            v = View(v.base, v.exprs, simplify_pieces(v.pieces, box, dims, self.table) if v.pieces else ())
            info = IndexInfo(**common, inputs=(self.access(v),), src_maps=(Access(x.id, f),), reduce=red,
                             reduce_op=n.arg["op"])
            return info, self.base(n)
        if n.uop == "GATHER":
            x, idx = self.tiny[n.src[0]], self.tiny[n.src[1]]
            note = f"data-dependent index along axis {n.arg['axis']} (read from {idx.id})"
            xv, iv = self.views[x.id], self.views[idx.id]
            ins = (Access(xv.base, None, (), self.access(xv).tensor, note), self.access(iv))
            srcs = (Access(x.id, None, note=note), Access(idx.id, identity_map(len(n.shape))))
            return IndexInfo(**common, inputs=ins, src_maps=srcs, non_scop=True,
                             reason="GATHER: " + note), self.base(n)
        ins, srcs = [], []
        for s in n.src:
            if is_ref(s):
                ins.append(self.access(self.views[s]))
                srcs.append(Access(s, identity_map(len(n.shape))))
        return IndexInfo(**common, inputs=tuple(ins), src_maps=tuple(srcs)), self.base(n)

    def movement(self, n: Node, common: dict) -> tuple[IndexInfo, View]:
        x = self.tiny[n.src[0]]
        xv = self.views[x.id]
        try:
            f, opened = step_map(n, x)
            for e in f:
                self.table.affine(e)   # index variables times sizes cannot enter ISL
        except (NonAffineStep, NonAffine) as e:
            note = f"{n.uop} {[str(d) for d in x.shape]} -> {[str(d) for d in n.shape]}: {e}"
            ins = (Access(xv.base, None, (), self.access(xv).tensor, note),)
            return IndexInfo(**common, inputs=ins, src_maps=(Access(x.id, None, note=note),), non_scop=True,
                             reason=note), self.base(n)
        v = xv.compose(f, {f"i{k}": d for k, d in enumerate(n.shape)})
        if n.uop == "PAD":
            inner = v.pieces or (Piece(),)
            pad = n.arg.get("value", 0)
            pieces = tuple(Piece(opened + p.constraints, p.fill) for p in inner) + (Piece((), pad),)
            v = View(v.base, v.exprs, pieces)
        if v.pieces:
            if n.uop in _RESIMPLIFY:
                dims = [f"i{k}" for k in range(len(n.shape))]
                box = tuple(Range.make(axis_var(k), 0, d) for k, d in enumerate(n.shape))
                v = View(v.base, v.exprs, simplify_pieces(v.pieces, box, dims, self.table))
            else:
                v = View(v.base, v.exprs, fold_constants(v.pieces))
        info = IndexInfo(**common, inputs=(self.access(v),), src_maps=(Access(x.id, f),))
        return info, v


def _kinds(tiny: TinyGraph, infos: Mapping[str, IndexInfo]) -> dict[str, IndexInfo]:
    """``broadcast`` for axes the value does not vary along (size 1, or read at a constant / along an
    axis its base does not vary on), ``iter`` otherwise. Varying-ness flows from INPUTs (every axis of
    size > 1 varies) through the composed maps and piece constraints; CONSTs vary along nothing."""
    varying: dict[str, set[int]] = {}
    out: dict[str, IndexInfo] = {}
    for vid, info in infos.items():
        n = len(info.axes)
        if info.uop == "INPUT":
            var = set(range(n))
        elif info.uop == "CONST":
            var = set()
        else:
            var = set()
            for acc in info.inputs:
                if acc.map is None:
                    var |= set(range(n))
                    continue
                base_var = varying[acc.value_id]
                names: set[str] = set()
                for j, e in enumerate(acc.map):
                    if j in base_var:
                        names |= index_names(e)
                for p in acc.pieces:
                    for r in p.constraints:
                        names |= index_names(r.expr)
                var |= {int(s[1:]) for s in names if s.startswith("i")}
        var = {k for k in var if lift(info.axes[k].size) != 1}
        varying[vid] = var
        axes = tuple(replace(a, kind="iter" if k in var else "broadcast") for k, a in enumerate(info.axes))
        out[vid] = replace(info, axes=axes)
    return out


def _symbols_in_order(tiny: TinyGraph) -> list[str]:
    """Parameters in signature order: input shapes first, then the graph's defaults, then the rest."""
    seen: dict[str, None] = {}

    def add(shape) -> None:
        for d in shape:
            if isinstance(d, Expr):
                for s in sorted(d.symbols()):
                    seen.setdefault(s, None)
    for _, nid in tiny.inputs:
        add(tiny[nid].shape)
    for s in tiny.symbols:
        seen.setdefault(s, None)
    for n in tiny.nodes.values():
        add(n.shape)
    return list(seen)


def build_indexbook(tiny: TinyGraph, shapes: Mapping[str, tuple] | None = None) -> IndexBook:
    """The IndexBook of a Tiny graph, aligned to the signature (``shapes``: tensor -> declared shape;
    by default the INPUT nodes' shapes). Raises E1304 when sizes disagree with the signature."""
    from kumiko.indexbook.align import align_params
    book = _Builder(tiny).run()
    if shapes is None:
        shapes = {t: tiny[nid].shape for t, nid in tiny.inputs}
    book = align_params(book, shapes)
    book.verify()
    return book



