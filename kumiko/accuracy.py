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
fp64 1e-12: the evaluator and the targets that take fp64 (eval, cpu) both compute it in float64 (unit
roundoff 1.1e-16), so they differ only by summation order - sequential, lane-wise or blocked - whose
error grows like n*u in the worst case: 1e-12 is ~9000 u, as fp32's 1e-4 is ~1700 u, leaving room for
rows of thousands of terms while a single fp32 rounding anywhere (~6e-8) fails it. An output is judged by
the loosest bound among the float dtypes it is computed through (``judged_as``): an fp64 output cast up
from fp32 math carries fp32 rounding and gets the fp32 bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from kumiko import dtypes
from kumiko.diagnostics import KumikoError

#: dtype name -> the largest relative L2 error an output of that dtype may have against the evaluator
BOUNDS: dict[str, float] = {"fp64": 1e-12, "fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2, "i32": 0.0, "bool": 0.0}


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


def judged_as(graph) -> dict[str, str]:
    """Output name -> the dtype whose bound it is judged by: of the float dtypes of the nodes it depends on
    (a Tiny IR graph's ``nodes``, ``outputs``, each node's ``src`` and ``dtype``), the one with the loosest
    bound (an output with no float node behind it: its own dtype)."""
    nodes, memo = graph.nodes, {}

    def loosest(nid: str) -> str | None:
        stack, seen, best = [nid], set(), None
        while stack:
            k = stack.pop()
            if k in seen or k not in nodes:
                continue
            seen.add(k)
            if k in memo:
                cands = [memo[k]]
            else:
                n = nodes[k]
                cands = [n.dtype.name] if n.dtype.is_float else []
                stack.extend(s for s in n.src if isinstance(s, str))
            for c in cands:
                if c is not None and (best is None or BOUNDS[c] > BOUNDS[best]):
                    best = c
        memo[nid] = best
        return best

    return {t: loosest(nid) or nodes[nid].dtype.name for t, nid in graph.outputs}


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
            judged: Mapping[str, str] | None = None) -> list[OutputCheck]:
    """Every output of ``want`` (the reference) against ``got``, in ``want``'s order; ``judged`` (from
    ``judged_as``) names the dtype whose bound an output must meet (default: the dtype it is stored in)."""
    out = []
    for name, w in want.items():
        w = np.asarray(w)
        g = np.asarray(got[name]) if name in got else np.full(w.shape, np.nan)
        dt = dtypes.from_numpy(w.dtype)
        by = dtypes.lookup((judged or {}).get(name)) or dt
        nonfinite = int(np.count_nonzero(~np.isfinite(g.astype(np.float64)))) if g.size else 0
        out.append(OutputCheck(name, dt.name, rel_l2(g, w), bound(by), nonfinite))
    return out


def raise_on_mismatch(checks: list[OutputCheck], target: str, sizes: Mapping[str, int]) -> None:
    """E1705 for the first output over its bound (all of them listed in the details)."""
    bad = [c for c in checks if not c.ok]
    if not bad:
        return
    c = bad[0]
    why = (f"relative L2 error {c.rel_l2:.3g} against the reference evaluator exceeds the bound {c.bound:g} "
           f"for this {c.dtype} output" + (f"; {c.nonfinite} element(s) are NaN or inf" if c.nonfinite else ""))
    raise KumikoError("E1705", at=f"output {c.name} on {target}", why=why,
                      sizes=dict(sizes), outputs={k.name: k.to_json() for k in checks})
