"""Elaboration of a parsed DSL program into one frontend ``Graph``: name resolution, calls of ops
(``dsl_vocab``) and of subgraphs (inlined), sizes and attributes (``dsl_consts``), and typing.

Each op is typed the moment it is created, by lowering it into a running Tiny IR builder with the
same lowering code ``Graph.make`` uses; a shape or dtype error therefore points at the operator or
call that caused it, inside whichever subgraph it sits (with the chain of calls that led there).

Naming: a variable of ``main`` names its tensor; an output takes its declared name; a value made
inside a subgraph is ``<graph>_<variable>``; a nested expression's temporaries are
``<target>_1, <target>_2, ...``. Every name is made unique, so the result is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.frontend.dsl import DSL_DTYPE, QUALIFIERS
from kumiko.frontend.dsl_ast import (
    Assign,
    Binary,
    Call,
    GraphDef,
    ListLit,
    Name,
    Num,
    Pos,
    Program,
    Str,
    TupleLit,
    Unary,
    left_spine,
)
from kumiko.frontend.dsl_consts import Constants
from kumiko.frontend.dsl_lex import Source, closest_match
from kumiko.frontend.dsl_vocab import OPERATORS, vocabulary
from kumiko.frontend.graph import Graph, OpNode, SigInput, TensorType
from kumiko.symbolic import Expr
from kumiko.tiny.build import TinyBuilder
from kumiko.tiny.ir import FrozenDict

#: subgraph calls nest at most this deep (seed 004: recursion up to depth 10)
MAX_DEPTH = 10

# ------------------------------------------------------------------------------------------------
# elaboration

Value = Any      # a tensor name (str) or a literal number / bool


class _Recording(FrozenDict):
    """Attributes that remember which keys the lowering read (to catch misspelt keywords)."""

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        object.__setattr__(self, "read", set())

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)


@dataclass
class _Op:
    op: str
    inputs: list
    outputs: list
    attrs: dict
    pos: Pos
    chain: str | None


@dataclass
class Frame:
    graph: GraphDef
    main: bool
    env: dict = field(default_factory=dict)        # variable -> Value
    defs: dict = field(default_factory=dict)       # variable -> Pos of its definition
    syms: dict = field(default_factory=dict)       # size symbol -> int | Expr (in the caller's terms)
    base: str = "t"                                # stem for temporaries of the current statement


class Elaborator(Constants):
    def __init__(self, program: Program, name: str):
        self.src: Source = program.source
        self.program = program
        self.name = name
        self.graphs: dict[str, GraphDef] = {}
        self.vocab = vocabulary()
        self.b = TinyBuilder(name)
        self.tid: dict[str, str] = {}                  # tensor -> Tiny IR node id
        self.types: dict[str, TensorType] = {}
        self.ops: list[_Op] = []
        self.used: set[str] = set()
        self.frames: list[Frame] = []
        self.calls: list[tuple[str, Pos, str]] = []    # (caller, call position, callee) of active calls
        self.reached: set[str] = set()

    # diagnostics --------------------------------------------------------------------------------
    def chain(self) -> str | None:
        if not self.calls:
            return None
        parts: list[list] = []
        for caller, pos, callee in reversed(self.calls):      # innermost first; repeats collapsed
            text = f"{callee} called at {self.src.where(pos)} in {caller}"
            if parts and parts[-1][0] == text:
                parts[-1][1] += 1
            else:
                parts.append([text, 1])
        return "; ".join(t if k == 1 else f"{t} ({k} times)" for t, k in parts)

    def error(self, pos: Pos, why: str, suggestion: str | None = None, code: str = "E1601",
              **details: Any) -> KumikoError:
        if self.calls:
            details["called_from"] = self.chain()
        return self.src.error(pos, why, suggestion, code=code, **details)

    def relocate(self, e: KumikoError, pos: Pos, op: str | None = None, chain: str | None = None) -> KumikoError:
        details = {k: v for k, v in e.details.items() if k not in ("excerpt", "called_from")}
        if op:
            details["op"] = op
        if e.at.startswith("tiny:"):
            details.setdefault("tiny", e.at)
        chain = chain if chain is not None else self.chain()
        if chain:
            details["called_from"] = chain
        return self.src.error(pos, e.why, e.suggestion, code=e.code, **details)

    # entry --------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for g in self.program.graphs:
            if g.name in self.graphs:
                first = self.graphs[g.name].pos
                raise self.error(g.pos, f"graph {g.name!r} is defined twice (first at {first.line}:{first.col})",
                                 suggestion="give each graph its own name")
            self._check_header(g)
            self.graphs[g.name] = g
        if "main" not in self.graphs:
            if not self.program.graphs:
                raise self.error(Pos(1, 1), "the file defines no graph",
                                 suggestion="write the entry point: graph main(x: f32[N]) -> (y: f32[N]) { ... }")
            g = self.program.graphs[-1]
            raise self.error(g.pos, "there is no graph main (the entry point)",
                             suggestion=f"name the entry graph main (e.g. rename {g.name!r})")
        graph = self.main(self.graphs["main"])
        for g in self.program.graphs:
            if g.name not in self.reached and g.name != "main":
                Elaborator(self.program, g.name).standalone(g, self.graphs)
        return graph

    def _check_header(self, g: GraphDef) -> None:
        seen: dict[str, Pos] = {}
        for s in g.symbols:
            if s.name in seen:
                raise self.error(s.pos, f"size {s.name!r} is declared twice in graph {g.name!r}")
            seen[s.name] = s.pos
        for group, what in ((g.params, "input"), (g.results, "output")):
            names: dict[str, Pos] = {}
            for p in group:
                if p.name in names:
                    prev = names[p.name]
                    raise self.error(p.pos, f"{what} name {p.name!r} is used twice (first at {prev.line}:{prev.col})",
                                     suggestion=f"give every {what} its own name")
                names[p.name] = p.pos
        for p in g.params:
            kinds: dict[str, str] = {}
            for word, pos in p.quals:
                kind = QUALIFIERS[word]
                if g.name != "main":
                    raise self.error(pos, f"{word!r} qualifies an input of main; subgraph inputs take none",
                                     suggestion="roles and storage describe the program's signature: put them on "
                                     "main's inputs")
                if kind in kinds:
                    raise self.error(pos, f"{p.name!r} has two {kind}s ({kinds[kind]!r} and {word!r})")
                kinds[kind] = word

    def main(self, g: GraphDef) -> Graph:
        self.reached.add(g.name)
        f = Frame(g, main=True)
        f.syms = {s.name: Expr.sym(s.name) for s in g.symbols}
        self.frames.append(f)
        self.used |= {p.name for p in (*g.params, *g.results)}
        self.used |= {t for st in g.body if isinstance(st, Assign) for t, _ in st.targets}
        inputs = []
        for p in g.params:
            t = self.type_of(f, p.type)
            quals = dict(_qual_kinds(p.quals))
            sig = SigInput(p.name, quals.get("role", "data"), quals.get("mutability", "immutable"),
                           quals.get("storage"))
            inputs.append(sig)
            self.tid[p.name] = self.b.add("INPUT", tensor_id=p.name, dtype=t.dtype.name, shape=t.shape,
                                          **({"storage": sig.storage} if sig.storage else {}))
            self.types[p.name] = t
            f.env[p.name], f.defs[p.name] = p.name, p.pos
        ret = g.body[-1]
        for st in g.body[:-1]:
            self.assign(f, st)
        outputs = self.main_return(f, ret, {i.tensor for i in inputs})
        nodes = [OpNode(o.op, o.outputs[0], tuple(o.inputs), tuple(o.outputs), FrozenDict(o.attrs)) for o in self.ops]
        symbols = {s.name: s.default for s in g.symbols if s.default is not None}
        tensors = {i.tensor: self.types[i.tensor] for i in inputs}
        try:
            return Graph.make(inputs, outputs, tensors, nodes, symbols, self.name)
        except KumikoError as e:
            op = next((o for o in self.ops if e.at.startswith(f"op {o.outputs[0]} (")), None)
            if op is None:
                raise self.relocate(e, ret.pos) from None
            raise self.relocate(e, op.pos, chain=op.chain) from None

    def standalone(self, g: GraphDef, graphs: dict) -> None:
        """Type-check a subgraph that main never calls: sizes take their defaults, else stay symbolic."""
        self.graphs = graphs
        self.reached.add(g.name)
        f = Frame(g, main=False)
        f.syms = {s.name: Expr.sym(s.name) if s.default is None else s.default for s in g.symbols}
        self.frames.append(f)
        for p in g.params:
            t = self.type_of(f, p.type)
            name = self.unique(f"{g.name}_{p.name}")
            self.tid[name] = self.b.add("INPUT", tensor_id=name, dtype=t.dtype.name, shape=t.shape)
            self.types[name] = t
            f.env[p.name], f.defs[p.name] = name, p.pos
        self.body(f)

    # statements ---------------------------------------------------------------------------------
    def body(self, f: Frame) -> list:
        for st in f.graph.body[:-1]:
            self.assign(f, st)
        return self.sub_return(f, f.graph.body[-1])

    def claim(self, f: Frame, var: str) -> str:
        if f.main:
            return var
        return self.unique(f"{f.graph.name}_{var}")

    def assign(self, f: Frame, st: Assign) -> None:
        for k, (name, pos) in enumerate(st.targets):
            if name in f.env or any(name == n for n, _ in st.targets[:k]):
                prev = f.defs.get(name, pos)
                raise self.error(pos, f"{name!r} is already defined (at {prev.line}:{prev.col}); every name is "
                                 "bound once", suggestion=f"pick a new name, e.g. {name}2")
        f.base = st.targets[0][0]
        wants = [self.claim(f, name) for name, _ in st.targets]
        mark = len(self.ops)
        values = self.values(f, st.value, len(st.targets), wants)
        created = {o for op in self.ops[mark:] for o in op.outputs}
        renamed: dict[str, str] = {}
        for (name, pos), want, v in zip(st.targets, wants, values):
            if isinstance(v, str) and v in renamed:
                v = renamed[v]
            elif isinstance(v, str) and v in created and v != want and want not in self.tid:
                self.rename(v, want)
                renamed[v] = want
                v = want
            f.env[name], f.defs[name] = v, pos

    def main_return(self, f: Frame, ret, inputs: set) -> list[str]:
        g = f.graph
        if len(ret.values) != len(g.results):
            raise self.error(ret.pos, f"main returns {len(ret.values)} value(s) but declares {len(g.results)} "
                             f"output(s) ({', '.join(r.name for r in g.results)})",
                             suggestion="return one value per declared output, in order")
        outputs: list[str] = []
        for r, e in zip(g.results, ret.values):
            f.base = r.name
            v = self.value(f, e, r.name if r.name not in self.tid else None)
            pos = e.pos
            if not isinstance(v, str):
                raise self.error(pos, f"output {r.name!r} must be a tensor, not the number {v!r}",
                                 suggestion="compute it from an input")
            if r.name in inputs and v != r.name:
                raise self.error(pos, f"output {r.name!r} has the name of an input, so it must return that input",
                                 suggestion=f"return {r.name}, or give the output another name")
            if v in inputs and v != r.name:
                raise self.error(pos, f"output {r.name!r} would be the input {v!r} itself; an output that is an "
                                 "input keeps the input's name", suggestion=f"declare the output as {v}: ..., or "
                                 "return a computed value")
            if v in outputs:
                raise self.error(pos, f"this value is already returned as output {v!r}",
                                 suggestion="each output needs its own value")
            if v != r.name:
                if r.name in self.tid:
                    at = next((d for d in f.defs.items() if d[0] == r.name), None)
                    where = f" (defined at {at[1].line}:{at[1].col})" if at else ""
                    raise self.error(pos, f"output name {r.name!r} already names another value{where}",
                                     suggestion=f"return {r.name} itself, or rename that variable")
                self.rename(v, r.name)
            want = self.type_of(f, r.type)
            got = self.types[r.name]
            if got != want:
                raise self.error(pos, f"output {r.name!r} is declared {_tstr(want)} but the value returned is "
                                 f"{_tstr(got)}", suggestion="fix the declared type or the computation",
                                 code="E1011")
            outputs.append(r.name)
        return outputs

    def sub_return(self, f: Frame, ret) -> list:
        g = f.graph
        if len(ret.values) != len(g.results):
            raise self.error(ret.pos, f"graph {g.name!r} returns {len(ret.values)} value(s) but declares "
                             f"{len(g.results)} output(s)", suggestion="return one value per declared output")
        out = []
        for r, e in zip(g.results, ret.values):
            f.base = r.name
            v = self.value(f, e)
            got = TensorType(dtypes.fp32, ()) if not isinstance(v, str) else self.types[v]
            for d, gd in zip(r.type.dims, got.shape):
                if isinstance(d, Name) and d.name in {s.name for s in g.symbols} and d.name not in f.syms:
                    f.syms[d.name] = gd
            want = self.type_of(f, r.type)
            if not isinstance(v, str):
                if want.shape != ():
                    raise self.error(e.pos, f"output {r.name!r} is declared {_tstr(want)} but the value is the "
                                     f"number {v!r}", code="E1011")
            elif got != want:
                raise self.error(e.pos, f"output {r.name!r} of graph {g.name!r} is declared {_tstr(want)}"
                                 f"{_bindings(f)} but the value returned is {_tstr(got)}",
                                 suggestion="fix the declared type or the computation", code="E1011")
            out.append(v)
        return out

    # names --------------------------------------------------------------------------------------
    def unique(self, stem: str, suffix: bool = False) -> str:
        if not suffix and stem not in self.used:
            self.used.add(stem)
            return stem
        k = 1
        while f"{stem}_{k}" in self.used:
            k += 1
        self.used.add(f"{stem}_{k}")
        return f"{stem}_{k}"

    def temp(self, f: Frame) -> str:
        return self.unique(f.base if f.main else f"{f.graph.name}_{f.base}", suffix=True)

    def rename(self, old: str, new: str) -> None:
        for o in self.ops:
            o.inputs = [new if isinstance(x, str) and x == old else x for x in o.inputs]
            o.outputs = [new if x == old else x for x in o.outputs]
        self.tid[new] = self.tid.pop(old)
        self.types[new] = self.types.pop(old)
        self.used.add(new)
        for fr in self.frames:
            for k, v in fr.env.items():
                if isinstance(v, str) and v == old:
                    fr.env[k] = new

    # values -------------------------------------------------------------------------------------
    def value(self, f: Frame, e: Any, out: str | None = None) -> Value:
        return self.values(f, e, 1, [out])[0]

    def values(self, f: Frame, e: Any, n: int, outs: list) -> list:
        if isinstance(e, Call):
            return self.call(f, e, n, outs)
        if n != 1:
            raise self.error(e.pos, f"this expression gives one value but {n} names are assigned",
                             suggestion="assign it to one name, or call a graph or op with several results")
        out = outs[0]
        if isinstance(e, Num):
            return [e.value]
        if isinstance(e, Str):
            raise self.error(e.pos, "a string is not a value; strings are attribute values",
                             suggestion='pass it as an attribute: gelu(x, approximate="tanh")')
        if isinstance(e, Name):
            return [self.lookup(f, e)]
        if isinstance(e, (ListLit, TupleLit)):
            raise self.error(e.pos, "a list is not a value; lists are attribute values",
                             suggestion="pass it as an attribute, e.g. reshape(x, shape=[M, -1])")
        if isinstance(e, Unary):
            v = self.value(f, e.operand)
            if not isinstance(v, str):
                return [-v]
            return self.emit(f, "Elementwise", [v], {"fn": "neg"}, e.pos, [out])
        if isinstance(e, Binary):
            leaf, spine = left_spine(e)
            for b in reversed(spine):                # the root's '%' first, as a recursive walk finds it
                if b.op == "%":
                    raise self.error(b.pos, "'%' works on sizes only (in types and attributes)",
                                     suggestion="there is no tensor remainder op")
            acc = self.value(f, leaf)
            for b in spine:
                acc = self.binary(f, b, acc, self.value(f, b.rhs), out if b is e else None)
            return [acc]
        raise self.error(e.pos, "unexpected expression")   # pragma: no cover (the parser makes no others)

    def binary(self, f: Frame, e: Binary, a: Value, b: Value, out: str | None) -> Value:
        """One operator over two evaluated operands: folded when both are numbers, else an op."""
        if not isinstance(a, str) and not isinstance(b, str):
            return self.fold(e, a, b)
        if e.op == "@":
            if not (isinstance(a, str) and isinstance(b, str)):
                raise self.error(e.pos, "'@' multiplies two tensors", suggestion="use '*' to scale by a number")
            return self.emit(f, "MatMul", [a, b], {}, e.pos, [out])[0]
        return self.emit(f, "Elementwise", [a, b], {"fn": OPERATORS[e.op]}, e.pos, [out])[0]

    def lookup(self, f: Frame, e: Name) -> Value:
        if e.name in f.env:
            return f.env[e.name]
        if e.name in f.syms:
            raise self.error(e.pos, f"{e.name!r} is a size; sizes appear in types and attributes, not as values",
                             suggestion=f"use it in an attribute, e.g. reshape(x, shape=[{e.name}, -1])")
        if e.name in self.vocab or e.name in self.graphs:
            what = "graph" if e.name in self.graphs else "op"
            raise self.error(e.pos, f"{e.name!r} is an {what}, not a value", suggestion=f"call it: {e.name}(x)")
        near = closest_match(e.name, list(f.env))
        raise self.error(e.pos, f"{e.name!r} is not defined" + (f"; did you mean {near!r}?" if near else ""),
                         suggestion="define it before this line (name = ...) or declare it as an input")

    # calls --------------------------------------------------------------------------------------
    def call(self, f: Frame, e: Call, n: int, outs: list) -> list:
        if e.func in self.graphs:
            return self.inline(f, e, n)
        cands = self.vocab.get(e.func)
        if not cands:
            near = closest_match(e.func, [*self.vocab, *self.graphs])
            raise self.error(e.pos, f"unknown op or graph {e.func!r}" + (f"; did you mean {near!r}?" if near else ""),
                             suggestion="call an op of the frontend vocabulary (docs/dsl.md lists them) or a graph "
                             "defined in this file")
        b = next((c for c in cands if c.arity == len(e.args)), cands[0])
        if b.arity is not None and b.arity != len(e.args):
            takes = " or ".join(f"{c.arity} input{'s' if c.arity != 1 else ''}" for c in cands)
            raise self.error(e.pos, f"{e.func} takes {takes}, got {len(e.args)}",
                             suggestion="inputs come first and positionally; attributes are keywords (name=value)")
        args = [self.value(f, a) for a in e.args]
        attrs: dict = {"fn": b.fn} if b.fn else {}
        kwpos: dict = {}
        for key, x, pos in e.kwargs:
            if key == "fn" and b.fn:
                raise self.error(pos, f"{e.func} fixes fn={b.fn!r}", suggestion=f"drop fn=, or call {b.op}(...)")
            attrs[key] = self.const(f, x)
            kwpos[key] = pos
        return self.emit(f, b.op, args, attrs, e.pos, outs + [None] * (n - len(outs)), n, kwpos, e.func)

    def emit(self, f: Frame, op: str, inputs: list, attrs: dict, pos: Pos, outs: list, n: int = 1,
             kwpos: dict | None = None, spelled: str | None = None) -> list[str]:
        from kumiko.frontend.lower import lower_op
        names = [o if o is not None and o not in self.tid else self.temp(f) for o in (outs + [None] * n)[:n]]
        self.used |= set(names)
        rec = _Recording(attrs)
        node = OpNode(op, names[0], tuple(inputs), tuple(names), rec)
        desc = f"{op}.{attrs['fn']}" if "fn" in attrs else op
        args = [self.tid[x] if isinstance(x, str) else x for x in inputs]
        try:
            res = lower_op(self.b, node, args)
        except KumikoError as err:
            raise self.relocate(err, pos, desc) from None
        if len(res) != n:
            raise self.error(pos, f"{spelled or op} gives {len(res)} value(s) but {n} names are assigned")
        for key in attrs:
            if key not in rec.read:
                near = closest_match(key, sorted(k for k in rec.read if isinstance(k, str)))
                if near:
                    raise self.error((kwpos or {}).get(key, pos), f"{spelled or op} does not use the attribute "
                                     f"{key!r}; did you mean {near!r}?", suggestion=f"write {near}=...")
        for name, nid in zip(names, res):
            self.tid[name] = nid
            self.types[name] = TensorType(self.b.dtype(nid), self.b.shape(nid))
        self.ops.append(_Op(op, list(inputs), list(names), dict(attrs), pos, self.chain()))
        return names

    def inline(self, f: Frame, e: Call, n: int) -> list:
        g = self.graphs[e.func]
        if len(g.results) != n:
            targets = ", ".join(r.name for r in g.results)
            raise self.error(e.pos, f"graph {g.name!r} returns {len(g.results)} value(s) but {n} name(s) take them",
                             suggestion=f"assign one name per output: ({targets}) = {g.name}(...)"
                             if len(g.results) > 1 else f"use it as one value: y = {g.name}(...)")
        if len(e.args) != len(g.params):
            want = ", ".join(p.name for p in g.params)
            raise self.error(e.pos, f"graph {g.name!r} takes {len(g.params)} input(s) ({want}), got {len(e.args)}",
                             suggestion=f"call it as {g.name}({want})")
        if e.kwargs:
            raise self.error(e.kwargs[0][2], f"graph {g.name!r} takes no attributes",
                             suggestion="pass every input positionally")
        if len(self.calls) >= MAX_DEPTH:
            names = ["main", *(c for _, _, c in self.calls), g.name]
            path = " -> ".join(names[:4] + (["..."] if len(names) > 6 else names[4:-2]) + names[-2:])
            raise self.error(e.pos, f"calls nest deeper than {MAX_DEPTH} ({path}); graphs are inlined and the DSL "
                             "has no conditionals, so a recursive graph never reaches a base case",
                             suggestion="unroll the recursion by hand, or call a different graph")
        args = [self.value(f, a) for a in e.args]
        callee = Frame(g, main=False)
        declared = {s.name: s for s in g.symbols}
        for p, a in zip(g.params, args):
            if isinstance(a, str) and len(p.type.dims) == len(self.types[a].shape):
                for d, ad in zip(p.type.dims, self.types[a].shape):
                    if isinstance(d, Name) and d.name in declared and d.name not in callee.syms:
                        callee.syms[d.name] = ad
        for s in g.symbols:
            if s.name not in callee.syms and s.default is not None:
                callee.syms[s.name] = s.default
        self.calls.append((f.graph.name, e.pos, g.name))
        wants = [self.type_of(callee, p.type) for p in g.params]
        self.calls.pop()
        for p, a, want, ae in zip(g.params, args, wants, e.args):
            if not isinstance(a, str):
                if want.shape != ():
                    raise self.error(ae.pos, f"input {p.name!r} of graph {g.name!r} is {_tstr(want)}, not a number",
                                     suggestion="pass a tensor", code="E1011")
            elif self.types[a] != want:
                raise self.error(ae.pos, f"input {p.name!r} of graph {g.name!r} must be {_tstr(want)}"
                                 f"{_bindings(callee)}, got {_tstr(self.types[a])}", code="E1011",
                                 suggestion="pass a value of the declared dtype and shape")
            callee.env[p.name], callee.defs[p.name] = a, p.pos
        self.reached.add(g.name)
        self.calls.append((f.graph.name, e.pos, g.name))
        self.frames.append(callee)
        try:
            return self.body(callee)
        finally:
            self.frames.pop()
            self.calls.pop()

def _qual_kinds(quals: tuple) -> list[tuple[str, str]]:
    return [(QUALIFIERS[w], w) for w, _ in quals]


def _tstr(t: TensorType) -> str:
    return f"{DSL_DTYPE.get(t.dtype.name, t.dtype.name)}[{', '.join(str(d) for d in t.shape)}]"


def _bindings(f: Frame) -> str:
    bound = [f"{k}={v}" for k, v in f.syms.items() if Expr.lift(v) != Expr.sym(k)]
    return f" (with {', '.join(bound)})" if bound else ""


def elaborate(program: Program, name: str) -> Graph:
    return Elaborator(program, name).run()
