"""Region JSON in the shape of seed 001 §6.8, and its loader (a dumped region stage can be resumed).

Expressions: ``{"read": {"tensor", "map"}}``, ``{"add": [a, b]}``, ``{"relu": [x]}``, ``{"cast": {"operand",
"to"}}``, ``{"select": {"pred", "then", "else"}}`` (an index guard is ``{"and": [{"ge": [e, 0]}, ...]}``),
``{"reduce": {"op", "axes", "init", "dtype", "body"}}``, ``{"BroadcastInDim": {"operand", "result_shape",
"broadcast_dimensions", "axes"}}``, ``{"transpose": {"operand", "permutation"}}``, ``{"gather": {...}}``;
a let is referenced by its name (a string), a constant is a number (``"-INF"``/``"INF"``/``"NAN"`` when
not finite, ``{"const": v, "dtype": d}`` when typed).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.region.ssa import (
    Axis,
    Binary,
    BroadcastInDim,
    Cast,
    Const,
    Gather,
    Guard,
    Layout,
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
    Transpose,
    Typer,
    Unary,
    Yield,
    typecheck,
)
from kumiko.symbolic import Expr, dim, dim_json, parse_expr


def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NAN" if math.isnan(v) else ("INF" if v > 0 else "-INF")
    return v


def _unnum(v: Any) -> Any:
    return {"NAN": float("nan"), "INF": float("inf"), "-INF": float("-inf")}.get(v, v) if isinstance(v, str) else v


def expr_json(e: RExpr, ty: Typer | None = None) -> Any:
    """JSON of an expression; with the region's Typer, BroadcastInDim also shows the seed's
    ``result_shape`` and ``broadcast_dimensions``."""
    return _expr_json(e, ty)


def _expr_json(e: RExpr, ty: Typer | None) -> Any:  # noqa: C901 (one case per node kind)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Const):
        return {"const": _num(e.value), "dtype": e.dtype.name} if e.dtype is not None else _num(e.value)
    if isinstance(e, Read):
        d = {"tensor": e.tensor, "map": [str(Expr.lift(i)) for i in e.index]}
        if e.flat:
            d["flat"] = True
        return {"read": d}
    if isinstance(e, Gather):
        return {"gather": {"tensor": e.tensor, "map": [str(Expr.lift(i)) for i in e.index], "var": e.var,
                           "by": _expr_json(e.by, ty)}}
    if isinstance(e, Unary):
        return {e.fn: [_expr_json(e.x, ty)]}
    if isinstance(e, Cast):
        return {"cast": {"operand": _expr_json(e.x, ty), "to": e.to.name}}
    if isinstance(e, Binary):
        return {e.fn: [_expr_json(e.x, ty), _expr_json(e.y, ty)]}
    if isinstance(e, Select):
        pred = ({"and": [{c_op: [str(Expr.lift(c)), 0]} for c, c_op in e.pred.constraints]}
                if isinstance(e.pred, Guard) else _expr_json(e.pred, ty))
        return {"select": {"pred": pred, "then": _expr_json(e.then, ty), "else": _expr_json(e.other, ty)}}
    if isinstance(e, Reduce):
        if ty is not None:
            ty.add_axes(e.axes)
        return {"reduce": {"op": e.op, "axes": [a.to_json() for a in e.axes], "init": _num(e.init),
                           "dtype": e.dtype.name, "body": _expr_json(e.body, ty)}}
    if isinstance(e, BroadcastInDim):
        d = {"operand": _expr_json(e.operand, ty), "axes": list(e.axes)}
        if ty is not None:
            _, ot = ty.type_of(e.operand)
            d["result_shape"] = [dim_json(ty.axes[a].size) for a in e.axes]
            d["broadcast_dimensions"] = [e.axes.index(a) for a in (ot.axes if ot else ())]
        return {"BroadcastInDim": d}
    if isinstance(e, Transpose):
        return {"transpose": {"operand": _expr_json(e.operand, ty), "permutation": list(e.perm)}}
    raise TypeError(e)


def region_json(r: Region) -> dict:
    r, types = typecheck(r)
    tensors = dict(r.inputs)
    tensors.update({o.name: o.memref for o in r.outputs})
    ty = Typer(r.name, r.iters, tensors)
    lets = []
    for let in r.lets:
        t = types[let.name]
        lets.append({"let": let.name, "axes": list(t.axes), "dtype": t.dtype.name, "expr": expr_json(let.expr, ty)})
        ty.lets[let.name] = t
    return {"region": {
        "name": r.name,
        "iters": [a.to_json() for a in r.iters],
        "inputs": [{"name": n, "memref": m.to_json()} for n, m in r.inputs],
        "outputs": [{"name": o.name, "memref": o.memref.to_json(), "materialize": o.materialize} for o in r.outputs],
        "lets": lets,
        "yield": [{"from": y.src, "to": y.to, **({"cast": y.cast.name} if y.cast else {})} for y in r.yields],
        "notes": list(r.notes),
    }}


def program_json(p: Program) -> dict:
    return {"kumiko": "region", "version": 1, "name": p.name, "symbols": dict(p.symbols),
            "inputs": [{"name": n, "memref": m.to_json()} for n, m in p.inputs],
            "outputs": [{"name": n, "memref": m.to_json()} for n, m in p.outputs],
            "buffers": [{"name": n, "memref": m.to_json()} for n, m in p.buffers],
            "regions": [region_json(r)["region"] for r in p.regions]}


# ------------------------------------------------------------------------------------------------
# loading

def _memref(d: Mapping) -> MemRef:
    lay = d.get("layout") or {}
    return MemRef(tuple(dim(x) for x in d["shape"]), dtypes.lookup(d["dtype"]),
                  Layout(lay.get("kind", "row_major"), tuple(sorted((lay.get("params") or {}).items()))),
                  int(d.get("alignment", 128)), bool(d.get("noalias", True)))


def _axis(d: Mapping) -> Axis:
    return Axis(d["name"], dim(d["size"]))


def _ix(s: Any) -> Expr:
    return parse_expr(s) if isinstance(s, str) else Expr.lift(s)


def expr_from_json(j: Any) -> RExpr:
    if isinstance(j, str) and j not in ("NAN", "INF", "-INF"):
        return Ref(j)
    if not isinstance(j, dict):
        return Const(_unnum(j))
    if "const" in j:
        return Const(_unnum(j["const"]), dtypes.lookup(j.get("dtype")) if j.get("dtype") else None)
    (k, v), = j.items()
    if k == "read":
        return Read(v["tensor"], tuple(_ix(x) for x in v["map"]), bool(v.get("flat", False)))
    if k == "gather":
        return Gather(v["tensor"], tuple(_ix(x) for x in v["map"]), v["var"], expr_from_json(v["by"]))
    if k == "cast":
        return Cast(expr_from_json(v["operand"]), dtypes.lookup(v["to"]))
    if k == "select":
        p = v["pred"]
        if isinstance(p, dict) and "and" in p:
            pred: Any = Guard(tuple((_ix(c[op][0]), op) for c in p["and"] for op in c))
        else:
            pred = expr_from_json(p)
        return Select(pred, expr_from_json(v["then"]), expr_from_json(v["else"]))
    if k == "reduce":
        return Reduce(v["op"], tuple(_axis(a) for a in v["axes"]), _unnum(v["init"]),
                      dtypes.lookup(v.get("dtype")) if v.get("dtype") else None, expr_from_json(v["body"]))
    if k == "BroadcastInDim":
        return BroadcastInDim(expr_from_json(v["operand"]), tuple(v["axes"]))
    if k == "transpose":
        return Transpose(expr_from_json(v["operand"]), tuple(v["permutation"]))
    if isinstance(v, list) and len(v) == 1:
        return Unary(k, expr_from_json(v[0]))
    if isinstance(v, list) and len(v) == 2:
        return Binary(k, expr_from_json(v[0]), expr_from_json(v[1]))
    raise KumikoError("E1009", at="region", why=f"cannot read the region expression {k!r}")


def region_from_json(d: Mapping) -> Region:
    d = d.get("region", d)
    return Region(d["name"], tuple(_axis(a) for a in d["iters"]),
                  tuple((i["name"], _memref(i["memref"])) for i in d["inputs"]),
                  tuple(Output(o["name"], _memref(o["memref"]), o.get("materialize", "gmem")) for o in d["outputs"]),
                  tuple(Let(x["let"], expr_from_json(x["expr"])) for x in d["lets"]),
                  tuple(Yield(y["from"], y["to"], dtypes.lookup(y["cast"]) if y.get("cast") else None)
                        for y in d["yield"]),
                  tuple(d.get("notes", ())))


def program_from_json(d: Mapping) -> Program:
    return Program(d["name"], tuple(region_from_json(r) for r in d["regions"]),
                   tuple((i["name"], _memref(i["memref"])) for i in d["inputs"]),
                   tuple((i["name"], _memref(i["memref"])) for i in d["outputs"]),
                   tuple((i["name"], _memref(i["memref"])) for i in d.get("buffers", ())),
                   dict(d.get("symbols") or {}))
