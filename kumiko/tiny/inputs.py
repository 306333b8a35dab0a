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


def check_array(name: str, dt: dtypes.DType, arr, want: tuple, shape: tuple, raw16: bool = False) -> np.ndarray:
    """The one check of an input array: dtype ``dt`` (with ``raw16``, fp16/bf16 also as raw uint16 storage,
    viewed as it) and shape ``want`` (``shape`` evaluated; the symbolic one is named in the message). Every
    target's inputs pass here: the Executable's bind (``evaluate.check_inputs``), the CPU runtime and the
    GPU's upload. Returns the array as the kernels read it."""
    arr = np.asarray(arr)
    if raw16 and arr.dtype == np.uint16 and dt in (dtypes.fp16, dtypes.bf16):
        arr = arr.view(dt.np)
    if arr.dtype != dt.np and dtypes.from_numpy(arr.dtype) is not dt:
        raise KumikoError("E1015", at=f"input {name}", why=f"expected dtype {dt}, got {arr.dtype}",
                          suggestion=f"convert with arr.astype({np.dtype(dt.np).name!r}) or add a Cast to the graph")
    if tuple(arr.shape) != want:
        raise KumikoError("E1015", at=f"input {name}", why=f"expected shape {list(want)} "
                          f"({[str(d) for d in shape]}), got {list(arr.shape)}")
    return arr


def input_shape(name: str, shape: tuple, env: Mapping[str, int]) -> tuple:
    """An input's shape under ``env`` (E1014 for a size symbol without a value)."""
    try:
        return tuple(dim_eval(d, env) for d in shape)
    except KeyError as e:
        raise KumikoError("E1014", at=f"input {name}", why=f"size symbol {e.args[0]} has no value") from None


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
