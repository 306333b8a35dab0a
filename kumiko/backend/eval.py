"""The ``eval`` backend: the Tiny IR evaluator (numpy), the oracle every other target is checked against. It
adds one stage, ``binary``: the evaluator bound to the program (no regions, plans, kernels or source)."""
from __future__ import annotations

from dataclasses import dataclass

from kumiko.backend import Backend
from kumiko.tiny.evaluate import evaluate


@dataclass(frozen=True)
class EvalOptions:
    """``fp64``: evaluate floats in float64 (a reference for the reference)."""
    fp64: bool = False


class EvalBackend(Backend):
    name = "eval"
    Options = EvalOptions
    stages = ("binary",)
    notes = {"binary": "the Tiny IR evaluator"}

    def build(self, comp):
        tiny, fp64 = comp.tiny, comp.options.fp64
        return lambda inputs, env: evaluate(tiny, inputs, env, fp64=fp64)
