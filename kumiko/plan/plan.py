"""The Schedule Plan (seed 001 §8.1): a small, frozen, hashable record of how one region is run.

Fields follow the seed: ``tile``, ``stages``, ``bind``, ``warp_tile``, ``cache``, ``vectorize``,
``predicate_tail``, ``epilogue``, ``arch``, ``layout_hints``, ``algo_choice``, ``local_edges``,
``async_`` (``async`` in JSON) and ``barrier_model``. CPU plans use ``tile`` for cache blocks over the
contraction's (M, N, K), ``micro`` for the register micro-tile (MR, NR), ``vectorize.width`` from the
machine, ``bind`` to name the loops OpenMP runs in parallel, ``cache`` for packed operand panels.
Mappings are stored as sorted tuples so plans hash and compare by value; JSON keeps the seed's shape.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from kumiko.diagnostics import KumikoError

ARCHS = ("cpu-avx512", "cpu-avx2", "cpu-scalar", "sm80", "sm90")


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw_map(v: tuple) -> dict:
    return {k: (_thaw_map(x) if _is_pairs(x) else list(x) if isinstance(x, tuple) else x) for k, x in v}


def _is_pairs(x: Any) -> bool:
    return isinstance(x, tuple) and bool(x) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                                  for p in x)


@dataclass(frozen=True)
class Plan:
    arch: str
    tile: tuple = ()                   # CPU: (MC, NC, KC) cache blocks of a contraction; GPU: (BM, BN, BK)
    micro: tuple = ()                  # CPU register micro-tile (MR, NR); GPU: unused
    stages: int = 1
    bind: tuple = ()                   # (("m.o", "omp"), ...) or (("m.o", "block.y"), ...)
    warp_tile: str | None = None
    cache: tuple = ()                  # ((("at", "k.o"), ("tensor", "A"), ("where", "pack")), ...)
    vectorize: tuple = ()              # (("axis", "n.i"), ("width", 8))
    predicate_tail: tuple = ()         # axis names whose extent may not divide the tile
    epilogue: tuple = ()               # ops applied to the accumulator (from SRNF R3)
    layout_hints: tuple = ()
    algo_choice: tuple = ()            # (("contraction", "packed"),) or (("region", "loops"),)
    local_edges: tuple = ()
    async_: tuple = ()                 # (("enable", False), ...)
    barrier_model: str | None = None
    threads: int = 0                   # CPU: OpenMP threads (0: all)

    # access ----------------------------------------------------------------------------------------
    def get(self, name: str, key: str, default: Any = None) -> Any:
        return dict(getattr(self, name)).get(key, default)

    @property
    def algo(self) -> str:
        return self.get("algo_choice", "contraction", self.get("algo_choice", "region", "loops"))

    @property
    def vector_width(self) -> int:
        return int(self.get("vectorize", "width", 1))

    # JSON --------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            key = "async" if f.name == "async_" else f.name
            if _is_pairs(v):
                d[key] = _thaw_map(v)
            elif isinstance(v, tuple):
                d[key] = [(_thaw_map(x) if _is_pairs(x) else x) for x in v]
            else:
                d[key] = v
        return d

    @staticmethod
    def from_json(d: Mapping) -> "Plan":
        known = {("async" if f.name == "async_" else f.name): f.name for f in fields(Plan)}
        bad = sorted(set(d) - set(known))
        if bad:
            raise KumikoError("E1010", at="plan", why=f"unknown plan fields {bad}")
        kw = {known[k]: _freeze(v) for k, v in d.items()}
        p = Plan(**kw)
        if p.arch not in ARCHS:
            raise KumikoError("E1010", at="plan", why=f"arch {p.arch!r} is not one of {ARCHS}")
        return p

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def with_(self, **kw: Any) -> "Plan":
        """A copy with fields replaced; mappings and lists are frozen as ``make_plan`` does."""
        return replace(self, **{k: _freeze(v) for k, v in kw.items()})


def make_plan(arch: str, **kw: Any) -> Plan:
    return Plan(arch=arch, **{k: _freeze(v) for k, v in kw.items()})
