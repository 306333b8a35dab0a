"""``align_params``: the signature's size symbols are the only truth (seed 001 §4.2).

Every Domain and AxisExpr of the book is expressed over the same ordered parameter list — the
symbols of the signature's tensors, in signature order — so the ISL objects Poly-View builds from
different values share one parameter space. A size or map that uses a symbol the signature does not
know, a symbol spelled like an axis variable, or a signature tensor whose IndexBook axes disagree
with its declared shape is an E1304 AxisAlignmentMismatch.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from kumiko.diagnostics import KumikoError
from kumiko.indexbook.expr import is_index_name, lift, param_names
from kumiko.indexbook.model import IndexBook
from kumiko.symbolic import Expr, dim


def _shape_syms(shape) -> list[str]:
    out: list[str] = []
    for d in shape:
        if isinstance(d, Expr):
            out += sorted(d.symbols())
    return out


def align_params(book: IndexBook, shapes: Mapping[str, tuple]) -> IndexBook:
    """The book with ``params`` in signature order; raises E1304 on any disagreement."""
    order: dict[str, None] = {}
    for tensor, _ in tuple(book.inputs) + tuple(book.outputs):
        if tensor in shapes:
            for s in _shape_syms(shapes[tensor]):
                order.setdefault(s, None)
    for s in order:
        if is_index_name(s):
            raise KumikoError("E1304", at="IndexBook.align_params", why=f"size symbol {s!r} is spelled like an "
                              "axis variable (i<k>/r<k> are reserved for axes)")
    for tensor, vid in tuple(book.inputs) + tuple(book.outputs):
        if tensor not in shapes:
            continue
        want = tuple(dim(d) for d in shapes[tensor])
        have = book[vid].shape
        if len(want) != len(have):
            raise KumikoError("E1304", at="IndexBook.align_params", why=f"{tensor} has {len(have)} axes in the "
                              f"IndexBook but rank {len(want)} in the signature", value=vid)
        for k, (w, h) in enumerate(zip(want, have)):
            if lift(w) != lift(h):
                raise KumikoError("E1304", at="IndexBook.align_params", why=f"axis i{k} of {tensor} has size {h} "
                                  f"in the IndexBook but {w} in the signature", value=vid)
    known = set(order) | {k for k, _ in book.derived}
    for vid, info in book.values.items():
        used: set[str] = set()
        for a in info.axes + info.reduce:
            used |= param_names(lift(a.size))
        for acc in info.inputs:
            for e in acc.exprs():
                used |= param_names(e)
        stray = sorted(used - known)
        if stray:
            raise KumikoError("E1304", at="IndexBook.align_params", why=f"value {vid} uses size symbol(s) "
                              f"{stray} that no signature tensor declares", value=vid,
                              signature_symbols=sorted(order))
    return replace(book, params=tuple(order))
