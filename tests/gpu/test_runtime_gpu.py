"""The ``cuda`` target on a real NVIDIA GPU: every example against the Tiny IR evaluator (fp16 through the MMA
skeleton, fp32 SIMT, bf16), sizes that are and are not tile multiples, larger problems against numpy,
poisoned outputs, the cubin cache, and the diagnostics for faults, out-of-memory and bad launches.

Marked ``gpu`` and skipped, with the reason, where there is no device: no cuda-bindings, no driver, no
GPU, or no nvcc (kernels are built with it). Run on a lent machine with::

    python -m pytest -m gpu tests/gpu/test_runtime_gpu.py -v

The device's fault test runs in a child process: an illegal address leaves that process's CUDA context
unusable, and the other tests must keep theirs.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.plan.gpu import FUSED
from kumiko.runtime import cubin as kc
from kumiko.runtime.cuda_driver import CudaDevice, device_available
from kumiko.runtime.cuda_program import POISON_BYTE, pack_params
from kumiko.runtime.ptxas import nvcc_path

from .conftest import EXAMPLES, STEMS, graph, rel_l2

HAVE_GPU, GPU_REASON = device_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason=f"no GPU for the cuda target ({GPU_REASON})"),
    pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (the cuda target builds its kernels with it)"),
]
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def device() -> CudaDevice:
    dev = CudaDevice.get(0)
    print(f"\ndevice: {dev.describe()}")
    return dev


@pytest.fixture(scope="module")
def exes(gpu_cache):
    """``exes(stem, dtype)`` -> the example compiled for ``cuda`` once per module."""
    cache: dict = {}

    def get(stem: str, dtype: str = "fp16") -> kumiko.compiler.Executable:
        if (stem, dtype) not in cache:
            cache[(stem, dtype)] = kumiko.compile(graph(stem, dtype), "cuda")
        return cache[(stem, dtype)]
    return get


def _compare(exe, g, seed: int, shapes=None) -> dict[str, float]:
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(seed, shapes)
    out, want = exe(**ins), ref(**ins)
    return {k: rel_l2(out[k], want[k]) for k in want}


# ------------------------------------------------------------------------------------------------
# the examples

@pytest.mark.parametrize("stem", STEMS)
def test_fp16_examples_match_the_evaluator(device, exes, stem):
    exe = exes(stem, "fp16")
    # tensor cores: mma.sync (sm80 plans), wgmma (sm90 plans on Hopper), or the fused attention kernel's mma.sync
    assert {p.algo for p in exe._run.plans.values()} & {"mma", "wgmma", FUSED}
    assert exe._run.gpu_arch == device.arch
    g = graph(stem, "fp16")
    for seed, shapes in ((1, None), (2, {k: v + 5 for k, v in g.symbols.items()})):
        errs = _compare(exe, g, seed, shapes)
        assert all(e < 1e-2 for e in errs.values()), (stem, shapes, errs)


@pytest.mark.parametrize("stem", STEMS)
def test_fp32_examples_match_the_evaluator(exes, stem):
    g = graph(stem, "fp32")
    errs = _compare(exes(stem, "fp32"), g, 4, {k: v + 3 for k, v in g.symbols.items()})
    assert all(e < 1e-4 for e in errs.values()), errs


@pytest.mark.parametrize("stem", ["gemm_bias_relu", "attention_causal"])
def test_bf16_examples_match_the_evaluator(exes, stem):
    g = graph(stem, "bf16")
    errs = _compare(exes(stem, "bf16"), g, 5, {k: v + 3 for k, v in g.symbols.items()})
    assert all(e < 2e-2 for e in errs.values()), errs


def test_the_gpu_runs_the_emulators_source(exes, gpu_cache):
    """The device runs the very source the emulator tests (same lowering, same text)."""
    from kumiko.pipeline import compile_cuda
    for stem in STEMS:
        exe = exes(stem)
        assert exe._run.source == compile_cuda(graph(stem, "fp16").tiny, arch=exe._run.plan_arch).source


# ------------------------------------------------------------------------------------------------
# larger problems, against numpy (the evaluator would materialise the M*N*K product)

def _gemm_graph():
    a, b = Tensor.input("A", ("M", "K"), dtype="fp16"), Tensor.input("B", ("K", "N"), dtype="fp16")
    return (a @ b).graph("y", name="gemm_fp16")


def _attn_graph(causal: bool, d: int = 64):
    q, k, v = (Tensor.input(n, ("B", "H", "S", d), dtype="fp16") for n in ("Q", "K", "V"))
    y = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=1.0 / np.sqrt(d))
    return y.graph("y", name="attn_causal" if causal else "attn")


def _np_attn(q, k, v, causal):
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("mnk", [(1000, 777, 515), (2048, 2048, 2048), (129, 4095, 1031), (64, 64, 4104)])
def test_gemm_sizes(gpu_cache, mnk):
    m, n, k = mnk
    exe = kumiko.compile(_gemm_graph(), "cuda")
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), np.float32).astype(np.float16)
    b = rng.standard_normal((k, n), np.float32).astype(np.float16)
    y = exe(A=a, B=b)["y"]
    assert y.dtype == np.float16 and y.shape == (m, n)
    err = rel_l2(y, a.astype(np.float32) @ b.astype(np.float32))
    assert err < 1e-2, (mnk, err)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_sizes(gpu_cache, causal):
    exe = kumiko.compile(_attn_graph(causal), "cuda")
    rng = np.random.default_rng(7)
    for b, h, s in ((1, 2, 77), (2, 8, 1000)):
        q, k, v = (rng.standard_normal((b, h, s, 64), np.float32).astype(np.float16) for _ in range(3))
        y = exe(Q=q, K=k, V=v)["y"]
        err = rel_l2(y, _np_attn(q, k, v, causal))
        assert err < 1e-2, (b, h, s, causal, err)


@pytest.mark.parametrize("graph_replay", [False, True])
def test_split_k_on_the_device(gpu_cache, graph_replay):
    """Split-K (``Plan.split_k``) where the chooser picks it: a batch-1 ResNet stage-4 conv and a 128-token
    projection on the SM80 skeleton. Three calls on fresh inputs each match numpy: the per-tile counters (zeroed
    once when allocated) are left zero by every launch, also when the launches replay as a CUDA Graph."""
    x = Tensor.input("X", (1, 512, 7, 7), dtype="fp16")
    w = Tensor.input("Wt", (512, 512, 3, 3), dtype="fp16")
    b = Tensor.input("b", (512,), dtype="fp16")
    conv = kumiko.compile(x.conv2d(w, b, padding=1).relu().graph("y"), "cuda", arch="sm80", cuda_graph=graph_replay)
    a = Tensor.input("A", (128, 3072), dtype="fp16")
    wl = Tensor.input("W", (3072, 768), dtype="fp16")
    lin = kumiko.compile((a @ wl).graph("y"), "cuda", arch="sm80", cuda_graph=graph_replay)
    for exe in (conv, lin):
        assert any(p.split_k > 1 for p in exe._run.plans.values()), exe._run.plans
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    for _ in range(3):
        xs, ws, bs = (rng.standard_normal(s, np.float32).astype(np.float16) for s in ((1, 512, 7, 7),
                                                                                      (512, 512, 3, 3), (512,)))
        want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(xs.astype(np.float32)),
                                                     torch.from_numpy(ws.astype(np.float32)),
                                                     torch.from_numpy(bs.astype(np.float32)), padding=1)).numpy()
        assert rel_l2(conv(X=xs, Wt=ws, b=bs)["y"], want) < 2e-3
        am, wm = (rng.standard_normal(s, np.float32).astype(np.float16) for s in ((128, 3072), (3072, 768)))
        assert rel_l2(lin(A=am, W=wm)["y"], am.astype(np.float32) @ wm.astype(np.float32)) < 2e-3


# ------------------------------------------------------------------------------------------------
# buffers, poisoning, the cache

def test_outputs_are_poisoned_before_the_kernels_run(exes):
    exe = exes("attention_row_softmax")
    prog = exe._run.runner()
    ins = exe.random_inputs(0)
    env = exe.bind(ins)
    b = prog.bind(env)
    prog.upload(b, ins)
    prog.fill_poison(b)
    before = prog.download(b)["P"]
    assert (before.view(np.uint16) == POISON_BYTE * 0x101).all()
    prog.enqueue(b)
    prog.wait(b)
    after = prog.download(b)["P"].astype(np.float32)
    assert np.isfinite(after).all(), "every output element is written"
    # the same sizes reuse the device buffers; new sizes get new ones (at most KEEP_BOUND kept)
    assert prog.bind(env) is b
    exe(**exe.random_inputs(1, {"M": 33}))
    assert len(prog._bound) == 2


def test_cuda_graph_replays_the_launches(gpu_cache, monkeypatch):
    """cuda_graph=True (and KUMIKO_CUDA_GRAPH=1): each size set's launches captured once, replayed on fresh inputs,
    bit-identical to launching them one by one."""
    g = graph("attention_causal", "fp16")
    exe = kumiko.compile(g, "cuda", cuda_graph=True)
    plain = kumiko.compile(g, "cuda")
    for seed, shapes in ((1, None), (2, None), (3, {k: v + 5 for k, v in g.symbols.items()})):
        errs = _compare(exe, g, seed, shapes)
        assert all(e < 1e-2 for e in errs.values()), (seed, errs)
        ins = exe.random_inputs(seed + 10, shapes)
        a, b = exe(**ins), plain(**ins)
        assert all(np.array_equal(a[k].view(np.uint16), b[k].view(np.uint16)) for k in a)
    prog = exe._run.runner()
    assert prog.graph and len(prog._bound) == 2 and all(b.graph is not None for b in prog._bound.values())
    assert all(b.graph is None for b in plain._run.runner()._bound.values())
    prog.release()
    monkeypatch.setenv("KUMIKO_CUDA_GRAPH", "1")
    assert kumiko.compile(g, "cuda")._run.cuda_graph


def test_second_compile_is_a_cache_hit_and_runs_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    g = graph("gemm_bias_relu", "fp16")
    first = kumiko.compile(g, "cuda")
    compiles = kc.STATS["compiles"]
    second = kumiko.compile(g, "cuda")
    assert not first._run.cubin.cached and second._run.cubin.cached and kc.STATS["compiles"] == compiles
    ins = first.random_inputs(3, {"M": 300, "N": 200, "K": 100})
    a, b = first(**ins)["C2"], second(**ins)["C2"]
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), "deterministic across modules"


def test_corrupted_cubin_in_the_cache_is_rebuilt_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    g = graph("gemm_bias_relu", "fp16")
    c = kumiko.compile(g, "cuda")._run.cubin
    c.path.write_bytes(c.data[:64])
    exe = kumiko.compile(g, "cuda")
    assert not exe._run.cubin.cached
    errs = _compare(exe, g, 8)
    assert all(e < 1e-2 for e in errs.values())


def test_sync_each_and_cli(gpu_cache, capsys):
    from kumiko.cli import main
    exe = kumiko.compile(graph("attention_causal", "fp16"), "cuda", sync_each=True)
    errs = _compare(exe, graph("attention_causal", "fp16"), 9)
    assert all(e < 1e-2 for e in errs.values())
    assert main(["run", str(EXAMPLES / "gemm_bias_relu.json"), "--target", "cuda"]) == 0
    assert "target cuda" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# diagnostics

def test_out_of_memory_is_a_diagnostic(device):
    with pytest.raises(KumikoError) as e:
        device.alloc(1 << 50, "output huge")
    assert e.value.code == "E1704" and e.value.details["cuda_error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert e.value.at == "output huge"
    device.free(device.alloc(1024, "still usable"))


AXPY = """#include "kumiko_cuda.cuh"
extern "C" __global__ void kumiko_axpy(const float* __restrict__ x, float* __restrict__ y, float a, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_invalid_launch_is_a_diagnostic(device, gpu_cache):
    cub = kc.build_cubin(AXPY, device.arch, name="axpy")
    mod = device.load_module(cub.data, "axpy")
    fn = device.function(mod, "kumiko_axpy")
    from kumiko.kernel.gpu_ir import Param
    params = (Param("x", "float", True, True), Param("y", "float"), Param("a", "float", pointer=False),
              Param("n", "long long", pointer=False))
    x, y = device.alloc(4096, "x"), device.alloc(4096, "y")
    argv, keep = pack_params(params, [x, y, 2.0, 1024])
    with pytest.raises(KumikoError) as e:
        device.launch(fn, "kumiko_axpy", (8, 1, 1), (2048, 1, 1), 0, argv)     # 2048 threads per block
    assert e.value.code == "E1703" and e.value.at == "kumiko_axpy"
    with pytest.raises(KumikoError) as e:
        device.function(mod, "no_such_kernel")
    assert e.value.code == "E1703"
    # the context survives both: a correct launch runs
    device.upload(x, np.arange(1024, dtype=np.float32), "x")
    device.fill(y, 0, 4096, "y")
    device.launch(fn, "kumiko_axpy", (8, 1, 1), (128, 1, 1), 0, argv)
    device.sync("kumiko_axpy")
    out = np.empty(1024, np.float32)
    device.download(out, y, "y")
    assert np.array_equal(out, 2.0 * np.arange(1024, dtype=np.float32))
    for p in (x, y):
        device.free(p)
    device.unload_module(mod)


_FAULT_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from kumiko.diagnostics import KumikoError
    from kumiko.kernel.gpu_ir import Param
    from kumiko.runtime.cubin import build_cubin
    from kumiko.runtime.cuda_driver import CudaDevice
    from kumiko.runtime.cuda_program import pack_params
    src = '#include "kumiko_cuda.cuh"\\n' + (
        'extern "C" __global__ void kumiko_oob(float* __restrict__ y, long long n) '
        '{{ y[n + (long long)threadIdx.x * (1ll << 32)] = 1.0f; }}\\n')
    dev = CudaDevice.get(0)
    cub = build_cubin(src, dev.arch, name="oob")
    fn = dev.function(dev.load_module(cub.data, "oob"), "kumiko_oob")
    y = dev.alloc(256, "y")
    argv, keep = pack_params((Param("y", "float"), Param("n", "long long", pointer=False)), [y, 1 << 40])
    try:
        dev.launch(fn, "kumiko_oob", (1, 1, 1), (32, 1, 1), 0, argv)
        dev.sync("kernel kumiko_oob")
        print(json.dumps({{"raised": None}}))
    except KumikoError as e:
        print(json.dumps({{"raised": e.to_dict()}}))
""")


def test_illegal_address_names_the_kernel(gpu_cache):
    proc = subprocess.run([sys.executable, "-c", _FAULT_SCRIPT.format(root=str(ROOT))], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout.strip().splitlines()[-1])["raised"]
    assert d is not None, "the out-of-bounds store must fault"
    assert d["code"] == "E1704" and "kumiko_oob" in d["at"] and d["sticky"] is True
    assert d["cuda_error"] in ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED")
