"""The elementwise loops the CPU backend marks ``#pragma omp simd`` (fused epilogues, stage outputs) are
vectorized by gcc on every ISA we build for, AVX2 machines (Zen, Haswell: ``-march=x86-64-v3``) included.

With gcc's default ``-ftrapping-math`` a select followed by arithmetic (a ReLU6 clamp then ``+ 0``; exp2's
clamp of its argument then ``x + 1.5 * 2^23``) is not if-converted on AVX2: gcc moves the arithmetic onto
the select's arms, and an add may raise a floating-point exception, so the loop stayed scalar ("control flow
in loop"). On a Zen 3 that made MobileNetV2's 1x1 expand convs 3.7x slower than onnxruntime; AVX-512 hid it
with masked operations. The kernels build with ``-fno-trapping-math`` (values are unchanged: gcc may ignore
exception flags, as clang does by default), and ``kumiko_exp2`` is branch-free, so a dead lane (2^x below
2^-150) is still an exact 0 and not an underflow when gcc vectorizes it (``test_cpu_header``).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kumiko
from kumiko.runtime.cpu import CC, DEFAULT_FLAGS, INCLUDE_DIR

EXAMPLES = Path(__file__).parents[2] / "examples"


def scalar_simd_loops(source: str, tmp: Path, march: str) -> list[str]:
    """Each ``#pragma omp simd`` loop of ``source`` that gcc reports as not vectorized at ``-march=march``,
    with the reason it gives."""
    unit = tmp / "k.c"
    unit.write_text(source)
    flags = [f for f in DEFAULT_FLAGS if not f.startswith("-march") and f != "-shared"]
    proc = subprocess.run([CC, *flags, f"-march={march}", "-fopt-info-vec-all", f"-I{INCLUDE_DIR}", "-S", str(unit),
                           "-o", str(tmp / "k.s")], capture_output=True, text=True, check=True)
    lines = source.splitlines()
    loops = [i + 2 for i, text in enumerate(lines) if "#pragma omp simd" in text]   # the for statement's line
    missed = {int(m[1]): m[2] for m in re.finditer(r"k\.c:(\d+):\d+: missed: not vectorized: (.*)", proc.stderr)}
    done = {int(m[1]) for m in re.finditer(r"k\.c:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    bad = []
    for line in loops:
        near = range(line, line + 3)      # gcc names the loop by its header or the first statement of its body
        if not any(n in done for n in near) and any(n in missed for n in near):
            bad.append(f"line {line}: {next(missed[n] for n in near if n in missed)}: {lines[line - 1].strip()}")
    return bad


def conv_clip(c: int, co: int, h: int, k: int) -> onnx.ModelProto:
    """A MobileNetV2 layer: Conv with bias, then Clip(0, 6)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((co, c, k, k)) * 0.1).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    g = helper.make_graph(nodes, "conv_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c, h, h))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, co, h, h))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


GRAPHS = {
    "conv1x1_relu6": lambda: kumiko.from_onnx(conv_clip(16, 96, 56, 1)),
    "conv3x3_relu6": lambda: kumiko.from_onnx(conv_clip(8, 32, 30, 3)),
    "mlp_gelu": lambda: kumiko.load(EXAMPLES / "mlp_subgraphs.kumiko"),
    "conv_silu": lambda: kumiko.load(EXAMPLES / "conv3x3_s2_p1_silu.kumiko"),
    "gemm_bias_relu": lambda: kumiko.load(EXAMPLES / "gemm_bias_relu.json"),
}


@pytest.mark.skipif(shutil.which(CC) is None, reason="needs gcc")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_simd_loops_are_vectorized(name, march, tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")          # the source, not a cached program
    source = kumiko.compile(GRAPHS[name](), "cpu").compilation.source.source
    assert "#pragma omp simd" in source
    assert scalar_simd_loops(source, tmp_path, march) == []


def test_the_build_ignores_floating_point_exceptions():
    """What lets the selects vectorize; contraction stays off (see test_wrong_answers)."""
    assert "-fno-trapping-math" in DEFAULT_FLAGS and "-ffp-contract=off" in DEFAULT_FLAGS
