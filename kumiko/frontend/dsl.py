"""The graph DSL (seed 004, "Subgraph"): text -> one validated frontend ``Graph``.

    graph<M=256, N=128, K=64> main(A: f32[M, K], B: f32[K, N], bias: param const_pool f32[N])
        -> (C: f32[M, N]) {
        C = relu(A @ B + bias)      // newlines or ';' end statements
        return C
    }

A file holds ``graph`` definitions; ``graph main`` is the entry point and every other graph is a
subgraph. Calls of subgraphs are inlined while the program is elaborated (recursion nests at most 10
deep), so the result is one flat Graph, the same one the JSON format or the Tensor API would give.
The grammar is in ``docs/dsl.md``; this module holds its words (reserved words, literals, dtypes,
qualifiers) and the parser of the syntax tree (``dsl_ast``) from the tokens of ``dsl_lex`` (which also
makes the located diagnostics); ``dsl_elab`` turns the tree into a Graph (names, inlining, typing), with
``dsl_vocab`` (the op vocabulary, derived from the lowering tables) and ``dsl_consts`` (sizes and
attribute values).

Every error points at ``file:line:col`` with the source line, a caret under the culprit and a
suggestion. Syntax and naming errors are E1601 (ParseError); shape and dtype errors found while an
op is typed keep the lowering's code (E1011, E1005, ...) but are located the same way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl_ast import (
    Assign,
    Binary,
    Call,
    GraphDef,
    ListLit,
    Name,
    Num,
    Param,
    Pos,
    Program,
    Return,
    Str,
    SymbolDecl,
    TupleLit,
    TypeAst,
    Unary,
)
from kumiko.frontend.dsl_lex import Source, Token, closest_match, tokenize

#: seed 004's reserved words: syntax keywords, the fused-op syntax, boolean literals
RESERVED = ("graph", "return", "fused", "fused_reduce", "fused_cumulative", "true", "false")
FUSED = ("fused", "fused_reduce", "fused_cumulative")
#: literal words (not reserved by the seed, but they always mean the literal; use `inf` to name a value)
LITERALS = {"true": True, "false": False, "inf": float("inf"), "nan": float("nan")}
#: DSL dtype names -> kumiko dtype names (kumiko's own names are accepted too)
DTYPES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64", "i32": "i32", "bool": "bool"}
DSL_DTYPE = {v: k for k, v in DTYPES.items()}
#: words that may precede a main input's type: role, mutability, storage (see SigInput)
QUALIFIERS = {"data": "role", "param": "role", "state": "role", "immutable": "mutability",
              "mutable": "mutability", "const_pool": "storage", "arena": "storage", "external": "storage"}


# ------------------------------------------------------------------------------------------------
# parser

CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
#: binary operators by binding strength (all left-associative; ``**`` binds tighter, in ``power``)
PRECEDENCE = {**dict.fromkeys(CMP_OPS, 0), "+": 1, "-": 1, "*": 2, "/": 2, "@": 2, "%": 2}
#: how deeply an expression may nest: brackets, calls and exponents while parsing, and the depth of
#: the tree the elaborator recurses over (E1018 beyond). Each level costs the parser up to four
#: Python frames and the elaborator three, so this keeps both far from Python's recursion limit.
MAX_NESTING = 128


class Parser:
    def __init__(self, src: Source):
        self.src = src
        self.toks = tokenize(src)
        self.i = 0
        self.nesting = 0                          # open brackets and calls around the current token
        self.depth: dict[int, int] = {}           # id(node) -> elaborator recursion depth (``_built``)

    # token helpers ----------------------------------------------------------------------------
    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> Token:
        t = self.peek()
        self.i += 1
        return t

    def at(self, text: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind in ("op", "ident") and t.text == text

    def skip_nl(self) -> None:
        while self.peek().kind == "nl":
            self.i += 1

    def err(self, tok: Token, why: str, suggestion: str | None = None) -> KumikoError:
        return self.src.error(tok.pos, why, suggestion)

    def expect(self, text: str, context: str, suggestion: str | None = None) -> Token:
        if self.at(text):
            return self.take()
        t = self.peek()
        raise self.err(t, f"expected {text!r} {context}, found {_describe(t)}",
                       suggestion or f"insert {text!r} here")

    def ident(self, what: str, binding: bool = True) -> tuple[str, Pos]:
        """A name being defined (graph, parameter, symbol, variable); reserved words are refused."""
        t = self.peek()
        if t.kind == "name":
            self.take()
            return t.value, t.pos
        if t.kind != "ident":
            raise self.err(t, f"expected {what}, found {_describe(t)}",
                           suggestion=f"write {what} here (letters, digits and '_', or `any text` in backticks)")
        if binding and t.text in RESERVED:
            raise self.reserved(t, what)
        if binding and t.text in LITERALS:
            raise self.err(t, f"{t.text!r} is a literal word and cannot be used as {what}",
                           suggestion=f"pick another name, or write `{t.text}` in backticks")
        self.take()
        return t.text, t.pos

    def reserved(self, t: Token, what: str) -> KumikoError:
        role = "the fused-op syntax" if t.text in FUSED else "a boolean literal" if t.text in ("true", "false") \
            else "a syntax keyword"
        return self.err(t, f"{t.text!r} is a reserved word ({role}) and cannot be used as {what}",
                        suggestion=f"pick another name, e.g. {t.text}_, or write `{t.text}` in backticks")

    # program ------------------------------------------------------------------------------------
    def program(self) -> Program:
        graphs = []
        self.skip_nl()
        while self.peek().kind != "eof":
            t = self.peek()
            if not self.at("graph"):
                raise self.err(t, f"expected a graph definition, found {_describe(t)}",
                               suggestion="a file holds only graphs: graph main(x: f32[N]) -> (y: f32[N]) { ... }")
            graphs.append(self.graph())
            self.skip_nl()
        return Program(tuple(graphs), self.src)

    def graph(self) -> GraphDef:
        self.take()                                  # 'graph'
        symbols = []
        if self.at("<"):
            self.take()
            while not self.at(">"):
                name, pos = self.ident("a size name")
                default = None
                if self.at("="):
                    self.take()
                    t = self.take()
                    if t.kind != "num" or not isinstance(t.value, int):
                        raise self.err(t, f"the default of size {name!r} must be a non-negative integer, found "
                                       f"{_describe(t)}", suggestion=f"write {name}=128")
                    default = t.value
                symbols.append(SymbolDecl(name, default, pos))
                if not self.at(">"):
                    self.expect(",", "between size declarations", "separate sizes with ',': graph<M=64, N=32>")
            self.take()
        name, pos = self.ident("a graph name")
        open_paren = self.expect("(", f"after the graph name {name!r}", "write the inputs in parentheses: "
                                 f"graph {name}(x: f32[N]) -> (y: f32[N]) {{ ... }}")
        params = self.params(main_like=True)
        self.expect(")", "after the inputs", f"close the input list opened at {open_paren.pos.line}:"
                    f"{open_paren.pos.col}")
        self.skip_nl()
        self.expect("->", "before the outputs", "declare the outputs: -> (y: f32[N])")
        self.skip_nl()
        self.expect("(", "around the outputs", "outputs are named and parenthesised: -> (y: f32[N], z: f32[N])")
        results = self.params(main_like=False)
        if not results:
            raise self.err(self.peek(), f"graph {name!r} declares no outputs",
                           suggestion="declare at least one: -> (y: f32[N])")
        self.expect(")", "after the outputs")
        self.skip_nl()
        open_pos = self.expect("{", "to open the graph body", "the body is a block: { ... return y }").pos
        body = self.body(name)
        close_pos = self.take().pos                  # '}' (brackets are matched by the tokenizer)
        return GraphDef(name, pos, tuple(symbols), tuple(params), tuple(results), tuple(body), open_pos, close_pos)

    def params(self, main_like: bool) -> list[Param]:
        out: list[Param] = []
        while not self.at(")"):
            name, pos = self.ident("an input name" if main_like else "an output name")
            self.expect(":", f"after {name!r}", f"give its type: {name}: f32[N]")
            quals = []
            while self.peek().kind == "ident" and self.peek().text in QUALIFIERS:
                if not main_like:
                    raise self.err(self.peek(), f"outputs take no qualifiers ({self.peek().text!r})",
                                   suggestion="qualifiers (param, state, const_pool, ...) describe inputs")
                t = self.take()
                quals.append((t.text, t.pos))
            out.append(Param(name, pos, self.type(), tuple(quals)))
            if not self.at(")"):
                self.expect(",", "between declarations", "separate declarations with ','")
        return out

    def type(self) -> TypeAst:
        t = self.peek()
        if t.kind != "ident":
            raise self.err(t, f"expected a type like f32[N, K], found {_describe(t)}",
                           suggestion=f"types are a dtype ({', '.join(DTYPES)}) and a shape in brackets")
        from kumiko import dtypes
        dt = dtypes.lookup(DTYPES.get(t.text, t.text))
        if dt is None or dt.name not in dtypes.USER or t.text not in (*DTYPES, *DTYPES.values()):
            near = closest_match(t.text, list(DTYPES))
            why = f"unknown dtype {t.text!r}" + (f"; did you mean {near!r}?" if near else "")
            raise self.err(t, why, suggestion=f"use one of {', '.join(DTYPES)}")
        self.take()
        self.expect("[", f"after the dtype {t.text!r}", f"write the shape in brackets: {t.text}[N, K] "
                    f"(a scalar is {t.text}[])")
        dims = []
        while not self.at("]"):
            dims.append(self.expr())
            if not self.at("]"):
                self.expect(",", "between sizes")
        self.take()
        return TypeAst(dt.name, tuple(dims), t.pos)

    def body(self, graph: str) -> list:
        stmts: list = []
        while self.at(";") or self.peek().kind == "nl":
            self.take()
        while not self.at("}"):
            t = self.peek()
            if stmts and isinstance(stmts[-1], Return):
                raise self.err(t, "statements after return are unreachable",
                               suggestion="return must be the last statement of a graph")
            if self.at("graph"):
                raise self.err(t, "a graph cannot be defined inside another graph",
                               suggestion="close the previous graph with '}' first")
            stmts.append(self.statement())
            if not (self.at("}") or self.at(";") or self.peek().kind == "nl"):
                u = self.peek()
                raise self.err(u, f"expected the end of the statement, found {_describe(u)}",
                               suggestion="put one statement per line, or separate statements with ';'")
            while self.at(";") or self.peek().kind == "nl":
                self.take()
        if not stmts or not isinstance(stmts[-1], Return):
            raise self.err(self.peek(), f"graph {graph!r} has no return statement",
                           suggestion="end the body with: return NAME (or return A, B for several outputs)")
        return stmts

    def statement(self):
        t = self.peek()
        if self.at("return"):
            self.take()
            values = [self.expr()]
            while self.at(","):
                self.take()
                values.append(self.expr())
            if len(values) == 1 and isinstance(values[0], TupleLit):
                values = list(values[0].items)
            return Return(tuple(values), t.pos)
        lhs = [self.expr()]
        while self.at(","):
            self.take()
            lhs.append(self.expr())
        if not self.at("="):
            u = self.peek()
            if len(lhs) == 1 and isinstance(lhs[0], Call):
                raise self.err(t, "the result of this call is not assigned",
                               suggestion=f"assign it to a name: y = {lhs[0].func}(...)")
            raise self.err(u, f"expected '=' after the assignment target, found {_describe(u)}",
                           suggestion="statements are assignments (y = relu(x)) or return NAME")
        eq = self.take()
        if len(lhs) == 1 and isinstance(lhs[0], TupleLit):
            lhs = list(lhs[0].items)
        targets = []
        for x in lhs:
            if not isinstance(x, Name):
                raise self.src.error(_pos_of(x), "only names can be assigned to",
                                     suggestion="write NAME = expression, or (a, b) = f(x) for several results")
            self._check_target(x)
            targets.append((x.name, x.pos))
        if self.at("return"):
            raise self.err(self.peek(), "return must start its own statement")
        return Assign(tuple(targets), self.expr(), eq.pos)

    def _check_target(self, x: Name) -> None:
        if x.quoted:
            return
        if x.name in RESERVED:
            raise self.reserved(Token("ident", x.name, x.name, x.pos), "a variable name")

    # expressions --------------------------------------------------------------------------------
    # Operator chains are parsed with loops (precedence climbing over an explicit operand stack), so
    # a 500-term sum or a run of 5000 signs costs no recursion; only brackets, calls and `**`
    # exponents nest, and those are bounded by MAX_NESTING (E1018), as is the depth of the tree the
    # elaborator walks (see ``_built``).
    def expr(self):
        operands, ops = [self.operand()], []
        while self.peek().kind == "op" and self.peek().text in PRECEDENCE:
            op = self.take()
            if op.text in CMP_OPS and any(o.text in CMP_OPS for o in ops):
                raise self.err(op, "comparisons do not chain",
                               suggestion="compare two values at a time, e.g. (a < b) and then combine")
            while ops and PRECEDENCE[ops[-1].text] >= PRECEDENCE[op.text]:
                self._reduce(operands, ops)
            ops.append(op)
            operands.append(self.operand())
        while ops:
            self._reduce(operands, ops)
        return operands[0]

    def _reduce(self, operands: list, ops: list) -> None:
        op, rhs = ops.pop(), operands.pop()
        operands.append(self._built(Binary(op.text, operands.pop(), rhs, op.pos)))

    def operand(self):
        """A run of prefix signs, then a power. ``-x ** 2`` is ``-(x ** 2)``, as in Python. A run of
        minus signs keeps its parity in at most two negations (``--x`` stays two ``neg``s)."""
        signs = self._signs()
        return self._negate(self.power(), signs)

    def _signs(self) -> list[Token]:
        signs = []
        while self.peek().kind == "op" and self.peek().text in ("-", "+"):
            t = self.take()
            if t.text == "-":
                signs.append(t)
        return signs

    def _negate(self, e, signs: list[Token]):
        for t in signs[:2 - len(signs) % 2][::-1]:
            e = self._built(Unary("-", e, t.pos))
        return e

    def power(self):
        """``primary ** unary ** ...``, right-associative, each exponent with its own prefix signs
        (``2 ** -2 ** 2`` is ``2 ** -(2 ** 2)``); read with a loop and folded from the right."""
        base = self.primary()
        chain = []
        while self.at("**"):
            op = self.take()
            chain.append((op, self._signs(), self.primary()))
        if not chain:
            return base
        e = None
        for k in range(len(chain) - 1, -1, -1):
            op, signs, p = chain[k]
            if e is not None:
                e = self._built(Binary("**", p, e, chain[k + 1][0].pos))
            e = self._negate(p if e is None else e, signs)
        return self._built(Binary("**", base, e, chain[0][0].pos))

    def _built(self, node):
        """Record how deep ``node`` makes the elaborator recurse (it walks a Binary's left operand
        with a loop, every other child with a call) and refuse a tree deeper than MAX_NESTING."""
        d = self.depth.get
        if isinstance(node, Binary):
            depth = max(d(id(node.lhs), 0), 1 + d(id(node.rhs), 0))
        elif isinstance(node, Unary):
            depth = 1 + d(id(node.operand), 0)
        elif isinstance(node, Call):
            depth = 1 + max((d(id(x), 0) for x in (*node.args, *(v for _, v, _ in node.kwargs))), default=0)
        else:
            depth = 1 + max((d(id(x), 0) for x in node.items), default=0)
        if depth > MAX_NESTING:
            raise self.src.error(node.pos, f"this expression nests deeper than {MAX_NESTING} levels",
                                 code="E1018", suggestion="split it into several statements", limit=MAX_NESTING)
        self.depth[id(node)] = depth
        return node

    def _enter(self, tok: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.src.error(tok.pos, f"brackets and calls nest deeper than {MAX_NESTING} levels here",
                                 code="E1018", suggestion="split the expression into several statements",
                                 limit=MAX_NESTING)

    def primary(self):
        t = self.peek()
        if t.kind == "num":
            self.take()
            return Num(t.value, t.pos)
        if t.kind == "str":
            self.take()
            return Str(t.value, t.pos)
        if t.kind == "name":
            self.take()
            return Name(t.value, t.pos, quoted=True)
        if t.kind == "ident":
            if t.text in ("graph", "return"):
                raise self.err(t, f"{t.text!r} is a keyword and cannot appear inside an expression",
                               suggestion="return starts a statement; graph starts a definition")
            self.take()
            if t.text in LITERALS:
                return Num(LITERALS[t.text], t.pos)
            if self.at("("):
                return self.call(t)
            return Name(t.text, t.pos)
        if self.at("("):
            open_ = self.take()
            self._enter(open_)
            items = [self.expr()]
            while self.at(","):
                self.take()
                if self.at(")"):
                    break
                items.append(self.expr())
            self.take()                               # ')' (matched by the tokenizer)
            self.nesting -= 1
            return items[0] if len(items) == 1 else self._built(TupleLit(tuple(items), open_.pos))
        if self.at("["):
            open_ = self.take()
            self._enter(open_)
            items = []
            while not self.at("]"):
                items.append(self.expr())
                if not self.at("]"):
                    self.expect(",", "between list items")
            self.take()
            self.nesting -= 1
            return self._built(ListLit(tuple(items), open_.pos))
        raise self.err(t, f"expected a value, found {_describe(t)}",
                       suggestion="a value is a name, a number, a call like relu(x) or a parenthesised expression")

    def call(self, name: Token) -> Call:
        self._enter(self.take())                      # '('
        args, kwargs = [], []
        while not self.at(")"):
            t = self.peek()
            if t.kind in ("ident", "name") and self.at("=", 1):
                key = self.take()
                self.take()
                if any(k == key.value for k, _, _ in kwargs):
                    raise self.err(key, f"attribute {key.value!r} is given twice")
                kwargs.append((key.value, self.expr(), key.pos))
            else:
                if kwargs:
                    raise self.err(t, "an input follows an attribute",
                                   suggestion="write the inputs first, then the attributes: f(x, w, stride=2)")
                args.append(self.expr())
            if not self.at(")"):
                self.expect(",", f"between the arguments of {name.text}")
        self.take()
        self.nesting -= 1
        if name.text in FUSED:
            raise self.err(name, f"{name.text!r} is reserved for the fused-op syntax, which the DSL does not "
                           "support yet", suggestion="write the ops one by one; kumiko fuses them itself")
        return self._built(Call(name.text, tuple(args), tuple(kwargs), name.pos))


def _describe(t: Token) -> str:
    if t.kind == "eof":
        return "the end of the file"
    if t.kind == "nl":
        return "the end of the line"
    return repr(t.text)


def _pos_of(x: Any) -> Pos:
    return x.pos


def parse_ast(text: str, filename: str | None = None) -> Program:
    """The syntax tree of a DSL file (no name resolution or typing yet)."""
    return Parser(Source(text, filename)).program()


def parse_program(text: str, filename: str | None = None, name: str | None = None):
    """Parse, resolve, inline and type a DSL program; returns its ``main`` as a validated ``Graph``.

    The Graph is named ``name``, else the file's stem, else ``main``."""
    from kumiko.frontend.dsl_elab import elaborate
    gname = name or (Path(filename).stem if filename else "main")
    try:
        return elaborate(parse_ast(text, filename), gname)
    except RecursionError:
        # MAX_NESTING keeps the parser and the elaborator well inside Python's stack; this is the last
        # line for a caller that is itself already deep in the stack
        raise KumikoError("E1018", at=filename or "<string>", why="the program nests deeper than the Python "
                          f"stack allows here (kumiko's own limit is {MAX_NESTING} levels)",
                          limit=MAX_NESTING) from None
