"""ONNX indexing and shape ops that exported transformers use: Split, Trilu, GatherElements, GatherND,
ScatterND, ScatterElements, ArgMax/ArgMin, Einsum, TopK (static K <= TOPK_MAX_K) and Tile.

Everything here is built from frontend ops (Slice, Gather, Elementwise where/compare, Reduce,
MatMul, Permute, Reshape); no Tiny IR op is added for ONNX. Three ideas carry most of it:

* **Index tensors.** An "iota" along one axis is an i32 param ``arange(n)`` when n is static and an
  exclusive CumSum of ones when it is a size symbol, so masks (Trilu) and arg-reductions
  (ArgMax/ArgMin/TopK) are comparisons of index tensors rather than data-dependent code.
* **Scatter with constant indices is a select.** The positions an ONNX scatter writes are known at
  import, so the result is ``where(mask, combine(data, take(updates, src)), data)`` with a constant
  mask and a constant source index per "layer" (the k-th write to a position, so duplicate indices
  reduce in ONNX's order). Run-time indices would need a data-dependent write, which Tiny IR lacks:
  E1010.
* **Einsum is transposes around MatMul.** Each pair of operands is permuted to
  ``[batch, kept-left, contracted]`` x ``[batch, contracted, kept-right]`` and multiplied, so the
  contraction is the ordinary MatMul (found by the kernels as MUL -> REDUCE(SUM)); letters that
  appear in one operand only are summed first.

Each op also has a numpy folder, so constant subgraphs (a Trilu'd causal mask over a
ConstantOfShape, a Split of a constant shape) fold at import like the rest.
"""
from __future__ import annotations

import numpy as np

from kumiko import dtypes
from kumiko.frontend.onnx_fold import _ints, folder
from kumiko.frontend.onnx_import import Importer
from kumiko.frontend.onnx_model import OnnxNode
from kumiko.frontend.onnx_ops import converter
from kumiko.symbolic import prod

_I32_MAX = int(np.iinfo(np.int32).max)


def _axis(node: OnnxNode, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise node.err("E1010", f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _static(node: OnnxNode, d, what: str) -> int:
    if not isinstance(d, int):
        raise node.err("E1011", f"{node.op_type} needs a static size for {what}, got {d}",
                       suggestion="give the model static sizes on this axis")
    return d


def _iota(imp: Importer, n, rank: int, axis: int) -> str:
    """i32 ``0..n-1`` laid along ``axis`` of a rank-``rank`` tensor of ones elsewhere: a constant when n
    is static, an exclusive prefix sum of ones when n is a size symbol."""
    shape = [1] * rank
    shape[axis] = n
    if isinstance(n, int):
        return imp._param(f"{imp.cur.name}::iota", np.arange(n, dtype=np.int32).reshape(shape))
    one = imp._param(f"{imp.cur.name}::one", np.ones((1,), np.int32))
    ramp = imp.emit("CumSum", [imp.emit("Expand", [one], shape=[n])], axis=0, exclusive=True)
    return imp.reshape(ramp, shape)


def _zero(dt: dtypes.DType):
    return False if dt is dtypes.bool_ else 0.0 if dt.is_float else 0


# ------------------------------------------------------------------------------------------------
# Split

def _split_sizes(node: OnnxNode, n: int, split: list[int] | None) -> list[int]:
    """ONNX's pieces: ``split`` as given (it must sum to the axis), else ``num_outputs`` (opset 18) or
    one piece per output, equal when they divide the axis, otherwise ceil-sized with a smaller last
    piece (onnx's reference rule)."""
    count = len(node.outputs)
    if split is not None:
        if len(split) != count or sum(split) != n or min(split, default=0) < 0:
            raise node.err("E1011", f"split {split} does not cut an axis of {n} into {count} outputs")
        return split
    if node.attr("num_outputs") is not None and int(node.attr("num_outputs")) != count:
        raise node.err("E1009", f"num_outputs={node.attr('num_outputs')} but the node has {count} outputs")
    chunk = -(-n // count)
    sizes = [chunk] * (count - 1) + [n - chunk * (count - 1)]
    if sizes[-1] < 0:
        raise node.err("E1011", f"an axis of {n} cannot be split into {count} pieces of {chunk}")
    return sizes


def _split_arg(node: OnnxNode, v) -> list[int] | None:
    return _ints(v) if v is not None else node.ints("split")


@converter("Split", attrs="axis split num_outputs")
def conv_split(imp: Importer, node: OnnxNode) -> list[str]:
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    axis = _axis(node, int(node.attr("axis", 0)), len(shape))
    split = _split_arg(node, imp.const(node.input(1), "split") if node.input(1) else None)
    sizes = _split_sizes(node, _static(node, shape[axis], f"axis {axis}"), split)
    starts = np.cumsum([0, *sizes]).tolist()
    return [imp.emit("Slice", [x], starts=[s], ends=[e], axes=[axis], steps=[1]) for s, e in zip(starts, starts[1:])]


@folder("Split")
def fold_split(node: OnnxNode, v: list) -> list:
    x = v[0]
    axis = _axis(node, int(node.attr("axis", 0)), x.ndim)
    sizes = _split_sizes(node, x.shape[axis], _split_arg(node, v[1] if len(v) > 1 else None))
    return np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)


# ------------------------------------------------------------------------------------------------
# Trilu

def _trilu_k(imp: Importer, node: OnnxNode) -> int:
    if not node.input(1):
        return 0
    k = _ints(imp.const(node.input(1), "k", "E1010"))
    if len(k) != 1:
        raise node.err("E1010", f"Trilu's k must be one value, got {k}")
    return k[0]


@converter("Trilu", attrs="upper")
def conv_trilu(imp: Importer, node: OnnxNode) -> str:
    """``where(col - row >= k, x, 0)`` (upper) or ``<= k`` (lower) over iota tensors of the last two axes."""
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    if len(shape) < 2:
        raise node.err("E1011", f"Trilu needs a rank >= 2 input, got rank {len(shape)}")
    k = _trilu_k(imp, node)
    row, col = _iota(imp, shape[-2], 2, 0), _iota(imp, shape[-1], 2, 1)
    mask = imp.ew("ge" if node.attr("upper", 1) else "le", imp.ew("sub", col, row), k)
    return imp.ew("where", mask, x, _zero(imp.dtype(x)))


@folder("Trilu")
def fold_trilu(node: OnnxNode, v: list) -> list:
    k = int(np.asarray(v[1]).reshape(-1)[0]) if len(v) > 1 and v[1] is not None else 0
    return [(np.triu if node.attr("upper", 1) else np.tril)(v[0], k).astype(v[0].dtype)]


# ------------------------------------------------------------------------------------------------
# GatherElements, GatherND

@converter("GatherElements", attrs="axis")
def conv_gather_elements(imp: Importer, node: OnnxNode) -> str:
    """The frontend's torch.gather; ONNX lets indices be shorter than data on the other axes, so data is
    first cut to the indices' extent there."""
    x, idx = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    xs, ins = imp.shape(x), imp.shape(idx)
    if len(xs) != len(ins):
        raise node.err("E1011", f"indices have rank {len(ins)}, data rank {len(xs)}")
    axis = _axis(node, int(node.attr("axis", 0)), len(xs))
    cut = [k for k, (p, q) in enumerate(zip(xs, ins)) if k != axis and p != q]
    if cut:
        x = imp.emit("Slice", [x], starts=[0] * len(cut), ends=[ins[k] for k in cut], axes=cut, steps=[1] * len(cut))
    return imp.emit("Gather", [x, idx], axis=axis, mode="elements")


@folder("GatherElements")
def fold_gather_elements(node: OnnxNode, v: list) -> list:
    x, idx = v[0], v[1].astype(np.int64)
    axis = _axis(node, int(node.attr("axis", 0)), x.ndim)
    x = x[tuple(slice(None) if k == axis else slice(0, d) for k, d in enumerate(idx.shape))]
    return [np.take_along_axis(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)]


@converter("GatherND", attrs="batch_dims")
def conv_gather_nd(imp: Importer, node: OnnxNode) -> str:
    """The K index components become one linear index into data's K indexed axes (flattened, so they
    need static sizes); batch_dims 0 is then a take, batch_dims b > 0 a torch.gather per flattened batch."""
    x, idx = imp.tensor(node.input(0)), imp.tensor(node.input(1))
    xs, ins = imp.shape(x), imp.shape(idx)
    b = int(node.attr("batch_dims", 0))
    if not ins or not 0 <= b < min(len(xs), len(ins)):
        raise node.err("E1010", f"batch_dims {b} must be below the ranks of data ({len(xs)}) and indices ({len(ins)})")
    k = _static(node, ins[-1], "the last axis of indices")
    if not 1 <= k <= len(xs) - b:
        raise node.err("E1011", f"indices address {k} axes; data has {len(xs) - b} after {b} batch axes")
    if list(xs[:b]) != list(ins[:b]):
        raise node.err("E1011", f"batch axes differ: data {[str(d) for d in xs[:b]]}, "
                       f"indices {[str(d) for d in ins[:b]]}")
    dims = [_static(node, d, "an indexed axis of data") for d in xs[b:b + k]]
    rest, lead = list(xs[b + k:]), list(ins[:-1])
    lin = None
    for c, size in enumerate(dims):
        comp = imp.reshape(imp.emit("Slice", [idx], starts=[c], ends=[c + 1], axes=[len(ins) - 1], steps=[1]), lead)
        comp = imp.ew("where", imp.ew("lt", comp, 0), imp.ew("add", comp, size), comp)
        stride = int(np.prod(dims[c + 1:], dtype=np.int64))
        term = comp if stride == 1 else imp.ew("mul", comp, stride)
        lin = term if lin is None else imp.ew("add", lin, term)
    flat = int(np.prod(dims, dtype=np.int64))
    if b == 0:
        return imp.emit("Gather", [imp.reshape(x, [flat, *rest]), lin], axis=0, mode="take")
    nb, ni = prod(xs[:b]), prod(lead[b:])
    li = imp.emit("Expand", [imp.reshape(lin, [nb, ni] + [1] * len(rest))], shape=[nb, ni, *rest])
    g = imp.emit("Gather", [imp.reshape(x, [nb, flat, *rest]), li], axis=1, mode="elements")
    return imp.reshape(g, [*lead, *rest])


# ------------------------------------------------------------------------------------------------
# ScatterND, ScatterElements (constant indices)

_COMBINE = {"none": None, "add": "add", "mul": "mul", "max": "max", "min": "min"}
_NP_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_writes(node: OnnxNode, shape: tuple, idx: np.ndarray, upd_shape: tuple) -> np.ndarray:
    """The flat output position of each update element, in ONNX's write order (indices in C order)."""
    idx = np.asarray(idx, dtype=np.int64)
    if node.op_type == "ScatterND":
        k = idx.shape[-1] if idx.ndim else 0
        if idx.ndim == 0 or not 1 <= k <= len(shape):
            raise node.err("E1011", f"ScatterND indices {list(idx.shape)} do not address data {list(shape)}")
        want = tuple(idx.shape[:-1]) + tuple(shape[k:])
        lead = idx.reshape(-1, k)
        dims = np.asarray(shape[:k], dtype=np.int64)
        lead = np.where(lead < 0, lead + dims, lead)
        if ((lead < 0) | (lead >= dims)).any():
            raise node.err("E1010", "ScatterND indices are out of range for the data")
        inner = int(np.prod(shape[k:], dtype=np.int64))
        lin = np.ravel_multi_index(tuple(lead.T), shape[:k]) if lead.size else np.zeros(0, np.int64)
        pos = (lin[:, None] * inner + np.arange(inner)[None, :]).reshape(-1)
    else:
        axis = _axis(node, int(node.attr("axis", 0)), len(shape))
        want = tuple(idx.shape)
        if idx.ndim != len(shape) or any(i > d for k, (i, d) in enumerate(zip(idx.shape, shape)) if k != axis):
            raise node.err("E1011", f"ScatterElements indices {list(idx.shape)} do not fit data {list(shape)}")
        n = shape[axis]
        i = np.where(idx < 0, idx + n, idx)
        if ((i < 0) | (i >= n)).any():
            raise node.err("E1010", "ScatterElements indices are out of range for the data")
        coords = list(np.indices(idx.shape))
        coords[axis] = i
        pos = np.ravel_multi_index(tuple(coords), shape).reshape(-1)
    if tuple(upd_shape) != want:
        raise node.err("E1011", f"updates have shape {list(upd_shape)}, expected {list(want)}")
    return pos


def _layers(pos: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(positions, update indices) of the first, second, ... write to each position: within a layer no
    position repeats, and applying layers in order is ONNX's sequential write."""
    order = np.argsort(pos, kind="stable")
    sp = pos[order]
    first = np.r_[0, np.flatnonzero(sp[1:] != sp[:-1]) + 1] if sp.size else np.zeros(0, np.int64)
    rank = np.arange(sp.size) - np.repeat(first, np.diff(np.r_[first, sp.size]))
    return [(sp[rank == d], order[rank == d]) for d in range(int(rank.max()) + 1 if rank.size else 0)]


def _reduction(node: OnnxNode) -> str:
    r = node.attr("reduction", "none")
    if r not in _COMBINE:
        raise node.err("E1010", f"reduction {r!r} is not supported (none, add, mul, max, min)")
    return r


@converter("ScatterND", "ScatterElements", attrs="axis reduction")
def conv_scatter(imp: Importer, node: OnnxNode) -> str:
    if node.op_type == "ScatterND" and "axis" in node.attrs:
        raise node.err("E1010", "ScatterND has no axis attribute")
    red = _reduction(node)
    idx = imp._try_const(node.input(1), set())[0]
    if idx is None:
        raise node.err("E1010", f"{node.op_type} with run-time indices is not supported: kumiko expresses a "
                       "scatter as a select over positions known at import, and Tiny IR has no data-dependent "
                       "write", suggestion="make the indices a constant (an initializer or a folded subgraph)")
    x, upd = imp.tensor(node.input(0)), imp.tensor(node.input(2))
    shape = tuple(_static(node, d, "data") for d in imp.shape(x))
    pos = _scatter_writes(node, shape, idx, imp.shape(upd))
    flat = imp.reshape(upd, [int(np.prod(imp.shape(upd), dtype=np.int64))])
    y = x
    for where_, src in _layers(pos):
        mask = np.zeros(int(np.prod(shape, dtype=np.int64)), bool)
        index = np.zeros(mask.size, np.int32)
        mask[where_], index[where_] = True, src
        m = imp._param(f"{node.name}::mask", mask.reshape(shape))
        taken = imp.emit("Gather", [flat, imp._param(f"{node.name}::src", index.reshape(shape))], axis=0, mode="take")
        y = imp.ew("where", m, taken if red == "none" else imp.ew(_COMBINE[red], y, taken), y)
    return y


@folder("ScatterND", "ScatterElements")
def fold_scatter(node: OnnxNode, v: list) -> list:
    red = _reduction(node)
    x, upd = v[0], v[2]
    pos = _scatter_writes(node, x.shape, v[1], upd.shape)
    out, u = x.reshape(-1).copy(), upd.reshape(-1)
    for where_, src in _layers(pos):
        out[where_] = u[src] if red == "none" else _NP_COMBINE[red](out[where_], u[src])
    return [out.reshape(x.shape)]


# ------------------------------------------------------------------------------------------------
# ArgMax, ArgMin, TopK

def _arg(imp: Importer, x: str, axis: int, keepdim: bool, fn: str, last: bool) -> str:
    """The first (or last) index along ``axis`` where x equals its max (min): the extreme by Reduce,
    then the min (max) of ``where(x == extreme, iota, sentinel)``."""
    shape = imp.shape(x)
    ext = imp.emit("Reduce", [x], fn=fn, axes=[axis], keepdim=True)
    hit = imp.ew("eq", x, ext)
    cand = imp.ew("where", hit, _iota(imp, shape[axis], len(shape), axis), -1 if last else _I32_MAX)
    return imp.emit("Reduce", [cand], fn="max" if last else "min", axes=[axis], keepdim=keepdim)


@converter("ArgMax", "ArgMin", attrs="axis keepdims select_last_index")
def conv_argmax(imp: Importer, node: OnnxNode) -> str:
    x = imp.tensor(node.input(0))
    axis = _axis(node, int(node.attr("axis", 0)), len(imp.shape(x)))
    return _arg(imp, x, axis, bool(node.attr("keepdims", 1)), "max" if node.op_type == "ArgMax" else "min",
                bool(node.attr("select_last_index", 0)))


@folder("ArgMax", "ArgMin")
def fold_argmax(node: OnnxNode, v: list) -> list:
    x = v[0]
    axis = _axis(node, int(node.attr("axis", 0)), x.ndim)
    f = np.argmax if node.op_type == "ArgMax" else np.argmin
    if node.attr("select_last_index", 0):
        i = x.shape[axis] - 1 - f(np.flip(x, axis), axis=axis)
    else:
        i = f(x, axis=axis)
    return [np.expand_dims(i, axis).astype(np.int64) if node.attr("keepdims", 1) else i.astype(np.int64)]


#: the largest K TopK builds: each of the K rounds is a max reduction, a compare and two selects over the
#: whole input, so the cost grows as K times the input (a sort would not, but Tiny IR has none)
TOPK_MAX_K = 32


@converter("TopK", attrs="axis largest sorted")
def conv_topk(imp: Importer, node: OnnxNode) -> list[str]:
    """K rounds of arg-max-and-mask for a static K <= TOPK_MAX_K: round r takes the max (min) of what
    is not yet taken and its lowest index among the untaken (ONNX's order for ties), then marks that
    index taken. Values and indices come out sorted (largest first, or smallest for ``largest=0``),
    which ``sorted=0`` also allows. NaN is not ordered (ONNX puts it first; here it is never the max)."""
    k = _ints(imp.const(node.input(1), "K"))
    if len(k) != 1 or k[0] < 1:
        raise node.err("E1010", f"TopK needs one K >= 1, got {k}")
    k = k[0]
    if k > TOPK_MAX_K:
        raise node.err("E1010", f"TopK with K={k} is not supported: kumiko builds K rounds of a max reduction "
                       f"and a mask, up to K={TOPK_MAX_K} (a larger K needs a sort, which Tiny IR does not have)",
                       suggestion=f"use K <= {TOPK_MAX_K}, or compute the top-K outside the model")
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    axis = _axis(node, int(node.attr("axis", -1)), len(shape))
    if isinstance(shape[axis], int) and k > shape[axis]:
        raise node.err("E1011", f"TopK's K={k} exceeds the size {shape[axis]} of axis {axis}")
    largest = bool(node.attr("largest", 1))
    fn = "max" if largest else "min"
    if k == 1:
        values = imp.emit("Reduce", [x], fn=fn, axes=[axis], keepdim=True)
        return [values, _arg(imp, x, axis, True, fn, False) if node.wants_output(1) else None]
    dt = imp.dtype(x)
    worst = dtypes.neutral("MAX" if largest else "MIN", dt).item()
    iota = _iota(imp, shape[axis], len(shape), axis)
    cur, taken, vals, idxs = x, None, [], []
    for r in range(k):
        ext = imp.emit("Reduce", [cur], fn=fn, axes=[axis], keepdim=True)
        cand = imp.ew("where", imp.ew("eq", cur, ext), iota, _I32_MAX)
        if taken is not None:
            cand = imp.ew("where", taken, _I32_MAX, cand)
        idx = imp.emit("Reduce", [cand], fn="min", axes=[axis], keepdim=True)
        vals.append(ext)
        idxs.append(idx)
        if r + 1 < k:
            hit = imp.ew("eq", iota, idx)
            cur = imp.ew("where", hit, worst, cur)
            taken = hit if taken is None else imp.ew("where", hit, True, taken)
    values = imp.emit("Concat", vals, axis=axis)
    return [values, imp.emit("Concat", idxs, axis=axis) if node.wants_output(1) else None]


# ------------------------------------------------------------------------------------------------
# Tile

@converter("Tile")
def conv_tile(imp: Importer, node: OnnxNode) -> str:
    """numpy.tile with constant repeats: [d0, d1, ...] -> [1, d0, 1, d1, ...] -> expand to
    [r0, d0, r1, d1, ...] -> reshape to [r0*d0, r1*d1, ...]."""
    x = imp.tensor(node.input(0))
    shape = imp.shape(x)
    reps = _ints(imp.const(node.input(1), "repeats", "E1010"))
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise node.err("E1010", f"Tile's repeats {reps} must give one count >= 0 per axis of the rank-{len(shape)} "
                       "input")
    if 0 in reps:
        raise node.err("E1011", f"Tile's repeats {reps} make an empty tensor")
    y = imp.reshape(x, tuple(e for d in shape for e in (1, d)))
    y = imp.emit("Expand", [y], shape=[e for r, d in zip(reps, shape) for e in (r, d)])
    return imp.reshape(y, tuple(prod([r, d]) for r, d in zip(reps, shape)))


@folder("Tile")
def fold_tile(node: OnnxNode, v: list) -> list:
    return [np.tile(v[0], [int(r) for r in v[1].reshape(-1)])]


# ------------------------------------------------------------------------------------------------
# Einsum

def _einsum_terms(node: OnnxNode, n: int) -> tuple[list[str], str]:
    eq = str(node.attr("equation", "")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if "." in eq:
        raise node.err("E1010", f"Einsum equation {eq!r}: ellipsis ('...') is not supported",
                       suggestion="spell every axis with a letter")
    if len(terms) != n:
        raise node.err("E1009", f"Einsum equation {eq!r} has {len(terms)} operands, the node {n}")
    for t in (*terms, rhs):
        if not all(c.isalpha() for c in t):
            raise node.err("E1010", f"Einsum equation {eq!r} is malformed")
        if len(set(t)) != len(t):
            raise node.err("E1010", f"Einsum equation {eq!r} repeats a letter in one term ({t!r}): diagonals and "
                           "traces are not supported")
    if not arrow:                   # implicit output: the letters used once, in alphabetical order
        rhs = "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))
    if set(rhs) - set(lhs):
        raise node.err("E1010", f"Einsum output letters {sorted(set(rhs) - set(lhs))} appear in no operand")
    return terms, rhs


def _sum_out(imp: Importer, x: str, lx: str, keep: set) -> tuple[str, str]:
    drop = [k for k, c in enumerate(lx) if c not in keep]
    if not drop:
        return x, lx
    return imp.emit("Reduce", [x], fn="sum", axes=drop, keepdim=False), "".join(c for c in lx if c in keep)


def _contract(imp: Importer, a: str, la: str, b: str, lb: str, keep: set) -> tuple[str, str]:
    """a (letters la) x b (letters lb), summing the shared letters not in ``keep``, as one MatMul."""
    a, la = _sum_out(imp, a, la, set(lb) | keep)
    b, lb = _sum_out(imp, b, lb, set(la) | keep)
    size = dict(zip(la, imp.shape(a)))
    for c, d in zip(lb, imp.shape(b)):
        if size.setdefault(c, d) != d:
            raise imp.err("E1011", f"Einsum letter {c!r} has sizes {size[c]} and {d}")
    batch = [c for c in la if c in lb and c in keep]
    con = [c for c in la if c in lb and c not in keep]
    ma, nb = [c for c in la if c not in lb], [c for c in lb if c not in la]
    bs = [size[c] for c in batch]
    am = imp.permute(a, [la.index(c) for c in batch + ma + con])
    bm = imp.permute(b, [lb.index(c) for c in batch + con + nb])
    am = imp.reshape(am, bs + [prod([size[c] for c in ma]), prod([size[c] for c in con])])
    bm = imp.reshape(bm, bs + [prod([size[c] for c in con]), prod([size[c] for c in nb])])
    y = imp.emit("MatMul", [am, bm])
    return imp.reshape(y, bs + [size[c] for c in ma + nb]), "".join(batch + ma + nb)


@converter("Einsum", attrs="equation")
def conv_einsum(imp: Importer, node: OnnxNode) -> str:
    """Operands are contracted left to right (each step keeps the letters later operands or the output
    still need); what is left is summed and permuted to the output's order."""
    names = [n for n in node.inputs if n]
    terms, rhs = _einsum_terms(node, len(names))
    xs = [imp.tensor(n) for n in names]
    for x, t in zip(xs, terms):
        if len(imp.shape(x)) != len(t):
            raise node.err("E1011", f"Einsum term {t!r} names {len(t)} axes, its operand has rank {len(imp.shape(x))}")
    y, ly = xs[0], terms[0]
    for k in range(1, len(xs)):
        keep = set(rhs).union(*terms[k + 1:])
        y, ly = _contract(imp, y, ly, xs[k], terms[k], keep)
    y, ly = _sum_out(imp, y, ly, set(rhs))
    return imp.permute(y, [ly.index(c) for c in rhs])


@folder("Einsum")
def fold_einsum(node: OnnxNode, v: list) -> list:
    terms, rhs = _einsum_terms(node, len([a for a in v if a is not None]))
    return [np.asarray(np.einsum(f"{','.join(terms)}->{rhs}", *[a for a in v if a is not None]))]
