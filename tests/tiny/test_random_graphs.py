"""Differential tests: random chains of elementwise / movement / reduce ops, built twice in lockstep.

Hypothesis draws a start shape and a list of ops; every op is applied both to a kumiko value (through the
``Tensor`` API, or straight to Tiny IR with ``TinyBuilder``) and to a float64 numpy array by the plain
numpy formula. The graph's evaluation must match the numpy chain. The only discontinuous op (a
comparison feeding ``where``) compares an exact input with a constant, so fp32-vs-fp64 rounding can
never flip a branch.
"""
from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kumiko
from kumiko import Tensor
from kumiko.tiny import TinyBuilder, load, to_json

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Chain:
    """A kumiko Tensor and its numpy twin, plus the fresh inputs drawn along the way."""

    def __init__(self, rng: np.random.Generator, shape: tuple):
        self.rng = rng
        self.n_inputs = 0
        self.t, self.ref = self.fresh(shape)
        self.scale = float(np.max(np.abs(self.ref)))

    def fresh(self, shape, dtype=np.float32):
        arr = self.rng.standard_normal(shape).astype(np.float32)
        if dtype == np.bool_:
            arr = arr > 0
        t = Tensor(arr, name=f"in{self.n_inputs}")
        self.n_inputs += 1
        return t, arr.astype(np.float64) if dtype != np.bool_ else arr

    def apply(self, t, ref):
        self.t, self.ref = t, np.asarray(ref, dtype=np.float64)
        assert tuple(self.t.shape) == self.ref.shape, (self.t.shape, self.ref.shape)
        if self.ref.size:
            self.scale = max(self.scale, float(np.max(np.abs(self.ref))))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    "neg": (lambda t: -t, lambda x: -x),
    "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0)),
    "abs": (lambda t: t.abs(), np.abs),
    "sigmoid": (lambda t: t.sigmoid(), _sigmoid),
    "tanh": (lambda t: t.tanh(), np.tanh),
    "silu": (lambda t: t.silu(), lambda x: x * _sigmoid(x)),
    "exp_of_tanh": (lambda t: t.tanh().exp(), lambda x: np.exp(np.tanh(x))),
    "sqrt_abs": (lambda t: (t.abs() + 0.5).sqrt(), lambda x: np.sqrt(np.abs(x) + 0.5)),
}
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "max": (lambda a, b: a.maximum(b), np.maximum),
    "min": (lambda a, b: a.minimum(b), np.minimum),
}
OPS = ["unary", "binary", "scalar", "where", "reshape", "permute", "expand", "pad", "slice", "flip", "reduce",
       "cumsum", "concat"]


def _broadcastable_shape(data, shape):
    """A shape that broadcasts against ``shape``: some axes set to 1, maybe fewer leading axes."""
    drop = data.draw(st.integers(0, len(shape)), label="drop")
    return tuple(1 if data.draw(st.booleans(), label="one") else d for d in shape[drop:])


def step(data, c: Chain) -> None:
    shape = c.ref.shape
    rank = len(shape)
    op = data.draw(st.sampled_from(OPS), label="op")
    if op == "unary":
        f, g = UNARY[data.draw(st.sampled_from(sorted(UNARY)), label="fn")]
        c.apply(f(c.t), g(c.ref))
    elif op == "binary":
        f, g = BINARY[data.draw(st.sampled_from(sorted(BINARY)), label="fn")]
        other, oref = c.fresh(_broadcastable_shape(data, shape))
        if data.draw(st.booleans(), label="swap"):
            c.apply(f(other, c.t), g(oref, c.ref))
        else:
            c.apply(f(c.t, other), g(c.ref, oref))
    elif op == "scalar":
        k = data.draw(st.sampled_from([-1.5, 0.5, 2.0, 3.0]), label="k")
        which = data.draw(st.sampled_from(["add", "rsub", "mul", "div", "rdiv_pos"]), label="sfn")
        if which == "add":
            c.apply(c.t + k, c.ref + k)
        elif which == "rsub":
            c.apply(k - c.t, k - c.ref)
        elif which == "mul":
            c.apply(c.t * k, c.ref * k)
        elif which == "div":
            c.apply(c.t / k, c.ref / k)
        else:
            c.apply(k / (c.t.abs() + 1.0), k / (np.abs(c.ref) + 1.0))
    elif op == "where":
        cond, cref = c.fresh(_broadcastable_shape(data, shape))
        k = data.draw(st.sampled_from([-2.0, 0.0, 1.0]), label="k")
        cond = cond > 0.25
        c.apply(cond.where(c.t, k), np.where(cref > 0.25, c.ref, k))
    elif op == "reshape":
        kind = data.draw(st.sampled_from(["flatten", "insert1", "merge", "split"]), label="kind")
        if kind == "flatten":
            new = [-1]
        elif kind == "insert1":
            k = data.draw(st.integers(0, rank), label="at")
            new = list(shape[:k]) + [1] + list(shape[k:])
        elif kind == "merge" and rank >= 2:
            k = data.draw(st.integers(0, rank - 2), label="at")
            new = list(shape[:k]) + [shape[k] * shape[k + 1]] + list(shape[k + 2:])
        else:
            n = int(np.prod(shape))
            f = next((f for f in (2, 3) if n % f == 0 and n > f), None)
            new = [f, -1] if f else [-1, 1]
        c.apply(c.t.reshape(new), c.ref.reshape(new))
    elif op == "permute" and rank >= 2:
        perm = data.draw(st.permutations(range(rank)), label="perm")
        c.apply(c.t.permute(list(perm)), np.transpose(c.ref, perm))
    elif op == "expand" and rank <= 3:
        lead = data.draw(st.integers(1, 3), label="lead")
        new = [lead] + [d if d != 1 else data.draw(st.integers(1, 3), label="grow") for d in shape]
        c.apply(c.t.expand(new), np.broadcast_to(c.ref, new))
    elif op == "pad" and rank >= 1:
        pads = [(data.draw(st.integers(-min(d - 1, 2), 2), label="lo"),
                 data.draw(st.integers(-min(d - 1, 2), 2), label="hi")) for d in shape]
        pads = [(lo, hi) if d + lo + hi >= 1 else (max(lo, 0), max(hi, 0)) for (lo, hi), d in zip(pads, shape)]
        value = data.draw(st.sampled_from([0.0, -1.0, 2.5]), label="value")
        y = np.pad(c.ref, [(max(lo, 0), max(hi, 0)) for lo, hi in pads], constant_values=value)
        y = y[tuple(slice(-min(lo, 0), y.shape[k] + min(hi, 0)) for k, (lo, hi) in enumerate(pads))]
        c.apply(c.t.pad(pads, value), y)
    elif op == "slice" and rank >= 1:
        key = []
        for d in shape:
            st_ = data.draw(st.sampled_from([1, 1, 2, 3, -1, -2]), label="step")
            a = data.draw(st.integers(-d, d - 1), label="start")
            b = data.draw(st.one_of(st.none(), st.integers(-d - 1, d)), label="stop")
            if len(range(*slice(a, b, st_).indices(d))) == 0:
                a, b = None, None   # keep every axis non-empty
            key.append(slice(a, b, st_))
        c.apply(c.t[tuple(key)], c.ref[tuple(key)])
    elif op == "flip" and rank >= 1:
        axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                                  unique_by=lambda a: a % rank), label="axes")
        c.apply(c.t.flip(axes), np.flip(c.ref, axis=tuple(axes)))
    elif op == "reduce" and rank >= 1:
        fn = data.draw(st.sampled_from(["sum", "max", "min", "mean"]), label="rfn")
        axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True), label="axes")
        keep = data.draw(st.booleans(), label="keepdim") or rank == len(axes)
        ref = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}[fn](c.ref, axis=tuple(axes), keepdims=keep)
        c.apply(getattr(c.t, fn)(axes, keep), ref)
    elif op == "cumsum" and rank >= 1:
        ax = data.draw(st.integers(-rank, rank - 1), label="axis")
        excl, rev = data.draw(st.booleans(), label="exclusive"), data.draw(st.booleans(), label="reverse")
        x = np.flip(c.ref, ax) if rev else c.ref
        y = np.cumsum(x, axis=ax) - (x if excl else 0)
        c.apply(c.t.cumsum(ax, excl, rev), np.flip(y, ax) if rev else y)
    elif op == "concat" and rank >= 1:
        ax = data.draw(st.integers(0, rank - 1), label="axis")
        s = list(shape)
        s[ax] = data.draw(st.integers(1, 3), label="extent")
        other, oref = c.fresh(tuple(s))
        if data.draw(st.booleans(), label="first"):
            c.apply(other.cat(c.t, dim=ax), np.concatenate([oref, c.ref], axis=ax))
        else:
            c.apply(c.t.cat(other, dim=ax), np.concatenate([c.ref, oref], axis=ax))


def check(got: np.ndarray, c: Chain) -> None:
    want = c.ref
    assert got.shape == want.shape and got.dtype == np.float32
    # fp32 vs float64 rounding is relative to the largest magnitude seen along the chain (cancellation)
    err = np.max(np.abs(got.astype(np.float64) - want)) if want.size else 0.0
    assert err <= 2e-5 * max(c.scale, 1.0), f"abs error {err:.3g} at scale {c.scale:.3g}"


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2 ** 32 - 1),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       n_ops=st.integers(1, 7))
def test_random_tensor_chains_match_numpy(data, seed, shape, n_ops):
    c = Chain(np.random.default_rng(seed), shape)
    for _ in range(n_ops):
        step(data, c)
    if c.t.op is None:                      # every drawn op was skipped: do something
        c.apply(c.t + 1.0, c.ref + 1.0)
    check(c.t.numpy(), c)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2 ** 32 - 1),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       n_ops=st.integers(1, 5))
def test_random_graphs_survive_json_round_trips(data, seed, shape, n_ops):
    """The same random graph, dumped to frontend JSON and to Tiny IR JSON and loaded back, still matches."""
    c = Chain(np.random.default_rng(seed), shape)
    for _ in range(n_ops):
        step(data, c)
    c.apply(c.t * 1.0, c.ref)
    g = c.t.graph("out")
    inputs = {t: _leaf_data(c.t, t) for t in g.input_types}
    g2 = kumiko.Graph.from_json(json.loads(json.dumps(g.to_json())))
    tiny = load(json.loads(json.dumps(to_json(g.tiny))))
    for prog in (g, g2, tiny):
        check(kumiko.compile(prog)(**inputs)["out"], c)


def _leaf_data(root: Tensor, name: str) -> np.ndarray:
    stack, seen = [root], set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op is None and t.name == name:
            return t.data
        stack.extend(s for s in t.srcs if isinstance(s, Tensor))
    raise KeyError(name)


# ------------------------------------------------------------------------------------------------
# straight Tiny IR: the uops themselves against numpy


def tiny_step(data, b: TinyBuilder, x: str, ref: np.ndarray, rng, feeds: dict) -> tuple[str, np.ndarray]:
    shape = ref.shape
    rank = len(shape)
    op = data.draw(st.sampled_from(["ADD", "MUL", "MAX", "SUB", "FDIV", "NEG", "EXP2", "RELU", "SQRT", "RESHAPE",
                                    "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "REDUCE", "CAST", "WHERE",
                                    "CMP", "VIEW"]), label="uop")
    if op in ("ADD", "MUL", "MAX", "SUB", "FDIV"):
        if data.draw(st.booleans(), label="imm"):
            k = data.draw(st.sampled_from([0.5, 2.0, -3.0]), label="k")
            fn = {"ADD": np.add, "MUL": np.multiply, "MAX": np.maximum, "SUB": np.subtract, "FDIV": np.divide}[op]
            return b.add(op, [x, k]), fn(ref, k)
        name = f"in{len(feeds)}"
        arr = rng.standard_normal(shape).astype(np.float32)
        if op == "FDIV":
            arr = np.abs(arr) + 0.5
        feeds[name] = arr
        y = b.add("INPUT", tensor_id=name, dtype="fp32", shape=shape)
        fn = {"ADD": np.add, "MUL": np.multiply, "MAX": np.maximum, "SUB": np.subtract, "FDIV": np.divide}[op]
        return b.add(op, [x, y]), fn(ref, arr.astype(np.float64))
    if op == "NEG":
        return b.add("NEG", [x]), -ref
    if op == "EXP2":
        t = b.add("MIN", [b.add("MAX", [x, -4.0]), 4.0])
        return b.add("EXP2", [t]), np.exp2(np.clip(ref, -4, 4))
    if op == "RELU":
        return b.add("RELU", [x]), np.maximum(ref, 0)
    if op == "SQRT":
        t = b.add("ADD", [b.add("RELU", [x]), 0.25])
        return b.add("SQRT", [t]), np.sqrt(np.maximum(ref, 0) + 0.25)
    if op == "RESHAPE":
        new = (int(np.prod(shape)),) if rank != 1 else (1, shape[0])
        return b.add("RESHAPE", [x], result_shape=new), ref.reshape(new)
    if op == "PERMUTE" and rank >= 2:
        perm = tuple(data.draw(st.permutations(range(rank)), label="perm"))
        return b.add("PERMUTE", [x], perm=perm), np.transpose(ref, perm)
    if op == "EXPAND" and 1 in shape:
        new = tuple(3 if d == 1 else d for d in shape)
        return b.add("EXPAND", [x], result_shape=new), np.broadcast_to(ref, new)
    if op == "PAD":
        pads = [(data.draw(st.integers(0, 2), label="lo"), data.draw(st.integers(0, 2), label="hi")) for _ in shape]
        v = data.draw(st.sampled_from([0.0, 1.5]), label="v")
        return b.add("PAD", [x], pad=pads, value=v), np.pad(ref, pads, constant_values=v)
    if op == "SHRINK":
        lo = [data.draw(st.integers(0, d - 1), label="lo") for d in shape]
        hi = [data.draw(st.integers(a + 1, d), label="hi") for a, d in zip(lo, shape)]
        steps = [data.draw(st.integers(1, 3), label="step") for _ in shape]
        return b.add("SHRINK", [x], lo=lo, hi=hi, step=steps), \
            ref[tuple(slice(a, z, s) for a, z, s in zip(lo, hi, steps))]
    if op == "FLIP":
        axes = sorted(data.draw(st.sets(st.integers(0, rank - 1), min_size=1), label="axes"))
        return b.add("FLIP", [x], axes=axes), np.flip(ref, axis=tuple(axes))
    if op == "REDUCE" and rank >= 2:
        rop = data.draw(st.sampled_from(["SUM", "MAX", "MIN"]), label="rop")
        axes = sorted(data.draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank - 1), label="axes"))
        fn = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}[rop]
        return b.add("REDUCE", [x], op=rop, axes=axes, dtype="fp32"), fn(ref, axis=tuple(axes))
    if op == "CAST":
        t = b.add("CAST", [x], to="fp16")
        return b.add("CAST", [t], to="fp32"), ref.astype(np.float32).astype(np.float16).astype(np.float64)
    if op in ("WHERE", "CMP"):
        name = f"in{len(feeds)}"
        arr = rng.standard_normal(shape).astype(np.float32)
        feeds[name] = arr
        y = b.add("INPUT", tensor_id=name, dtype="fp32", shape=shape)
        cond = b.add("CMPLT", [y, 0.0]) if op == "WHERE" else b.add("CMPLE", [0.5, y])
        mask = arr < 0 if op == "WHERE" else 0.5 <= arr
        return b.add("WHERE", [cond, x, -1.0]), np.where(mask, ref, -1.0)
    if op == "VIEW" and rank >= 1:
        # a sliding window of width 2 over the last axis: (..., i, j) -> (..., i + j)
        if shape[-1] < 2:
            return x, ref
        i = [f"i{k}" for k in range(rank + 1)]
        imap = i[:rank - 1] + [f"{i[rank - 1]} + {i[rank]}"]
        new = shape[:-1] + (shape[-1] - 1, 2)
        want = np.stack([ref[..., :-1], ref[..., 1:]], axis=-1)
        return b.add("VIEW", [x], result_shape=new, index_map=imap), want
    return x, ref


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2 ** 32 - 1),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       n_ops=st.integers(1, 7))
def test_random_tiny_graphs_match_numpy(data, seed, shape, n_ops):
    rng = np.random.default_rng(seed)
    b = TinyBuilder("rand")
    x0 = rng.standard_normal(shape).astype(np.float32)
    feeds = {"in0": x0}
    x = b.add("INPUT", tensor_id="in0", dtype="fp32", shape=shape)
    ref = x0.astype(np.float64)
    scale = float(np.max(np.abs(ref)))
    for _ in range(n_ops):
        x, ref = tiny_step(data, b, x, ref, rng, feeds)
        scale = max(scale, float(np.max(np.abs(ref))) if ref.size else 0.0)
    x = b.add("MUL", [x, 1.0])
    ins = [(t, nid) for nid, n in b.nodes.items() if n.uop == "INPUT" for t in [n.arg["tensor_id"]]]
    g = b.finish(ins, [("out", x)])
    for prog in (g, load(json.loads(json.dumps(to_json(g))))):
        got = kumiko.compile(prog)(**{t: feeds[t] for t, _ in ins})["out"]
        assert got.shape == ref.shape and got.dtype == np.float32
        err = np.max(np.abs(got - ref)) if ref.size else 0.0
        # a CAST to fp16 rounds a value by up to 2**-11 relative; otherwise only fp32 rounding
        assert err <= 1e-3 * max(scale, 1.0) if "CAST" in {n.uop for n in g.nodes.values()} else \
            err <= 2e-5 * max(scale, 1.0), err
