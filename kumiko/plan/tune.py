"""Autotuning (seed 001 §11; Triton's habit): build and time the surviving candidate plans of each
region, score a failed build as infinite, and cache the winner on disk keyed by (region hash, shape
cluster, target, compiler version). ``kumiko compile --tune`` drives it with a progress bar; a later
plain compile of the same region and shape cluster picks the cached winner up.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.plan.cost import candidates, estimate, machine_from_features
from kumiko.plan.plan import Plan
from kumiko.region.serial import region_json
from kumiko.region.ssa import Program, Region
from kumiko.util import atomic_write


def shape_cluster(env: Mapping[str, int]) -> str:
    """Sizes rounded up to powers of two: plans are reused across nearby shapes (ShapeSets)."""
    return ",".join(f"{k}={1 << max(0, math.ceil(math.log2(max(v, 1))))}" for k, v in sorted(env.items())
                    if isinstance(v, int))


def tune_key(region: Region, env: Mapping[str, int], arch: str, compiler: str) -> str:
    text = json.dumps(region_json(region), sort_keys=True) + "|" + shape_cluster(env) + "|" + arch + "|" + compiler
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _tune_dir() -> Path | None:
    root = knobs.cache_dir()
    return None if root is None else root / "tune"


def cached_plan(key: str) -> Plan | None:
    d = _tune_dir()
    if d is None:
        return None
    f = d / f"{key}.json"
    try:
        return Plan.from_json(json.loads(f.read_text())["plan"])
    except (OSError, ValueError, KeyError, KumikoError):
        return None       # missing or corrupted: tune again


def store_plan(key: str, plan: Plan, seconds: float) -> None:
    d = _tune_dir()
    if d is not None:
        atomic_write(d / f"{key}.json", json.dumps({"plan": plan.to_json(), "seconds": seconds}, indent=2) + "\n")


def progress(done: int, total: int, label: str, stream=sys.stderr) -> None:
    width = 30
    fill = int(width * done / max(total, 1))
    stream.write(f"\r  tuning {label}: [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
    if done == total:
        stream.write("\n")
    stream.flush()


def tune(program: Program, plans: dict[str, Plan], env: Mapping[str, int], features: dict, compiler: str,
         time_plans: Callable[[dict[str, Plan]], float], report: Callable = progress) -> dict[str, Plan]:
    """For each region with more than one candidate, time every candidate (others fixed) and keep the
    fastest; returns the tuned plans. ``time_plans(plans)`` builds and times the whole program, raising
    a KumikoError when a build fails (scored ``inf``)."""
    m = machine_from_features(features)
    out = dict(plans)
    for r in program.regions:
        base = out[r.name]
        cands = candidates(base, m)
        if len(cands) < 2:
            continue
        key = tune_key(r, env, base.arch, compiler)
        hit = cached_plan(key)
        if hit is not None:
            out[r.name] = hit
            continue
        cands.sort(key=lambda p: estimate(r, p, env, m).seconds)
        scores = []
        for k, p in enumerate(cands):
            trial = dict(out)
            trial[r.name] = p
            try:
                t = time_plans(trial)
            except KumikoError:
                t = math.inf          # a failed build never wins
            scores.append(t)
            report(k + 1, len(cands), r.name)
        best = min(range(len(cands)), key=lambda i: scores[i])
        if math.isfinite(scores[best]):
            out[r.name] = cands[best]
            store_plan(key, cands[best], scores[best])
    return out


def median_time(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]
