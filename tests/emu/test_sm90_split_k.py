"""Split-K on the SM90 GEMM skeleton (``Plan.split_k`` on a wgmma plan, ``gpu_ir_sm90.SplitKSum``): few output tiles
over a long K (a transformer's projections at 128 tokens) divide each tile's K tiles among CTAs; every consumer
thread writes its fp32 partial sums to its split's slab and counts itself in its own counter word, and the thread of
the tile's last CTA adds the slabs in split order before the epilogue. Checked on the emulator against the Tiny IR
evaluator in every schedule - bias + ReLU, splits with no K tiles, a batched GEMM, attention's merged heads through
the 3-D map, a LayerNorm rest through scratch - with the counters checked zero after each run; the chooser's splits;
validation; the verifier over a split with no K tiles; a launch that drops the splits; the nvcc sm_90a build."""
from __future__ import annotations

import pytest

from kumiko.diagnostics import KumikoError
from kumiko.frontend.tensor import Tensor
from kumiko.kernel.gpu_ir_sm90 import Sm90Kernel
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from kumiko.pipeline import compile_cuda
from kumiko.runtime.ptxas import nvcc_path
from tests.gpu.conftest import assert_missing_splits_reported

from .conftest import needs_gxx
from .test_sm90_gemm import EMUS, check, gemm_graph

pytestmark = needs_gxx


def _plans(g, split: int | None):
    """The chooser's sm90 plans, every wgmma plan's ``split_k`` replaced by ``split`` (None: as chosen)."""
    c = compile_cuda(g.tiny, "sm90")
    return {k: p.with_(split_k=split) if split and p.algo == "wgmma" else p for k, p in c.plans.items()}


def _merged_heads():
    ctx = Tensor.input("C", (1, 4, 40, 64), dtype="fp16")
    w = Tensor.input("W", (256, 72), dtype="fp16")
    return (ctx.permute(0, 2, 1, 3).reshape(1, 40, 256) @ w).graph("y", name="merge_heads")


CASES = {
    "bias_relu_37x72x512_s5": (lambda: gemm_graph((37, 512), (512, 72), "fp16", bias_relu=True), 5, "fp16"),
    "empty_split_5x8x72_s3": (lambda: gemm_graph((5, 72), (72, 8), "fp16"), 3, "fp16"),     # 2 K tiles, 3 splits
    "tail_130x136x1000_s4": (lambda: gemm_graph((130, 1000), (1000, 136), "bf16", bias_relu=True), 4, "bf16"),
    "batched_3x19x200x24_s4": (lambda: gemm_graph((3, 19, 200), (3, 200, 24), "fp16"), 4, "fp16"),
    "merged_heads_s2": (_merged_heads, 2, "fp16"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_k_matches_the_evaluator_in_every_schedule(name):
    make, split, dtype = CASES[name]
    g = make()
    plans = _plans(g, split)
    c = compile_cuda(g.tiny, "sm90", plans=plans)
    assert any(isinstance(k, Sm90Kernel) for k in c.kernels) and "split-K" in c.source
    for emu in EMUS:
        check(g, emu, dtype, plans=plans)


@pytest.mark.parametrize("m, k, n, tile, split, stages", [
    (128, 3072, 768, (64, 64), 3, 8),      # BERT's FFN output projection: 24 tiles, 48 K tiles -> 16 a split
    (128, 768, 768, (64, 64), 1, 8),       # the attention output projection: 12 K tiles, fastest unsplit
    (64, 8192, 256, (64, 64), 8, 8),       # 4 tiles, 128 K tiles
    (128, 768, 3072, (64, 64), 1, 8),      # 96 tiles: more than half the SMs already, one wave
    (128, 320, 768, (64, 64), 1, 5),       # a ring as deep as the CTA's 5 K tiles
    (1024, 4096, 1024, (64, 64), 1, 4),    # 256 tiles: two waves, the ring stays at 4 stages
    (128, 128, 768, (64, 64), 1, 4)])      # 2 K tiles: nothing to split
def test_the_chooser_splits_few_tiles_over_a_long_k(m, k, n, tile, split, stages):
    """Split-K for few tiles over a long K; a one-wave grid (a CTA an SM) gets a ring of up to 8 stages, as many as
    the CTA's K tiles (BERT 0.84 -> 0.76 ms as a CUDA Graph on an H100, bench/RESULTS.md)."""
    (plan,) = compile_cuda(gemm_graph((m, k), (k, n), "fp16").tiny, "sm90").plans.values()
    assert plan.algo == "wgmma" and plan.tile[:2] == tile and plan.split_k == split and plan.stages == stages
    assert plan.get("async_", "prefetch_depth") == stages and plan.threads == 256


def test_a_gemm_followed_by_layernorm_splits_and_keeps_its_simt_rest():
    x = Tensor.input("X", (128, 3072), dtype="fp16")
    w = Tensor.input("W", (3072, 768), dtype="fp16")
    r = Tensor.input("R", (128, 768), dtype="fp16")
    g = (x @ w + r).layernorm(-1).graph("y", name="ffn_out_ln")      # BERT's FFN output and its LayerNorm
    c = compile_cuda(g.tiny, "sm90")
    assert [p.split_k for p in c.plans.values()] == [3]
    assert [type(k).__name__ for k in c.kernels] == ["Sm90Kernel", "SimtKernel"]
    (ln, rest) = c.launches
    assert {v for v, _ in ln.scratch} == {"kk_ws", ln.scratch[0][0]} and ln.counters
    assert rest.scratch == ln.scratch[:1]           # the rest reads the accumulator's scratch, not the workspace
    check(g, "deferred", "fp16")


def test_validation_and_the_verifier():
    g = gemm_graph((37, 512), (512, 72), "fp16")
    plans = _plans(g, 5)
    (name, plan), = plans.items()
    for bad in (0, 65, 2.5, "3"):
        with pytest.raises(KumikoError) as e:
            compile_cuda(g.tiny, "sm90", plans={name: plan.with_(split_k=bad)})
        assert e.value.code == "E1801" and "split_k" in e.value.why
    persistent = plan.with_(async_={**dict(plan.async_), "epilogue_overlap": True})
    with pytest.raises(KumikoError) as e:
        compile_cuda(g.tiny, "sm90", plans={name: persistent})
    assert e.value.code == "E1801" and "persistent" in e.value.why
    k = compile_cuda(g.tiny, "sm90", plans=plans).kernels[0]
    # the verifier runs split 0 and the last split (no K tiles when K tiles < splits) at each ring length
    assert dict(k.verify_sizes)["blockIdx.z"] == (0, 4) and verify_sm90(k) is k


def test_a_launch_missing_the_splits_is_reported():
    g = gemm_graph((130, 300), (300, 40), "fp16", bias_relu=True)
    assert_missing_splits_reported(compile_cuda(g.tiny, "sm90", plans=_plans(g, 3)), g, "C2")


@pytest.mark.nvcc
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_nvcc_builds_split_kernels_for_sm90a_without_spills():
    from kumiko.runtime.emu_program import nvcc_check
    for g, split in ((gemm_graph((128, 3072), (3072, 768), "fp16", bias_relu=True), None),
                     (gemm_graph((256, 1024), (1024, 256), "bf16"), 4)):
        plans = _plans(g, split)
        if split is not None:           # two consumer warpgroups, each summing its own 64 rows
            (name, plan), = plans.items()
            plans = {name: plan.with_(tile=(128, 128, 64), threads=384, warp_tile="64x128", stages=4)}
        c = compile_cuda(g.tiny, "sm90", plans=plans)
        assert next(iter(c.plans.values())).split_k > 1
        res = nvcc_check(c, "sm_90a")
        assert "atom.global.add" in res.ptx or "red.global.add" in res.ptx or "atom.add" in res.ptx
        for ln in c.launches:
            r = res.resources[ln.kernel]
            assert r.spill_stores == r.spill_loads == 0, r
