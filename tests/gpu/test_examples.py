"""The seeds' examples on the cuda-emu target against the Tiny IR evaluator: fp16 (the MMA skeleton for
every contraction) in every emulator configuration (deferred, eager, reversed, random, asan), at the
examples' sizes and at sizes that are not multiples of any tile (K not a multiple of 8: the
scalar-gather fallback); fp32 (SIMT) and bf16."""
from __future__ import annotations

import pytest

import kumiko
from kumiko.accuracy import bound
from kumiko.diagnostics import KumikoError

from .conftest import EXAMPLES, STEMS, graph, needs_gxx, run_and_compare

pytestmark = needs_gxx


@pytest.mark.parametrize("emu", ["deferred", "eager", "reversed", "random", "asan"])
@pytest.mark.parametrize("stem", STEMS)
def test_fp16_examples_match_the_evaluator(compiled, stem, emu):
    c = compiled(stem, "fp16")
    assert any(p.algo in ("mma", "streaming_softmax") for p in c.plans.values()), "every example holds a contraction"
    g = graph(stem, "fp16")
    for seed, shapes in ((1, None), (2, {k: v + 5 for k, v in g.symbols.items()})):
        errs = run_and_compare(c, g, emu, seed, shapes)
        assert all(e <= bound("fp16") for e in errs.values()), (stem, emu, shapes, errs)


@pytest.mark.parametrize("stem", STEMS)
def test_fp32_examples_run_simt(compiled, stem):
    c = compiled(stem, "fp32")
    assert all(p.algo == "simt" for p in c.plans.values())
    g = graph(stem, "fp32")
    errs = run_and_compare(c, g, "deferred", 3, {k: v + 3 for k, v in g.symbols.items()})
    assert all(e <= bound("fp32") for e in errs.values()), errs


@pytest.mark.parametrize("stem", ["gemm_bias_relu", "attention_causal"])
def test_bf16(compiled, stem):
    g = graph(stem, "bf16")
    errs = run_and_compare(compiled(stem, "bf16"), g, "deferred", 4, {k: v + 3 for k, v in g.symbols.items()})
    assert all(e <= bound("bf16") for e in errs.values()), errs
    assert "mma_m16n8k16_bf16f32" in compiled(stem, "bf16").source


def test_compile_api_and_options(compiled):
    c = compiled("gemm_bias_relu", "fp16")
    exe = kumiko.compile(graph("gemm_bias_relu", "fp16"), "cuda-emu", emu="eager")
    assert exe.target == "cuda-emu" and exe._run.source == c.source      # deterministic source
    out = exe(**exe.random_inputs(0, {"M": 3, "N": 5, "K": 7}))
    assert out["C2"].shape == (3, 5)
    with pytest.raises(KumikoError) as e:
        kumiko.compile(graph("gemm_bias_relu", "fp16"), "cuda-emu", emu="tsan")
    assert e.value.code == "E1501"


def test_cli_runs_cuda_emu(gpu_cache, capsys):
    from kumiko.cli import main
    rc = main(["run", str(EXAMPLES / "gemm_bias_relu.json"), "--target", "cuda-emu"])
    assert rc == 0
    assert "cuda-emu" in capsys.readouterr().out


def test_cli_checks_the_fp16_example_in_an_emulator_configuration(compiled, capsys):
    """The issue's acceptance run from the command line: an fp16 example (tensor-core path) at sizes that are
    not tile multiples, in the eager+run-ahead emulator, checked against the evaluator."""
    from kumiko.cli import main
    compiled("gemm_bias_relu", "fp16")                    # its emulator library, built once for the session
    rc = main(["run", str(EXAMPLES / "gemm_bias_relu.json"), "--target", "cuda-emu", "--dtype", "fp16",
               "--emu", "eager", "--shapes", "M=70,N=37,K=45", "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(emulator: eager)" in out and "C2: float16[70, 37]" in out and "(bound 0.01 for fp16): ok" in out


def test_emulator_uses_the_plans_arch_shared_memory_limit(compiled):
    """cuda-emu plans for sm_80 by default: its launches are held to sm_80's 166,912 bytes a block, not
    sm_90's 227 KiB (a plan that only fits an H100 must not pass on the emulator for an A100)."""
    c = compiled("gemm_bias_relu", "fp16")
    assert c.arch == "sm80"
    for emu in ("deferred", "reversed", "asan"):
        assert c.module(emu).config.runtime_options()["max_smem"] == 166912
