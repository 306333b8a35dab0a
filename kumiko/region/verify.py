"""Region verification: types (``typecheck``), neutral inits (E1403 NeutralInvalid), C-CON1, and a
static bounds check of every Read with ISL (E1401 UnguardedAccess): the set of iteration points that
satisfy the guards in scope yet index outside the MemRef must be empty, for all sizes >= 1."""
from __future__ import annotations

import islpy as isl

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.region.srnf import check_ccon1, children
from kumiko.region.ssa import Guard, Read, Reduce, Region, RExpr, Select, typecheck
from kumiko.symbolic import Expr


def verify(r: Region) -> Region:
    r, _ = typecheck(r)
    check_ccon1(r)
    sizes = {a.name: a.size for a in r.iters}
    memrefs = dict(r.inputs)
    for let in r.lets:
        _walk(r, let.expr, dict(sizes), (), memrefs)
    return r


def _walk(r: Region, e: RExpr, axes: dict, guards: tuple, memrefs: dict) -> None:
    if isinstance(e, Reduce):
        want = dtypes.neutral(e.op.upper(), e.dtype).item()
        if e.init != want:
            raise KumikoError("E1403", at=f"region {r.name}", why=f"Reduce({e.op}) starts from {e.init}, not its "
                              f"neutral {want} in {e.dtype}")
        axes = {**axes, **{a.name: a.size for a in e.axes}}
        _walk(r, e.body, axes, guards, memrefs)
        return
    if isinstance(e, Select) and isinstance(e.pred, Guard):
        _walk(r, e.then, axes, guards + e.pred.constraints, memrefs)
        _walk(r, e.other, axes, guards, memrefs)
        return
    if isinstance(e, Read) and not e.flat and e.tensor in memrefs:
        _check_read(r, e, axes, guards, memrefs[e.tensor].shape)
    for k in children(e):
        _walk(r, k, axes, guards, memrefs)


def _check_read(r: Region, e: Read, axes: dict, guards: tuple, shape: tuple) -> None:
    exprs = [Expr.lift(i) for i in e.index] + [Expr.lift(c) for c, _ in guards] + \
        [Expr.lift(s) for s in list(shape) + list(axes.values())]
    if not all(x.is_affine() for x in exprs):
        return  # products of size symbols: outside ISL's affine world; playback checks it at run time
    names = sorted(axes)
    params = sorted(set().union(*(x.symbols() for x in exprs)) - set(names))
    base = [f"0 <= {a} < {Expr.lift(axes[a]).to_isl()}" for a in names] + [f"{p} >= 1" for p in params]
    base += [f"{Expr.lift(c).to_isl()} {'>=' if op == 'ge' else '='} 0" for c, op in guards]
    for k, (ix, size) in enumerate(zip(e.index, shape)):
        ix = Expr.lift(ix).to_isl()
        bad = f"({ix} < 0 or {ix} >= {Expr.lift(size).to_isl()})"
        text = f"[{', '.join(params)}] -> {{ [{', '.join(names)}] : {' and '.join(base + [bad])} }}"
        if not isl.Set(text).is_empty():
            raise KumikoError("E1401", at=f"region {r.name}", why=f"Read {e.tensor}[{', '.join(map(str, e.index))}] "
                              f"can leave axis {k} (size {size}) where no Select guards it")
