"""Evaluate a value *through its IndexBook entry*: enumerate the domain, apply the map, take pieces.

This is how the IndexBook is checked against the reference evaluator (the property tests): a value
read through its composed AxisMap and first-match pieces must equal what the evaluator computed
node by node. REDUCE values are played back by reading their access over (axes + reduce axes) and
reducing. Only values whose accesses reach bases you pass in ``bases`` can be played back.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.indexbook.model import Access, IndexBook, Piece
from kumiko.symbolic import dim_eval


def read_access(acc: Access, names: list[str], shape: tuple[int, ...], base: np.ndarray,
                env: Mapping[str, int], dtype) -> np.ndarray:
    """``acc`` evaluated at every point of the box ``names`` x ``shape``."""
    if acc.map is None:
        raise KumikoError("E1304", at=f"playback:{acc.value_id}", why=f"the access is not affine: {acc.note}")
    idx = np.indices(shape, dtype=np.int64, sparse=True) if shape else []
    ienv: dict = dict(env)
    ienv.update({n: idx[k] for k, n in enumerate(names)})
    coords = [np.broadcast_to(np.asarray(e.evaluate(ienv), dtype=np.int64), shape) for e in acc.map]
    out = np.zeros(shape, dtype=dtype)
    done = np.zeros(shape, dtype=bool)
    for p in acc.pieces or (Piece(),):
        mask = np.ones(shape, dtype=bool)
        for r in p.constraints:
            mask &= np.broadcast_to(r.holds(ienv), shape)
        mask &= ~done
        if p.reads:
            out[mask] = base[tuple(c[mask] for c in coords)] if coords else base
        else:
            out[mask] = p.fill
        done |= mask
    if not done.all():
        raise KumikoError("E1401", at=f"playback:{acc.value_id}", why="the pieces do not cover the domain")
    return out


def play(book: IndexBook, vid: str, bases: Mapping[str, np.ndarray], env: Mapping[str, int]) -> np.ndarray:
    """The value ``vid`` computed from ``bases`` (arrays by base value id) through its IndexBook entry."""
    info = book[vid]
    if vid in bases:
        return np.asarray(bases[vid])
    if not info.inputs or len(info.inputs) != 1:
        raise KumikoError("E1304", at=f"playback:{vid}", why=f"{info.uop} is not a single read; play it back "
                          "from its operands instead")
    acc = info.inputs[0]
    base = np.asarray(bases[acc.value_id])
    if info.reduce:
        axes = info.axes + info.reduce
        shape = tuple(dim_eval(a.size, env) for a in axes)
        full = read_access(acc, [a.name for a in axes], shape, base, env, base.dtype)
        red = tuple(range(len(info.axes), len(axes)))
        op = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}[info.reduce_op or "SUM"]
        return op(full, axis=red)
    shape = tuple(dim_eval(a.size, env) for a in info.axes)
    return read_access(acc, [a.name for a in info.axes], shape, base, env, base.dtype)
