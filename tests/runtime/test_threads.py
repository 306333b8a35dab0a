"""One Executable called from several threads at once gives each call its own right answer (issue 20).

Programs with intermediate buffers keep them in an arena reused call after call; two calls running at once
must not share it (nor the output pool, nor the aligned input copies). Each call below gets a fresh random
input of its own and is compared against the evaluator (or numpy) for that input."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import compare
from kumiko.compiler import Executable
from kumiko.runtime.cpu import build_c
from kumiko.runtime.program import CpuProgram

from .handmade import KERNELS, two_region_program

EXAMPLES = Path(__file__).parents[2] / "examples"
THREADS = 4


def hammer(call: Callable[[int], list[str]], calls: int) -> list[str]:
    """Run ``call(seed)`` ``calls`` times in each of THREADS threads, all started together; every failure
    message (a wrong result or an exception) collected."""
    errors: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        start.wait()
        for i in range(calls):
            try:
                errors.extend(call(1000 * t + i))
            except Exception as e:  # noqa: BLE001 - reported, so the test names it
                errors.append(f"seed {1000 * t + i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    return errors


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (absolute error < 1.5e-7): numpy has no erf, and this is vectorised."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def mlp_reference(x, w1, b1, w2, b2) -> dict[str, np.ndarray]:
    """examples/mlp_subgraphs.kumiko in float64 numpy (rounded to the graph's fp32 at the end): two dense GELU
    layers, a residual, rows centred."""
    def dense(v, w, b):
        z = v @ w.astype(np.float64) + b.astype(np.float64)
        return 0.5 * z * (1.0 + erf(z / np.sqrt(2.0)))
    r = dense(dense(x.astype(np.float64), w1, b1), w2, b2) + x
    mu = r.mean(axis=1, keepdims=True)
    return {"y": (r - mu).astype(np.float32), "mu": mu.astype(np.float32)}


@pytest.mark.parametrize("target, calls", [("cpu", 100), ("eval", 10), ("cuda-emu", 3)])
def test_mlp_from_four_threads(target, calls):
    """mlp_subgraphs has an intermediate buffer in the arena; B=64 as in the issue's report. Every call gets
    fresh random inputs of its own, checked against numpy (itself checked against the evaluator once)."""
    g = kumiko.load(EXAMPLES / "mlp_subgraphs.kumiko")
    exe = kumiko.compile(g, target)
    first = exe.random_inputs(0, {"B": 64})
    assert all(c.ok for c in compare(mlp_reference(**first), Executable(g, "eval")(**first)))

    def call(seed: int) -> list[str]:
        ins = exe.random_inputs(seed, {"B": 64})
        got = exe(**ins)
        return [f"seed {seed}: {c.name} rel_l2 {c.rel_l2:.3g}" for c in compare(got, mlp_reference(**ins))
                if not c.ok]

    errors = hammer(call, calls)
    assert not errors, f"{len(errors)} wrong results, e.g. {errors[:3]}"


def test_handmade_program_from_four_threads():
    """The runtime alone: x -> t (arena) -> y, with contiguous inputs (used in place) and strided ones (copied
    into the runtime's own memory), mostly at one size (one arena, one output pool key) and sometimes not."""
    run = CpuProgram(two_region_program(), build_c(KERNELS, name="handmade"), {"k_t": "k_t", "k_y": "k_y"},
                     poison=True)

    def call(seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        m, n = (256, 300) if seed % 5 else (int(rng.integers(1, 300)), int(rng.integers(1, 300)))
        x = rng.standard_normal((m, 2 * n)).astype(np.float32)
        x = x[:, ::2] if seed % 2 else np.ascontiguousarray(x[:, :n])
        y = run({"x": x}, {"M": m, "N": n})["y"]
        return [] if np.array_equal(y, x * 2 + 1) else [f"seed {seed}: wrong y"]

    errors = hammer(call, 100)
    assert not errors, f"{len(errors)} wrong results, e.g. {errors[:3]}"


def test_sequential_calls_reuse_one_arena():
    """Called from one thread, a program keeps one call state: the same arena bytes every call."""
    run = CpuProgram(two_region_program(), build_c(KERNELS, name="handmade"), {"k_t": "k_t", "k_y": "k_y"})
    env = {"M": 5, "N": 7}
    x = np.ones((5, 7), np.float32)
    run({"x": x}, env)
    _, raw = run.arena(env)
    for _ in range(3):
        np.testing.assert_array_equal(run({"x": x}, env)["y"], x * 2 + 1)
        assert run.arena(env)[1] is raw
    assert len(run._free_states) == 1
