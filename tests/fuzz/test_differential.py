"""Differential fuzzing: random network-shaped graphs on the compiled targets against the evaluator.

``netgraphs`` draws graphs whose sizes straddle the thresholds where a CPU plan changes path (vector
loops and their four-accumulator unrolled form, long rows, tails) and whose ops are the ones networks
combine: reductions broadcast back, softmax and layernorm on any axis, permutes, flips, negative-step
slices, reversed and exclusive cumsums, ``y @ y.T``, pads. Each compiled result must equal the
evaluator's within the fp32 bound (``netgraphs.agrees``: where a graph cancels catastrophically, within a
few times the fp32 reference's own error against float64), or the compile must end in a diagnostic, never
another exception.
Under CI the draws are derandomized (tests/conftest.py); ``python -m tests.fuzz.netgraphs N`` sweeps N
seeded graphs for longer hunts.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kumiko
from kumiko.diagnostics import KumikoError
from tests.fuzz.netgraphs import MAX_ELEMENTS, HypothesisDraw, agrees, draw_graph, inputs_for

#: examples per test; ``KUMIKO_FUZZ_EXAMPLES=2000 pytest tests/fuzz`` hunts longer than CI does
FUZZ = settings(max_examples=int(os.environ.get("KUMIKO_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=list(HealthCheck))


def _differential(data, seed: int, target: str, max_elements: int = MAX_ELEMENTS) -> None:
    g, shapes, ops = draw_graph(HypothesisDraw(data), max_elements=max_elements)
    ins = inputs_for(shapes, seed)
    want = kumiko.compile(g, "eval")(**ins)["y"]
    try:
        exe = kumiko.compile(g, target)
    except KumikoError:
        return                                   # a refusal with a diagnostic is allowed; a traceback is not
    ok, err = agrees(g, ins, exe(**ins)["y"], want)
    assert ok, f"{target}: relative L2 error {err:.3g} for ops {ops} on inputs {shapes}"


@FUZZ
@given(data=st.data(), seed=st.integers(0, 2 ** 31 - 1))
def test_network_shaped_graphs_on_cpu_match_the_evaluator(data, seed):
    _differential(data, seed, "cpu")


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2 ** 31 - 1))
def test_network_shaped_graphs_on_the_cuda_emulator_match_the_evaluator(data, seed):
    _differential(data, seed, "cuda-emu", max_elements=4096)   # the emulator runs each GPU thread on the CPU
