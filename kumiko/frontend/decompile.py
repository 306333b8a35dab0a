"""Graph -> DSL text (seed 004, "Decompile"): one ``graph main`` whose parse is the same graph.

One statement per op, in the graph's (topological) order, each named after the op's output
tensors, so ``parse_program(decompile(g))`` has the same signature, tensors, ops, attributes and
Tiny IR; only op names (the DSL names an op after its first output) and the graph's name (the entry
is always ``main``) are not kept, and alias op spellings (``gemm`` for ``GEMM``...) become the
op they stand for. Names that are not DSL identifiers (ONNX's ``onnx::Add_3``) are written in
backticks; attribute strings that are size expressions are written unquoted.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl import DSL_DTYPE, DTYPES, LITERALS, RESERVED
from kumiko.frontend.dsl_lex import IDENT
from kumiko.frontend.dsl_vocab import OPERATORS, spelling
from kumiko.frontend.graph import Graph, SigInput, TensorType
from kumiko.symbolic import Expr, dim, dim_json, parse_expr

_OPERATOR_OF = {fn: op for op, fn in OPERATORS.items()}
_SYMBOL_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9']*")
WRAP = 110      # a longer header puts each input and output on its own line


def decompile(graph: Graph) -> str:
    """The DSL source of ``graph`` as a single ``graph main``."""
    symbols = _symbols(graph)
    w = _Writer(set(symbols))
    decls = ", ".join(f"{w.name(s)}={graph.symbols[s]}" if s in graph.symbols else w.name(s) for s in symbols)
    params = ", ".join(f"{w.name(i.tensor)}: {_quals(i)}{w.type(graph.tensors[i.tensor])}" for i in graph.inputs)
    results = ", ".join(f"{w.name(o)}: {w.type(graph.tensors[o])}" for o in graph.outputs)
    head = f"graph{f'<{decls}>' if decls else ''} main"
    if len(f"{head}({params}) -> ({results}) {{") > WRAP:    # one declaration a line (newlines inside ( ) are free)
        params = "".join(f"\n    {w.name(i.tensor)}: {_quals(i)}{w.type(graph.tensors[i.tensor])},"
                         for i in graph.inputs) + ("\n" if graph.inputs else "")
        results = "\n" + "".join(f"    {w.name(o)}: {w.type(graph.tensors[o])},\n" for o in graph.outputs)
    lines = [f"// decompiled from the kumiko graph {json.dumps(graph.name)}", f"{head}({params}) -> ({results}) {{"]
    for n in graph.nodes:
        targets = ", ".join(w.name(o) for o in n.outputs)
        lhs = f"({targets})" if len(n.outputs) > 1 else targets
        lines.append(f"    {lhs} = {w.op(n.op, n.inputs, dict(n.attrs))}")
    lines.append(f"    return {', '.join(w.name(o) for o in graph.outputs)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _symbols(graph: Graph) -> list[str]:
    """Sizes to declare: the graph's defaults first, then symbols of the inputs, then any others."""
    seen: dict[str, None] = dict.fromkeys(graph.symbols)
    seen.update(dict.fromkeys(graph.symbol_names()))
    rest: set[str] = set()
    for t in graph.tensors.values():
        for d in t.shape:
            if isinstance(d, Expr):
                rest |= d.symbols()
    seen.update(dict.fromkeys(sorted(rest - set(seen))))
    return list(seen)


def _quals(i: SigInput) -> str:
    words = [i.role] if i.role != "data" else []
    words += [i.mutability] if i.mutability != "immutable" else []
    words += [i.storage] if i.storage else []
    return "".join(f"{w} " for w in words)


class _Writer:
    def __init__(self, symbols: set[str]):
        self.symbols = symbols

    def name(self, s: str) -> str:
        """A name as written: bare when it is a plain identifier that means nothing else, else `quoted`."""
        if IDENT.fullmatch(s) and s not in RESERVED and s not in LITERALS and s != "none" and \
                not (s in self.symbols and (s in DTYPES or s in DTYPES.values())):
            return s
        if "`" in s or "\n" in s or not s:
            raise KumikoError("E1010", at=f"decompile: name {s!r}", why="this name cannot be written in the DSL "
                              "(it holds a backtick or a newline, or is empty)", suggestion="rename it")
        return f"`{s}`"

    def dim(self, d: Any) -> str:
        if isinstance(d, int):
            return str(d)
        text = str(d)
        return _SYMBOL_TOKEN.sub(lambda m: m.group() if m.group() in ("floor", "ceil") and
                                 text[m.end():m.end() + 1] == "(" else self.name(m.group()), text)

    def type(self, t: TensorType) -> str:
        return f"{DSL_DTYPE.get(t.dtype.name, t.dtype.name)}[{', '.join(self.dim(d) for d in t.shape)}]"

    def operand(self, x: Any) -> str:
        return self.name(x) if isinstance(x, str) else _number(x)

    def op(self, op: str, inputs: tuple, attrs: dict) -> str:
        from kumiko.frontend.lower import OP_ALIASES, OPS
        op = op if op in OPS else OP_ALIASES.get(op.lower(), op)
        fn = attrs.get("fn") if op in ("Elementwise", "Reduce") else None
        ins = [self.operand(x) for x in inputs]
        if op == "Elementwise" and set(attrs) == {"fn"}:
            if fn in _OPERATOR_OF and len(inputs) == 2:
                lhs = f"({ins[0]})" if fn == "pow" and ins[0].startswith("-") else ins[0]
                return f"{lhs} {_OPERATOR_OF[fn]} {ins[1]}"
            if fn == "neg" and len(inputs) == 1 and isinstance(inputs[0], str):
                return f"-{ins[0]}"
        if op == "MatMul" and not attrs and len(inputs) == 2 and all(isinstance(x, str) for x in inputs):
            return f"{ins[0]} @ {ins[1]}"
        name, fixes_fn = spelling(op, fn)
        kwargs = [f"{self.name(k)}={self.const(v)}" for k, v in attrs.items() if not (fixes_fn and k == "fn")]
        return f"{name}({', '.join(ins + kwargs)})"

    def const(self, v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "none"
        if isinstance(v, (int, float)):
            return _number(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.const(x) for x in v) + "]"
        if isinstance(v, Expr):
            v = dim_json(dim(v))
            return self.const(v)
        if isinstance(v, str):
            if v in DSL_DTYPE:
                return DSL_DTYPE[v]
            sym = self._size(v)
            return sym if sym is not None else json.dumps(v)
        raise KumikoError("E1010", at="decompile", why=f"attribute value {v!r} cannot be written in the DSL",
                          suggestion="attributes are numbers, booleans, strings, sizes and lists of them")

    def _size(self, s: str) -> str | None:
        """``s`` unquoted when it is the canonical text of a size expression over declared sizes."""
        try:
            e = parse_expr(s)
        except (SyntaxError, TypeError, ValueError):
            return None
        d = dim(e)
        if isinstance(d, int) or not d.symbols() <= self.symbols or str(d) != s:
            return None
        return self.dim(d)


def _number(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return repr(x)
    if hasattr(x, "item"):
        return _number(x.item())
    raise KumikoError("E1010", at="decompile", why=f"input {x!r} is neither a tensor name nor a number")
