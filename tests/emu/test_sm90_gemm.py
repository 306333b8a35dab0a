"""The SM90 GEMM skeleton (kernel/gpu_sm90_gemm) derived from the Region and an sm90 plan, on cuda-emu with
``arch="sm90"``: GEMM, GEMM + bias + ReLU and batched GEMM against the Tiny IR evaluator at sizes that are not tile
multiples, fp16 and bf16, in the emulator's configurations; the chooser's choice (sm90 where TMA can read the
operands, the SM80 skeleton elsewhere and for sm80); plan validation; the verifier; the nvcc sm_90a build."""
from __future__ import annotations

import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.kernel.gpu_ir_sm90 import Sm90Kernel
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from kumiko.pipeline import compile_cuda
from kumiko.plan.gpu_sm90 import sm90_plan
from kumiko.plan.plan import Plan
from kumiko.region.analysis import analyze
from kumiko.runtime.ptxas import nvcc_path

from .conftest import needs_gxx, rel_l2

pytestmark = needs_gxx

#: emulator configurations the SM80 MMA tests run (the tensor-map launches are not in the ASan worker yet)
EMUS = ["deferred", "eager", "reversed", "random"]
TOL = {"fp16": 2e-3, "bf16": 1.6e-2}


def gemm_graph(shape_a: tuple, shape_b: tuple, dtype: str, bias_relu: bool = False, residual: bool = False) -> Graph:
    """A (..., M, K) @ B (..., K, N) [+ bias (N), ReLU] [+ R (..., M, N)] with constant sizes, fp32 accumulation."""
    n = shape_b[-1]
    tensors = {"A": {"dtype": dtype, "shape": list(shape_a)}, "B": {"dtype": dtype, "shape": list(shape_b)}}
    ins = [{"tensor": "A", "role": "data"}, {"tensor": "B", "role": "data"}]
    nodes = [{"op": "MatMul", "name": "mm", "inputs": ["A", "B"], "outputs": ["C0"], "attrs": {"acc_dtype": "fp32"}}]
    out = "C0"
    if bias_relu:
        tensors["bias"] = {"dtype": dtype, "shape": [n]}
        ins.append({"tensor": "bias", "role": "param"})
        nodes += [{"op": "Elementwise", "name": "add", "fn": "add", "inputs": ["C0", "bias"], "outputs": ["C1"]},
                  {"op": "Elementwise", "name": "relu", "fn": "relu", "inputs": ["C1"], "outputs": ["C2"]}]
        out = "C2"
    if residual:
        tensors["R"] = {"dtype": dtype, "shape": list(shape_a[:-1]) + [n]}
        ins.append({"tensor": "R", "role": "data"})
        nodes.append({"op": "Elementwise", "name": "res", "fn": "add", "inputs": [out, "R"], "outputs": ["C3"]})
        tensors[out] = {"dtype": dtype, "shape": list(shape_a[:-1]) + [n]}
        out = "C3"
    tensors[out] = {"dtype": dtype, "shape": list(shape_a[:-1]) + [n]}
    return Graph.from_json({"name": "sm90_gemm", "signature": {"inputs": ins, "outputs": [{"tensor": out}]},
                            "tensors": tensors, "graph": nodes})


def check(g: Graph, emu: str, dtype: str, want_sm90: bool = True, plans=None) -> None:
    exe = kumiko.compile(g, "cuda-emu", arch="sm90", emu=emu, plans=plans)
    c = exe._run
    sm90 = [k for k in c.kernels if isinstance(k, Sm90Kernel)]
    assert bool(sm90) == want_sm90, [type(k).__name__ for k in c.kernels]
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(3)
    out, want = exe(**ins), ref(**ins)
    for k in want:
        assert rel_l2(out[k], want[k]) < TOL[dtype], (k, rel_l2(out[k], want[k]))


GEMMS = [((37, 72), (72, 48)), ((129, 64), (64, 200)), ((256, 256), (256, 256)), ((2, 8), (8, 8))]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("sa,sb", GEMMS)
def test_gemm_and_bias_relu(sa, sb, dtype):
    check(gemm_graph(sa, sb, dtype), "deferred", dtype)
    check(gemm_graph(sa, sb, dtype, bias_relu=True), "eager", dtype)


@pytest.mark.parametrize("emu", EMUS)
def test_bias_relu_in_every_configuration(emu):
    check(gemm_graph((70, 136), (136, 72), "fp16", bias_relu=True), emu, "fp16")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_batched_gemm(dtype):
    check(gemm_graph((3, 37, 72), (3, 72, 48), dtype), "deferred", dtype)


def test_bias_relu_residual_epilogue():
    """The whole pointwise tail (cast, bias, ReLU, a residual read at the element) runs on the fragment."""
    g = gemm_graph((100, 64), (64, 136), "bf16", bias_relu=True, residual=True)
    check(g, "deferred", "bf16")
    assert len(compile_cuda(g.tiny, "sm90").kernels) == 1


def test_operands_tma_cannot_read_keep_the_sm80_skeleton():
    """K = 70 halves is a 140-byte row (TMA's strides are multiples of 16 bytes); 1x1x1 likewise; M = 1 has no M
    axis (a size-1 iter), so no GEMM for the skeleton."""
    check(gemm_graph((37, 70), (70, 45), "fp16"), "deferred", "fp16", want_sm90=False)
    check(gemm_graph((1, 1), (1, 1), "fp16"), "deferred", "fp16", want_sm90=False)
    check(gemm_graph((1, 8), (8, 8), "fp16"), "deferred", "fp16", want_sm90=False)
    g = gemm_graph((37, 72), (72, 48), "fp16")
    assert all(p.arch == "sm80" and p.algo == "mma" for p in compile_cuda(g.tiny, "sm80").plans.values())


@pytest.mark.parametrize("tile,stages", [((64, 64, 64), 3), ((128, 256, 64), 3), ((64, 192, 64), 2)])
def test_plan_override_tiles(tile, stages):
    g = gemm_graph((129, 64), (64, 200), "bf16", bias_relu=True)
    c = compile_cuda(g.tiny, "sm90")
    (name, plan), = c.plans.items()
    r = c.program.regions[0]
    p = sm90_plan(r, analyze(r).contraction, tile[0], tile[1], stages)
    check(g, "deferred", "bf16", plans={name: p})


def test_plan_validation_rejects_what_the_skeleton_cannot_build():
    g = gemm_graph((129, 64), (64, 200), "fp16")
    c = compile_cuda(g.tiny, "sm90")
    (name, chosen), = c.plans.items()
    assert chosen.algo == "wgmma" and chosen.arch == "sm90" and chosen.tile == (64, 64, 64) and chosen.threads == 256
    r = c.program.regions[0]
    plan = sm90_plan(r, analyze(r).contraction, 128, 128, 4)
    assert plan.threads == 384
    compile_cuda(g.tiny, "sm90", plans={name: plan})
    assert Plan.from_json(plan.to_json()) == plan
    for bad in (plan.with_(tile=(96, 128, 64)), plan.with_(tile=(128, 128, 32)), plan.with_(stages=9),
                plan.with_(threads=256)):
        with pytest.raises(KumikoError) as e:
            compile_cuda(g.tiny, "sm90", plans={name: bad})
        assert e.value.code == "E1801"
    odd = gemm_graph((37, 70), (70, 45), "fp16")
    c2 = compile_cuda(odd.tiny, "sm90")
    (name2, _), = c2.plans.items()
    with pytest.raises(KumikoError) as e:
        compile_cuda(odd.tiny, "sm90", plans={name2: plan})
    assert e.value.code == "E1801" and "TMA" in e.value.why


def test_symbolic_sizes_run_the_sm80_kernel_when_rows_are_not_16_bytes():
    """The example's sizes are symbols: the SM90 launch runs when K and N are multiples of 8, the SM80 kernel
    built beside it otherwise."""
    from tests.gpu.conftest import graph
    g = graph("gemm_bias_relu", "fp16")
    c = compile_cuda(g.tiny, "sm90")
    assert [type(k).__name__ for k in c.kernels] == ["Sm90Kernel", "MmaKernel"]
    ref = kumiko.compile(g, "eval")
    for shapes, ran in (({"M": 130, "N": 72, "K": 136}, 0), ({"M": 37, "N": 45, "K": 70}, 1)):
        ins = ref.random_inputs(1, shapes)
        env = ref.bind(ins, None)
        assert [ln.runs(env) for ln in c.launches] == [ran == 0, ran == 1]
        out, want = c.runner("deferred")(ins, env), ref(**ins)
        assert rel_l2(out["C2"], want["C2"]) < TOL["fp16"]


def test_the_verifier_accepts_the_kernel_and_catches_a_missing_wait():
    import dataclasses

    from kumiko.kernel.gpu_ir_sm90 import WgmmaWait, rewrite
    c = compile_cuda(gemm_graph((256, 256), (256, 256), "fp16", bias_relu=True).tiny, "sm90")
    k = c.kernels[0]
    assert verify_sm90(k) is k
    bad = dataclasses.replace(k, body=rewrite(k.body, lambda s: () if isinstance(s, WgmmaWait) else None))
    with pytest.raises(KumikoError) as e:
        verify_sm90(bad)
    assert e.value.details["hazard"] in ("acc_in_flight", "release_in_flight")


def test_the_verifier_catches_a_stage_released_while_its_wgmma_group_is_in_flight():
    """With one wgmma group in flight past each wait (the default), a consumer may release k tile kt - 1's stage,
    not kt's: releasing its own stage lets the producer overwrite what the pending wgmma still reads."""
    import dataclasses

    from kumiko.kernel.gpu_ir_sm90 import BarRef, IExpr, If, MbarArrive, rewrite
    c = compile_cuda(gemm_graph((256, 512), (512, 256), "fp16").tiny, "sm90")
    (plan,) = c.plans.values()
    k, S = c.kernels[0], plan.stages
    assert plan.get("async_", "wgmma_in_flight") == 1 and "1 wgmma group(s) in flight" in " ".join(k.notes)
    early = If(IExpr.var("kt").gt(0), (MbarArrive(BarRef("kk_empty", IExpr.var("kt") % S)),))
    bad = dataclasses.replace(k, body=rewrite(k.body, lambda s: (early,) if isinstance(s, If) and
                                              isinstance(s.body[0], MbarArrive) else None))
    assert bad != k
    with pytest.raises(KumikoError) as e:
        verify_sm90(bad)
    assert e.value.details["hazard"] == "release_in_flight"
    # wgmma_in_flight 0: wait for every group, release the stage just read (the skeleton before)
    c0 = compile_cuda(gemm_graph((256, 512), (512, 256), "fp16").tiny, "sm90",
                      plans={r: p.with_(async_={**dict(p.async_), "wgmma_in_flight": 0}) for r, p in c.plans.items()})
    assert "0 wgmma group(s) in flight" in " ".join(c0.kernels[0].notes) and verify_sm90(c0.kernels[0])


@pytest.mark.nvcc
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_nvcc_builds_it_for_sm90a_without_spills():
    from kumiko.runtime.emu_program import nvcc_check
    wide = gemm_graph((256, 64), (64, 256), "fp16", bias_relu=True)
    c = compile_cuda(wide.tiny, "sm90")
    (name, plan), = c.plans.items()
    r = c.program.regions[0]
    wide_plan = {name: sm90_plan(r, analyze(r).contraction, 128, 256, 3)}
    from kumiko import Tensor
    symbolic = (Tensor.input("A", ("M", "K"), dtype="fp16") @ Tensor.input("B", ("K", "N"), dtype="fp16")).graph("y")
    for g, plans in ((gemm_graph((256, 256), (256, 256), "bf16", bias_relu=True), None),
                     (gemm_graph((3, 37, 72), (3, 72, 48), "fp16"), None), (wide, wide_plan),
                     (symbolic, None)):                 # the persistent 128x256 kernel and its SM80 twin
        c = compile_cuda(g, "sm90", plans=plans)
        res = nvcc_check(c, "sm_90a")
        for instr in ("cp.async.bulk.tensor.2d" if len(c.kernels[0].maps[0].box) == 2 else "cp.async.bulk.tensor.3d",
                      "wgmma.mma_async.sync.aligned", "setmaxnreg.inc.sync.aligned.u32", "mbarrier.try_wait.parity"):
            assert instr in res.ptx, instr
        for ln in c.launches:
            r = res.resources[ln.kernel]
            assert r.spill_stores == r.spill_loads == 0, r


@pytest.mark.parametrize("lead", [(1,), (1, 1)])
def test_leading_batch_of_one_drops_out_of_the_map(lead):
    """An ONNX Linear's activation [1, S, K] (index 0 on a dimension of size 1) is TMA's plain 2-D map: the region
    takes the SM90 kernel; a batch of 2 there is a real batch axis the weights lack, so it keeps the SM80 one."""
    g = gemm_graph((*lead, 40, 64), (64, 72), "fp16", bias_relu=True)
    check(g, "deferred", "fp16")
    check(gemm_graph((2, 40, 64), (64, 72), "fp16"), "deferred", "fp16", want_sm90=False)


@pytest.mark.parametrize("m, n, batch, tile, persistent", [
    (4096, 4096, 1, (128, 256), True), (4096, 4096, 4, (128, 256), False), (2048, 2048, 1, (128, 128), False),
    (1024, 1024, 1, (64, 64), False), (128, 768, 1, (64, 64), False), (128, 768, 16, (128, 64), False),
    (48, 40, 1, (64, 64), False)])
def test_the_chooser_halves_the_tile_until_the_gpu_fills(m, n, batch, tile, persistent):
    """128x256, 4 stages, persistent (no batch axes) when that still gives FILL_CTAS tiles (132, an H100/H200's
    SMs); else 128x128 unless that gives fewer CTAs than FILL_CTAS: then N halves, then M."""
    lead = (batch,) if batch > 1 else ()
    g = gemm_graph((*lead, m, 64), (*lead, 64, n), "fp16")
    (plan,) = compile_cuda(g.tiny, "sm90").plans.values()
    assert plan.algo == "wgmma" and plan.tile[:2] == tile
    assert plan.get("async_", "epilogue_overlap") is persistent and plan.stages == 4


def test_symbolic_sizes_get_the_large_persistent_plan():
    from kumiko import Tensor
    g = (Tensor.input("A", ("M", "K"), dtype="fp16") @ Tensor.input("B", ("K", "N"), dtype="fp16")).graph("y")
    c = compile_cuda(g, "sm90")
    (plan,) = c.plans.values()
    assert plan.tile == (128, 256, 64) and plan.get("async_", "epilogue_overlap") is True
    assert c.launches[0].persistent == 1 and verify_sm90(c.kernels[0])


def _persistent(g, bm=None, bn=None, stages=4):
    """``g``'s chosen sm90 plan (or one of tile bm x bn) made persistent (async.epilogue_overlap)."""
    c = compile_cuda(g.tiny, "sm90")
    (name, plan), = c.plans.items()
    if bm is not None:
        r = c.program.regions[0]
        plan = sm90_plan(r, analyze(r).contraction, bm, bn, stages)
    return {name: plan.with_(async_={**dict(plan.async_), "epilogue_overlap": True})}


@pytest.mark.parametrize("emu", EMUS)
@pytest.mark.parametrize("sa, sb, tile", [((300, 520), (520, 264), (128, 128, 4)),
                                          ((300, 520), (520, 264), (128, 256, 3)),
                                          ((129, 64), (64, 200), None), ((1000, 72), (72, 64), (64, 64, 2))])
def test_persistent_kernel_strides_over_the_tiles(emu, sa, sb, tile):
    """async.epilogue_overlap: a grid of min(tiles, SMs) CTAs (the emulator has 2 SMs, so each CTA runs several tiles
    in the grouped order, its ring's stages and phases running on across them) computes every tile exactly."""
    g = gemm_graph(sa, sb, "fp16", bias_relu=True)
    plans = _persistent(g, *(tile or (None, None)))
    check(g, emu, "fp16", plans=plans)
    c = compile_cuda(g.tiny, "sm90", plans=plans)
    (ln,) = c.launches
    bm, bn, _ = next(iter(c.plans.values())).tile
    tiles = -(-sa[0] // bm) * -(-sb[1] // bn)
    assert ln.persistent == 1 and ln.dims({}, 2) == (min(tiles, 2), 1, 1) and ln.dims({}, 1000) == (tiles, 1, 1)
    assert "persistent" in " ".join(c.kernels[0].notes) and ln.to_json()["persistent"] == {"ctas_per_sm": 1}


def test_persistent_plans_are_validated_and_the_verifier_follows_the_ring_across_tiles():
    import dataclasses

    from kumiko.kernel.gpu_ir_sm90 import BarRef, IExpr, MbarWait, rewrite
    g = gemm_graph((300, 520), (520, 264), "fp16")
    plans = _persistent(g, 128, 128, 4)
    k = compile_cuda(g.tiny, "sm90", plans=plans).kernels[0]
    assert verify_sm90(k) is k and dict(k.verify_sizes)["gridDim.x"] == (1, 2)
    # the producer restarting its ring count each tile (stage kt % S) instead of going on (tl * KT + kt)
    kt = IExpr.var("kt")
    restart = dataclasses.replace(k, body=rewrite(k.body, lambda s: (
        MbarWait(BarRef("kk_empty", kt % 4), ((kt // 4) & 1) ^ 1),) if isinstance(s, MbarWait)
        and s.bar.name == "kk_empty" else None))
    with pytest.raises(KumikoError) as e:
        verify_sm90(restart)
    assert e.value.details["hazard"] in ("mbar_parity", "stage_not_released", "mbar_deadlock")
    (name, plan), = plans.items()
    with pytest.raises(KumikoError) as e:
        compile_cuda(g.tiny, "sm90", plans={name: plan.with_(async_={**dict(plan.async_), "epilogue_overlap": 2})})
    assert e.value.code == "E1801" and "epilogue_overlap" in e.value.why
    batched = gemm_graph((3, 100, 64), (3, 64, 72), "fp16")
    with pytest.raises(KumikoError) as e:
        compile_cuda(batched.tiny, "sm90", plans=_persistent(batched))
    assert e.value.code == "E1801" and "batch" in e.value.why


@pytest.mark.parametrize("shape", [(128, 768, 768), (100, 200, 136), ("M", "K", 136)])
def test_a_gemm_followed_by_layernorm_takes_wgmma_and_a_simt_rest(shape):
    """A contraction whose rest is not pointwise (residual + LayerNorm over N, BERT's projections) takes the SM90
    skeleton with its accumulator in an fp32 scratch, then the SIMT kernel a warp a row (one-warp blocks for 128
    rows); symbolic sizes keep the guarded SM80 twin with its own rest. Matches the evaluator in two schedules."""
    m, k, n = shape
    x = kumiko.Tensor.input("X", (m, k), dtype="fp16")
    w = kumiko.Tensor.input("W", (k, n), dtype="fp16")
    r = kumiko.Tensor.input("R", (m, n), dtype="fp16")
    g = (x @ w + r).layernorm(-1).graph("y", name="proj_ln")
    c = compile_cuda(g.tiny, arch="sm90")
    kinds = [type(q).__name__ for q in c.kernels]
    assert kinds[:2] == ["Sm90Kernel", "SimtKernel"], kinds
    (plan,) = c.plans.values()
    assert plan.algo == "wgmma" and plan.get("bind", "rest.point") == "warp"
    assert c.launches[0].scratch and c.launches[1].scratch == c.launches[0].scratch[:1]
    if m == 128:
        assert c.kernels[1].threads == 32
    ref = kumiko.compile(g, "eval")
    for emu in ("deferred", "random"):
        ins = ref.random_inputs(1, {"M": 70, "K": 88} if m == "M" else None)
        out = c.runner(emu)(ins, ref.bind(ins, None))
        assert rel_l2(out["y"], ref(**ins)["y"]) < 2e-3, emu


@pytest.mark.parametrize("heads, seq, d, n, layernorm", [(4, 40, 64, 72, False), (3, 130, 128, 64, True)])
def test_merged_heads_are_read_by_a_3d_tensor_map(heads, seq, d, n, layernorm):
    """Attention's output [1, H, S, D] read as a projection's rows [S, H * D] (a permute and a reshape: K is (head,
    d)) takes the SM90 skeleton through a 3-D tensor map (D, S, H), K tile kt loading head kt // (D / 64): every
    K tile one box, rows past S zero-filled. D = 128 takes two K tiles a head; a LayerNorm rest goes to the SIMT
    kernel."""
    ctx = kumiko.Tensor.input("C", (1, heads, seq, d), dtype="fp16")
    w = kumiko.Tensor.input("W", (heads * d, n), dtype="fp16")
    r = kumiko.Tensor.input("R", (1, seq, n), dtype="fp16")
    y = ctx.permute(0, 2, 1, 3).reshape(1, seq, heads * d) @ w + r
    g = (y.layernorm(-1) if layernorm else y).graph("y", name="merge_heads")
    c = compile_cuda(g.tiny, arch="sm90")
    k = c.kernels[0]
    assert isinstance(k, Sm90Kernel) and k.maps[0].rank == 3 and k.maps[0].box[2] == 1
    ref = kumiko.compile(g, "eval")
    for emu in ("deferred", "random"):
        ins = ref.random_inputs(2)
        out = c.runner(emu)(ins, ref.bind(ins, None))
        assert rel_l2(out["y"], ref(**ins)["y"]) < 2e-3, emu


def test_a_head_other_than_a_multiple_of_64_keeps_the_sm80_gather():
    ctx = kumiko.Tensor.input("C", (1, 4, 40, 32), dtype="fp16")
    w = kumiko.Tensor.input("W", (128, 64), dtype="fp16")
    g = (ctx.permute(0, 2, 1, 3).reshape(1, 40, 128) @ w).graph("y", name="merge_heads32")
    assert [type(x).__name__ for x in compile_cuda(g.tiny, arch="sm90").kernels] == ["MmaKernel"]
