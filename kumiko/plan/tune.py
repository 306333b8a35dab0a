"""Autotuning (seed 001 §11; Triton's habit): build and time the surviving candidate plans of each
region, score a failed build as infinite, and cache the winner on disk keyed by (region hash, shape
cluster, target, compiler version). ``kumiko compile --tune`` drives it with a progress bar; a later
plain compile of the same region and shape cluster picks the cached winner up (``cached_winner``). A cache
entry is a hint, never trusted: one that does not parse, has the wrong shape, or is not one of the region's
candidates on this machine is a miss, and tuning again overwrites it.
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
from kumiko.plan.cost import Machine, candidates, estimate, machine_from_features
from kumiko.plan.plan import PLAN_FORMAT, Plan
from kumiko.region.serial import region_json
from kumiko.region.ssa import Program, Region
from kumiko.util.files import cache_root, publish_entry


def shape_cluster(env: Mapping[str, int]) -> str:
    """Sizes rounded up to powers of two: plans are reused across nearby shapes (ShapeSets)."""
    return ",".join(f"{k}={1 << max(0, math.ceil(math.log2(max(v, 1))))}" for k, v in sorted(env.items())
                    if isinstance(v, int))


def tune_key(region: Region, env: Mapping[str, int], arch: str, compiler: str) -> str:
    text = "|".join((json.dumps(region_json(region), sort_keys=True), shape_cluster(env), arch, compiler,
                     f"plan/{PLAN_FORMAT}"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _tune_dir() -> Path | None:
    """``<KUMIKO_CACHE>/tune``; None with the cache off (tuned plans are then not kept)."""
    return None if knobs.cache_dir() is None else cache_root("tune")


def cached_plan(key: str) -> Plan | None:
    """The plan stored under ``key``, or None: missing, unreadable, not JSON, or JSON of another shape than
    ``{"plan": {...}}`` (a file from another version, or damaged) are all misses."""
    d = _tune_dir()
    if d is None:
        return None
    try:
        entry = json.loads((d / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    plan = entry.get("plan") if isinstance(entry, dict) else None
    if not isinstance(plan, dict):
        return None
    try:
        return Plan.from_json(plan)
    except (KumikoError, TypeError, ValueError):
        return None


def cached_winner(region: Region, base: Plan, env: Mapping[str, int], machine: Machine,
                  compiler: str) -> Plan | None:
    """The tuned plan cached for this region and shape cluster, if it is ``base`` or one of ``base``'s
    candidates on this machine: only a plan tuning could have chosen here is taken from the cache."""
    hit = cached_plan(tune_key(region, env, base.arch, compiler))
    return hit if hit is not None and (hit == base or hit in candidates(base, machine)) else None


def store_plan(key: str, plan: Plan, seconds: float) -> None:
    """Cache a tuned winner (overwriting whatever held the key, a directory included)."""
    d = _tune_dir()
    if d is not None:
        publish_entry(d / f"{key}.json", json.dumps({"plan": plan.to_json(), "seconds": seconds}, indent=2) + "\n")


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
        hit = cached_winner(r, base, env, m, compiler)
        if hit is not None:
            out[r.name] = hit
            continue
        key = tune_key(r, env, base.arch, compiler)
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
