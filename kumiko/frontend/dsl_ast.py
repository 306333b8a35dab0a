"""The DSL's syntax tree: what the parser makes and the elaborator reads. Every node keeps the
position of its first token (an operator's own position for ``Binary``), for located errors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pos:
    line: int
    col: int
    width: int = 1


@dataclass(frozen=True)
class Num:
    value: int | float | bool
    pos: Pos


@dataclass(frozen=True)
class Str:
    value: str
    pos: Pos


@dataclass(frozen=True)
class Name:
    name: str
    pos: Pos
    quoted: bool = False        # `backticked`: never a keyword, dtype or literal word


@dataclass(frozen=True)
class ListLit:
    items: tuple
    pos: Pos


@dataclass(frozen=True)
class TupleLit:                 # only as assignment targets: (a, b) = f(x)
    items: tuple
    pos: Pos


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Any
    pos: Pos


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Any
    rhs: Any
    pos: Pos                    # the operator


def left_spine(e: Any) -> tuple[Any, list[Binary]]:
    """``((a + b) - c) * d`` as ``a`` and its operators bottom-up ``[+, -, *]``: a long chain of
    left-associative operators (a 500-term sum) is a deep tree, so its walkers loop over the left
    spine and recurse only into right operands, which the parser keeps shallow (``MAX_NESTING``)."""
    spine = []
    while isinstance(e, Binary):
        spine.append(e)
        e = e.lhs
    return e, spine[::-1]


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple
    kwargs: tuple               # ((name, expr, pos), ...)
    pos: Pos                    # the function name


@dataclass(frozen=True)
class Assign:
    targets: tuple              # ((name, pos), ...)
    value: Any
    pos: Pos


@dataclass(frozen=True)
class Return:
    values: tuple
    pos: Pos


@dataclass(frozen=True)
class TypeAst:
    dtype: str                  # kumiko dtype name
    dims: tuple                 # expressions
    pos: Pos


@dataclass(frozen=True)
class Param:
    name: str
    pos: Pos
    type: TypeAst
    quals: tuple = ()           # ((word, pos), ...)


@dataclass(frozen=True)
class SymbolDecl:
    name: str
    default: int | None
    pos: Pos


@dataclass(frozen=True)
class GraphDef:
    name: str
    pos: Pos
    symbols: tuple              # SymbolDecl
    params: tuple               # Param
    results: tuple              # Param (no qualifiers)
    body: tuple                 # Assign | Return; the last one is the Return
    open_pos: Pos
    close_pos: Pos


@dataclass(frozen=True)
class Program:
    graphs: tuple
    source: Any                 # the dsl_lex.Source it was parsed from
