"""Frontend IR (seed 001 §2): a graph signature, a tensor table and a list of high-level ops.

A ``Graph`` is checked when it is made: names are defined once and before use, the signature names
real tensors, every op's shapes and dtypes are inferred (by lowering it to Tiny IR, the one place
where op semantics live; see ``kumiko.frontend.lower``) and any type the tensor table declares must
match what was inferred. A Graph that exists is therefore valid, and ``graph.tiny`` is its Tiny IR.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_json, dims
from kumiko.tiny.ir import FrozenDict, TinyGraph

ROLES = ("data", "param", "state")
MUTABILITY = ("immutable", "mutable")
STORAGES = (None, "const_pool", "arena", "external")


@dataclass(frozen=True)
class TensorType:
    dtype: dtypes.DType
    shape: tuple

    def to_json(self) -> dict:
        return {"dtype": self.dtype.name, "shape": [dim_json(d) for d in self.shape]}

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SigInput:
    tensor: str
    role: str = "data"
    mutability: str = "immutable"
    storage: str | None = None

    def to_json(self) -> dict:
        d = {"tensor": self.tensor, "role": self.role, "mutability": self.mutability}
        if self.storage:
            d["storage"] = self.storage
        return d


@dataclass(frozen=True)
class OpNode:
    op: str
    name: str
    inputs: tuple            # tensor names, or numeric literals (scalars) for Elementwise
    outputs: tuple[str, ...]
    attrs: FrozenDict = field(default_factory=FrozenDict)

    @property
    def fn(self) -> str | None:
        return self.attrs.get("fn")

    def to_json(self) -> dict:
        d: dict = {"op": self.op, "name": self.name}
        attrs = dict(self.attrs)
        if "fn" in attrs:
            d["fn"] = attrs.pop("fn")
        d["inputs"] = [_lit_json(x) for x in self.inputs]
        d["outputs"] = list(self.outputs)
        if attrs:
            d["attrs"] = {k: _attr_json(v) for k, v in attrs.items()}
        return d

    def describe(self) -> str:
        return f"{self.name} ({self.op}{'.' + self.fn if self.fn else ''})"


def _lit_json(x: Any) -> Any:
    if isinstance(x, float) and x != x:
        return {"const": "nan"}
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return {"const": "inf" if x > 0 else "-inf"}
    return x


def _attr_json(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_attr_json(x) for x in v]
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return _lit_json(v)
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict) and set(v) == {"const"}:
        if v["const"] not in ("nan", "inf", "-inf") and not isinstance(v["const"], (int, float)):
            raise KumikoError("E1009", at="graph", why=f"a literal {{'const': ...}} holds 'nan', 'inf', '-inf' or a "
                              f"number, got {v['const']!r}")
        return float(v["const"])
    return v


@dataclass(frozen=True, eq=False)
class Graph:
    inputs: tuple[SigInput, ...]
    outputs: tuple[str, ...]
    tensors: Mapping[str, TensorType]      # every tensor: signature inputs, intermediates, outputs
    nodes: tuple[OpNode, ...]
    symbols: Mapping[str, int] = field(default_factory=dict)   # default sizes for symbols (for `run`)
    name: str = "main"
    tiny: TinyGraph | None = field(default=None, repr=False)
    #: values of ``param`` inputs known when the graph is made (e.g. ONNX initializers); executables
    #: fill inputs the caller leaves out from here. Not part of the JSON form (arrays, not text).
    params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: fp32 data inputs that executables also take as float64 arrays, narrowed at the call (fp64 inputs
    #: narrowed by ``with_float_dtype("fp32", only="fp64")``, as ``from_onnx(narrow_double=True)`` does).
    #: Not part of the JSON form.
    fp64_inputs: frozenset = field(default_factory=frozenset, repr=False)

    # construction -----------------------------------------------------------------------------------
    @staticmethod
    def make(inputs: Iterable[SigInput], outputs: Iterable[str], tensors: Mapping[str, TensorType],
             nodes: Iterable[OpNode], symbols: Mapping[str, int] | None = None, name: str = "main",
             params: Mapping[str, Any] | None = None) -> "Graph":
        """Validate, infer every tensor's type and lower to Tiny IR; raises a KumikoError on bad input."""
        from kumiko.frontend.lower import lower_graph
        inputs, outputs, nodes = tuple(inputs), tuple(outputs), tuple(nodes)
        nodes = _check_names(inputs, outputs, tensors, nodes)
        for k in params or {}:
            if k not in {i.tensor for i in inputs}:
                raise KumikoError("E1013", at=f"params.{k}", why=f"param value {k!r} is not a signature input")
        table, tiny = lower_graph(inputs, outputs, tensors, nodes, dict(symbols or {}), name)
        return Graph(inputs, outputs, table, nodes, dict(symbols or {}), name, tiny, dict(params or {}))

    @cached_property
    def input_types(self) -> dict[str, TensorType]:
        return {i.tensor: self.tensors[i.tensor] for i in self.inputs}

    @cached_property
    def output_types(self) -> dict[str, TensorType]:
        return {o: self.tensors[o] for o in self.outputs}

    def symbol_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for i in self.inputs:
            for d in self.tensors[i.tensor].shape:
                if not isinstance(d, int):
                    seen.update(dict.fromkeys(sorted(d.symbols())))
        return list(seen)

    # JSON -------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d: dict = {"kumiko": "frontend", "version": 1, "name": self.name}
        if self.symbols:
            d["symbols"] = dict(self.symbols)
        d["signature"] = {"inputs": [i.to_json() for i in self.inputs],
                          "outputs": [{"tensor": o} for o in self.outputs]}
        d["tensors"] = {k: v.to_json() for k, v in self.tensors.items()}
        d["graph"] = [n.to_json() for n in self.nodes]
        return d

    @staticmethod
    def from_json(d: Any, where: str = "graph") -> "Graph":
        if not isinstance(d, Mapping):
            raise KumikoError("E1009", at=where, why="a graph file must hold a JSON object")
        sig = _need(d, "signature", Mapping, where)
        tens = _need(d, "tensors", Mapping, where)
        ops = _need(d, "graph", list, where)
        inputs = []
        for k, i in enumerate(_need(sig, "inputs", list, f"{where}.signature")):
            at = f"{where}.signature.inputs[{k}]"
            if isinstance(i, str):
                i = {"tensor": i}
            if not isinstance(i, Mapping) or not isinstance(i.get("tensor"), str):
                raise KumikoError("E1009", at=at, why="each signature input needs a 'tensor' name")
            entry = SigInput(i["tensor"], i.get("role", "data"), i.get("mutability", "immutable"), i.get("storage"))
            check_sig_input(entry, at)
            inputs.append(entry)
        outputs = []
        for k, o in enumerate(_need(sig, "outputs", list, f"{where}.signature")):
            name = o if isinstance(o, str) else (o.get("tensor") if isinstance(o, Mapping) else None)
            if not isinstance(name, str):
                raise KumikoError("E1009", at=f"{where}.signature.outputs[{k}]", why="each output needs a 'tensor'")
            outputs.append(name)
        tensors = {}
        for name, t in tens.items():
            at = f"{where}.tensors.{name}"
            if not isinstance(t, Mapping) or "dtype" not in t or not isinstance(t.get("shape"), list):
                raise KumikoError("E1009", at=at, why="a tensor needs 'dtype' and a 'shape' list")
            dt = dtypes.lookup(t["dtype"])
            if dt is None or dt.name not in dtypes.USER:
                raise KumikoError("E1012", at=at, why=f"dtype {t['dtype']!r} is not supported")
            try:
                shape = dims(t["shape"])
            except (SyntaxError, TypeError, ValueError) as e:
                raise KumikoError("E1009", at=at, why=f"bad shape {t['shape']!r}: {e}") from None
            except RecursionError:      # the size-expression parser recurses once per parenthesis
                raise KumikoError("E1018", at=at, why="a size expression of this shape nests too deeply to read") \
                    from None
            if any(isinstance(s, int) and s < 0 for s in shape):
                raise KumikoError("E1009", at=at, why=f"bad shape {t['shape']!r}: sizes must be >= 0")
            tensors[name] = TensorType(dt, shape)
        nodes = []
        for k, n in enumerate(ops):
            at = f"{where}.graph[{k}]"
            if not isinstance(n, Mapping) or not isinstance(n.get("op"), str):
                raise KumikoError("E1009", at=at, why="each op needs an 'op' string")
            ins, outs = n.get("inputs", []), n.get("outputs", [])
            if not isinstance(ins, list) or not isinstance(outs, list) or not outs or \
                    not all(isinstance(o, str) for o in outs):
                raise KumikoError("E1009", at=at, why="'inputs' must be a list and 'outputs' a non-empty list of names")
            if not isinstance(n.get("attrs") or {}, Mapping):
                raise KumikoError("E1009", at=at, why="'attrs' must be an object")
            attrs = dict(n.get("attrs") or {})
            if "fn" in n and not isinstance(n["fn"], str):
                raise KumikoError("E1009", at=at, why=f"'fn' must be a string, got {n['fn']!r}")
            if "fn" in n:
                attrs["fn"] = n["fn"]
            nodes.append(OpNode(n["op"], str(n.get("name") or f"{n['op'].lower()}_{k}"),
                                tuple(_freeze(x) for x in ins), tuple(outs),
                                FrozenDict({a: _freeze(v) for a, v in attrs.items()})))
        symbols = d.get("symbols") or {}
        if not isinstance(symbols, Mapping) or not all(isinstance(v, int) for v in symbols.values()):
            raise KumikoError("E1009", at=f"{where}.symbols", why="'symbols' maps size names to ints")
        return Graph.make(inputs, outputs, tensors, nodes, dict(symbols), str(d.get("name", "main")))

    def with_float_dtype(self, dtype: str, only: str | None = None) -> "Graph":
        """The same graph with every floating-point tensor (and float param value) stored as ``dtype``:
        how an fp32 example becomes the fp16 or bf16 program the tensor-core path compiles. Accumulator
        dtypes (``acc_dtype``) are attributes and stay, unless narrower than ``dtype`` (fp32 ones in an fp64
        graph widen to fp64); an op whose own attributes name a dtype that no longer fits (a Cast to fp32
        feeding an fp16 add) is reported by the frontend's checks as usual.

        ``only`` (a float dtype) retypes just the tensors and params of that dtype, and the dtype attributes
        (``to``, ``acc_dtype``, ``out_dtype``) naming it: ``with_float_dtype("fp32", only="fp64")`` narrows
        float64 to fp32 (``from_onnx(..., narrow_double=True)``). A finite param value the new dtype cannot
        hold is then E1012, and the retyped data inputs still take float64 arrays (``fp64_inputs``)."""
        dt, src = dtypes.lookup(dtype), dtypes.lookup(only) if only is not None else None
        if dt is None or not dt.is_float or dt.name not in dtypes.USER or (only is not None and (
                src is None or not src.is_float)):
            raise KumikoError("E1012", at=f"{self.name} as {dtype}", suggestion="give fp16, bf16, fp32 or fp64",
                              why=f"{dtype!r} (from {only!r}) is not a floating-point dtype a graph may use")

        def hit(name: Any) -> bool:
            t = dtypes.lookup(name)
            return t is not None and (t is src if src is not None else t.is_float)
        d = self.to_json()
        for t in d["tensors"].values():
            if hit(t["dtype"]):
                t["dtype"] = dt.name
        for n in d["graph"]:
            attrs = n.get("attrs", {})
            if src is not None:
                attrs.update({k: dt.name for k in ("to", "acc_dtype", "out_dtype") if hit(attrs.get(k))})
            acc = dtypes.lookup(attrs.get("acc_dtype"))
            if acc is not None and acc.is_float and acc.itemsize < dt.itemsize:
                attrs["acc_dtype"] = dt.name        # an accumulator narrower than the values widens with them
        g = Graph.from_json(d, f"{self.name} as {dt.name}")
        params = {}
        for k, v in self.params.items():
            v = np.asarray(v)
            if v.dtype.kind != "f" or not hit(dtypes.from_numpy(v.dtype)):
                params[k] = v
                continue
            with np.errstate(over="ignore"):
                params[k] = v.astype(dt.np)
            if src is not None and (np.isinf(params[k]) & np.isfinite(v)).any():
                raise KumikoError("E1012", at=f"{self.name} as {dt.name}", why=f"param {k!r} holds finite "
                                  f"{src.name} values beyond the {dt.name} range")
        wide = frozenset(i.tensor for i in self.inputs if i.role == "data" and self.tensors[i.tensor].dtype is
                         dtypes.fp64) if src is dtypes.fp64 and dt is dtypes.fp32 else frozenset()
        return replace(g, params=params or g.params, fp64_inputs=self.fp64_inputs | wide)

    def save(self, path: str | Path) -> None:
        from kumiko.util import atomic_write
        atomic_write(Path(path), json.dumps(self.to_json(), indent=2) + "\n")

    # text -----------------------------------------------------------------------------------------
    #: a graph with more ops than this prints its first and last ``STR_ENDS`` ops and a count between
    STR_MAX_OPS = 24
    STR_ENDS = 8

    def __str__(self) -> str:
        """The graph for reading (``print(graph)``, the REPL): name and signature, default sizes, then one
        op per line with its output types; the dataclass's one-line repr of every field was unreadable."""
        def sig(t: str) -> str:
            role = next((i.role for i in self.inputs if i.tensor == t), "data")
            return f"{t}: {self.tensors[t]}" + (f" ({role})" if role != "data" else "")

        lines = [f"Graph {self.name}({', '.join(sig(i.tensor) for i in self.inputs)}) -> "
                 f"({', '.join(sig(o) for o in self.outputs)})"]
        if self.symbols:
            lines.append(f"  symbols: {', '.join(f'{k}={v}' for k, v in self.symbols.items())}")
        nodes = self.nodes
        if len(nodes) > self.STR_MAX_OPS:
            nodes = (*nodes[:self.STR_ENDS], None, *nodes[-self.STR_ENDS:])
        for n in nodes:
            if n is None:
                lines.append(f"  ... {len(self.nodes) - 2 * self.STR_ENDS} more ops ...")
                continue
            ins = ", ".join(str(x) for x in n.inputs)
            outs = ", ".join(f"{o}: {self.tensors[o]}" if o in self.tensors else o for o in n.outputs)
            lines.append(f"  {n.name} = {n.op}{'.' + n.fn if n.fn else ''}({ins}) -> {outs}")
        lines.append(f"  ({len(self.nodes)} op{'s' * (len(self.nodes) != 1)})")
        return "\n".join(lines)

    __repr__ = __str__


#: how deeply a graph file's JSON may nest (a frontend graph needs about 6 levels, a Tiny IR dump
#: about 8); checked before parsing, because Python's json recurses once per level (RecursionError)
MAX_JSON_DEPTH = 64
#: JSON integers beyond int64 are refused (kumiko's sizes and constants are at most int64)
MAX_JSON_INT_DIGITS = 19
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def loads(text: str, where: str) -> Any:
    """Parse a graph file's JSON text; every failure is a ``KumikoError``: malformed JSON (E1009 with
    the position), nesting deeper than MAX_JSON_DEPTH (E1018, found by a scan that does not recurse)
    and integers outside int64 (E1009; Python's int-string limit would raise a ValueError at 4300
    digits and json a RecursionError at about 1000 levels)."""
    depth = 0
    for m in re.finditer(r"[\[\]{}]", _JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise KumikoError("E1018", at=where, why=f"the JSON nests deeper than {MAX_JSON_DEPTH} levels",
                              limit=MAX_JSON_DEPTH)

    def parse_int(s: str) -> int:
        if len(s.lstrip("-0")) > MAX_JSON_INT_DIGITS or not -2 ** 63 <= int(s) < 2 ** 63:
            raise KumikoError("E1009", at=where, why=f"the integer {s[:20]}{'...' if len(s) > 20 else ''} "
                              f"({len(s.lstrip('-'))} digits) is outside the int64 range")
        return int(s)

    try:
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        line = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else ""
        raise KumikoError("E1009", at=f"{where}:{e.lineno}:{e.colno}", why=f"invalid JSON: {e.msg}",
                          excerpt=f"  {line}\n  {' ' * (e.colno - 1)}^",
                          suggestion="Fix the JSON syntax at the marked position.") from None


def _need(d: Mapping, key: str, typ: type, where: str) -> Any:
    if key not in d:
        raise KumikoError("E1009", at=where, why=f"missing '{key}'")
    if not isinstance(d[key], typ):
        raise KumikoError("E1009", at=f"{where}.{key}", why=f"'{key}' must be a {typ.__name__}")
    return d[key]


def check_sig_input(i: SigInput, at: str) -> None:
    """A signature input's name, role, mutability and storage are among the known ones (E1013); checked
    by every way of making a Graph (JSON, the Tensor API, the DSL, ONNX import)."""
    if not isinstance(i.tensor, str) or not i.tensor:
        raise KumikoError("E1013", at=at, why=f"an input's name must be a non-empty string, got {i.tensor!r}")
    if i.role not in ROLES or i.mutability not in MUTABILITY or i.storage not in STORAGES:
        raise KumikoError("E1013", at=at, why=f"role must be one of {ROLES}, mutability one of {MUTABILITY}, "
                          f"storage one of {STORAGES[1:]} (got {i.role!r}, {i.mutability!r}, {i.storage!r})")


def _check_names(inputs: tuple, outputs: tuple, tensors: Mapping, nodes: tuple) -> tuple:
    seen: set[str] = set()
    for i in inputs:
        check_sig_input(i, f"signature.inputs.{i.tensor}")
        if i.tensor in seen:
            raise KumikoError("E1013", at=f"signature.inputs.{i.tensor}", why=f"input {i.tensor!r} is listed twice")
        if i.tensor not in tensors:
            raise KumikoError("E1013", at=f"signature.inputs.{i.tensor}",
                              why=f"input {i.tensor!r} has no entry in the tensor table (dtype and shape)")
        seen.add(i.tensor)
    names: set[str] = set()
    producer: dict[str, OpNode] = {}
    for n in nodes:
        if n.name in names:
            raise KumikoError("E1016", at=f"op {n.name}", why=f"op name {n.name!r} is used twice")
        names.add(n.name)
        for o in n.outputs:
            if o in seen or o in producer:
                raise KumikoError("E1016", at=f"op {n.describe()}", why=f"tensor {o!r} is defined twice")
            producer[o] = n
    for n in nodes:
        for x in n.inputs:
            if isinstance(x, str) and x not in seen and x not in producer:
                raise KumikoError("E1007", at=f"op {n.describe()}", why=f"input {x!r} is not defined",
                                  suggestion="Define it as a signature input or as some op's output.")
    order = _topo(nodes, producer)
    seen |= set(producer)
    if not outputs:
        raise KumikoError("E1013", at="signature.outputs", why="the graph has no outputs")
    for o in outputs:
        if o not in seen:
            raise KumikoError("E1013", at=f"signature.outputs.{o}", why=f"output {o!r} is not produced by any op")
    if len(set(outputs)) != len(outputs):
        raise KumikoError("E1013", at="signature.outputs", why="an output is listed twice")
    return order


def _topo(nodes: tuple, producer: Mapping[str, OpNode]) -> tuple:
    """Ops in dependency order (stable: file order where free); a cycle is E1008."""
    state: dict[str, int] = {}
    order: list[OpNode] = []
    for root in nodes:
        stack = [(root, False)]
        while stack:
            n, done = stack.pop()
            if done:
                state[n.name] = 2
                order.append(n)
                continue
            if state.get(n.name) == 2:
                continue
            if state.get(n.name) == 1:
                continue
            state[n.name] = 1
            stack.append((n, True))
            for x in reversed([x for x in n.inputs if isinstance(x, str) and x in producer]):
                p = producer[x]
                if state.get(p.name) == 1:
                    raise KumikoError("E1008", at=f"op {p.describe()}",
                                      why=f"{p.name!r} and {n.name!r} depend on each other through {x!r}")
                if state.get(p.name) != 2:
                    stack.append((p, False))
    return tuple(order)
