"""The element types kumiko knows: fp16, bf16, fp32, fp64, i32, bool.

bf16 comes from ml_dtypes so numpy can hold it. Names follow the seeds (``fp16``); the DSL's short
names (``f16``) and numpy's (``float16``) are accepted as aliases on input and never produced.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    np: np.dtype
    itemsize: int
    is_float: bool
    is_int: bool
    c_name: str        # the C/CUDA storage type the renderers use

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    def __reduce__(self):
        # the dtypes are singletons (compared with ``is``): pickling and deep copies give the same object back
        return (_by_name, (self.name,))


def _by_name(name: str) -> "DType":
    return ALL[name]


fp16 = DType("fp16", np.dtype(np.float16), 2, True, False, "half")
bf16 = DType("bf16", np.dtype(ml_dtypes.bfloat16), 2, True, False, "bfloat16")
fp32 = DType("fp32", np.dtype(np.float32), 4, True, False, "float")
fp64 = DType("fp64", np.dtype(np.float64), 8, True, False, "double")
i32 = DType("i32", np.dtype(np.int32), 4, False, True, "int")
bool_ = DType("bool", np.dtype(np.bool_), 1, False, False, "bool")

ALL: dict[str, DType] = {d.name: d for d in (fp16, bf16, fp32, fp64, i32, bool_)}
#: dtypes a user graph may use (fp64 runs on the eval and cpu targets; the CUDA targets refuse it, E1012)
USER: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp64", "i32", "bool")

_ALIASES = {
    "f16": "fp16", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "f32": "fp32", "float32": "fp32", "float": "fp32",
    "f64": "fp64", "float64": "fp64", "double": "fp64",
    "int32": "i32", "int": "i32",
    "bool_": "bool", "b8": "bool",
}


def lookup(name: "str | DType") -> DType | None:
    if isinstance(name, DType):
        return name
    if not isinstance(name, str):
        return None
    return ALL.get(_ALIASES.get(name, name))


def from_numpy(dt: np.dtype) -> DType | None:
    dt = np.dtype(dt)
    for d in ALL.values():
        if d.np == dt:
            return d
    return None


def neutral(op: str, dt: DType):
    """The identity of a reduction in a dtype (SUM -> 0, MAX -> lowest, MIN -> highest)."""
    if op == "SUM":
        return dt.np.type(0)
    if dt.is_float:
        return dt.np.type(-np.inf if op == "MAX" else np.inf)
    if dt.is_int:
        info = np.iinfo(dt.np)
        return dt.np.type(info.min if op == "MAX" else info.max)
    return dt.np.type(op != "MAX")


def default_acc(dt: DType) -> DType:
    """The accumulator a reduction over ``dt`` uses unless told otherwise (fp32 for every float)."""
    if dt.is_float:
        return fp64 if dt is fp64 else fp32
    return i32
