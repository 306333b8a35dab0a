"""How far a target's outputs are from the reference evaluator's, and how far they may be.

One measure everywhere (tests, ``kumiko run --check``, the benchmarks): the relative L2 error
``|got - want| / |want|`` over an output, infinite when ``got`` holds a NaN or inf the reference does not
(a poisoned buffer read back, a missing store) or when the shapes differ. The bound an output must meet
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
    """Relative L2 error of ``got`` against ``want``; inf for a shape mismatch or a non-finite value in
    ``got`` where ``want`` is finite (NaN where both are NaN, inf where both are the same inf, count as equal)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    got, want = got.astype(np.float64), want.astype(np.float64)
    both = ~np.isfinite(want) & ((np.isnan(got) & np.isnan(want)) | (got == want))
    if not np.all(np.isfinite(got) | both):
        return float("inf")
    ok = ~both
    return float(np.linalg.norm(got[ok] - want[ok]) / max(np.linalg.norm(want[ok]), 1e-30))


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
