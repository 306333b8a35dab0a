"""Random valid graphs built from the patterns networks use, at the sizes networks use.

The small random graphs of ``tests/tiny`` and ``tests/kernel`` stay at sizes 1-9, below every threshold
where a CPU plan changes path: vector loops and their unrolled multi-accumulator form (rows of 64 and
more), long rows, several cache blocks, the staged and packed contraction paths. Wrong answers hid
there (a keepdim mean broadcast back at 64x64; a reversed-index sum that gcc's vectorizer miscompiled).
This generator draws:

- sizes from a menu that straddles those thresholds (1, odd primes, powers of two and their
  neighbours, rows of a few hundred);
- ops in the shapes networks combine them: a reduction kept and broadcast back into its source
  (squeeze-excitation, instance/group norm), softmax and layernorm over any axis, permutes, flips,
  negative-step slices, reversed and exclusive cumsums, a contraction ``y @ y.T`` on the last two axes,
  pads, elementwise chains and binaries against broadcast inputs.

It is written against a tiny ``Draw`` interface so the same generator serves hypothesis (``st.data()``,
shrinking) and a plain seeded sweep (``python -m tests.fuzz.netgraphs N``) for long hunts.
"""
from __future__ import annotations

import random
from typing import Any, Protocol, Sequence

import numpy as np

from kumiko import Tensor

#: sizes that straddle the CPU plan's thresholds (vector width 8/16, 4 accumulators x 16 = 64, blocks)
SIZES = (1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 48, 63, 64, 65, 97, 127, 128, 130, 257)
#: the most elements one drawn tensor may hold (keeps a CI example under a second or two)
MAX_ELEMENTS = 300_000

UNARY = ("relu", "exp_tanh", "neg", "sigmoid", "tanh", "abs", "silu", "gelu", "sqrt_abs")
BINARY = ("add", "sub", "mul", "max", "min")
OPS = ("unary", "binary", "reduce_back", "reduce", "softmax", "layernorm", "permute", "flip", "slice_neg",
       "cumsum", "matmul_t", "pad", "scalar")


class Draw(Protocol):
    def integers(self, lo: int, hi: int) -> int: ...
    def choice(self, seq: Sequence[Any]) -> Any: ...


class RandomDraw:
    """Draws from a seeded ``random.Random`` (the sweep)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def integers(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.r.randrange(len(seq))]


class HypothesisDraw:
    """Draws from hypothesis' ``st.data()`` (shrinks to a small failing graph)."""

    def __init__(self, data: Any):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def integers(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, seq: Sequence[Any]) -> Any:
        return self.data.draw(self.st.sampled_from(list(seq)))


def _unary(t: Tensor, fn: str) -> Tensor:
    if fn == "exp_tanh":
        return t.tanh().exp()
    if fn == "sqrt_abs":
        return (t.abs() + 0.5).sqrt()
    return getattr(t, fn)()


def draw_shape(d: Draw, max_elements: int = MAX_ELEMENTS) -> tuple[int, ...]:
    """A rank-1..4 shape of sizes from ``SIZES``, shrunk axis by axis until it fits ``max_elements``."""
    shape = [d.choice(SIZES) for _ in range(d.integers(1, 4))]
    while int(np.prod(shape)) > max_elements:
        k = int(np.argmax(shape))
        shape[k] = max(1, shape[k] // 4)
    return tuple(shape)


def _broadcast_partner(d: Draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    drop = d.integers(0, len(shape))
    return tuple(1 if d.integers(0, 1) else s for s in shape[drop:])


class NetGraph:
    """The graph being drawn: its inputs (name -> shape) and the current value."""

    def __init__(self, d: Draw, max_elements: int = MAX_ELEMENTS):
        self.d, self.max_elements = d, max_elements
        self.inputs: dict[str, tuple[int, ...]] = {}
        self.t = self.input(draw_shape(d, max_elements))

    def input(self, shape: tuple[int, ...]) -> Tensor:
        name = f"x{len(self.inputs)}"
        self.inputs[name] = shape
        return Tensor.input(name, shape)

    def step(self) -> str:
        """Apply one drawn op; returns its name (for reports)."""
        d, t = self.d, self.t
        shape, rank = tuple(t.shape), t.ndim
        op = d.choice(OPS)
        axes = sorted({d.integers(0, rank - 1) for _ in range(d.integers(1, rank))})
        ax = d.integers(0, rank - 1)
        if op == "unary":
            self.t = _unary(t, d.choice(UNARY))
        elif op == "binary":
            other = self.input(_broadcast_partner(d, shape))
            fn = d.choice(BINARY)
            self.t = t._ew(fn, other) if d.integers(0, 1) else other._ew(fn, t)
        elif op == "reduce_back":           # x (op) reduce(x, axes, keepdim): SE / instance norm
            r = t._reduce(d.choice(("sum", "mean", "max")), axes, True)
            self.t = t._ew(d.choice(("mul", "add", "sub")), r)
        elif op == "reduce" and rank >= 2:
            self.t = t._reduce(d.choice(("sum", "mean", "max", "min")), axes if len(axes) < rank else axes[:-1],
                               bool(d.integers(0, 1)))
        elif op == "softmax":
            self.t = t.softmax(ax)
        elif op == "layernorm":
            self.t = t.layernorm(ax)
        elif op == "permute" and rank >= 2:
            perm = list(range(rank))
            random.Random(d.integers(0, 10 ** 6)).shuffle(perm)
            self.t = t.permute(perm)
        elif op == "flip":
            self.t = t.flip(axes)
        elif op == "slice_neg":
            key = tuple(slice(None, None, d.choice((-1, -2, -3))) if k in axes else slice(None) for k in range(rank))
            self.t = t[key]
        elif op == "cumsum":
            self.t = t.cumsum(ax, bool(d.integers(0, 1)), bool(d.integers(0, 1)))
        elif op == "matmul_t" and rank >= 2 and shape[-2] * shape[-2] * max(1, int(np.prod(shape[:-2]))) \
                <= self.max_elements:
            self.t = t @ t.transpose(-1, -2)
        elif op == "pad":
            self.t = t.pad([(d.integers(0, 2), d.integers(0, 2)) if k in axes else (0, 0) for k in range(rank)],
                           d.choice((0.0, -1.0)))
        elif op == "scalar":
            self.t = t * d.choice((-1.5, 0.5, 2.0)) + d.choice((0.25, -3.0))
        else:
            return "skip"
        return op


def draw_graph(d: Draw, max_ops: int = 4, max_elements: int = MAX_ELEMENTS) \
        -> tuple[Any, dict[str, tuple[int, ...]], list[str]]:
    """A validated ``Graph`` with output ``y``, its input shapes, and the ops drawn."""
    g = NetGraph(d, max_elements)
    ops = [g.step() for _ in range(d.integers(1, max_ops))]
    if all(o == "skip" for o in ops):
        g.t = g.t.relu()
    return g.t.graph("y"), g.inputs, ops


def _fp32_sequential(g: Any, ins: dict[str, np.ndarray]) -> np.ndarray:
    """The graph evaluated with every float SUM accumulated strictly in order in fp32 (``np.cumsum``), the
    least accurate order a kernel may use: how far that lands from float64 is the rounding noise an fp32
    kernel may legitimately show where the graph cancels."""
    import importlib

    import kumiko
    ev = importlib.import_module("kumiko.tiny.evaluate")   # the module (the package exports its function)

    def seq32(terms, axes, acc):
        k = len(axes)
        t = np.moveaxis(terms, axes, tuple(range(-k, 0)))
        t = t.reshape(t.shape[:t.ndim - k] + (-1,)).astype(acc)
        with np.errstate(all="ignore"):
            return np.cumsum(t, axis=-1, dtype=acc)[..., -1] if t.shape[-1] else np.zeros(t.shape[:-1], acc)

    def contract32(operands, shape, axes, acc):
        with np.errstate(all="ignore"):
            terms = np.broadcast_to(np.multiply(*(np.asarray(o, np.float64) for o in operands)), shape)
        return seq32(terms, axes, acc)

    saved = ev._sequential_sum, ev._contract
    ev._sequential_sum, ev._contract = seq32, contract32
    try:
        return kumiko.compile(g, "eval")(**ins)["y"]
    finally:
        ev._sequential_sum, ev._contract = saved


def agrees(g: Any, ins: dict[str, np.ndarray], got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """Whether a target's ``got`` matches the evaluator's ``want``: within the fp32 bound, or - where the
    graph cancels catastrophically (``x * mean(layernorm(x))`` is rounding noise around 0, a sum over
    values that cancel keeps only its rounding error) - no farther from the float64 evaluation than a few
    times an fp32 evaluation's own distance from it (the evaluator's, or one that sums strictly in order
    in fp32). Returns (ok, relative L2 error against ``want``)."""
    import kumiko
    from kumiko.accuracy import bound, rel_l2
    err = rel_l2(got, want)
    if err <= bound("fp32"):
        return True, err
    if not np.array_equal(np.isfinite(got), np.isfinite(want)):
        return False, err
    ideal = kumiko.compile(g, "eval", fp64=True)(**ins)["y"].astype(np.float64)
    fin = np.isfinite(ideal) & np.isfinite(want)
    seq = _fp32_sequential(g, ins)
    fin &= np.isfinite(seq)
    noise = max(float(np.linalg.norm(want[fin].astype(np.float64) - ideal[fin])),
                float(np.linalg.norm(seq[fin].astype(np.float64) - ideal[fin])))
    off = float(np.linalg.norm(got[fin].astype(np.float64) - ideal[fin]))
    return off <= 8 * noise + bound("fp32") * float(np.linalg.norm(ideal[fin])), err


def inputs_for(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}


def _sweep(n: int, start: int = 0, target: str = "cpu",
           max_elements: int = MAX_ELEMENTS) -> None:   # pragma: no cover - a developer's hunting tool
    import kumiko
    bad = 0
    for seed in range(start, start + n):
        try:
            g, shapes, ops = draw_graph(RandomDraw(seed), max_elements=max_elements)
            ins = inputs_for(shapes, seed)
            want = kumiko.compile(g, "eval")(**ins)["y"]
            got = kumiko.compile(g, target)(**ins)["y"]
        except Exception as e:   # noqa: BLE001 - report and go on hunting
            bad += 1
            print(f"seed {seed}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ok, err = agrees(g, ins, got, want)
        if not ok:
            bad += 1
            print(f"seed {seed}: rel_l2 {err:.3g} ops {ops} inputs {shapes}", flush=True)
    print(f"{bad} of {n} wrong")


if __name__ == "__main__":   # pragma: no cover
    import sys
    # python -m tests.fuzz.netgraphs N [START [TARGET [MAX_ELEMENTS]]]
    _sweep(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0, *sys.argv[3:4],
           *[int(a) for a in sys.argv[4:5]])
