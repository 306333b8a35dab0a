"""The SM90 GEMM skeleton (TMA, mbarrier, wgmma, warp specialization) on a real Hopper GPU: ``cuda`` plans ``sm90``
on an ``sm_90a`` device by default, the runtime encodes each tensor map with ``cuTensorMapEncodeTiled`` over the
device buffers, and the results match the Tiny IR evaluator (or numpy at sizes the evaluator would be slow at) for
GEMM, GEMM + bias + ReLU, a residual epilogue and batched GEMM, in fp16 and bf16, at sizes that are and are not tile
multiples; where TMA's 16-byte rows fail at run time the guarded SM80 kernel runs instead; ``arch="sm80"`` keeps the
mma.sync skeleton on the same device and agrees.

Marked ``gpu``; skipped without a device, and on a device that is not sm_90a. Run on a lent machine with::

    python -m pytest -m gpu tests/gpu/test_sm90_gpu.py -v
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel.gpu_ir import MmaKernel
from kumiko.kernel.gpu_ir_sm90 import Sm90Kernel
from kumiko.runtime.cuda_driver import CudaDevice, device_available
from kumiko.runtime.ptxas import nvcc_path

from .conftest import rel_l2

HAVE_GPU, GPU_REASON = device_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason=f"no GPU for the cuda target ({GPU_REASON})"),
    pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (the cuda target builds its kernels with it)"),
]
TOL = {"fp16": 2e-3, "bf16": 1.6e-2}


@pytest.fixture(scope="module", autouse=True)
def hopper():
    dev = CudaDevice.get(0)
    if dev.arch != "sm_90a":
        pytest.skip(f"the SM90 skeleton needs an sm_90a device, this is {dev.arch}")
    return dev


def gemm(dtype: str, batch: tuple = (), sizes=("M", "K", "N"), bias_relu=False, residual=False):
    m, k, n = sizes
    a = Tensor.input("A", (*batch, m, k), dtype=dtype)
    b = Tensor.input("B", (*batch, k, n), dtype=dtype)
    y = a @ b
    if bias_relu:
        y = (y + Tensor.input("bias", (n,), dtype=dtype)).relu()
    if residual:
        y = y + Tensor.input("R", (*batch, m, n), dtype=dtype)
    return y.graph("y", name=f"sm90_gemm_{dtype}")


def kinds(exe) -> set[str]:
    return {type(k).__name__ for k in exe._run.kernels}


def launched(exe) -> list[str]:
    """The kernels the last bound sizes launch (a guarded pair launches one of its two)."""
    b = next(reversed(exe._run.runner()._bound.values()))
    return [ln.kernel for ln in b.launches]


def compare(exe, g, seed: int, shapes=None) -> float:
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(seed, shapes)
    out, want = exe(**ins), ref(**ins)
    return max(rel_l2(out[k], want[k]) for k in want)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mkn", [(37, 72, 48), (129, 64, 200), (256, 256, 256), (2, 8, 8), (300, 520, 136)])
def test_constant_sizes_match_the_evaluator(dtype, mkn):
    g = gemm(dtype, sizes=mkn, bias_relu=True)
    exe = kumiko.compile(g, "cuda")
    assert exe._run.plan_arch == "sm90" and kinds(exe) == {"Sm90Kernel"}
    assert compare(exe, g, 3) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_residual_and_batched(dtype):
    g = gemm(dtype, batch=(3,), sizes=(100, 136, 72), residual=True)
    exe = kumiko.compile(g, "cuda")
    assert Sm90Kernel.__name__ in kinds(exe)
    assert compare(exe, g, 5) < TOL[dtype]


def test_symbolic_sizes_take_the_guarded_kernel_that_fits():
    """Sizes whose rows are multiples of 16 bytes run the SM90 kernel; the others its guarded SM80 twin."""
    g = gemm("fp16", bias_relu=True)
    exe = kumiko.compile(g, "cuda")
    assert kinds(exe) == {"Sm90Kernel", "MmaKernel"}
    sm90, sm80 = (ln.kernel for ln in exe._run.launches)
    for shapes, runs in (({"M": 200, "K": 264, "N": 136}, sm90), ({"M": 77, "K": 130, "N": 61}, sm80),
                         ({"M": 64, "K": 64, "N": 64}, sm90)):
        assert compare(exe, g, 7, shapes) < TOL["fp16"], shapes
        assert launched(exe) == [runs], shapes


@pytest.mark.parametrize("mnk", [(2048, 2048, 2048), (1000, 776, 512), (64, 64, 4104)])
def test_large_gemms_against_numpy(mnk):
    m, n, k = mnk
    exe = kumiko.compile(gemm("fp16"), "cuda")
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), np.float32).astype(np.float16)
    b = rng.standard_normal((k, n), np.float32).astype(np.float16)
    y = exe(A=a, B=b)["y"]
    assert launched(exe) == [exe._run.launches[0].kernel], "the sizes are 16-byte rows: the SM90 kernel runs"
    assert rel_l2(y, a.astype(np.float32) @ b.astype(np.float32)) < 2e-3


def test_sm80_plans_on_hopper_agree():
    g = gemm("fp16", sizes=(300, 520, 136), bias_relu=True)
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(11)
    a, b = (kumiko.compile(g, "cuda", arch=arch) for arch in ("sm90", "sm80"))
    assert kinds(a) == {"Sm90Kernel"} and kinds(b) == {MmaKernel.__name__}
    ya, yb, want = a(**ins)["y"], b(**ins)["y"], ref(**ins)["y"]
    assert rel_l2(ya, want) < TOL["fp16"] and rel_l2(yb, want) < TOL["fp16"]



@pytest.mark.parametrize("mnk, tile", [((2048, 2048, 2048), (128, 128, 4)), ((1000, 776, 520), (128, 256, 3)),
                                       ((300, 264, 136), (64, 64, 4))])
def test_persistent_kernel_on_the_device(mnk, tile):
    """async.epilogue_overlap: min(tiles, the device's SMs) CTAs striding over the tiles, against numpy."""
    from kumiko.plan.gpu_sm90 import sm90_plan
    from kumiko.region.analysis import analyze
    m, n, k = mnk
    g = gemm("fp16", sizes=(m, k, n), bias_relu=True)
    c = kumiko.compile(g, "cuda")
    r = c._run.program.regions[0]
    p = sm90_plan(r, analyze(r).contraction, *tile)
    exe = kumiko.compile(g, "cuda", plans={r.name: p.with_(async_={**dict(p.async_), "epilogue_overlap": True})})
    (ln,) = exe._run.launches
    assert ln.persistent == 1
    rng = np.random.default_rng(13)
    a, w, bias = (rng.standard_normal(s, np.float32).astype(np.float16) for s in ((m, k), (k, n), (n,)))
    y = exe(A=a, B=w, bias=bias)["y"]
    want = np.maximum(a.astype(np.float32) @ w.astype(np.float32) + bias.astype(np.float32), 0)
    assert rel_l2(y, want) < TOL["fp16"]
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    b = next(reversed(exe._run.runner()._bound.values()))
    assert b.launches[0].grid == (min(tiles, CudaDevice.get(0).sm_count), 1, 1)


@pytest.mark.parametrize("mnk, tile, split", [((128, 768, 3072), None, None), ((128, 768, 768), (64, 64, 4), 2),
                                              ((256, 264, 1024), (128, 128, 4), 5), ((40, 72, 128), (64, 64, 4), 3)])
def test_split_k_on_the_device(mnk, tile, split):
    """Split-K on the SM90 skeleton (the chooser's for BERT's 128-token projections; two consumers; a split with no
    K tiles), against numpy, three launches in a row: each leaves its counters zero for the next."""
    from kumiko.plan.gpu_sm90 import sm90_plan
    from kumiko.region.analysis import analyze
    m, n, k = mnk
    g = gemm("fp16", sizes=(m, k, n), bias_relu=True)
    plans = None
    if tile is not None:
        r = kumiko.compile(g, "cuda")._run.program.regions[0]
        plans = {r.name: sm90_plan(r, analyze(r).contraction, *tile).with_(split_k=split)}
    exe = kumiko.compile(g, "cuda", plans=plans)
    assert next(iter(exe._run.plans.values())).split_k > 1 and kinds(exe) == {"Sm90Kernel"}
    rng = np.random.default_rng(17)
    for _ in range(3):
        a, w, bias = (rng.standard_normal(s, np.float32).astype(np.float16) for s in ((m, k), (k, n), (n,)))
        y = exe(A=a, B=w, bias=bias)["y"]
        want = np.maximum(a.astype(np.float32) @ w.astype(np.float32) + bias.astype(np.float32), 0)
        assert rel_l2(y, want) < TOL["fp16"]


@pytest.mark.parametrize("d", [64, 128])
def test_merged_attention_heads_through_a_3d_tensor_map(d):
    """An attention output [1, H, S, D] read as a projection's rows (BERT's and GPT-2's output projections at batch
    1) takes the SM90 skeleton through a 3-D tensor map (D, S, H), with a residual + LayerNorm rest; against
    numpy."""
    heads, seq, n = 12, 130, 768
    ctx = Tensor.input("C", (1, heads, seq, d), dtype="fp16")
    w = Tensor.input("W", (heads * d, n), dtype="fp16")
    r = Tensor.input("R", (1, seq, n), dtype="fp16")
    g = (ctx.permute(0, 2, 1, 3).reshape(1, seq, heads * d) @ w + r).layernorm(-1).graph("y", name="merge")
    exe = kumiko.compile(g, "cuda")
    assert "Sm90Kernel" in kinds(exe)
    rng = np.random.default_rng(d)
    c, wm, rm = (rng.standard_normal(s, np.float32).astype(np.float16)
                 for s in ((1, heads, seq, d), (heads * d, n), (1, seq, n)))
    y = c.astype(np.float32).transpose(0, 2, 1, 3).reshape(1, seq, heads * d) @ wm.astype(np.float32) + rm
    want = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    assert rel_l2(exe(C=c, W=wm, R=rm)["y"], want) < TOL["fp16"]


#: (d, causal, dtype) of the fused attention cases on the device
ATTN = [(64, False, "fp16"), (128, True, "fp16"), (128, False, "bf16"), (64, True, "bf16")]


@pytest.mark.parametrize("d,causal,dtype", ATTN, ids=[f"d{d}-{'causal' if c else 'full'}-{t}" for d, c, t in ATTN])
def test_fused_attention_on_the_device(d, causal, dtype):
    """The attention Region pair on sm_90a takes the SM90 fused kernel (TMA maps over Q, K, V; wgmma with P from
    registers; one launch), and matches the evaluator at query and key lengths that are not block multiples, a
    single query row, and a long sequence whose key blocks run through the two-stage rings many times."""
    q = Tensor.input("Q", ("B", "H", "M", d), dtype=dtype)
    k, v = (Tensor.input(n, ("B", "H", "N", d), dtype=dtype) for n in "KV")
    g = q.scaled_dot_product_attention(k, v, is_causal=causal).graph("O", name=f"attn{d}")
    exe = kumiko.compile(g, "cuda")
    assert kinds(exe) == {"Sm90Kernel"} and len(exe._run.kernels) == 1
    for seed, shapes in enumerate(({"B": 1, "H": 3, "M": 200, "N": 333}, {"B": 2, "H": 2, "M": 1, "N": 70},
                                   {"B": 1, "H": 2, "M": 1024, "N": 1024})):
        assert compare(exe, g, seed, shapes) < TOL[dtype], shapes


def test_fused_attention_over_projected_heads_on_the_device():
    """Q, K, V as heads of one [1, S, 3 * H * d] projection (what an exported transformer holds at batch 1): 3-D
    tensor maps whose origins are the Q, K and V column offsets."""
    heads, d, s = 4, 64, 300
    x = Tensor.input("X", (1, s, 3 * heads * d), dtype="fp16")
    q, k, v = (x[:, :, i * heads * d:(i + 1) * heads * d].reshape(1, s, heads, d).permute(0, 2, 1, 3)
               for i in range(3))
    g = q.scaled_dot_product_attention(k, v, is_causal=True, scale=0.125).graph("O", name="heads")
    exe = kumiko.compile(g, "cuda")
    assert kinds(exe) == {"Sm90Kernel"}
    assert compare(exe, g, 7) < TOL["fp16"]
