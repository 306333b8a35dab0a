"""ContractionPattern detection (seed 001 §5.2, §10 step 3): ``REDUCE(SUM)`` directly over a ``MUL``.

The MUL's operands are movement-only views (the IndexBook composed them straight to their bases), so
the pattern is read off the two composed maps over the block's dims ``i*`` (output) and ``r*``
(reduce), with size-1 dims set to 0:

* every coordinate a single dim (or a constant): a matmul family. Output dims read by both operands
  are batch dims, by one only are M (lhs) / N (rhs); reduce dims read by both are K.
  ``matmul`` (no batch), ``batched_matmul``, ``matvec`` (M or N empty), ``dot`` (both empty).
* some coordinate ``s*i + d*r + c`` mixing one output and reduce dims: a ``conv``; ``s`` is the stride,
  ``d`` the dilation, ``c`` the (pad) offset; the other operand must be plain (the filter).
* anything else: ``contraction`` (still a sum of products, just no named pattern).

Pattern names stay here (and in the Poly-View dump): the Region layer never sees them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kumiko.indexbook.expr import index_names, lift
from kumiko.indexbook.model import Access, IndexInfo
from kumiko.symbolic import Expr, Sym


@dataclass(frozen=True)
class ContractionPattern:
    pattern: str
    lhs: str
    rhs: str
    lhs_idx: tuple[str, ...]
    rhs_idx: tuple[str, ...]
    out_idx: tuple[str, ...]
    reduce_idx: tuple[str, ...]
    batch_idx: tuple[str, ...] = ()
    m_idx: tuple[str, ...] = ()
    n_idx: tuple[str, ...] = ()
    image: str | None = None          # conv: which operand slides ("lhs"/"rhs")
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()
    affine_offsets: tuple[tuple[str, str], ...] = field(default=())

    def to_json(self) -> dict:
        d: dict = {"pattern": self.pattern, "lhs": self.lhs, "rhs": self.rhs, "lhs_idx": list(self.lhs_idx),
                   "rhs_idx": list(self.rhs_idx), "out_idx": list(self.out_idx), "reduce_idx": list(self.reduce_idx)}
        if self.batch_idx:
            d["batch_idx"] = list(self.batch_idx)
        if self.pattern in ("matmul", "batched_matmul", "matvec"):
            d["m_idx"], d["n_idx"] = list(self.m_idx), list(self.n_idx)
        if self.pattern == "conv":
            d.update(image=self.image, strides=list(self.strides), dilations=list(self.dilations),
                     offsets=list(self.offsets))
        d["affine_offsets"] = dict(self.affine_offsets)
        return d


def axis_roles(outs, lhs, rhs) -> dict[str, str]:
    """The one batch/M/N classifier of a sum of products (this module's patterns and the Region layer's
    ``kumiko.region.analysis.find_contraction`` both use it): an output dim that both operands read is
    ``"batch"``, one only the lhs reads ``"m"``, one only the rhs reads ``"n"``, one neither reads
    ``"free"`` (a size-1 or broadcast dim)."""
    lhs, rhs = set(lhs), set(rhs)
    return {v: ("batch" if v in rhs else "m") if v in lhs else "n" if v in rhs else "free" for v in outs}


def _ordered_vars(exprs) -> list[str]:
    out: list[str] = []
    for e in exprs:
        for m, _ in e.terms:
            for a in m:
                n = getattr(a, "name", None)
                if n is not None and n in index_names(e) and n not in out:
                    out.append(n)
    return out


def _plain(e: Expr) -> bool:
    return e.is_const or (e.const == 0 and e.as_symbol() is not None)


def detect(red: IndexInfo, lhs: Access, rhs: Access, lhs_name: str, rhs_name: str) -> ContractionPattern | None:
    """The pattern of ``red = sum_r(lhs * rhs)``; ``lhs``/``rhs`` are maps over red's dims (i*, r*)."""
    if red.reduce_op != "SUM" or lhs.map is None or rhs.map is None:
        return None
    ones = {a.name: Expr((), 0) for a in red.axes + red.reduce if lift(a.size) == 1}
    L = [e.subs(ones) for e in lhs.map]
    R = [e.subs(ones) for e in rhs.map]
    outs = [a.name for a in red.axes if a.name not in ones]
    reds = [a.name for a in red.reduce if a.name not in ones]
    lv, rv = _ordered_vars(L), _ordered_vars(R)
    base = dict(lhs=lhs_name, rhs=rhs_name, lhs_idx=tuple(lv), rhs_idx=tuple(rv), out_idx=tuple(outs),
                reduce_idx=tuple(reds))
    windows = {side: [e for e in es if _window(e, outs, reds)] for side, es in (("lhs", L), ("rhs", R))}
    if windows["lhs"] or windows["rhs"]:
        image = "lhs" if windows["lhs"] else "rhs"
        other = R if image == "lhs" else L
        if windows["lhs"] and windows["rhs"] or not all(_plain(e) for e in other):
            return ContractionPattern("contraction", **base)
        coords = windows[image]
        strides, dil, offs, aff = [], [], [], []
        for e in coords:
            o = next(v for v in outs if e.coeff(v))
            r = [v for v in reds if e.coeff(v)]
            strides.append(e.coeff(o))
            dil.append(e.coeff(r[0]))
            offs.append(e.const)
            aff.append((o, str(e)))
        return ContractionPattern("conv", **base, image=image, strides=tuple(strides), dilations=tuple(dil),
                                  offsets=tuple(offs), affine_offsets=tuple(aff))
    if not all(_plain(e) for e in L + R):
        return ContractionPattern("contraction", **base)
    roles = axis_roles(outs, lv, rv)
    batch, m, n = (tuple(v for v in outs if roles[v] == role) for role in ("batch", "m", "n"))
    if any(not (r in lv and r in rv) for r in reds):
        return ContractionPattern("contraction", **base)
    if m and n:
        pattern = "batched_matmul" if batch else "matmul"
    elif m or n:
        pattern = "matvec"
    else:
        pattern = "dot"
    return ContractionPattern(pattern, **base, batch_idx=batch, m_idx=m, n_idx=n)


def _window(e: Expr, outs: list[str], reds: list[str]) -> bool:
    """``s*i + d*r (+ ...) + c``: exactly one output dim and at least one reduce dim, all affine terms."""
    names = index_names(e)
    if any(len(m) != 1 or not isinstance(m[0], Sym) for m, _ in e.terms):
        return False
    o = [v for v in outs if v in names]
    r = [v for v in reds if v in names]
    return len(o) == 1 and len(r) >= 1 and len(names) == len(o) + len(r)
