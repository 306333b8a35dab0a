"""CPU playback (seed 001 §6.11): execute a region with numpy exactly as written, and a Program of
regions in order. Every later stage's kernels are tested against this.

Values are numpy arrays paired with their axis names. A ``Read`` evaluates its index expressions over
the grid of its axes; an index outside the MemRef is an error unless a ``Select`` guard in scope masks
it (E1401 UnguardedAccess) - so playback also checks that pads and tails are guarded.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from kumiko import dtypes, ops
from kumiko.diagnostics import KumikoError
from kumiko.region.ssa import (
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Gather,
    Guard,
    Program,
    Read,
    Reduce,
    Ref,
    Region,
    RExpr,
    Select,
    Transpose,
    Unary,
    typecheck,
)
from kumiko.symbolic import Expr, dim_eval

NA = tuple  # (array, axes)


def _align(v: NA, axes: tuple) -> np.ndarray:
    """View a named array with ``axes`` (a superset, canonical order) by transposing and adding dims."""
    arr, have = v
    order = [a for a in axes if a in have]
    arr = np.transpose(arr, [have.index(a) for a in order]) if tuple(order) != have else arr
    shape = [arr.shape[order.index(a)] if a in order else 1 for a in axes]
    return arr.reshape(shape)


class _Region:
    def __init__(self, r: Region, buffers: Mapping[str, np.ndarray], env: Mapping[str, int]):
        self.r, lets_t = typecheck(r)
        self.types = lets_t
        self.buffers, self.env = buffers, dict(env)
        self.order = [a.name for a in r.iters]
        self.sizes = {a.name: dim_eval(a.size, env) for a in r.iters}
        self.lets: dict[str, NA] = {}

    def canon(self, names) -> tuple:
        s = set(names)
        return tuple(n for n in self.order if n in s)

    def grid(self, axes: tuple) -> dict[str, np.ndarray]:
        out = {}
        for k, a in enumerate(axes):
            shape = [1] * len(axes)
            shape[k] = self.sizes[a]
            out[a] = np.arange(self.sizes[a], dtype=np.int64).reshape(shape)
        return out

    def index_axes(self, exprs) -> tuple:
        names: set[str] = set()
        for e in exprs:
            if e is not None:
                names |= {s for s in Expr.lift(e).symbols() if s in self.sizes}
        return self.canon(names)

    def ev(self, e: RExpr, mask: NA | None) -> NA:  # noqa: C901 (a dispatcher)
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=(e.dtype or dtypes.fp32).np if e.dtype else None), ()
        if isinstance(e, Ref):
            return self.lets[e.name]
        if isinstance(e, (Read, Gather)):
            return self._read(e, mask)
        if isinstance(e, Unary):
            arr, axes = self.ev(e.x, mask)
            return _unary(e.fn, arr), axes
        if isinstance(e, Cast):
            arr, axes = self.ev(e.x, mask)
            return ops.cast(arr, e.to, via=_compute_np(e.to)), axes
        if isinstance(e, Binary):
            x, y = self.ev(e.x, mask), self.ev(e.y, mask)
            axes = self.canon(set(x[1]) | set(y[1]))
            xa, ya = _align(x, axes), _align(y, axes)
            xa, ya = _coerce(xa, ya)
            return _binary(e.fn, xa, ya), axes
        if isinstance(e, Select):
            p = self._pred(e.pred)
            inner = p if mask is None else self._and(mask, p)
            outer_p = (~p[0], p[1])
            outer = outer_p if mask is None else self._and(mask, outer_p)
            t, o = self.ev(e.then, inner), self.ev(e.other, outer)
            axes = self.canon(set(p[1]) | set(t[1]) | set(o[1]))
            ta, oa = _coerce(_align(t, axes), _align(o, axes))
            return np.where(_align(p, axes), ta, oa), axes
        if isinstance(e, Reduce):
            for a in e.axes:
                self.sizes[a.name] = dim_eval(a.size, self.env)
                if a.name not in self.order:
                    self.order.append(a.name)
            arr, axes = self.ev(e.body, mask)
            names = [a.name for a in e.axes]
            full = self.canon(set(axes) | set(names))
            arr = np.broadcast_to(_align((arr, axes), full), [self.sizes[a] for a in full])
            red = tuple(full.index(n) for n in names)
            acc = _compute_np(e.dtype)
            arr = arr.astype(acc)
            if arr.size == 0:
                out = np.full([s for k, s in enumerate(arr.shape) if k not in red], e.init, dtype=acc)
            else:
                out = ops.REDUCE_BY_FN[e.op].np(arr, axis=red).astype(acc, copy=False)
            return out.astype(e.dtype.np), tuple(a for a in full if a not in names)
        if isinstance(e, BroadcastInDim):
            return _align(self.ev(e.operand, mask), self.canon(e.axes)), self.canon(e.axes)
        if isinstance(e, Transpose):
            arr, axes = self.ev(e.operand, mask)
            return np.transpose(arr, e.perm), tuple(axes[p] for p in e.perm)
        raise TypeError(f"cannot play back {e!r}")

    def _and(self, a: NA, b: NA) -> NA:
        axes = self.canon(set(a[1]) | set(b[1]))
        return _align(a, axes) & _align(b, axes), axes

    def _pred(self, p) -> NA:
        if isinstance(p, Guard):
            axes = self.index_axes(c for c, _ in p.constraints)
            g = {**self.env, **self.grid(axes)}
            ok = np.ones([1] * len(axes), dtype=bool)
            for c, op in p.constraints:
                v = np.asarray(Expr.lift(c).evaluate(g))
                ok = ok & (v >= 0 if op == "ge" else v == 0)
            return np.broadcast_to(ok, [self.sizes[a] for a in axes]), axes
        arr, axes = self.ev(p, None)
        return arr.astype(bool), axes

    def _read(self, e, mask: NA | None) -> NA:
        name = e.tensor
        if name not in self.buffers:
            raise KumikoError("E1007", at=f"region {self.r.name}", why=f"buffer {name!r} has no value at playback")
        buf = self.buffers[name]
        axes = self.index_axes(e.index)
        by = None
        if isinstance(e, Gather):
            by = self.ev(e.by, mask)
            axes = self.canon(set(axes) | set(by[1]))
        g = {**self.env, **self.grid(axes)}
        shape = [self.sizes[a] for a in axes]
        if by is not None:
            g[e.var] = _align(by, axes).astype(np.int64)
        if getattr(e, "flat", False):
            buf = buf.reshape(-1)
        coords, bad = [], np.zeros(shape, dtype=bool)
        for k, ix in enumerate(e.index):
            c = np.broadcast_to(np.asarray(Expr.lift(ix).evaluate(g)), shape)
            bad = bad | (c < 0) | (c >= buf.shape[k])
            coords.append(np.clip(c, 0, max(buf.shape[k] - 1, 0)))
        if bad.any():
            if mask is not None:
                union = self.canon(set(axes) | set(mask[1]))
                masked = _align((bad, axes), union) & _align(mask, union)
            else:
                masked = bad
            if masked.any():
                raise KumikoError("E1401", at=f"region {self.r.name}", why=f"a read of {name} leaves its bounds "
                                  "where no Select guards it")
        if buf.size == 0:
            return np.zeros(shape, dtype=buf.dtype), axes
        return buf[tuple(coords)], axes

    def run(self) -> dict[str, np.ndarray]:
        for let in self.r.lets:
            self.lets[let.name] = self.ev(let.expr, None)
        outs = {}
        iters = tuple(a.name for a in self.r.iters)
        for y in self.r.yields:
            o = next(o for o in self.r.outputs if o.name == y.to)
            arr = np.broadcast_to(_align(self.lets[y.src], iters), [self.sizes[a] for a in iters])
            dt = y.cast or o.memref.dtype
            outs[y.to] = np.array(ops.cast(arr, dt), copy=True, order="C")
        return outs


def _compute_np(dt: dtypes.DType) -> np.dtype:
    return np.dtype(np.float32) if dt in (dtypes.fp16, dtypes.bf16) else dt.np


def _coerce(x: np.ndarray, y: np.ndarray):
    """Untyped constants take their sibling's dtype; 16-bit floats compute in fp32."""
    if x.ndim == 0 and x.dtype != y.dtype and y.dtype != np.bool_:
        x = x.astype(y.dtype)
    if y.ndim == 0 and y.dtype != x.dtype and x.dtype != np.bool_:
        y = y.astype(x.dtype)
    return x, y


def _unary(fn: str, x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    xf = x.astype(np.float32) if dt.itemsize == 2 and dt.kind != "i" else x
    with np.errstate(all="ignore"):
        r = ops.BY_FN[fn].np(xf)
    return np.asarray(r).astype(dt)


def _binary(fn: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    dt = x.dtype if x.ndim or not y.ndim else y.dtype
    half = dt.itemsize == 2 and dt.kind not in "iub"
    xf, yf = (x.astype(np.float32), y.astype(np.float32)) if half else (x, y)
    with np.errstate(all="ignore"):
        op = ops.BY_FN[fn]
        r = op.np(xf, yf)
    return r if op.kind == "compare" else np.asarray(r).astype(dt)


def play_region(r: Region, buffers: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Run one region on named buffers; returns its outputs by name."""
    return _Region(r, buffers, env).run()


def play_program(p: Program, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Run every region in order, passing intermediates by name; returns the signature outputs. A region that
    writes a buffer through a view of another shape (a split group axis: ``kumiko.region.groups``) hands it on
    in the program's shape, the same row-major memory."""
    bufs: dict[str, np.ndarray] = dict(inputs)
    shapes = dict((*p.buffers, *p.outputs))
    for r in p.regions:
        for name, arr in play_region(r, bufs, env).items():
            m = shapes.get(name)
            bufs[name] = arr.reshape([dim_eval(d, env) for d in m.shape]) if m is not None else arr
    return {name: bufs[name] for name, _ in p.outputs}
