"""How far a target's outputs are from the reference evaluator's, and how far they may be.

One measure everywhere (tests, ``kumiko run --check``, the benchmarks): the relative L2 error
``|got - want| / |want|`` over an output, infinite when ``got`` holds a NaN or inf the reference does not
(a poisoned buffer read back, a missing store) or when the shapes differ. Where the reference is NaN or
inf, any NaN or inf is accepted: which one an overflow gives depends on the order of a sum and on
whether its multiply-adds are fused (``[3e38, 3e38, -3e38, -3e38]`` sums to inf one at a time and to 0
pairwise; ``1e30*1e30 - 1e30*1e30`` is NaN rounded per product and inf with FMAs), which IEEE and C
leave to the compiler (the evaluator's promise is in ``kumiko.tiny.evaluate``). The error is computed
in float64, so huge finite fp32 values do not overflow the measure. The bound an output must meet
depends on the dtype it is stored in: fp32 1e-4 (DESIGN.md §6); fp16 1e-2 and bf16 2e-2, since each
stored intermediate is rounded to 11 or 8 significant bits and a kernel may round at other places than
the evaluator (a fused epilogue keeps the fp32 accumulator); integers and bools must match exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError

#: dtype name -> the largest relative L2 error an output of that dtype may have against the evaluator
BOUNDS: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2, "i32": 0.0, "bool": 0.0}


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """Relative L2 error of ``got`` against ``want``, in float64; inf for a shape mismatch or where exactly
    one of them is finite (a NaN or inf in both counts as equal, whichever: see the module docstring)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return float("inf")
    diff, ref = got[finite] - want[finite], want[finite]
    scale = max(float(np.max(np.abs(ref), initial=0.0)), float(np.max(np.abs(diff), initial=0.0)), 1e-300)
    # scaled by the largest magnitude: float64 squares of huge values (or of many of them) stay finite
    return float(np.linalg.norm(diff / scale) / max(np.linalg.norm(ref / scale), 1e-30 / scale))


def bound(dtype: "str | dtypes.DType | np.dtype") -> float:
    """The relative L2 bound for an output stored as ``dtype``."""
    dt = dtypes.lookup(dtype) if not isinstance(dtype, np.dtype) else dtypes.from_numpy(dtype)
    if dt is None or dt.name not in BOUNDS:
        raise ValueError(f"no accuracy bound for dtype {dtype!r}")
    return BOUNDS[dt.name]


@dataclass(frozen=True)
class OutputCheck:
    """One output's comparison: its error, the bound for its dtype, and how many elements are not finite."""
    name: str
    dtype: str
    rel_l2: float
    bound: float
    nonfinite: int

    @property
    def ok(self) -> bool:
        return self.rel_l2 <= self.bound

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "rel_l2": self.rel_l2 if np.isfinite(self.rel_l2) else "inf",
                "bound": self.bound, "nonfinite": self.nonfinite, "ok": self.ok}


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> list[OutputCheck]:
    """Every output of ``want`` (the reference) against ``got``, in ``want``'s order."""
    out = []
    for name, w in want.items():
        w = np.asarray(w)
        g = np.asarray(got[name]) if name in got else np.full(w.shape, np.nan)
        dt = dtypes.from_numpy(w.dtype)
        nonfinite = int(np.count_nonzero(~np.isfinite(g.astype(np.float64)))) if g.size else 0
        out.append(OutputCheck(name, dt.name, rel_l2(g, w), bound(dt), nonfinite))
    return out


def raise_on_mismatch(checks: list[OutputCheck], target: str, sizes: Mapping[str, int]) -> None:
    """E1705 for the first output over its bound (all of them listed in the details)."""
    bad = [c for c in checks if not c.ok]
    if not bad:
        return
    c = bad[0]
    why = (f"relative L2 error {c.rel_l2:.3g} against the reference evaluator exceeds the {c.dtype} bound "
           f"{c.bound:g}" + (f"; {c.nonfinite} element(s) are NaN or inf" if c.nonfinite else ""))
    raise KumikoError("E1705", at=f"output {c.name} on {target}", why=why,
                      sizes=dict(sizes), outputs={k.name: k.to_json() for k in checks})
