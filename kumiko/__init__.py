"""kumiko: a deep-learning compiler.

Public API (stable): ``Tensor`` (lazy, tinygrad-style), ``Graph``, ``load(path)``,
``compile(graph, target=...)`` -> ``Executable``; ``exe(**inputs)`` returns outputs by name;
``exe.save(path)`` and ``load_executable(path)`` keep one (constants and, on ``cpu``, its kernels) across processes.
"""
from kumiko import dtypes
from kumiko.compiler import Executable, compile, load, load_executable
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.frontend.onnx_import import from_onnx  # needs the [onnx] extra only when called
from kumiko.tensor import Tensor

__version__ = "0.1.0"
__all__ = ["Executable", "Graph", "KumikoError", "Tensor", "compile", "dtypes", "from_onnx", "load", "load_executable",
           "__version__"]
