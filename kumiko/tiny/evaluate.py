"""The reference evaluator: runs a TinyGraph with numpy, node by node, exactly as written.

It is the oracle every later stage is tested against, so it is deliberately simple: each node's
result is rounded to the node's dtype (fp16/bf16 math is done in fp32 and rounded back, as a GPU
does per op; fp64 math is float64 throughout); REDUCE accumulates in its declared dtype. ``fp64=True``
instead computes every float node in float64 (an "ideal" reference for judging rounding error of the
other targets).

A float SUM follows what the compiled kernels compute, because where values overflow the order and
the fusion decide the result (``_sequential_sum``): the terms are added one at a time in row-major
order of the reduced axes, and a SUM over a MUL (a contraction) adds the exact product, as an FMA or a
tensor core does, instead of the product rounded to the MUL's dtype (an fp16 product over 65504 is inf
on its own, but not inside an fp32 GEMM accumulator). The reference promises IEEE results for that
order and fusion; a target that sums in another order may overflow elsewhere (``kumiko.accuracy``
accepts any NaN or inf where the reference has one).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from kumiko import dtypes, ops
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_eval
from kumiko.tiny.inputs import check_array, input_shape
from kumiko.tiny.ir import Node, TinyGraph, is_ref
from kumiko.tiny.limits import check_limits, check_symbols, contraction_mul, eval_schedule

LOG2E = math.log2(math.e)

def bind_symbols(g: TinyGraph, inputs: Mapping[str, np.ndarray], given: Mapping[str, int] | None = None,
                 defaults: bool = False) -> dict[str, int]:
    """Bind size symbols from the inputs' shapes (plain-symbol dims only; others are checked)."""
    env: dict[str, int] = dict(given or {})
    for tensor, nid in g.inputs:
        n = g.nodes[nid]
        if tensor not in inputs:
            continue
        arr = inputs[tensor]
        if len(arr.shape) != len(n.shape):
            raise KumikoError("E1015", at=f"input {tensor}", why=f"expected rank {len(n.shape)} "
                              f"{[str(d) for d in n.shape]}, got shape {list(arr.shape)}")
        for d, actual in zip(n.shape, arr.shape):
            name = d.as_symbol() if not isinstance(d, int) else None
            if name is not None:
                if name in env and env[name] != actual:
                    raise KumikoError("E1015", at=f"input {tensor}", why=f"symbol {name} is {env[name]} elsewhere "
                                      f"but {actual} here")
                env[name] = int(actual)
    if defaults:
        for k, v in g.symbols.items():
            env.setdefault(k, int(v))
    check_symbols(env)
    return env


def check_inputs(g: TinyGraph, inputs: Mapping[str, np.ndarray], env: Mapping[str, int], *,
                 trusted: frozenset = frozenset(), partial: bool = False) -> None:
    """Every input is given, none is extra, each has its dtype and its shape under ``env``. ``trusted``: names
    whose arrays were checked before (an Executable's constants); ``partial``: check only those given."""
    names = [t for t, _ in g.inputs]
    missing = [] if partial else [t for t in names if t not in inputs]
    extra = [t for t in inputs if t not in names]
    if missing or extra:
        raise KumikoError("E1015", at="inputs", why=(f"missing {missing} " if missing else "") +
                          (f"unexpected {extra}" if extra else ""), expected=names)
    for tensor, nid in g.inputs:
        if tensor in trusted or tensor not in inputs:
            continue
        n = g.nodes[nid]
        check_array(tensor, n.dtype, inputs[tensor], input_shape(tensor, n.shape, env), n.shape)


def evaluate(g: TinyGraph, inputs: Mapping[str, np.ndarray], env: Mapping[str, int] | None = None,
             fp64: bool = False, keep: bool = False) -> dict[str, np.ndarray]:
    """Outputs by signature name (in signature order); ``keep=True`` returns every node's value by id."""
    env = bind_symbols(g, inputs, env)
    check_inputs(g, inputs, env)
    sched = eval_schedule(g, keep)
    check_limits(g, env, every_node=True, schedule=sched)
    vals: dict[str, np.ndarray] = {}
    feeds = {nid: t for t, nid in g.inputs}
    for nid, n in g.nodes.items():
        if nid in sched.fused:          # a contraction's product: its SUM computes it from the operands
            continue
        if n.uop == "INPUT":
            v = np.asarray(inputs[feeds[nid]]) if nid in feeds else None
            if v is None:
                raise KumikoError("E1015", at=f"tiny:{nid}", why=f"INPUT {n.arg.get('tensor_id')} has no value")
        else:
            want = tuple(dim_eval(d, env) for d in n.shape)
            if any(d < 0 for d in want):    # numpy would fail on it (check_sizes says the same for the kernels)
                raise KumikoError("E1015", at=f"tiny:{nid} ({n.uop})", why=f"with sizes {dict(env)} this node's "
                                  f"shape {[str(d) for d in n.shape]} is {list(want)}: a negative extent")
            srcs = [(vals.get(s) if s in sched.fused else vals[s]) if is_ref(s) else s for s in n.src]
            v = _eval_node(n, srcs, env, fp64, _fused(g, n, vals, env))
            if np.shape(v) != want:   # the bound sizes break an assumption the graph made (e.g. a slice end)
                raise KumikoError("E1015", at=f"tiny:{nid} ({n.uop})", why=f"with sizes {dict(env)} this node's "
                                  f"shape {[str(d) for d in n.shape]} is {list(want)}, but the computation gives "
                                  f"{list(np.shape(v))}", suggestion="Pass inputs whose sizes the graph's slices, "
                                  "pads and views fit.")
        vals[nid] = _round(v, n.dtype, fp64)
        for dead in sched.free_after.get(nid, ()):
            vals.pop(dead, None)
    if keep:
        return vals
    return {t: vals[nid] for t, nid in g.outputs}


def _store(dt: dtypes.DType, fp64: bool) -> np.dtype:
    return np.dtype(np.float64) if fp64 and dt.is_float else dt.np


def _compute(dt: dtypes.DType, fp64: bool) -> np.dtype:
    """Math happens in fp32 for 16-bit floats (rounded back by ``_round``), float64 for fp64 nodes and, in
    reference mode, for every float node."""
    if dt is dtypes.fp64 or (fp64 and dt.is_float):
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dt.is_float else dt.np


def _round(v, dt: dtypes.DType, fp64: bool) -> np.ndarray:
    v = np.asarray(v)
    want = _store(dt, fp64)
    with np.errstate(over="ignore"):      # rounding to a narrower float overflows to inf, as IEEE says
        return v if v.dtype == want else v.astype(want)


def _fused(g: TinyGraph, n: Node, vals: Mapping[str, np.ndarray], env: Mapping[str, int]) -> tuple | None:
    """A float SUM of a float MUL (a contraction): the MUL's operands and shape, from which the SUM computes
    the exact products itself (``_contract``), whether or not the product was materialised for another user."""
    mul = contraction_mul(g, n)
    if mul is None:
        return None
    src = g.nodes[mul]
    return [vals[s] if is_ref(s) else s for s in src.src], tuple(dim_eval(d, env) for d in src.shape)


def _unbroadcast(x, ndim: int) -> np.ndarray:
    """``x`` as float64 with rank ``ndim`` (leading 1s), every broadcast (stride 0) axis cut to extent 1, so a
    weight expanded over a batch is converted once, not once per image. fp32, fp16 and bf16 values are exact
    in float64, and so are products of two of them."""
    x = np.asarray(x)
    x = x.reshape((1,) * (ndim - x.ndim) + x.shape)
    x = x[tuple(slice(0, 1) if st == 0 and d > 1 else slice(None) for st, d in zip(x.strides, x.shape))]
    return x.astype(np.float64)


def _contract(operands: list, shape: tuple, axes: tuple, acc: np.dtype) -> np.ndarray:
    """SUM over ``axes`` of the product of two operands broadcast to ``shape``, as an ``acc`` accumulator that
    adds the exact products one at a time in row-major order of ``axes`` computes it (``_sequential_sum``'s
    promise), without materialising the product: an einsum in float64 gives the sum, rounded to ``acc``;
    only the output points whose sum of |terms| leaves ``acc``'s range (where a running sum may overflow
    first) take their terms one at a time. Memory: the operands in float64 and the result."""
    nd = len(shape)
    a, b = (_unbroadcast(x, nd) for x in operands)
    keep = [k for k in range(nd) if k not in axes]
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

    def spec(x):
        dims = [k for k in range(nd) if x.shape[k] != 1 or shape[k] == 1]
        return x.reshape([x.shape[k] for k in dims]), "".join(letters[k] for k in dims), set(dims)

    (xa, sa, da), (xb, sb, db) = spec(a), spec(b)
    out_dims = [k for k in keep if k in da | db]
    sub = f"{sa},{sb}->{''.join(letters[k] for k in out_dims)}"
    scale = math.prod(shape[k] for k in axes if k not in da | db)     # reduced axes neither operand varies on
    with np.errstate(all="ignore"):
        total = np.einsum(sub, xa, xb, optimize=True) * scale
        if acc != np.float64:
            top = float(np.finfo(acc).max)
            n_terms = math.prod(shape[k] for k in axes)
            bound = (np.max(np.abs(xa), initial=0.0) * np.max(np.abs(xb), initial=0.0)) * n_terms
            if not bound <= top:            # some running sum may leave acc's range: find where
                risky = ~(np.einsum(sub, np.abs(xa), np.abs(xb), optimize=True) * scale <= top)
                if risky.any():
                    total[risky] = _risky_totals(a, b, shape, axes, out_dims, np.nonzero(risky), acc)
    total = total.reshape([shape[k] if k in out_dims else 1 for k in keep])
    return np.broadcast_to(total, [shape[k] for k in keep]).astype(acc)


def _risky_totals(a, b, shape, axes, out_dims, where, acc) -> np.ndarray:
    """The in-order totals (``_in_order``) at the output points ``where`` (indices over ``out_dims``)."""
    keep = [k for k in range(len(shape)) if k not in axes]

    def rows_of(x, part):
        x = np.moveaxis(np.broadcast_to(x, shape), axes, tuple(range(-len(axes), 0)))
        idx = tuple(part[out_dims.index(k)] if k in out_dims else 0 for k in keep)
        return x[idx].reshape(len(part[0]), -1)
    out = np.empty(len(where[0]))
    step = max(1, _CHUNK // max(1, math.prod(shape[k] for k in axes)))
    for r0 in range(0, len(out), step):
        part = tuple(w[r0:r0 + step] for w in where)
        out[r0:r0 + step] = _in_order(rows_of(a, part) * rows_of(b, part), acc)
    return out


def _sequential_sum(terms: np.ndarray, axes: tuple, acc: np.dtype) -> np.ndarray:
    """The SUM of float64 ``terms`` over ``axes`` as an ``acc`` accumulator that adds them one at a time
    in row-major order of those axes computes it, rounding aside.

    The float64 running sum of fp32 (or exact fp32 x fp32 product) terms cannot overflow, and until the
    accumulator overflows it follows the float64 one to within rounding. So the result is the float64 sum
    rounded to ``acc``, except where a running sum first leaves ``acc``'s range: from there a sequential
    accumulator holds the inf of that sign, and only an infinite term (the same inf, or NaN for the
    opposite one) changes it."""
    k = len(axes)
    t = np.moveaxis(terms, axes, tuple(range(-k, 0)))
    lead = t.shape[:t.ndim - k]
    t = t.reshape((math.prod(lead), math.prod(t.shape[t.ndim - k:])))
    out = np.zeros(t.shape[0], dtype=acc)
    top = float(np.finfo(acc).max)
    rows = max(1, _CHUNK // max(1, t.shape[1]))       # bounded temporaries on a large sum
    with np.errstate(all="ignore"):
        for r0 in range(0, t.shape[0], rows):
            c = t[r0:r0 + rows]
            total = c.sum(axis=-1)
            # no running sum can leave acc's range where the sum of magnitudes stays inside it
            risky = ~(np.abs(c).sum(axis=-1) <= top)
            if risky.any():
                total[risky] = _in_order(c[risky], acc)
            out[r0:r0 + rows] = total.astype(acc)
    return out.reshape(lead)


def _in_order(rows: np.ndarray, acc: np.dtype) -> np.ndarray:
    """Each row of float64 terms added one at a time into an ``acc`` accumulator: the float64 running sum,
    except that from where it first leaves ``acc``'s range the accumulator holds the inf of that sign, and
    only an infinite term (the same inf, or NaN for the opposite one) changes it."""
    with np.errstate(all="ignore"):
        run = np.cumsum(rows, axis=-1)                  # add.accumulate: strictly in order
        if run.shape[-1] == 0:
            return np.zeros(run.shape[:-1])
        over = np.isfinite(run) & ~np.isfinite(run.astype(acc))
        first = np.take_along_axis(run, np.argmax(over, axis=-1)[..., None], axis=-1)[..., 0]
        tot = run[..., -1]
        return np.where(over.any(axis=-1), np.copysign(np.inf, first) + np.where(np.isfinite(tot), 0.0, tot), tot)


#: float64 elements a sequential sum handles at once
_CHUNK = 1 << 22


def _eval_node(n: Node, srcs: list, env: Mapping[str, int], fp64: bool, fused: tuple | None = None) -> np.ndarray:
    """One node's value from its sources' values; ``fused``: a contraction's MUL operands and shape (``_fused``),
    whose SUM does not read the product (which ``evaluate`` may not have materialised)."""
    u, a = n.uop, n.arg
    try:
        shape = tuple(dim_eval(d, env) for d in n.shape)
        for e in a.get("index_map", ()) if u == "VIEW" else ():
            e.subs({f"i{k}": 0 for k in range(len(shape))}).evaluate(env)
    except KeyError as e:   # a size symbol that no input's shape binds
        raise KumikoError("E1014", at=f"tiny:{n.id} ({u})", why=f"size symbol {e.args[0]} has no value",
                          suggestion="Bind it through an input's shape (or give it with --shapes).") from None
    if u == "CONST":
        return np.asarray(a["value"], dtype=_store(n.dtype, fp64))
    x = srcs[0]
    if u == "CAST":
        return ops.cast(x, n.dtype, dest=_store(n.dtype, fp64))
    if u in ops.ELEMENTWISE:
        return _elementwise(n, srcs, fp64)
    if u == "REDUCE":
        acc = _compute(n.dtype, fp64)
        axes = tuple(a.get("axes", ()))
        if a["op"] == "SUM" and fused is not None and axes:
            return _contract(fused[0], fused[1], axes, acc)
        xa = x.astype(acc)
        if not axes:
            return xa
        if a["op"] == "SUM":
            if fp64 or not n.dtype.is_float:
                return np.sum(xa, axis=axes, dtype=acc)
            return _sequential_sum(x.astype(np.float64), axes, acc)
        if any(x.shape[i] == 0 for i in axes):
            return np.full(shape, dtypes.neutral(a["op"], n.dtype), dtype=acc)
        return ops.REDUCE[a["op"]].np(xa, axis=axes)
    if u == "RESHAPE":
        return x.reshape(shape)
    if u == "PERMUTE":
        return np.transpose(x, a["perm"])
    if u == "EXPAND":
        return np.broadcast_to(x, shape)
    if u == "PAD":
        pads = [(dim_eval(lo, env), dim_eval(hi, env)) for lo, hi in a["pad"]]
        return np.pad(x, pads, mode="constant", constant_values=np.asarray(a.get("value", 0)).astype(x.dtype))
    if u == "SHRINK":
        step = a.get("step") or (1,) * x.ndim
        return x[tuple(slice(dim_eval(lo, env), dim_eval(hi, env), s) for lo, hi, s in zip(a["lo"], a["hi"], step))]
    if u == "FLIP":
        return np.flip(x, axis=tuple(a["axes"]))
    if u == "VIEW":
        idx = np.indices(shape, dtype=np.int64, sparse=True) if shape else []
        ienv = dict(env)
        ienv.update({f"i{k}": idx[k] for k in range(len(shape))})
        coords = []
        for e, size in zip(a["index_map"], x.shape):
            c = np.broadcast_to(np.asarray(e.evaluate(ienv)), shape)
            if c.size and (c.min() < 0 or c.max() >= size):
                raise KumikoError("E1401", at=f"tiny:{n.id} (VIEW)", why=f"index {e} leaves [0, {size})")
            coords.append(c)
        return x[tuple(coords)] if coords else np.broadcast_to(x, shape)
    if u == "GATHER":
        idx = srcs[1]
        ax = a["axis"]
        if idx.size and (idx.min() < 0 or idx.max() >= x.shape[ax]):
            raise KumikoError("E1401", at=f"tiny:{n.id} (GATHER)", why=f"an index leaves [0, {x.shape[ax]})")
        return np.take_along_axis(x, idx.astype(np.int64), axis=ax)
    raise KumikoError("E1006", at=f"tiny:{n.id}", why=f"the evaluator has no rule for {u}")


def _elementwise(n: Node, srcs: list, fp64: bool) -> np.ndarray:
    u = n.uop
    values = srcs[1:] if u == "WHERE" else srcs
    ref = next(s for s in values if isinstance(s, np.ndarray)).dtype
    cdt = np.dtype(np.float64) if ref == np.float64 else _compute(dtypes.from_numpy(ref), fp64)

    def arr(s, dt=cdt):
        return np.asarray(s, dtype=dt) if not isinstance(s, np.ndarray) else s.astype(dt, copy=False)

    with np.errstate(all="ignore"):
        if u == "WHERE":
            c = srcs[0] if isinstance(srcs[0], np.ndarray) else np.asarray(bool(srcs[0]))
            return ops.ELEMENTWISE[u].np(c, arr(srcs[1]), arr(srcs[2]))
        return ops.ELEMENTWISE[u].np(*(arr(s) for s in srcs))


def _interval(e, box: Mapping[str, tuple], env: Mapping[str, int]) -> tuple[int, int]:
    """Bounds of an affine + floordiv expression over a box of axis values (interval arithmetic)."""
    from kumiko.symbolic import Expr, FloorDiv, Sym
    e = Expr.lift(e)
    lo = hi = e.const
    for mono, c in e.terms:
        if len(mono) != 1:
            v = int(Expr((((mono, c),)), 0).evaluate({**env, **{k: b[1] for k, b in box.items()}}))
            lo, hi = lo + min(0, v), hi + max(0, v)
            continue
        a = mono[0]
        if isinstance(a, Sym):
            if a.name in box:
                r = box[a.name]
            else:
                r = (env[a.name], env[a.name]) if a.name in env else (0, 0)
        else:
            assert isinstance(a, FloorDiv)
            n_lo, n_hi = _interval(a.num, box, env)
            r = (n_lo // a.den, n_hi // a.den)
        lo, hi = lo + min(c * r[0], c * r[1]), hi + max(c * r[0], c * r[1])
    return lo, hi


def check_sizes(g: TinyGraph, env: Mapping[str, int]) -> None:
    """Concrete sizes a compiled kernel relies on without checking: no negative extent, slices inside
    their source, non-negative pads, VIEW windows inside their source (E1015 when the bound sizes break
    one; the evaluator finds the same through numpy, compiled code would read out of bounds)."""
    for nid, n in g.nodes.items():
        at = f"tiny:{nid} ({n.uop})"
        try:
            shape = [dim_eval(d, env) for d in n.shape]
        except KeyError as e:
            raise KumikoError("E1014", at=at, why=f"size symbol {e.args[0]} has no value") from None
        if any(d < 0 for d in shape):
            raise KumikoError("E1015", at=at, why=f"these input sizes make a negative extent {shape}")
        if n.uop not in ("SHRINK", "PAD", "VIEW"):
            continue
        src = [dim_eval(d, env) for d in g.nodes[n.src[0]].shape]
        if n.uop == "SHRINK":
            for k, (lo, hi) in enumerate(zip(n.arg["lo"], n.arg["hi"])):
                lo, hi = dim_eval(lo, env), dim_eval(hi, env)
                if not 0 <= lo <= hi <= src[k]:
                    sym = g.nodes[n.src[0]].shape[k]
                    raise KumikoError("E1015", at=at, why=f"slice [{lo}, {hi}) of axis {k} ([{n.arg['lo'][k]}, "
                                      f"{n.arg['hi'][k]})) leaves its size {src[k]} ({sym})",
                                      suggestion="Pass inputs large enough for the graph's slices.")
        elif n.uop == "PAD":
            if any(dim_eval(a, env) < 0 or dim_eval(b, env) < 0 for a, b in n.arg["pad"]):
                raise KumikoError("E1015", at=at, why="these input sizes make a negative padding")
        elif n.uop == "VIEW" and all(d > 0 for d in shape):
            box = {f"i{k}": (0, d - 1) for k, d in enumerate(shape)}
            for k, e in enumerate(n.arg["index_map"]):
                lo, hi = _interval(e, box, env)
                if lo < 0 or hi >= src[k]:
                    raise KumikoError("E1015", at=at, why=f"the view reads axis {k} at [{lo}, {hi}] beyond size "
                                      f"{src[k]}", suggestion="Pass inputs large enough for the graph's windows.")
