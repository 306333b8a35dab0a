"""nvcc -> cubin for the ``cuda`` target: the disk cache (hits, corrupted entries rebuilt, nothing left by a
failed build), both archs, and the ptxas report fed back to the plans (spills, shared memory). Needs nvcc,
not a GPU; skipped with a reason where nvcc is missing."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.pipeline import compile_cuda
from kumiko.runtime import cubin as kc
from kumiko.runtime.cuda_program import check_cubin
from kumiko.runtime.ptxas import nvcc_path

from .conftest import EXAMPLES, graph, needs_gxx

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")]

SOURCE = """// a tiny kernel in the generated code's shape
#include "kumiko_cuda.cuh"
extern "C" __global__ void __launch_bounds__(128) kumiko_axpy(const float* __restrict__ x, float* __restrict__ y,
                                                              float a, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
KUMIKO_ENTRY(kumiko_axpy)
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    return tmp_path / "cubin"


def _files(root):
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_second_build_is_a_cache_hit(cache):
    before = dict(kc.STATS)
    a = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    assert not a.cached and a.data[:4] == b"\x7fELF" and a.path.read_bytes() == a.data
    r = a.resources["kumiko_axpy"]
    assert r.arch == "sm_80" and r.entry and r.registers > 0 and r.spill_stores == 0
    b = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    assert b.cached and b.data == a.data and b.key == a.key and b.resources == a.resources
    assert kc.STATS["compiles"] == before["compiles"] + 1 and kc.STATS["disk_hits"] == before["disk_hits"] + 1
    assert sorted(_files(cache)) == sorted(f"{a.key}{s}" for s in (".cu", ".cubin", ".json"))
    info = json.loads((cache / f"{a.key}.json").read_text())
    assert info["arch"] == "sm_80" and info["size"] == len(a.data) and "Compiling entry function" in info["log"]


def test_key_covers_arch_flags_and_source(cache):
    k80 = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    k90 = kc.build_cubin(SOURCE, "sm_90a", name="axpy")
    assert k80.key != k90.key and k90.resources["kumiko_axpy"].arch == "sm_90a"
    assert kc.build_cubin(SOURCE, "sm_80", name="axpy", extra_flags=("-DX=1",)).key != k80.key
    assert kc.build_cubin(SOURCE + "\n// edited\n", "sm_80", name="axpy").key != k80.key
    assert len(list(cache.glob("*.cubin"))) == 4


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_sidecar", "bad_sidecar"])
def test_corrupted_entry_is_rebuilt(cache, damage):
    a = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    meta = cache / f"{a.key}.json"
    if damage == "truncate":
        a.path.write_bytes(a.data[: len(a.data) // 2])
    elif damage == "flip":
        a.path.write_bytes(a.data[:100] + bytes([a.data[100] ^ 0xFF]) + a.data[101:])
    elif damage == "no_sidecar":
        meta.unlink()
    else:
        meta.write_text("{not json")
    before = dict(kc.STATS)
    b = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    assert not b.cached and b.data == a.data and b.path.read_bytes() == a.data
    assert kc.STATS["rebuilt_corrupt"] == before["rebuilt_corrupt"] + 1
    assert kc.build_cubin(SOURCE, "sm_80", name="axpy").cached


def test_invalidate_drops_the_entry(cache):
    a = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    kc.invalidate(a)
    assert _files(cache) == []
    assert not kc.build_cubin(SOURCE, "sm_80", name="axpy").cached


def test_failing_source_is_a_diagnostic_and_leaves_nothing(cache):
    bad = SOURCE.replace("a * x[i]", "a * undefined_name[i]")
    with pytest.raises(KumikoError) as e:
        kc.build_cubin(bad, "sm_80", name="axpy")
    d = e.value
    assert d.code == "E1701" and d.kind == "KernelBuildFailed" and d.at == "axpy"
    assert "undefined_name" in d.why and "-arch=sm_80" in d.details["command"] and "error" in d.details["log"]
    assert _files(cache) == [], "a failed build writes nothing into the cache"


def test_bad_arch_and_missing_nvcc(cache, monkeypatch):
    with pytest.raises(KumikoError) as e:
        kc.build_cubin(SOURCE, "compute_80")
    assert e.value.code == "E1501"
    monkeypatch.setattr(kc, "nvcc_path", lambda: None)
    with pytest.raises(KumikoError) as e:
        kc.build_cubin(SOURCE, "sm_80")
    assert e.value.code == "E1701" and "nvcc" in e.value.why


def test_cache_off_builds_into_a_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", "0")
    a = kc.build_cubin(SOURCE, "sm_80", name="axpy")
    assert a.path.exists() and not str(a.path).startswith(str(tmp_path))


#: a kernel with 96 live floats under __launch_bounds__(1024, 2) (at most 32 registers): ptxas spills
SPILLING = """#include "kumiko_cuda.cuh"
extern "C" __global__ void __launch_bounds__(1024, 2) NAME(const float* __restrict__ x, float* __restrict__ y) {
  float acc[96];
#pragma unroll
  for (int j = 0; j < 96; ++j) acc[j] = x[threadIdx.x + j * 1024];
#pragma unroll
  for (int it = 0; it < 4; ++it)
#pragma unroll
    for (int j = 0; j < 96; ++j) acc[j] = acc[j] * acc[(j + 7) % 96] + x[j + it];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 96; ++j) s += acc[j] * (float)j;
  y[threadIdx.x] = s;
}
"""


def test_ptxas_report_rejects_spills_and_smem(cache):
    """The ptxas report is fed back to the plans: the generated GEMM passes; a kernel of the same name that
    spills is rejected (E1801 spill), as is shared memory past the device's per-block limit (E1801 smem)."""
    c = compile_cuda(graph("gemm_bias_relu", "fp16").tiny)
    ok = kc.build_cubin(c.source, "sm_80", name="gemm")
    check_cubin(c, ok)
    with pytest.raises(KumikoError) as e:
        check_cubin(c, ok, smem_limit=c.launches[0].smem - 1)
    assert e.value.code == "E1801" and e.value.details["hazard"] == "smem"
    spills = kc.build_cubin(SPILLING.replace("NAME", c.launches[0].kernel), "sm_80", name="spill")
    assert spills.resources[c.launches[0].kernel].spill_stores > 0
    with pytest.raises(KumikoError) as e:
        check_cubin(c, spills)
    assert e.value.code == "E1801" and e.value.details["hazard"] == "spill"
    with pytest.raises(KumikoError) as e:
        check_cubin(c, kc.build_cubin(SOURCE, "sm_80", name="axpy"))       # the kernel is not in the report
    assert e.value.code == "E1701"


def test_cuda_target_builds_without_a_device(cache):
    """With an explicit gpu_arch, compiling for ``cuda`` needs nvcc, not a GPU (the device opens at the first
    call); the cubin is the generated source the emulator runs, and a second compile is a cache hit."""
    g = graph("attention_causal", "fp16")
    exe = kumiko.compile(g, "cuda", gpu_arch="sm_90a")
    run = exe._run
    assert run.gpu_arch == "sm_90a" and not run.cubin.cached
    assert run.source == compile_cuda(g.tiny).source
    assert set(run.cubin.resources) >= {ln.kernel for ln in run.launches}
    assert kumiko.compile(g, "cuda", gpu_arch="sm_90a")._run.cubin.cached


def test_a_chosen_plan_that_ptxas_rejects_steps_down(cache, monkeypatch):
    """The ptxas report fed back to the chooser: a chosen MMA plan that spills is replaced by the next plan
    down (the large plan's one-barrier ring: the two-barrier ring, then the small tile) and the replacement
    says why; a plan the caller gave is never replaced, it is rejected (E1801)."""
    from kumiko.runtime import cuda_program as tg
    real = tg.check_resources
    seen = []

    def spills_unless_small(plan, kernel, res, smem, region=None):
        seen.append((plan.tile, plan.get("async_", "release")))
        if plan.algo == "mma" and plan.tile != (64, 64, 32):
            res = replace(res, registers=255, spill_stores=8, spill_loads=8)
        real(plan, kernel, res, smem, region)

    monkeypatch.setattr(tg, "check_resources", spills_unless_small)
    g = graph("gemm_bias_relu", "fp16")
    exe = kumiko.compile(g, "cuda", gpu_arch="sm_90a", arch="sm80")       # the mma.sync chooser on Hopper
    (plan,) = exe._run.plans.values()
    assert seen == [((128, 128, 32), "merged"), ((128, 128, 32), "trailing"), ((64, 64, 32), "trailing")]
    assert plan.tile == (64, 64, 32) and plan.warp_tile == "32x32" and plan.stages == 3 and plan.threads == 128
    assert dict(plan.ptxas_fallback) == {"gpu_arch": "sm_90a", "hazard": "spill", "steps": 2}
    assert plan.to_json()["ptxas_fallback"] == {"gpu_arch": "sm_90a", "hazard": "spill", "steps": 2}
    assert "// plan: tile 64x64x32, warps 2x2, 3 stages" in exe._run.source
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "cuda", gpu_arch="sm_90a", arch="sm80", plans={"k_C2": compile_cuda(g.tiny).plans["k_C2"]})
    assert e.value.code == "E1801" and e.value.details["hazard"] == "spill" and e.value.details["region"] == "k_C2"


def test_chosen_plans_build_without_spills_for_awkward_sizes(cache):
    """Sizes where ptxas (CUDA 13, sm_90a) spilled the one-barrier ring's small tile: the chooser's plan
    after feedback builds clean."""
    from kumiko import Tensor
    g = (Tensor.input("A", (512, 512), dtype="fp16") @ Tensor.input("B", (512, 64), dtype="fp16")).graph("y", name="g")
    for arch in ("sm_80", "sm_90a"):
        run = kumiko.compile(g, "cuda", gpu_arch=arch)._run
        assert all(r.spill_stores == r.spill_loads == 0 for r in run.cubin.resources.values())


def test_cli_compiles_for_cuda_without_a_device(cache, tmp_path, capsys):
    """``kumiko compile --target cuda --gpu-arch sm_90a`` builds with nvcc alone, reports each launch with
    ptxas's numbers, and ``--dump c`` writes the .cu and the cubin; --gpu-arch elsewhere is a diagnostic."""
    from kumiko.cli import main
    d = json.loads((EXAMPLES / "attention_causal.json").read_text())
    for t in d["tensors"].values():
        t["dtype"] = "fp16"
    f = tmp_path / "attn16.json"
    f.write_text(json.dumps(d))
    out = tmp_path / "build"
    assert main(["compile", str(f), "--target", "cuda", "--gpu-arch", "sm_90a", "--dump", "c", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "compiled for cuda (sm_90a cubin" in text and "streaming_softmax (sm90" in text and "online softmax" in text
    assert text.count("    launch ") == 1 and "registers" in text and "0 B spill stores" in text
    name = d.get("name", "attention_causal")
    assert (out / f"{name}.cu").read_text() == compile_cuda(graph("attention_causal", "fp16").tiny, arch="sm90").source
    assert (out / f"{name}.sm_90a.cubin").read_bytes()[:4] == b"\x7fELF"
    assert main(["--json", "compile", str(f), "--target", "cuda", "--gpu-arch", "sm_80"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["gpu_arch"] == "sm_80" and [ln["ptxas"]["spill_stores"] for ln in res["launches"]] == [0]
    assert main(["compile", str(f), "--gpu-arch", "sm_80"]) == 2
    assert "E1010" in capsys.readouterr().err


@needs_gxx
def test_cli_runs_the_sm90_skeleton_on_the_emulator(cache, capsys):
    """``kumiko run FILE --target cuda-emu --gpu-arch sm_90a --dtype fp16 --check`` plans for Hopper (the SM90
    skeleton: TMA + wgmma) and checks against the evaluator; sm_80 keeps mma.sync; a name that is no arch, or the
    option on another target, is E1010."""
    from kumiko.cli import main
    f = str(EXAMPLES / "gemm_bias_relu.json")
    assert main(["--json", "run", f, "--target", "cuda-emu", "--gpu-arch", "sm_90a", "--dtype", "fp16", "--check"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert all(c["ok"] for c in res["check"].values())
    assert main(["--json", "compile", f, "--target", "cuda-emu", "--gpu-arch", "sm_90a", "--dtype", "fp16"]) == 0
    assert {p["algo_choice"].get("contraction") for p in json.loads(capsys.readouterr().out)["plans"].values()} == {
        "wgmma"}
    assert main(["--json", "compile", f, "--target", "cuda-emu", "--gpu-arch", "sm_80", "--dtype", "fp16"]) == 0
    assert {p["algo_choice"].get("contraction") for p in json.loads(capsys.readouterr().out)["plans"].values()} == {
        "mma"}
    for bad in (["--target", "cuda-emu", "--gpu-arch", "hopper"], ["--target", "cpu", "--gpu-arch", "sm_90a"]):
        assert main(["run", f, *bad]) == 2
        assert "E1010" in capsys.readouterr().err
