"""The CPU kernel IR: a loop nest of typed statements, the stage between a Region+Plan and C text.

Expressions inside statements are C expression strings built by ``kumiko.kernel.cexpr`` from the
region (index arithmetic, loads with their dtype conversions, math). Statements carry structure the
renderer and later passes need: loops (with ``parallel``/``collapse`` for OpenMP and ``vector`` for
SIMD hints), OpenMP parallel regions (per-thread scratch, then worksharing loops), guarded blocks,
scratch arrays with their extent, stores to MemRefs, and vector stores of ``kumiko_cpu.h``'s lanes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from kumiko.kernel import cexpr as C
from kumiko.symbolic import Expr


@dataclass(frozen=True)
class Decl:
    ctype: str
    name: str
    init: str | None = None


@dataclass(frozen=True)
class Assign:
    name: str
    value: str


@dataclass(frozen=True)
class Store:
    buf: str
    offset: str
    value: str


@dataclass(frozen=True)
class VecStore:
    """``fn(buf + offset, value)``: KUMIKO_VW lanes stored with a ``kumiko_cpu.h`` helper (kv_store, ...)."""
    fn: str
    buf: str
    offset: str
    value: str


@dataclass(frozen=True)
class Scratch:
    """A thread-private scratch array: heap (freed at the end of the enclosing block), or on the stack
    (``stack``: ``size`` is a small constant)."""
    ctype: str
    name: str
    size: str
    stack: bool = False


@dataclass(frozen=True)
class For:
    var: str
    lo: str
    hi: str
    body: tuple
    step: str = "1"
    parallel: bool = False   # its own ``omp parallel for``
    collapse: int = 1
    vector: int = 0          # a SIMD hint (``#pragma omp simd``) when > 0
    workshare: bool = False  # an ``omp for`` inside an enclosing parallel region
    tail: bool = False       # the scalar remainder of a vector loop (< KUMIKO_VW iterations): never parallel
    par_if: str = ""         # a parallel loop's OpenMP ``if``: threads only when this holds (enough work)
    trips: int | None = None  # the trip count when known when compiling (``axis_loop``): a point's taps


def axis_loop(var: str, extent, body: tuple) -> For:
    """``for (var = 0; var < extent; ++var) body`` over a size expression, with its trip count when
    ``extent`` is a constant (``For.trips``: what the parallel nests' work estimate counts)."""
    return For(var, "0", C.index(extent, set()), body, trips=Expr.lift(extent).as_int())


@dataclass(frozen=True)
class Parallel:
    """``#pragma omp parallel { body }``: the body runs once per thread (its Scratch arrays are the
    thread's own); the loops inside that share out work are ``workshare`` Fors."""
    body: tuple
    cond: str = ""           # OpenMP ``if``: threads only when this holds (enough work)


@dataclass(frozen=True)
class If:
    cond: str
    then: tuple
    other: tuple = ()


@dataclass(frozen=True)
class Block:
    body: tuple
    unrolled: bool = False    # the body's statements are the iterations of an unrolled loop: their work adds up


@dataclass(frozen=True)
class Comment:
    text: str


@dataclass(frozen=True)
class Raw:
    """A statement the contraction path emits verbatim (micro-kernel calls)."""
    text: str


#: the status a CPU kernel returns when a data-dependent (gather) index was out of range; the runtime turns it
#: into a diagnostic (0 is success, anything else an internal error)
STATUS_BAD_INDEX = 2

Stmt = Union[Decl, Assign, Store, VecStore, Scratch, For, Parallel, If, Block, Comment, Raw]


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str           # element storage type
    const: bool


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple        # Param, ... (inputs then outputs, the ABI order)
    syms: tuple          # size symbol names, sorted (the ABI order)
    body: tuple
    notes: tuple = ()
    gather_check: bool = False   # declares ``kk_bad``; returns STATUS_BAD_INDEX when a gather index was out of range
    #: a scalar reduction reads backwards along its reduction axis (``x.flip(1).sum()``): gcc 12's loop
    #: vectorizer miscompiles such an in-order float reduction in a loop nest (it returned 67 for 66), so
    #: the renderer turns that one pass off for this function (docs/cpu.md, "Compiler bugs we steer around")
    no_loop_vectorize: bool = False
