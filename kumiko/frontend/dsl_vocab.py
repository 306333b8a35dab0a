"""The DSL's op vocabulary, derived from the lowering tables so that a new frontend op (or a new
elementwise fn) is callable from the DSL by itself, and the reverse map ``spelling`` that decompile uses.

Elementwise fns and reductions are called by their fn name (``relu(x)``, ``sum(x, axes=[1])``);
``max``/``min`` are elementwise with two inputs and reductions with one. Every other op is called by
its snake_case name (``Conv2D`` -> ``conv2d``) and by its exact op name (``GEMM``, ``Cast``), the
spelling of last resort that always names exactly that op.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

#: Elementwise fns that lower_elementwise handles beyond its UNARY/BINARY/COMPARE tables, with arity
EW_EXTRA = {"where": 3, "cast": 1, "clip": 1}
REDUCE_FNS = ("sum", "mean", "max", "min")
#: spellings nicer than the mechanical snake_case of an op name
SPELLING = {"MatMul": "matmul", "CumSum": "cumsum"}
#: binary operators -> Elementwise fn ('@' is MatMul)
OPERATORS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "**": "pow",
             "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


@dataclass(frozen=True)
class Builtin:
    """A DSL function: the frontend op it makes, a fixed ``fn`` attribute, its number of inputs."""
    name: str
    op: str
    fn: str | None = None
    arity: int | None = None       # None: the lowering checks the inputs


def snake(op: str) -> str:
    return SPELLING.get(op) or re.sub(r"(?<=[a-z])(?=[A-Z])", "_", op).lower()


def vocabulary() -> dict[str, tuple[Builtin, ...]]:
    """DSL name -> candidates (``max``/``min`` are elementwise with two inputs, reductions with one).

    Elementwise fns and reductions by their fn name; every other op by its snake_case name
    (``Conv2D`` -> ``conv2d``) and by its exact op name (``GEMM``, ``Cast``), which is the spelling
    of last resort that always names exactly that op."""
    from kumiko.frontend import lower_nn  # noqa: F401  (registers the nn ops)
    from kumiko.frontend.lower import OPS
    from kumiko.frontend.lower_ew import BINARY_FNS, COMPARE_FNS, UNARY_FNS
    return _vocabulary(tuple(OPS), tuple(UNARY_FNS), tuple(BINARY_FNS), tuple(COMPARE_FNS))


@lru_cache(maxsize=4)
def _vocabulary(ops: tuple, unary: tuple, binary: tuple, compare: tuple) -> dict[str, tuple[Builtin, ...]]:
    table: dict[str, tuple[Builtin, ...]] = {}

    def add(b: Builtin) -> None:
        table[b.name] = table.get(b.name, ()) + (b,)
    for fn in unary:
        add(Builtin(fn, "Elementwise", fn, 1))
    for fn in (*binary, *compare):
        add(Builtin(fn, "Elementwise", fn, 2))
    for fn, n in EW_EXTRA.items():
        add(Builtin(fn, "Elementwise", fn, n))
    for fn in REDUCE_FNS:
        add(Builtin(fn, "Reduce", fn, 1))
    for op in ops:
        if snake(op) not in table:
            add(Builtin(snake(op), op))
    for op in ops:
        if op not in table:
            add(Builtin(op, op))
    return table


def spelling(op: str, fn: str | None) -> tuple[str, bool]:
    """The DSL name that makes ``op`` (with ``fn``), and whether that name fixes the fn."""
    table = vocabulary()
    for name, cands in table.items():
        for b in cands:
            if b.op == op and b.fn is not None and b.fn == fn:
                return name, True
    for name, cands in table.items():
        for b in cands:
            if b.op == op and b.fn is None:
                return name, False
    return op, False
