"""Split-K on the SM80 MMA skeleton (``Plan.split_k``, ``gpu_ir.SplitK``): an output tile's K tiles divided among
CTAs, whose fp32 partial sums the last CTA of the tile adds in split order before the epilogue. Checked on the
emulator against the Tiny IR evaluator - GEMMs with bias and ReLU, an implicit-GEMM conv (table gather), a batched
GEMM, a contraction whose rest runs on the SIMT kernel (the accumulator through scratch), symbolic sizes - in every
schedule, with the split's counters checked zero after every run (``GpuRunner``). The chooser splits small-M, long-K
problems (a ResNet-50 stage-4 conv at batch 1) and nothing else; the verifier and the validator reject splits that
cannot be summed; a launch that does not run every split is reported by the runner (its counters stay non-zero, no
epilogue runs). Also here: an fp16 bias cast to fp32 keeps the epilogue on the fragments, and SIMT kernels with few
points run one-warp blocks."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.frontend.tensor import Tensor
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.pipeline import compile_cuda
from kumiko.plan.gpu import choose_gpu_plan, describe_gpu_plan, simt_threads, split_k_for, validate_gpu_plan
from kumiko.runtime.program import program_symbols
from tests.gpu.conftest import assert_missing_splits_reported, needs_gxx, run_and_compare

pytestmark = needs_gxx
CONFIGS = ("deferred", "eager", "reversed", "random")


def _gemm(m, n, k, dtype="fp16"):
    a = Tensor.input("A", (m, k), dtype=dtype)
    b = Tensor.input("B", (k, n), dtype=dtype)
    bias = Tensor.input("bias", (n,), dtype=dtype)
    return ((a @ b) + bias).relu().graph("y", name="gemm")


def _conv(n, c, hw, co, k, stride):
    x = Tensor.input("X", (n, c, hw, hw), dtype="fp16")
    w = Tensor.input("Wt", (co, c, k, k), dtype="fp16")
    b = Tensor.input("b", (co,), dtype="fp16")
    return x.conv2d(w, b, stride=stride, padding=k // 2).relu().graph("y", name="conv")


def _batched():
    a = Tensor.input("A", ("B", "M", "K"), dtype="bf16")
    b = Tensor.input("Bm", ("B", "K", 24), dtype="bf16")
    return a.matmul(b).graph("y", name="bmm")


def _softmax_rows():
    """A contraction followed by a softmax over N: the accumulator goes to scratch, a SIMT kernel does the rest."""
    a = Tensor.input("A", (21, 300), dtype="fp16")
    b = Tensor.input("B", (300, 40), dtype="fp16")
    return (a @ b).softmax(-1).graph("y", name="mm_softmax")


def _split_plans(g, split: int | None):
    """The chooser's sm80 plans, with every MMA plan's ``split_k`` replaced by ``split`` (None: as chosen)."""
    prog = compile_cuda(g.tiny).program
    plans = {r.name: choose_gpu_plan(r, "sm80", program_symbols(prog)) for r in prog.regions}
    if split is not None:
        plans = {k: p.with_(split_k=split) if p.algo == "mma" else p for k, p in plans.items()}
    return plans


CASES = {
    "gemm_37x72x517_s5": (lambda: _gemm(37, 72, 517), 5, None),
    "gemm_130x40x300_s3": (lambda: _gemm(130, 40, 300), 3, None),
    "gemm_5x8x33_s2": (lambda: _gemm(5, 8, 33), 2, None),            # fewer K tiles than splits: empty splits
    "gemm_bf16_49x64x1000": (lambda: _gemm(49, 64, 1000, "bf16"), None, None),      # the chooser's split
    "conv_c64_7x7_co128": (lambda: _conv(1, 64, 7, 128, 3, 1), None, None),
    "conv_c24_9x9_s2_n2": (lambda: _conv(2, 24, 9, 40, 3, 2), 3, None),
    "bmm_symbolic": (_batched, 4, [{"B": 3, "M": 19, "K": 200}, {"B": 1, "M": 70, "K": 37}]),
    "softmax_rest": (_softmax_rows, 4, None),
}


@pytest.fixture(scope="module")
def built(gpu_cache):
    out = {}
    for name, (make, split, _) in CASES.items():
        g = make()
        plans = _split_plans(g, split)
        out[name] = (g, compile_cuda(g.tiny, plans=plans), plans)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_split_k_matches_the_evaluator(built, name):
    g, c, plans = built[name]
    assert any(p.split_k > 1 for p in plans.values()), {k: describe_gpu_plan(p) for k, p in plans.items()}
    assert "split-K" in c.source
    for config in CONFIGS:
        for i, shapes in enumerate(CASES[name][2] or [None]):
            errs = run_and_compare(c, g, config, seed=3 + i, shapes=shapes)
            assert all(e < 2e-3 for e in errs.values()), (config, shapes, errs)


def test_chooser_splits_small_m_long_k_only():
    # a ResNet-50 stage-4 3x3 conv at batch 1: M = 49, N = 512, K = 4608 -> 8 output tiles of 64x64
    assert split_k_for(8, 4608, 32) == 16
    assert split_k_for(32, 512, 32) == 4            # the stage-4 1x1 conv: 4 K tiles a split
    assert split_k_for(12, 64, 32) == 1             # two K tiles: nothing to split
    assert split_k_for(200, 4096, 32) == 1          # enough tiles already
    assert split_k_for(None, 4096, 32) == 1 and split_k_for(8, None, 32) == 1      # sizes known at run time only
    g = _gemm(49, 512, 4608)
    plans = _split_plans(g, None)
    (p,) = [p for p in plans.values() if p.algo == "mma"]
    assert p.split_k == 16 and "split K x16" in describe_gpu_plan(p)
    big = [p for p in _split_plans(_gemm(1024, 1024, 4096), None).values() if p.algo == "mma"]
    assert [p.split_k for p in big] == [1]


def test_kumiko_split_k_caps_the_chooser(monkeypatch):
    monkeypatch.setenv("KUMIKO_SPLIT_K", "4")
    assert split_k_for(8, 4608, 32) == 4
    monkeypatch.setenv("KUMIKO_SPLIT_K", "1")
    assert split_k_for(8, 4608, 32) == 1
    assert [p.split_k for p in _split_plans(_gemm(49, 512, 4608), None).values() if p.algo == "mma"] == [1]


def test_merged_heads_are_gathered_through_k_tables():
    """sm80: a projection reading attention's heads merged ([1, H, S, D] as [S, H * D]: K is split by a floor
    division) gathers its A operand through the per-warp K tables (their bound covers the floor division)."""
    ctx = Tensor.input("C", (1, 4, 40, 64), dtype="fp16")
    w = Tensor.input("W", (256, 72), dtype="fp16")
    g = (ctx.permute(0, 2, 1, 3).reshape(1, 40, 256) @ w).graph("y", name="merge_heads")
    c = compile_cuda(g.tiny)
    assert "through per-warp K tables" in c.source
    for emu in ("deferred", "reversed"):
        errs = run_and_compare(c, g, emu, 2)
        assert all(e < 2e-3 for e in errs.values()), (emu, errs)


def test_validator_and_verifier_reject_unsummable_splits(built):
    g, c, plans = built["gemm_37x72x517_s5"]
    region = c.program.regions[0]
    syms = program_symbols(c.program)
    for bad in (0, 65, 2.5):
        with pytest.raises(KumikoError) as e:
            validate_gpu_plan(plans[region.name].with_(split_k=bad), region, syms)
        assert e.value.code == "E1801" and "split_k" in e.value.why
    kern = next(k for k in c.kernels if getattr(k, "split", None) is not None)
    for mutated in (replace(kern, epilogue=replace(kern.epilogue, mode="smem_window", window=1)),
                    replace(kern, split=replace(kern.split, splits=1)),
                    replace(kern, params=tuple(p for p in kern.params if p.name != kern.split.counters))):
        with pytest.raises(KumikoError) as e:
            verify_mma(mutated)
        assert e.value.details["hazard"] == "split_k"


def test_a_launch_missing_splits_leaves_the_output_poisoned(built):
    g, c, _ = built["gemm_130x40x300_s3"]
    assert_missing_splits_reported(c, g, "y")


def test_a_bias_cast_to_fp32_keeps_the_epilogue_on_the_fragments():
    """An fp16 conv + bias + ReLU: the bias is read and cast to fp32 in a let over the channel axis alone. The
    epilogue is still pointwise (computed at each output point): one MMA kernel, no fp32 scratch, no SIMT rest."""
    c = compile_cuda(_conv(1, 16, 9, 24, 3, 1).tiny)
    assert [type(k).__name__ for k in c.kernels] == ["MmaKernel"]
    assert all(not ln.scratch or all(v == "kk_ws" for v, _ in ln.scratch) for ln in c.launches)


def test_simt_blocks_shrink_until_the_points_fill_the_gpu():
    """A SIMT kernel with few points (a LayerNorm over 128 rows, a warp a row) runs one warp a block, so its blocks
    spread over the SMs; many points keep 256 threads; unknown counts keep 256."""
    assert simt_threads(128, "warp") == 32
    assert simt_threads(128 * 12, "warp") == 256
    assert simt_threads(2048, "thread") == 32 and simt_threads(98304, "thread") == 256
    assert simt_threads(None, "warp") == 256 and simt_threads(0, "thread") == 256
    x = Tensor.input("X", (128, 768), dtype="fp16")
    w = Tensor.input("W", (768, 768), dtype="fp16")
    g = (x @ w + x).layernorm(-1).graph("y", name="proj_ln")
    c = compile_cuda(g.tiny)
    rest = [k for k in c.kernels if k.name.endswith("_rest")]
    assert rest and all(k.threads == 32 and k.warp for k in rest), [(k.name, k.threads) for k in c.kernels]
    errs = run_and_compare(c, g, "deferred", 1)
    assert all(e < 2e-3 for e in errs.values()), errs
