"""Region formation: partition a TinyGraph into regions (one region = one kernel) and write each as
Region Buffer SSA.

A region is grown backwards from a *root* (a materialised value). Everything the root needs is
*inlined* by index propagation: the iteration point is pushed through movement ops with the
IndexBook's per-op rules (``kumiko.region.index``), pads become ``Select`` guards, reductions get
fresh axes. A value is instead made a root of its own and read through a MemRef by one of these
stated, deterministic rules (each recorded in the region's notes for ``kumiko explain``):

- R-out      graph outputs are materialised (gmem).
- R-contract a value holding a reduction, read inside another reduction over axes it lacks (a
             contraction operand: inlining would recompute it per missing axis), is materialised;
             ``deferred`` when it has a single consumer (seed 001 §6.8.3: attention's P).
- R-contract a second contraction (a sum of products whose two factors each lack one of the axes in
             scope: a GEMM or a convolution) anywhere in a region that already holds one is materialised:
             a kernel runs one contraction's micro-kernel, and a second one would run as scalar loops in
             its epilogue (ResNet's downsampling shortcut added to the block's last 1x1 conv: 28 ms fused,
             under 1 ms as a kernel of its own); so is a contraction under a pad guard (a Concat branch):
             the micro-kernel computes all of its kernel's output; and one inside another reduction in a
             region that also reduces over its own iters (SqueezeNet's conv -> pool -> channel softmax).
- R-window   a value holding a reduction, read inside another reduction with all of its axes, is fused
             (computed at the consumer) when Poly Core's compute-at report says it is legal and needs
             no recompute (buffer class ``reg``: Conv -> ReLU -> MaxPool 2x2/2); otherwise (overlapping
             windows) it is materialised. Where Poly Core cannot analyse the pair (non-SCoP), the same
             criterion is applied to the index map directly (injective over the consumer's box).
- R-pool     (the cpu target's) a value holding a contraction, summed whole over 2 to ``pool_points`` - 1 (a
             global average pool over a conv's 7x7 pixels: each reduce axis the plain index of a dimension of
             its size, not a window's ``oh + kh``), is materialised: fused, the pool's points were the
             micro-kernel's lanes (49 of 64), and apart ran 0.74-0.76 of the time.
- R-gather   the data operand of a GATHER is read through a data-dependent index (non-SCoP): it must
             be a MemRef.
- R-fanout   a value that several regions need is recomputed in each when it is cheap (no reduction,
             no gather below it) and narrow (it reads at most ``MAX_RECOMPUTE_READS`` tensors of
             comparable size), else materialised once. Without the width bound a transformer's residual
             stream, an add chain through every layer, was recomputed from all of its terms in every
             LayerNorm: quadratic in the depth. Inside one region a value is never
             recomputed: the same (value, index) is one shared let (seed 001 §6.7.6), and a value
             holding a reduction needed at a second point of one region (LRN's shifted channels under
             pad guards) is materialised.
- R-reshape  a reshape that merges symbolic axes has no affine inverse: its source is materialised and
             read through its flat row-major offset.
- R-depth    a value ``MAX_DEPTH`` nested inlinings below its region's root is materialised: every pass
             over a region (here, SRNF, verification, playback, kernel emission, rendering) walks its
             expressions recursively, so a region's depth is bounded; a chain of thousands of ops becomes a
             chain of kernels of bounded depth instead of a RecursionError.
- R-index    a movement value whose source index would grow past ``MAX_INDEX_TERMS`` terms is
             materialised. Index maps are simplified with the iterators' ranges (a reshape round trip
             gives the plain index back), but a chain of genuine permutations (reshape -> transpose ->
             reshape, repeated) can compose to floor expressions that double per step.

Points are compared modulo size-1 axes: a coordinate on an axis of extent 1 is the same point whatever
it holds (``0`` from an EXPAND/RESHAPE of a unit dim, or the size-1 iterator), so a ``(1, H, S, D)``
graph forms the same regions as a ``(B, H, S, D)`` one. A top-level reduction whose body holds a
reduction and lacks some iters (LayerNorm's variance, LogSoftmax's sum) reduces over those iters, its
body a top-level let (the seed 001 §6.8.3 form), instead of materialising the body by R-contract.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from kumiko import dtypes, ops
from kumiko.region.groups import split_groups
from kumiko.region.index import injective, move_index
from kumiko.region.pairview import compute_at_verdict
from kumiko.region.srnf import children, normalize
from kumiko.region.ssa import (
    Axis,
    Binary,
    Cast,
    Const,
    Gather,
    Guard,
    Let,
    MemRef,
    Output,
    Program,
    Read,
    Reduce,
    Ref,
    Region,
    RExpr,
    Select,
    Unary,
    Yield,
)
from kumiko.symbolic import Expr, expr_size
from kumiko.tiny.ir import MOVEMENT, Node, TinyGraph, is_ref
from kumiko.util import reachable

#: the most tensors of comparable size (at least 1/8 of the value's elements) a value recomputed in several
#: regions may read (R-fanout)
MAX_RECOMPUTE_READS = 2
#: the most nested inlinings one region holds (R-depth); real regions stay far below (attention: ~30)
MAX_DEPTH = 96
#: the most terms (floor numerators included) one source index of a movement op may have (R-index);
#: the examples' indices have fewer than 10
MAX_INDEX_TERMS = 256
#: the cpu target's R-pool bound (``form_regions``' ``pool_points``): a contraction pooled whole (a global
#: average pool over all of its pixels) over fewer points than this is materialised: fused, the pool's points
#: are the micro-kernel's lanes (7 x 7: 49 of 64), and the conv and the pool apart ran 0.74-0.76 of the time of
#: the fused kernel (ResNet-50's and MobileNetV2's last convs, 2-core Zen 3); over 14 x 14 and 56 x 56 pixels
#: fused is the faster. The GPU targets keep the pool fused (their window tiles: ``kumiko.plan.gpu``)
GLOBAL_POOL_POINTS = 64


def _neutral(op: str, dt) -> object:
    """The reduction's identity in its accumulator dtype (-inf for a float max, INT_MIN for i32, False for bool)."""
    return dtypes.neutral(op, dt).item()


class NeedsRoot(Exception):
    """Raised while inlining when a value must be materialised; formation restarts with it as a root."""

    def __init__(self, nid: str, rule: str, why: str, deferred: bool = False):
        super().__init__(why)
        self.nid, self.rule, self.why, self.deferred = nid, rule, why, deferred


@dataclass
class _Build:
    """The state of building one region."""
    root: str
    iters: tuple                                    # names of the root's axes
    sizes: dict = field(default_factory=dict)       # every axis name -> size
    lets: list = field(default_factory=list)
    shared: dict = field(default_factory=dict)      # (nid, index) -> let name (top level only)
    reads: dict = field(default_factory=dict)       # MemRef name -> nid
    inlined: set = field(default_factory=set)       # compute nodes built into this region
    n_red: int = 0
    n_gather: int = 0
    guarded: int = 0                                # > 0 while inlining under a pad/slice guard
    consumers: list = field(default_factory=list)   # the reductions being built, innermost last
    depth: int = 0                                  # nested ``inline`` calls in progress (R-depth)
    contraction: str | None = None                  # the top-level contraction this region holds (R-contract)
    points: dict = field(default_factory=dict)      # nid -> the point a value holding a reduction is built at
    rows: bool = False                              # a reduction over the region's iters (§6.8.3 row form)
    nested: str | None = None                       # a contraction built inside another reduction


def _free(index: tuple) -> set:
    out: set[str] = set()
    for e in index:
        out |= Expr.lift(e).symbols()
    return out


def _unit_free(index: tuple, shape: tuple, sizes: dict) -> tuple:
    """The point ``index`` names, written canonically: a coordinate on an axis of extent 1 is 0 whatever
    expression it holds (``0`` from an EXPAND/RESHAPE of a unit dim, or the size-1 iterator ``i0``), and
    an axis of extent 1 (an iter or a reduction axis) is 0 wherever it appears. Two indices of one value
    are the same point iff their canonical forms are equal; used for the shared-let key and the
    injectivity check, so unit batch axes do not stop fusion."""
    unit = {a: 0 for a, s in sizes.items() if s == 1}
    return tuple(Expr.lift(0) if d == 1 else Expr.lift(e).subs(unit) for e, d in zip(index, shape))


def _lacks_an_iter(e: RExpr, iters: tuple, sizes: dict) -> bool:
    """Does ``e`` read memory only, through indices that leave out a non-unit iter (an operand a
    contraction reuses along that iter)? An operand holding a let (which has every iter) does not."""
    free: set[str] = set()
    stack, reads = [e], 0
    while stack:
        x = stack.pop()
        if isinstance(x, Ref):
            return False
        if isinstance(x, Read):
            reads += 1
            free |= _free(x.index)
        stack.extend(children(x))
    return reads > 0 and any(a not in free and sizes[a] != 1 for a in iters)


def _contraction(body: RExpr, iters: tuple, sizes: dict) -> bool:
    """Is a sum over ``body`` a contraction: a product of two factors, each reused along some iter?"""
    while isinstance(body, Cast):
        body = body.x
    return (isinstance(body, Binary) and body.fn == "mul" and _lacks_an_iter(body.x, iters, sizes)
            and _lacks_an_iter(body.y, iters, sizes))


def _top_level(index: tuple, shape: tuple, iters: tuple) -> bool:
    """Is the index a plain point of the region's iteration space (iter names, 0 on unit axes)? Then the
    value is a top-level let over those iters, shared by every use at the same point."""
    return all(Expr.lift(e).as_symbol() in iters or (d == 1 and Expr.lift(e) == 0) for e, d in zip(index, shape))


class Former:
    def __init__(self, g: TinyGraph, pool_points: int = 0):
        self.g = g
        self.pool_points = pool_points      # R-pool's bound (0: the rule is off; the target's choice)
        self.users = self._compute_users()
        self.out_names: dict[str, list] = {}
        # an output that *is* the input of the same name needs no kernel (the executable returns the input)
        self.outputs = tuple((t, nid) for t, nid in g.outputs
                             if not (g.nodes[nid].uop == "INPUT" and g.nodes[nid].arg["tensor_id"] == t))
        for t, nid in self.outputs:
            self.out_names.setdefault(nid, []).append(t)
        self.roots: dict[str, tuple[str, str, bool]] = {}
        for t, nid in self.outputs:
            self.roots.setdefault(nid, ("R-out", f"graph output {t}", False))
        self._cheap: dict[str, bool] = {}
        self._wide: dict[str, frozenset | None] = {}     # nid -> the comparable tensors it reads; None: too many
        self._poly: dict = {}
        self._moves: dict = {}      # ``_move``'s memo
        self.fused_by_poly: list[str] = []

    def _move(self, n: Node, index: tuple, sizes: Mapping) -> tuple:
        """``move_index`` memoized for this formation: a restart builds regions again with the same indices
        (GPT-2's 109 regions took 385 builds, which asked 11,171 moves of 1,133 distinct node and index
        pairs). The key holds the extents of the index's own iterators, the only ones its simplification
        reads."""
        syms = frozenset().union(*(Expr.lift(i).symbols() for i in index))
        key = (n.id, index, tuple(sorted((a, sizes[a]) for a in syms if a in sizes)))
        got = self._moves.get(key)
        if got is None:
            got = self._moves[key] = move_index(self.g, n, index, sizes)
        return got

    def _compute_users(self) -> dict[str, set]:
        """Compute-node consumers of each node, looking through movement chains."""
        direct = self._direct = self.g.consumers()
        out: dict[str, set] = {}
        def moves(u: str) -> bool:
            return self.g.nodes[u].uop in MOVEMENT

        for nid in self.g.nodes:
            out[nid] = {u for u in reachable(direct[nid], lambda u: direct[u] if moves(u) else ()) if not moves(u)}
        return out

    def buffer(self, nid: str) -> str:
        n = self.g.nodes[nid]
        if n.uop == "INPUT":
            return n.arg["tensor_id"]
        return self.out_names[nid][0] if nid in self.out_names else f"t_{nid}"

    def cheap(self, nid: str) -> bool:
        """No reduction or gather below, down to inputs and roots: recomputing it is cheap. A memoized
        post-order with an explicit stack, since a chain may be longer than Python's recursion limit."""
        stack = [nid]
        while stack:
            top = stack[-1]
            if top in self._cheap:
                stack.pop()
                continue
            n = self.g.nodes[top]
            todo = [s for s in n.refs if s not in self.roots and s not in self._cheap]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            self._cheap[top] = n.uop not in ("REDUCE", "GATHER") and all(
                s in self.roots or self._cheap[s] for s in n.refs)
        return self._cheap[nid]

    # inlining ------------------------------------------------------------------------------------
    def inline(self, b: _Build, nid: str, index: tuple, scope: tuple) -> RExpr:
        n = self.g.nodes[nid]
        if n.uop == "INPUT" or (nid in self.roots and nid != b.root):
            b.reads[self.buffer(nid)] = nid
            return Read(self.buffer(nid), tuple(index))
        if n.uop == "CONST":
            return Const(n.arg["value"], n.dtype)
        if b.depth >= MAX_DEPTH:
            raise NeedsRoot(nid, "R-depth", f"{nid} is {b.depth} nested ops below {b.root}: materialised so that "
                            f"no kernel nests deeper than {MAX_DEPTH}")
        b.depth += 1
        try:
            return self._inline(b, n, nid, index, scope)
        finally:
            b.depth -= 1

    def _inline(self, b: _Build, n: Node, nid: str, index: tuple, scope: tuple) -> RExpr:
        if n.uop in MOVEMENT:
            return self.movement(b, n, index, scope)
        key = (nid, _unit_free(index, n.shape, b.sizes))
        if key in b.shared:
            return Ref(b.shared[key])
        inside = len(scope) > len(b.iters)
        if nid != b.root and not self.cheap(nid):
            # a value holding a reduction is built at one point of a kernel: at a second one (a channel
            # window under pad guards, LRN's sum of shifted squares) it would be recomputed, its whole
            # reduction again, for each (seed 001 §6.7.6): materialised once instead
            if b.points.setdefault(nid, key[1]) != key[1]:
                raise NeedsRoot(nid, "R-fanout", f"{nid} holds a reduction and is needed at two different "
                                "points of one kernel: materialised once")
            if inside:
                self.check_fusable(b, nid, index, scope)
        b.inlined.add(nid)
        expr = self.compute(b, n, index, scope)
        # a value valid only under a guard stays in the guarded branch: as a top-level let it would be
        # evaluated (and read out of bounds) where the guard is false
        if not inside and not b.guarded and nid != b.root and (
                _top_level(index, n.shape, b.iters) or (n.uop == "REDUCE" and _free(index) <= set(b.iters))):
            name = f"v_{nid}"
            taken = {x.name for x in b.lets}
            if name in taken and not self.cheap(nid):
                # a reducing value needed at two different points of one kernel (e.g. t + t^T): computing it
                # twice is what seed 001 §6.7.6 forbids, so it is materialised once
                raise NeedsRoot(nid, "R-fanout", f"{nid} holds a reduction and is needed at two different "
                                "points of one kernel: materialised once")
            k = 1
            while name in taken:        # a cheap value at another point: recomputed, its own let
                name, k = f"v_{nid}_{k}", k + 1
            b.lets.append(Let(name, expr))
            b.shared[key] = name
            return Ref(name)
        return expr

    def check_fusable(self, b: _Build, nid: str, index: tuple, scope: tuple) -> None:
        free = _free(index)
        missing = [a for a in scope if a not in free and b.sizes[a] != 1]
        if missing:
            raise NeedsRoot(nid, "R-contract", f"{nid} holds a reduction and is read inside a reduction over "
                            f"axes it lacks ({', '.join(missing)}): it is a contraction operand",
                            deferred=len(self.users[nid]) == 1 and nid not in self.out_names)
        consumer = b.consumers[-1] if b.consumers else None
        pooled = self.pooled_whole(b, nid, index, scope, consumer)
        if pooled is not None and 1 < pooled < self.pool_points and self.holds_contraction(nid):
            raise NeedsRoot(nid, "R-pool", f"{nid} holds a contraction pooled whole by {consumer} over "
                            f"{pooled} points (< {self.pool_points}): the conv and the pool run apart")
        verdict = self.poly_verdict(nid, consumer) if consumer is not None else None
        if verdict is not None:
            ok, why = verdict
            if not ok:
                raise NeedsRoot(nid, "R-window", f"Poly Core: {nid} cannot be computed at {consumer}: {why}")
            self.fused_by_poly.append(f"compute-at {nid} in {consumer}: Poly Core says legal, {why}")
        elif not injective(_unit_free(index, self.g.nodes[nid].shape, b.sizes), {a: b.sizes[a] for a in scope}):
            raise NeedsRoot(nid, "R-window", f"{nid} holds a reduction and is read through an overlapping "
                            "window; fusing would recompute it")

    def pooled_whole(self, b: _Build, nid: str, index: tuple, scope: tuple, consumer: str | None) -> int | None:
        """The points a sum (an average pool) over whole dimensions of ``nid`` covers, where ``consumer`` is
        one: each of its reduce axes (the last of ``scope``) is the plain index of a dimension of ``nid`` of
        its size, it sums no product of two values and ``nid`` is not itself the sum (a conv's activation, bias or
        residual between them); None otherwise (a conv sums the products of a view of its input, its taps or
        channels whole dimensions of that view; a window's taps are ``oh + kh``)."""
        if consumer is None:
            return None
        cn = self.g.nodes[consumer]
        if cn.uop != "REDUCE" or cn.arg["op"] != "SUM" or not cn.arg["axes"] or self.g.nodes[nid].uop == "REDUCE":
            return None        # (a sum of a sum: SRNF's R0 merges them into one reduction)
        if self.sums_products(consumer):
            return None        # the consumer is a contraction (a conv over its input's view)
        axes, shape = scope[-len(cn.arg["axes"]):], self.g.nodes[nid].shape
        points = 1
        for a in axes:
            dims = [d for d, x in enumerate(index) if Expr.lift(x) == Expr.sym(a)]
            size = Expr.lift(b.sizes[a]).as_int()
            if not dims or size is None or Expr.lift(shape[dims[0]]).as_int() != size:
                return None
            points *= size
        return points

    def sums_products(self, nid: str) -> bool:
        """Is ``nid`` a sum of products of two different values (a conv or a matmul; not a square, a variance's)?"""
        n = self.g.nodes[nid]
        if n.uop != "REDUCE" or n.arg["op"] != "SUM":
            return False
        src = self.g.nodes[n.src[0]]
        return src.uop == "MUL" and len(set(src.refs)) == 2

    def holds_contraction(self, nid: str) -> bool:
        """Does ``nid``, inlined down to roots, hold a sum of products (``sums_products``)?"""
        below = reachable([nid], lambda u: [s for s in self.g.nodes[u].refs if s not in self.roots])
        return any(self.sums_products(u) for u in below)

    def poly_verdict(self, producer: str, consumer: str) -> tuple[bool, str] | None:
        """Poly Core's compute-at report: legal and no recompute (buffer class ``reg``: each producer
        element used by one consumer point). None when Poly Core cannot analyse the pair (non-SCoP).
        Asked of the pair's own subgraph (``pairview``), cached by its shape."""
        key = (producer, consumer)
        if key not in self._poly:
            self._poly[key] = compute_at_verdict(self.g, producer, consumer, self._direct)
        return self._poly[key]

    def compute(self, b: _Build, n: Node, index: tuple, scope: tuple) -> RExpr:
        u = n.uop
        if u == "REDUCE":
            return self.reduce(b, n, index, scope)
        if u == "CAST":
            return Cast(self.inline(b, n.src[0], index, scope), n.dtype)
        kind = ops.kind(u)
        if kind == "unary":
            return Unary(ops.ELEMENTWISE[u].fn, self.inline(b, n.src[0], index, scope))
        if u == "GATHER":
            return self.gather(b, n, index, scope)
        args = [self.inline(b, s, index, scope) if is_ref(s) else Const(s) for s in n.src]
        if kind in ("binary", "compare"):
            return Binary(ops.ELEMENTWISE[u].fn, args[0], args[1])
        if u == "WHERE":
            return Select(args[0], args[1], args[2])
        raise AssertionError(u)

    def reduce(self, b: _Build, n: Node, index: tuple, scope: tuple) -> RExpr:
        op, src = n.arg["op"].lower(), self.g.nodes[n.src[0]]
        reused = self.reuse_iter_axes(b, n, index, scope)
        if reused is not None:
            axes, body_index = reused
            body = self.inline(b, n.src[0], body_index, scope)
            return Reduce(op, axes, _neutral(n.arg["op"], n.dtype), n.dtype, body)
        axes, body_index = [], list(index)
        for a in n.arg["axes"]:
            name = f"r{b.n_red}"
            b.n_red += 1
            axes.append(Axis(name, src.shape[a]))
            b.sizes[name] = src.shape[a]
            body_index.insert(a, Expr.sym(name))
        inner = scope + tuple(a.name for a in axes)
        b.consumers.append(n.id)
        body = self.inline(b, n.src[0], tuple(body_index), inner)
        b.consumers.pop()
        if op == "sum" and _contraction(body, scope, b.sizes):
            if b.contraction is not None and b.contraction != n.id:
                raise NeedsRoot(n.id, "R-contract", f"{n.id} is a second contraction in the kernel of {b.root} "
                                f"(which holds {b.contraction}): a kernel runs one contraction")
            if len(scope) > len(b.iters):
                b.nested = n.id
                self.nested_under_rows(b)
            if b.guarded:
                raise NeedsRoot(n.id, "R-contract", f"{n.id} is a contraction under a pad guard (a Concat's "
                                f"part, a Pad's interior) in the kernel of {b.root}: a kernel's contraction "
                                "covers all of its output")
            b.contraction = n.id
        return Reduce(op, tuple(axes), _neutral(n.arg["op"], n.dtype), n.dtype, body)

    def reuse_iter_axes(self, b: _Build, n: Node, index: tuple, scope: tuple):
        """Seed 001 §6.8.3 form: ``Mrow = reduce(max, [n], S)`` where S is a top-level let over the
        iters. When the reduction's body, with each reduced axis named by an unused iter of the same
        size, is a value this region already holds as a let, reduce over those iters instead of
        recomputing the body under fresh axes (never recompute inside a region).

        The same form is used when the body is not a let yet but holds a reduction (LayerNorm's
        ``sum((x - mean)^2)``, LogSoftmax's ``sum(exp(x - max))``): under fresh axes it would be read
        inside a reduction over the non-unit iters the reduction lacks, which R-contract materialises;
        as a top-level let over the iters each of its elements is computed once."""
        if len(scope) != len(b.iters):
            return None
        free = _free(index)
        lacks = any(b.sizes[a] != 1 for a in b.iters if a not in free)
        src = self.g.nodes[n.src[0]]
        spare = [a for a in b.iters if a not in free]
        axes, body_index = [], list(index)
        for a in n.arg["axes"]:
            pick = next((s for s in spare if b.sizes[s] == src.shape[a]), None)
            if pick is None:
                return None
            spare.remove(pick)
            axes.append(Axis(pick, src.shape[a]))
            body_index.insert(a, Expr.sym(pick))
        nid, idx = n.src[0], tuple(body_index)
        while self.g.nodes[nid].uop in MOVEMENT:
            idx, guards = self._move(self.g.nodes[nid], idx, b.sizes)
            if idx is None or guards:
                return None
            nid = self.g.nodes[nid].src[0]
        body = self.g.nodes[nid]
        if (nid, _unit_free(idx, body.shape, b.sizes)) in b.shared or (
                lacks and not b.guarded and body.uop not in ("INPUT", "CONST") and nid not in self.roots
                and not self.cheap(nid) and _top_level(idx, body.shape, b.iters)):
            b.rows = True
            self.nested_under_rows(b)
            return tuple(axes), tuple(body_index)
        return None

    @staticmethod
    def nested_under_rows(b: _Build) -> None:
        """A contraction inside another reduction (a conv under a global pool) in a region that also reduces
        over its own iters (a softmax over the pooled channels) would run as scalar loops: materialised."""
        if b.rows and b.nested is not None:
            raise NeedsRoot(b.nested, "R-contract", f"{b.nested} is a contraction inside another reduction in "
                            f"the kernel of {b.root}, which reduces over its own iters (a softmax over a conv's "
                            "pooled channels): it runs as its own kernel's micro-kernel")

    def movement(self, b: _Build, n: Node, index: tuple, scope: tuple) -> RExpr:
        src_index, guards = self._move(n, index, b.sizes)
        if src_index is not None and n.id != b.root and sum(expr_size(e) for e in src_index) > MAX_INDEX_TERMS:
            raise NeedsRoot(n.id, "R-index", f"the index of {n.id}'s source would have more than {MAX_INDEX_TERMS} "
                            "terms: materialised so that the index expressions of one kernel stay small")
        if src_index is None:
            src = n.src[0]
            if self.g.nodes[src].uop != "INPUT" and src not in self.roots:
                raise NeedsRoot(src, "R-reshape", f"reshape {n.id} merges symbolic axes; its source is "
                                "materialised and read through its flat index")
            from kumiko.region.index import linear
            b.reads[self.buffer(src)] = src
            return Read(self.buffer(src), (linear(tuple(Expr.lift(i) for i in index), n.shape),), flat=True)
        if not guards:
            return self.inline(b, n.src[0], src_index, scope)
        b.guarded += 1
        inner = self.inline(b, n.src[0], src_index, scope)
        b.guarded -= 1
        return Select(Guard(tuple(guards)), inner, Const(n.arg.get("value", 0), n.dtype))

    def gather(self, b: _Build, n: Node, index: tuple, scope: tuple) -> RExpr:
        """The data operand is pushed through its movement chain with the gathered coordinate as an
        opaque symbol bound to the index value; the chain must end at a MemRef."""
        var = f"g{b.n_gather}"
        b.n_gather += 1
        by = self.inline(b, n.src[1], index, scope)
        ax = n.arg["axis"]
        idx = tuple(Expr.sym(var) if k == ax else Expr.lift(i) for k, i in enumerate(index))
        nid = n.src[0]
        while self.g.nodes[nid].uop in MOVEMENT:
            m = self.g.nodes[nid]
            nxt, guards = self._move(m, idx, b.sizes)
            if nxt is None or guards:
                raise NeedsRoot(nid, "R-gather", "the data operand of a gather must be a plain view of a MemRef")
            idx, nid = nxt, m.src[0]
        if self.g.nodes[nid].uop != "INPUT" and nid not in self.roots:
            raise NeedsRoot(nid, "R-gather", f"gather {n.id} reads {nid} through a data-dependent index "
                            "(non-SCoP): it is materialised")
        b.reads[self.buffer(nid)] = nid
        return Gather(self.buffer(nid), idx, var, by)

    # regions -------------------------------------------------------------------------------------
    def build(self, root: str) -> tuple[Region, _Build]:
        n = self.g.nodes[root]
        iters = tuple(f"i{k}" for k in range(len(n.shape)))
        b = _Build(root, iters, dict(zip(iters, n.shape)))
        index = tuple(Expr.sym(a) for a in iters)
        cast = None
        top = root
        if n.uop == "CAST" and self.g.nodes[n.src[0]].uop not in MOVEMENT + ("INPUT", "CONST"):
            cast, top = n.dtype, n.src[0]
            b.root = top
        expr = self.inline(b, top, index, iters)
        b.lets.append(Let("out", expr))
        rule, why, deferred = self.roots[root]
        names = self.out_names.get(root) or [self.buffer(root)]
        outs = tuple(Output(nm, MemRef(n.shape, n.dtype), "deferred" if deferred else "gmem") for nm in names)
        inputs = tuple((buf, MemRef(self.g.nodes[nid].shape, self.g.nodes[nid].dtype))
                       for buf, nid in sorted(b.reads.items(), key=lambda kv: list(self.g.nodes).index(kv[1])))
        fused = [f"{nid} {self.g.nodes[nid].uop}" for nid in self.g.nodes if nid in b.inlined or nid == b.root
                 and self.g.nodes[nid].uop not in MOVEMENT]
        notes = [f"root {root}: {rule}: {why}", "fuses: " + (", ".join(fused) or "nothing (a copy)")]
        notes += [n for n in self.fused_by_poly if n.split(" in ")[0].split()[-1] in b.inlined]
        for buf, nid in sorted(b.reads.items(), key=lambda kv: list(self.g.nodes).index(kv[1])):
            if self.g.nodes[nid].uop == "INPUT":
                notes.append(f"reads {buf}: a graph input")
            else:
                r_rule, r_why, _ = self.roots[nid]
                notes.append(f"reads {buf}: materialised by {r_rule} ({r_why})")
        notes = tuple(notes)
        region = Region(f"k_{names[0]}", tuple(Axis(a, b.sizes[a]) for a in iters), inputs, outs, tuple(b.lets),
                        tuple(Yield("out", nm, cast) for nm in names), notes)
        return normalize(region), b

    def form(self) -> Program:
        """Build every root's region; a value that must be a root (NeedsRoot, or R-fanout after a pass) becomes
        one and only the regions that had inlined it are built again (the others cannot change: they never
        reached it), so a deep network's many restarts cost the regions they touch, not the whole graph."""
        built: dict = {}
        for _ in range(4 * len(self.g.nodes) + 4):
            try:
                for r in self._order():
                    if r not in built:
                        built[r] = self.build(r)
            except NeedsRoot as e:
                self.roots[e.nid] = (e.rule, e.why, e.deferred)
                self._rooted(built, e.nid)
                continue
            fan = self._fanout(built)
            if fan is None:
                return self._program({r: built[r] for r in self._order()})
            self.roots[fan] = ("R-fanout", f"{fan} is needed by several kernels and holds a reduction or reads "
                               f"more than {MAX_RECOMPUTE_READS} tensors of its size (itself or the value its chain of "
                               "single consumers starts from): materialised once", False)
            self._rooted(built, fan)
        raise RuntimeError("region formation did not converge")

    def _rooted(self, built: dict, nid: str) -> None:
        """``nid`` just became a root: forget the regions that inlined it and what depends on the roots."""
        for r in [r for r, (_, b) in built.items() if nid in b.inlined or r == nid]:
            del built[r]
        self._cheap.clear()
        self._wide.clear()

    def _fanout(self, built) -> str | None:
        count: dict[str, int] = {}
        for _, (_, b) in built.items():
            for nid in b.inlined:
                if nid != b.root:
                    count[nid] = count.get(nid, 0) + 1
        for nid in self.g.nodes:
            if count.get(nid, 0) > 1 and (not self.cheap(nid) or self.reads(nid) is None):
                return self._fanout_top(nid)
        return None

    def _fanout_top(self, nid: str) -> str:
        """Where to materialise a fanned-out value: up its chain of single consumers that compute the same
        number of elements from it (a GEMM's bias and residual adds: they then run in its epilogue, and the
        consumers read one tensor instead of recomputing the chain)."""
        numel = self._numel
        top = nid
        while len(self.users.get(top, ())) == 1 and top not in self.out_names:
            (u,) = self.users[top]
            n = self.g.nodes[u]
            if u in self.roots or n.uop in ("REDUCE", "GATHER") or numel(u) is None or numel(u) != numel(top):
                break
            top = u
        return top

    def _numel(self, nid: str) -> int | None:
        """The element count of ``nid``, None when a size is symbolic."""
        total = 1
        for d in self.g.nodes[nid].shape:
            if not isinstance(d, int):
                return None
            total *= d
        return total

    def reads(self, nid: str) -> frozenset | None:
        """The materialised tensors of comparable size (at least 1/8 of ``nid``'s elements; a symbolic size
        counts) that computing ``nid`` reads, or None when there are more than ``MAX_RECOMPUTE_READS``.
        Iterative and memoized like ``cheap``."""
        def comparable(leaf: str, top: str) -> bool:
            a, b = self._numel(leaf), self._numel(top)
            return a is None or b is None or 8 * a >= b

        stack = [nid]
        while stack:
            top = stack[-1]
            if top in self._wide:
                stack.pop()
                continue
            n = self.g.nodes[top]
            if top != nid and (top in self.roots or n.uop == "INPUT"):
                self._wide[top] = frozenset([top])
                stack.pop()
                continue
            todo = [s for s in n.refs if s not in self._wide]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            got: set | None = set()
            for s in n.refs:
                sub = self._wide[s]
                if sub is None:
                    got = None
                    break
                got |= {x for x in sub if comparable(x, top)}
            self._wide[top] = None if got is None or len(got) > MAX_RECOMPUTE_READS else frozenset(got)
        return self._wide[nid]

    def _order(self) -> list[str]:
        return [nid for nid in self.g.nodes if nid in self.roots]

    def _program(self, built) -> Program:
        regions = tuple(built[r][0] for r in self._order())
        ins = tuple((t, MemRef(self.g.nodes[nid].shape, self.g.nodes[nid].dtype)) for t, nid in self.g.inputs)
        outs = tuple((t, MemRef(self.g.nodes[nid].shape, self.g.nodes[nid].dtype)) for t, nid in self.outputs)
        bufs = tuple((self.buffer(r), MemRef(self.g.nodes[r].shape, self.g.nodes[r].dtype))
                     for r in self._order() if r not in self.out_names)
        return Program(self.g.name, regions, ins, outs, bufs, dict(self.g.symbols))


def form_regions(g: TinyGraph, pool_points: int = 0, group_axes: bool = False) -> Program:
    """Partition a TinyGraph into regions in execution order (producers before consumers); ``pool_points``:
    R-pool's bound, a target's (``Backend.formation``; 0, the default, turns the rule off); ``group_axes``: an
    output axis read in whole groups (a grouped conv's channel) split in two where that makes the region a
    contraction (``kumiko.region.groups``; a target's, off by default)."""
    p = Former(g, pool_points).form()
    return split_groups(p) if group_axes else p
