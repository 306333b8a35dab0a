"""The stable public entry points: ``load``, ``compile`` and the ``Executable`` they produce.

Targets plug in behind ``compile`` by name: ``eval``, ``cpu``, ``cuda-emu`` and ``cuda`` (a real GPU
through cuda-bindings; without one it raises E1501). Every target takes and returns numpy arrays keyed by
signature names, binds symbolic sizes from the inputs' shapes, and checks dtypes and shapes with diagnostics.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from kumiko import dtypes
from kumiko.backend import BACKENDS
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.pipeline import Compilation, arrange, compile_program, to_tiny
from kumiko.tiny.evaluate import bind_symbols, check_inputs, check_sizes
from kumiko.tiny.inputs import random_inputs
from kumiko.tiny.ir import TinyGraph
from kumiko.tiny.limits import check_limits
from kumiko.util.log import log, stage

DEFAULT_TARGET = "cpu"


#: the target names (``kumiko.backend.BACKENDS`` names each one's backend)
TARGETS: tuple[str, ...] = tuple(BACKENDS)


def load(path: str | Path) -> Graph | TinyGraph:
    """Load a graph file: frontend JSON (seed 001 §2.2), a dumped Tiny IR (``{"uops": ...}``), a ``.kumiko``
    program or an ONNX model (``.onnx``; its initializers become the Graph's ``params``)."""
    p = Path(path)
    if p.suffix == ".onnx":
        try:
            import onnx  # noqa: F401

            from kumiko.frontend.onnx_import import from_onnx
        except ImportError:
            raise KumikoError("E1501", at=str(p), why="importing an ONNX model needs the onnx package",
                              suggestion="pip install onnx") from None
        with stage(f"load {p.name} (import the ONNX model, lower to Tiny IR)"):
            return from_onnx(p)
    try:
        text = p.read_text()
    except OSError as e:
        raise KumikoError("E1502", at=str(p), why=f"cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise KumikoError("E1009", at=str(p), why=f"not a UTF-8 text file ({e.reason} at byte {e.start})",
                          suggestion="Give a JSON graph file, a Tiny IR dump, a .kumiko program or an .onnx "
                          "model.") from None
    with stage(f"load {p.name} (parse, check, lower to Tiny IR)"):
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


_INT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.float64)
_WIDE_CHARS = frozenset({np.dtype(np.int64).char, np.dtype(np.longlong).char, np.dtype(np.float64).char})
_I32 = np.iinfo(np.int32)


class Executable:
    """A compiled program: call it with arrays by signature name, get outputs in signature order."""

    def __init__(self, program: Graph | TinyGraph, target: str = DEFAULT_TARGET, *, _saved: dict | None = None,
                 start: Mapping[str, Any] | None = None, want: tuple = (), **options):
        self._options = dict(options)
        if _saved is None and not start:
            program = arrange(program, target, options)     # the program the target compiles (its layout)
        self.tiny = to_tiny(program) if not (start and "tiny" in start) else start["tiny"]
        #: fp32 inputs that also take float64 arrays (an imported ONNX model's DOUBLE inputs)
        self.fp64_inputs = program.fp64_inputs if isinstance(program, Graph) else frozenset()
        if _saved is not None:            # load_executable: the saved constants and input kinds
            self.fp64_inputs = frozenset(_saved["fp64_inputs"])
        self._in_dtypes = {t: self.tiny.nodes[nid].dtype for t, nid in self.tiny.inputs}
        #: the constant pool: values for param inputs the caller may leave out (a Graph's ``params``, e.g. ONNX
        #: initializers), bound once. Each is the Executable's own read-only C-contiguous copy in the input's
        #: dtype, so a target may prepare it once (the cpu target packs weights into its micro-kernel's panels)
        #: and trust it for every call that does not pass another array in its place.
        bound = _saved["params"] if _saved is not None else program.params if isinstance(program, Graph) else {}
        self.params = {k: self._constant(k, v) for k, v in bound.items()}
        self.target = target
        if isinstance(program, Graph):   # a Graph lowers as it is made: its time is in load's (or the caller's)
            log(1, f"stage frontend->tiny: done when the Graph was made ({len(self.tiny.nodes)} Tiny IR nodes)")
        #: every stage's artifact (``kumiko.pipeline``): what dumps, reports and tests read
        self.compilation: Compilation | None = None
        if _saved is not None and _saved.get("artifact") is not None and target == "cpu":
            from kumiko.backend import backend
            from kumiko.runtime.cpu_artifact import restore
            with stage(f"load the saved {self.tiny.name} for {target}"):
                restored = restore(_saved["artifact"], constants=self.params)
            if restored is None:
                log(1, "the saved kernels were built for another ISA: compiling again")
            else:
                be = backend(target)
                self.compilation = Compilation(target, be, be.options(options), self.params, tiny=self.tiny,
                                               region=restored.program, plan=restored.plans, binary=restored)
        if self.compilation is None:
            with stage(f"compile {self.tiny.name} for {target}"):
                self.compilation = compile_program(program, target, options, constants=self.params, start=start,
                                                   want=want, arranged=True)
        self._run = self.compilation.runner()
        self._sizes_ok: set = set()      # sizes check_sizes passed (bind)
        #: what a call's own arrays looked like when they passed ``bind`` - ((name, dtype, shape), ...) in the
        #: call's order - and the sizes they bound: a call whose arrays look the same binds the same sizes and
        #: passes the same checks (they read nothing else of an array), so it skips them
        self._bound: dict[tuple, dict[str, int]] = {}
        self._outputs = tuple(self.output_names)
        # the constants are checked once, here: a call that passes the bound arrays themselves skips their
        # checks (a network's weights are most of its inputs: ResNet-50 has 161)
        try:
            self._const_env = bind_symbols(self.tiny, self.params)
            check_inputs(self.tiny, self.params, self._const_env, partial=True)
            self._trusted = frozenset(self.params)
        except KumikoError:               # reported at the call that uses them, as for any input
            self._const_env, self._trusted = {}, frozenset()

    def save(self, path: str | Path) -> None:
        """Write this Executable to ``path``, constants included, so that ``kumiko.load_executable(path)``
        runs it in another process: on the ``cpu`` target without compiling (the kernel library is saved
        with it; a machine with another ISA compiles again), on other targets by compiling the saved graph.
        The file is a pickle: load only files you trust. Written atomically."""
        from kumiko.util.files import write_file
        artifact = None
        if self.target == "cpu":
            from kumiko.runtime.cpu_artifact import save_state
            artifact = save_state(self.compilation.binary)
        state = {"format": EXECUTABLE_FORMAT, "tiny": self.tiny, "target": self.target, "options": self._options,
                 "params": self.params, "fp64_inputs": sorted(self.fp64_inputs), "artifact": artifact}
        write_file(Path(path), pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), "a saved Executable")

    @property
    def input_names(self) -> list[str]:
        return [t for t, _ in self.tiny.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t for t, _ in self.tiny.outputs]

    def bind(self, inputs: Mapping[str, np.ndarray], shapes: Mapping[str, int] | None = None) -> dict[str, int]:
        trusted = frozenset(k for k in self._trusted if inputs.get(k) is self.params[k])
        if trusted:
            fresh = {k: v for k, v in inputs.items() if k not in trusted}
            env = bind_symbols(self.tiny, fresh, {**self._const_env, **(shapes or {})})
        else:
            env = bind_symbols(self.tiny, inputs, shapes)
        check_inputs(self.tiny, inputs, env, trusted=trusted)
        if self.target != "eval":        # compiled kernels trust these; the evaluator checks as it runs
            key = tuple(sorted(env.items()))
            if key not in self._sizes_ok:        # they depend on the sizes only: once per set of sizes
                check_sizes(self.tiny, env)
                check_limits(self.tiny, env, at=f"{self.target} call")
                if len(self._sizes_ok) < 64:
                    self._sizes_ok.add(key)
        return env

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        # plain loops, not comprehensions (each a function call of its own): this is most of a small graph's
        # time outside its kernels (a 16-float ReLU on a 2-core Zen 3: 2.9 -> 1.8 us, the call 9.5 -> 8.3 us)
        given, key = {}, []
        for k, v in inputs.items():
            if type(v) is not np.ndarray:
                v = np.asarray(v)
            v = given[k] = self._narrow(k, v)
            key.append((k, v.dtype, v.shape))
        key = tuple(key)
        if self.params:
            inputs = self.params.copy()
            inputs.update(given)
        else:
            inputs = given
        env = self._bound.get(key)
        if env is None:
            env = self.bind(inputs)
            if len(self._bound) < 64:
                self._bound[key] = env
        out = self._run(inputs, env)
        res = {}
        for name in self._outputs:
            # an output that is an input of the same name is not computed by any kernel: return a copy
            res[name] = out[name] if name in out else np.array(inputs[name], copy=True)
        return res

    def _constant(self, name: str, value) -> np.ndarray:
        arr = self._narrow(name, np.array(value, copy=True, order="C"))    # a C-contiguous copy of its own
        arr.setflags(write=False)
        return arr

    def _narrow(self, name: str, arr: np.ndarray) -> np.ndarray:
        """The one place a call's arrays are narrowed to kumiko's dtypes: int64 (numpy's default integer,
        ONNX's index type) for an i32 input, float64 for an fp32 input in ``fp64_inputs``. A value the
        narrowing would change is E1015; any other dtype is left for the input check to refuse."""
        adt = arr.dtype
        if adt.char not in _WIDE_CHARS:     # neither int64 nor float64 (a character test: dtype == costs more)
            return arr
        dt = self._in_dtypes.get(name)
        if adt == _INT64 and dt is dtypes.i32:
            if arr.size and not _I32.min <= arr.min() <= arr.max() <= _I32.max:
                raise KumikoError("E1015", at=f"input {name}", why="int64 values outside the i32 range "
                                  f"[{arr.min()}, {arr.max()}] cannot be narrowed to i32, the input's dtype")
            return arr.astype(np.int32)
        if adt == _FLOAT64 and dt is dtypes.fp32 and name in self.fp64_inputs:
            with np.errstate(over="ignore"):
                out = arr.astype(np.float32)
            if (np.isinf(out) & np.isfinite(arr)).any():
                raise KumikoError("E1015", at=f"input {name}", why="finite float64 values overflow fp32, the "
                                  "input's dtype")
            return out
        return arr

    def random_inputs(self, seed: int = 0, shapes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Fresh random inputs (never zeros): normal floats, small non-negative ints, random bools."""
        return random_inputs(self.tiny, seed, shapes, every_node=self.target == "eval")


#: what ``Executable.save`` writes (a new version when the record changes)
EXECUTABLE_FORMAT = "kumiko-executable/2"        # 2: plans of PLAN_FORMAT 2 (named blocks)


def load_executable(path: str | Path) -> Executable:
    """An Executable that ``Executable.save`` wrote (a pickle: load only files you trust)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise KumikoError("E1502", at=str(p), why=f"cannot read the file: {e.strerror or e}") from None
    try:
        state = pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: pickle raises many kinds
        raise KumikoError("E1009", at=str(p), why=f"not a saved kumiko Executable ({type(e).__name__}: {e})",
                          suggestion="Give a file written by Executable.save.") from None
    if not isinstance(state, dict) or state.get("format") != EXECUTABLE_FORMAT:
        raise KumikoError("E1009", at=str(p), why=f"not a saved kumiko Executable of format {EXECUTABLE_FORMAT}",
                          suggestion="Save it again with this version of kumiko.")
    return Executable(state["tiny"], state["target"], _saved=state, **state["options"])


def compile(program: Graph | TinyGraph, target: str = DEFAULT_TARGET, **options) -> Executable:  # noqa: A001
    """Compile a Graph (or a Tiny IR) for a target; see ``TARGETS`` for the names."""
    return Executable(program, target, **options)

