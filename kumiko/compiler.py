"""The stable public entry points: ``load``, ``compile`` and the ``Executable`` they produce.

Targets plug in behind ``compile`` by name: ``eval``, ``cpu``, ``cuda-emu`` and ``cuda`` (a real GPU
through cuda-bindings; without one it raises E1501). Every target takes and returns numpy arrays keyed by
signature names, binds symbolic sizes from the inputs' shapes, and checks dtypes and shapes with diagnostics.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.symbolic import dim_eval
from kumiko.tiny.evaluate import bind_symbols, check_inputs, check_sizes, evaluate
from kumiko.tiny.ir import TinyGraph
from kumiko.tiny.limits import check_limits, check_symbols

#: target name -> factory(tiny graph, options) -> callable(inputs, env) -> outputs
TARGETS: dict[str, Callable[..., Callable]] = {}
#: targets that are planned but not built yet, with the issue that brings them
PLANNED: dict[str, str] = {}
DEFAULT_TARGET = "cpu"


def register_target(name: str):
    def deco(factory):
        TARGETS[name] = factory
        return factory
    return deco


@register_target("eval")
def _eval_target(tiny: TinyGraph, fp64: bool = False, **_):
    return lambda inputs, env: evaluate(tiny, inputs, env, fp64=fp64)


def load(path: str | Path) -> Graph | TinyGraph:
    """Load a graph file: frontend JSON (seed 001 §2.2) or a dumped Tiny IR (``{"uops": ...}``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise KumikoError("E1502", at=str(p), why=f"cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise KumikoError("E1009", at=str(p), why=f"not a UTF-8 text file ({e.reason} at byte {e.start})",
                          suggestion="Give a JSON graph file, a Tiny IR dump or a .kumiko program.") from None
    if p.suffix == ".kumiko":
        try:
            from kumiko.frontend.dsl import parse_program
        except ImportError:
            raise KumikoError("E1501", at=str(p), why="the graph DSL is not available in this build") from None
        return parse_program(text, filename=str(p))
    from kumiko.frontend.graph import loads
    return load_json(loads(text, str(p)), str(p))


def load_json(d: object, where: str = "graph") -> Graph | TinyGraph:
    if isinstance(d, Mapping) and "uops" in d:
        from kumiko.tiny.build import load as load_tiny
        return load_tiny(d)
    return Graph.from_json(d, where)


def to_tiny(program: Graph | TinyGraph) -> TinyGraph:
    if isinstance(program, TinyGraph):
        return program
    if isinstance(program, Graph):
        return program.tiny
    raise TypeError(f"expected a kumiko Graph or TinyGraph, got {type(program).__name__}")


class Executable:
    """A compiled program: call it with arrays by signature name, get outputs in signature order."""

    def __init__(self, program: Graph | TinyGraph, target: str = DEFAULT_TARGET, **options):
        if target not in TARGETS:
            if target in PLANNED:
                why = f"target {target!r} is not built yet ({PLANNED[target]} brings it)"
            else:
                why = f"unknown target {target!r}"
            raise KumikoError("E1501", at="compile", why=why,
                              suggestion=f"available targets: {', '.join(sorted(TARGETS))}")
        self.tiny = to_tiny(program)
        #: values for param inputs the caller may leave out (a Graph's ``params``, e.g. ONNX initializers)
        self.params = dict(program.params) if isinstance(program, Graph) else {}
        self.target = target
        self._run = TARGETS[target](self.tiny, **options)
        self._sizes_ok: set = set()      # sizes check_sizes passed (bind)

    @property
    def input_names(self) -> list[str]:
        return [t for t, _ in self.tiny.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t for t, _ in self.tiny.outputs]

    def bind(self, inputs: Mapping[str, np.ndarray], shapes: Mapping[str, int] | None = None) -> dict[str, int]:
        env = bind_symbols(self.tiny, inputs, shapes)
        check_inputs(self.tiny, inputs, env)
        if self.target != "eval":        # compiled kernels trust these; the evaluator checks as it runs
            key = tuple(sorted(env.items()))
            if key not in self._sizes_ok:        # they depend on the sizes only: once per set of sizes
                check_sizes(self.tiny, env)
                check_limits(self.tiny, env, at=f"{self.target} call")
                if len(self._sizes_ok) < 64:
                    self._sizes_ok.add(key)
        return env

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        inputs = {**self.params, **inputs}
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
        env = self.bind(inputs)
        out = self._run(inputs, env)
        # an output that is an input of the same name is not computed by any kernel: return a copy
        return {name: out[name] if name in out else np.array(inputs[name], copy=True) for name in self.output_names}

    def random_inputs(self, seed: int = 0, shapes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Fresh random inputs (never zeros): normal floats, small non-negative ints, random bools."""
        env = dict(self.tiny.symbols)
        env.update(shapes or {})
        check_symbols(env)
        rng = np.random.default_rng(seed)
        shapes_of = {}
        for name, nid in self.tiny.inputs:
            try:
                shapes_of[name] = tuple(dim_eval(d, env) for d in self.tiny.nodes[nid].shape)
            except KeyError as e:
                raise KumikoError("E1014", at=f"input {name}", why=f"size symbol {e.args[0]} has no value",
                                  suggestion=f"give it with --shapes {e.args[0]}=VALUE (or a 'symbols' default "
                                             "in the graph file)") from None
            if any(d < 0 for d in shapes_of[name]):
                raise KumikoError("E1015", at=f"input {name}", why=f"these sizes give it the negative extent "
                                  f"{list(shapes_of[name])} ({[str(d) for d in self.tiny.nodes[nid].shape]})")
        # before allocating: the inputs and the outputs the call will make (every value for the evaluator)
        check_limits(self.tiny, env, every_node=self.target == "eval", at="random inputs")
        out = {}
        for name, nid in self.tiny.inputs:
            n, shape = self.tiny.nodes[nid], shapes_of[name]
            if n.dtype.is_float:
                out[name] = rng.standard_normal(shape, dtype=np.float32).astype(n.dtype.np)
            elif n.dtype is dtypes.i32:
                out[name] = rng.integers(0, 3, size=shape, dtype=np.int32)
            else:
                out[name] = rng.random(shape) < 0.5
        return out


def compile(program: Graph | TinyGraph, target: str = DEFAULT_TARGET, **options) -> Executable:  # noqa: A001
    """Compile a Graph (or a Tiny IR) for a target; see ``TARGETS`` for the names."""
    return Executable(program, target, **options)


# targets past the evaluator register themselves on import
import kumiko.runtime.target_cpu  # noqa: E402,F401
import kumiko.runtime.target_cuda  # noqa: E402,F401
import kumiko.runtime.target_cuda_gpu  # noqa: E402,F401
