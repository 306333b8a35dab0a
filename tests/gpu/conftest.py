"""Shared fixtures for the cuda-emu target tests: every example compiled once, its emulator libraries
(plain and AddressSanitizer) built two at a time in the background into a private cache."""
from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import kumiko
from kumiko.accuracy import rel_l2  # noqa: F401  (the tests import it from here)
from kumiko.frontend.graph import Graph
from kumiko.pipeline import compile_cuda
from kumiko.runtime.emu_program import CompiledCuda

EXAMPLES = Path(__file__).parents[2] / "examples"
#: the seeds' examples the target must run (stem), in fp16 unless stated
STEMS = ("gemm_bias_relu", "conv3x3_s2_p1", "conv_relu_maxpool", "attention_row_softmax", "attention_causal")
#: (stem, dtype) -> emulator configurations whose libraries the tests need
BUILDS = {**{(s, "fp16"): ("deferred", "asan") for s in STEMS},
          **{(s, "fp32"): ("deferred",) for s in STEMS},
          ("gemm_bias_relu", "bf16"): ("deferred",), ("attention_causal", "bf16"): ("deferred",)}

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")


def graph(stem: str, dtype: str = "fp16") -> Graph:
    """An example with every float tensor retyped (the examples are fp32; MMA needs 16-bit), as
    ``kumiko run --dtype`` does."""
    return kumiko.load(EXAMPLES / f"{stem}.json").with_float_dtype(dtype)


@pytest.fixture(scope="session")
def gpu_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("kumiko-gpu-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KUMIKO_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def compiled(gpu_cache):
    """``compiled(stem, dtype)`` -> CompiledCuda whose libraries are built (or being built) already."""
    if shutil.which("g++") is None:
        pytest.skip("the CUDA emulator needs g++")
    progs: dict[tuple, CompiledCuda] = {k: compile_cuda(graph(*k).tiny) for k in BUILDS}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[tuple, list[Future]] = {k: [pool.submit(progs[k].module, e) for e in emus]
                                              for k, emus in BUILDS.items()}

        def get(stem: str, dtype: str = "fp16") -> CompiledCuda:
            for f in futures[(stem, dtype)]:
                f.result()
            return progs[(stem, dtype)]
        yield get


def mma_plans(stem: str, dtype: str = "fp16", arch: str = "sm80") -> dict:
    """The chooser's per-region plans of an example, to pass as ``plans``: the attention pair then keeps the
    three-launch path (QK^T on the MMA skeleton into a scratch, the SIMT row softmax, P·V) instead of the fused
    streaming kernel, which the chooser picks only for pairs whose plans are its own."""
    from kumiko.plan.gpu import choose_gpu_plan
    from kumiko.runtime.program import program_symbols
    prog = compile_cuda(graph(stem, dtype).tiny).program
    return {r.name: choose_gpu_plan(r, arch, program_symbols(prog)) for r in prog.regions}


def run_and_compare(c: CompiledCuda, g: Graph, emu: str, seed: int, shapes=None) -> dict[str, float]:
    """Run the compiled program on the emulator against the Tiny IR evaluator; rel. L2 per output."""
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(seed, shapes)
    env = ref.bind(ins, None)
    out = c.runner(emu)(ins, env)
    want = ref(**ins)
    return {k: rel_l2(out[k], want[k]) for k in want}


def assert_missing_splits_reported(c: CompiledCuda, g: Graph, out: str) -> None:
    """Injected bug: the split-K launch's grid z holds the batch but not the splits, so no tile's counters reach
    the last split, no epilogue runs and the output keeps its poison; the counters stay non-zero, which the
    runner reports (E1704). The right launches match the evaluator."""
    from dataclasses import replace

    from kumiko.diagnostics import KumikoError
    ln = next(x for x in c.launches if x.counters)
    broken = replace(c, launches=[replace(ln, grid=ln.grid[:2] + ((1, 1),)) if x is ln else x for x in c.launches])
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(5)
    env = ref.bind(ins, None)
    with pytest.raises(KumikoError) as e:
        broken.runner("deferred")(ins, env)
    assert e.value.code == "E1704" and "split-K counters" in e.value.why
    assert rel_l2(c.runner("deferred")(ins, env)[out], ref(**ins)[out]) < 2e-3
