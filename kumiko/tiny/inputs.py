"""Random inputs for a Tiny IR program: what ``kumiko run`` feeds a graph when the user gives none, what the
autotuner times plans on, and what the tests compare targets with."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_eval
from kumiko.tiny.ir import TinyGraph
from kumiko.tiny.limits import check_limits, check_symbols


def random_inputs(tiny: TinyGraph, seed: int = 0, shapes: Mapping[str, int] | None = None,
                  every_node: bool = False) -> dict[str, np.ndarray]:
    """Fresh random inputs (never zeros) for ``tiny`` at its ``symbols`` defaults overridden by ``shapes``:
    normal floats, small non-negative ints, random bools. The sizes are checked first (``limits``), with
    every value the evaluator keeps counted when ``every_node``."""
    env = dict(tiny.symbols)
    env.update(shapes or {})
    check_symbols(env)
    rng = np.random.default_rng(seed)
    shapes_of = {}
    for name, nid in tiny.inputs:
        try:
            shapes_of[name] = tuple(dim_eval(d, env) for d in tiny.nodes[nid].shape)
        except KeyError as e:
            raise KumikoError("E1014", at=f"input {name}", why=f"size symbol {e.args[0]} has no value",
                              suggestion=f"give it with --shapes {e.args[0]}=VALUE (or a 'symbols' default "
                                         "in the graph file)") from None
        if any(d < 0 for d in shapes_of[name]):
            raise KumikoError("E1015", at=f"input {name}", why=f"these sizes give it the negative extent "
                              f"{list(shapes_of[name])} ({[str(d) for d in tiny.nodes[nid].shape]})")
    # before allocating: the inputs and the outputs the call will make (every value for the evaluator)
    check_limits(tiny, env, every_node=every_node, at="random inputs")
    out = {}
    for name, nid in tiny.inputs:
        n, shape = tiny.nodes[nid], shapes_of[name]
        if n.dtype.is_float:
            out[name] = rng.standard_normal(shape, dtype=np.float32).astype(n.dtype.np)
        elif n.dtype is dtypes.i32:
            out[name] = rng.integers(0, 3, size=shape, dtype=np.int32)
        else:
            out[name] = rng.random(shape) < 0.5
    return out
