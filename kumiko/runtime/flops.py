"""What a benchmark reports besides time: FLOPs and bytes from the Tiny IR, and the timing loop itself.

FLOPs are counted on the Tiny IR, the one place every frontend op has been reduced to the same
vocabulary, so a GEMM written as ``A @ B``, as an ONNX MatMul or as MUL -> REDUCE counts the same:

- an elementwise op counts its op table ``flops`` (``kumiko.ops``: 1 for unary, binary, comparison and WHERE,
  0 for CAST) per *output* element (after EXPAND, so a broadcast operand costs its broadcast size: that is
  the work done);
- a REDUCE counts its op's ``flops`` (1) per *input* element (each element joins the accumulator once);
- movement ops, INPUT, CONST and GATHER count 0 (they move data, they do not compute).

Hence MUL feeding REDUCE(SUM) counts 2 per multiply-accumulate: GEMM M x N x K is ``2*M*N*K``, the usual
convention; a 3x3 convolution is ``2 * N*Co*Ho*Wo * Ci*9``. A frontend op that lowers to several
uops counts its parts (``exp(x)`` is EXP2(MUL(x, log2 e)): 2 per element), so the count says what the
program asks for, not what a fused kernel happens to execute.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

from kumiko import ops
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_eval
from kumiko.tiny.ir import TinyGraph
from kumiko.tiny.limits import evaluator_peak


def _numel(shape, env: Mapping[str, int]) -> int:
    n = 1
    for d in shape:
        n *= dim_eval(d, env)
    return n


def _env(tiny: TinyGraph, env: Mapping[str, int] | None) -> dict[str, int]:
    return {**dict(tiny.symbols), **dict(env or {})}


def count_flops(tiny: TinyGraph, env: Mapping[str, int] | None = None) -> int | None:
    """FLOPs of one run at the sizes ``env`` gives (the graph's default symbols fill the rest); None when
    a size symbol has no value."""
    env = _env(tiny, env)
    total = 0
    try:
        for n in tiny.nodes.values():
            if n.uop in ops.ELEMENTWISE:
                total += ops.ELEMENTWISE[n.uop].flops * _numel(n.shape, env)
            elif n.uop == "REDUCE":
                total += ops.REDUCE[n.arg["op"]].flops * _numel(tiny.nodes[n.src[0]].shape, env)
    except KeyError:
        return None
    return total


def count_io_bytes(tiny: TinyGraph, env: Mapping[str, int] | None = None) -> int | None:
    """Bytes of the signature's inputs and outputs: the least traffic any implementation has."""
    env = _env(tiny, env)
    try:
        return sum(_numel(tiny.nodes[nid].shape, env) * tiny.nodes[nid].dtype.itemsize
                   for _, nid in (*tiny.inputs, *tiny.outputs))
    except KeyError:
        return None


def evaluator_bytes(tiny: TinyGraph, env: Mapping[str, int] | None = None) -> int | None:
    """The most bytes the ``eval`` target holds at once at these sizes (its live values and a node's
    temporaries, ``tiny.limits.evaluator_peak``): a benchmark uses it to skip sizes the evaluator cannot
    hold in memory. None when a size symbol has no value."""
    try:
        return evaluator_peak(tiny, _env(tiny, env))
    except KumikoError:
        return None


def measure(fn: Callable[[], object], reps: int = 10, warmup: int = 2) -> dict:
    """Time ``fn()``: ``warmup`` untimed calls, then ``reps`` timed ones (``time.perf_counter``).

    Returns seconds: median, min, mean, and every sample, so reports can show spread.
    """
    for _ in range(max(0, warmup)):
        fn()
    samples = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "mean_s": statistics.fmean(samples),
            "reps": len(samples), "warmup": max(0, warmup), "samples_s": samples}


def gflops(flops: int | None, seconds: float) -> float | None:
    return None if flops is None or seconds <= 0 else flops / seconds / 1e9
