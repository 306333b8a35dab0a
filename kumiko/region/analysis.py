"""What a Region says about itself: the facts every code generator and the planner ask of one region.

``analyze(region)`` computes them once, from the Region and its size symbols alone (no target, no plan):

- the typed region and the type of every let (``typecheck``: BroadcastInDim inserted where a Binary needs it);
- the iteration sizes (``sizes``: iter axis -> size) and the MemRefs it reads and writes;
- the loop order (``iters``): an iter axis that a let reduces over runs inside that let's own axes, so the
  reduction sees the whole axis (``loop_order``);
- each let's *level*: the loop depth of its last axis in that order (``level``);
- the contraction the region holds, with its batch/M/N/K roles and whether the rest is a pointwise
  epilogue (``contraction``: ``find_contraction``);
- the row split of the SIMT skeleton: the iters some let reduces over (inner) and the others (``row_axes``).

The CPU loop-nest emitter (``kumiko.kernel.lower_cpu``), the GPU skeletons (``kumiko.kernel.gpu_mma``,
``gpu_simt``), the row-block pipeline (``kumiko.kernel.stream``) and the planners (``kumiko.plan``) read
these facts; none of them builds an emitter to ask a question about a region.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from kumiko import dtypes
from kumiko.poly.contraction import axis_roles
from kumiko.region.srnf import children, free_axes
from kumiko.region.ssa import Binary, Cast, Program, Read, Reduce, Ref, Region, RExpr, Typer, Unary, typecheck
from kumiko.symbolic import Expr


def let_refs(e: RExpr, red: tuple = ()) -> list[tuple[str, tuple]]:
    """(let name, reduce axes in scope at the reference) for every Ref inside ``e``."""
    if isinstance(e, Ref):
        return [(e.name, red)]
    if isinstance(e, Reduce):
        return let_refs(e.body, red + tuple(a.name for a in e.axes))
    out: list = []
    for k in children(e):
        out += let_refs(k, red)
    return out


def contains(e: RExpr, kinds: tuple) -> bool:
    """Whether ``e`` or an expression inside it is one of ``kinds``."""
    return isinstance(e, kinds) or any(contains(k, kinds) for k in children(e))


def reused_reduce_axes(e: RExpr, iters: set) -> set:
    """Iter axes that a reduction inside ``e`` reduces over (seed 001 §6.8.3: ``reduce(max, [n], S)``)."""
    out: set = set()
    if isinstance(e, Reduce):
        out |= {a.name for a in e.axes if a.name in iters}
    for k in children(e):
        out |= reused_reduce_axes(k, iters)
    return out


def loop_order(iters: list, lets: tuple, types: dict) -> list:
    """Loop order: an axis that a let reduces over runs inside that let's own axes, so the reduction
    sees the whole axis (a softmax over axis 0 iterates columns outermost). Stable otherwise; when the
    constraints cycle, the original order is kept (the emitter then computes such lets in phases)."""
    after: dict = {a: set() for a in iters}
    for let in lets:
        for x in reused_reduce_axes(let.expr, set(iters)):
            after[x] |= {a for a in types[let.name].axes if a != x}
    order, left = [], list(iters)
    while left:
        pick = next((a for a in left if not (after[a] & set(left))), None)
        if pick is None:
            return list(iters)
        order.append(pick)
        left.remove(pick)
    return order


def depth(axes, order) -> int:
    """The loop depth a value over ``axes`` lives at: one below the last of them in the loop ``order``."""
    return max((order.index(a) + 1 for a in axes), default=0)


def row_axes(region: Region, precomputed=()) -> tuple[tuple, tuple]:
    """(inner, outer) iters: inner ones some let (other than the ``precomputed`` ones) reduces over."""
    iters = [a.name for a in region.iters]
    inner: set = set()
    for let in region.lets:
        if let.name not in precomputed:
            inner |= reused_reduce_axes(let.expr, set(iters))
    return tuple(a for a in iters if a in inner), tuple(a for a in iters if a not in inner)


@dataclass(frozen=True)
class Contraction:
    """A sum of products in a region, ``sum_K x*y``, and the role of each axis.

    Found structurally (``find_contraction``), never by op name. Poly-View's ``ContractionPattern``
    (``kumiko.poly.contraction``) answers another question - which named pattern (matmul, conv, ...) one
    Tiny IR MUL -> REDUCE(SUM) is, from the IndexBook's composed maps, for the Poly-View dump - before
    regions exist; this one says where in a formed region (with its epilogue, and a window reduction
    computed at it) the kernels find the contraction they run. Both classify the axes with the same rule,
    ``axis_roles``: read by both operands is batch, by ``x`` only M, by ``y`` only N."""

    let: str                  # the let holding the accumulator
    x: RExpr                  # the M-side operand
    y: RExpr                  # the N-side operand
    batch: tuple              # axis names
    m_axes: tuple
    n_axes: tuple
    k_axes: tuple             # reduce Axis objects
    pointwise: bool           # every other let is a pointwise epilogue at full depth
    outer: Reduce | None = None   # compute-at: an outer reduction over window axes around the contraction
    f: RExpr | None = None        # the pointwise map between them, with the accumulator as Ref("__acc")


def _strip(e: RExpr) -> RExpr:
    return e.x if isinstance(e, Cast) else e


def _is_contraction(e: RExpr) -> bool:
    if not (isinstance(e, Reduce) and e.op == "sum" and e.dtype.name == "fp32"):
        return False
    body = _strip(e.body)
    return isinstance(body, Binary) and body.fn == "mul" and not any(
        contains(o, (Ref, Reduce)) for o in (body.x, body.y))


def _inner_contractions(e: RExpr) -> list:
    if _is_contraction(e):
        return [e]
    out = []
    for k in children(e):
        out += _inner_contractions(k)
    return out


def _substitute(e: RExpr, target: RExpr, by: RExpr) -> RExpr:
    if e == target:
        return by
    if isinstance(e, Unary):
        return Unary(e.fn, _substitute(e.x, target, by))
    if isinstance(e, Cast):
        return Cast(_substitute(e.x, target, by), e.to)
    if isinstance(e, Binary):
        return Binary(e.fn, _substitute(e.x, target, by), _substitute(e.y, target, by))
    return e


def unit_iters(facts: "RegionFacts", c: Contraction) -> tuple[str, ...]:
    """The region's size-1 iters that are none of ``c``'s batch, M or N axes (an exported model's batch of one; an
    output axis no operand reads), in iter order: 0 wherever a kernel reads them."""
    return tuple(a.name for a in facts.region.iters
                 if facts.sizes.get(a.name) == 1 and a.name not in c.batch + c.m_axes + c.n_axes)


def find_contraction(facts: RegionFacts) -> Contraction | None:
    """The first top-level let that is ``sum_K x*y`` - or ``reduce_W f(sum_K x*y)`` with f pointwise
    (a consumer reduction computed at the contraction: seed 003's Conv -> ReLU -> MaxPool)."""
    r = facts.region
    for let in r.lets:
        e, outer, f = let.expr, None, None
        if isinstance(e, Reduce) and not _is_contraction(e):
            inner = set(_inner_contractions(e.body))
            if len(inner) != 1:
                continue
            (c,) = inner
            f = _substitute(e.body, c, Ref("__acc"))
            if contains(f, (Reduce,)) or any(name != "__acc" for name, _ in let_refs(f)) or \
                    not all(isinstance(a.size, int) for a in e.axes):
                continue
            outer, e = let.expr, c
        if not _is_contraction(e):
            continue
        body = _strip(e.body)
        x, y = body.x, body.y
        w_names = tuple(a.name for a in outer.axes) if outer is not None else ()
        out_axes = facts.types[let.name].axes + w_names
        k_names = {a.name for a in e.axes}
        fx = {a for a in free_axes(x) if a in facts.sizes or a in k_names or a in w_names}
        fy = {a for a in free_axes(y) if a in facts.sizes or a in k_names or a in w_names}
        if any(a in fy for a in w_names):
            continue
        roles = axis_roles(out_axes, fx, fy)
        batch = tuple(a for a in out_axes if roles[a] == "batch")
        # an output axis neither operand reads (size 1) goes with M; the window axes are M's innermost
        m_axes = tuple(a for a in out_axes if roles[a] in ("m", "free") and a not in w_names) + w_names
        n_axes = tuple(a for a in out_axes if roles[a] == "n")
        if not m_axes:      # one row whose axis the let dropped (x[0, k] of an x[1, K]): a size-1 iter is M
            m_axes = tuple(a.name for a in r.iters if facts.sizes.get(a.name) == 1 and a.name not in out_axes)[:1]
        if not m_axes or not n_axes:
            continue
        others = [x2 for x2 in r.lets if x2.name != let.name]
        unit = {a.name for a in r.iters if facts.sizes.get(a.name) == 1}     # points compare modulo size-1 axes
        # the other lets are computed at each point of the contraction's output: any that uses fewer axes (a bias
        # read and cast to fp32 before it is added) is recomputed there, which costs a read
        pointwise = tuple(a for a in facts.types[let.name].axes if a not in unit) == tuple(
            a.name for a in r.iters if a.name not in unit) and all(
            not contains(o.expr, (Reduce,)) and all(not red for _, red in let_refs(o.expr))
            for o in others) and r.lets.index(let) == 0
        if outer is not None and not pointwise:
            continue
        return Contraction(let.name, x, y, batch, m_axes, n_axes, e.axes, pointwise, outer, f)
    return None


@dataclass
class RegionFacts:
    """The facts of one region (``analyze``). Read-only by convention: an emitter that extends them
    (reduce axes as sizes, a let of its own) works on copies."""

    region: Region                   # typed: BroadcastInDim inserted (typecheck)
    types: dict                      # let -> VType
    sizes: dict                      # iter axis -> size
    iters: tuple                     # iter axes in loop order
    memrefs: dict = field(default_factory=dict)    # inputs then outputs: name -> MemRef

    def level(self, let_name: str) -> int:
        """The loop depth of the let: one below its last axis in the loop order (0: outside every loop)."""
        return depth(self.types[let_name].axes, self.iters)

    def typer(self) -> Typer:
        """A Typer over the region's iters, MemRefs and lets (a fresh one: callers may add axes to it)."""
        ty = Typer(self.region.name, self.region.iters, self.memrefs)
        ty.lets.update(self.types)
        return ty

    def dtype_of(self, e: RExpr) -> dtypes.DType | None:
        """The dtype of an expression of this region (None for an untyped constant)."""
        t = self.typer().type_of(e)[1]
        return t.dtype if t is not None else None

    @cached_property
    def contraction(self) -> Contraction | None:
        """The region's contraction (``find_contraction``), or None."""
        return find_contraction(self)

    def row_axes(self, precomputed=()) -> tuple[tuple, tuple]:
        return row_axes(self.region, precomputed)


def analyze(region: Region) -> RegionFacts:
    """The facts of ``region`` (see the module docstring)."""
    r, types = typecheck(region)
    memrefs = dict(r.inputs)
    memrefs.update({o.name: o.memref for o in r.outputs})
    order = loop_order([a.name for a in r.iters], r.lets, types)
    return RegionFacts(r, types, {a.name: a.size for a in r.iters}, tuple(order), memrefs)



def reads(e: RExpr) -> set:
    """The tensors ``e`` reads (its Read leaves)."""
    if isinstance(e, Read):
        return {e.tensor}
    out: set = set()
    for k in children(e):
        out |= reads(k)
    return out


@dataclass(frozen=True)
class ChainedContractions:
    """Regions k and k+1 where k's contraction rows produce P = [batch..., M, N] and k+1's contraction reads P
    as its left operand with N as its K axis (attention's scores -> P @ V): what the CPU row-block pipeline
    (``kernel.stream``) and the GPU's streaming attention (``kernel.gpu_attention``) run as one kernel."""
    f0: RegionFacts
    c0: Contraction
    f1: RegionFacts
    c1: Contraction
    p: str                  # k's one output, read by k+1 alone
    m0: str
    n0: str
    iters0: tuple


def chained_contractions(program: Program, k: int) -> ChainedContractions | None:
    if k + 1 >= len(program.regions):
        return None
    r0, r1 = program.regions[k], program.regions[k + 1]
    if len(r0.outputs) != 1 or len(r0.yields) != 1:
        return None
    p = r0.outputs[0].name
    if p in dict(program.outputs) or p not in dict(r1.inputs) or \
            any(p in dict(r.inputs) for j, r in enumerate(program.regions) if j != k + 1):
        return None
    f0, f1 = analyze(r0), analyze(r1)
    c0, c1 = f0.contraction, f1.contraction
    if c0 is None or c1 is None or c0.outer is not None or c1.outer is not None or not c1.pointwise:
        return None
    if len(c0.m_axes) != 1 or len(c0.n_axes) != 1 or len(c1.m_axes) != 1 or len(c1.k_axes) != 1:
        return None
    (m0,), (n0,) = c0.m_axes, c0.n_axes
    iters0 = tuple(a.name for a in r0.iters)
    unit = set(unit_iters(f0, c0))      # (an ONNX batch of one: P's index there is 0)
    core = tuple(a for a in iters0 if a not in unit)
    if core != (*c0.batch, m0, n0) or set(f0.types[c0.let].axes) - unit != set(core):
        return None       # P is laid out [batch..., M, N]: a block's rows are one contiguous slab
    x1 = c1.x
    if not isinstance(x1, Read) or x1.tensor != p or x1.flat or p in reads(c1.y) or \
            any(p in reads(x.expr) for x in r1.lets if x.name != c1.let):
        return None
    if len(x1.index) != len(iters0) or any(Expr.lift(e).as_int() != 0 for a, e in zip(iters0, x1.index) if a in unit):
        return None
    names = [Expr.lift(e).as_symbol() for a, e in zip(iters0, x1.index) if a not in unit]
    if None in names:
        return None
    to1 = dict(zip(core, names))
    if to1[n0] != c1.k_axes[0].name or to1[m0] != c1.m_axes[0] or tuple(to1[a] for a in c0.batch) != c1.batch:
        return None
    size1 = dict(f1.sizes, **{a.name: a.size for a in c1.k_axes})
    if any(Expr.lift(f0.sizes[a]) != Expr.lift(size1[to1[a]]) for a in core):
        return None
    return ChainedContractions(f0, c0, f1, c1, p, m0, n0, iters0)
